"""One vLLM engine, one mode: greedy output with logprobs, GDN call counts, speed; writes JSON.

Runs on the lent GPU machine (see run_device.sh), one process per mode, because a mode is set
before vLLM is imported:
- `--capability 7.5` reports the GPU as Turing to torch, NVML and vLLM, so vLLM takes its SM75
  paths (TRITON_ATTN, FLA's Triton GDN kernels, no FlashInfer GDN) and our plugin, reading the
  facts file in CAOVAN_FACTS, takes its Turing decisions. Triton still builds for the real GPU.
- `--shim sm75` also makes Triton build every kernel for sm_75 (Triton's own Turing code, and our
  Turbo hook's rewrite for allowlisted kernels, both through ptxas for sm_75) and hands the PTX
  to the driver, which JIT-compiles it for the GPU in hand. Test-only: what a Turing user runs,
  on another card.
Plugin on or off is decided by the caller: our wheel on PYTHONPATH, or not.

    python3 engine_check.py --model DIR --out FILE.json [--shim native|sm75] [--speed] [--ngram]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

# A prompt longer than --max-num-batched-tokens (later chunks start from a GDN state), a short
# one, and one that repeats the long one's first 2048 tokens (a prefix-cache hit).
CHUNK = 2048
PROMPTS = (3000, 700)
SHARED_PREFIX = 2048
GEN_TOKENS = 32
SPEED_PREFILL = (8192, 32768)
DECODE_TOKENS = 256


def report_turing(capability: tuple[int, int]) -> None:
    """Report `capability` to torch, NVML and vLLM; Triton keeps the real one for its target."""
    import torch
    from triton.runtime import driver

    driver.active.get_current_target()   # Triton's driver keeps the real query, taken before the patch
    torch.cuda.get_device_capability = lambda device=None: capability
    try:
        import pynvml
        pynvml.nvmlDeviceGetCudaComputeCapability = lambda handle: capability
    except ImportError:
        pass
    import vllm.third_party.pynvml as vllm_nvml
    vllm_nvml.nvmlDeviceGetCudaComputeCapability = lambda handle: capability
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability
    type(current_platform).get_device_capability = classmethod(
        lambda cls, device_id=0: DeviceCapability(*capability))


def install_sm75_shim() -> dict[str, int]:
    """Make Triton build for sm_75 and load the PTX through the driver's JIT. Returns a live count
    of the kernels so built."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime import driver

    built = {"kernels": 0}
    driver.active.get_current_target = lambda: GPUTarget("cuda", 75, 32)
    add_stages = CUDABackend.add_stages

    def add_stages_sm75(self: Any, stages: dict, options: Any, *rest: Any) -> None:
        add_stages(self, stages, options, *rest)   # Triton's stages, then the Turbo hook's, for sm_75
        to_cubin = stages["cubin"]

        def ptx_for_the_driver(src: str, metadata: dict) -> bytes:
            to_cubin(src, metadata)   # ptxas for sm_75, as on a Turing card: its errors still stop us
            built["kernels"] += 1
            return src.encode() + b"\0"

        stages["cubin"] = ptx_for_the_driver

    CUDABackend.add_stages = add_stages_sm75
    return built


def random_prompt(rng: random.Random, n: int) -> list[int]:
    """`n` token ids away from the special tokens of the Qwen3.5 vocabulary."""
    return [rng.randrange(1000, 200000) for _ in range(n)]


def completion(out: Any) -> dict[str, Any]:
    """Tokens, the top-2 logprobs of each step and the prefix-cache hits of one request."""
    c = out.outputs[0]
    steps = []
    for tok, lps in zip(c.token_ids, c.logprobs or []):
        ranked = sorted(((v.logprob, t) for t, v in lps.items()), reverse=True)[:2]
        steps.append({"chosen": tok, "chosen_logprob": lps[tok].logprob,
                      "top": [[t, lp] for lp, t in ranked]})
    return {"tokens": list(c.token_ids), "steps": steps, "num_cached_tokens": out.num_cached_tokens}


def gdn_census(model: Any) -> dict[str, Any]:
    """Which GDN ops of the model run our kernel; wraps ours to count calls (apply_model)."""
    ops = [m for m in model.modules() if hasattr(m, "_caovan_upstream") or type(m).__name__ == "ChunkGatedDeltaRule"]
    ours = [m for m in ops if getattr(m, "_caovan_kernel", None) is not None]
    for i, op in enumerate(ours):
        kernel = op._caovan_kernel
        op._caovan_calls = 0

        def counted(*a: Any, _op: Any = op, _k: Any = kernel, **kw: Any) -> Any:
            _op._caovan_calls += 1
            return _k(*a, **kw)

        op._caovan_kernel = counted
    return {"gdn_ops": len(ops), "ours": len(ours), "classes": sorted({type(m).__name__ for m in ops})}


def gdn_calls(model: Any) -> list[int]:
    """Calls of our kernel per GDN op since gdn_census (empty when none is ours)."""
    return [m._caovan_calls for m in model.modules() if hasattr(m, "_caovan_calls")]


def timed(llm: Any, prompts: list[list[int]], params: Any) -> tuple[float, list[Any]]:
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - t0, outs


def speed(llm: Any, rng: random.Random) -> dict[str, Any]:
    """Prefill tok/s for each SPEED_PREFILL length (fresh prompts: no cache hit; best of 2) and
    single-stream decode tok/s (the time of DECODE_TOKENS+1 tokens less that of 1, same length)."""
    from vllm import SamplingParams

    one = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
    rows: dict[str, Any] = {}
    for n in SPEED_PREFILL:
        times = [timed(llm, [random_prompt(rng, n)], one)[0] for _ in range(2)]
        rows[f"prefill_{n}"] = {"seconds": times, "tok_s": n / min(times)}
    many = SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS + 1, ignore_eos=True, detokenize=False)
    t1 = min(timed(llm, [random_prompt(rng, 1024)], one)[0] for _ in range(2))
    tn = min(timed(llm, [random_prompt(rng, 1024)], many)[0] for _ in range(2))
    rows["decode_1024"] = {"seconds_first": t1, "seconds_all": tn, "tok_s": DECODE_TOKENS / (tn - t1)}
    return rows


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        model=args.model, load_format="dummy", skip_tokenizer_init=True, dtype="float16", seed=0,
        max_model_len=40960, max_num_seqs=8, max_num_batched_tokens=CHUNK, enable_prefix_caching=True,
        gpu_memory_utilization=args.gpu_memory_utilization, attention_config={"backend": "TRITON_ATTN"},
        limit_mm_per_prompt={"image": 0, "video": 0},
        compilation_config={"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8]})
    if args.ngram:
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3,
                                    "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    return kw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="folder with the model's config.json")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--shim", choices=("native", "sm75"), default="native")
    parser.add_argument("--capability", default="7.5", help="the capability reported (default 7.5)")
    parser.add_argument("--speed", action="store_true", help="also time prefill and decode")
    parser.add_argument("--ngram", action="store_true", help="n-gram speculative decoding")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # one process: our patches reach the engine
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")    # no compile workers without the shim
    major, minor = (int(x) for x in args.capability.split("."))
    report_turing((major, minor))
    shim = install_sm75_shim() if args.shim == "sm75" else None
    result: dict[str, Any] = {"argv": sys.argv[1:], "plugin": "caovan_vllm_sm75_turbo3" in sys.modules or _plugin_present()}
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(**engine_kwargs(args))
    result["engine_start_s"] = time.perf_counter() - t0
    result["census"] = llm.apply_model(gdn_census)[0]
    rng = random.Random(1)
    prompts = [random_prompt(rng, n) for n in PROMPTS]
    prompts.append(prompts[0][:SHARED_PREFIX] + random_prompt(rng, 400))
    prompts.append((random_prompt(rng, 16) * 40)[:600])   # repeats: something for the n-gram proposer
    greedy = SamplingParams(temperature=0.0, max_tokens=GEN_TOKENS, logprobs=2, detokenize=False, ignore_eos=True)
    _, first = timed(llm, prompts[:2], greedy)
    _, again = timed(llm, prompts[2:], greedy)   # after the first finished: its blocks are cached
    result["completions"] = [completion(o) for o in first + again]
    result["gdn_calls_after_greedy"] = llm.apply_model(gdn_calls)[0]
    if args.speed:
        result["speed"] = speed(llm, random.Random(2))
    if shim is not None:
        result["sm75_ptx_kernels"] = shim["kernels"]
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"engine_check: wrote {args.out}", flush=True)
    return 0


def _plugin_present() -> bool:
    import importlib.util

    return importlib.util.find_spec("caovan_vllm_sm75_turbo3") is not None


if __name__ == "__main__":
    sys.exit(main())
