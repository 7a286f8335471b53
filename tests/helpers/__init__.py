"""Helpers the tests share: crafted facts, cache trees, a stand-in vLLM server, hostile inputs, Turbo kernels."""
