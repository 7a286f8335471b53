"""The FlashInfer sampler probe: a real test build in a child process (which fails on this CI
machine: CUDA 13 without curand.h), the time limit, and the result cached per key and toolchain."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from helpers.plans import plan_here
from test_cli_serve import FACTS, MODEL, clean_env, launch, venv_with_fake_vllm  # noqa: F401 (fixture)

from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args
from caovan_vllm_sm75_turbo3.runtime import flashinfer_probe as fp


def _has_curand() -> bool:
    dirs = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", "/usr/local", "/usr"]
    return any(Path(d, "include", "curand.h").is_file() for d in dirs if d)


@pytest.mark.vllm
def test_probe_mode_really_builds_and_keeps_the_sampler_off_when_it_fails(tmp_path, venv_with_fake_vllm):
    if _has_curand():
        pytest.skip("this machine has curand.h: the FlashInfer sampler build may succeed here")
    home, record = tmp_path / "home", tmp_path / "fake.json"
    home.mkdir()
    env = clean_env(home, FAKE_VLLM_OUT=str(record), CAOVAN_FACTS=str(FACTS), CAOVAN_PROFILE="none",
                    CAOVAN_FLASHINFER_SAMPLER="probe", CAOVAN_PROBE_TIMEOUT_S="280")
    r, _ = launch(venv_with_fake_vllm, [MODEL], env)
    assert r.returncode == 0, r.stderr
    assert "flashinfer_sampler: test-building FlashInfer's sampler (up to 280 s) ..." in r.stdout
    assert "flashinfer_sampler=disabled-probe-failed" in r.stdout.splitlines()
    got = json.loads(record.read_text())["env"]
    assert got["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    keydir = Path(got["FLASHINFER_WORKSPACE_BASE"]).parent
    result = json.loads((keydir / fp.RESULT_FILE).read_text())
    assert result["ok"] is False and "curand.h" in result["reason"]
    # the build ran in the isolated workspace, for sm_75 only
    built = Path(got["FLASHINFER_WORKSPACE_BASE"], ".cache", "flashinfer")
    assert [p.name for p in built.glob("*/*")] == ["75"]
    assert list(built.glob("*/75/cached_ops/sampling"))
    # a second launch reads the stored result instead of building again
    start = time.monotonic()
    r2, _ = launch(venv_with_fake_vllm, [MODEL], env)
    assert r2.returncode == 0 and "test-building" not in r2.stdout
    assert "flashinfer_sampler=disabled-probe-failed" in r2.stdout.splitlines()
    assert time.monotonic() - start < 10


def test_time_limit_kills_the_whole_build(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    slow = tmp_path / "slow-python"
    slow.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        sleep 300 &
        echo $! > {pidfile}
        sleep 300
    """))
    slow.chmod(0o755)
    start = time.monotonic()
    result = fp.run_probe({"PATH": os.environ["PATH"]}, 2, "fp", python=str(slow))
    assert time.monotonic() - start < 30
    assert result.ok is False and result.reason == "no result within 2 s (CAOVAN_PROBE_TIMEOUT_S)"
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the build's own children survived the time limit"
        time.sleep(0.1)


def test_a_child_that_exits_without_building_is_a_failure(tmp_path):
    fake = tmp_path / "py"
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named flashinfer' >&2\nexit 1\n")
    fake.chmod(0o755)
    result = fp.run_probe({}, 30, "fp", python=str(fake))
    assert result.ok is False and result.reason == "ModuleNotFoundError: No module named flashinfer"


def test_results_are_stored_per_key_and_toolchain(tmp_path):
    ok = fp.SamplerProbe(True, "sampling module built", 40.0, "nvcc=/a|release=13.0", "now")
    fp.store(tmp_path, ok)
    got = fp.read_cached(tmp_path, "nvcc=/a|release=13.0")
    assert got == fp.SamplerProbe(True, "sampling module built", 40.0, "nvcc=/a|release=13.0", "now", cached=True)
    assert fp.read_cached(tmp_path, "nvcc=/a|release=12.8") is None  # another toolkit: test again
    (tmp_path / fp.RESULT_FILE).write_text("{half")
    assert fp.read_cached(tmp_path, "nvcc=/a|release=13.0") is None
    assert fp.read_cached(tmp_path / "missing", "x") is None


def test_fingerprint_follows_the_toolkit():
    a = fp.toolchain_fingerprint({"CUDA_HOME": "/usr/local/cuda"}, "/usr/local/cuda/bin/nvcc", "13.0")
    assert a != fp.toolchain_fingerprint({"CUDA_HOME": "/usr/local/cuda"}, "/usr/local/cuda/bin/nvcc", "12.9")
    assert a != fp.toolchain_fingerprint({"CUDA_HOME": "/opt/cuda"}, "/usr/local/cuda/bin/nvcc", "13.0")
    assert a == fp.toolchain_fingerprint({"CUDA_HOME": "/usr/local/cuda", "OTHER": "x"},
                                         "/usr/local/cuda/bin/nvcc", "13.0")


def test_launch_plans_probe_once_and_dry_run_never(tmp_path, monkeypatch):
    calls = []

    def fake_probe(env, timeout_s, fingerprint, python=sys.executable):
        calls.append((env["FLASHINFER_WORKSPACE_BASE"], env["FLASHINFER_CUDA_ARCH_LIST"], timeout_s))
        return fp.SamplerProbe(True, "sampling module built", 1.0, fingerprint, "now")

    monkeypatch.setattr(fp, "run_probe", fake_probe)
    env = {"HOME": str(tmp_path / "home"), "CAOVAN_FACTS": str(FACTS), "CAOVAN_FLASHINFER_SAMPLER": "probe",
           "CAOVAN_PROBE_TIMEOUT_S": "77"}
    args = read_vllm_args([MODEL])
    dry = plan_here(env, args, write=False)
    assert dry.plan.status["flashinfer_sampler"] == "probe-pending" and calls == []
    assert not (tmp_path / "home").exists()
    first = plan_here(env, args, write=True)
    assert first.plan.status["flashinfer_sampler"] == "enabled-probe-passed"
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in first.plan.env_updates()
    assert calls == [(str(first.keydir.path / "flashinfer"), "7.5", 77)]
    second = plan_here(env, args, write=True)
    assert len(calls) == 1 and second.plan.sampler_probe.cached
    assert second.plan.status["flashinfer_sampler"] == "enabled-probe-passed"
    # a dry run now shows the stored result, still without building
    assert plan_here(env, args, write=False).plan.status["flashinfer_sampler"] == "enabled-probe-passed"
    assert len(calls) == 1


def test_no_probe_when_the_launch_would_stop(tmp_path, monkeypatch):
    monkeypatch.setattr(fp, "run_probe", lambda *a, **k: pytest.fail("probe ran although the launch stops"))
    env = {"HOME": str(tmp_path), "CAOVAN_FACTS": str(FACTS), "CAOVAN_FLASHINFER_SAMPLER": "probe",
           "CAOVAN_REQUIRE_TURBO3": "1", "CAOVAN_GDN_LEGACY_DISABLE": "1", "CAOVAN_TURBO": "off"}
    prepared = plan_here(env, read_vllm_args([MODEL]), write=True)
    assert prepared.plan.refusal and not (tmp_path / ".cache").exists()
