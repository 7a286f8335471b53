"""benchmarks/projection/project.py: the roofline projection onto a 2080 Ti (pure Python).

The numbers come from a profiled engine run on a lent GPU; these tests hold the model to what its
docstring says, on random profiles: each class scales by the ratio of its rooflines on the two
cards, no class goes under its launches' cost, the host's share is carried over, and the field
check scales the decode row as stated.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "projection"))
import project  # noqa: E402

CONFIG = json.loads((ROOT / "benchmarks/engine/qwen36-27b-tp2-8layer/config.json").read_text())
WEIGHTS = {"matrix": {"tensors": 40, "elements": 1_500_000_000, "bytes": 3_000_000_000},
           "lm_head": {"tensors": 1, "elements": 1_271_398_400, "bytes": 2_542_796_800},
           "embedding": {"tensors": 1, "elements": 1_271_398_400, "bytes": 2_542_796_800}}
NAMES = {"gemm": "nvjet_tst_128x64_64x8_1x1_v_bz_TNT", "gdn_prefill": "_state_kernel",
         "gdn_decode": "fused_recurrent_gated_delta_rule_packed_decode_kernel", "attention": "_attn_kernel",
         "conv1d": "_causal_conv1d_fwd_kernel", "other": "void at::native::vectorized_elementwise_kernel<4>"}


def _profile(rng: random.Random, tokens: int) -> dict:
    kernels = [{"name": n, "calls": rng.randint(1, 400), "us": rng.uniform(10, 5000)} for n in NAMES.values()]
    gpu = sum(k["us"] for k in kernels)
    return {"tokens": tokens, "wall_s": gpu / 1e6 * rng.uniform(1.05, 2.0), "gpu_us": gpu,
            "launches": sum(k["calls"] for k in kernels), "kernels": kernels}


def test_every_named_kernel_lands_in_its_class() -> None:
    for cls, name in NAMES.items():
        assert project.classify(name)[0] == cls, name
    assert project.classify("gdn_prep_k128_v128_ci")[0] == "gdn_prefill"
    assert project.classify("kernel_unified_attention_2d")[0] == "attention"


# Names from the profiled engine runs of 2026-12-07 (benchmarks/results/engine_h100_2026-12-07_vllm0.24_profile)
@pytest.mark.parametrize("name,plugin_on,cls,tensor", [
    ("_state_kernel", True, "gdn_prefill", True),            # ours, Turbo mma
    ("_prep_kernel", True, "gdn_prefill", True),
    ("_attn_kernel", True, "attention", True),
    ("_merge_kernel", True, "attention", False),             # ours, but no dot product
    ("chunk_gated_delta_rule_fwd_kernel_h_blockdim64", False, "gdn_prefill", False),   # FLA on sm_75: FMA
    ("chunk_fwd_kernel_o", False, "gdn_prefill", False),
    ("kernel_unified_attention", False, "attention", False),  # vLLM's Triton attention on sm_75: FMA
    ("nvjet_sm90_hsh_192x160_64x4_2x1_v_bz_coopB_TNT", False, "gemm", True),   # cuBLAS either way
    ("nvjet_sm90_hsh_192x160_64x4_2x1_v_bz_coopB_TNT", True, "gemm", True),
    ("_state_kernel", False, "gdn_prefill", False),          # a kernel of that name without the plugin: stock
])
def test_tensor_cores_only_for_cublas_and_our_turbo_kernels_with_the_plugin_on(name, plugin_on, cls, tensor) -> None:
    assert project.classify(name, plugin_on) == (cls, tensor)


def test_our_tensor_core_kernel_names_are_our_kernels() -> None:
    """The names the projection counts on tensor cores are Triton kernels defined in our kernels/."""
    source = "".join(p.read_text() for p in (ROOT / "src/caovan_vllm_sm75_turbo3/kernels").rglob("*.py"))
    for name in project.OURS_ON_TENSOR_CORES:
        assert f"\ndef {name}(" in source, name


@pytest.mark.parametrize("seed", range(6))
def test_each_class_scales_by_its_roofline_ratio_past_its_launch_cost(seed: int) -> None:
    rng = random.Random(seed)
    cards, _ = project.cards()
    here, there = cards["h100-sxm"], cards[project.TARGET]
    s = project.Shapes.of(CONFIG, WEIGHTS)
    launch = rng.uniform(0.5, 3.0)
    name = rng.choice(["prefill_8192", "prefill_32768", "decode_1024", "late_chunk_32768", "decode_at_131072"])
    prof = _profile(rng, 256)
    r = project.row_of(name, prof["tokens"], 2048)
    out = project.project_row(prof, r, s, here, there, launch)
    for cls, c in out["classes"].items():
        w = project.work(cls, r, s)
        if w is None:
            want = here.dram_gbps / there.dram_gbps
        else:
            want = there.roofline_s(*w, c["tensor"]) / here.roofline_s(*w, c["tensor"])
        assert c["ratio"] == pytest.approx(want)
        assert c["ratio"] >= 1.0   # the 2080 Ti is below the H100 on every limit
        fixed = min(c["launches"] * launch, c["us"])   # carried over; the rest scales
        assert c["projected_us"] == pytest.approx(fixed + (c["us"] - fixed) * want)
        assert c["us"] <= c["projected_us"] <= c["us"] * want
    host = prof["wall_s"] - prof["gpu_us"] / 1e6
    assert out["host_ms"] == pytest.approx(host * 1e3)
    assert out["projected_tok_s"] == pytest.approx(r.tokens / (out["projected_gpu_ms"] / 1e3 + host))
    assert out["projected_tok_s"] < out["measured_tok_s_profiled"]


def test_compute_bound_work_scales_by_peak_and_memory_bound_by_bandwidth() -> None:
    cards, _ = project.cards()
    here, there = cards["h100-sxm"], cards[project.TARGET]
    assert there.roofline_s(1e15, 1.0, True) / here.roofline_s(1e15, 1.0, True) == pytest.approx(
        here.tensor_fp16_fp32acc_tflops / there.tensor_fp16_fp32acc_tflops)
    assert there.roofline_s(1.0, 1e12, False) / here.roofline_s(1.0, 1e12, False) == pytest.approx(
        here.dram_gbps / there.dram_gbps)


def test_decode_reads_every_weight_once_a_token_and_prefill_computes_on_every_token() -> None:
    s = project.Shapes.of(CONFIG, WEIGHTS)
    d = project.row_of("decode_1024", 256, 2048)
    flops, bytes_ = project.work("gemm", d, s)
    assert bytes_ >= 256 * (WEIGHTS["matrix"]["bytes"] + WEIGHTS["lm_head"]["bytes"])
    p = project.row_of("prefill_8192", 8192, 2048)
    assert p.steps == 4
    flops_p, _ = project.work("gemm", p, s)
    assert flops_p == pytest.approx(2 * (WEIGHTS["matrix"]["elements"] * 8192 + WEIGHTS["lm_head"]["elements"] * 4))
    late = project.row_of("late_chunk_131072", 2048, 2048)
    whole = project.row_of("prefill_32768", 32768, 2048)
    assert late.pairs > 2048 * (131072 - 2048) and whole.pairs == 32768 * 32769 / 2


def test_field_check_scales_the_decode_row_as_stated() -> None:
    rng = random.Random(3)
    cards, _ = project.cards()
    s = project.Shapes.of(CONFIG, WEIGHTS)
    prof = _profile(rng, 256)
    decode = project.project_row(prof, project.row_of("decode_1024", 256, 2048), s, cards["h100-sxm"],
                                 cards[project.TARGET], 1.0)
    f = project.Field()
    fc = project.field_check(decode, s, f)
    per = fc["per_token_us"]
    assert per["all_reduce"] == f.layers * f.all_reduces_per_layer * f.all_reduce_us
    gdn = decode["classes"]["gdn_decode"]["projected_us"] / 256
    assert per["gdn_decode"] == pytest.approx(gdn * f.gdn_layers / s.gdn_layers)
    assert fc["projected_tok_s"] == pytest.approx(1e6 / sum(per.values()))
    assert fc["off_by"] == pytest.approx(fc["projected_tok_s"] / f.tok_s)


def test_an_unknown_card_or_a_run_without_profile_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no limits in cards.json"):
        project.measured_card("Tesla K80")
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"argv": []}))
    launch = tmp_path / "launch.json"
    launch.write_text(json.dumps({"card": "NVIDIA H100 80GB HBM3", "graph_us_per_kernel": 1.0}))
    with pytest.raises(SystemExit):
        project.main([str(run), "--launch", str(launch)])
