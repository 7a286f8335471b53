"""Every pinned GDN config compiles for Turing (GPUTarget("cuda", 75, 32)) and fits it.

Turbo build (sm_80 planning, PTX rewrite, ptxas for sm_75): at most 65,536 bytes of shared
memory, 0 spill bytes, and the matrix products on tensor cores (m16n8k8 mma in the PTX).
Plain build (stock Triton for sm_75): the vLLM variant of the main shape compiles within
64 KiB; Triton lowers its products to FMA there, which spills (reported, not required).
Pointers are marked 16-byte aligned, as Triton's JIT specialises torch allocations: that is
the build a serving process gets (unaligned builds of some specs spill a few hundred bytes).
The builds run in one child process with TRITON_INTERPRET=0: Triton cannot compile in a
process where its interpreter has run (other test modules use it). Needs ptxas; no GPU.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("triton")   # torch is not needed: specs.py imports only the Triton kernels
from caovan_vllm_sm75_turbo3.kernels.gdn.configs import STATE  # noqa: E402
from caovan_vllm_sm75_turbo3.kernels.gdn.specs import pinned_specs, state_spec  # noqa: E402
from helpers.fit import SHARED_LIMIT, assert_turbo_fits, build_in_child  # noqa: E402

pytestmark = [pytest.mark.triton_compile,
              pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")]

PLAIN = "plain:gdn_prep_k128_v128_ci"

SPECS = """
from caovan_vllm_sm75_turbo3.kernels.gdn.specs import pinned_specs, prep_spec
TURBO, PLAIN = pinned_specs(), [prep_spec(128, 128, l2norm=False, chunk_indices=True)]
"""


@pytest.fixture(scope="module")
def builds() -> dict:
    return build_in_child(SPECS)


@pytest.mark.parametrize("name", [s.name for s in pinned_specs()])
def test_turbo_build_fits_sm75(builds, name):
    assert_turbo_fits(name, builds[name])


@pytest.mark.parametrize("cfg_key", [(k, v, cfg) for (k, v), cfgs in STATE.items() for cfg in cfgs],
                         ids=lambda c: state_spec(*c).name)
def test_pinned_state_shared_bytes_match_the_build(builds, cfg_key):
    """The launcher counts state programs per SM from the pinned shared bytes: they must be the build's."""
    info = builds[state_spec(*cfg_key).name]
    assert "error" not in info, info.get("error")
    assert info["shared_bytes"] == cfg_key[2].shared_bytes


def test_plain_build_compiles_within_shared_memory(builds):
    info = builds[PLAIN]
    assert "error" not in info, info.get("error")
    assert info["build"] == "plain" and info["sm75_target"]
    assert info["shared_bytes"] <= SHARED_LIMIT
    assert info["mma_count"] == 0 and info["fma_count"] > 0  # stock Triton: no tensor cores on sm_75
