"""Paged attention for Turing over an fp16 or fp8 (e4m3 / e5m2) KV cache, with vLLM's
`unified_attention` interface, and its float64 reference."""

from .inputs import AttentionInputError
from .kernel import unified_attention, widen_fp8
from .reference import dequantize_cache, kv_quantisation_error, quantize_cache, unified_attention_reference

__all__ = ["unified_attention", "widen_fp8", "unified_attention_reference", "dequantize_cache", "quantize_cache",
           "kv_quantisation_error", "AttentionInputError"]
