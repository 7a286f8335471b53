"""What to build for sm_75: one compile spec per pinned attention config, as vLLM's calls specialise it.

The specs feed ahead-of-time builds (the sm_75 fit test, the benchmark's PTX) with the signature
and constants the launcher in kernel.py uses: decode configs with key splits (their partials then
merged), prefill configs in one pass. Pointers and the strides of vLLM's layouts (multiples of
head_dim) are marked 16-divisible, as Triton's JIT specialises them. Importing this module needs
Triton but not torch, so the builds run in a venv with Triton alone.
"""

from __future__ import annotations

from typing import Any

from ..turbo.compile import jit_function
from ..turbo.spec import KernelSpec
from .configs import DECODE, FORMAT_CODE, HEAD_DIMS, PREFILL, PREFILL_PLAIN
from .triton_kernels import _attn_kernel, _merge_kernel

# Qwen3.6-27B at tensor parallel 2: 12 query heads on 2 KV heads per GPU. G only sets index
# arithmetic and which rows are real, so one ratio stands for all.
SPEC_GROUP = 6
SPEC_SPLITS = 16  # a long-context decode's split count (the kernel is the same for every S > 1)
_STRIDES = ("sq_tok", "sq_head", "so_tok", "so_head", "sk_blk", "sk_off", "sk_head", "sv_blk", "sv_off", "sv_head",
            "ks_seq", "ks_head", "vs_seq", "vs_head")


def attention_spec(head_dim: int, kv_format: str, *, decode: bool, num_splits: int, plain: bool = False) -> KernelSpec:
    """The attention kernel at a pinned config, with vLLM's fp8 per-tensor scales for fp8 caches;
    a prefill spec names the plain fallback the launcher uses where its build came out plain."""
    cfg = (DECODE if decode else PREFILL_PLAIN if plain else PREFILL)[(head_dim, kv_format)]
    kv = "*fp16" if kv_format == "fp16" else "*u8"
    fp8 = kv_format != "fp16"
    split = num_splits > 1
    sig = {"q": "*fp16", "k": kv, "v": kv, "out": "*fp16"}
    sig |= {n: "*fp32" if split else "constexpr" for n in ("part_o", "part_m", "part_l")}
    sig |= {"cu_q": "*i32", "seqused_k": "*i32", "block_table": "*i32"}
    sig |= {n: "*fp32" if fp8 else "constexpr" for n in ("k_scale", "v_scale")}
    sig |= {n: "i32" for n in ("num_seqs", "block_size", "bt_stride", "window_left", *_STRIDES)}
    sig |= {"sm_scale": "fp32", "softcap": "fp32"}
    cx: dict[str, Any] = {n: None for n, t in sig.items() if t == "constexpr"}
    cx |= {"G": SPEC_GROUP, "HEAD_DIM": head_dim, "BLOCK_M": cfg.block_m, "BLOCK_Q": cfg.block_m // SPEC_GROUP,
           "TILE_N": cfg.tile_n, "KV_FMT": FORMAT_CODE[kv_format], "NUM_SPLITS": num_splits, "K_SCALED": fp8,
           "V_SCALED": fp8, "USE_SOFTCAP": False, "USE_WINDOW": False}
    sig |= {n: "constexpr" for n in cx}
    divisible = tuple(n for n, t in sig.items() if t.startswith("*")) + _STRIDES
    name = f"attn_d{head_dim}_{kv_format}_{'decode' if decode else 'prefill'}{'_plain' if plain else ''}_s{num_splits}"
    fallback = None
    if not decode and not plain and PREFILL_PLAIN[(head_dim, kv_format)] != cfg:
        fallback = attention_spec(head_dim, kv_format, decode=False, num_splits=num_splits, plain=True)
    return KernelSpec(name, jit_function(_attn_kernel), sig, cx, cfg.num_warps, divisible, maxnreg=cfg.maxnreg,
                      plain_fallback=fallback)


def merge_spec(head_dim: int, num_splits: int = SPEC_SPLITS) -> KernelSpec:
    """The split merge (no products: it needs no tensor cores and builds plain)."""
    sig = {"out": "*fp16", "part_o": "*fp32", "part_m": "*fp32", "part_l": "*fp32", "cu_q": "*i32", "num_seqs": "i32",
           "so_tok": "i32", "so_head": "i32"}
    cx = {"NUM_SPLITS": num_splits, "HEAD_DIM": head_dim}
    sig |= {n: "constexpr" for n in cx}
    divisible = ("out", "part_o", "part_m", "part_l", "cu_q", "so_tok", "so_head")
    return KernelSpec(f"attn_merge_d{head_dim}_s{num_splits}", jit_function(_merge_kernel), sig, cx, 4, divisible)


def pinned_specs() -> list[KernelSpec]:
    """Every pinned attention config: decode with splits and prefill in one pass, per (head dim, format)."""
    return [attention_spec(d, f, decode=decode, num_splits=SPEC_SPLITS if decode else 1)
            for (d, f) in DECODE for decode in (True, False)]


def plain_fallback_specs() -> list[KernelSpec]:
    """The plain prefill fallbacks of the pinned specs (those that differ from their spec)."""
    return [s.plain_fallback for s in pinned_specs() if s.plain_fallback is not None]


def merge_specs() -> list[KernelSpec]:
    """The merge kernel per head dim."""
    return [merge_spec(d) for d in HEAD_DIMS]
