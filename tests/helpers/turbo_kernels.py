"""Small Triton kernels for the turbo tests (a module of its own: Triton reads kernels' source)."""

import triton
import triton.language as tl


@triton.jit
def tile_dot_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """C[M, N] = A[M, K] @ B[K, N] in fp16 with fp32 accumulation (C stored fp16)."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k0 + rk)[None, :],
                    mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k0 + rk)[:, None] * N + rn[None, :],
                    mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def tf32_dot_kernel(a_ptr, b_ptr, c_ptr, BM: tl.constexpr):
    """An fp32 dot: planned as sm_80 it becomes a tf32 mma, which the rewrite splits into fp16 ones."""
    r = tl.arange(0, BM)
    a = tl.load(a_ptr + r[:, None] * BM + r[None, :])
    b = tl.load(b_ptr + r[:, None] * BM + r[None, :])
    tl.store(c_ptr + r[:, None] * BM + r[None, :], tl.dot(a, b))


@triton.jit
def ieee_dot_kernel(a_ptr, b_ptr, c_ptr, BM: tl.constexpr):
    """An IEEE fp32 dot (as vLLM's solve_tril asks): FMA unless the turbo build asks for tf32."""
    r = tl.arange(0, BM)
    a = tl.load(a_ptr + r[:, None] * BM + r[None, :])
    b = tl.load(b_ptr + r[:, None] * BM + r[None, :])
    tl.store(c_ptr + r[:, None] * BM + r[None, :], tl.dot(a, b, input_precision="ieee"))


DOT_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
           "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
TF32_SIG = {"a_ptr": "*fp32", "b_ptr": "*fp32", "c_ptr": "*fp32", "BM": "constexpr"}
