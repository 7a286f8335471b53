"""Launch configurations for the GDN prefill kernels, pinned per shape class (no autotuning).

vLLM's FLA kernels autotune on the first (64-token warmup) call and reuse that choice for 32K
tokens; here the choice is a table lookup on shapes known on the host, so a serving process
never benchmarks and never depends on what the first request looked like. Every entry is
checked to compile for sm_75 within 64 KiB of shared memory and without register spills
(tests/test_gdn_sm75_fit.py).
"""

from __future__ import annotations

from dataclasses import dataclass

CHUNK = 64  # tokens per chunk (BT); the same chunking as vLLM's FLA (FLA_CHUNK_SIZE)
HEAD_DIMS = (64, 128)  # K and V each; others are refused
# Fewer (sequence, value head) pairs than this leave SMs idle with 64-wide value slices,
# so the state kernel then splits V finer. 2 x 68 SMs of a 2080 Ti, rounded down.
FEW_PAIRS = 128


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
# 32-wide tiles, 13 % faster than 16-wide on the H200 (benchmarks/RESULTS.md); 8 warps were
# twice as slow and spilled. K=64: 16-wide, since 32-wide spills with the in-kernel L2 norm.
PREP: dict[tuple[int, int], PrepConfig] = {
    (64, 64): PrepConfig(block_k=16, num_warps=4),
    (64, 128): PrepConfig(block_k=16, num_warps=4),
    (128, 64): PrepConfig(block_k=32, num_warps=4),
    (128, 128): PrepConfig(block_k=32, num_warps=4),
}

# (K, V, shape class) -> state config; classes: "few" pairs (long prompts) or "many" (batches).
STATE: dict[tuple[int, int, str], StateConfig] = {
    (64, 64, "few"): StateConfig(block_v=16, num_warps=4),
    (64, 64, "many"): StateConfig(block_v=32, num_warps=8),
    (64, 128, "few"): StateConfig(block_v=16, num_warps=4),
    (64, 128, "many"): StateConfig(block_v=32, num_warps=8),
    (128, 64, "few"): StateConfig(block_v=16, num_warps=4),
    (128, 64, "many"): StateConfig(block_v=32, num_warps=8),
    (128, 128, "few"): StateConfig(block_v=16, num_warps=4),
    (128, 128, "many"): StateConfig(block_v=32, num_warps=8),
}


def shape_class(num_sequences: int, num_value_heads: int) -> str:
    """'few' when there are too few (sequence, value head) pairs to fill the GPU, else 'many'."""
    return "few" if num_sequences * num_value_heads < FEW_PAIRS else "many"


def select(head_k: int, head_v: int, num_sequences: int, num_value_heads: int) -> tuple[PrepConfig, StateConfig]:
    """The pinned (prep, state) configs for these shapes; head dims must be in HEAD_DIMS."""
    cls = shape_class(num_sequences, num_value_heads)
    return PREP[(head_k, head_v)], STATE[(head_k, head_v, cls)]
