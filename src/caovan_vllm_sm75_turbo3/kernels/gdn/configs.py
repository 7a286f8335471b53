"""Launch configurations for the GDN prefill kernels, pinned per shape class (no autotuning).

vLLM's FLA kernels autotune on the first (64-token warmup) call and reuse that choice for 32K
tokens; here the choice is a table lookup on shapes known on the host, so a serving process
never benchmarks and never depends on what the first request looked like. Every entry is
checked to compile for sm_75 within 64 KiB of shared memory and without register spills
(tests/test_kernels_gdn_fit.py).
"""

from __future__ import annotations

from dataclasses import dataclass

CHUNK = 64  # tokens per chunk (BT); the same chunking as vLLM's FLA (FLA_CHUNK_SIZE)
HEAD_DIMS = (64, 128)  # K and V each; others are refused
# Chunks per segment when a long prompt runs as several prep + state launches, each prep
# overlapping the previous segment's state pass (chunk.plan_launch says when). 64 is the shortest
# length whose overlap still outweighs the launches and stream waits each segment adds; longer
# segments gained nothing (the sweep is in benchmarks/RESULTS.md).
SEGMENT_CHUNKS = 64
L2NORM_EPS = 1e-6  # the epsilon vLLM's FLA l2norm uses: x / sqrt(sum(x^2) + eps)


@dataclass(frozen=True)
class PrepConfig:
    """The per-chunk kernel (WY solve, w/u, q', intra-chunk output): one program per chunk and head."""

    block_k: int
    num_warps: int


@dataclass(frozen=True)
class StateConfig:
    """The sequential kernel: one program per (value slice of BV, sequence, value head)."""

    block_v: int
    num_warps: int


# (K, V) -> prep config: K and V walked in column tiles (a runtime loop, so ptxas does not
# unroll and hoist every tile's loads at once) by 4 warps, one 16-row MMA tile each. K=128:
# 32-wide tiles, which beat 16-wide; 8 warps were slower and spilled (benchmarks/RESULTS.md).
# K=64: 16-wide, since 32-wide spills with the in-kernel L2 norm.
PREP: dict[tuple[int, int], PrepConfig] = {
    (64, 64): PrepConfig(block_k=16, num_warps=4),
    (64, 128): PrepConfig(block_k=16, num_warps=4),
    (128, 64): PrepConfig(block_k=32, num_warps=4),
    (128, 128): PrepConfig(block_k=32, num_warps=4),
}

# (K, V) -> state config: 32-wide value slices by 4 warps, for every batch shape. It beat
# 16-wide/4 warps and 32-wide/8 warps for long single prompts and packed batches alike, also
# with occupancy capped to what Turing's 64 KiB of shared memory per SM allows (one program per
# SM), so one config serves every batch (benchmarks/RESULTS.md).
STATE: dict[tuple[int, int], StateConfig] = {
    (64, 64): StateConfig(block_v=32, num_warps=4),
    (64, 128): StateConfig(block_v=32, num_warps=4),
    (128, 64): StateConfig(block_v=32, num_warps=4),
    (128, 128): StateConfig(block_v=32, num_warps=4),
}


def select(head_k: int, head_v: int) -> tuple[PrepConfig, StateConfig]:
    """The pinned (prep, state) configs for these head dims; they must be in HEAD_DIMS."""
    return PREP[(head_k, head_v)], STATE[(head_k, head_v)]
