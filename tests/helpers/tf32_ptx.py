"""A one-instruction PTX kernel around Triton's tf32 m16n8k8, and the register lists of a PTX line."""

from __future__ import annotations

import re

TF32 = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
LINE = f"{TF32} {{%r1, %r2, %r3, %r4}}, {{%r5, %r6, %r7, %r8}}, {{%r9, %r10}}, {{%r11, %r12, %r13, %r14}};"


def ptx_kernel(body: str) -> str:
    """An sm_80 PTX module whose one entry holds `body`."""
    return f".version 8.7\n.target sm_80\n.visible .entry k()\n{{\n\t{body}\n}}\n"


def regs(text: str) -> list[list[str]]:
    """The registers of each {...} group of a PTX operand list."""
    return [[r.strip() for r in g.split(",")] for g in re.findall(r"\{([^{}]*)\}", text)]
# D reuses A's and B's registers: the split must read them all before its first mma writes D
ALIASED_LINE = f"{TF32} {{%r5, %r6, %r9, %r8}}, {{%r5, %r6, %r7, %r8}}, {{%r9, %r10}}, {{%r11, %r12, %r13, %r14}};"
