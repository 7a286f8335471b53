"""Every pinned attention config compiles for Turing (GPUTarget("cuda", 75, 32)) and fits it.

Turbo build (sm_80 planning, PTX rewrite, ptxas for sm_75): at most 65,536 bytes of shared
memory, 0 spill bytes, both products on tensor cores (m16n8k8 mma in the PTX) and next to no
fp32 FMA left (the softmax's few). The split merge has no products and builds plain; it must fit
too. Pointers and layout strides are marked 16-divisible, as Triton's JIT specialises vLLM's
tensors. The builds run in one child process with TRITON_INTERPRET=0: Triton cannot compile in
a process where its interpreter has run (other test modules use it). Needs ptxas; no GPU.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("triton")   # torch is not needed: specs.py imports only the Triton kernels
from caovan_vllm_sm75_turbo3.kernels.attention.specs import (  # noqa: E402
    merge_specs, pinned_specs, plain_fallback_specs)
from helpers.fit import SHARED_LIMIT, assert_turbo_fits, build_in_child  # noqa: E402

# The module's builds run in whichever test comes first: each may take that long (the child's own limit).
pytestmark = [pytest.mark.triton_compile, pytest.mark.timeout(1500),
              pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")]

FMA_SHARE = 0.1  # fp32 FMA per tensor-core mma in the PTX, at most

SPECS = """
from caovan_vllm_sm75_turbo3.kernels.attention.specs import merge_specs, pinned_specs, plain_fallback_specs
TURBO, PLAIN = pinned_specs(), merge_specs() + plain_fallback_specs()
"""


@pytest.fixture(scope="module")
def builds() -> dict:
    return build_in_child(SPECS)


@pytest.mark.parametrize("name", [s.name for s in pinned_specs()])
def test_turbo_build_fits_sm75(builds, name):
    assert_turbo_fits(name, builds[name], FMA_SHARE)


@pytest.mark.parametrize("name", [s.name for s in merge_specs()])
def test_merge_builds_plain_within_sm75(builds, name):
    info = builds["plain:" + name]
    assert "error" not in info, info.get("error")
    assert info["build"] == "plain" and info["sm75_target"]
    assert info["shared_bytes"] <= SHARED_LIMIT and info["spill_bytes"] == 0


@pytest.mark.parametrize("name", [s.name for s in plain_fallback_specs()])
def test_plain_prefill_fallback_launches_on_turing(builds, name):
    """What runs where a prefill build comes out plain: it may spill (slow), never exceed 64 KiB (broken)."""
    info = builds["plain:" + name]
    assert "error" not in info, info.get("error")
    assert info["build"] == "plain" and info["sm75_target"] and info["shared_bytes"] <= SHARED_LIMIT


def test_every_prefill_whose_tile_cannot_build_plain_has_a_fallback():
    from caovan_vllm_sm75_turbo3.kernels.attention.configs import PREFILL, PREFILL_PLAIN

    assert {s.name for s in plain_fallback_specs()} == {
        f"attn_d{d}_{f}_prefill_plain_s1" for (d, f), cfg in PREFILL.items() if PREFILL_PLAIN[(d, f)] != cfg}
    assert len(plain_fallback_specs()) == 3   # head dim 256, each KV format
