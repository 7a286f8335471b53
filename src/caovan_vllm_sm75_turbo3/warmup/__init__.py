"""Warmup client for a running vLLM OpenAI-compatible server: readiness, the request ladder, the report.

This layer talks HTTP to a server the user started (`caovan-sm75-warmup`); it never imports torch,
triton or vllm and never starts anything itself.
"""
