"""The oracle: paged causal attention in float64 with plain torch loops over sequences.

The cache is dequantised with the same per-tensor scales the kernel uses (fp8 value x descale),
so the reference measures the kernel's own error; `kv_quantisation_error` measures, separately,
how far an fp8 cache is from the fp16 values it was made from.
"""

from __future__ import annotations

import torch

from .inputs import TORCH_DTYPES, kv_format

# Float64 scores held at once (2 GiB): full-size checks (8192 rows x 128K keys) go in row steps.
_SCORES_PER_STEP = 2**28


def dequantize_cache(cache: torch.Tensor, descale: torch.Tensor | None = None,
                     kv_cache_dtype: str | None = None) -> torch.Tensor:
    """The cache in float64, `[num_blocks, block_size, kv_heads, head_dim]`, fp8 values times descale.

    `descale` is one scale per KV head (`[kv_heads]`) or None (1); a uint8 cache needs
    `kv_cache_dtype` as for the kernel. An fp16 cache is returned as it is (vLLM ignores its scales).
    """
    fmt = kv_format(cache, kv_cache_dtype)
    if fmt == "fp16":
        return cache.double()
    x = cache.view(TORCH_DTYPES[fmt]).to(torch.float64)
    if descale is not None:
        x = x * descale.double().view(1, 1, -1, 1)
    return x


def quantize_cache(source: torch.Tensor, scale: torch.Tensor | float, kv_format: str) -> torch.Tensor:
    """fp8 bytes of `source / scale` (saturated to the format's finite range), as float8 tensors.

    `scale` per KV head (`[kv_heads]`) or one float; what vLLM's cache write computes with a
    per-tensor scale. For tests and the benchmark.
    """
    dtype = TORCH_DTYPES[kv_format]
    if isinstance(scale, torch.Tensor):
        scale = scale.double().view(1, 1, -1, 1)
    limit = torch.finfo(dtype).max
    return (source.double() / scale).clamp(-limit, limit).to(dtype)


def kv_quantisation_error(cache: torch.Tensor, source: torch.Tensor, descale: torch.Tensor | None = None,
                          kv_cache_dtype: str | None = None) -> float:
    """‖dequantised cache − source‖ / ‖source‖ over the whole cache: the fp8 error alone, no kernel."""
    from ..numerics import rel_error

    return rel_error(dequantize_cache(cache, descale, kv_cache_dtype), source.double())


def _gather(cache: torch.Tensor, table_row: torch.Tensor, n: int) -> torch.Tensor:
    """The first n keys of one sequence, [n, kv_heads, head_dim], through its block table row."""
    bs = cache.shape[1]
    pos = torch.arange(n, device=cache.device)
    return cache[table_row[pos // bs].long(), pos % bs]


def unified_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                seqused_k: torch.Tensor, block_table: torch.Tensor, softmax_scale: float,
                                window_size: tuple[int, int] | None = (-1, -1), softcap: float = 0.0,
                                k_descale: torch.Tensor | None = None, v_descale: torch.Tensor | None = None,
                                kv_cache_dtype: str | None = None) -> torch.Tensor:
    """The attention output `[tokens, q_heads, head_dim]` in float64, same arguments as the kernel.

    Row i of a sequence with q_len rows and kv_len keys sees keys j <= kv_len - q_len + i, and
    j >= kv_len - q_len + i - left with a sliding window (left, ...). Descales `[num_seqs, kv_heads]`.
    """
    T, QH, D = q.shape
    KVH = k.shape[2]
    G = QH // KVH
    left = window_size[0] if window_size is not None else -1
    o = torch.zeros(T, QH, D, dtype=torch.float64, device=q.device)
    bounds = [int(x) for x in cu_seqlens_q.tolist()]
    for n in range(len(bounds) - 1):
        q0, q1, kv_len = bounds[n], bounds[n + 1], int(seqused_k[n])
        if q1 == q0:
            continue
        ks = k_descale[n] if k_descale is not None else None
        vs = v_descale[n] if v_descale is not None else None
        keys = dequantize_cache(_gather(k, block_table[n], kv_len).unsqueeze(0), ks, kv_cache_dtype)[0]
        vals = dequantize_cache(_gather(v, block_table[n], kv_len).unsqueeze(0), vs, kv_cache_dtype)[0]
        keys = keys.repeat_interleave(G, dim=1)  # [kv_len, QH, D]: query head h reads KV head h // G
        vals = vals.repeat_interleave(G, dim=1)
        step = max(1, _SCORES_PER_STEP // (QH * kv_len))  # query rows per step: bounded score memory
        for r0 in range(q0, q1, step):
            r1 = min(r0 + step, q1)
            s = torch.einsum("ihd,jhd->hij", q[r0:r1].double(), keys) * softmax_scale
            if softcap > 0:
                s = softcap * torch.tanh(s / softcap)
            last = kv_len - q1 + torch.arange(r0, r1, device=q.device)  # the last key each row sees
            j = torch.arange(kv_len, device=q.device)
            seen = j[None, :] <= last[:, None]
            if left >= 0:
                seen &= j[None, :] >= last[:, None] - left
            s = s.masked_fill(~seen, float("-inf"))
            o[r0:r1] = torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), vals)
    return o
