"""The oracle: the gated delta rule as a plain float64 token-by-token recurrence.

Same interface and layouts as `chunk_gated_delta_rule` (vLLM 0.21), written for clarity, not
speed. Per value head, with the state S laid out [V, K] and key head `i // (HV // H)`:

    S <- S * exp(g_t)                      # decay (g is in log space)
    S <- S + beta_t * (v_t - S k_t) k_t^T  # delta-rule write
    o_t = scale * S q_t
"""

from __future__ import annotations

import torch

from .configs import L2NORM_EPS


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def gated_delta_rule_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return `(o, final_state)` in float64: o `[B, T, HV, V]`, final_state `[N, HV, V, K]` or None.

    q, k `[B, T, H, K]`; v `[B, T, HV, V]`; g, beta `[B, T, HV]`; initial_state `[N, HV, V, K]`.
    With `cu_seqlens` (B must be 1) the T tokens are N packed sequences; without it each of the
    B rows is one sequence.
    """
    q64, k64, v64 = q.double(), k.double(), v.double()
    g64, b64 = g.double(), beta.double()
    if use_qk_l2norm_in_kernel:
        q64, k64 = _l2norm(q64), _l2norm(k64)
    B, T, H, K = q64.shape
    HV, V = v64.shape[2], v64.shape[3]
    if scale is None:
        scale = K**-0.5
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        bounds = [int(x) for x in cu_seqlens.tolist()]
        spans = [(0, bounds[n], bounds[n + 1]) for n in range(len(bounds) - 1)]
    dev = q.device
    kv_head = torch.arange(HV, device=dev) // (HV // H)  # value head i reads key head i // (HV // H)
    o = torch.zeros(B, T, HV, V, dtype=torch.float64, device=dev)
    final = torch.zeros(len(spans), HV, V, K, dtype=torch.float64, device=dev)
    for n, (b, start, end) in enumerate(spans):
        # All value heads at once; tokens strictly one after another.
        if initial_state is not None:
            s = initial_state[n].double().clone()
        else:
            s = torch.zeros(HV, V, K, dtype=torch.float64, device=dev)
        for t in range(start, end):
            kt, qt = k64[b, t, kv_head], q64[b, t, kv_head]  # [HV, K]
            s = s * torch.exp(g64[b, t])[:, None, None]
            err = v64[b, t] - torch.einsum("hvk,hk->hv", s, kt)
            s = s + b64[b, t][:, None, None] * err[:, :, None] * kt[:, None, :]
            o[b, t] = scale * torch.einsum("hvk,hk->hv", s, qt)
        final[n] = s
    return o, (final if output_final_state else None)
