"""Every pinned GDN config compiles for Turing (GPUTarget("cuda", 75, 32)) and fits it.

Turbo build (sm_80 planning, PTX rewrite, ptxas for sm_75): at most 65,536 bytes of shared
memory, 0 spill bytes, and the matrix products on tensor cores (m16n8k8 mma in the PTX).
Plain build (stock Triton for sm_75): the vLLM variant of the main shape compiles within
64 KiB; Triton lowers its products to FMA there, which spills (reported, not required).
Needs ptxas (CUDA toolkit) on PATH; no GPU.
"""

from __future__ import annotations

import shutil

import pytest

from caovan_vllm_sm75_turbo3.kernels.gdn.specs import pinned_specs, prep_spec
from caovan_vllm_sm75_turbo3.kernels.turbo.compile import compile_for_sm75

pytestmark = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")

SHARED_LIMIT = 65536


@pytest.mark.parametrize("spec", pinned_specs(), ids=lambda s: s.name)
def test_turbo_build_fits_sm75(spec):
    info = compile_for_sm75(spec.fn, spec.signature, spec.constexprs, num_warps=spec.num_warps, turbo=True)
    assert info.build == "turbo"
    assert ".target sm_75" in info.ptx and "m16n8k16" not in info.ptx
    assert info.shared_bytes <= SHARED_LIMIT, f"{spec.name}: {info.shared_bytes} bytes of shared memory"
    assert info.spill_bytes == 0, f"{spec.name}: {info.spill_bytes} spill bytes ({info.registers} registers)"
    assert info.mma_count > 0, f"{spec.name}: no tensor-core mma in the PTX"


def test_plain_build_compiles_within_shared_memory():
    spec = prep_spec(128, 128, l2norm=False, chunk_indices=True)
    info = compile_for_sm75(spec.fn, spec.signature, spec.constexprs, num_warps=spec.num_warps, turbo=False,
                            num_stages=1)
    assert info.build == "plain" and ".target sm_75" in info.ptx
    assert info.shared_bytes <= SHARED_LIMIT
    assert info.mma_count == 0 and info.fma_count > 0  # stock Triton: no tensor cores on sm_75
