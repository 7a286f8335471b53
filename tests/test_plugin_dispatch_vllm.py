"""GDN dispatch inside real vLLM 0.21 processes on the CPU (Triton's interpreter), planned for
2 x 2080 Ti (`CAOVAN_FACTS=examples/2x2080ti-22g.json`).

Each scenario is one fresh Python process: vLLM's own plugin loader calls our entry point, then
the test builds vLLM's real `GatedDeltaNetAttention` (which asks for `ChunkGatedDeltaRule()`)
under a real `VllmConfig` for a tiny Qwen3-Next config, exactly as model construction does.

On the CPU platform vLLM's `CustomOp.dispatch_forward` would pick `forward_cpu` (enabled) or
`forward_native` (disabled, the default with Inductor's custom_ops=['none']), and
`ChunkGatedDeltaRule.__init__` then sets `forward_native` anyway unless FlashInfer runs on SM90
-- the same choice it makes on an SM75 GPU. So the op our replacement sees here is the one it
sees on a 2080 Ti; only the kernel's device differs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
FACTS = ROOT / "examples" / "2x2080ti-22g.json"
IFACE = "legacy-gdn-linear-attn-v020"

HARNESS = textwrap.dedent("""
    import json, logging, os, sys, traceback
    records = []
    class Keep(logging.Handler):
        def emit(self, record): records.append(record.getMessage())
    log = logging.getLogger("caovan_vllm_sm75_turbo3")
    log.addHandler(Keep()); log.setLevel(logging.DEBUG)
    sc = json.loads(os.environ.pop("TEST_SCENARIO"))
    out = {"records": records}

    import vllm.platforms as P
    from vllm.platforms.cpu import CpuPlatform
    P._current_platform = CpuPlatform()  # what vLLM resolves on a machine without a GPU
    sys.argv = ["/venv/bin/vllm", "serve", sc["model"]]
    import vllm.plugins
    from vllm.engine.arg_utils import EngineArgs
    try:
        for i in range(sc["loads"]):
            if i and sc["fresh_plugin_state"]:
                # A second copy of the plugin in this process: every once-per-process flag of
                # ours and vLLM's is reset, only vLLM's op registry remembers.
                import caovan_vllm_sm75_turbo3.plugin.register as reg
                import caovan_vllm_sm75_turbo3.plugin.dispatch.controller as ctl
                reg._REGISTERED = False
                ctl._DISPATCH = None
                vllm.plugins.plugins_loaded = False
            # vLLM loads plugins from EngineArgs.__post_init__ (an LLM(...)), with the settings in hand
            EngineArgs(model=sc["model"], additional_config=sc["additional_config"])
    except Exception as err:
        out["load_error"] = f"{type(err).__name__}: {err}"

    import torch
    from vllm.config import ModelConfig, SchedulerConfig, VllmConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    mc = ModelConfig(model=sc["model"], dtype="float16", max_model_len=sc["tokens"], skip_tokenizer_init=True)
    cfg = VllmConfig(model_config=mc, additional_config=sc["additional_config"],
                     scheduler_config=SchedulerConfig(max_num_batched_tokens=sc["tokens"], max_num_seqs=4,
                                                      max_model_len=sc["tokens"], is_encoder_decoder=False))
    with set_current_vllm_config(cfg):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{sc['port']}")
        initialize_model_parallel(1, 1)
        from vllm.model_executor.layers.mamba import gdn_linear_attn as gdn
        from vllm.model_executor.custom_op import op_registry_oot
        out["ours_registered"] = sum(1 for c in op_registry_oot.values() if hasattr(c, "_caovan_interface"))
        out["hooks_left"] = sum(1 for f in sys.meta_path if type(f).__name__ == "AfterImport"
                                and "gdn" in f.module)   # the GDN layer's hook (not the cache fix's)
        try:
            layer = gdn.GatedDeltaNetAttention(mc.hf_text_config, cfg, prefix="model.layers.0.linear_attn")
            second = gdn.GatedDeltaNetAttention(mc.hf_text_config, cfg, prefix="model.layers.1.linear_attn")
        except Exception as err:
            out["build_error"] = f"{type(err).__name__}: {err}"
            print("OUT " + json.dumps(out)); sys.exit(0)
        op = layer.chunk_gated_delta_rule
        out["op_class"] = type(op).__name__
        out["op_is_upstream_class"] = type(op) is gdn.ChunkGatedDeltaRule
        out["forward_method"] = op._forward_method.__name__
        out["same_method_for_second"] = second.chunk_gated_delta_rule._forward_method.__name__
        if sc["forward"]:
            from caovan_vllm_sm75_turbo3.kernels.gdn import gated_delta_rule_reference
            from caovan_vllm_sm75_turbo3.kernels.numerics import rel_error
            lengths = sc["lengths"]; T = sum(lengths); H, HV, K, V = 2, 4, 64, 64
            nrm = torch.nn.functional.normalize
            q = nrm(torch.randn(1, T, H, K), dim=-1).half(); k = nrm(torch.randn(1, T, H, K), dim=-1).half()
            v = torch.randn(1, T, HV, V).half()
            g = -torch.nn.functional.softplus(torch.randn(1, T, HV)); beta = torch.sigmoid(torch.randn(1, T, HV))
            h0 = 0.1 * torch.randn(len(lengths), HV, V, K)
            cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], dtype=torch.int32)
            core = torch.full((T, HV, V), float("nan"), dtype=torch.float16)  # poisoned
            with set_forward_context(None, cfg):
                o, s = op(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                          cu_seqlens=cu, chunk_indices=None, chunk_offsets=None,
                          use_qk_l2norm_in_kernel=False, core_attn_out=core)
            ro, rs = gated_delta_rule_reference(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                cu_seqlens=cu)
            out["err_o"], out["err_s"] = rel_error(o, ro), rel_error(s, rs)  # NaN/inf -> inf
            out["err_core"] = rel_error(core.unsqueeze(0), ro)
    print("OUT " + json.dumps(out))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_dir(tmp_path: Path, head_dim: int) -> Path:
    """A tiny Qwen3-Next config (2 key / 4 value GDN heads); no weights are needed to build a layer."""
    d = tmp_path / f"model-k{head_dim}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 32, "vocab_size": 256, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": head_dim, "linear_value_head_dim": head_dim, "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2, "max_position_embeddings": 512, "torch_dtype": "float16",
        "num_experts": 0, "decoder_sparse_step": 1, "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64, "num_experts_per_tok": 1, "hidden_act": "silu",
        "rms_norm_eps": 1e-6}))
    return d


def scenario(tmp_path: Path, *, head_dim: int = 64, loads: int = 1, fresh_plugin_state: bool = False,
             forward: bool = False, lengths: tuple[int, ...] = (), tokens: int = 128,
             additional_config: dict | None = None, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("CAOVAN_", "VLLM_", "TRITON_", "TORCH", "FLASHINFER_", "CUDA_CACHE", "_CAOVAN"))}
    full.update({"HOME": str(tmp_path / "home"), "CAOVAN_FACTS": str(FACTS), "TRITON_INTERPRET": "1",
                 "CAOVAN_CACHE_DIR": str(tmp_path / "cache"), "VLLM_WORKER_MULTIPROC_METHOD": "spawn", **env})
    full["TEST_SCENARIO"] = json.dumps({
        "model": str(_model_dir(tmp_path, head_dim)), "loads": loads, "fresh_plugin_state": fresh_plugin_state,
        "forward": forward, "lengths": list(lengths), "tokens": tokens, "port": _free_port(),
        "additional_config": additional_config or {}})
    r = subprocess.run([sys.executable, "-c", HARNESS], capture_output=True, text=True, timeout=540, env=full,
                       cwd=tmp_path)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("OUT ")), None)
    assert r.returncode == 0 and line, r.stdout[-3000:] + r.stderr[-5000:]
    return json.loads(line[4:])


def state_lines(out: dict) -> list[str]:
    return [r for r in out["records"] if r.startswith("Caovan SM75 Turbo3 GDN prefill: gdn_legacy=")]


def test_loaded_twice_registers_once_and_forward_matches_float64_on_a_packed_batch(tmp_path):
    out = scenario(tmp_path, loads=3, fresh_plugin_state=True, forward=True, lengths=(1, 64, 70, 9))
    assert "load_error" not in out and "build_error" not in out, out
    assert out["ours_registered"] == 1 and out["hooks_left"] == 0
    assert out["op_class"] == "CaovanChunkGatedDeltaRule" and not out["op_is_upstream_class"]
    assert out["forward_method"] == out["same_method_for_second"] == "forward_caovan"
    [line] = state_lines(out)  # one line per process, however often the plugin was loaded
    assert line.startswith(f"Caovan SM75 Turbo3 GDN prefill: gdn_legacy={IFACE} interface={IFACE} "
                           "kernel=caovan-gdn-chunk why=2 SM75 GPU(s); precompiled ")
    assert "H=2 HV=4 K=64 V=64 TP=1 max-num-batched-tokens=128" in line
    # fp16 inputs/outputs, fp32 state: 1e-2 relative to the float64 recurrence; a broken output is inf and fails
    for key in ("err_o", "err_s", "err_core"):
        assert out[key] <= 1e-2, (key, out[key])


def test_disable_switch_keeps_vllms_op_and_says_so(tmp_path):
    out = scenario(tmp_path, CAOVAN_GDN_LEGACY_DISABLE="1")
    assert "build_error" not in out, out
    assert out["ours_registered"] == 0 and out["op_is_upstream_class"]
    assert out["forward_method"] == "forward_native"
    [line] = state_lines(out)
    assert line.startswith(f"Caovan SM75 Turbo3 GDN prefill: gdn_legacy=disabled-by-user interface={IFACE} "
                           "kernel=vllm-upstream why=CAOVAN_GDN_LEGACY_DISABLE=1 (env CAOVAN_GDN_LEGACY_DISABLE)")


def test_disable_from_additional_config_is_decided_once_before_any_op(tmp_path):
    # LLM(additional_config=...): the process's one decision reads it where vLLM loads plugins, so the
    # dispatch never registers our op (before, it registered and only the op's first build said no).
    out = scenario(tmp_path, additional_config={"caovan_gdn_legacy_disable": True})
    assert "build_error" not in out and "load_error" not in out, out
    assert out["ours_registered"] == 0 and out["op_is_upstream_class"] and out["forward_method"] == "forward_native"
    [line] = state_lines(out)
    assert "gdn_legacy=disabled-by-user" in line and "additional-config caovan_gdn_legacy_disable" in line
    banner = next(r for r in out["records"] if r.startswith("Caovan vLLM SM75 Turbo3 external plugin"))
    assert "\ngdn_legacy=disabled-by-user\n" in banner
    assert not any("decided from" in r for r in out["records"])   # vLLM's config and the decision agree


def test_a_model_our_kernel_refuses_falls_back_with_the_exact_line(tmp_path):
    out = scenario(tmp_path, head_dim=96)  # our kernel takes head dims 64 and 128 only
    assert "build_error" not in out, out
    failed = [r for r in out["records"] if r.startswith("Caovan SM75 Turbo3 dispatch failed")]
    assert failed == [f"Caovan SM75 Turbo3 dispatch failed on interface {IFACE}: our kernel does not take this "
                      "model (H=2 HV=4 K=96 V=96 TP=1 max-num-batched-tokens=128 max-num-seqs=4 float16): "
                      "head dims K=96, V=96 are not supported: K and V must each be one of (64, 128)"]
    # vLLM's own kernel serves every layer of this process
    assert out["forward_method"] == out["same_method_for_second"] == "forward_native"
    [line] = state_lines(out)
    assert line.startswith(f"Caovan SM75 Turbo3 GDN prefill: gdn_legacy=upstream interface={IFACE} "
                           "kernel=vllm-fla-triton why=dispatch failed: our kernel does not take this model")


def test_failing_precompile_launch_falls_back_with_the_exact_line(tmp_path):
    # Without Triton's interpreter this GPU-less machine cannot launch a Triton kernel: a real
    # launch failure, the CPU's stand-in for e.g. `CUDA error: invalid resource handle`.
    out = scenario(tmp_path, TRITON_INTERPRET="0")
    assert "build_error" not in out, out
    failed = [r for r in out["records"] if r.startswith("Caovan SM75 Turbo3 dispatch failed")]
    assert len(failed) == 1, out["records"]
    assert failed[0].startswith(f"Caovan SM75 Turbo3 dispatch failed on interface {IFACE}: precompile launch for 1 "
                                "sequence(s), 128 tokens (H=2 HV=4 K=64 V=64 TP=1 max-num-batched-tokens=128 "
                                "max-num-seqs=4 float16) raised ")
    assert out["forward_method"] == out["same_method_for_second"] == "forward_native"
    [line] = state_lines(out)
    assert line.startswith(f"Caovan SM75 Turbo3 GDN prefill: gdn_legacy=upstream interface={IFACE} "
                           "kernel=vllm-fla-triton why=dispatch failed: precompile launch for 1 sequence(s)")


def test_failing_precompile_with_require_turbo3_refuses(tmp_path):
    out = scenario(tmp_path, TRITON_INTERPRET="0", additional_config={"caovan_require_turbo3": True})
    assert out["build_error"].startswith(
        "Turbo3Refused: require-turbo3 (additional-config caovan_require_turbo3) is on, but our GDN prefill "
        "cannot serve this process: precompile launch for 1 sequence(s)")
    assert any(r.startswith(f"Caovan SM75 Turbo3 dispatch failed on interface {IFACE}: ") for r in out["records"])


def test_precompile_off_still_dispatches_and_says_so(tmp_path):
    out = scenario(tmp_path, CAOVAN_FLASHQLA_PRECOMPILE="0")
    assert out["forward_method"] == "forward_caovan"
    [line] = state_lines(out)
    assert line.endswith("why=2 SM75 GPU(s); precompile off (env CAOVAN_FLASHQLA_PRECOMPILE): "
                         "the first prefill compiles")


@pytest.mark.parametrize("require", [False, True])
def test_unknown_layout_in_a_fake_vllm_tree_is_one_line_and_never_a_crash(tmp_path, require):
    """A vLLM whose GDN code lives somewhere we do not know: nothing of ours is registered."""
    fake = tmp_path / "fake"
    for pkg in ("vllm", "vllm/model_executor", "vllm/model_executor/layers", "vllm/model_executor/layers/mamba",
                "vllm/model_executor/layers/mamba/gdn_v99"):
        (fake / pkg).mkdir(parents=True)
        (fake / pkg / "__init__.py").write_text("")
    (fake / "vllm/model_executor/layers/mamba/gdn_v99/layer.py").write_text("class GatedDeltaNetV99: pass\n")
    code = textwrap.dedent("""
        import logging, sys
        records = []
        class Keep(logging.Handler):
            def emit(self, record): records.append(record.getMessage())
        logging.getLogger("caovan_vllm_sm75_turbo3").addHandler(Keep())
        logging.getLogger("caovan_vllm_sm75_turbo3").setLevel(logging.INFO)
        from caovan_vllm_sm75_turbo3.errors import Turbo3Refused
        from caovan_vllm_sm75_turbo3.plugin import dispatch
        import vllm
        assert vllm.__file__.startswith(sys.argv[1]), vllm.__file__
        try:
            dispatch.install()
            print("ERROR none")
        except Turbo3Refused as err:
            print("ERROR", err)
        import vllm.model_executor.layers.mamba.gdn_v99.layer
        print("HOOKS", sum(1 for f in sys.meta_path if type(f).__name__ == "AfterImport"))
        for r in records: print("REC", r)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAOVAN_")}
    env.update(PYTHONPATH=str(fake), CAOVAN_FACTS=str(FACTS), CAOVAN_REQUIRE_TURBO3="1" if require else "0")
    r = subprocess.run([sys.executable, "-c", code, str(fake)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [ln[4:] for ln in r.stdout.splitlines() if ln.startswith("REC ")]
    assert recs == ["Caovan SM75 Turbo3 GDN prefill: gdn_legacy=upstream interface=none kernel=vllm-upstream "
                    "why=not supported: this vLLM has none of the GDN modules we know "
                    "(vllm/model_executor/layers/mamba/gdn_linear_attn.py, "
                    "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py)"]
    assert "HOOKS 0" in r.stdout
    error = next(ln for ln in r.stdout.splitlines() if ln.startswith("ERROR"))
    if require:
        assert error.startswith("ERROR require-turbo3 (env CAOVAN_REQUIRE_TURBO3) is on, but our GDN prefill cannot "
                                "serve this process: this vLLM has none of the GDN modules we know")
    else:
        assert error == "ERROR none"


@pytest.mark.parametrize("require", [False, True])
def test_a_changed_gdn_module_is_not_supported_and_vllm_still_imports_it(tmp_path, require):
    """The module is where 0.21 has it, but its op lost what we rely on: vLLM's path, one line;
    with require-turbo3 the import (that is, vLLM's model construction) stops with the reason."""
    fake = tmp_path / "fake"
    mamba = fake / "vllm/model_executor/layers/mamba"
    mamba.mkdir(parents=True)
    for pkg in ("vllm", "vllm/model_executor", "vllm/model_executor/layers", "vllm/model_executor/layers/mamba"):
        (fake / pkg / "__init__.py").write_text("")
    (mamba / "gdn_linear_attn.py").write_text(textwrap.dedent("""
        class ChunkGatedDeltaRule:
            def __init__(self, backend):
                self._forward_method = self.forward_cuda
            def forward_cuda(self, x):
                return x
        class GatedDeltaNetAttention:
            pass
        LOADED = True
    """))
    code = textwrap.dedent("""
        import logging, sys
        records = []
        class Keep(logging.Handler):
            def emit(self, record): records.append(record.getMessage())
        logging.getLogger("caovan_vllm_sm75_turbo3").addHandler(Keep())
        logging.getLogger("caovan_vllm_sm75_turbo3").setLevel(logging.INFO)
        from caovan_vllm_sm75_turbo3.errors import Turbo3Refused
        from caovan_vllm_sm75_turbo3.plugin import dispatch
        dispatch.install()
        try:
            import vllm.model_executor.layers.mamba.gdn_linear_attn as m
            print("LOADED", m.LOADED)
        except Turbo3Refused as err:
            print("REFUSED", err)
        for r in records: print("REC", r)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAOVAN_")}
    env.update(PYTHONPATH=str(fake), CAOVAN_FACTS=str(FACTS), CAOVAN_REQUIRE_TURBO3="1" if require else "0")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    if require:
        assert ("REFUSED require-turbo3 (env CAOVAN_REQUIRE_TURBO3) is on, but our GDN prefill cannot serve this "
                "process: vLLM's vllm/model_executor/layers/mamba/gdn_linear_attn.py does not match") in r.stdout
    else:
        assert "LOADED True" in r.stdout
    [rec] = [ln[4:] for ln in r.stdout.splitlines() if ln.startswith("REC ")]
    assert rec.startswith(f"Caovan SM75 Turbo3 GDN prefill: gdn_legacy=upstream interface={IFACE} "
                          "kernel=vllm-upstream why=not supported: vLLM's "
                          "vllm/model_executor/layers/mamba/gdn_linear_attn.py does not match "
                          f"{IFACE}: ChunkGatedDeltaRule is not registered as CustomOp 'chunk_gated_delta_rule'")
    for part in ("ChunkGatedDeltaRule.__init__ requires ['backend']", "never selects self.forward_native",
                 "has no forward_native", "GatedDeltaNetAttention.__init__ does not build"):
        assert part in rec


VERIFY = textwrap.dedent("""
    import json, sys
    import vllm.platforms as P
    from vllm.platforms.cpu import CpuPlatform
    P._current_platform = CpuPlatform()
    from caovan_vllm_sm75_turbo3.plugin.dispatch import verify
    rows = verify.verify_prefill((verify.PrefillCase((1, 64, 70), key_heads=1, value_heads=2, head_dim=64),))
    print("OUT " + json.dumps([r.to_dict() for r in rows]))
""")


@pytest.mark.parametrize("disabled", [False, True])
def test_verify_runs_our_prefill_through_the_dispatch_path(tmp_path, disabled):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAOVAN_", "TRITON_"))}
    env.update(CAOVAN_FACTS=str(FACTS), TRITON_INTERPRET="1", HOME=str(tmp_path),
               CAOVAN_GDN_LEGACY_DISABLE="1" if disabled else "0")
    r = subprocess.run([sys.executable, "-c", VERIFY], capture_output=True, text=True, timeout=540, env=env)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("OUT ")), None)
    assert r.returncode == 0 and line, r.stdout[-2000:] + r.stderr[-4000:]
    rows = json.loads(line[4:])
    if disabled:
        assert rows == [{"name": "gdn-dispatch", "status": "FAIL", "rel_err": None, "ms": None,
                         "detail": rows[0]["detail"]}]
        assert rows[0]["detail"].startswith("gdn_legacy=disabled-by-user interface=legacy-gdn-linear-attn-v020")
        return
    assert [r["name"] for r in rows] == ["gdn-dispatch", "gdn-prefill T=135 (3 seq) H=1 HV=2 D=64 vs float64",
                                         "gdn-prefill T=135 (3 seq) H=1 HV=2 D=64 vs vLLM"]
    assert rows[0]["status"] == "PASS" and rows[0]["detail"].startswith(
        "gdn_legacy=legacy-gdn-linear-attn-v020 interface=legacy-gdn-linear-attn-v020 kernel=caovan-gdn-chunk")
    assert rows[1]["status"] == "PASS" and 0 < rows[1]["rel_err"] <= 1e-2
    assert rows[2]["status"] == "SKIP" and "no CUDA GPU" in rows[2]["detail"]
