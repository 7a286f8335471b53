"""vLLM 0.21 (`legacy-gdn-linear-attn-v020`): the GDN layer in `mamba/gdn_linear_attn.py`.

`GatedDeltaNetAttention.__init__` builds `ChunkGatedDeltaRule()` (CustomOp
"chunk_gated_delta_rule"), whose `__init__` picks `forward_native` (FLA's Triton kernels from
`vllm.model_executor.layers.fla.ops`) everywhere except FlashInfer on SM90. Qwen3.5/3.6 import
the layer from this module.
"""

from __future__ import annotations

from .interface import GdnInterface

INTERFACE = GdnInterface(
    name="legacy-gdn-linear-attn-v020",
    module="vllm.model_executor.layers.mamba.gdn_linear_attn",
    layer_class="GatedDeltaNetAttention",
    fla_packages=("vllm.model_executor.layers.fla.ops",),
)
