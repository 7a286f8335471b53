"""Talking to a running vLLM OpenAI-compatible server: shared by caovan-sm75-warmup and caovan-sm75-bench.

`address` checks where and with which key (never printed), `transport` moves bytes under a
wall-clock limit and turns HTTP failures into reasons a person can act on, `client` speaks vLLM's
OpenAI endpoints on top of it (as httpx keeps its transport apart from its client), `readiness`
waits for a server to take requests, `prompts` builds prompts of a given token length.
Nothing here imports torch, triton or vllm, or starts anything.
"""
