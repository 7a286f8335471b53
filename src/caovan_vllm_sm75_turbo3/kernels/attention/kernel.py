"""Paged attention for Turing (sm_75) over an fp16 or fp8 KV cache, with vLLM's `unified_attention` interface.

One program per (query block, KV head[, key split]). Its BLOCK_M query rows are (token, GQA head)
pairs of one sequence that share the KV head: row m is token `m // G` of the block and query head
`kv_head * G + m % G`, so a decode step (one token) still fills M = 16 of the mma with the query
heads of that KV head, and the KV head's keys are read once for all of them. Per step a tile of
TILE_N keys is gathered through the block table (key position j -> block j // block_size, offset
j % block_size, for any block size, not only powers of two), fp8 bytes are widened to fp16 by
integer bit work (sm_75 has no fp8 instructions), then S = Q K^T and O += P V run as fp16
products with fp32 accumulation (tensor cores through the Turbo rewrite) and an online softmax
in fp32, in the log2 domain.

Row i of a sequence with q_len rows and kv_len keys (context included) sees keys
j <= kv_len - q_len + i (causal), and j >= that - window_left with a sliding window. The keys of
a program are split among NUM_SPLITS programs when the (query block, KV head) programs alone
cannot fill the GPU (long-context decode); `_merge_kernel` then combines their partial results.
Per-tensor fp8 scales (vLLM's k_descale / v_descale, [num_seqs, kv_heads]) are applied to the
scores and to the output, never per element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from .configs import FORMAT_CODE, MAX_SPLITS, MIN_KEYS_PER_SPLIT, TARGET_PROGRAMS_PER_SM, AttentionConfig, select
from .inputs import AttentionShapes, check_inputs, check_vllm_extras

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


def _alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer the launcher allocates comes from here (tests replace it to poison buffers)."""
    return torch.empty(shape, dtype=dtype, device=device)


def widen_fp8(x: torch.Tensor, kv_format: str) -> torch.Tensor:
    """fp8 bytes (a uint8 or float8 tensor) -> float16 through the kernel's own bit conversion.

    `kv_format` is "fp8_e4m3" or "fp8_e5m2"; for tests and checks of `_widen`.
    """
    src = x.contiguous().view(torch.uint8).reshape(-1)
    n = src.numel()
    words = torch.nn.functional.pad(src, (0, -n % 4)).view(torch.int32)  # the kernel reads whole words
    dst = _alloc((n,), torch.float16, src.device)
    block = 64
    _widen_kernel[(triton.cdiv(words.numel(), block),)](words, dst, words.numel(), n, KV_FMT=FORMAT_CODE[kv_format],
                                                        BLOCK=block)
    return dst.view(x.shape)


def plan_splits(programs: int, max_seqlen_k: int, sm_count: int | None) -> int:
    """Key splits per program: a power of two that brings the grid to ~TARGET_PROGRAMS_PER_SM per SM.

    From host numbers only (vLLM's max_seqlen_k is a Python int). 1 when the grid is already full,
    when keys are few, or with no GPU (`sm_count` None).
    """
    if sm_count is None or programs <= 0:
        return 1
    cap = min(MAX_SPLITS, -(-TARGET_PROGRAMS_PER_SM * sm_count // programs), max(max_seqlen_k // MIN_KEYS_PER_SPLIT, 1))
    return 1 << (max(cap, 1).bit_length() - 1)


def unified_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    cu_seqlens_q: torch.Tensor, max_seqlen_q: int, seqused_k: torch.Tensor, max_seqlen_k: int,
    softmax_scale: float, causal: bool, window_size: tuple[int, int] | None, block_table: torch.Tensor,
    softcap: float, q_descale: torch.Tensor | None, k_descale: torch.Tensor | None, v_descale: torch.Tensor | None,
    seq_threshold_3D: int | None = None, num_par_softmax_segments: int | None = None,
    softmax_segm_output: torch.Tensor | None = None, softmax_segm_max: torch.Tensor | None = None,
    softmax_segm_expsum: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
    output_scale: torch.Tensor | None = None, qq_bias: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None, mm_prefix_range: torch.Tensor | None = None,
    use_alibi_sqrt: bool = False, kv_quant_mode: object = None, k_scale_cache: torch.Tensor | None = None,
    v_scale_cache: torch.Tensor | None = None, chunk_lookback: int = -1,
    *, kv_cache_dtype: str | None = None, num_splits: int | None = None,
) -> torch.Tensor:
    """Causal paged attention with vLLM's `unified_attention` interface and layouts; writes `out`.

    q/out `[tokens, q_heads, head_dim]` float16 (head_dim 128 or 256); k/v
    `[num_blocks, block_size, kv_heads, head_dim]` as float16, float8_e4m3fn, float8_e5m2, or
    uint8 views of fp8 bytes with `kv_cache_dtype` saying which ("fp8"/"fp8_e4m3" or "fp8_e5m2").
    Any block size. `cu_seqlens_q` `[num_seqs+1]`, `seqused_k` `[num_seqs]` (keys per sequence,
    its query rows included), `block_table` `[num_seqs, max_blocks]`. `k_descale`/`v_descale`
    `[num_seqs, kv_heads]` float32 dequantise an fp8 cache (ignored for fp16, as vLLM does).
    `window_size` (-1, -1) is none, (left, 0) a sliding window; `softcap` 0 is none.
    vLLM's own split buffers (`seq_threshold_3D`, `softmax_segm_*`...) are accepted and not
    used: the launcher plans its own splits (`num_splits` overrides the plan). Features this
    kernel lacks (alibi, sinks, per-token-head scales, ...) raise AttentionInputError.
    Never synchronises with the host. Returns `out`.
    """
    del seq_threshold_3D, num_par_softmax_segments, softmax_segm_output, softmax_segm_max, softmax_segm_expsum
    check_vllm_extras(alibi_slopes=alibi_slopes, output_scale=output_scale, qq_bias=qq_bias, sinks=sinks,
                      mm_prefix_range=mm_prefix_range, use_alibi_sqrt=use_alibi_sqrt, kv_quant_mode=kv_quant_mode,
                      k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache, chunk_lookback=chunk_lookback)
    s = check_inputs(q, k, v, out, cu_seqlens_q, seqused_k, block_table, causal, window_size, softcap,
                     q_descale, k_descale, v_descale, kv_cache_dtype)
    if s.tokens == 0 or s.num_seqs == 0:
        return out
    call = plan_call(q, k, v, out, cu_seqlens_q, seqused_k, block_table, k_descale, v_descale, s, max_seqlen_q,
                     max_seqlen_k, float(softmax_scale), float(softcap), num_splits)
    _attn_kernel[call.grid](*call.args.values(), **call.constexprs, num_warps=call.config.num_warps, num_stages=1)
    if call.merge_grid is not None:
        _merge_kernel[call.merge_grid](*call.merge_args.values(), NUM_SPLITS=call.num_splits, HEAD_DIM=s.head_dim,
                                       num_warps=4)
    return out


@dataclass
class AttentionCall:
    """One call's launches, decided from shapes and host numbers: what `unified_attention` runs.

    `args` are `_attn_kernel`'s runtime arguments by name, in order (None for an absent pointer);
    the benchmark feeds the same to the kernel's sm_75 PTX. `merge_grid` is None without splits.
    """

    config: AttentionConfig
    num_splits: int
    grid: tuple[int, int, int]
    args: dict[str, Any]
    constexprs: dict[str, Any]
    merge_grid: tuple[int, int] | None
    merge_args: dict[str, Any]


def plan_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, cu_q: torch.Tensor,
              seqused_k: torch.Tensor, block_table: torch.Tensor, k_descale: torch.Tensor | None,
              v_descale: torch.Tensor | None, s: AttentionShapes, max_seqlen_q: int, max_seqlen_k: int,
              softmax_scale: float, softcap: float, num_splits: int | None = None) -> AttentionCall:
    """The pinned config, the split count (planned unless given), grids and arguments; allocates partials."""
    cfg = select(s.head_dim, s.kv_format, s.group, max_seqlen_q)
    block_q = cfg.block_m // s.group
    grid_q = s.tokens // block_q + s.num_seqs  # an upper bound on the query blocks (no host sync)
    if num_splits is None:
        dev = q.device
        sm_count = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else None
        num_splits = plan_splits(grid_q * s.kv_heads, max_seqlen_k, sm_count)
    fp8 = s.kv_format != "fp16"
    kc = k.view(torch.uint8) if fp8 else k
    vc = v.view(torch.uint8) if fp8 else v
    ks = k_descale if fp8 else None  # vLLM applies the scales to fp8 caches only
    vs = v_descale if fp8 else None
    parts: tuple[torch.Tensor | None, ...] = (None, None, None)
    if num_splits > 1:
        parts = (_alloc((s.tokens, s.q_heads, num_splits, s.head_dim), torch.float32, q.device),
                 _alloc((s.tokens, s.q_heads, num_splits), torch.float32, q.device),
                 _alloc((s.tokens, s.q_heads, num_splits), torch.float32, q.device))
    args = dict(q=q, k=kc, v=vc, out=out, part_o=parts[0], part_m=parts[1], part_l=parts[2], cu_q=cu_q,
                seqused_k=seqused_k, block_table=block_table, k_scale=ks, v_scale=vs, num_seqs=s.num_seqs,
                block_size=s.block_size, bt_stride=block_table.stride(0), window_left=max(s.window_left, 0),
                sq_tok=q.stride(0), sq_head=q.stride(1), so_tok=out.stride(0), so_head=out.stride(1),
                sk_blk=kc.stride(0), sk_off=kc.stride(1), sk_head=kc.stride(2),
                sv_blk=vc.stride(0), sv_off=vc.stride(1), sv_head=vc.stride(2),
                ks_seq=ks.stride(0) if ks is not None else 0, ks_head=ks.stride(1) if ks is not None else 0,
                vs_seq=vs.stride(0) if vs is not None else 0, vs_head=vs.stride(1) if vs is not None else 0,
                sm_scale=softmax_scale, softcap=softcap if softcap > 0 else 1.0)
    cx = dict(G=s.group, HEAD_DIM=s.head_dim, BLOCK_M=cfg.block_m, BLOCK_Q=block_q, TILE_N=cfg.tile_n,
              KV_FMT=FORMAT_CODE[s.kv_format], NUM_SPLITS=num_splits, K_SCALED=ks is not None,
              V_SCALED=vs is not None, USE_SOFTCAP=softcap > 0, USE_WINDOW=s.window_left >= 0)
    merge_args = dict(out=out, part_o=parts[0], part_m=parts[1], part_l=parts[2], cu_q=cu_q, num_seqs=s.num_seqs,
                      so_tok=out.stride(0), so_head=out.stride(1))
    return AttentionCall(cfg, num_splits, (grid_q, s.kv_heads, num_splits), args, cx,
                         (s.tokens, s.q_heads) if num_splits > 1 else None, merge_args)
