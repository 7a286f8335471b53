"""Offline sm_75 compiles, plain and turbo, with the resource readout (no GPU needed)."""

from __future__ import annotations

import pytest

from helpers.turbo_isolation import in_clean_child

pytestmark = [in_clean_child, pytest.mark.triton_compile]

pytest.importorskip("triton")

from caovan_vllm_sm75_turbo3.kernels.turbo.compile import (  # noqa: E402
    TurboBuildError, compile_for_sm75, divisibility_attrs, jit_function)

from helpers.turbo_kernels import DOT_SIG, TF32_SIG, ieee_dot_kernel, tf32_dot_kernel, tile_dot_kernel  # noqa: E402

TILE = {"BM": 64, "BN": 64, "BK": 32}


def test_plain_sm75_dot_is_fma_and_turbo_is_mma() -> None:
    attrs = divisibility_attrs(jit_function(tile_dot_kernel), ["a_ptr", "b_ptr", "c_ptr", "N", "K"])
    plain = compile_for_sm75(tile_dot_kernel, DOT_SIG, TILE, num_warps=4, turbo=False, attrs=attrs)
    turbo = compile_for_sm75(tile_dot_kernel, DOT_SIG, TILE, num_warps=4, turbo=True, attrs=attrs)
    assert plain.build == "plain" and turbo.build == "turbo"
    assert plain.mma_count == 0 and plain.fma_count >= 64 * 64 * 32 // 128   # Triton 3.6's sm_75 fallback
    assert turbo.mma_count > 0 and turbo.fma_count == 0
    assert "m16n8k8" in turbo.ptx and "m16n8k16" not in turbo.ptx
    assert ".target sm_75" in turbo.ptx and ".target sm_75" in plain.ptx
    assert turbo.spill_bytes == 0 and turbo.registers is not None
    assert 0 < turbo.shared_bytes <= 65536
    assert turbo.entry == plain.entry == "tile_dot_kernel"
    assert turbo.cubin[:4] == b"\x7fELF" and turbo.kernel.metadata.num_stages == 1


def test_turbo_build_that_cannot_run_on_sm75_raises_with_reason() -> None:
    bf16 = {**DOT_SIG, "a_ptr": "*bf16", "b_ptr": "*bf16"}   # a bf16 mma: Turing has no bf16 at all
    with pytest.raises(TurboBuildError, match="bf16"):
        compile_for_sm75(tile_dot_kernel, bf16, TILE, num_warps=4, turbo=True)


def test_fp32_dot_builds_turbo_as_split_fp16_products() -> None:
    turbo = compile_for_sm75(tf32_dot_kernel, TF32_SIG, {"BM": 32}, num_warps=4, turbo=True)
    plain = compile_for_sm75(tf32_dot_kernel, TF32_SIG, {"BM": 32}, num_warps=4, turbo=False)
    assert plain.mma_count == 0   # sm_75's fp32 dot stays exact FMA when plain
    assert turbo.mma_count > 0 and turbo.mma_count % 3 == 0 and ".tf32" not in turbo.ptx
    assert turbo.spill_bytes == 0 and turbo.fma_count <= 0.05 * plain.fma_count


def test_ieee_fp32_dot_gets_tensor_cores_only_when_its_entry_asks() -> None:
    as_is = compile_for_sm75(ieee_dot_kernel, TF32_SIG, {"BM": 32}, num_warps=4, turbo=True)
    split = compile_for_sm75(ieee_dot_kernel, TF32_SIG, {"BM": 32}, num_warps=4, turbo=True, fp32_dots="f16x3")
    plain = compile_for_sm75(ieee_dot_kernel, TF32_SIG, {"BM": 32}, num_warps=4, turbo=False)
    assert as_is.mma_count == 0 and plain.mma_count == 0   # IEEE stays FMA unless the entry opts in
    assert split.mma_count > 0 and split.fma_count <= 0.05 * plain.fma_count
    assert "inputPrecision = tf32" not in split.kernel.asm["ttir"]   # only the turbo copy asks for tf32
