"""Chunked Gated DeltaNet prefill in two Triton kernels, built to fit Turing (sm_75).

Per value head and chunk of BT=64 tokens, with gamma the in-chunk cumulative log gate, state S
[V, K] at the chunk start, and T = (I + A)^-1 for A[i,j] = beta_i (k_i.k_j) e^(gamma_i-gamma_j), j < i:

    W  = T diag(beta e^gamma) K          U  = T diag(beta) V          (the WY form)
    P  = scale (Q K^T) e^(gamma_i-gamma_j), j <= i
    Q' = scale diag(e^gamma) Q - P W     O_intra = P U
    delta = U - W S^T                    O = O_intra + Q' S^T
    S <- e^(gamma_last) S + delta^T diag(e^(gamma_last - gamma)) K

1. `_prep_kernel`: one program per (chunk, value head), all chunks in parallel. It does every
   step that does not need S (the 64x64 solve, W, U, Q', O_intra) and writes W, U, Q' and the
   decayed keys in fp16 (as FLA stores w and u), O_intra straight into the output.
2. `_state_kernel`: one program per (value slice, sequence, value head). The state slice [K, BV]
   stays in registers across all chunks; per chunk three tensor-core products. Neither the
   per-chunk states nor delta (FLA's v_new) ever go to memory.

Fusing step 1 into step 2 would keep W/U on chip as well, but then the solve runs serially
chunk after chunk in few programs; on a long prompt (one sequence, 24 heads) the parallel prep
is the faster split. All matrix products take fp16 operands and accumulate in fp32, so a
planned-as-sm_80 build rewritten for sm_75 (kernels/turbo) runs them on tensor cores.

Packed sequences (`cu_seqlens`) need no host synchronisation: the prep grid is sized from T and
N (or from vLLM's precomputed `chunk_indices`), programs past the last chunk do nothing, and
each program finds its sequence on the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .configs import CHUNK, select
from .inputs import check_inputs
from .reference import L2NORM_EPS


@triton.jit(do_not_specialize=["T", "N"])
def _prep_kernel(
    q, k, v, g, beta,  # inputs: [*, H, K] fp16 x2, [*, HV, V] fp16, [*, HV] fp32 x2
    w, u, qd, kd, o,  # outputs: [*, HV, K] fp16, [*, HV, V] fp16, [*, HV, K] fp16 x2, [*, HV, V]
    cu_seqlens, chunk_indices,  # int32/int64 or None
    T, N, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_CHUNK_INDICES: tl.constexpr, USE_L2NORM: tl.constexpr, EPS: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    i_hk = i_h // (HV // H)
    if IS_VARLEN:
        if HAS_CHUNK_INDICES:
            i_n = tl.load(chunk_indices + 2 * i_c).to(tl.int32)
            i_t = tl.load(chunk_indices + 2 * i_c + 1).to(tl.int32)
        else:
            # The grid is an upper bound on the chunk count; find (sequence, chunk) on the device.
            i_n = i_c * 0 - 1
            i_t = i_c * 0
            rem = i_c
            for n in range(0, N):
                nc = (tl.load(cu_seqlens + n + 1).to(tl.int32) - tl.load(cu_seqlens + n).to(tl.int32) + BT - 1) // BT
                hit = (rem >= 0) & (rem < nc)
                i_n = tl.where(hit, n, i_n)
                i_t = tl.where(hit, rem, i_t)
                rem = rem - nc
        bos = tl.load(cu_seqlens + tl.maximum(i_n, 0)).to(tl.int32)
        eos = tl.load(cu_seqlens + tl.maximum(i_n, 0) + 1).to(tl.int32)
        eos = tl.where(i_n >= 0, eos, bos)  # a program past the last chunk masks everything
    else:
        nts = (T + BT - 1) // BT
        i_n = i_c // nts
        i_t = i_c % nts
        bos = i_n * T
        eos = bos + T

    r = tl.arange(0, BT)
    ck = tl.arange(0, K)
    cv = tl.arange(0, V)
    rows = bos + i_t * BT + r
    m = rows < eos
    rows64 = rows.to(tl.int64)

    b_k = tl.load(k + rows64[:, None] * (H * K) + i_hk * K + ck[None, :], mask=m[:, None], other=0.0)
    b_q = tl.load(q + rows64[:, None] * (H * K) + i_hk * K + ck[None, :], mask=m[:, None], other=0.0)
    if USE_L2NORM:
        kf = b_k.to(tl.float32)
        b_k = (kf / tl.sqrt(tl.sum(kf * kf, 1) + EPS)[:, None]).to(tl.float16)
        qf = b_q.to(tl.float32)
        b_q = (qf / tl.sqrt(tl.sum(qf * qf, 1) + EPS)[:, None]).to(tl.float16)
    b_g = tl.load(g + rows64 * HV + i_h, mask=m, other=0.0)
    b_beta = tl.load(beta + rows64 * HV + i_h, mask=m, other=0.0)
    b_gc = tl.cumsum(b_g, 0)  # gamma; masked rows add 0, so the last entry is gamma_last
    g_last = tl.sum(b_g, 0)

    # A^T directly (K K^T is symmetric): At[j, i] = A[i, j] = beta_i kk_ij e^(gamma_i - gamma_j), j < i.
    b_kk = tl.dot(b_k, tl.trans(b_k))
    upper = r[:, None] < r[None, :]
    b_at = tl.where(upper, b_kk * b_beta[None, :] * tl.exp(tl.where(upper, b_gc[None, :] - b_gc[:, None], 0.0)), 0.0)

    # T = (I + A)^-1 by forward substitution: row i = e_i - A[i, :] T (rows above i are final).
    b_t = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in range(1, BT):
        a_i = tl.sum(tl.where(r[None, :] == i, b_at, 0.0), 1)  # a_i[j] = A[i, j]
        row = -tl.sum(a_i[:, None] * b_t, 0)
        b_t = tl.where(r[:, None] == i, row[None, :] + tl.where(r == i, 1.0, 0.0)[None, :], b_t)
    b_t16 = b_t.to(tl.float16)

    tok_k = rows64[:, None] * (HV * K) + i_h * K + ck[None, :]
    tok_v = rows64[:, None] * (HV * V) + i_h * V + cv[None, :]
    e_g = tl.exp(b_gc)
    b_w = tl.dot(b_t16, (b_k.to(tl.float32) * (b_beta * e_g)[:, None]).to(tl.float16)).to(tl.float16)
    tl.store(w + tok_k, b_w, mask=m[:, None])
    b_v = tl.load(v + rows64[:, None] * (HV * V) + i_h * V + cv[None, :], mask=m[:, None], other=0.0)
    b_u = tl.dot(b_t16, (b_v.to(tl.float32) * b_beta[:, None]).to(tl.float16)).to(tl.float16)
    tl.store(u + tok_v, b_u, mask=m[:, None])

    lower = r[:, None] >= r[None, :]
    b_p = tl.dot(b_q, tl.trans(b_k))
    b_p = tl.where(lower, b_p * scale * tl.exp(tl.where(lower, b_gc[:, None] - b_gc[None, :], 0.0)), 0.0)
    b_p16 = b_p.to(tl.float16)
    b_qd = b_q.to(tl.float32) * (scale * e_g)[:, None] - tl.dot(b_p16, b_w)
    tl.store(qd + tok_k, b_qd.to(tl.float16), mask=m[:, None])
    b_oi = tl.dot(b_p16, b_u)
    tl.store(o + tok_v, b_oi.to(o.dtype.element_ty), mask=m[:, None])
    b_kd = b_k.to(tl.float32) * tl.exp(g_last - b_gc)[:, None]
    tl.store(kd + tok_k, b_kd.to(tl.float16), mask=m[:, None])


@triton.jit(do_not_specialize=["T"])
def _state_kernel(
    w, u, qd, kd, g, o,  # from the prep kernel, g [*, HV] fp32, o [*, HV, V] (read, then final)
    h0, ht,  # [N, HV, V, K] fp32 or None
    cu_seqlens,
    T,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = i_nh // HV
    i_h = i_nh % HV
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int32)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int32)
    else:
        bos = i_n * T
        eos = bos + T

    r = tl.arange(0, BT)
    ck = tl.arange(0, K)
    cv = i_v * BV + tl.arange(0, BV)
    # The state is kept transposed, St = S^T [K, BV], so that every product below is a plain dot.
    st_off = i_nh.to(tl.int64) * (V * K) + cv[None, :] * K + ck[:, None]
    if USE_INITIAL_STATE:
        b_st = tl.load(h0 + st_off).to(tl.float32)
    else:
        b_st = tl.zeros([K, BV], dtype=tl.float32)

    for c in range(0, (eos - bos + BT - 1) // BT):
        rows = bos + c * BT + r
        m = rows < eos
        rows64 = rows.to(tl.int64)
        tok_k = rows64[:, None] * (HV * K) + i_h * K + ck[None, :]
        tok_v = rows64[:, None] * (HV * V) + i_h * V + cv[None, :]
        b_st16 = b_st.to(tl.float16)
        b_w = tl.load(w + tok_k, mask=m[:, None], other=0.0)
        b_delta = tl.load(u + tok_v, mask=m[:, None], other=0.0).to(tl.float32) - tl.dot(b_w, b_st16)
        b_qd = tl.load(qd + tok_k, mask=m[:, None], other=0.0)
        b_o = tl.load(o + tok_v, mask=m[:, None], other=0.0).to(tl.float32) + tl.dot(b_qd, b_st16)
        tl.store(o + tok_v, b_o.to(o.dtype.element_ty), mask=m[:, None])
        g_last = tl.sum(tl.load(g + rows64 * HV + i_h, mask=m, other=0.0), 0)
        b_kd = tl.load(kd + tok_k, mask=m[:, None], other=0.0)
        b_st = b_st * tl.exp(g_last) + tl.dot(tl.trans(b_kd), b_delta.to(tl.float16))

    if STORE_FINAL_STATE:
        tl.store(ht + st_off, b_st)


def _alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer the launcher allocates comes from here (tests replace it to poison buffers)."""
    return torch.empty(shape, dtype=dtype, device=device)


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
    prep_cfg, state_cfg = select(K, V, N, HV)
    dev = q.device
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
    if not is_varlen:
        n_chunks = B * triton.cdiv(T, CHUNK)
    elif chunk_indices is not None:
        n_chunks = chunk_indices.shape[0]
    else:
        n_chunks = triton.cdiv(T, CHUNK) + N  # sum(ceil(len_i / BT)) <= T / BT + N
    if n_chunks == 0 or T == 0:
        if final_state is not None:
            final_state.copy_(initial_state if initial_state is not None else torch.zeros_like(final_state))
        return o, final_state
    _prep_kernel[(n_chunks, HV)](
        q, k, v, g, beta, w, u, qd, kd, o, cu_seqlens, chunk_indices, T, N, float(scale),
        H=H, HV=HV, K=K, V=V, BT=CHUNK, IS_VARLEN=is_varlen, HAS_CHUNK_INDICES=chunk_indices is not None,
        USE_L2NORM=bool(use_qk_l2norm_in_kernel), EPS=L2NORM_EPS, num_warps=prep_cfg.num_warps, num_stages=1,
    )
    _state_kernel[(V // state_cfg.block_v, N * HV)](
        w, u, qd, kd, g, o, initial_state, final_state, cu_seqlens, T,
        HV=HV, K=K, V=V, BT=CHUNK, BV=state_cfg.block_v, IS_VARLEN=is_varlen,
        USE_INITIAL_STATE=initial_state is not None, STORE_FINAL_STATE=final_state is not None,
        num_warps=state_cfg.num_warps, num_stages=1,
    )
    return o, final_state
