"""Whether our accelerated path (the Turing GDN prefill through vLLM's GDN layer) can be active.

One place answers this, for the `gdn_legacy=`, `turbo=` and `turbo3=` status lines and for
require-turbo3. The one rule: our GDN prefill is in charge only where the Turbo hook gives it
tensor cores (without them it runs as a plain fp32-FMA build, far slower than with them and
likely slower than vLLM's own), so `turbo3=active` always means tensor cores. The launcher
predicts it from facts and settings; plugin/dispatch confirms it inside each vLLM process and
logs the final state (`gdn_legacy=<interface family>` when ours is active, `disabled-by-user`
or `upstream`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Settings
from ..runtime.facts import Facts
from . import vllm_versions as vv
from .turbo import GDN_KERNELS, TurboDecision, decide_turbo


@dataclass(frozen=True)
class GdnState:
    """The `gdn_legacy=` value, whether our kernel serves GDN prefill, and why (or why not);
    `turbo` is the Turbo hook's decision for the same facts and settings."""

    line: str
    active: bool
    reasons: tuple[str, ...]
    turbo: TurboDecision


def gdn_state(facts: Facts, settings: Settings) -> GdnState:
    """What serves GDN prefill with these facts and settings."""
    turbo = decide_turbo(facts, settings, facts.versions.triton)
    if settings.gdn_legacy_disable:
        return GdnState("disabled-by-user", False, (
            f"CAOVAN_GDN_LEGACY_DISABLE=1 ({settings.source('gdn_legacy_disable')}) keeps vLLM's own GDN prefill",),
            turbo)
    reasons = []
    if facts.sm75_count == 0:
        reasons.append(f"no SM75 GPU (sm75=0/{len(facts.gpus)})")
    status = vv.support_status(facts.versions.vllm)
    if status in ("unknown", "too-old", "too-new"):
        reasons.append(f"vLLM {facts.versions.vllm or '(not installed)'} is outside the supported "
                       f"releases {vv.SUPPORTED_MIN} to {vv.SUPPORTED_MAX_MINOR}.x")
    elif vv.gdn_family(facts.versions.vllm) is None:
        reasons.append(f"no known GDN interface for vLLM {facts.versions.vllm}")
    if settings.mode == "guards":
        reasons.append(f"mode=guards ({settings.source('mode')}) keeps vLLM's own kernels")
    if not reasons and not turbo.serves(GDN_KERNELS):
        reasons.append(turbo.not_served_reason("our GDN prefill") + ", so vLLM's own stays in charge")
    if reasons:
        return GdnState("upstream", False, tuple(reasons), turbo)
    # The active path is named by its interface family; plugin/dispatch confirms it in each vLLM
    # process (interface checks, precompile, self-check).
    family = vv.gdn_family(facts.versions.vllm)
    return GdnState(family, True, (
        f"{facts.sm75_count} SM75 GPU(s); vLLM {facts.versions.vllm} has GDN interface {family}: "
        "our prefill replaces ChunkGatedDeltaRule",), turbo)
