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
    """The sequential kernel: one program per (value slice of BV, sequence, value head).

    `early_loads`: every operand of a chunk is fetched (and staged in shared memory) at the top of
    its iteration; otherwise right before its products (K=128: both 64-row halves of one operand
    together), which needs far less shared memory.
    `shared_bytes`: shared memory of its sm_75 turbo build, pinned so that the launcher can count
    programs per SM without compiling (tests/test_kernels_gdn_fit.py checks it against the build).
    """

    block_v: int
    num_warps: int
    early_loads: bool
    shared_bytes: int


@dataclass(frozen=True)
class SmBudget:
    """What one SM of the card offers (torch.cuda.get_device_properties on the user's card)."""

    sm_count: int
    shared_per_sm: int
    regs_per_sm: int


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

# (K, V) -> state configs, preferred first. 32-wide value slices by 4 warps beat 16-wide/4 warps
# and 32-wide/8 warps for long single prompts and packed batches alike (benchmarks/RESULTS.md),
# with early loads on a card where the whole state pass is resident at once (an H200: 96 programs
# at TP 2 on 132 SMs). Early loads take 56 KiB of shared memory, so on Turing (64 KiB per SM) one
# program fits per SM and a 2080 Ti (68 SMs) runs Qwen3.6-27B's 96 programs at TP 2 in two waves
# of the serial pass; the late-load build takes 24 KiB (16 at K=64), and its two programs per SM (registers
# allow two) run them in one. select_state picks by that count. In the Turing-shaped proxy (68
# SMs asked, 72 given, 64 KiB per SM) late loads cut the state pass at T=32768 from 3.40 to 2.77 ms
# and each row's total by 2-18 %; on a full H200, where both fit at once, early loads stay 1.2-1.6x
# faster (benchmarks/RESULTS.md, "Turing-shaped proxy", 2026-12-04). BV=64 was no way out: with 4 warps it spills (112 B),
# with 8 its chained products repeat half their work (2.46 ms against 1.25 for the state pass at
# T=32768 on the H200).
STATE: dict[tuple[int, int], tuple[StateConfig, ...]] = {
    (64, 64): (StateConfig(32, 4, True, 32768), StateConfig(32, 4, False, 16384)),
    (64, 128): (StateConfig(32, 4, True, 32768), StateConfig(32, 4, False, 16384)),
    (128, 64): (StateConfig(32, 4, True, 57344), StateConfig(32, 4, False, 24576)),
    (128, 128): (StateConfig(32, 4, True, 57344), StateConfig(32, 4, False, 24576)),
}
MAX_REGISTERS = 255  # per thread; the pinned builds may use all of them (ptxas' sm_75 cap)


def state_waves(cfg: StateConfig, head_v: int, rows: int, budget: SmBudget) -> int:
    """Waves of the state pass: its programs over how many fit on the card at once, by shared
    memory and (at the worst case of 255 registers a thread) by registers."""
    per_sm = min(budget.shared_per_sm // cfg.shared_bytes, budget.regs_per_sm // (cfg.num_warps * 32 * MAX_REGISTERS))
    programs = head_v // cfg.block_v * rows
    return -(-programs // (max(per_sm, 1) * budget.sm_count))


def select_state(head_k: int, head_v: int, rows: int, budget: SmBudget | None) -> StateConfig:
    """The state config for `rows` (sequences x value heads) on this card: the one whose serial
    pass runs in the fewest waves, the earlier one on a tie (without a budget, the first)."""
    cfgs = STATE[(head_k, head_v)]
    if budget is None:
        return cfgs[0]
    return min(cfgs, key=lambda c: state_waves(c, head_v, rows, budget))
