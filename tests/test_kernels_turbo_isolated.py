"""Run each Turbo compile test module in a fresh Python process without TRITON_INTERPRET."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.turbo_isolation import CHILD_FLAG

# The test_cli_kernels_check.py child imports vLLM and builds every allowlisted kernel plain and turbo:
# 337 s on a loaded 2-core machine, so a limit above the child's own 1500 s one.
pytestmark = [pytest.mark.triton_compile, pytest.mark.vllm, pytest.mark.timeout(1800)]

TESTS = Path(__file__).resolve().parent
MODULES = ["test_kernels_turbo_rewrite.py", "test_kernels_turbo_compile.py", "test_kernels_turbo_hook.py", "test_cli_kernels_check.py",
           "test_fla_releases.py",   # the vLLM FLA variants that ship with this Triton (3.6: 0.21-0.26)
           "test_bench_vllm_fla_sm75.py"]   # the benchmark's vLLM FLA chain: its PTX parameters


@pytest.mark.parametrize("module", MODULES)
def test_module_in_a_clean_process(module: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env[CHILD_FLAG] = "1"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(TESTS / module)],
                       cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=1500)
    tail = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, tail
    assert " passed" in r.stdout and " skipped" not in r.stdout.splitlines()[-1], tail
