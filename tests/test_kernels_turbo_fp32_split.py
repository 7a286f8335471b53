"""fp32 dots on Turing tensor cores: the tf32 m16n8k8 -> three fp16 m16n8k8 split (PTX text, and a
CPU emulation of the warp's fragments that runs the rewrite's own instructions), the TTIR switch
from IEEE to tf32, and the allowlist field that asks for it. No GPU, no Triton compile."""

from __future__ import annotations

import re

import numpy as np
import pytest

from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import parse_allowlist
from caovan_vllm_sm75_turbo3.kernels.turbo.pipeline import ieee_dots_as_tf32
from caovan_vllm_sm75_turbo3.kernels.turbo.rewrite import TurboRewriteError, rewrite_ptx

TF32 = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
F16 = "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32"
LINE = f"{TF32} {{%r1, %r2, %r3, %r4}}, {{%r5, %r6, %r7, %r8}}, {{%r9, %r10}}, {{%r11, %r12, %r13, %r14}};"


def _ptx(body: str) -> str:
    return f".version 8.7\n.target sm_80\n.visible .entry k()\n{{\n\t{body}\n}}\n"


def _regs(text: str) -> list[list[str]]:
    return [[r.strip() for r in g.split(",")] for g in re.findall(r"\{([^{}]*)\}", text)]


def test_tf32_mma_becomes_three_fp16_mma_after_every_operand_is_packed() -> None:
    out = rewrite_ptx(_ptx(LINE))
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
    (d1, a1, b1, c1), (d2, a2, b2, c2), (d3, a3, b3, c3) = (_regs(lines[i]) for i in mmas)
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
    # D reuses A's and B's registers: the split reads them all before the first mma writes D
    line = f"{TF32} {{%r5, %r6, %r9, %r8}}, {{%r5, %r6, %r7, %r8}}, {{%r9, %r10}}, {{%r11, %r12, %r13, %r14}};"
    assert rewrite_ptx(_ptx(line)).tf32_split == 1
    err, scale = _run_split(line, *_inputs(np.random.default_rng(3)), d=["%r5", "%r6", "%r9", "%r8"])
    assert np.max(np.abs(err) / scale) < 2 ** -20


def test_cvt_rna_tf32_becomes_a_move_and_other_tf32_conversions_stay_refused() -> None:
    out = rewrite_ptx(_ptx("cvt.rna.tf32.f32 %r3, %r1;"))
    assert "mov.b32 %r3, %r1;" in out.ptx and "tf32" not in out.ptx
    with pytest.raises(TurboRewriteError, match="tf32"):
        rewrite_ptx(_ptx("cvt.rn.tf32.f32 %r3, %r1;"))


@pytest.mark.parametrize("line, why", [
    ("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%r7}, "
     "{%r1,%r2,%r3,%r4};", "bf16"),
    ("mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32 {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%r7}, "
     "{%r1,%r2,%r3,%r4};", "no sm_75 form"),
    (f"@%p1 {LINE}", "no sm_75 form"),   # a predicated mma cannot become a block
])
def test_what_has_no_sm75_split_stays_refused(line: str, why: str) -> None:
    with pytest.raises(TurboRewriteError, match=re.escape(why)):
        rewrite_ptx(_ptx(line))


# --- a CPU emulation of one warp running the rewritten block -----------------------------------
# Fragment layouts from the PTX ISA (mma.m16n8k8): g = lane >> 2, t = lane % 4.

def _tf32_fragments(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> list[dict[str, object]]:
    """Each lane's registers as Triton's tf32 mma reads them (%r5-%r8 A, %r9-%r10 B, %r11-%r14 C)."""
    lanes = []
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        regs: dict[str, object] = {}
        for i, (r, c) in enumerate([(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)]):
            regs[f"%r{5 + i}"] = np.float32(A[r, c])
        regs["%r9"], regs["%r10"] = np.float32(B[t, g]), np.float32(B[t + 4, g])
        for i, (r, c) in enumerate([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
            regs[f"%r{11 + i}"] = np.float32(C[r, c])
        lanes.append(regs)
    return lanes


def _mma_f16(lanes: list[dict], d: list[str], a: list[str], b: list[str], c: list[str]) -> None:
    """One m16n8k8 f16 x f16 + f32 across the warp: exact products, fp32 result per mma."""
    A, B, C = np.zeros((16, 8)), np.zeros((8, 8)), np.zeros((16, 8))
    for lane, regs in enumerate(lanes):
        g, t = lane >> 2, lane % 4
        for row, reg in ((g, a[0]), (g + 8, a[1])):
            A[row, 2 * t], A[row, 2 * t + 1] = (float(h) for h in regs[reg])   # (low, high) halves
        B[2 * t, g], B[2 * t + 1, g] = (float(h) for h in regs[b[0]])
        for i, (r, col) in enumerate([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
            C[r, col] = float(regs[c[i]])
    D = (C + A @ B).astype(np.float32)
    for lane, regs in enumerate(lanes):
        g, t = lane >> 2, lane % 4
        for i, (r, col) in enumerate([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
            regs[d[i]] = D[r, col]


def _execute(block: str, lanes: list[dict]) -> None:
    """Run the rewritten block's instructions (the few kinds it uses) on every lane."""
    with np.errstate(invalid="ignore", over="ignore"):
        for line in (x.strip().rstrip(";") for x in block.splitlines()):
            if not line or line[0] in "{}." or line.startswith(".reg"):
                continue
            op, rest = line.split(None, 1)
            if op.startswith("mma.sync"):
                _mma_f16(lanes, *_regs(rest))
                continue
            dst, src = (s.strip() for s in rest.split(",", 1))
            for regs in lanes:
                if op == "mov.b32" and src.startswith("{"):
                    lo, hi = _regs(src)[0]
                    regs[dst] = (regs[lo], regs[hi])
                elif op == "mov.b32":
                    regs[dst] = regs[src]
                elif op == "cvt.rn.f16.f32":
                    regs[dst] = np.float16(regs[src])
                elif op == "cvt.f32.f16":
                    regs[dst] = np.float32(regs[src])
                elif op == "sub.f32":
                    x, y = (s.strip() for s in src.split(","))
                    regs[dst] = np.float32(regs[x] - regs[y])
                else:
                    raise AssertionError(f"the emulation does not know {op}")


def _inputs(rng: np.random.Generator, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    A = (rng.standard_normal((16, 8)) * scale).astype(np.float32)
    B = (rng.standard_normal((8, 8)) * scale).astype(np.float32)
    return A, B, rng.standard_normal((16, 8)).astype(np.float32)


def _run_split(line: str, A: np.ndarray, B: np.ndarray, C: np.ndarray, *, d: list[str] | None = None,
               ptx_edit=None) -> tuple[np.ndarray, np.ndarray]:
    """(D - float64 reference, sum |a||b| + |c|) after one warp runs the rewritten block of `line`."""
    ptx = rewrite_ptx(_ptx(line)).ptx
    if ptx_edit is not None:
        ptx = ptx_edit(ptx)
    lanes = _tf32_fragments(A, B, C)
    _execute(ptx.split(".visible .entry k()", 1)[1], lanes)
    D = np.zeros((16, 8))
    for lane, regs in enumerate(lanes):
        g, t = lane >> 2, lane % 4
        for reg, (r, col) in zip(d or ["%r1", "%r2", "%r3", "%r4"],
                                 [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
            D[r, col] = regs[reg]
    A64, B64, C64 = (x.astype(np.float64) for x in (A, B, C))
    return D - (C64 + A64 @ B64), np.abs(C64) + np.abs(A64) @ np.abs(B64)


def _tf32(x: np.ndarray) -> np.ndarray:
    """x rounded to tf32 (10 mantissa bits), what an sm_80 tf32 mma multiplies."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)


def test_emulated_split_matches_float64_far_better_than_tf32() -> None:
    rng = np.random.default_rng()   # fresh inputs on every run
    worst, worst_tf32 = 0.0, 0.0
    for _ in range(20):
        A, B, C = _inputs(rng)
        err, scale = _run_split(LINE, A, B, C)
        worst = max(worst, float(np.max(np.abs(err) / scale)))
        tf = C.astype(np.float64) + _tf32(A).astype(np.float64) @ _tf32(B).astype(np.float64)
        worst_tf32 = max(worst_tf32, float(np.max(np.abs(tf - (C + A.astype(np.float64) @ B)) / scale)))
    # hi + lo keeps ~22 bits per operand; the fp32 result rounding (2^-24) and the dropped lo*lo
    # term bound the error near 2^-21 of sum |a||b| + |c|; tf32 loses ~2^-11.
    assert worst < 2 ** -20, worst
    assert worst_tf32 > 2 ** -16 and worst < worst_tf32 / 100


def test_emulation_fails_a_wrong_packing_order() -> None:
    A, B, C = _inputs(np.random.default_rng(7))
    wrong = lambda ptx: ptx.replace("{%caovan_h0, %caovan_h2}", "{%caovan_h0, %caovan_h1}").replace(  # noqa: E731
        "{%caovan_h1, %caovan_h3}", "{%caovan_h2, %caovan_h3}")
    err, scale = _run_split(LINE, A, B, C, ptx_edit=wrong)
    assert np.max(np.abs(err) / scale) > 1e-2


def test_emulation_small_values_keep_an_absolute_floor_and_overflow_is_nan() -> None:
    A, B, _ = _inputs(np.random.default_rng(11), scale=1e-3)
    C = np.zeros((16, 8), dtype=np.float32)
    err, scale = _run_split(LINE, A, B, C)
    # |x - hi - lo| <= max(2^-22 |x|, 2^-25): below 2^-3 the lo part is an fp16 subnormal, so the
    # error is bounded by an absolute 2^-25 per operand element, not by 2^-22 of it
    floor = 2 ** -25 * (np.abs(A.astype(np.float64)).sum(1, keepdims=True) + np.abs(B.astype(np.float64)).sum(0))
    assert (np.abs(err) <= floor + 2 ** -22 * scale).all()
    assert np.max(np.abs(err) / scale) > 2 ** -20   # worse than the relative bound: the floor is real
    A[3, 5] = 70000.0   # beyond fp16: hi = inf, and the results that use it are NaN, never finite and wrong
    err, _ = _run_split(LINE, A, B, C)
    assert np.isnan(err[3]).all() and np.isfinite(np.delete(err, 3, axis=0)).all()


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
