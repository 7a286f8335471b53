"""vLLM 0.24 – 0.34 (`triton-attn-v024`): the backend registry in `vllm/v1/attention/backends/registry.py`
(`AttentionBackendEnum.CUSTOM`, `register_backend`) and TRITON_ATTN in `.../backends/triton_attn.py`.

From 0.24 `TritonAttentionImpl.__init__` raises for fp8 KV below SM89 and the cache write
(`triton_reshape_and_cache_flash`, a Triton kernel, not the CUDA `reshape_and_cache_flash`) asserts
SM89 for fp8: on Turing neither vLLM's read nor its write of an fp8 cache runs. The cache split
changed in 0.26 (`kv_cache.unbind(1)` before, `kv_cache.transpose(1, 2).split(...)` after); our
subclass takes the views vLLM's own `forward` makes, so both are served. 0.25 added the
`rswa_*` and `mm_prefix_clamp_sliding_window` keywords to the kernel call.
"""

from __future__ import annotations

from .interface import AttentionInterface

INTERFACE = AttentionInterface(
    name="triton-attn-v024",
    since="0.24",
    until="0.34",
    registry_module="vllm.v1.attention.backends.registry",
    backend_module="vllm.v1.attention.backends.triton_attn",
    cache_write_module="vllm.v1.attention.ops.triton_reshape_and_cache_flash",
)
