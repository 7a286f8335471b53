"""Every pinned attention config compiles for Turing (GPUTarget("cuda", 75, 32)) and fits it.

Turbo build (sm_80 planning, PTX rewrite, ptxas for sm_75): at most 65,536 bytes of shared
memory, 0 spill bytes, both products on tensor cores (m16n8k8 mma in the PTX) and next to no
fp32 FMA left (the softmax's few). The split merge has no products and builds plain; it must fit
too. Pointers and layout strides are marked 16-divisible, as Triton's JIT specialises vLLM's
tensors. The builds run in one child process with TRITON_INTERPRET=0: Triton cannot compile in
a process where its interpreter has run (other test modules use it). Needs ptxas; no GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("triton")   # torch is not needed: specs.py imports only the Triton kernels
from caovan_vllm_sm75_turbo3.kernels.attention.specs import merge_specs, pinned_specs  # noqa: E402

# The module's builds run in whichever test comes first: each may take that long (the child's own limit).
pytestmark = [pytest.mark.triton_compile, pytest.mark.timeout(1500),
              pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")]

SHARED_LIMIT = 65536
FMA_SHARE = 0.1  # fp32 FMA per tensor-core mma in the PTX, at most

_BUILD_ALL = """
import json
from caovan_vllm_sm75_turbo3.kernels.attention.specs import merge_specs, pinned_specs
from caovan_vllm_sm75_turbo3.kernels.turbo.compile import compile_for_sm75

def build(spec, turbo):
    try:
        info = compile_for_sm75(spec.fn, spec.signature, spec.constexprs, num_warps=spec.num_warps, attrs=spec.attrs,
                                turbo=turbo, num_stages=1)
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"[:2000]}
    return {"build": info.build, "sm75_target": ".target sm_75" in info.ptx, "k16_left": "m16n8k16" in info.ptx,
            **info.summary_numbers()}

out = {spec.name: build(spec, True) for spec in pinned_specs()}
out |= {spec.name: build(spec, False) for spec in merge_specs()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def builds() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="0")
    run = subprocess.run([sys.executable, "-c", _BUILD_ALL], env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", [s.name for s in pinned_specs()])
def test_turbo_build_fits_sm75(builds, name):
    info = builds[name]
    assert "error" not in info, info.get("error")
    assert info["build"] == "turbo" and info["sm75_target"] and not info["k16_left"]
    assert info["shared_bytes"] <= SHARED_LIMIT, f"{name}: {info['shared_bytes']} bytes of shared memory"
    assert info["spill_bytes"] == 0, f"{name}: {info['spill_bytes']} spill bytes ({info['registers']} registers)"
    assert info["mma_count"] > 0, f"{name}: no tensor-core mma in the PTX"
    assert info["fma_count"] <= FMA_SHARE * info["mma_count"], f"{name}: {info['fma_count']} FMA left in the PTX"


@pytest.mark.parametrize("name", [s.name for s in merge_specs()])
def test_merge_builds_plain_within_sm75(builds, name):
    info = builds[name]
    assert "error" not in info, info.get("error")
    assert info["build"] == "plain" and info["sm75_target"]
    assert info["shared_bytes"] <= SHARED_LIMIT and info["spill_bytes"] == 0
