"""The two Triton kernels of the GDN prefill (the maths and the split are described in chunk.py).

They live apart from the launcher so that building them for sm_75 ahead of time (specs.py: the
fit test, `caovan-sm75-kernels check`, the benchmark's PTX) needs only Triton, not torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

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
    EARLY_LOADS: tl.constexpr,
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
    if EARLY_LOADS:
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
    else:
        # Each operand fetched right before its products, its two 64-row halves together (K=128):
        # 24 KiB of shared memory instead of 56, so two programs share a Turing SM (64 KiB) and
        # hide each other's load latency (configs.select_state says when). One half at a time
        # took 16 KiB but waited for each load alone: 5-10 % slower in the Turing-shaped proxy
        # (benchmarks/RESULTS.md).
        for c in range(c_lo, c_hi):
            b_u = tl.load(p_u, boundary_check=(0,))
            b_gc = tl.load(p_g, boundary_check=(0,))
            b_w1 = tl.load(p_w, boundary_check=(0,))
            if K > 64:
                b_w2 = tl.load(tl.advance(p_w, (0, 64)), boundary_check=(0,))
            b_s16a = b_s1.to(tl.float16)
            b_delta = b_u.to(tl.float32) - tl.dot(b_w1, b_s16a)
            if K > 64:
                b_s16b = b_s2.to(tl.float16)
                b_delta -= tl.dot(b_w2, b_s16b)
            b_d16 = b_delta.to(tl.float16)
            decay = tl.exp(tl.sum(b_gc, 0))
            b_o = tl.load(p_o, boundary_check=(0,))
            b_q1 = tl.load(p_q, boundary_check=(0,))
            if K > 64:
                b_q2 = tl.load(tl.advance(p_q, (0, 64)), boundary_check=(0,))
            b_out = b_o.to(tl.float32) + tl.dot(b_q1, b_s16a)
            if K > 64:
                b_out += tl.dot(b_q2, b_s16b)
            tl.store(p_o, b_out.to(o.dtype.element_ty), boundary_check=(0,))
            b_k1 = tl.load(p_kt, boundary_check=(1,))
            if K > 64:
                b_k2 = tl.load(tl.advance(p_kt, (64, 0)), boundary_check=(1,))
            b_s1 = b_s1 * decay + tl.dot(b_k1, b_d16)
            if K > 64:
                b_s2 = b_s2 * decay + tl.dot(b_k2, b_d16)
            p_w = tl.advance(p_w, (BT, 0))
            p_q = tl.advance(p_q, (BT, 0))
            p_kt = tl.advance(p_kt, (0, BT))
            p_u = tl.advance(p_u, (BT, 0))
            p_o = tl.advance(p_o, (BT, 0))
            p_g = tl.advance(p_g, (BT,))

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
