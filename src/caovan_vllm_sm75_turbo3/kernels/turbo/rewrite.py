"""The PTX text rewrite from sm_80 to sm_75 instructions. Pure text; imports no Triton.

An fp16 `mma.sync.m16n8k16` (sm_80) is exactly two `m16n8k8` (sm_75): k 0-7 use A registers
0-1 and B register 0, k 8-15 use A registers 2-3 and B register 1, and the second accumulates
onto the first's result. `cvt.rn.f16x2.f32 d, a, b` (sm_80) packs `a` into the high and `b`
into the low half of `d`; sm_75 does it with two `cvt.rn.f16.f32` and a `mov.b32`.

An fp32 dot planned as sm_80 is a tf32 `mma.sync.m16n8k8` (Turing has none). Each becomes a
split-fp16 product with fp32 accumulation: every fp32 operand x is split into hi = f16(x) and
lo = f16(x - hi), and D = C + Ahi*Bhi + Ahi*Blo + Alo*Bhi by three fp16 m16n8k8. The fp16 form
holds k 2t, 2t+1 where the tf32 form holds k t, t+4 (PTX ISA, mma.m16n8k8 fragments); packing
A's (a0, a2) and (a1, a3) and B's (b0, b1) applies the same k permutation to both operands, and
a dot does not depend on the order of its k terms. Per operand |x - hi - lo| <= max(2^-22 |x|,
2^-25) (the 2^-25 floor is fp16's subnormal step), finer than tf32's 2^-11 |x|. |x| >= 65520
rounds hi to inf and makes the result NaN: visible, never a silently wrong value.
`cvt.rna.tf32.f32` becomes a move, since the split reads the full fp32 value. Anything else that
needs sm_80 or newer is refused with the reason: the kernel then builds plain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import TurboError

# Bump when the rewrite's output changes: it is part of Triton's cache key.
REWRITE_VERSION = "2"

_REGS = r"\{([^}]*)\}"
_MMA_K16 = re.compile(
    r"mma\.sync\.aligned\.m16n8k16\.row\.col\.(f16|f32)\.f16\.f16\.(f16|f32)\s*"
    + _REGS + r"\s*,\s*" + _REGS + r"\s*,\s*" + _REGS + r"\s*,\s*" + _REGS + r"\s*;")
# Anchored at the line start: a predicated mma is left alone, and then refused below.
_MMA_TF32 = re.compile(
    r"^(\s*)mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32\s*"
    + _REGS + r"\s*,\s*" + _REGS + r"\s*,\s*" + _REGS + r"\s*,\s*" + _REGS + r"\s*;", re.MULTILINE)
_CVT_TF32 = re.compile(r"cvt\.rna\.tf32\.f32\s+(%\w+)\s*,\s*(%\w+)\s*;")
_CVT_X2 = re.compile(r"cvt\.rn\.f16x2\.f32\s+(%\w+)\s*,\s*(%\w+)\s*,\s*(%\w+)\s*;")
_TARGET = re.compile(r"^(\s*\.target\s+)sm_\w+", re.MULTILINE)

# sm_75 has these mma forms; any other mma left in the PTX needs a newer GPU.
_SM75_MMA = re.compile(r"mma\.sync\.aligned\.(m16n8k8\.row\.col\.f(16|32)\.f16\.f16\.f(16|32)"
                       r"|m8n8k4\.|m8n8k16\.|m8n8k32\.|m8n8k128\.)")

# Instructions Triton may emit when it plans for sm_80+ that sm_75 lacks, with the reason shown
# in the fallback message. ptxas for sm_75 catches whatever this list misses.
_SM80_ONLY: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (why, re.compile(pattern, re.MULTILINE)) for why, pattern in (
        ("cp.async (asynchronous copies need sm_80)", r"^\s*(@!?%\w+\s+)?cp\.(async|reduce\.async)"),
        ("mbarrier (needs sm_80)", r"^\s*(@!?%\w+\s+)?mbarrier\."),
        ("bf16 arithmetic or conversion (Turing has no bf16)", r"^\s*(@!?%\w+\s+)?\w[\w.]*\.bf16"),
        ("tf32 conversion (needs sm_80)", r"^\s*(@!?%\w+\s+)?cvt\.\w*\.?tf32"),
        ("packed f32->f16x2/bf16x2 conversion variant (needs sm_80)", r"^\s*(@!?%\w+\s+)?cvt\.[\w.]*x2\.f32"),
        ("f16 min/max (needs sm_80)", r"^\s*(@!?%\w+\s+)?(min|max)(\.\w+)*\.f16"),
        ("redux.sync (needs sm_80)", r"^\s*(@!?%\w+\s+)?redux\.sync"),
        ("L2 cache policy (needs sm_80)", r"createpolicy|\.L2::cache_hint|\.L2::256B"),
        ("Hopper/Blackwell instruction", r"^\s*(@!?%\w+\s+)?(wgmma|stmatrix|setmaxnreg|elect\.sync|"
                                         r"griddepcontrol|fence\.proxy|tcgen05|st\.async|multimem)"),
    ))


class TurboRewriteError(TurboError):
    """The PTX cannot be rewritten for sm_75; `str(err)` is the reason, for the fallback log."""


@dataclass(frozen=True)
class RewriteResult:
    """The sm_75 PTX and how many instructions were split."""

    ptx: str
    mma_split: int
    cvt_split: int
    tf32_split: int = 0   # tf32 m16n8k8 turned into three fp16 m16n8k8


def _regs(group: str) -> list[str]:
    return [r.strip() for r in group.split(",") if r.strip()]


def _split_mma(m: re.Match[str]) -> str:
    dtype, ctype = m.group(1), m.group(2)
    d, a, b, c = (_regs(m.group(i)) for i in (3, 4, 5, 6))
    acc = 4 if dtype == "f32" else 2
    if len(a) != 4 or len(b) != 2 or len(d) != acc or len(c) != (4 if ctype == "f32" else 2):
        raise TurboRewriteError(f"unexpected m16n8k16 register lists: {m.group(0)!r}")
    if set(d) & set(a[2:] + b[1:]):
        # The second half reads A/B after the first half has written D: they must not alias.
        raise TurboRewriteError(f"m16n8k16 output registers alias its inputs: {m.group(0)!r}")
    op = f"mma.sync.aligned.m16n8k8.row.col.{dtype}.f16.f16.{ctype}"
    op2 = f"mma.sync.aligned.m16n8k8.row.col.{dtype}.f16.f16.{dtype}"
    dd = ", ".join(d)
    return (f"{op} {{{dd}}}, {{{a[0]}, {a[1]}}}, {{{b[0]}}}, {{{', '.join(c)}}};\n\t"
            f"{op2} {{{dd}}}, {{{a[2]}, {a[3]}}}, {{{b[1]}}}, {{{dd}}};")


def _split_cvt(m: re.Match[str]) -> str:
    d, hi, lo = m.groups()
    # A scoped block so the two temporaries never clash with Triton's registers.
    return ("{ .reg .b16 %caovan_lo, %caovan_hi; "
            f"cvt.rn.f16.f32 %caovan_hi, {hi}; cvt.rn.f16.f32 %caovan_lo, {lo}; "
            f"mov.b32 {d}, {{%caovan_lo, %caovan_hi}}; }}")


def _split_tf32(m: re.Match[str]) -> str:
    indent = m.group(1)
    d, a, b, c = (_regs(m.group(i)) for i in (2, 3, 4, 5))
    if len(a) != 4 or len(b) != 2 or len(d) != 4 or len(c) != 4:
        raise TurboRewriteError(f"unexpected tf32 m16n8k8 register lists: {m.group(0).strip()!r}")
    # A scoped block; every packed operand is made before the first mma writes D, so D may alias A, B or C.
    lines = [".reg .f32 %caovan_x, %caovan_r;", ".reg .b16 %caovan_h<6>, %caovan_l<6>;",
             ".reg .b32 %caovan_ah<2>, %caovan_al<2>, %caovan_bh, %caovan_bl;"]
    for i, reg in enumerate(a + b):
        lines += [f"mov.b32 %caovan_x, {reg};", f"cvt.rn.f16.f32 %caovan_h{i}, %caovan_x;",
                  f"cvt.f32.f16 %caovan_r, %caovan_h{i};", "sub.f32 %caovan_r, %caovan_x, %caovan_r;",
                  f"cvt.rn.f16.f32 %caovan_l{i}, %caovan_r;"]
    for half in "hl":   # low 16 bits first: fp16 k 2t <- tf32 k t, fp16 k 2t+1 <- tf32 k t+4
        lines += [f"mov.b32 %caovan_a{half}0, {{%caovan_{half}0, %caovan_{half}2}};",
                  f"mov.b32 %caovan_a{half}1, {{%caovan_{half}1, %caovan_{half}3}};",
                  f"mov.b32 %caovan_b{half}, {{%caovan_{half}4, %caovan_{half}5}};"]
    op, dd = "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32", ", ".join(d)
    lines += [f"{op} {{{dd}}}, {{%caovan_ah0, %caovan_ah1}}, {{%caovan_bh}}, {{{', '.join(c)}}};",
              f"{op} {{{dd}}}, {{%caovan_ah0, %caovan_ah1}}, {{%caovan_bl}}, {{{dd}}};",
              f"{op} {{{dd}}}, {{%caovan_al0, %caovan_al1}}, {{%caovan_bh}}, {{{dd}}};"]
    return f"{indent}{{\n" + "".join(f"{indent}\t{line}\n" for line in lines) + f"{indent}}}"


def sm80_only_instructions(ptx: str) -> list[str]:
    """Reasons for each kind of sm_80-or-newer instruction still in `ptx` (empty: none found)."""
    found = [why for why, pattern in _SM80_ONLY if pattern.search(ptx)]
    for line in ptx.splitlines():
        text = line.strip()
        if "mma.sync" in text and not text.startswith("//") and not _SM75_MMA.search(text):
            shape = re.search(r"mma\.sync\.aligned\.[\w.]+", text)
            found.append(f"{shape.group(0) if shape else 'mma'} has no sm_75 form")
            break
    return found


def rewrite_ptx(ptx: str) -> RewriteResult:
    """Rewrite PTX that Triton produced for sm_80 into sm_75 PTX.

    Splits every fp16 m16n8k16 mma into two m16n8k8, every tf32 m16n8k8 into three fp16 m16n8k8
    (split operands), every `cvt.rn.f16x2.f32` into two `cvt.rn.f16.f32`, turns `cvt.rna.tf32.f32`
    into a move, and sets `.target sm_75`. Raises `TurboRewriteError(reason)` when an
    sm_80-only instruction remains (bf16 mma, cp.async, ...).
    """
    if not _TARGET.search(ptx):
        raise TurboRewriteError("no .target line: this is not PTX")
    out, mma_split = _MMA_K16.subn(_split_mma, ptx)
    out, tf32_split = _MMA_TF32.subn(_split_tf32, out)
    out = _CVT_TF32.sub(r"mov.b32 \1, \2;", out)
    out, cvt_split = _CVT_X2.subn(_split_cvt, out)
    out = _TARGET.sub(r"\g<1>sm_75", out, count=1)
    left = sm80_only_instructions(out)
    if left:
        raise TurboRewriteError("sm_80-only instructions remain: " + "; ".join(left))
    return RewriteResult(ptx=out, mma_split=mma_split, cvt_split=cvt_split, tf32_split=tf32_split)
