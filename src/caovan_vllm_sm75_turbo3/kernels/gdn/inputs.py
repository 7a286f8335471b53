"""Checks of the arguments of `chunk_gated_delta_rule`, from shapes and dtypes only.

Nothing here reads a device tensor's values (that would synchronise with the GPU and break CUDA
graph capture); `cu_seqlens` is trusted to be vLLM's non-decreasing query_start_loc.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import CaovanError
from ..gdn_capability import KERNEL_CAPABILITIES, kernel_runs_on
from .configs import HEAD_DIMS


class GDNInputError(CaovanError, ValueError):
    """An argument of chunk_gated_delta_rule that this kernel does not accept."""


@dataclass(frozen=True)
class GDNShapes:
    """The sizes of one call: B rows of T tokens, H key heads, HV value heads, N sequences."""

    batch: int
    tokens: int
    key_heads: int
    value_heads: int
    head_k: int
    head_v: int
    sequences: int


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    chunk_indices: torch.Tensor | None,
    core_attn_out: torch.Tensor | None,
) -> GDNShapes:
    """Return the call's shapes or raise GDNInputError naming the argument and what is accepted."""
    if q.dim() != 4 or k.shape != q.shape:
        raise GDNInputError(f"q and k must both be [B, T, H, K]; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or v.shape[:2] != (B, T):
        raise GDNInputError(f"v must be [B, T, HV, V] with B={B}, T={T}; got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if K not in HEAD_DIMS or V not in HEAD_DIMS:
        raise GDNInputError(f"head dims K={K}, V={V} are not supported: K and V must each be one of {HEAD_DIMS}")
    if HV % H != 0:
        raise GDNInputError(f"value heads HV={HV} must be a multiple of key heads H={H} (GQA)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.float16:
            raise GDNInputError(f"{name} must be float16 (Turing has no bf16 tensor cores); got {t.dtype}")
    for name, t in (("g", g), ("beta", beta)):
        if tuple(t.shape) != (B, T, HV):
            raise GDNInputError(f"{name} must be [B, T, HV] = {(B, T, HV)}; got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise GDNInputError(f"{name} must be a floating-point tensor; got {t.dtype}")
    if cu_seqlens is None:
        N = B
        if chunk_indices is not None:
            raise GDNInputError("chunk_indices is only meaningful together with cu_seqlens")
    else:
        if B != 1:
            raise GDNInputError(f"with cu_seqlens the batch size must be 1 (packed sequences); got B={B}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise GDNInputError("cu_seqlens must be a 1-D int32/int64 tensor [N+1] of sequence starts")
        N = cu_seqlens.numel() - 1
        if chunk_indices is not None and (chunk_indices.dim() != 2 or chunk_indices.shape[1] != 2):
            raise GDNInputError(f"chunk_indices must be [num_chunks, 2] (sequence, chunk); got {tuple(chunk_indices.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (N, HV, V, K):
        raise GDNInputError(f"initial_state must be [N, HV, V, K] = {(N, HV, V, K)}; got {tuple(initial_state.shape)}")
    if core_attn_out is not None:
        if core_attn_out.dtype != q.dtype:
            raise GDNInputError(f"core_attn_out must have q's dtype {q.dtype}; got {core_attn_out.dtype}")
        if core_attn_out.numel() < B * T * HV * V or not core_attn_out.is_contiguous():
            raise GDNInputError(f"core_attn_out must be contiguous with at least {B * T * HV * V} elements")
    if q.is_cuda:
        check_capability(torch.cuda.get_device_capability(q.device))
    return GDNShapes(B, T, H, HV, K, V, N)


def check_capability(capability: tuple[int, int]) -> None:
    """Raise GDNInputError for a GPU this kernel is not verified on (outside sm_75 .. sm_89).

    On sm_90 and newer Triton 3.6 builds the state pass with wgmma, and its results were wrong
    when measured on an H200 (benchmarks/RESULTS.md); below sm_75 there are no fp16 mma.sync.
    The range is `gdn_capability.KERNEL_CAPABILITIES`; the dispatch's narrower rule is beside it.
    """
    low, high = KERNEL_CAPABILITIES
    if not kernel_runs_on(capability):
        raise GDNInputError(
            f"this GDN kernel runs on GPUs of compute capability {low[0]}.{low[1]} to {high[0]}.{high[1]}; "
            f"this one is {capability[0]}.{capability[1]}"
            + (" (Triton 3.6's wgmma build of its state pass gave wrong results on sm_90)" if tuple(capability) >= (9, 0) else "")
            + ": use vLLM's own FLA kernels there")
