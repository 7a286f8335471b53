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
from triton.runtime.errors import OutOfResources

from .configs import FORMAT_CODE, MAX_SPLITS, MIN_KEYS_PER_SPLIT, TARGET_PROGRAMS_PER_SM, AttentionConfig, select
from .inputs import AttentionShapes, check_inputs, check_vllm_extras
from .triton_kernels import _attn_kernel, _merge_kernel, _widen_kernel


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
    plan = (q, k, v, out, cu_seqlens_q, seqused_k, block_table, k_descale, v_descale, s, max_seqlen_q, max_seqlen_k,
            float(softmax_scale), float(softcap), num_splits)
    call = plan_call(*plan)
    try:
        _launch(call)
    except OutOfResources:
        # The build came out plain (no Turbo hook in this process, or its build fell back): Triton's
        # own sm_75 code needs more shared memory for this tile than Turing has. The plain config
        # fits; it is slower. Costs a raised exception per such call, before any GPU work.
        plain = plan_call(*plan, plain=True)
        if plain.config == call.config:
            raise
        call = plain
        _launch(call)
    if call.merge_grid is not None:
        _merge_kernel[call.merge_grid](*call.merge_args.values(), NUM_SPLITS=call.num_splits, HEAD_DIM=s.head_dim,
                                       num_warps=4)
    return out


def _launch(call: AttentionCall) -> None:
    _attn_kernel[call.grid](*call.args.values(), **call.constexprs, num_warps=call.config.num_warps, num_stages=1,
                            maxnreg=call.config.maxnreg)


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
              softmax_scale: float, softcap: float, num_splits: int | None = None,
              plain: bool = False) -> AttentionCall:
    """The pinned config (`plain`: the one for a build without the Turbo rewrite), the split count
    (planned unless given), grids and arguments; allocates partials."""
    cfg = select(s.head_dim, s.kv_format, s.group, max_seqlen_q, plain=plain)
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
