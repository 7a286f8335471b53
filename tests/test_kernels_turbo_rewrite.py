"""The sm_80 -> sm_75 PTX rewrite, on PTX that Triton 3.6 really emits (no GPU needed)."""

from __future__ import annotations

import re

import pytest

from helpers.turbo_isolation import in_clean_child

pytestmark = [in_clean_child, pytest.mark.triton_compile]

from caovan_vllm_sm75_turbo3.kernels.turbo.rewrite import TurboRewriteError, rewrite_ptx

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from caovan_vllm_sm75_turbo3.kernels.turbo.compile import jit_function  # noqa: E402

from helpers.turbo_kernels import DOT_SIG, tile_dot_kernel  # noqa: E402

K16 = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
K8 = "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32"


@pytest.fixture(autouse=True)
def _no_interpreter(monkeypatch):
    """Triton cannot compile while TRITON_INTERPRET=1 (another test module may set it)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.fixture(scope="module")
def sm80_ptx() -> str:
    """Triton's PTX for a 64x64x32 fp16 tile when planned for sm_80 with one stage."""
    src = ASTSource(jit_function(tile_dot_kernel), DOT_SIG, {"BM": 64, "BN": 64, "BK": 32})
    k = triton.compile(src, target=GPUTarget("cuda", 80, 32), options={"num_warps": 4, "num_stages": 1})
    return k.asm["ptx"]


def _regs(text: str) -> list[list[str]]:
    return [[r.strip() for r in g.split(",")] for g in re.findall(r"\{([^}]*)\}", text)]


def test_every_k16_mma_becomes_two_k8_with_the_right_halves(sm80_ptx: str) -> None:
    k16 = [line.strip() for line in sm80_ptx.splitlines() if K16 in line]
    assert k16, "Triton 3.6 planned as sm_80 should emit m16n8k16"
    out = rewrite_ptx(sm80_ptx)
    assert out.mma_split == len(k16)
    assert "m16n8k16" not in out.ptx
    k8 = [line.strip() for line in out.ptx.splitlines() if K8 in line]
    assert len(k8) == 2 * len(k16)
    for orig, first, second in zip(k16, k8[0::2], k8[1::2]):
        d, a, b, c = _regs(orig)
        d1, a1, b1, c1 = _regs(first)
        d2, a2, b2, c2 = _regs(second)
        assert (d1, a1, b1, c1) == (d, a[:2], b[:1], c)   # k 0-7 onto the original accumulator
        assert (d2, a2, b2, c2) == (d, a[2:], b[1:], d)   # k 8-15 onto the first half's result


def test_target_is_sm75_and_ptxas_for_sm75_accepts_it(sm80_ptx: str) -> None:
    from caovan_vllm_sm75_turbo3.kernels.turbo.resources import PtxasError, run_ptxas

    out = rewrite_ptx(sm80_ptx)
    assert re.search(r"^\.target sm_75\s*$", out.ptx, re.MULTILINE)
    with pytest.raises(PtxasError):       # the safety net: the unrewritten PTX is refused for sm_75
        run_ptxas(re.sub(r"\.target sm_\d+", ".target sm_75", sm80_ptx))
    cubin, report = run_ptxas(out.ptx)
    assert len(cubin) > 1000 and report.registers and report.spill_bytes == 0


def test_cvt_f16x2_splits_high_and_low_halves() -> None:
    ptx = ".version 8.7\n.target sm_80\n\tcvt.rn.f16x2.f32 \t%r3, %r1, %r2;\n"
    out = rewrite_ptx(ptx)
    assert out.cvt_split == 1 and "f16x2" not in out.ptx
    body = out.ptx.split(".target sm_75", 1)[1]
    # a (%r1) goes to the high half, b (%r2) to the low half: mov.b32 d, {lo, hi}
    assert re.search(r"cvt\.rn\.f16\.f32 (%\w+), %r1;.*cvt\.rn\.f16\.f32 (%\w+), %r2;.*"
                     r"mov\.b32 %r3, \{\2, \1\}", body)


@pytest.mark.parametrize("line, why", [
    # (a tf32 m16n8k8 is split into fp16 ones: tests/test_kernels_turbo_fp32_split.py)
    ("mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2}, "
     "{%r5}, {%f1,%f2,%f3,%f4};", "no sm_75 form"),
    ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, "
     "{%r5,%r6}, {%f1,%f2,%f3,%f4};", "bf16"),
    ("cp.async.cg.shared.global [%r1], [%rd1], 16;", "cp.async"),
    ("cvt.rn.bf16x2.f32 %r1, %f1, %f2;", "bf16"),
])
def test_sm80_only_instructions_are_refused_with_the_reason(line: str, why: str) -> None:
    with pytest.raises(TurboRewriteError, match=re.escape(why)):
        rewrite_ptx(f".version 8.7\n.target sm_80\n\t{line}\n")


def test_aliasing_output_registers_are_refused() -> None:
    line = (f"{K16} {{%r1, %r2, %r3, %r4}}, {{%r5, %r6, %r1, %r8}}, {{%r9, %r10}}, "
            "{%r1, %r2, %r3, %r4};")
    with pytest.raises(TurboRewriteError, match="alias"):
        rewrite_ptx(f".version 8.7\n.target sm_80\n\t{line}\n")


def test_not_ptx_is_refused() -> None:
    with pytest.raises(TurboRewriteError):
        rewrite_ptx("hello")
