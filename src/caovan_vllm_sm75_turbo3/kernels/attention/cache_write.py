"""Our fp8 KV cache write for SM75: vLLM's `triton_reshape_and_cache_flash` interface, integer bit work.

vLLM's own cache write (a Triton kernel from 0.24) lets `tl.store` convert to fp8, which Triton
builds only for SM89+ (e4m3) and vLLM asserts SM89 for any fp8 cache. Here each value is scaled
in fp32 (x / k_scale, as vLLM does), then rounded to the nearest even fp8 code by integer work on
its fp32 bits, saturating at the format's largest finite value (as vLLM's CUDA cast does);
NaN stays NaN. The byte goes to the cache through a uint8 view. The plugin's backend
(plugin/attention/backend.py) calls it for fp8 caches and leaves fp16 caches to vLLM's own writer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (mantissa bits, exponent bias, largest finite value) of each fp8 format, by torch dtype.
FORMATS = {torch.float8_e4m3fn: (3, 7, 448.0), torch.float8_e5m2: (2, 15, 57344.0)}


@triton.jit
def _to_fp8_bits(x, MANT: tl.constexpr, BIAS: tl.constexpr, MAXV: tl.constexpr):
    """fp32 -> fp8 code (int32 0..255), round to nearest even, saturating; NaN -> 0x7F | sign."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.minimum(tl.abs(x), MAXV)
    m = a.to(tl.int32, bitcast=True)
    SHIFT: tl.constexpr = 23 - MANT
    normal = ((m + ((1 << (SHIFT - 1)) - 1) + ((m >> SHIFT) & 1)) >> SHIFT) - ((127 - BIAS) << MANT)
    # Below the smallest normal, the code is the value in units of the smallest subnormal,
    # rounded to even by the fp32 magic-number trick (exact for these small values).
    SUB_SCALE: tl.constexpr = float(2 ** (BIAS + MANT - 1))
    sub = ((a * SUB_SCALE + 12582912.0) - 12582912.0).to(tl.int32)
    MIN_NORMAL: tl.constexpr = float(2.0 ** (1 - BIAS))
    code = tl.where(a < MIN_NORMAL, sub, normal)
    code = tl.where(x != x, 0x7F, code)
    return code | sign


@triton.jit
def _write_kernel(src, cache, slots, scale, s_tok, s_head, c_blk, c_slot, c_head, block_size,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
                  MAXV: tl.constexpr):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slots + tok).to(tl.int64)
    if slot < 0:  # a padding token
        return
    d = tl.arange(0, BLOCK_D)
    mask = d < HEAD_DIM
    x = tl.load(src + tok.to(tl.int64) * s_tok + head * s_head + d, mask=mask, other=0.0).to(tl.float32)
    code = _to_fp8_bits(x / tl.load(scale), MANT, BIAS, MAXV)
    where = (slot // block_size) * c_blk + (slot % block_size) * c_slot + head * c_head + d
    tl.store(cache + where, code.to(tl.uint8), mask=mask)


def write_fp8(src: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor, scale: torch.Tensor) -> None:
    """Write `src` [tokens, kv_heads, head_dim] (unit stride in head_dim) into the fp8 `cache`
    [num_blocks, block_size, kv_heads, head_dim] (a float8 view, any strides) at `slot_mapping`."""
    mant, bias, maxv = FORMATS[cache.dtype]
    raw = cache.view(torch.uint8)
    tokens, heads, dim = src.shape
    if tokens == 0:
        return
    _write_kernel[(tokens, heads)](src, raw, slot_mapping, scale, src.stride(0), src.stride(1), raw.stride(0),
                                   raw.stride(1), raw.stride(2), raw.shape[1], HEAD_DIM=dim,
                                   BLOCK_D=triton.next_power_of_2(dim), MANT=mant, BIAS=bias, MAXV=maxv,
                                   num_warps=1 if dim <= 128 else 2)
