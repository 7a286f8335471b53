"""Numeric cases for the allowlisted vLLM FLA GDN kernels: fresh random inputs, float64 references.

Each case builds packed variable-length inputs (as vLLM's prefill passes them: one batch row,
`cu_seqlens`, chunk indices), the kernel's argument list in signature order, its grid, the
outputs it writes (poisoned with NaN first) and a float64 reference of what the kernel computes,
written from the kernel's definition (vLLM 0.21 `fla/ops`), chunk by chunk. A launcher (CuPy on
the lent H200, Triton's own on the user's card) runs the kernel; `compare` gives the error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..numerics import rel_error

BT = 64                 # FLA_CHUNK_SIZE
HEADS_K, HEADS_V, HEAD_DIM = 8, 24, 128   # Qwen3.6-27B at tensor parallel 2


@dataclass
class Case:
    """One launch: arguments in signature order, grid, outputs to check and their references."""

    kernel: str
    args: dict[str, Any]               # every parameter by name (tensors, ints, floats, constexprs)
    grid: tuple[int, int, int]
    outputs: dict[str, torch.Tensor]   # written by the kernel (NaN until then)
    reference: Callable[[], dict[str, torch.Tensor]]
    tokens: int
    extra: dict[str, Any] = field(default_factory=dict)
    fill: float = float("nan")   # what the outputs hold before the launch (NaN: any unwritten element shows)
    # An fp32-dot kernel also passes with an error under this (its plain sm_75 build is exact fp32 FMA;
    # turbo's split-fp16 products are ~2^-22 per operand, still far finer than the fp16 the chain ends in).
    error_floor: float = 0.0


@dataclass(frozen=True)
class Packing:
    """Packed sequences: cu_seqlens and the (sequence, chunk) list that vLLM's FLA builds."""

    seqlens: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.seqlens)

    @property
    def bounds(self) -> list[int]:
        out = [0]
        for n in self.seqlens:
            out.append(out[-1] + n)
        return out

    def chunks(self) -> list[tuple[int, int, int, int]]:
        """(sequence, chunk within it, first token, tokens in chunk) for every chunk in order."""
        out, b = [], self.bounds
        for s, n in enumerate(self.seqlens):
            for c in range(math.ceil(n / BT)):
                start = b[s] + c * BT
                out.append((s, c, start, min(BT, b[s + 1] - start)))
        return out


def _chunk_index(packing: Packing, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[NT, BT] token index of each chunk row (clamped) and its validity mask."""
    ch = packing.chunks()
    start = torch.tensor([c[2] for c in ch], device=device)
    length = torch.tensor([c[3] for c in ch], device=device)
    ar = torch.arange(BT, device=device)
    mask = ar[None, :] < length[:, None]
    idx = torch.where(mask, start[:, None] + ar[None, :], torch.zeros_like(start)[:, None])
    return idx, mask


def _gather(x: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rows of x [T, ...] into chunks [NT, BT, ...] as float64, zero outside the sequence."""
    y = x[idx].double()
    return y * mask.view(*mask.shape, *([1] * (y.dim() - 2)))


def _scatter(chunks: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor, tokens: int) -> torch.Tensor:
    out = chunks.new_zeros((tokens, *chunks.shape[2:]))
    out[idx[mask]] = chunks[mask]
    return out


def _inputs(packing: Packing, device: torch.device, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Shared GDN-like inputs: unit-norm keys, gates in (0, 1), chunk-local cumulative log decay."""
    T, Hg, H, K = packing.total, HEADS_K, HEADS_V, HEAD_DIM

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

    k = randn(T, Hg, K)
    k = (k / k.norm(dim=-1, keepdim=True)).half()
    q = (randn(T, Hg, K) / math.sqrt(K) * 4).half()
    beta = torch.rand(T, H, generator=gen, device=device) * 0.9 + 0.05
    decay = -(torch.rand(T, H, generator=gen, device=device) * 0.09 + 0.01)   # log decay per token
    idx, mask = _chunk_index(packing, device)
    g = _scatter(torch.cumsum(decay[idx] * mask[..., None], dim=1), idx, mask, T).float()
    return {"q": q, "k": k, "beta": beta.float(), "g": g}


def _meta(packing: Packing, device: torch.device) -> dict[str, torch.Tensor]:
    ch = packing.chunks()
    per_seq = [math.ceil(n / BT) for n in packing.seqlens]
    offs = [0]
    for n in per_seq:
        offs.append(offs[-1] + n)
    i32 = dict(dtype=torch.int32, device=device)
    return {"cu_seqlens": torch.tensor(packing.bounds, **i32),
            "chunk_indices": torch.tensor([[c[0], c[1]] for c in ch], **i32).flatten(),
            "chunk_offsets": torch.tensor(offs, **i32)}


def _nan(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def recompute_w_u(packing: Packing, device: torch.device, gen: torch.Generator, cfg: dict) -> Case:
    """w = A (k beta e^g), u = A (v beta) per chunk (wy_fast.recompute_w_u_fwd_kernel)."""
    T, Hg, H, K = packing.total, HEADS_K, HEADS_V, HEAD_DIM
    x = _inputs(packing, device, gen)
    m = _meta(packing, device)
    v = torch.randn(T, H, K, generator=gen, device=device).half()
    A = (torch.randn(T, H, BT, generator=gen, device=device) * 0.2).half()
    w, u = _nan(T, H, K, dtype=torch.float16, device=device), _nan(T, H, K, dtype=torch.float16, device=device)
    args = {"k": x["k"], "v": v, "beta": x["beta"], "w": w, "u": u, "A": A, "g": x["g"],
            "cu_seqlens": m["cu_seqlens"], "chunk_indices": m["chunk_indices"], "T": T,
            "H": H, "Hg": Hg, "K": K, "V": K, "BT": BT, "BK": 64, "BV": 64, "IS_VARLEN": True}

    def reference() -> dict[str, torch.Tensor]:
        idx, mask = _chunk_index(packing, device)
        head_k = torch.arange(H, device=device) // (H // Hg)
        kc = _gather(x["k"], idx, mask)[:, :, head_k]                      # [NT, BT, H, K]
        bc, gc = _gather(x["beta"], idx, mask), _gather(x["g"], idx, mask)   # [NT, BT, H]
        Ac = _gather(A, idx, mask)                                          # [NT, BT(row), H, BT(col)]
        vb = _gather(v, idx, mask) * bc[..., None]
        kb = kc * (bc * torch.exp(gc))[..., None]
        uc = torch.einsum("nthj,njhd->nthd", Ac, vb)
        wc = torch.einsum("nthj,njhd->nthd", Ac, kb)
        return {"w": _scatter(wc, idx, mask, T), "u": _scatter(uc, idx, mask, T)}

    return Case("recompute_w_u_fwd_kernel", args, (len(packing.chunks()), H, 1), {"w": w, "u": u},
                reference, T)


def fwd_h(packing: Packing, device: torch.device, gen: torch.Generator, cfg: dict) -> Case:
    """The chunk recurrence of the state (chunk_delta_h...fwd_kernel_h_blockdim64)."""
    T, Hg, H, K = packing.total, HEADS_K, HEADS_V, HEAD_DIM
    N, NT, BV = len(packing.seqlens), len(packing.chunks()), int(cfg["BV"])
    x = _inputs(packing, device, gen)
    m = _meta(packing, device)
    w = (torch.randn(T, H, K, generator=gen, device=device) * 0.05).half()
    u = torch.randn(T, H, K, generator=gen, device=device).half()
    h0 = torch.randn(N, H, K, K, generator=gen, device=device) * 0.1
    h = _nan(NT, H, K, K, dtype=torch.float16, device=device)
    v_new = _nan(T, H, K, dtype=torch.float16, device=device)
    ht = _nan(N, H, K, K, dtype=torch.float32, device=device)
    args = {"k": x["k"], "v": u, "w": w, "v_new": v_new, "g": x["g"], "gk": None, "h": h, "h0": h0, "ht": ht,
            "cu_seqlens": m["cu_seqlens"], "chunk_offsets": m["chunk_offsets"], "T": T,
            "H": H, "Hg": Hg, "K": K, "V": K, "BT": BT, "BV": BV, "USE_G": True, "USE_GK": False,
            "USE_INITIAL_STATE": True, "STORE_FINAL_STATE": True, "SAVE_NEW_VALUE": True, "IS_VARLEN": True}

    def reference() -> dict[str, torch.Tensor]:
        idx, mask = _chunk_index(packing, device)
        head_k = torch.arange(H, device=device) // (H // Hg)
        kc = _gather(x["k"], idx, mask)[:, :, head_k]     # [NT, BT, H, K]
        wc, uc, gc = _gather(w, idx, mask), _gather(u, idx, mask), _gather(x["g"], idx, mask)
        lengths = torch.tensor([c[3] for c in packing.chunks()], device=device)
        g_last = gc[torch.arange(NT, device=device), lengths - 1]          # [NT, H]
        h_ref = torch.zeros(NT, H, K, K, dtype=torch.float64, device=device)
        vn_ref = torch.zeros_like(uc)
        state = h0.double().clone()                                         # [N, H, V, K]
        first = [0]
        for n in packing.seqlens:
            first.append(first[-1] + math.ceil(n / BT))
        steps = max(first[i + 1] - first[i] for i in range(N))
        for c in range(steps):   # chunk c of every sequence that has one, all heads at once
            seqs = [s for s in range(N) if first[s] + c < first[s + 1]]
            ids = torch.tensor([first[s] + c for s in seqs], device=device)
            S = state[seqs]
            h_ref[ids] = S
            vn = uc[ids] - torch.einsum("nthk,nhvk->nthv", wc[ids], S)
            vn_ref[ids] = vn
            gl = g_last[ids]                                                # [n, H]
            vs = vn * torch.exp(gl[:, None, :] - gc[ids])[..., None] * mask[ids][..., None, None]
            state[seqs] = S * torch.exp(gl)[..., None, None] + torch.einsum("nthv,nthk->nhvk", vs, kc[ids])
        return {"h": h_ref, "v_new": _scatter(vn_ref, idx, mask, T), "ht": state}

    return Case("chunk_gated_delta_rule_fwd_kernel_h_blockdim64", args, (K // BV, N * H, 1),
                {"h": h, "v_new": v_new, "ht": ht}, reference, T)


def fwd_o(packing: Packing, device: torch.device, gen: torch.Generator, cfg: dict) -> Case:
    """o = scale (q h^T e^g + tril(q k^T e^{g_t - g_s}) v) per chunk (chunk_o.chunk_fwd_kernel_o)."""
    T, Hg, H, K = packing.total, HEADS_K, HEADS_V, HEAD_DIM
    NT, BV = len(packing.chunks()), int(cfg["BV"])
    x = _inputs(packing, device, gen)
    m = _meta(packing, device)
    v = torch.randn(T, H, K, generator=gen, device=device).half()
    hs = (torch.randn(NT, H, K, K, generator=gen, device=device) * 0.1).half()
    o = _nan(T, H, K, dtype=torch.float16, device=device)
    scale = K ** -0.5
    args = {"q": x["q"], "k": x["k"], "v": v, "h": hs, "g": x["g"], "o": o,
            "cu_seqlens": m["cu_seqlens"], "chunk_indices": m["chunk_indices"], "scale": scale, "T": T,
            "H": H, "Hg": Hg, "K": K, "V": K, "BT": BT, "BK": int(cfg["BK"]), "BV": BV,
            "USE_G": True, "IS_VARLEN": True}

    def reference() -> dict[str, torch.Tensor]:
        idx, mask = _chunk_index(packing, device)
        head_k = torch.arange(H, device=device) // (H // Hg)
        qc = _gather(x["q"], idx, mask)[:, :, head_k]
        kc = _gather(x["k"], idx, mask)[:, :, head_k]
        vc, gc = _gather(v, idx, mask), _gather(x["g"], idx, mask)
        inter = torch.einsum("nthk,nhvk->nthv", qc, hs.double()) * torch.exp(gc)[..., None]
        att = torch.einsum("nthk,nshk->nhts", qc, kc)
        gdiff = gc.permute(0, 2, 1)[:, :, :, None] - gc.permute(0, 2, 1)[:, :, None, :]
        causal = torch.ones(BT, BT, device=device, dtype=torch.bool).tril()
        att = torch.where(causal, att * torch.exp(gdiff), torch.zeros((), dtype=att.dtype, device=device))
        intra = torch.einsum("nhts,nshv->nthv", att, vc)
        return {"o": _scatter((inter + intra) * scale, idx, mask, T)}

    return Case("chunk_fwd_kernel_o", args, (K // BV, NT, H), {"o": o}, reference, T)


FP32_DOT_ERROR_FLOOR = 1e-5   # 20-50x the split's expected error, 30x under a tf32 product's


def _kkt_chunks(packing: Packing, k: torch.Tensor, beta: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """beta_t k_t.k_s exp(g_t - g_s) for s < t inside a chunk, else 0: [NT, BT(t), H, BT(s)] float64."""
    H, Hg = beta.shape[1], k.shape[1]
    idx, mask = _chunk_index(packing, k.device)
    kc = _gather(k, idx, mask)[:, :, torch.arange(H, device=k.device) // (H // Hg)]   # [NT, BT, H, K]
    bc, gc = _gather(beta, idx, mask), _gather(g, idx, mask)                         # [NT, BT, H]
    att = torch.einsum("nthk,nshk->nths", kc, kc) * bc[..., None]
    att = att * torch.exp(gc[:, :, :, None] - gc.permute(0, 2, 1)[:, None, :, :])
    lower = torch.ones(BT, BT, device=k.device, dtype=torch.bool).tril(-1)
    valid = lower[None, :, None, :] & mask[:, :, None, None] & mask[:, None, None, :]
    return torch.where(valid, att, torch.zeros((), dtype=att.dtype, device=k.device))


def kkt(packing: Packing, device: torch.device, gen: torch.Generator, cfg: dict) -> Case:
    """A = beta k k^T e^{g_t - g_s}, strictly lower per chunk, fp32 (chunk_scaled_dot_kkt_fwd_kernel)."""
    T, Hg, H, K = packing.total, HEADS_K, HEADS_V, HEAD_DIM
    x = _inputs(packing, device, gen)
    m = _meta(packing, device)
    A = _nan(T, H, BT, dtype=torch.float32, device=device)
    args = {"k": x["k"], "beta": x["beta"], "g": x["g"], "A": A, "cu_seqlens": m["cu_seqlens"],
            "chunk_indices": m["chunk_indices"], "T": T, "H": H, "Hg": Hg, "K": K, "BT": BT,
            "BK": int(cfg["BK"]), "IS_VARLEN": True, "USE_G": True}

    def reference() -> dict[str, torch.Tensor]:
        idx, mask = _chunk_index(packing, device)
        return {"A": _scatter(_kkt_chunks(packing, x["k"], x["beta"], x["g"]), idx, mask, T)}

    return Case("chunk_scaled_dot_kkt_fwd_kernel", args, (len(packing.chunks()), H, 1), {"A": A}, reference, T,
                error_floor=FP32_DOT_ERROR_FLOOR)


def _solve_tril_case(packing: Packing, device: torch.device, x: dict[str, torch.Tensor]) -> Case:
    """Ai = (I + A)^-1 per chunk, stored fp16 into a zero-filled tensor as vLLM's solve_tril does
    (merge_16x16_to_64x64_inverse_kernel writes the diagonal and lower 16x16 blocks only)."""
    T, H = packing.total, HEADS_V
    m = _meta(packing, device)
    idx, mask = _chunk_index(packing, device)
    A = _scatter(_kkt_chunks(packing, x["k"], x["beta"], x["g"]), idx, mask, T).float()
    Ai = torch.zeros(T, H, BT, dtype=torch.float16, device=device)
    args = {"A": A, "Ai": Ai, "cu_seqlens": m["cu_seqlens"], "chunk_indices": m["chunk_indices"], "T": T,
            "H": H, "BT": BT, "USE_TMA": False, "IS_VARLEN": True, "DOT_PRECISION": "ieee"}

    def reference() -> dict[str, torch.Tensor]:
        Ac = _gather(A, idx, mask).permute(0, 2, 1, 3)                   # [NT, H, BT(t), BT(s)]
        eye = torch.eye(BT, dtype=torch.float64, device=device)
        # rows and columns past a short chunk's end are 0 in A: the inverse is I there, and the
        # kernel stores only the chunk's own rows, so those rows drop out in _scatter.
        inv = torch.linalg.inv(eye + Ac).permute(0, 2, 1, 3)            # [NT, BT, H, BT]
        inv = inv * mask[:, None, None, :]
        return {"Ai": _scatter(inv, idx, mask, T)}

    return Case("merge_16x16_to_64x64_inverse_kernel", args, (len(packing.chunks()), H, 1), {"Ai": Ai},
                reference, T, fill=0.0, extra={"max_abs_A": float(A.abs().max())})


def solve_tril(packing: Packing, device: torch.device, gen: torch.Generator, cfg: dict) -> Case:
    """(I + A)^-1 of the GDN inputs' A (solve_tril.merge_16x16_to_64x64_inverse_kernel)."""
    return _solve_tril_case(packing, device, _inputs(packing, device, gen))


def solve_tril_stress(packing: Packing, device: torch.device, gen: torch.Generator, cfg: dict) -> Case:
    """The same with beta = 1, g = 0 and keys that all lie close to one direction (A near 1 below the
    diagonal): the largest operands the merge's products see, for the split's fp16-range limit."""
    T, Hg, H, K = packing.total, HEADS_K, HEADS_V, HEAD_DIM
    x = _inputs(packing, device, gen)
    base = torch.randn(Hg, K, generator=gen, device=device)
    noise = torch.randn(T, Hg, K, generator=gen, device=device) * base.norm(dim=-1, keepdim=True) / math.sqrt(K)
    k = base[None] + 0.05 * noise
    x["k"] = (k / k.norm(dim=-1, keepdim=True)).half()
    x["beta"] = torch.ones(T, H, device=device)
    x["g"] = torch.zeros(T, H, device=device)
    return _solve_tril_case(packing, device, x)


CASES: dict[str, Callable[[Packing, torch.device, torch.Generator, dict], Case]] = {
    "recompute_w_u": recompute_w_u, "fwd_h": fwd_h, "fwd_o": fwd_o, "kkt": kkt, "solve_tril": solve_tril}
# Extra inputs a case's kernel is also checked on (turbo_numeric.py run, one config, one shape).
STRESS: dict[str, Callable[[Packing, torch.device, torch.Generator, dict], Case]] = {
    "solve_tril": solve_tril_stress}


def launch_args(case: Case, signature: dict[str, str]) -> list[tuple[str, Any]]:
    """(type, value) of each non-constexpr parameter in order, for a driver-level launcher."""
    out = []
    for name, kind in signature.items():
        if kind == "constexpr":
            continue
        out.append((kind, case.args[name]))
    return out


def compare(case: Case, refs: dict[str, torch.Tensor]) -> dict[str, float]:
    """Relative error of each output against its reference (`numerics.rel_error`: inf if broken)."""
    return {name: rel_error(case.outputs[name], refs[name]) for name in case.outputs}


def packings(kind: str) -> Sequence[Packing]:
    """Shapes: 'full' for the H200 benchmark (T 64 to 32768), 'quick' for caovan-sm75-verify."""
    if kind == "quick":
        return (Packing((64,)), Packing((1, 63, 65, 130, 700, 1100)), Packing((4096,)))
    return (Packing((64,)), Packing((1, 63, 64, 65, 500, 1000, 2357)), Packing((2048,) * 4),
            Packing((32768,)))
