"""Caovan vLLM SM75 Turbo3: a vLLM plugin that makes serving on Turing GPUs (SM75) fast and reliable.

Importing this package is cheap: it never imports torch, triton or vllm.
"""

__version__ = "0.6.5"
