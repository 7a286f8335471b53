"""A CPU emulation of one warp running the rewrite's tf32 -> three fp16 m16n8k8 block (its own
instructions on the fragments the PTX ISA lays out), against float64. Needs numpy (the full lane)."""

from __future__ import annotations

import pytest

from helpers.tf32_ptx import ALIASED_LINE, LINE, ptx_kernel
from helpers.tf32_ptx import regs as operand_groups

from caovan_vllm_sm75_turbo3.kernels.turbo.rewrite import rewrite_ptx

np = pytest.importorskip("numpy")


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
                _mma_f16(lanes, *operand_groups(rest))
                continue
            dst, src = (s.strip() for s in rest.split(",", 1))
            for regs in lanes:
                if op == "mov.b32" and src.startswith("{"):
                    lo, hi = operand_groups(src)[0]
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
    ptx = rewrite_ptx(ptx_kernel(line)).ptx
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


def test_output_registers_may_alias_inputs() -> None:
    # D reuses A's and B's registers: the split reads them all before the first mma writes D
    err, scale = _run_split(ALIASED_LINE, *_inputs(np.random.default_rng(3)), d=["%r5", "%r6", "%r9", "%r8"])
    assert np.max(np.abs(err) / scale) < 2 ** -20
