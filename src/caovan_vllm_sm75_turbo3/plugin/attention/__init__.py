"""Our attention backend for vLLM 0.24+: fp8 (e4m3/e5m2) or fp16 KV on SM75 through kernels/attention."""

from .controller import install

__all__ = ["install"]
