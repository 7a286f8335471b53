"""Chunked Gated DeltaNet prefill in two Triton kernels, built to fit Turing (sm_75).

Per value head and chunk of BT=64 tokens, with gamma the in-chunk cumulative log gate, state S
[V, K] at the chunk start, and T = (I + A)^-1 for A[i,j] = beta_i (k_i.k_j) e^(gamma_i-gamma_j), j < i:

    W  = T diag(beta e^gamma) K          U  = T diag(beta) V          (the WY form)
    P  = scale (Q K^T) e^(gamma_i-gamma_j), j <= i
    Q' = scale diag(e^gamma) Q - P W     O_intra = P U
    delta = U - W S^T                    O = O_intra + Q' S^T
    S <- e^(gamma_last) S + delta^T diag(e^(gamma_last - gamma)) K

1. `_prep_kernel`: one program per (chunk, value head), all chunks in parallel. It does every
   step that does not need S (T, W, U, Q', O_intra) and writes W, U, Q' and the decayed keys in
   fp16 (as FLA stores w and u), O_intra straight into the output. T is solved in 16-row
   blocks: the four diagonal blocks by fp32 forward substitution at once (15 warp-local steps),
   then the blocks below them by tensor-core products, through this program's own rows of w and
   kd as scratch (no extra buffer). One loop walks the K and V column tiles together, each
   fetched one iteration ahead. The grid is flat with value heads fastest.
2. `_state_kernel`: one program per (value slice, sequence, value head). The state slice [K, BV]
   stays in registers across all chunks; per chunk and 64-row half of K, three tensor-core
   products whose operands are staged through shared memory as soon as the chunk starts.
   Neither the per-chunk states nor delta (FLA's v_new) ever go to memory.

When the state pass has at most one program per SM (a long prompt, few sequences), the chunks
run as segments of SEGMENT_CHUNKS (`run_segments`): one prep and one state launch each, the
state pass on a second stream, so the prep of segment i+1 fills the SMs that the state
programs leave idle while they work through segment i. Between segments each state program
parks its fp32 slice in the final-state buffer (or a scratch one); the arithmetic is the same,
so the result is bitwise that of one launch each.

Fusing step 1 into step 2 would keep W/U on chip as well, but the solve would then run serially
chunk after chunk in few programs; for a long prompt (one sequence, 24 heads) the parallel prep
should be the faster split (the fused variant was not built). All matrix products take fp16
operands and accumulate in fp32, so a planned-as-sm_80 build rewritten for sm_75
(kernels/turbo) runs them on tensor cores. Measured cost split: benchmarks/RESULTS.md.

Packed sequences (`cu_seqlens`) need no host synchronisation: the prep grid is sized from T and
N (or from vLLM's precomputed `chunk_indices`), programs past the last chunk do nothing, and
each program finds its sequence on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

from .configs import CHUNK, L2NORM_EPS, PREP, SEGMENT_CHUNKS, PrepConfig, SmBudget, StateConfig, select_state
from .inputs import check_inputs
from .triton_kernels import _prep_kernel, _state_kernel


def _alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer the launcher allocates comes from here (tests replace it to poison buffers)."""
    return torch.empty(shape, dtype=dtype, device=device)


@dataclass(frozen=True)
class LaunchPlan:
    """Grids, pinned configs and segments of one call, decided from shapes alone.

    `segments` are windows [lo, hi) of flat chunk indices (sequence by sequence, chunk by chunk,
    the order of vLLM's chunk_indices). Each window gets its own prep and state launch, so the
    prep of window i+1 runs while the state pass works through window i.
    """

    prep: PrepConfig
    state: StateConfig
    n_chunks: int  # flat chunks the prep grid covers (an upper bound without chunk_indices)
    segments: tuple[tuple[int, int], ...]
    state_grid: tuple[int, int]

    def prep_grid(self, segment: tuple[int, int], value_heads: int) -> tuple[int]:
        """The prep grid of one segment: one program per (chunk, value head), heads fastest."""
        return ((segment[1] - segment[0]) * value_heads,)


def plan_launch(*, batch: int, tokens: int, value_heads: int, head_k: int, head_v: int, sequences: int,
                cu_seqlens: torch.Tensor | None, chunk_indices: torch.Tensor | None,
                segment_chunks: int = SEGMENT_CHUNKS, budget: SmBudget | None = None) -> LaunchPlan:
    """The launch for these shapes on a card with this SM `budget` (None, as on the CPU: no
    limits). Reads tensor shapes only, never values (no host sync).

    The state config is the one whose serial pass runs in the fewest waves on the card
    (configs.select_state). The chunks are split into segments only when the state pass has at
    most one program per SM: then SMs are idle that the next segment's prep can use. With more
    state programs the GPU is already full, and segments only add launches (measured:
    benchmarks/RESULTS.md).
    """
    prep_cfg = PREP[(head_k, head_v)]
    state_cfg = select_state(head_k, head_v, sequences * value_heads, budget)
    if cu_seqlens is None:
        n_chunks = batch * triton.cdiv(tokens, CHUNK)
    elif chunk_indices is not None:
        n_chunks = chunk_indices.shape[0]
    else:
        n_chunks = triton.cdiv(tokens, CHUNK) + sequences  # sum(ceil(len_i / BT)) <= T / BT + N
    state_grid = (head_v // state_cfg.block_v, sequences * value_heads)
    if budget is not None and state_grid[0] * state_grid[1] > budget.sm_count:
        segment_chunks = max(n_chunks, 1)
    segments = tuple((lo, min(lo + segment_chunks, n_chunks)) for lo in range(0, n_chunks, segment_chunks))
    return LaunchPlan(prep_cfg, state_cfg, n_chunks, segments, state_grid)


def sm_budget(device: torch.device) -> SmBudget | None:
    """The SM count, shared memory and registers per SM of a CUDA device (None elsewhere)."""
    if device.type != "cuda":
        return None
    p = torch.cuda.get_device_properties(device)
    return SmBudget(p.multi_processor_count, p.shared_memory_per_multiprocessor, p.regs_per_multiprocessor)


def run_segments(plan: LaunchPlan, device: torch.device, prep: Callable[[tuple[int, int]], None],
                 state: Callable[[tuple[int, int]], None]) -> None:
    """Launch each segment's prep, then its state pass, overlapping the two on a CUDA device.

    The preps go on the current stream, back to back; the state passes on a high-priority
    pooled stream that waits for each segment's prep and joins back at the end (so CUDA graph
    capture sees one fork and join, and the caching allocator needs no extra bookkeeping: every
    buffer is used on the side stream only before the join). Holding the preps back to a few
    segments ahead of the state pass gained nothing (benchmarks/RESULTS.md). Elsewhere (the CPU
    interpreter) they run in turn.
    """
    if device.type != "cuda" or len(plan.segments) == 1:
        for seg in plan.segments:
            prep(seg)
            state(seg)
        return
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device=device, priority=-1)
    side.wait_stream(main)
    for seg in plan.segments:
        prep(seg)
        prepped = torch.cuda.Event()
        prepped.record(main)
        side.wait_event(prepped)
        with torch.cuda.stream(side):
            state(seg)
    main.wait_stream(side)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    chunk_offsets: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    core_attn_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaNet prefill with vLLM 0.21's `chunk_gated_delta_rule` interface and layouts.

    q, k `[B, T, H, K]` and v `[B, T, HV, V]` float16; g (log-space decay) and beta `[B, T, HV]`;
    value head i reads key head `i // (HV // H)`. With `cu_seqlens` (`[N+1]`, B == 1) the tokens
    are N packed sequences; `chunk_indices` (`[num_chunks, 2]`, vLLM's precomputed
    (sequence, chunk) pairs) sizes the grid exactly when given. `chunk_offsets` is accepted for
    interface compatibility and not needed (no per-chunk state is stored). `initial_state` and
    the final state are `[N, HV, V, K]`, float32. `scale` defaults to K ** -0.5.
    `use_qk_l2norm_in_kernel` L2-normalises q and k per head first (eps 1e-6, as vLLM).

    Returns `(o, final_state)`: o `[B, T, HV, V]` in q's dtype (a view of the first elements of
    `core_attn_out` when that is given, which is then written in place), final_state float32
    or None when `output_final_state` is False. Head dims other than 64/128 and non-fp16 q/k/v
    raise GDNInputError. Never synchronises with the host.
    """
    del chunk_offsets  # part of vLLM's signature; this kernel has no use for it
    s = check_inputs(q, k, v, g, beta, initial_state, cu_seqlens, chunk_indices, core_attn_out)
    B, T, H, HV, K, V, N = s.batch, s.tokens, s.key_heads, s.value_heads, s.head_k, s.head_v, s.sequences
    dev = q.device
    plan = plan_launch(batch=B, tokens=T, value_heads=HV, head_k=K, head_v=V, sequences=N, cu_seqlens=cu_seqlens,
                       chunk_indices=chunk_indices, segment_chunks=SEGMENT_CHUNKS, budget=sm_budget(dev))
    if scale is None:
        scale = K**-0.5
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = g.to(torch.float32).contiguous()
    beta = beta.to(torch.float32).contiguous()
    if initial_state is not None:
        initial_state = initial_state.to(torch.float32).contiguous()

    if core_attn_out is not None:
        o = core_attn_out.reshape(-1)[: B * T * HV * V].view(B, T, HV, V)
    else:
        o = _alloc((B, T, HV, V), q.dtype, dev)
    w = _alloc((B, T, HV, K), torch.float16, dev)
    qd = _alloc((B, T, HV, K), torch.float16, dev)
    kd = _alloc((B, T, HV, K), torch.float16, dev)
    u = _alloc((B, T, HV, V), torch.float16, dev)
    final_state = _alloc((N, HV, V, K), torch.float32, dev) if output_final_state else None

    is_varlen = cu_seqlens is not None
    if T == 0 or plan.n_chunks == 0:
        if final_state is not None:
            final_state.copy_(initial_state if initial_state is not None else torch.zeros_like(final_state))
        return o, final_state
    # Between segments the state waits in the final-state buffer, or in a scratch one. With a
    # single segment the carry is never touched, and g stands in for it (any fp32 pointer).
    if final_state is not None:
        carry = final_state
    elif len(plan.segments) > 1:
        carry = _alloc((N, HV, V, K), torch.float32, dev)
    else:
        carry = g

    def prep(seg: tuple[int, int]) -> None:
        _prep_kernel[plan.prep_grid(seg, HV)](
            q, k, v, g, beta, w, u, qd, kd, o, cu_seqlens, chunk_indices, T, N, seg[0], float(scale),
            H=H, HV=HV, K=K, V=V, BT=CHUNK, BK=plan.prep.block_k, IS_VARLEN=is_varlen,
            HAS_CHUNK_INDICES=chunk_indices is not None, USE_L2NORM=bool(use_qk_l2norm_in_kernel), EPS=L2NORM_EPS,
            num_warps=plan.prep.num_warps, num_stages=1,
        )

    def state(seg: tuple[int, int]) -> None:
        _state_kernel[plan.state_grid](
            w, u, qd, kd, g, o, initial_state, final_state, carry, cu_seqlens, T, seg[0], seg[1], plan.n_chunks,
            HV=HV, K=K, V=V, BT=CHUNK, BV=plan.state.block_v, IS_VARLEN=is_varlen,
            USE_INITIAL_STATE=initial_state is not None, STORE_FINAL_STATE=final_state is not None,
            EARLY_LOADS=plan.state.early_loads, num_warps=plan.state.num_warps, num_stages=1,
        )

    run_segments(plan, dev, prep, state)
    return o, final_state
