"""Model-level check: a small random-weight Qwen3-Next layer stack from the installed `transformers`,
run once with its own GDN prefill and once with ours in its place; both are compared with float64.

    python benchmarks/gdn_model_check.py --ptx .bench/gdn_ptx [--json FILE]   # GPU: ours as sm_75 turbo PTX
    TRITON_INTERPRET=1 python benchmarks/gdn_model_check.py --interpret         # CPU: ours under Triton's interpreter

The stack has Qwen3.6-27B's per-GPU GDN shape at tensor parallel 2 (8 key heads, 24 value heads, head
dim 128: the shape the benchmark's PTX is built for), three GDN layers and one full-attention layer,
dense MLPs (no expert routing, whose near-ties would flip on rounding), fp16 weights on the GPU. Each
model runs a prompt in two chunks through one cache, so the second chunk's GDN calls start from the
first's recurrent state, as vLLM's chunked prefill does. Every GDN call's output and final state is
checked against the float64 token-serial reference on that call's own inputs; the two runs' logits
and cached recurrent states are compared with each other.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

H, HV, D = 8, 24, 128
BUDGET = 1e-3      # per GDN call against float64: our kernel's error at full size is about 4.8e-4


def _config(layers: int):
    from transformers import Qwen3NextConfig

    types = ["linear_attention"] * (layers - 1) + ["full_attention"]
    return Qwen3NextConfig(
        vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=layers, layer_types=types,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=H, linear_num_value_heads=HV,
        linear_key_head_dim=D, linear_value_head_dim=D, linear_conv_kernel_dim=4, mlp_only_layers=list(range(layers)),
        num_experts=0, max_position_embeddings=4096)


class Recorder:
    """Wraps a GDN prefill with transformers' interface; checks each call against float64."""

    def __init__(self, name: str, fn):
        self.name, self.fn, self.calls = name, fn, []

    def __call__(self, query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
        from caovan_vllm_sm75_turbo3.kernels.gdn import gated_delta_rule_reference
        from caovan_vllm_sm75_turbo3.kernels.numerics import rel_error

        o, final = self.fn(query, key, value, g, beta, chunk_size=chunk_size, initial_state=initial_state,
                           output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                           cu_seqlens=cu_seqlens, **kwargs)
        h0 = None if initial_state is None else initial_state.transpose(-1, -2)  # ours and the reference: [N, HV, V, K]
        ro, rs = gated_delta_rule_reference(query, key, value, g, beta, initial_state=h0, output_final_state=True,
                                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        row = {"T": query.shape[1], "initial_state": initial_state is not None, "rel_err_o": rel_error(o, ro)}
        if final is not None:
            row["rel_err_state"] = rel_error(final.transpose(-1, -2), rs)
        self.calls.append(row)
        return o, final


def ours(launch):
    """Our prefill behind transformers' interface; `launch(q, k, v, g, beta, h0, cu)` -> (o, final [N, HV, V, K])."""
    def fn(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
           use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
        import torch

        assert query.shape[0] == 1 and cu_seqlens is None, "one sequence per call in this check"
        # transformers repeats each key head for its value heads; our kernel reads key head i // (HV // H)
        ratio = value.shape[2] // H
        q, k = query[:, :, ::ratio], key[:, :, ::ratio]
        assert torch.equal(q.repeat_interleave(ratio, 2), query), "key heads are not repeated as expected"
        if use_qk_l2norm_in_kernel:  # as transformers and vLLM's FLA do it, in fp32, before the fp16 cast
            q, k = (x.float() * torch.rsqrt((x.float() ** 2).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
        T = query.shape[1]
        h0 = (torch.zeros(1, value.shape[2], D, D, device=query.device) if initial_state is None
              else initial_state.transpose(-1, -2).float().contiguous())
        cu = torch.tensor([0, T], dtype=torch.int32, device=query.device)
        o, final = launch(q.half().contiguous(), k.half().contiguous(), value.half().contiguous(),
                          g.float().contiguous(), beta.float().contiguous(), h0, cu)
        return o.to(query.dtype), (final.transpose(-1, -2).contiguous() if output_final_state else None)
    return fn


def _launch_ptx(ptx: Path):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gdn_prefill import _chunk_indices, _Sm75

    impl = _Sm75(ptx, "turbo")

    def launch(q, k, v, g, beta, h0, cu):
        ci = _chunk_indices([int(cu[-1])]).to(q.device)
        o, ht, _ = impl(q, k, v, g, beta, h0, cu, ci)
        return o.clone(), ht.clone()
    return launch


def _launch_interpreted(q, k, v, g, beta, h0, cu):
    from caovan_vllm_sm75_turbo3.kernels.gdn import chunk_gated_delta_rule

    return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)


def _run(model, chunks, gdn):
    """The model over the prompt's chunks through one cache, with `gdn` as its GDN prefill."""
    import torch
    from transformers import DynamicCache
    from transformers.models.qwen3_next import modeling_qwen3_next as mq

    saved = mq.torch_chunk_gated_delta_rule
    mq.torch_chunk_gated_delta_rule = gdn
    try:
        cache = DynamicCache(config=model.config)
        logits = []
        with torch.no_grad():
            for ids in chunks:
                logits.append(model(input_ids=ids, past_key_values=cache, use_cache=True).logits.float())
        layers = [i for i, t in enumerate(model.config.layer_types) if t == "linear_attention"]
        states = [cache.layers[i].recurrent_states[0].float().clone() for i in layers]
    finally:
        mq.torch_chunk_gated_delta_rule = saved
    return torch.cat(logits, 1), states


def check(launch, device, dtype, lens: list[int], layers: int) -> dict:
    """Both runs and their comparison; `ok` when every GDN call is within BUDGET and nothing is NaN."""
    import torch
    from transformers import Qwen3NextForCausalLM
    from transformers.models.qwen3_next import modeling_qwen3_next as mq

    from caovan_vllm_sm75_turbo3.kernels.numerics import rel_error

    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(_config(layers)).to(device=device, dtype=dtype).eval()
    ids = torch.randint(0, 1024, (1, sum(lens)), device=device)
    chunks = list(torch.split(ids, lens, dim=1))
    theirs = Recorder("transformers", mq.torch_chunk_gated_delta_rule)
    mine = Recorder("ours", ours(launch))
    t0 = time.perf_counter()
    logits_t, states_t = _run(model, chunks, theirs)
    logits_o, states_o = _run(model, chunks, mine)
    expected_calls = (layers - 1) * len(lens)
    report = {
        "lens": lens, "layers": layers, "dtype": str(dtype), "seconds": time.perf_counter() - t0,
        "calls": {"transformers": theirs.calls, "ours": mine.calls},
        "logits_rel_err": rel_error(logits_o, logits_t),
        "state_rel_err": max(rel_error(a, b) for a, b in zip(states_o, states_t))}
    worst = max(max(c["rel_err_o"], c.get("rel_err_state", 0.0)) for c in mine.calls) if mine.calls else float("inf")
    report["ours_worst_vs_float64"] = worst
    report["ok"] = (len(mine.calls) == len(theirs.calls) == expected_calls and worst <= BUDGET
                    and all(c["initial_state"] for c in mine.calls[layers - 1:]))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--ptx", type=Path, help="folder of `gdn_prefill.py build`: ours as sm_75 turbo PTX (GPU)")
    mode.add_argument("--interpret", action="store_true", help="ours under TRITON_INTERPRET=1 on the CPU (tiny)")
    ap.add_argument("--lens", default="", help="the prompt's chunk lengths (default 8192,3000 on the GPU, 70,50 on the CPU)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    import torch

    if a.interpret:
        launch, device, dtype, lens = _launch_interpreted, torch.device("cpu"), torch.float32, [70, 50]
    else:
        launch, device, dtype, lens = _launch_ptx(a.ptx), torch.device("cuda"), torch.float16, [8192, 3000]
    if a.lens:
        lens = [int(x) for x in a.lens.split(",")]
    report = check(launch, device, dtype, lens, a.layers)
    text = json.dumps(report, indent=1)
    if a.json:
        a.json.write_text(text)
    print(text)
    print(f"model check: {'OK' if report['ok'] else 'FAILED'}: ours worst {report['ours_worst_vs_float64']:.2e} "
          f"vs float64 (budget {BUDGET:g}), logits {report['logits_rel_err']:.2e} and states "
          f"{report['state_rel_err']:.2e} between the two runs")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
