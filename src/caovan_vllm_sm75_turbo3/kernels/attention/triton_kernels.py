"""The Triton kernels of the paged attention (the maths and the program layout are described in kernel.py).

They live apart from the launcher so that building them for sm_75 ahead of time (specs.py: the
fit test, the benchmark's PTX) needs only Triton, not torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
# e4m3 bytes widen to 2^-8 of their value (see `_widen`); this power of two rides on the scales.
E4M3_UNIT = tl.constexpr(256.0)


@triton.jit
def _unit(KV_FMT: tl.constexpr):
    """What one unit of `_widen`'s output is worth: 2^8 for e4m3, 1 otherwise."""
    if KV_FMT == 1:
        return E4M3_UNIT
    else:
        return 1.0


@triton.jit
def _widen(w, KV_FMT: tl.constexpr):
    """fp8 bytes, four to a little-endian uint32 word ([R, C]) -> fp16 [R, 4C] in units of `_unit(KV_FMT)`.

    Exact, in 32-bit integer operations on all four bytes or on two 16-bit lanes at once (sm_75
    has no fp8 instructions, and 16-bit ones would be split per element). `even` holds bytes 0
    and 2 of each word as the top byte of its two 16-bit lanes (bits 7-14 for e4m3), `odd` bytes
    1 and 3. e5m2 is the top byte of an fp16. e4m3fn (bias 7, 3 mantissa bits): its 7 magnitude
    bits at fp16 bits 7-13, its sign at bit 15, are the fp16 of 2^-8 of its value, subnormals
    included; the kernel folds the 2^8 into its score and output scales. Its NaNs (magnitude
    0x7F) are the only bytes whose magnitude + 1 carries into bit 7; the carry lands on fp16 bit
    14 and makes them fp16 NaNs.
    """
    if KV_FMT == 2:
        even = (w << 8) & 0xFF00FF00
        odd = w & 0xFF00FF00
    else:
        mag = w & 0x7F7F7F7F
        mag = mag | ((mag + 0x01010101) & 0x80808080)  # bit 7: the NaN carry
        sign = w & 0x80808080
        even = ((mag << 7) & 0x7F807F80) | ((sign << 8) & 0x80008000)
        odd = ((mag >> 1) & 0x7F807F80) | (sign & 0x80008000)
    # [R, C, 2 (lane), 2 (even, odd)] is bytes 0, 1, 2, 3 of each word in order
    x = tl.join(tl.join((even & 0xFFFF).to(tl.uint16), (even >> 16).to(tl.uint16)),
                tl.join((odd & 0xFFFF).to(tl.uint16), (odd >> 16).to(tl.uint16)))
    return tl.reshape(x, (w.shape[0], 4 * w.shape[1])).to(tl.float16, bitcast=True)


@triton.jit
def _widen_kernel(src, dst, n_words, n, KV_FMT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    w = tl.load(src.to(tl.pointer_type(tl.uint32)) + offs[:, None], mask=offs[:, None] < n_words, other=0)
    out = (_widen(w, KV_FMT) * _unit(KV_FMT)).to(tl.float16)
    offs4 = 4 * offs[:, None] + tl.arange(0, 4)[None, :]
    tl.store(dst + offs4, out, mask=offs4 < n)


@triton.jit
def _load_kv(base, row, ok, offs_d, KV_FMT: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One [rows, HEAD_DIM] key or value tile as fp16 (fp8 in `_unit` units); `row` in elements, masked rows 0.

    fp8 rows are read as uint32 words (`row` and the row strides are multiples of 4 bytes).
    """
    if KV_FMT == 0:
        return tl.load(base + row[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
    else:
        words = base.to(tl.pointer_type(tl.uint32))
        offs_w = tl.arange(0, HEAD_DIM // 4)
        return _widen(tl.load(words + (row // 4)[:, None] + offs_w[None, :], mask=ok[:, None], other=0), KV_FMT)


@triton.jit(do_not_specialize=["num_seqs", "block_size", "bt_stride", "window_left"])
def _attn_kernel(
    q, k, v, out,  # q/out [tokens, QH, D] fp16; k/v [blocks, block_size, KVH, D] fp16 or fp8 bytes
    part_o, part_m, part_l,  # split partials [tokens, QH, S, D], [tokens, QH, S] fp32 (None when S == 1)
    cu_q, seqused_k, block_table, k_scale, v_scale,  # k_scale/v_scale [num_seqs, KVH] fp32 or None
    num_seqs, block_size, bt_stride, window_left,
    sq_tok, sq_head, so_tok, so_head,
    sk_blk, sk_off, sk_head, sv_blk, sv_off, sv_head,
    ks_seq, ks_head, vs_seq, vs_head,
    sm_scale, softcap,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr, KV_FMT: tl.constexpr, NUM_SPLITS: tl.constexpr,
    K_SCALED: tl.constexpr, V_SCALED: tl.constexpr, USE_SOFTCAP: tl.constexpr, USE_WINDOW: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    # The grid numbers sequence n's query blocks from cu_q[n] // BLOCK_Q + n, an upper bound that
    # needs no host sync; binary search for the last sequence starting at or before this program.
    lo = pid * 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        start = tl.load(cu_q + mid).to(tl.int32) // BLOCK_Q + mid
        lo = tl.where(start <= pid, mid, lo)
        hi = tl.where(start <= pid, hi, mid - 1)
    seq = lo
    q_start = tl.load(cu_q + seq).to(tl.int32)
    q_len = tl.load(cu_q + seq + 1).to(tl.int32) - q_start
    qb = pid - (q_start // BLOCK_Q + seq)
    tok0 = qb * BLOCK_Q
    if tok0 >= q_len:
        return
    kv_len = tl.load(seqused_k + seq).to(tl.int32)
    ctx = kv_len - q_len  # keys before this sequence's first query row

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    t = tok0 + offs_m // G
    h = kvh * G + offs_m % G
    row_ok = (offs_m < BLOCK_Q * G) & (t < q_len)
    qpos = ctx + t  # the last key each row sees
    tok64 = (q_start + t).to(tl.int64)
    b_q = tl.load(q + tok64[:, None] * sq_tok + h[:, None] * sq_head + offs_d[None, :], mask=row_ok[:, None],
                  other=0.0)

    qk_scale = sm_scale * _unit(KV_FMT)  # a power of two: the same products as on the element
    if K_SCALED:
        qk_scale = qk_scale * tl.load(k_scale + seq * ks_seq + kvh * ks_head)
    hi_key = ctx + tl.minimum(q_len, tok0 + BLOCK_Q)  # keys past this one no row of the program sees
    lo_key = hi_key * 0
    if USE_WINDOW:
        lo_key = tl.maximum(ctx + tok0 - window_left, 0)
    first = lo_key // TILE_N
    n_tiles = (hi_key + TILE_N - 1) // TILE_N - first
    per_split = (n_tiles + NUM_SPLITS - 1) // NUM_SPLITS
    j_lo = first + split * per_split
    j_hi = tl.minimum(j_lo + per_split, first + n_tiles)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    bt_row = block_table + seq.to(tl.int64) * bt_stride
    offs_n = tl.arange(0, TILE_N)
    for j in range(j_lo, j_hi):
        keys = j * TILE_N + offs_n
        k_ok = keys < hi_key
        blk = keys // block_size
        phys = tl.load(bt_row + blk, mask=k_ok, other=0).to(tl.int64)
        off = (keys - blk * block_size).to(tl.int64)
        k_addr = phys * sk_blk + off * sk_off + kvh * sk_head
        b_k = _load_kv(k, k_addr, k_ok, offs_d, KV_FMT, HEAD_DIM)
        s = tl.dot(b_q, tl.trans(b_k))
        if USE_SOFTCAP:  # softcap * tanh(s / softcap), tanh from one exp2
            x = s * (qk_scale / softcap)
            e = tl.exp2(-2.0 * LOG2E * tl.abs(x))
            th = (1.0 - e) / (1.0 + e)
            s = softcap * LOG2E * tl.where(x < 0, -th, th)
        else:
            s = s * (qk_scale * LOG2E)
        seen = k_ok[None, :] & (keys[None, :] <= qpos[:, None])
        if USE_WINDOW:
            seen = seen & (keys[None, :] >= qpos[:, None] - window_left)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_addr = phys * sv_blk + off * sv_off + kvh * sv_head
        b_v = _load_kv(v, v_addr, k_ok, offs_d, KV_FMT, HEAD_DIM)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), b_v)
        m_i = m_new

    v_mul = _unit(KV_FMT)
    if V_SCALED:
        v_mul = v_mul * tl.load(v_scale + seq * vs_seq + kvh * vs_head)
    if NUM_SPLITS == 1:
        o = acc * (v_mul / tl.where(l_i > 0, l_i, 1.0))[:, None]
        tl.store(out + tok64[:, None] * so_tok + h[:, None] * so_head + offs_d[None, :], o.to(tl.float16),
                 mask=row_ok[:, None])
    else:
        QH = tl.num_programs(1) * G
        slot = (tok64 * QH + h) * NUM_SPLITS + split
        tl.store(part_o + slot[:, None] * HEAD_DIM + offs_d[None, :], acc * v_mul, mask=row_ok[:, None])
        tl.store(part_m + slot, m_i, mask=row_ok)
        tl.store(part_l + slot, l_i, mask=row_ok)


@triton.jit(do_not_specialize=["num_seqs"])
def _merge_kernel(out, part_o, part_m, part_l, cu_q, num_seqs, so_tok, so_head,
                  NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr):
    tok = tl.program_id(0)
    h = tl.program_id(1)
    if tok >= tl.load(cu_q + num_seqs):
        return  # a padding token past the last sequence: no program wrote partials for it
    base = (tok.to(tl.int64) * tl.num_programs(1) + h) * NUM_SPLITS
    offs_d = tl.arange(0, HEAD_DIM)
    m_max = tl.max(tl.load(part_m + base + tl.arange(0, NUM_SPLITS)), 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    # One split at a time, so registers stay at one row of HEAD_DIM whatever NUM_SPLITS is.
    total = 0.0
    o = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for i in range(NUM_SPLITS):
        w = tl.exp2(tl.load(part_m + base + i) - m_max)  # a split that saw no key (m = -inf) weighs 0
        total += w * tl.load(part_l + base + i)
        o += w * tl.load(part_o + (base + i) * HEAD_DIM + offs_d)
    o = o / tl.where(total > 0, total, 1.0)
    tl.store(out + tok * so_tok + h * so_head + offs_d, o.to(tl.float16))
