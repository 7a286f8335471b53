"""Our GDN prefill checked through the dispatch path on this machine's card (for `caovan-sm75-verify`).

The same steps as a serving process: `install()`, vLLM imports its GDN module (our replacement is
registered), vLLM's `ChunkGatedDeltaRule()` is built (CustomOp picks our class, which decides).
Then packed batches at Qwen3.6-27B TP2 shapes go through that op and are compared with the
float64 reference and, where vLLM's Triton can run (a CUDA GPU), with vLLM's own FLA kernel
(`forward_native` of the same op). Fresh random inputs each run; outputs poisoned first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ...kernels.numerics import rel_error
from .precompile import SELF_CHECK_RTOL

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


@dataclass(frozen=True)
class PrefillCase:
    """Packed sequence lengths at one head configuration (default: Qwen3.6-27B per GPU at TP2)."""

    lengths: tuple[int, ...]
    key_heads: int = 8
    value_heads: int = 24
    head_dim: int = 128

    @property
    def label(self) -> str:
        return (f"T={sum(self.lengths)} ({len(self.lengths)} seq) H={self.key_heads} "
                f"HV={self.value_heads} D={self.head_dim}")


DEFAULT_CASES = (PrefillCase((1, 64, 67, 300)), PrefillCase((2048,)))


@dataclass(frozen=True)
class PrefillResult:
    """One verify row: `name` is what was checked, `status` PASS/FAIL/SKIP."""

    name: str
    status: str
    detail: str
    rel_err: float | None = None
    ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _inputs(case: PrefillCase, device: Any) -> dict[str, Any]:
    import torch

    T, H, HV, D = sum(case.lengths), case.key_heads, case.value_heads, case.head_dim
    nrm = torch.nn.functional.normalize
    cu = [0]
    for n in case.lengths:
        cu.append(cu[-1] + n)
    return {
        "q": nrm(torch.randn(1, T, H, D), dim=-1).half().to(device),
        "k": nrm(torch.randn(1, T, H, D), dim=-1).half().to(device),
        "v": torch.randn(1, T, HV, D).half().to(device),
        "g": (-torch.nn.functional.softplus(torch.randn(1, T, HV))).to(device),
        "beta": torch.sigmoid(torch.randn(1, T, HV)).to(device),
        "initial_state": (0.1 * torch.randn(len(case.lengths), HV, D, D)).to(device),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32, device=device),
    }


def _timed(fn: Any, device: Any, **kw: Any) -> tuple[Any, float]:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn(**kw)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, (time.perf_counter() - start) * 1e3


def build_op(env: Mapping[str, str] | None = None) -> tuple[Any, PrefillResult]:
    """vLLM's `ChunkGatedDeltaRule()` built through our dispatch, and the row saying what serves it."""
    import importlib

    from . import controller

    dispatch = controller.install(env)
    present = controller.present_families()
    if dispatch is None or len(present) != 1:
        state = controller.current_state()
        return None, PrefillResult("gdn-dispatch", FAIL, state.line() if state else "the plugin is off (CAOVAN_ENABLE/CAOVAN_MODE)")
    module = importlib.import_module(present[0].module)  # our replacement registers now
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        op = module.ChunkGatedDeltaRule()
    state = controller.current_state()
    line = state.line() if state else "no dispatch state"
    dispatched = getattr(op, "_forward_method", None) == getattr(op, "forward_caovan", None)
    return op, PrefillResult("gdn-dispatch", PASS if dispatched else FAIL, line)


def verify_prefill(cases: tuple[PrefillCase, ...] = DEFAULT_CASES, env: Mapping[str, str] | None = None,
                   device: Any = None) -> list[PrefillResult]:
    """The dispatch row, then per case: ours through the op vs float64, and vs vLLM's own kernel."""
    import torch

    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    op, row = build_op(env)
    rows = [row]
    if op is None or row.status != PASS:
        return rows
    from vllm.triton_utils import HAS_TRITON

    from ...kernels.gdn import gated_delta_rule_reference

    for case in cases:
        x = _inputs(case, device)
        T = sum(case.lengths)
        core = torch.full((T, case.value_heads, case.head_dim), math.nan, dtype=torch.float16, device=device)
        kw = dict(x, output_final_state=True, chunk_indices=None, chunk_offsets=None,
                  use_qk_l2norm_in_kernel=False)
        try:
            o, s = op(**kw, core_attn_out=core)  # compiles on the first case
            _, ms = _timed(op, device, **kw)
        except Exception as err:
            rows.append(PrefillResult(f"gdn-prefill {case.label} vs float64", FAIL,
                                      f"our kernel raised {type(err).__name__}: {err}"))
            continue
        with torch.device("cpu"):
            ref_o, ref_s = gated_delta_rule_reference(**{n: t.cpu() for n, t in x.items()}, output_final_state=True)
        err = max(rel_error(core.unsqueeze(0), ref_o), rel_error(s, ref_s))
        rows.append(PrefillResult(f"gdn-prefill {case.label} vs float64", PASS if err <= SELF_CHECK_RTOL else FAIL,
                                  f"relative error {err:.2e} (budget {SELF_CHECK_RTOL:.0e}), ours {ms:.2f} ms",
                                  err, ms))
        if not (HAS_TRITON and device.type == "cuda"):
            rows.append(PrefillResult(f"gdn-prefill {case.label} vs vLLM", SKIP,
                                      "vLLM's Triton kernels cannot run here (no CUDA GPU)"))
            continue
        try:
            theirs_o, theirs_s = op.forward_native(**kw)  # compiles (and autotunes) first
            _, their_ms = _timed(op.forward_native, device, **kw)
        except Exception as err:
            rows.append(PrefillResult(f"gdn-prefill {case.label} vs vLLM", SKIP,
                                      f"vLLM's own kernel raised {type(err).__name__}: {err}"))
            continue
        diff = max(rel_error(o, theirs_o), rel_error(s, theirs_s))
        rows.append(PrefillResult(f"gdn-prefill {case.label} vs vLLM", PASS if diff <= SELF_CHECK_RTOL else FAIL,
                                  f"relative difference {diff:.2e}; ours {ms:.2f} ms, vLLM {their_ms:.2f} ms",
                                  diff, ms))
    return rows
