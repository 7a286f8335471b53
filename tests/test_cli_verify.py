"""caovan-sm75-verify refuses clearly where there is no SM75 GPU to check (exit 2, one line)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from caovan_vllm_sm75_turbo3.cli import verify
from caovan_vllm_sm75_turbo3.cli.common import run_cli
from caovan_vllm_sm75_turbo3.runtime.facts import GpuFact


def test_no_gpu_gives_a_clear_line_and_exit_2(monkeypatch, capsys) -> None:
    monkeypatch.setattr("caovan_vllm_sm75_turbo3.runtime.probe.probe_gpus", lambda env, notes: ([], None, False))
    assert run_cli(verify.PROG, verify.main, []) == 2
    err = capsys.readouterr().err
    assert err.startswith("caovan-sm75-verify: error: no NVIDIA GPU is visible") and "Traceback" not in err


def test_a_non_turing_device_is_refused_naming_what_is_visible(monkeypatch, capsys) -> None:
    gpus = [GpuFact(index=0, name="NVIDIA GeForce RTX 3090", compute_capability="8.6")]
    monkeypatch.setattr("caovan_vllm_sm75_turbo3.runtime.probe.probe_gpus", lambda env, notes: (gpus, "580", True))
    assert run_cli(verify.PROG, verify.main, ["--device", "0"]) == 2
    err = capsys.readouterr().err
    assert "--device 0 is not a visible SM75 GPU" in err and "RTX 3090 (8.6)" in err


def test_console_script_on_this_machine() -> None:
    from caovan_vllm_sm75_turbo3.runtime.probe import probe_gpus

    gpus, _, _ = probe_gpus({}, [])
    if gpus:
        pytest.skip("this machine has a GPU; the no-GPU path is covered above")
    r = subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.verify"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "no NVIDIA GPU is visible" in r.stderr and r.stdout == ""
