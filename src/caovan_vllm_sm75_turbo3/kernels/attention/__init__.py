"""Paged attention for Turing over an fp16 or fp8 (e4m3 / e5m2) KV cache, with vLLM's
`unified_attention` interface, and its float64 reference."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["unified_attention", "widen_fp8", "unified_attention_reference", "dequantize_cache", "quantize_cache",
           "kv_quantisation_error", "AttentionInputError"]

# Imported on first use: they need torch, and the sm_75 builds (specs.py) import this package
# in venvs that hold only Triton.
_LAZY = {"unified_attention": ".kernel", "widen_fp8": ".kernel", "AttentionInputError": ".inputs",
         **dict.fromkeys(("unified_attention_reference", "dequantize_cache", "quantize_cache", "kv_quantisation_error"),
                         ".reference")}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)
