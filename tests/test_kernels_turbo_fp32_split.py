"""fp32 dots on Turing tensor cores: the tf32 m16n8k8 -> three fp16 m16n8k8 split (PTX text), the
TTIR switch from IEEE to tf32, and the allowlist field that asks for it. No GPU, no Triton compile,
no numpy (the fast lane runs it); the warp emulation is in test_kernels_turbo_fp32_emulation.py."""

from __future__ import annotations

import re

import pytest

from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import parse_allowlist
from caovan_vllm_sm75_turbo3.kernels.turbo.pipeline import ieee_dots_as_tf32
from helpers.tf32_ptx import ALIASED_LINE, LINE, TF32, ptx_kernel, regs

from caovan_vllm_sm75_turbo3.kernels.turbo.rewrite import TurboRewriteError, rewrite_ptx

F16 = "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32"


def test_tf32_mma_becomes_three_fp16_mma_after_every_operand_is_packed() -> None:
    out = rewrite_ptx(ptx_kernel(LINE))
    assert out.tf32_split == 1 and "tf32" not in out.ptx and ".target sm_75" in out.ptx
    body = out.ptx.split(".visible .entry k()", 1)[1]
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    mmas = [i for i, line in enumerate(lines) if line.startswith(F16)]
    assert len(mmas) == 3 and mmas == list(range(mmas[0], mmas[0] + 3))
    # every operand is split and packed before the first mma writes D
    assert all(not line.startswith(F16) for line in lines[:mmas[0]])
    assert sum("cvt.rn.f16.f32" in line for line in lines[:mmas[0]]) == 12   # hi and lo of 6 registers
    reads = [line.split(",")[1].strip() for line in lines if line.startswith("mov.b32 %caovan_x,")]
    assert [r.rstrip(";") for r in reads] == ["%r5", "%r6", "%r7", "%r8", "%r9", "%r10"]
    d, c = ["%r1", "%r2", "%r3", "%r4"], ["%r11", "%r12", "%r13", "%r14"]
    (d1, a1, b1, c1), (d2, a2, b2, c2), (d3, a3, b3, c3) = (regs(lines[i]) for i in mmas)
    assert (d1, a1, b1, c1) == (d, ["%caovan_ah0", "%caovan_ah1"], ["%caovan_bh"], c)   # C + Ahi Bhi
    assert (d2, a2, b2, c2) == (d, ["%caovan_ah0", "%caovan_ah1"], ["%caovan_bl"], d)   # + Ahi Blo
    assert (d3, a3, b3, c3) == (d, ["%caovan_al0", "%caovan_al1"], ["%caovan_bh"], d)   # + Alo Bhi
    # fp16 k (2t, 2t+1) <- tf32 k (t, t+4): A (a0, a2) and (a1, a3), B (b0, b1), low half first
    assert "mov.b32 %caovan_ah0, {%caovan_h0, %caovan_h2};" in body
    assert "mov.b32 %caovan_ah1, {%caovan_h1, %caovan_h3};" in body
    assert "mov.b32 %caovan_bh, {%caovan_h4, %caovan_h5};" in body
    # a scoped block, so the temporaries never clash with Triton's registers or each other's splits
    assert re.search(r"^\s*\{\s*$", body, re.MULTILINE) and ".reg .b16 %caovan_h<6>" in body


def test_output_registers_may_alias_inputs() -> None:
    # D reuses A's and B's registers: the split reads them all before the first mma writes D (the
    # emulation in test_kernels_turbo_fp32_emulation.py runs this line)
    body = rewrite_ptx(ptx_kernel(ALIASED_LINE)).ptx
    first_mma = body.index(F16)
    for reg in ("%r5", "%r6", "%r7", "%r8", "%r9", "%r10"):
        assert f"mov.b32 %caovan_x, {reg};" in body[:first_mma]


def test_cvt_rna_tf32_becomes_a_move_and_other_tf32_conversions_stay_refused() -> None:
    out = rewrite_ptx(ptx_kernel("cvt.rna.tf32.f32 %r3, %r1;"))
    assert "mov.b32 %r3, %r1;" in out.ptx and "tf32" not in out.ptx
    with pytest.raises(TurboRewriteError, match="tf32"):
        rewrite_ptx(ptx_kernel("cvt.rn.tf32.f32 %r3, %r1;"))


@pytest.mark.parametrize("line, why", [
    ("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%r7}, "
     "{%r1,%r2,%r3,%r4};", "bf16"),
    ("mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32 {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%r7}, "
     "{%r1,%r2,%r3,%r4};", "no sm_75 form"),
    (f"@%p1 {LINE}", "no sm_75 form"),   # a predicated mma cannot become a block
])
def test_what_has_no_sm75_split_stays_refused(line: str, why: str) -> None:
    with pytest.raises(TurboRewriteError, match=re.escape(why)):
        rewrite_ptx(ptx_kernel(line))


# --- the TTIR switch and the allowlist field -----------------------------------------------------

TTIR = """    %b_Ai_21 = tt.dot %b_Ai_22_118, %b_A_21_123, %cst_10 : tensor<16x16xf32> * tensor<16x16xf32> -> tensor<16x16xf32> loc(#loc279)
    %x = tt.dot %a, %b, %c, inputPrecision = tf32x3 : tensor<16x16xf32> * tensor<16x16xf32> -> tensor<16x16xf32> loc(#loc1)
    %y = tt.dot %a, %b, %c, maxNumImpreciseAcc = 8 : tensor<16x16xf32> * tensor<16x16xf32> -> tensor<16x16xf32> loc(#loc2)
    %z = tt.dot %p, %q, %c : tensor<16x16xf16> * tensor<16x16xf16> -> tensor<16x16xf32> loc(#loc3)
"""


def test_ieee_fp32_dots_ask_for_tf32_and_nothing_else_changes() -> None:
    out, changed = ieee_dots_as_tf32(TTIR)
    got = out.splitlines()
    assert changed == 2
    assert "%b_A_21_123, %cst_10, inputPrecision = tf32 : tensor<16x16xf32>" in got[0]
    assert got[1] == TTIR.splitlines()[1]                   # the kernel's own precision choice stays
    assert "%c, inputPrecision = tf32, maxNumImpreciseAcc = 8 :" in got[2]   # the printed attribute order
    assert got[3] == TTIR.splitlines()[3]                   # fp16 dots are not fp32 dots


def _entry(**extra: object) -> dict:
    return {"name": "k", "modules": ["m"], "triton_versions": ["3.6"], "configs": [{}], "check": {}, **extra}


def test_allowlist_fp32_dots_field_defaults_off_and_refuses_unknown_modes() -> None:
    allow = parse_allowlist({"kernels": [_entry(), _entry(name="j", fp32_dots="f16x3")]})
    assert [e.fp32_dots for e in allow.kernels] == ["", "f16x3"]
    with pytest.raises(ValueError, match="fp32_dots"):
        parse_allowlist({"kernels": [_entry(fp32_dots="tf32")]})
