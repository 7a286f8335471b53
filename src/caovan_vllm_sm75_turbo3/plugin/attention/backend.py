"""Our attention backend for vLLM 0.24+ on SM75: vLLM's TRITON_ATTN with our kernel and fp8 cache write.

vLLM imports this module (through the class path `register_backend` was given) when it selects
`--attention-backend CUSTOM`; nothing else imports it. The classes subclass the installed vLLM's
TRITON_ATTN backend, so metadata building, the cache layout and CUDA-graph support
(`AttentionCGSupport.ALWAYS` in every release we read) stay vLLM's. `forward` and
`do_kv_cache_update` are vLLM's own functions with two global names re-bound: `unified_attention`
(ours: kernels/attention) and `triton_reshape_and_cache_flash` (ours for fp8: kernels/attention/cache_write.py).
The source check (interface.py) ran before registration and confirmed that nothing else differs.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from vllm.v1.attention.backends import triton_attn as _vllm

from ...kernels.attention import cache_write
from ...kernels.attention.configs import FP8_CACHE_DTYPES
from ...kernels.attention.inputs import TORCH_DTYPES
from ...kernels.attention import unified_attention as _kernel
from ...policy.attention import OUR_BACKEND

# vLLM's extras with the value that means "feature off"; anything else is refused by our kernel.
_OFF: dict[str, Any] = {"rswa_prefix_lens": None, "rswa_window": None, "use_td": False,
                        "mm_prefix_clamp_sliding_window": False}


def _ours(**kw: Any) -> torch.Tensor:
    """vLLM's `unified_attention(...)` call (keywords only) -> our kernel; the read format is the
    cache view's dtype (our impl views e5m2 caches as float8_e5m2, see `CaovanAttentionImpl`)."""
    for name, off in _OFF.items():
        value = kw.pop(name, off)
        if (value is not None) if off is None else bool(value):
            raise NotImplementedError(f"Caovan SM75 attention: {name} is not supported by our kernel")
    return _kernel(**kw)


def _rebound(fn: Callable[..., Any], **names: Any) -> Callable[..., Any]:
    """`fn` (a function of vLLM's triton_attn module) with some of its global names replaced."""
    scope = dict(fn.__globals__, **names)
    copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    return copy


def make_cache_write(fallback: Callable[..., None]) -> Callable[..., None]:
    """A drop-in for vLLM's `triton_reshape_and_cache_flash`: ours for fp8 caches, `fallback` otherwise."""

    def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, slot_mapping: torch.Tensor, kv_cache_dtype: str,
                          k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
        if key_cache.dtype not in cache_write.FORMATS:
            fallback(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
            return
        cache_write.write_fp8(key, key_cache, slot_mapping, k_scale)
        cache_write.write_fp8(value, value_cache, slot_mapping, v_scale)

    return reshape_and_cache


class CaovanAttentionImpl(_vllm.TritonAttentionImpl):
    """TRITON_ATTN's impl with our kernel and, for fp8 caches, our cache write."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 *args: Any, **kwargs: Any) -> None:
        # vLLM's __init__ raises for fp8 below SM89 (its kernel needs fp8e4nv); ours widens fp8
        # bytes itself, so build with "auto" and set what __init__ derives from the dtype.
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, "auto",
                         *args, **kwargs)
        self.kv_cache_dtype = kv_cache_dtype
        self._kv_quant_mode = _vllm.get_kv_quant_mode(kv_cache_dtype)
        self._is_per_token_head_quant = self._kv_quant_mode.is_per_token_head
        # vLLM views every fp8 cache as the platform's e4m3; ours reads and writes the named format.
        if kv_cache_dtype in FP8_CACHE_DTYPES:
            self.fp8_dtype = TORCH_DTYPES[FP8_CACHE_DTYPES[kv_cache_dtype]]
        self.supports_quant_query_input = False  # our kernel takes fp16 queries only

    forward = _rebound(_vllm.TritonAttentionImpl.forward, unified_attention=_ours)
    do_kv_cache_update = _rebound(
        _vllm.TritonAttentionImpl.do_kv_cache_update,
        triton_reshape_and_cache_flash=make_cache_write(_vllm.triton_reshape_and_cache_flash))


class CaovanAttentionBackend(_vllm.TritonAttentionBackend):
    """vLLM's TRITON_ATTN backend as `CUSTOM`: fp16 or fp8 (e4m3/e5m2) KV, fp16, head dims 128/256, SM75."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", *FP8_CACHE_DTYPES]

    @staticmethod
    def get_name() -> str:
        return OUR_BACKEND  # vLLM looks the layer's backend up as AttentionBackendEnum[get_name()]

    @staticmethod
    def get_impl_cls() -> type[CaovanAttentionImpl]:
        return CaovanAttentionImpl

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size in (128, 256)

    @classmethod
    def supports_compute_capability(cls, capability: Any) -> bool:
        return (capability.major, capability.minor) == (7, 5)

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == _vllm.AttentionType.DECODER

    @classmethod
    def supports_sink(cls) -> bool:
        return False

    @classmethod
    def supports_mm_prefix(cls) -> bool:
        return False

    @classmethod
    def supports_non_causal(cls) -> bool:
        return False

    @classmethod
    def supports_alibi_sqrt(cls) -> bool:
        return False

    @classmethod
    def supports_batch_invariance(cls) -> bool:
        return False

    @classmethod
    def supports_rswa(cls) -> bool:
        return False
