"""Checks of the arguments of `unified_attention`, from shapes, dtypes and host numbers only.

Nothing here reads a device tensor's values (that would synchronise with the GPU and break CUDA
graph capture): `cu_seqlens_q`, `seqused_k` and `block_table` are trusted to be vLLM's metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import CaovanError
from .configs import FP8_CACHE_DTYPES, HEAD_DIMS

# Which GPUs the launcher accepts: Turing up to Ada. The kernel is built for Turing; newer cards
# are where the H200 evidence runs the same sm_75 PTX, not through this launcher.
CAPABILITIES: tuple[tuple[int, int], tuple[int, int]] = ((7, 5), (8, 9))
CACHE_DTYPE_NAMES = FP8_CACHE_DTYPES
# The torch dtype of each KV format (configs.KV_FORMATS): their one home, with the reverse lookup.
TORCH_DTYPES = {"fp16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
_TORCH_FORMATS = {dtype: fmt for fmt, dtype in TORCH_DTYPES.items()}


class AttentionInputError(CaovanError, ValueError):
    """An argument of unified_attention that this kernel does not accept."""


@dataclass(frozen=True)
class AttentionShapes:
    """The sizes of one call."""

    tokens: int
    q_heads: int
    kv_heads: int
    head_dim: int
    num_blocks: int
    block_size: int
    num_seqs: int
    kv_format: str  # "fp16", "fp8_e4m3" or "fp8_e5m2"
    window_left: int  # -1: no sliding window

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.q_heads // self.kv_heads


def kv_format(cache: torch.Tensor, kv_cache_dtype: str | None) -> str:
    """The cache's format: from its dtype, or from `kv_cache_dtype` when it is a uint8 view of fp8 bytes."""
    if cache.dtype == torch.uint8:
        if kv_cache_dtype not in CACHE_DTYPE_NAMES:
            raise AttentionInputError(
                "k/v are uint8: say which fp8 format the bytes hold with kv_cache_dtype= one of "
                f"{sorted(CACHE_DTYPE_NAMES)}; got {kv_cache_dtype!r}")
        return CACHE_DTYPE_NAMES[kv_cache_dtype]
    if cache.dtype not in _TORCH_FORMATS:
        raise AttentionInputError(
            f"k/v must be float16, float8_e4m3fn, float8_e5m2 or uint8 (fp8 bytes); got {cache.dtype}")
    fmt = _TORCH_FORMATS[cache.dtype]
    if kv_cache_dtype is not None and kv_cache_dtype != "auto" and CACHE_DTYPE_NAMES.get(kv_cache_dtype) != fmt:
        raise AttentionInputError(f"kv_cache_dtype={kv_cache_dtype!r} contradicts the cache's dtype {cache.dtype}")
    return fmt


def _check_index(name: str, t: torch.Tensor, dims: int) -> None:
    if t.dim() != dims or t.dtype not in (torch.int32, torch.int64):
        raise AttentionInputError(f"{name} must be a {dims}-D int32/int64 tensor; got {t.dtype} {tuple(t.shape)}")


def _check_descale(name: str, t: torch.Tensor | None, num_seqs: int, kv_heads: int) -> None:
    if t is None:
        return
    if t.dtype != torch.float32 or tuple(t.shape) != (num_seqs, kv_heads):
        raise AttentionInputError(f"{name} must be float32 [num_seqs, kv_heads] = {(num_seqs, kv_heads)} "
                                  f"(per-tensor scales as vLLM expands them) or None; got {t.dtype} {tuple(t.shape)}")


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, cu_seqlens_q: torch.Tensor,
                 seqused_k: torch.Tensor, block_table: torch.Tensor, causal: bool, window_size: tuple[int, int] | None,
                 softcap: float, q_descale: torch.Tensor | None, k_descale: torch.Tensor | None,
                 v_descale: torch.Tensor | None, kv_cache_dtype: str | None) -> AttentionShapes:
    """Return the call's shapes or raise AttentionInputError naming the argument and what is accepted."""
    if q.dim() != 3 or q.dtype != torch.float16 or q.stride(-1) != 1:
        raise AttentionInputError(f"q must be float16 [tokens, q_heads, head_dim] with unit stride in head_dim; "
                                  f"got {q.dtype} {tuple(q.shape)}")
    T, QH, D = q.shape
    if D not in HEAD_DIMS:
        raise AttentionInputError(f"head_dim={D} is not supported: one of {HEAD_DIMS}")
    if out.shape != q.shape or out.dtype != torch.float16 or out.stride(-1) != 1:
        raise AttentionInputError(f"out must be float16 {tuple(q.shape)} like q; got {out.dtype} {tuple(out.shape)}")
    if k.dim() != 4 or v.shape != k.shape or v.dtype != k.dtype or k.shape[3] != D:
        raise AttentionInputError(f"k and v must both be [num_blocks, block_size, kv_heads, {D}] of one dtype; "
                                  f"got k {k.dtype} {tuple(k.shape)}, v {v.dtype} {tuple(v.shape)}")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise AttentionInputError("k and v need unit stride in head_dim (vLLM's cache layout)")
    fmt = kv_format(k, kv_cache_dtype)
    if fmt != "fp16" and any(t.data_ptr() % 4 or any(st % 4 for st in t.stride()[:3]) for t in (k, v)):
        raise AttentionInputError("fp8 k and v are read 4 bytes at a time: their addresses and strides must be "
                                  "multiples of 4 bytes (vLLM's cache layout is)")
    NB, BS, KVH = k.shape[:3]
    if KVH == 0 or QH % KVH != 0:
        raise AttentionInputError(f"q_heads={QH} must be a multiple of kv_heads={KVH} (GQA)")
    _check_index("cu_seqlens_q", cu_seqlens_q, 1)
    _check_index("seqused_k", seqused_k, 1)
    _check_index("block_table", block_table, 2)
    N = seqused_k.numel()
    if cu_seqlens_q.numel() != N + 1:
        raise AttentionInputError(f"cu_seqlens_q must have num_seqs + 1 = {N + 1} entries; got {cu_seqlens_q.numel()}")
    if block_table.shape[0] < N or block_table.stride(1) != 1:
        raise AttentionInputError(f"block_table must be [>= num_seqs ({N}), max_blocks] with unit column stride; "
                                  f"got {tuple(block_table.shape)}")
    if not causal:
        raise AttentionInputError("causal=False is not supported (vLLM's decoder attention is always causal)")
    left, right = tuple(window_size) if window_size is not None else (-1, -1)
    if left < -1 or right not in (-1, 0):
        raise AttentionInputError(f"window_size must be (-1, -1) (none) or (left >= 0, 0 or -1) for a causal "
                                  f"sliding window; got {tuple(window_size)}")
    if not softcap >= 0:
        raise AttentionInputError(f"softcap must be >= 0 (0: none); got {softcap}")
    if q_descale is not None:
        raise AttentionInputError("q_descale must be None: q is float16 (vLLM does not pass query scales)")
    _check_descale("k_descale", k_descale, N, KVH)
    _check_descale("v_descale", v_descale, N, KVH)
    if q.is_cuda:
        check_capability(torch.cuda.get_device_capability(q.device))
    return AttentionShapes(T, QH, KVH, D, NB, BS, N, fmt, left)


def check_capability(capability: tuple[int, int]) -> None:
    """Raise AttentionInputError for a GPU outside compute capability 7.5 .. 8.9."""
    low, high = CAPABILITIES
    if not low <= tuple(capability) <= high:
        raise AttentionInputError(
            f"this attention kernel runs on GPUs of compute capability {low[0]}.{low[1]} to {high[0]}.{high[1]}; "
            f"this one is {capability[0]}.{capability[1]}: use vLLM's own attention backends there")


# vLLM's KVQuantMode values this kernel serves (kernels import no vLLM, so by name or number):
# NONE (0) and FP8_PER_TENSOR (1).
_QUANT_MODES = {"NONE", "FP8_PER_TENSOR", "0", "1"}


def check_vllm_extras(*, alibi_slopes: object, output_scale: object, qq_bias: object, sinks: object,
                      mm_prefix_range: object, use_alibi_sqrt: bool, kv_quant_mode: object,
                      k_scale_cache: object, v_scale_cache: object, chunk_lookback: int) -> None:
    """Refuse vLLM's optional features that this kernel does not implement, by name."""
    for name, value in (("alibi_slopes", alibi_slopes), ("output_scale", output_scale), ("qq_bias", qq_bias),
                        ("sinks", sinks), ("mm_prefix_range", mm_prefix_range), ("k_scale_cache", k_scale_cache),
                        ("v_scale_cache", v_scale_cache)):
        if value is not None:
            raise AttentionInputError(f"{name} is not supported by this kernel: pass None")
    if use_alibi_sqrt:
        raise AttentionInputError("use_alibi_sqrt is not supported by this kernel: pass False")
    if chunk_lookback != -1:
        raise AttentionInputError(f"chunk_lookback={chunk_lookback} (chunked attention) is not supported: pass -1")
    if kv_quant_mode is not None:
        plain = str(int(kv_quant_mode)) if isinstance(kv_quant_mode, int) else kv_quant_mode
        mode = getattr(kv_quant_mode, "name", plain)
        if mode not in _QUANT_MODES:
            raise AttentionInputError(f"kv_quant_mode={mode} is not supported: NONE (fp16) or FP8_PER_TENSOR only")
