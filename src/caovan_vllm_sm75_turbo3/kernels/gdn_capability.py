"""Which GPUs our GDN prefill kernel runs on, and which one the dispatch puts it in charge on.

Two different facts, kept side by side so nobody mixes them up:
- the kernel accepts compute capability 7.5 to 8.9: it was verified there (on an H200 through its
  sm_75 PTX, and natively below sm_90; Triton 3.6's wgmma build of its state pass was wrong on sm_90);
- the dispatch replaces vLLM's GDN prefill on SM75 (Turing) only, the GPUs this product is for and
  the target the Turbo tensor-core rewrite builds for; newer cards keep vLLM's own kernels.

Outside `kernels/gdn/` on purpose: that package imports torch and Triton, and the launcher
(runtime facts) reads this without them.
"""

from __future__ import annotations

KERNEL_CAPABILITIES: tuple[tuple[int, int], tuple[int, int]] = ((7, 5), (8, 9))  # inclusive range
DISPATCH_CAPABILITY: tuple[int, int] = (7, 5)


def kernel_runs_on(capability: tuple[int, int]) -> bool:
    """Whether the kernel accepts a GPU of this (major, minor) compute capability."""
    low, high = KERNEL_CAPABILITIES
    return low <= tuple(capability) <= high


def dispatch_target(capability: tuple[int, int]) -> bool:
    """Whether the dispatch puts our kernel in charge of vLLM's GDN prefill on this GPU (SM75 only)."""
    return tuple(capability) == DISPATCH_CAPABILITY
