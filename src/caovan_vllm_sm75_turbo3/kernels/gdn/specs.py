"""What to build for sm_75: one compile spec per pinned config and kernel variant.

The specs feed ahead-of-time builds (the sm_75 fit test, the benchmark's PTX, a JIT-cache
warmup) with the exact signatures and constants the launcher in chunk.py uses for vLLM's call:
packed sequences, initial and final state, with and without in-kernel L2 norm. Importing this
module needs Triton but not torch, so the builds run in a venv with Triton alone.
"""

from __future__ import annotations

from ..turbo.compile import jit_function
from ..turbo.spec import KernelSpec
from .configs import CHUNK, L2NORM_EPS, PREP, STATE, StateConfig
from .triton_kernels import _prep_kernel, _state_kernel

# Qwen3.6-27B at tensor parallel 2: 8 key heads, 24 value heads per GPU. H and HV only set
# index arithmetic, so one pair stands for all.
SPEC_HEADS = (8, 24)


def prep_spec(head_k: int, head_v: int, *, l2norm: bool, chunk_indices: bool) -> KernelSpec:
    """The prep kernel for packed sequences, as the launcher calls it."""
    H, HV = SPEC_HEADS
    cfg = PREP[(head_k, head_v)]
    sig = {n: "*fp16" for n in ("q", "k", "v")}
    sig |= {"g": "*fp32", "beta": "*fp32"}
    sig |= {n: "*fp16" for n in ("w", "u", "qd", "kd", "o")}
    sig |= {"cu_seqlens": "*i32", "chunk_indices": "*i32", "T": "i32", "N": "i32", "c_off": "i32",
            "scale": "fp32"}
    cx = {"H": H, "HV": HV, "K": head_k, "V": head_v, "BT": CHUNK, "BK": cfg.block_k, "IS_VARLEN": True,
          "HAS_CHUNK_INDICES": chunk_indices, "USE_L2NORM": l2norm, "EPS": L2NORM_EPS}
    sig |= {n: "constexpr" for n in cx}
    name = f"gdn_prep_k{head_k}_v{head_v}{'_l2' if l2norm else ''}{'_ci' if chunk_indices else ''}"
    return KernelSpec(name, jit_function(_prep_kernel), sig, cx, cfg.num_warps)


def state_spec(head_k: int, head_v: int, cfg: StateConfig) -> KernelSpec:
    """The state kernel in config `cfg` for packed sequences with initial and final state."""
    sig = {n: "*fp16" for n in ("w", "u", "qd", "kd")}
    sig |= {"g": "*fp32", "o": "*fp16", "h0": "*fp32", "ht": "*fp32", "carry": "*fp32", "cu_seqlens": "*i32"}
    sig |= {"T": "i32", "f_lo": "i32", "f_hi": "i32", "f_all": "i32"}
    cx = {"HV": SPEC_HEADS[1], "K": head_k, "V": head_v, "BT": CHUNK, "BV": cfg.block_v, "IS_VARLEN": True,
          "USE_INITIAL_STATE": True, "STORE_FINAL_STATE": True, "EARLY_LOADS": cfg.early_loads}
    sig |= {n: "constexpr" for n in cx}
    name = f"gdn_state_k{head_k}_v{head_v}_bv{cfg.block_v}_w{cfg.num_warps}{'' if cfg.early_loads else '_late'}"
    return KernelSpec(name, jit_function(_state_kernel), sig, cx, cfg.num_warps)


def pinned_specs() -> list[KernelSpec]:
    """Every pinned config: prep in the variants vLLM uses and the heaviest one, and each state config."""
    specs = []
    for head_k, head_v in PREP:
        specs.append(prep_spec(head_k, head_v, l2norm=False, chunk_indices=True))
        specs.append(prep_spec(head_k, head_v, l2norm=True, chunk_indices=False))
    for (head_k, head_v), cfgs in STATE.items():
        specs += [state_spec(head_k, head_v, cfg) for cfg in cfgs]
    return specs
