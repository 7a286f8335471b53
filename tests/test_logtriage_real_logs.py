"""The logs of real `vllm serve` runs (vLLM 0.27.0's CPU build, made by the serve lane, machine paths
replaced) are judged right: a healthy server is never fatal, a failed start is never clean and is
named by its cause, with and without our own lines in the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from caovan_vllm_sm75_turbo3.logtriage.triage import triage_path
from helpers.real_vllm import without_our_lines

LOGS = Path(__file__).resolve().parent / "data" / "logs"

# name: (exit code, first failure id or None, words in its text or fix, ready)
CASES = {
    "real_vllm027_healthy_facts.log": (0, None, "", True),                 # plugin with SM75 facts, warmup, bench
    "real_vllm027_caovan_vllm_serve_no_gpu.log": (0, None, "", True),      # our banner says runtime=FAIL
    "real_vllm027_hybrid_gdn.log": (0, None, "", True),                    # Qwen3-Next, float32 SSM cache
    # the same, stopped by SIGINT: vLLM force-killed its engine core and logged EngineDeadError
    "real_vllm027_stopped_engine_dead_on_shutdown.log": (0, None, "", True),
    "real_vllm027_port_in_use.log": (2, "address-in-use", "Address already in use", False),
    "real_vllm027_missing_model.log": (2, "model-not-found", "does-not-exist", False),
    "real_vllm027_bad_flag.log": (2, "bad-argument", "--no-such-flag", False),
    "real_vllm027_kv_cache_too_small.log": (2, "kv-cache-too-small", "--max-model-len to at most 131072", False),
    # head_dim 16 is refused by the CPU attention at the first request: ready, then the engine died
    "real_vllm027_died_on_first_request.log": (2, "crash-after-serving", "head_dim=16", True),
}


def test_every_real_log_has_a_case():
    assert sorted(p.name for p in LOGS.glob("real_*.log")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_log_verdict(name):
    code, first, words, ready = CASES[name]
    for t in (triage_path(str(LOGS / name)), without_our_lines(LOGS / name)):
        assert t.exit_code == code, t.to_dict()
        assert (t.ready_line is not None) == ready
        assert t.vllm_version == ("0.27.0" if name != "real_vllm027_bad_flag.log" else None)   # argparse: no logo
        if first is None:
            assert t.first_failure is None and t.verdict in ("clean", "harmless-only")
        else:
            assert t.first_failure.id == first
            assert words in t.first_failure.text + t.first_failure.fix + t.first_failure.cause


def test_our_own_lines_in_the_real_logs_are_read_as_ours():
    healthy = triage_path(str(LOGS / "real_vllm027_healthy_facts.log"))
    assert healthy.caovan.status["sm75"] == "2/2" and healthy.caovan.processes >= 2
    assert healthy.http_ok > 10 and healthy.caovan.inactive_processes == 0
    no_gpu = triage_path(str(LOGS / "real_vllm027_caovan_vllm_serve_no_gpu.log"))
    assert no_gpu.caovan.status["runtime"] == "FAIL" and no_gpu.caovan.status["sm75"] == "0/0"
    assert no_gpu.caovan.processes == 0 and no_gpu.caovan.inactive_processes >= 2
    assert [f.status for f in no_gpu.findings if f.id == "caovan-runtime-fail"] == ["harmless"]


def test_a_requested_shutdown_is_not_the_engines_death():
    t = triage_path(str(LOGS / "real_vllm027_stopped_engine_dead_on_shutdown.log"))
    dead = next(f for f in t.findings if f.id == "engine-dead")
    assert dead.status == "harmless" and dead.note.startswith("after the shutdown that began at line")
