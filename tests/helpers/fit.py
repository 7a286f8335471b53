"""Building kernel specs for sm_75 in a clean child process, and the checks every turbo build must pass.

The builds run in one child with TRITON_INTERPRET=0: Triton cannot compile in a process where its
interpreter has run (other test modules use it). `specs` is Python that defines `TURBO` and `PLAIN`,
two lists of KernelSpec the child builds with and without the Turbo rewrite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SHARED_LIMIT = 65536

_CHILD = """
import json
from caovan_vllm_sm75_turbo3.kernels.turbo.compile import compile_for_sm75
{specs}

def build(spec, turbo):
    try:
        info = compile_for_sm75(spec.fn, spec.signature, spec.constexprs, num_warps=spec.num_warps, attrs=spec.attrs,
                                turbo=turbo, num_stages=1, maxnreg=spec.maxnreg)
    except Exception as err:
        return {{"error": f"{{type(err).__name__}}: {{err}}"[:2000]}}
    return {{"build": info.build, "sm75_target": ".target sm_75" in info.ptx, "k16_left": "m16n8k16" in info.ptx,
            **info.summary_numbers()}}

out = {{spec.name: build(spec, True) for spec in TURBO}}
out |= {{"plain:" + spec.name: build(spec, False) for spec in PLAIN}}
print(json.dumps(out))
"""


def build_in_child(specs: str, timeout_s: int = 1200) -> dict:
    """name -> build numbers (turbo builds by spec name, plain ones as "plain:NAME"), or {"error": ...}."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    run = subprocess.run([sys.executable, "-c", _CHILD.format(specs=specs)], env=env, capture_output=True,
                         text=True, timeout=timeout_s)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def assert_turbo_fits(name: str, info: dict, fma_per_mma: float | None = None) -> None:
    """A turbo build for sm_75: no m16n8k16 left, <= 64 KiB shared, 0 spills, mma present, and (when
    given) at most `fma_per_mma` fp32 FMA per mma."""
    assert "error" not in info, info.get("error")
    assert info["build"] == "turbo" and info["sm75_target"] and not info["k16_left"]
    assert info["shared_bytes"] <= SHARED_LIMIT, f"{name}: {info['shared_bytes']} bytes of shared memory"
    assert info["spill_bytes"] == 0, f"{name}: {info['spill_bytes']} spill bytes ({info['registers']} registers)"
    assert info["mma_count"] > 0, f"{name}: no tensor-core mma in the PTX"
    if fma_per_mma is not None:
        assert info["fma_count"] <= fma_per_mma * info["mma_count"], f"{name}: {info['fma_count']} FMA left"
