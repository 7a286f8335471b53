"""benchmarks/gdn_cold_start_sm75.py: how a build's time and its ptxas time are read (no Triton needed)."""

from __future__ import annotations

import random
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gdn_cold_start_sm75 as cold  # noqa: E402


def _fake_ptxas(tmp_path: Path, seconds: float) -> Path:
    exe = tmp_path / "bin" / "ptxas"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text(f"#!/bin/sh\nsleep {seconds}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_only_ptxas_runs_are_clocked_and_the_readout_is_left_out(tmp_path):
    ptxas = _fake_ptxas(tmp_path, 0.05)
    runs = random.randrange(1, 4)

    def build():
        subprocess.run(["true"], check=True)            # not ptxas: not clocked
        for _ in range(runs + 1):                        # the last: compile_for_sm75's readout
            subprocess.run([str(ptxas)], check=True)
        return type("Info", (), {"shared_bytes": 70000, "registers": 1, "mma_count": 0})()

    row = cold.timed_build(build)
    assert row["ptxas_runs"] == runs
    assert 0.05 * runs <= row["ptxas_seconds"] < row["seconds"] + 1e-9
    assert row["fits_turing"] is False   # 70,000 bytes: over a 2080 Ti's 65,536
    assert subprocess.run is not None and "timed_run" not in repr(subprocess.run)   # put back


def test_a_build_that_fails_still_counts_its_time_and_says_why():
    def build():
        raise RuntimeError("out of resource: shared memory")

    row = cold.timed_build(build)
    assert "RuntimeError: out of resource" in row["error"] and row["seconds"] >= 0 and row["ptxas_runs"] == 0
    sums = cold.totals([{"kernel": "k", **row}, {"kernel": "k", "seconds": 2.0, "ptxas_seconds": 1.0,
                                                   "fits_turing": False}])
    assert sums["all"]["builds"] == 2 and sums["all"]["failed"] == 1 and sums["all"]["over_turing_shared"] == 1
    assert sums["k"]["seconds"] == row["seconds"] + 2.0
