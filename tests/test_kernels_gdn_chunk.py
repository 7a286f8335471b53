"""The chunked GDN prefill kernel against the float64 token-serial reference, on the CPU.

The kernels run in Triton's interpreter: each test swaps in interpreted copies of them (and sets
TRITON_INTERPRET=1 for its duration), whatever mode the kernel module was imported in.
Every buffer the launcher allocates (output, intermediates, final state) and a given
core_attn_out are filled with NaN first, so a row the kernels fail to write shows up; inputs are
fresh random tensors each run. Error budget: ||out - ref|| / ||ref|| <= 5e-3 for the output and
the final state (fp16 q/k/v and fp16 intermediates, fp32 state and accumulation; observed ~5e-4).
"""

from __future__ import annotations

import pytest
torch = pytest.importorskip("torch")
import torch.nn.functional as F

from caovan_vllm_sm75_turbo3.errors import CaovanError
from caovan_vllm_sm75_turbo3.kernels.gdn import GDNInputError, chunk, chunk_gated_delta_rule, gated_delta_rule_reference
from caovan_vllm_sm75_turbo3.kernels.gdn.configs import CHUNK, STATE, SmBudget, select_state
from caovan_vllm_sm75_turbo3.kernels.numerics import rel_error  # NaN/inf -> inf, fails <= BUDGET

BUDGET = 5e-3
# DeprecationWarning: numpy, inside the Triton interpreter
pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(autouse=True)
def interpreted_kernels(monkeypatch):
    """Run our two kernels in Triton's interpreter for this test only.

    Triton's standard library (tl.cumsum, tl.sum, ...) is itself @triton.jit code: imported
    without TRITON_INTERPRET=1 those are compiler-only JITFunctions, so they are swapped for
    interpreted copies too, in both namespaces a kernel may reach them through.
    """
    import triton.language as tl
    import triton.language.standard as tl_standard
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for module in (tl_standard, tl, chunk):
        for name, obj in list(vars(module).items()):
            if isinstance(obj, JITFunction):
                monkeypatch.setattr(module, name, InterpretedFunction(obj.fn))


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """Make every launcher allocation start as NaN (or a huge value for integer buffers)."""
    def nan_alloc(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    monkeypatch.setattr(chunk, "_alloc", nan_alloc)


def _inputs(lens, B, H, HV, K, V, *, normalized, with_state):
    T = sum(lens) if lens is not None else None
    if lens is None:
        raise AssertionError("lens required")
    q = torch.randn(B, T, H, K)
    k = torch.randn(B, T, H, K)
    if normalized:  # vLLM normalises q and k before the call unless use_qk_l2norm_in_kernel
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    else:
        q, k = q * 0.7, k * 1.3
    v = torch.randn(B, T, HV, V)
    g = F.logsigmoid(torch.randn(B, T, HV) + 2.0)  # log-space decay in (-inf, 0)
    beta = torch.rand(B, T, HV)
    N = len(lens) if B == 1 else B
    h0 = torch.randn(N, HV, V, K) * 0.5 if with_state else None
    return q.half(), k.half(), v.half(), g.float(), beta.float(), h0


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def _chunk_indices(lens):
    """vLLM's precomputed (sequence, chunk) pairs, written out plainly."""
    pairs = [(n, c) for n, length in enumerate(lens) for c in range(-(-length // CHUNK))]
    return torch.tensor(pairs, dtype=torch.int32).reshape(-1, 2)


CASES = [
    # id, lens, H, HV, K, V, l2norm, state, final, chunk_indices, scale
    ("edge-lengths-gqa1", [1, 64, 37, 133], 2, 2, 64, 64, False, True, True, True, None),
    ("random-gqa2-l2norm-search", "random", 2, 4, 128, 128, True, False, True, False, None),
    ("gqa3-k128-v64-no-final", "random", 2, 6, 128, 64, False, True, False, True, 0.3),
    ("empty-sequence-k64-v128", [5, 0, 70], 1, 2, 64, 128, True, True, True, False, None),
    ("one-exact-chunk-l2norm", [64], 2, 4, 128, 128, True, True, True, True, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_varlen_matches_reference(case):
    _, lens, H, HV, K, V, l2norm, with_state, final, with_ci, scale = case
    if lens == "random":
        lens = torch.randint(1, 150, (3,)).tolist()
    q, k, v, g, beta, h0 = _inputs(lens, 1, H, HV, K, V, normalized=not l2norm, with_state=with_state)
    cu = _cu(lens)
    ci = _chunk_indices(lens) if with_ci else None
    o, st = chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=final,
                                   cu_seqlens=cu, chunk_indices=ci, use_qk_l2norm_in_kernel=l2norm)
    ro, rs = gated_delta_rule_reference(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=final,
                                        cu_seqlens=cu, use_qk_l2norm_in_kernel=l2norm)
    assert o.shape == (1, sum(lens), HV, V) and o.dtype == torch.float16
    assert rel_error(o, ro) <= BUDGET
    if final:
        assert st.shape == (len(lens), HV, V, K) and st.dtype == torch.float32
        assert rel_error(st, rs) <= BUDGET
    else:
        assert st is None


@pytest.mark.parametrize("l2norm", [False, True])
def test_batched_rows_without_cu_seqlens(l2norm):
    q, k, v, g, beta, h0 = _inputs([70], 2, 2, 4, 64, 64, normalized=not l2norm, with_state=True)
    o, st = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                   use_qk_l2norm_in_kernel=l2norm)
    ro, rs = gated_delta_rule_reference(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                        use_qk_l2norm_in_kernel=l2norm)
    assert rel_error(o, ro) <= BUDGET and rel_error(st, rs) <= BUDGET


def test_core_attn_out_is_written_in_place():
    lens = [3, 64, 20]
    q, k, v, g, beta, h0 = _inputs(lens, 1, 1, 2, 64, 64, normalized=True, with_state=True)
    T, HV, V = sum(lens), 2, 64
    buf = torch.full((T + 5, HV, V), float("nan"), dtype=torch.float16)  # larger than needed, like vLLM's
    o, st = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                   cu_seqlens=_cu(lens), core_attn_out=buf)
    ro, _ = gated_delta_rule_reference(q, k, v, g, beta, initial_state=h0, cu_seqlens=_cu(lens))
    assert o.data_ptr() == buf.data_ptr()
    assert rel_error(buf[:T].unsqueeze(0), ro) <= BUDGET
    assert torch.isnan(buf[T:]).all(), "wrote past the output's elements"


def test_sequences_are_independent():
    """Each packed sequence gives what it gives alone (no state leaks across cu_seqlens)."""
    lens = [40, 90]
    q, k, v, g, beta, h0 = _inputs(lens, 1, 1, 1, 64, 64, normalized=True, with_state=True)
    o, st = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=_cu(lens))
    s = slice(40, 130)
    o2, st2 = chunk_gated_delta_rule(q[:, s], k[:, s], v[:, s], g[:, s], beta[:, s], initial_state=h0[1:],
                                     output_final_state=True, cu_seqlens=_cu([90]))
    assert torch.equal(o[:, s], o2) and torch.equal(st[1:], st2)


@pytest.mark.parametrize("change, words", [
    (dict(K=96), "K=96"),
    (dict(V=256), "V=256"),
    (dict(HV=3, H=2), "multiple of key heads"),
    (dict(dtype=torch.bfloat16), "float16"),
])
def test_refuses_what_it_does_not_support(change, words):
    K, V, H, HV = change.get("K", 64), change.get("V", 64), change.get("H", 1), change.get("HV", 2)
    dt = change.get("dtype", torch.float16)
    q = torch.zeros(1, 8, H, K, dtype=dt)
    v = torch.zeros(1, 8, HV, V, dtype=dt)
    g = torch.zeros(1, 8, HV)
    with pytest.raises(GDNInputError) as err:
        chunk_gated_delta_rule(q, q.clone(), v, g, g.clone(), cu_seqlens=_cu([8]))
    assert words in str(err.value) and isinstance(err.value, CaovanError)


@pytest.mark.parametrize("cap, ok", [((7, 5), True), ((8, 6), True), ((8, 9), True), ((7, 0), False),
                                     ((9, 0), False), ((10, 0), False)])
def test_gpu_generations_outside_the_verified_range_are_refused(cap, ok):
    from caovan_vllm_sm75_turbo3.kernels.gdn.inputs import check_capability

    if ok:
        check_capability(cap)
        return
    with pytest.raises(GDNInputError, match=rf"7\.5 to 8\.9; this one is {cap[0]}\.{cap[1]}"):
        check_capability(cap)


def test_refuses_mismatched_initial_state():
    q, k, v, g, beta, _ = _inputs([5, 6], 1, 1, 1, 64, 64, normalized=True, with_state=False)
    with pytest.raises(GDNInputError, match=r"initial_state must be \[N, HV, V, K\]"):
        chunk_gated_delta_rule(q, k, v, g, beta, initial_state=torch.zeros(1, 1, 64, 64), cu_seqlens=_cu([5, 6]))


def test_launch_plan_reads_no_tensor_values():
    """Grids, configs and segments come from shapes alone: on the meta device any value read would raise."""
    meta = torch.device("meta")
    T, HV = 300, 24
    cu = torch.empty(9, dtype=torch.int32, device=meta)
    plan = chunk.plan_launch(batch=1, tokens=T, value_heads=HV, head_k=128, head_v=128, sequences=8,
                             cu_seqlens=cu, chunk_indices=None)
    assert plan.n_chunks == -(-T // CHUNK) + 8 and plan.segments == ((0, plan.n_chunks),)
    assert plan.prep_grid(plan.segments[0], HV) == (plan.n_chunks * HV,)
    ci = torch.empty(11, 2, dtype=torch.int32, device=meta)
    plan = chunk.plan_launch(batch=1, tokens=T, value_heads=HV, head_k=128, head_v=128, sequences=8,
                             cu_seqlens=cu, chunk_indices=ci, segment_chunks=4)
    assert plan.segments == ((0, 4), (4, 8), (8, 11))
    assert [plan.prep_grid(s, HV) for s in plan.segments] == [(4 * HV,), (4 * HV,), (3 * HV,)]
    assert plan.state_grid == (128 // plan.state.block_v, 8 * HV)
    programs = plan.state_grid[0] * plan.state_grid[1]
    for sm_count, segments in ((programs, 3), (programs - 1, 1)):  # segments only while the state pass leaves SMs idle
        budget = SmBudget(sm_count, 1 << 20, 1 << 20)
        plan = chunk.plan_launch(batch=1, tokens=T, value_heads=HV, head_k=128, head_v=128, sequences=8,
                                 cu_seqlens=cu, chunk_indices=ci, segment_chunks=4, budget=budget)
        assert len(plan.segments) == segments and plan.segments[-1][1] == 11


H200 = SmBudget(132, 233472, 65536)
RTX_2080_TI = SmBudget(68, 65536, 65536)


@pytest.mark.parametrize("budget, rows, early", [
    (H200, 24, True),          # Qwen3.6-27B at TP 2, one sequence: 96 programs, resident at once either way
    (H200, 8 * 24, True),      # 768 programs: three waves either way, so the preferred config
    (RTX_2080_TI, 24, False),  # 56 KiB each: one per SM, two waves; 24 KiB: two per SM, one wave
    (RTX_2080_TI, 12, True),   # TP 4: 48 programs, one wave either way
    (None, 24, True),          # no card (CPU): the preferred config
])
def test_state_config_follows_the_card(budget, rows, early):
    """The state config is the one whose serial pass runs in the fewest waves on the card."""
    cfg = select_state(128, 128, rows, budget)
    assert cfg.early_loads is early and cfg.block_v == 32
    meta = torch.device("meta")
    plan = chunk.plan_launch(batch=1, tokens=4096, value_heads=rows, head_k=128, head_v=128, sequences=1,
                             cu_seqlens=torch.empty(2, dtype=torch.int32, device=meta), chunk_indices=None,
                             budget=budget)
    assert plan.state == cfg


@pytest.mark.parametrize("lens, head_k", [([150, 1, 64, 90], 64), ([200], 64), ([150, 1, 64, 90], 128)])
def test_late_loads_equal_early_loads(lens, head_k, monkeypatch):
    """The late-load state config computes the same bits as the early-load one (K=128: the paired
    loads of the two 64-row halves)."""
    q, k, v, g, beta, h0 = _inputs(lens, 1, 1, 2, head_k, 128, normalized=True, with_state=True)
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=_cu(lens))
    late = next(c for c in STATE[(head_k, 128)] if not c.early_loads)
    o1, st1 = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    assert chunk.plan_launch(batch=1, tokens=sum(lens), value_heads=2, head_k=head_k, head_v=128,
                             sequences=len(lens), cu_seqlens=kw["cu_seqlens"], chunk_indices=None).state.early_loads
    monkeypatch.setattr(chunk, "select_state", lambda *a: late)
    o2, st2 = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    assert torch.equal(o1, o2) and torch.equal(st1, st2)


SEGMENT_CASES = [
    # id, lens (B=1 packed) or None for a batch of 2 rows of 150, initial state, final state, chunk_indices
    ("packed-edges", [1, 64, 130, 37, 200], True, True, True),
    ("packed-no-final-search", [150, 1, 64, 90], False, False, False),
    ("batched-rows", None, True, True, False),
]


@pytest.mark.parametrize("case", SEGMENT_CASES, ids=[c[0] for c in SEGMENT_CASES])
@pytest.mark.parametrize("segment_chunks", [1, 2, 3])
def test_segmented_launch_equals_one_launch(case, segment_chunks, monkeypatch):
    """Splitting the chunks into segments (state carried between launches) changes no bit."""
    _, lens, with_state, final, with_ci = case
    B = 1 if lens is not None else 2
    q, k, v, g, beta, h0 = _inputs(lens or [150], B, 1, 2, 64, 64, normalized=True, with_state=with_state)
    kw = dict(initial_state=h0, output_final_state=final)
    if lens is not None:
        kw |= dict(cu_seqlens=_cu(lens), chunk_indices=_chunk_indices(lens) if with_ci else None)
    o1, st1 = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    monkeypatch.setattr(chunk, "SEGMENT_CHUNKS", segment_chunks)
    o2, st2 = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    ro, rs = gated_delta_rule_reference(q, k, v, g, beta, **{n: x for n, x in kw.items() if n != "chunk_indices"})
    assert rel_error(o2, ro) <= BUDGET and torch.equal(o1, o2)
    if final:
        assert rel_error(st2, rs) <= BUDGET and torch.equal(st1, st2)
    else:
        assert st1 is None and st2 is None
