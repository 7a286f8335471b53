"""The SM75 paged attention kernel against its float64 reference, on the CPU (Triton's interpreter).

Each test swaps in interpreted copies of the kernels (and sets TRITON_INTERPRET=1 for its
duration). `out` and every launcher allocation (split partials) start as NaN, so an element the
kernels fail to write shows up; inputs, caches and block tables (shuffled, non-contiguous, block
sizes that are not powers of two) are fresh random draws each run. The reference dequantises the
same cache with the same scales, so the budget covers the kernel's own error only: fp16 P and
output rounding, fp32 accumulation (budget 5e-3; observed about 5e-4).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from caovan_vllm_sm75_turbo3.errors import CaovanError  # noqa: E402
from caovan_vllm_sm75_turbo3.kernels.attention import (  # noqa: E402
    AttentionInputError, kernel, quantize_cache, triton_kernels, unified_attention, unified_attention_reference,
    widen_fp8)
from caovan_vllm_sm75_turbo3.kernels.attention.configs import select  # noqa: E402
from caovan_vllm_sm75_turbo3.kernels.numerics import rel_error  # noqa: E402  NaN/inf -> inf

BUDGET = 5e-3
# DeprecationWarning: numpy, inside the Triton interpreter
pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@pytest.fixture(autouse=True)
def interpreted_kernels(monkeypatch):
    """Run our kernels (and Triton's @jit standard library) in the interpreter for this test only."""
    import triton.language as tl
    import triton.language.standard as tl_standard
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for module in (tl_standard, tl, triton_kernels, kernel):
        for name, obj in list(vars(module).items()):
            if isinstance(obj, JITFunction):
                monkeypatch.setattr(module, name, InterpretedFunction(obj.fn))


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    monkeypatch.setattr(kernel, "_alloc", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype))


def _bits(x: torch.Tensor) -> torch.Tensor:
    """fp16 bit patterns with every NaN mapped to one pattern (NaN == NaN)."""
    b = x.view(torch.int16).clone()
    b[torch.isnan(x)] = 0x7E00
    return b


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("as_uint8", [True, False])
def test_widen_matches_torch_for_every_byte(fmt, as_uint8):
    raw = torch.arange(256, dtype=torch.uint8)
    fp8 = raw.view(FP8[fmt])
    ours = widen_fp8(raw if as_uint8 else fp8, fmt)
    assert ours.dtype == torch.float16
    assert torch.equal(_bits(ours), _bits(fp8.to(torch.float16)))
    assert int(torch.isnan(ours).sum()) == (2 if fmt == "fp8_e4m3" else 6)  # e5m2: 3 NaN mantissas per sign


def _paged(kv_lens, block_size, kv_heads, head_dim, fmt):
    """A random cache with each sequence's blocks scattered: returns (k, v, block_table, k_src, v_src, ks, vs)."""
    need = [-(-n // block_size) for n in kv_lens]
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks)  # shuffled, non-contiguous blocks; a few stay unused
    width = max(need) + 2
    table = torch.randint(0, num_blocks, (len(kv_lens), width), dtype=torch.int32)  # garbage past each end
    used = 0
    for n, c in enumerate(need):
        table[n, :c] = perm[used:used + c].int()
        used += c
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_src, v_src = torch.randn(shape).half(), torch.randn(shape).half()
    N = len(kv_lens)
    if fmt == "fp16":
        return k_src, v_src, table, k_src, v_src, None, None
    ks = torch.rand(kv_heads) * 0.02 + 0.005  # per-tensor scales != 1, one per KV head as vLLM expands them
    vs = torch.rand(kv_heads) * 0.02 + 0.005
    k8, v8 = quantize_cache(k_src, ks, fmt), quantize_cache(v_src, vs, fmt)
    return k8, v8, table, k_src, v_src, ks.expand(N, kv_heads), vs.expand(N, kv_heads)


def _run(fmt, head_dim, group, kv_heads, block_size, rows, *, as_uint8=False, num_splits=1, window=(-1, -1),
         softcap=0.0):
    """rows: (q_len, context) per sequence; kv_len = context + q_len."""
    q_lens = [r[0] for r in rows]
    kv_lens = [r[0] + r[1] for r in rows]
    k, v, table, _, _, ks, vs = _paged(kv_lens, block_size, kv_heads, head_dim, fmt)
    T, QH = sum(q_lens), kv_heads * group
    q = (torch.randn(T, QH, head_dim) * 0.5).half()
    out = torch.full_like(q, float("nan"))
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    used = torch.tensor(kv_lens, dtype=torch.int32)
    scale = head_dim ** -0.5
    kk, vv, dtype_kw = k, v, None
    if as_uint8:
        kk, vv, dtype_kw = k.view(torch.uint8), v.view(torch.uint8), fmt
    got = unified_attention(q, kk, vv, out, cu, max(q_lens), used, max(kv_lens), scale, True, window, table, softcap,
                            None, ks, vs, kv_cache_dtype=dtype_kw, num_splits=num_splits)
    ref = unified_attention_reference(q, k, v, cu, used, table, scale, window, softcap, ks, vs)
    assert got is out
    return rel_error(out, ref)


# Row kinds, as (q_len, context): decode, speculative verify (1 + 3 drafts), a prefill chunk with
# earlier context, a fresh prefill.
DECODE, VERIFY, CHUNK, FRESH = (1, 37), (4, 21), (19, 30), (23, 0)
CASES = [
    # id, format, head_dim, GQA ratio, kv_heads, block_size, rows, as_uint8, num_splits
    ("e4m3-d128-g6-bs33-mixed", "fp8_e4m3", 128, 6, 1, 33, [DECODE, VERIFY, CHUNK, FRESH], False, 1),
    ("e5m2-d256-g4-bs12-mixed-uint8", "fp8_e5m2", 256, 4, 2, 12, [FRESH, DECODE, VERIFY], True, 1),
    ("fp16-d128-g1-bs16-mixed", "fp16", 128, 1, 2, 16, [CHUNK, DECODE, FRESH], False, 1),
    ("e4m3-d256-g1-bs7-decode-split3", "fp8_e4m3", 256, 1, 2, 7, [(1, 90), DECODE, (1, 0)], True, 4),
    ("e5m2-d128-g6-bs528-verify-split2", "fp8_e5m2", 128, 6, 1, 528, [VERIFY, (4, 60)], False, 2),
    ("fp16-d256-g6-bs5-prefill-split2", "fp16", 256, 6, 1, 5, [CHUNK], False, 2),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_reference(case):
    _, fmt, head_dim, group, kv_heads, block_size, rows, as_uint8, splits = case
    assert _run(fmt, head_dim, group, kv_heads, block_size, rows, as_uint8=as_uint8, num_splits=splits) <= BUDGET


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("nan_byte", [0x7F, 0xFF])
def test_nan_bytes_give_nan_where_the_reference_does(fmt, nan_byte):
    """A NaN key element poisons its KV head's rows, a NaN value element one column of them; nothing else."""
    k, v, table, _, _, ks, vs = _paged([41], 16, 2, 128, fmt)
    kb, vb = k.view(torch.uint8), v.view(torch.uint8)
    kb[table[0, 1], 3, 0, 77] = nan_byte  # key 19 of KV head 0
    vb[table[0, 2], 0, 1, 5] = nan_byte  # key 32 of KV head 1, column 5
    q = (torch.randn(1, 4, 128) * 0.5).half()
    out = torch.full_like(q, float("nan"))
    cu, used = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([41], dtype=torch.int32)
    for splits in (1, 2):
        unified_attention(q, k, v, out, cu, 1, used, 41, 0.1, True, (-1, -1), table, 0.0, None, ks, vs,
                          num_splits=splits)
        ref = unified_attention_reference(q, k, v, cu, used, table, 0.1, (-1, -1), 0.0, ks, vs)
        assert torch.isnan(ref[0, :2]).all() and int(torch.isnan(ref[0, 2:]).sum()) == 2
        assert torch.equal(torch.isnan(out), torch.isnan(ref))
        assert rel_error(out[0, 2:, 6:], ref[0, 2:, 6:]) <= BUDGET


def test_sliding_window_and_softcap():
    err = _run("fp8_e4m3", 128, 4, 1, 10, [VERIFY, CHUNK, DECODE], window=(7, 0), softcap=2.5)
    assert err <= BUDGET


def test_padding_tokens_past_the_last_sequence_are_left_alone():
    """Tokens past cu_seqlens_q[-1] (CUDA-graph padding) are neither read as queries nor written."""
    k, v, table, *_ = _paged([40], 16, 1, 128, "fp16")
    q = torch.randn(6, 4, 128).half()
    out = torch.full_like(q, float("nan"))
    cu, used = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([40], dtype=torch.int32)
    for splits in (1, 2):
        unified_attention(q, k, v, out, cu, 3, used, 40, 0.1, True, (-1, -1), table, 0.0, None, None, None,
                          num_splits=splits)
        ref = unified_attention_reference(q[:3], k, v, cu, used, table, 0.1)
        assert rel_error(out[:3], ref) <= BUDGET and torch.isnan(out[3:]).all()


def test_config_choice_follows_the_longest_query():
    assert select(256, "fp8_e4m3", 6, 1).block_m == 16  # decode: the 6 query heads of a KV head fill M
    assert select(256, "fp8_e4m3", 6, 4).block_m == 64  # verify 1+3 at G=6 needs 24 rows: one program
    assert select(128, "fp16", 32, 1).block_m == 32  # a GQA group larger than 16 rows widens M


@pytest.mark.parametrize("decode", [True, False])
def test_launch_options_are_the_specs(monkeypatch, decode):
    """The launcher passes the options the sm_75 fit test builds with (num_warps, maxnreg: the
    e5m2 decode's register cap), so the product runs the build that was checked."""
    from caovan_vllm_sm75_turbo3.kernels.attention.specs import SPEC_GROUP, attention_spec

    launches = []
    interpreted = kernel._attn_kernel

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(kwargs)
                return interpreted[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(kernel, "_attn_kernel", Recording())
    assert _run("fp8_e5m2", 128, SPEC_GROUP, 1, 16, [DECODE if decode else FRESH], num_splits=2) <= BUDGET
    spec = attention_spec(128, "fp8_e5m2", decode=decode, num_splits=2)
    assert spec.maxnreg == (255 if decode else None)
    assert [(k["num_warps"], k["num_stages"], k["maxnreg"]) for k in launches] == [(spec.num_warps, 1, spec.maxnreg)]
    assert {n: launches[0][n] for n in ("BLOCK_M", "BLOCK_Q", "TILE_N")} == {
        n: spec.constexprs[n] for n in ("BLOCK_M", "BLOCK_Q", "TILE_N")}


@pytest.mark.parametrize("fmt", ["fp16", "fp8_e4m3"])
def test_a_prefill_build_too_big_for_turing_relaunches_with_the_plain_config(monkeypatch, fmt):
    """Where the prefill build came out plain (no Turbo rewrite), Triton refuses its 98 KiB tile on
    Turing (OutOfResources at launch); the launcher then runs PREFILL_PLAIN, and the answer is right."""
    from triton.runtime.errors import OutOfResources

    from caovan_vllm_sm75_turbo3.kernels.attention.configs import PREFILL, PREFILL_PLAIN

    launches = []
    interpreted = kernel._attn_kernel
    too_big = PREFILL[(256, fmt)]

    class Turing:   # refuses the tile a plain build cannot hold, as Triton's loader does on sm_75
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((kwargs["BLOCK_M"], kwargs["TILE_N"], kwargs["num_warps"]))
                if (kwargs["TILE_N"], kwargs["num_warps"]) == (too_big.tile_n, too_big.num_warps):
                    raise OutOfResources(98304, 65536, "shared memory")
                return interpreted[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(kernel, "_attn_kernel", Turing())
    assert _run(fmt, 256, 6, 1, 16, [FRESH, CHUNK]) <= BUDGET
    plain = PREFILL_PLAIN[(256, fmt)]
    assert launches == [(64, too_big.tile_n, too_big.num_warps), (32, plain.tile_n, plain.num_warps)]
    assert plain != too_big


def test_split_plan_fills_the_gpu_from_host_numbers():
    assert kernel.plan_splits(2, 131072, 68) == 64
    assert kernel.plan_splits(2, 4096, 68) == 8  # no split shorter than MIN_KEYS_PER_SPLIT
    assert kernel.plan_splits(1640, 8192, 68) == 1
    assert kernel.plan_splits(2, 131072, None) == 1


@pytest.mark.parametrize("change, words", [
    (dict(head_dim=64), "head_dim=64"),
    (dict(q_dtype=torch.bfloat16), "q must be float16"),
    (dict(kv_dtype=torch.uint8), "kv_cache_dtype="),
    (dict(kv_dtype=torch.float32), "k/v must be"),
    (dict(q_heads=3), "multiple of kv_heads"),
    (dict(causal=False), "causal=False"),
    (dict(window=(4, 3)), "window_size"),
    (dict(q_descale=torch.ones(1)), "q_descale"),
    (dict(k_descale=torch.ones(2, 2)), "k_descale must be float32 [num_seqs, kv_heads]"),
    (dict(sinks=torch.zeros(4)), "sinks"),
    (dict(kv_dtype=torch.float8_e4m3fn, kv_misaligned=True), "multiples of 4 bytes"),
])
def test_refuses_what_it_does_not_support(change, words):
    D = change.get("head_dim", 128)
    q = torch.zeros(3, change.get("q_heads", 4), D, dtype=change.get("q_dtype", torch.float16))
    cache = torch.zeros(4, 16, 2, D).to(change.get("kv_dtype", torch.float16))
    if change.get("kv_misaligned"):  # fp8 bytes one past a word boundary
        cache = torch.zeros(cache.numel() + 1, dtype=cache.dtype)[1:].view(cache.shape)
    extra = {"sinks": change["sinks"]} if "sinks" in change else {}
    with pytest.raises(AttentionInputError) as err:
        unified_attention(q, cache, cache, q.clone(), torch.tensor([0, 3], dtype=torch.int32), 3,
                          torch.tensor([3], dtype=torch.int32), 3, 0.1, change.get("causal", True),
                          change.get("window", (-1, -1)), torch.zeros(1, 1, dtype=torch.int32), 0.0,
                          change.get("q_descale"), change.get("k_descale"), None, **extra)
    assert words in str(err.value) and isinstance(err.value, CaovanError)


def test_reference_in_row_steps_equals_one_step(monkeypatch):
    """The reference's bounded-memory row steps (full-size checks) change nothing."""
    from caovan_vllm_sm75_turbo3.kernels.attention import reference

    k, v, table, *_ = _paged([30, 12], 7, 2, 128, "fp16")
    q = torch.randn(12, 4, 128).half()
    cu, used = torch.tensor([0, 9, 12], dtype=torch.int32), torch.tensor([30, 12], dtype=torch.int32)
    whole = unified_attention_reference(q, k, v, cu, used, table, 0.1)
    monkeypatch.setattr(reference, "_SCORES_PER_STEP", 1)
    assert torch.allclose(unified_attention_reference(q, k, v, cu, used, table, 0.1), whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode, ok", [(0, True), (1, True), ("FP8_PER_TENSOR", True), (3, False), ("NVFP4", False)])
def test_kv_quant_modes(mode, ok):
    from caovan_vllm_sm75_turbo3.kernels.attention.inputs import check_vllm_extras

    kw = dict(alibi_slopes=None, output_scale=None, qq_bias=None, sinks=None, mm_prefix_range=None,
              use_alibi_sqrt=False, k_scale_cache=None, v_scale_cache=None, chunk_lookback=-1)
    if ok:
        check_vllm_extras(kv_quant_mode=mode, **kw)
    else:
        with pytest.raises(AttentionInputError, match="kv_quant_mode"):
            check_vllm_extras(kv_quant_mode=mode, **kw)
