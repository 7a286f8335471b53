"""Gated DeltaNet prefill for Turing: a chunked two-kernel Triton implementation with vLLM 0.21's
`chunk_gated_delta_rule` interface, and its float64 token-serial reference."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["chunk_gated_delta_rule", "gated_delta_rule_reference", "GDNInputError"]

# Imported on first use: they need torch, and the sm_75 builds (specs.py) import this package
# in venvs that hold only Triton.
_LAZY = {"chunk_gated_delta_rule": ".chunk", "GDNInputError": ".inputs", "gated_delta_rule_reference": ".reference"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)
