"""Gated DeltaNet prefill for Turing: a chunked two-kernel Triton implementation with vLLM 0.21's
`chunk_gated_delta_rule` interface, and its float64 token-serial reference."""

from .chunk import chunk_gated_delta_rule
from .inputs import GDNInputError
from .reference import gated_delta_rule_reference

__all__ = ["chunk_gated_delta_rule", "gated_delta_rule_reference", "GDNInputError"]
