"""vLLM 0.22+ (`modular-qwen-gdn-v022`): the Qwen GDN layer in `mamba/gdn/qwen_gdn_linear_attn.py`.

`QwenGatedDeltaNetAttention` (on a shared `gdn/base.py`) builds the same `ChunkGatedDeltaRule()`
op, whose `__init__` resolves a prefill backend and picks `forward_native` for "triton" (always
on SM75). FLA's kernels moved from `vllm.model_executor.layers.fla.ops` to
`vllm.third_party.flash_linear_attention.ops` in 0.26 with the same signature. From 0.32 the
layer passes an extra `aiter_prefill_metadata` keyword (ROCm only; None on CUDA).
"""

from __future__ import annotations

from .interface import GdnInterface

INTERFACE = GdnInterface(
    name="modular-qwen-gdn-v022",
    module="vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
    layer_class="QwenGatedDeltaNetAttention",
    fla_packages=("vllm.third_party.flash_linear_attention.ops", "vllm.model_executor.layers.fla.ops"),
)
