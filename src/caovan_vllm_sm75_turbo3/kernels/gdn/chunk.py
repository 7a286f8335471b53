"""Chunked Gated DeltaNet prefill in two Triton kernels, built to fit Turing (sm_75).

Per value head and chunk of BT=64 tokens, with gamma the in-chunk cumulative log gate, state S
[V, K] at the chunk start, and T = (I + A)^-1 for A[i,j] = beta_i (k_i.k_j) e^(gamma_i-gamma_j), j < i:

    W  = T diag(beta e^gamma) K          U  = T diag(beta) V          (the WY form)
    P  = scale (Q K^T) e^(gamma_i-gamma_j), j <= i
    Q' = scale diag(e^gamma) Q - P W     O_intra = P U
    delta = U - W S^T                    O = O_intra + Q' S^T
    S <- e^(gamma_last) S + delta^T diag(e^(gamma_last - gamma)) K

1. `_prep_kernel`: one program per (chunk, value head), all chunks in parallel. It does every
   step that does not need S (T, W, U, Q', O_intra) and writes W, U, Q' and the decayed keys in
   fp16 (as FLA stores w and u), O_intra straight into the output. T is solved in 16-row
   blocks: the four diagonal blocks by fp32 forward substitution at once (15 warp-local steps),
   then the blocks below them by tensor-core products, through this program's own rows of w and
   kd as scratch (no extra buffer). One loop walks the K and V column tiles together, each
   fetched one iteration ahead. The grid is flat with value heads fastest.
2. `_state_kernel`: one program per (value slice, sequence, value head). The state slice [K, BV]
   stays in registers across all chunks; per chunk and 64-row half of K, three tensor-core
   products whose operands are staged through shared memory as soon as the chunk starts.
   Neither the per-chunk states nor delta (FLA's v_new) ever go to memory.

When the state pass has at most one program per SM (a long prompt, few sequences), the chunks
run as segments of SEGMENT_CHUNKS (`run_segments`): one prep and one state launch each, the
state pass on a second stream, so the prep of segment i+1 fills the SMs that the state
programs leave idle while they work through segment i. Between segments each state program
parks its fp32 slice in the final-state buffer (or a scratch one); the arithmetic is the same,
so the result is bitwise that of one launch each.

Fusing step 1 into step 2 would keep W/U on chip as well, but the solve would then run serially
chunk after chunk in few programs; for a long prompt (one sequence, 24 heads) the parallel prep
should be the faster split (the fused variant was not built). All matrix products take fp16
operands and accumulate in fp32, so a planned-as-sm_80 build rewritten for sm_75
(kernels/turbo) runs them on tensor cores. Measured cost split: benchmarks/RESULTS.md.

Packed sequences (`cu_seqlens`) need no host synchronisation: the prep grid is sized from T and
N (or from vLLM's precomputed `chunk_indices`), programs past the last chunk do nothing, and
each program finds its sequence on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .configs import CHUNK, SEGMENT_CHUNKS, PrepConfig, StateConfig, select
from .inputs import check_inputs
from .reference import L2NORM_EPS


@triton.jit(do_not_specialize=["T", "N", "c_off"])
def _prep_kernel(
    q, k, v, g, beta,  # inputs: [*, H, K] fp16 x2, [*, HV, V] fp16, [*, HV] fp32 x2
    w, u, qd, kd, o,  # outputs: [*, HV, K] fp16, [*, HV, V] fp16, [*, HV, K] fp16 x2, [*, HV, V]
    cu_seqlens, chunk_indices,  # int32/int64 or None
    T, N, c_off, scale,  # c_off: flat index of this launch's first chunk (a segment's start)
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_CHUNK_INDICES: tl.constexpr, USE_L2NORM: tl.constexpr, EPS: tl.constexpr,
):
    # Heads vary fastest, so the programs in flight share their chunks: the HV / H value heads
    # of a key head then find its k and q in L2.
    i_c = c_off + tl.program_id(0) // HV
    i_h = tl.program_id(0) % HV
    i_hk = i_h // (HV // H)
    if IS_VARLEN:
        if HAS_CHUNK_INDICES:
            i_n = tl.load(chunk_indices + 2 * i_c).to(tl.int32)
            i_t = tl.load(chunk_indices + 2 * i_c + 1).to(tl.int32)
        else:
            # The grid is an upper bound on the chunk count; find (sequence, chunk) on the device.
            i_n = i_c * 0 - 1
            i_t = i_c * 0
            rem = i_c
            for n in range(0, N):
                nc = (tl.load(cu_seqlens + n + 1).to(tl.int32) - tl.load(cu_seqlens + n).to(tl.int32) + BT - 1) // BT
                hit = (rem >= 0) & (rem < nc)
                i_n = tl.where(hit, n, i_n)
                i_t = tl.where(hit, rem, i_t)
                rem = rem - nc
        bos = tl.load(cu_seqlens + tl.maximum(i_n, 0)).to(tl.int32)
        eos = tl.load(cu_seqlens + tl.maximum(i_n, 0) + 1).to(tl.int32)
        eos = tl.where(i_n >= 0, eos, bos)  # a program past the last chunk masks everything
    else:
        nts = (T + BT - 1) // BT
        i_n = i_c // nts
        i_t = i_c % nts
        bos = i_n * T
        eos = bos + T

    # Block pointers over this sequence only (shape = its length): rows past its end read 0 and
    # are not written; they also keep address arithmetic scalar, which saves registers. K and V
    # are walked in BK-wide column tiles: the right operand of an MMAv2 product is held whole by
    # every warp, and [64, 128] operands would not fit Turing's 255 registers.
    seq = eos - bos
    t0 = i_t * BT
    b64 = bos.to(tl.int64)
    r = tl.arange(0, BT)
    kb = k + b64 * (H * K) + i_hk * K
    qb = q + b64 * (H * K) + i_hk * K
    p_g = tl.make_block_ptr(g + b64 * HV + i_h, (seq,), (HV,), (t0,), (BT,), (0,))
    b_g = tl.load(p_g, boundary_check=(0,))
    p_beta = tl.make_block_ptr(beta + b64 * HV + i_h, (seq,), (HV,), (t0,), (BT,), (0,))
    b_beta = tl.load(p_beta, boundary_check=(0,))
    b_gc = tl.cumsum(b_g, 0)  # gamma; rows past the end add 0, so the last entry is gamma_last
    g_last = tl.sum(b_g, 0)

    # Gram matrices K K^T and Q K^T of the raw inputs; the L2 norm is applied to them afterwards.
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    b_qk = tl.zeros([BT, BT], dtype=tl.float32)
    b_qss = tl.zeros([BT], dtype=tl.float32)
    for j in tl.static_range(K // BK):
        p_k = tl.make_block_ptr(kb, (seq, K), (H * K, 1), (t0, j * BK), (BT, BK), (1, 0))
        p_q = tl.make_block_ptr(qb, (seq, K), (H * K, 1), (t0, j * BK), (BT, BK), (1, 0))
        b_k = tl.load(p_k, boundary_check=(0,))
        b_q = tl.load(p_q, boundary_check=(0,))
        b_kk += tl.dot(b_k, tl.trans(b_k))
        b_qk += tl.dot(b_q, tl.trans(b_k))
        if USE_L2NORM:
            qf = b_q.to(tl.float32)
            b_qss += tl.sum(qf * qf, 1)
    if USE_L2NORM:  # |k_i|^2 is the diagonal of K K^T
        b_rk = 1.0 / tl.sqrt(tl.sum(tl.where(r[:, None] == r[None, :], b_kk, 0.0), 1) + EPS)
        b_rq = 1.0 / tl.sqrt(b_qss + EPS)
    else:
        b_rk = tl.full([BT], 1.0, dtype=tl.float32)
        b_rq = tl.full([BT], 1.0, dtype=tl.float32)

    # A[i, j] = beta_i kk_ij e^(gamma_i - gamma_j), j < i, and the masked intra-chunk scores P.
    strict = r[:, None] > r[None, :]
    b_a = b_kk * ((b_rk * b_beta)[:, None] * b_rk[None, :])
    b_a = tl.where(strict, b_a * tl.exp(tl.where(strict, b_gc[:, None] - b_gc[None, :], 0.0)), 0.0)
    lower = r[:, None] >= r[None, :]
    b_p = b_qk * ((scale * b_rq)[:, None] * b_rk[None, :])
    b_p16 = tl.where(lower, b_p * tl.exp(tl.where(lower, b_gc[:, None] - b_gc[None, :], 0.0)), 0.0).to(tl.float16)

    # T = (I + A)^-1 in 16-row blocks. Scratch space is this program's own rows of kd (A) and
    # w (T), first BT columns; both are overwritten with their real contents afterwards. A 64-step
    # substitution over the whole tile would serialise 126 cross-warp reductions; this is 15
    # warp-local steps (the four diagonal blocks at once) and three tensor-core merges.
    wb = w + b64 * (HV * K) + i_h * K
    kdb = kd + b64 * (HV * K) + i_h * K
    RS = HV * K  # row stride of w, qd, kd
    p_as = tl.make_block_ptr(kdb, (seq, BT), (RS, 1), (t0, 0), (BT, BT), (1, 0))
    tl.store(p_as, b_a.to(tl.float16), boundary_check=(0,))
    tl.debug_barrier()
    # Diagonal blocks by forward substitution in fp32: t3[b, c, j] = T_bb[j, c], j fastest so the
    # reduction over j stays inside a warp. Row i of every block at once; the next rows are
    # loaded one step ahead.
    ib = tl.arange(0, BT // 16)[:, None, None]
    ic = tl.arange(0, 16)[None, :, None]
    ij = tl.arange(0, 16)[None, None, :]
    t3 = tl.where((ic == ij) & (ib >= 0), 1.0, 0.0)
    row0 = t0 + 16 * ib  # [NB, 1, 1]
    a_next = tl.load(kdb + (row0 + 1) * RS + 16 * ib + ij, mask=row0 + 1 < seq, other=0.0).to(tl.float32)
    for i in range(1, 16):
        a_i = a_next
        a_next = tl.load(kdb + (row0 + i + 1) * RS + 16 * ib + ij, mask=(row0 + i + 1 < seq) & (i < 15),
                         other=0.0).to(tl.float32)
        t_row = -tl.sum(a_i * t3, 2)  # [NB, 16]: row i of each block's inverse, without the 1
        t3 = tl.where(ij == i, t_row[:, :, None] + tl.where(ic == i, 1.0, 0.0), t3)
    tl.store(wb + (row0 + ij) * RS + 16 * ib + ic, t3.to(tl.float16), mask=row0 + ij < seq)
    tl.debug_barrier()
    # Off-diagonal blocks, block row by block row: T_b,<b = -T_bb (A_b,<b T_<b,<b).
    in_lower_blocks = r[None, :] < 16 * (r[:, None] // 16 + 1)  # T is zero right of a row's own block
    p_t = tl.make_block_ptr(wb, (seq, BT), (RS, 1), (t0, 0), (BT, BT), (1, 0))
    for bi in tl.static_range(1, BT // 16):
        rs16 = tl.arange(0, 16)
        p_ab = tl.make_block_ptr(kdb, (seq, BT), (RS, 1), (t0 + 16 * bi, 0), (16, BT), (1, 0))
        b_ab = tl.where(r[None, :] < 16 * bi, tl.load(p_ab, boundary_check=(0,)), 0.0).to(tl.float16)
        b_tp = tl.where(in_lower_blocks & (r[:, None] < 16 * bi), tl.load(p_t, boundary_check=(0,)), 0.0).to(tl.float16)
        b_x = tl.dot(b_ab, b_tp).to(tl.float16)
        p_d = tl.make_block_ptr(wb, (seq, BT), (RS, 1), (t0 + 16 * bi, 16 * bi), (16, 16), (1, 0))
        b_d = tl.where(rs16[None, :] <= rs16[:, None], tl.load(p_d, boundary_check=(0,)), 0.0).to(tl.float16)
        b_tb = -tl.dot(b_d, b_x)
        rows_b = t0 + 16 * bi + rs16[:, None]  # the diagonal block is already in place: write left of it
        tl.store(wb + rows_b * RS + r[None, :], b_tb.to(tl.float16), mask=(rows_b < seq) & (r[None, :] < 16 * bi))
        tl.debug_barrier()
    b_t16 = tl.where(in_lower_blocks, tl.load(p_t, boundary_check=(0,)), 0.0).to(tl.float16)
    tl.debug_barrier()  # every thread holds T before the scratch rows are overwritten

    # One loop over the column tiles of K and V together, so the two chains of products
    # interleave (faster than a loop each: benchmarks/RESULTS.md). Each tile's inputs are fetched
    # one iteration ahead (a runtime loop gets no software pipelining at one stage); past the last
    # column the fetch reads 0. With K != V the shorter side's work is skipped past its last tile.
    e_g = tl.exp(b_gc)
    qdb = qd + b64 * (HV * K) + i_h * K
    vb = v + b64 * (HV * V) + i_h * V
    ub = u + b64 * (HV * V) + i_h * V
    ob = o + b64 * (HV * V) + i_h * V
    p_kn = tl.make_block_ptr(kb, (seq, K), (H * K, 1), (t0, 0), (BT, BK), (1, 0))
    p_qn = tl.make_block_ptr(qb, (seq, K), (H * K, 1), (t0, 0), (BT, BK), (1, 0))
    p_vn = tl.make_block_ptr(vb, (seq, V), (HV * V, 1), (t0, 0), (BT, BK), (1, 0))
    n_k = tl.load(p_kn, boundary_check=(0, 1))
    n_q = tl.load(p_qn, boundary_check=(0, 1))
    n_v = tl.load(p_vn, boundary_check=(0, 1))
    for j in range(max(K, V) // BK):
        b_kn = n_k.to(tl.float32) * b_rk[:, None]
        b_qs = n_q.to(tl.float32) * (scale * b_rq * e_g)[:, None]
        b_vb = (n_v.to(tl.float32) * b_beta[:, None]).to(tl.float16)
        p_kn = tl.advance(p_kn, (0, BK))
        p_qn = tl.advance(p_qn, (0, BK))
        p_vn = tl.advance(p_vn, (0, BK))
        n_k = tl.load(p_kn, boundary_check=(0, 1))
        n_q = tl.load(p_qn, boundary_check=(0, 1))
        n_v = tl.load(p_vn, boundary_check=(0, 1))
        if j < K // BK:
            p_kd = tl.make_block_ptr(kdb, (seq, K), (HV * K, 1), (t0, j * BK), (BT, BK), (1, 0))
            tl.store(p_kd, (b_kn * tl.exp(g_last - b_gc)[:, None]).to(tl.float16), boundary_check=(0,))
            b_w = tl.dot(b_t16, (b_kn * (b_beta * e_g)[:, None]).to(tl.float16)).to(tl.float16)
            p_w = tl.make_block_ptr(wb, (seq, K), (HV * K, 1), (t0, j * BK), (BT, BK), (1, 0))
            tl.store(p_w, b_w, boundary_check=(0,))
            p_qd = tl.make_block_ptr(qdb, (seq, K), (HV * K, 1), (t0, j * BK), (BT, BK), (1, 0))
            tl.store(p_qd, (b_qs - tl.dot(b_p16, b_w)).to(tl.float16), boundary_check=(0,))
        if j < V // BK:
            b_u = tl.dot(b_t16, b_vb).to(tl.float16)
            p_u = tl.make_block_ptr(ub, (seq, V), (HV * V, 1), (t0, j * BK), (BT, BK), (1, 0))
            tl.store(p_u, b_u, boundary_check=(0,))
            p_o = tl.make_block_ptr(ob, (seq, V), (HV * V, 1), (t0, j * BK), (BT, BK), (1, 0))
            tl.store(p_o, tl.dot(b_p16, b_u).to(o.dtype.element_ty), boundary_check=(0,))


@triton.jit(do_not_specialize=["T", "f_lo", "f_hi", "f_all"])
def _state_kernel(
    w, u, qd, kd, g, o,  # from the prep kernel, g [*, HV] fp32, o [*, HV, V] (read, then final)
    h0, ht,  # [N, HV, V, K] fp32 or None
    carry,  # [N, HV, V, K] fp32: the state between segments (ht itself when the final state is kept)
    cu_seqlens,
    T, f_lo, f_hi, f_all,  # this launch's segment: the chunks of flat index f_lo <= f < f_hi of f_all
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = i_nh // HV
    i_h = i_nh % HV
    # f0: flat index of this sequence's first chunk, in the order the prep numbers chunks.
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int32)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int32)
        f0 = i_n * 0
        if (f_lo > 0) | (f_hi < f_all):  # a launch over every chunk needs no f0: skip the O(N) walk
            for m in range(0, i_n):
                f0 += (tl.load(cu_seqlens + m + 1).to(tl.int32) - tl.load(cu_seqlens + m).to(tl.int32) + BT - 1) // BT
    else:
        bos = i_n * T
        eos = bos + T
        f0 = i_n * ((T + BT - 1) // BT)

    seq = eos - bos
    n_c = (seq + BT - 1) // BT
    c_lo = tl.minimum(tl.maximum(f_lo - f0, 0), n_c)  # this segment's chunks of the sequence
    c_hi = tl.minimum(tl.maximum(f_hi - f0, 0), n_c)
    b64 = bos.to(tl.int64)
    # The state is kept transposed, S^T [K, BV], in 64-row halves: each product then holds
    # only a [64, BV] operand, which keeps the kernel within Turing's registers. A segment
    # after the sequence's first starts from the carried state.
    p_cy = tl.make_block_ptr(carry + i_nh.to(tl.int64) * (V * K), (K, V), (1, K), (0, i_v * BV), (64, BV), (0, 1))
    if c_lo > 0:
        b_s1 = tl.load(p_cy)
        if K > 64:
            b_s2 = tl.load(tl.advance(p_cy, (64, 0)))
    elif USE_INITIAL_STATE:
        p_h0 = tl.make_block_ptr(h0 + i_nh.to(tl.int64) * (V * K), (K, V), (1, K), (0, i_v * BV), (64, BV), (0, 1))
        b_s1 = tl.load(p_h0).to(tl.float32)
        if K > 64:
            b_s2 = tl.load(tl.advance(p_h0, (64, 0))).to(tl.float32)
    else:
        b_s1 = tl.zeros([64, BV], dtype=tl.float32)
        if K > 64:
            b_s2 = tl.zeros([64, BV], dtype=tl.float32)

    wb = w + b64 * (HV * K) + i_h * K
    qb = qd + b64 * (HV * K) + i_h * K
    kb = kd + b64 * (HV * K) + i_h * K
    ub = u + b64 * (HV * V) + i_h * V
    ob = o + b64 * (HV * V) + i_h * V
    gb = g + b64 * HV + i_h
    # Every operand of a chunk is loaded at the top of its iteration: Triton stages W, Kd and Q'
    # into shared memory straight away, so their latencies overlap one another and the first
    # product, without holding registers across iterations. Fetching the next chunk's W and U
    # into registers a step ahead was slower, since those registers stay held across the
    # iteration; fetching Kd too spilled at BV=32 (benchmarks/RESULTS.md).
    t_lo = c_lo * BT
    p_w = tl.make_block_ptr(wb, (seq, K), (HV * K, 1), (t_lo, 0), (BT, 64), (1, 0))
    p_q = tl.make_block_ptr(qb, (seq, K), (HV * K, 1), (t_lo, 0), (BT, 64), (1, 0))
    p_kt = tl.make_block_ptr(kb, (K, seq), (1, HV * K), (0, t_lo), (64, BT), (0, 1))
    p_u = tl.make_block_ptr(ub, (seq, V), (HV * V, 1), (t_lo, i_v * BV), (BT, BV), (1, 0))
    p_o = tl.make_block_ptr(ob, (seq, V), (HV * V, 1), (t_lo, i_v * BV), (BT, BV), (1, 0))
    p_g = tl.make_block_ptr(gb, (seq,), (HV,), (t_lo,), (BT,), (0,))
    for c in range(c_lo, c_hi):
        b_w1 = tl.load(p_w, boundary_check=(0,))
        b_u = tl.load(p_u, boundary_check=(0,))
        b_gc = tl.load(p_g, boundary_check=(0,))
        b_k1 = tl.load(p_kt, boundary_check=(1,))
        if K > 64:
            b_w2 = tl.load(tl.advance(p_w, (0, 64)), boundary_check=(0,))
            b_k2 = tl.load(tl.advance(p_kt, (64, 0)), boundary_check=(1,))
        b_q1 = tl.load(p_q, boundary_check=(0,))
        if K > 64:
            b_q2 = tl.load(tl.advance(p_q, (0, 64)), boundary_check=(0,))
        b_o = tl.load(p_o, boundary_check=(0,))
        p_out = p_o
        p_w = tl.advance(p_w, (BT, 0))
        p_q = tl.advance(p_q, (BT, 0))
        p_kt = tl.advance(p_kt, (0, BT))
        p_u = tl.advance(p_u, (BT, 0))
        p_o = tl.advance(p_o, (BT, 0))
        p_g = tl.advance(p_g, (BT,))

        b_s16 = b_s1.to(tl.float16)
        b_delta = b_u.to(tl.float32) - tl.dot(b_w1, b_s16)
        b_out = b_o.to(tl.float32) + tl.dot(b_q1, b_s16)
        if K > 64:
            b_s16 = b_s2.to(tl.float16)
            b_delta -= tl.dot(b_w2, b_s16)
            b_out += tl.dot(b_q2, b_s16)
        tl.store(p_out, b_out.to(o.dtype.element_ty), boundary_check=(0,))
        decay = tl.exp(tl.sum(b_gc, 0))
        b_d16 = b_delta.to(tl.float16)
        b_s1 = b_s1 * decay + tl.dot(b_k1, b_d16)
        if K > 64:
            b_s2 = b_s2 * decay + tl.dot(b_k2, b_d16)

    # The last segment of the sequence writes the final state; an earlier one, the carry.
    if c_hi < n_c:
        tl.store(p_cy, b_s1)
        if K > 64:
            tl.store(tl.advance(p_cy, (64, 0)), b_s2)
    elif STORE_FINAL_STATE:
        p_ht = tl.make_block_ptr(ht + i_nh.to(tl.int64) * (V * K), (K, V), (1, K), (0, i_v * BV), (64, BV), (0, 1))
        tl.store(p_ht, b_s1)
        if K > 64:
            tl.store(tl.advance(p_ht, (64, 0)), b_s2)


def _alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer the launcher allocates comes from here (tests replace it to poison buffers)."""
    return torch.empty(shape, dtype=dtype, device=device)


@dataclass(frozen=True)
class LaunchPlan:
    """Grids, pinned configs and segments of one call, decided from shapes alone.

    `segments` are windows [lo, hi) of flat chunk indices (sequence by sequence, chunk by chunk,
    the order of vLLM's chunk_indices). Each window gets its own prep and state launch, so the
    prep of window i+1 runs while the state pass works through window i.
    """

    prep: PrepConfig
    state: StateConfig
    n_chunks: int  # flat chunks the prep grid covers (an upper bound without chunk_indices)
    segments: tuple[tuple[int, int], ...]
    state_grid: tuple[int, int]

    def prep_grid(self, segment: tuple[int, int], value_heads: int) -> tuple[int]:
        """The prep grid of one segment: one program per (chunk, value head), heads fastest."""
        return ((segment[1] - segment[0]) * value_heads,)


def plan_launch(*, batch: int, tokens: int, value_heads: int, head_k: int, head_v: int, sequences: int,
                cu_seqlens: torch.Tensor | None, chunk_indices: torch.Tensor | None,
                segment_chunks: int = SEGMENT_CHUNKS, sm_count: int | None = None) -> LaunchPlan:
    """The launch for these shapes. Reads tensor shapes only, never values (no host sync).

    The chunks are split into segments only when the state pass has at most one program per
    SM (`sm_count`; None, as on the CPU, sets no such limit): then SMs are idle that the next
    segment's prep can use. With more state programs the GPU is already full, and segments only
    add launches (measured: benchmarks/RESULTS.md).
    """
    prep_cfg, state_cfg = select(head_k, head_v)
    if cu_seqlens is None:
        n_chunks = batch * triton.cdiv(tokens, CHUNK)
    elif chunk_indices is not None:
        n_chunks = chunk_indices.shape[0]
    else:
        n_chunks = triton.cdiv(tokens, CHUNK) + sequences  # sum(ceil(len_i / BT)) <= T / BT + N
    state_grid = (head_v // state_cfg.block_v, sequences * value_heads)
    if sm_count is not None and state_grid[0] * state_grid[1] > sm_count:
        segment_chunks = max(n_chunks, 1)
    segments = tuple((lo, min(lo + segment_chunks, n_chunks)) for lo in range(0, n_chunks, segment_chunks))
    return LaunchPlan(prep_cfg, state_cfg, n_chunks, segments, state_grid)


def run_segments(plan: LaunchPlan, device: torch.device, prep: Callable[[tuple[int, int]], None],
                 state: Callable[[tuple[int, int]], None]) -> None:
    """Launch each segment's prep, then its state pass, overlapping the two on a CUDA device.

    The preps go on the current stream, back to back; the state passes on a high-priority
    pooled stream that waits for each segment's prep and joins back at the end (so CUDA graph
    capture sees one fork and join, and the caching allocator needs no extra bookkeeping: every
    buffer is used on the side stream only before the join). Holding the preps back to a few
    segments ahead of the state pass gained nothing (benchmarks/RESULTS.md). Elsewhere (the CPU
    interpreter) they run in turn.
    """
    if device.type != "cuda" or len(plan.segments) == 1:
        for seg in plan.segments:
            prep(seg)
            state(seg)
        return
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device=device, priority=-1)
    side.wait_stream(main)
    for seg in plan.segments:
        prep(seg)
        prepped = torch.cuda.Event()
        prepped.record(main)
        side.wait_event(prepped)
        with torch.cuda.stream(side):
            state(seg)
    main.wait_stream(side)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    chunk_offsets: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    core_attn_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaNet prefill with vLLM 0.21's `chunk_gated_delta_rule` interface and layouts.

    q, k `[B, T, H, K]` and v `[B, T, HV, V]` float16; g (log-space decay) and beta `[B, T, HV]`;
    value head i reads key head `i // (HV // H)`. With `cu_seqlens` (`[N+1]`, B == 1) the tokens
    are N packed sequences; `chunk_indices` (`[num_chunks, 2]`, vLLM's precomputed
    (sequence, chunk) pairs) sizes the grid exactly when given. `chunk_offsets` is accepted for
    interface compatibility and not needed (no per-chunk state is stored). `initial_state` and
    the final state are `[N, HV, V, K]`, float32. `scale` defaults to K ** -0.5.
    `use_qk_l2norm_in_kernel` L2-normalises q and k per head first (eps 1e-6, as vLLM).

    Returns `(o, final_state)`: o `[B, T, HV, V]` in q's dtype (a view of the first elements of
    `core_attn_out` when that is given, which is then written in place), final_state float32
    or None when `output_final_state` is False. Head dims other than 64/128 and non-fp16 q/k/v
    raise GDNInputError. Never synchronises with the host.
    """
    del chunk_offsets  # part of vLLM's signature; this kernel has no use for it
    s = check_inputs(q, k, v, g, beta, initial_state, cu_seqlens, chunk_indices, core_attn_out)
    B, T, H, HV, K, V, N = s.batch, s.tokens, s.key_heads, s.value_heads, s.head_k, s.head_v, s.sequences
    dev = q.device
    sm_count = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else None
    plan = plan_launch(batch=B, tokens=T, value_heads=HV, head_k=K, head_v=V, sequences=N, cu_seqlens=cu_seqlens,
                       chunk_indices=chunk_indices, segment_chunks=SEGMENT_CHUNKS, sm_count=sm_count)
    if scale is None:
        scale = K**-0.5
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = g.to(torch.float32).contiguous()
    beta = beta.to(torch.float32).contiguous()
    if initial_state is not None:
        initial_state = initial_state.to(torch.float32).contiguous()

    if core_attn_out is not None:
        o = core_attn_out.reshape(-1)[: B * T * HV * V].view(B, T, HV, V)
    else:
        o = _alloc((B, T, HV, V), q.dtype, dev)
    w = _alloc((B, T, HV, K), torch.float16, dev)
    qd = _alloc((B, T, HV, K), torch.float16, dev)
    kd = _alloc((B, T, HV, K), torch.float16, dev)
    u = _alloc((B, T, HV, V), torch.float16, dev)
    final_state = _alloc((N, HV, V, K), torch.float32, dev) if output_final_state else None

    is_varlen = cu_seqlens is not None
    if T == 0 or plan.n_chunks == 0:
        if final_state is not None:
            final_state.copy_(initial_state if initial_state is not None else torch.zeros_like(final_state))
        return o, final_state
    # Between segments the state waits in the final-state buffer, or in a scratch one. With a
    # single segment the carry is never touched, and g stands in for it (any fp32 pointer).
    if final_state is not None:
        carry = final_state
    elif len(plan.segments) > 1:
        carry = _alloc((N, HV, V, K), torch.float32, dev)
    else:
        carry = g

    def prep(seg: tuple[int, int]) -> None:
        _prep_kernel[plan.prep_grid(seg, HV)](
            q, k, v, g, beta, w, u, qd, kd, o, cu_seqlens, chunk_indices, T, N, seg[0], float(scale),
            H=H, HV=HV, K=K, V=V, BT=CHUNK, BK=plan.prep.block_k, IS_VARLEN=is_varlen,
            HAS_CHUNK_INDICES=chunk_indices is not None, USE_L2NORM=bool(use_qk_l2norm_in_kernel), EPS=L2NORM_EPS,
            num_warps=plan.prep.num_warps, num_stages=1,
        )

    def state(seg: tuple[int, int]) -> None:
        _state_kernel[plan.state_grid](
            w, u, qd, kd, g, o, initial_state, final_state, carry, cu_seqlens, T, seg[0], seg[1], plan.n_chunks,
            HV=HV, K=K, V=V, BT=CHUNK, BV=plan.state.block_v, IS_VARLEN=is_varlen,
            USE_INITIAL_STATE=initial_state is not None, STORE_FINAL_STATE=final_state is not None,
            num_warps=plan.state.num_warps, num_stages=1,
        )

    run_segments(plan, dev, prep, state)
    return o, final_state
