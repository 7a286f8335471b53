"""What serves the model's hot Triton paths on SM75, for the `gdn_legacy=`, `turbo=` and `turbo3=`
status lines and for require-turbo3: one place answers it.

`gdn_legacy=`: our GDN prefill is in charge only where the Turbo hook gives it tensor cores (without
them it runs as a plain fp32-FMA build, far slower than with them and likely slower than vLLM's
own); `no-gdn-layers` for a model without GDN layers. plugin/dispatch confirms it inside each vLLM
process and logs the final state.

`turbo3=active` (README glossary): the hot Triton paths we accelerate for this model get tensor
cores: its GDN prefill (ours, or vLLM's own FLA kernels through the Turbo hook) and its attention
(ours, where it serves fp8 KV on vLLM 0.24+). require-turbo3 refuses only when none does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Settings
from ..logformat import AT_MODEL_LOAD, GDN_DISABLED, GDN_NO_LAYERS, GDN_UPSTREAM
from ..runtime.facts import Facts
from ..runtime.model import ModelShape
from . import vllm_versions as vv
from .attention import AttentionState
from .turbo import GDN_KERNELS, TurboDecision


@dataclass(frozen=True)
class GdnState:
    """The `gdn_legacy=` value, whether our kernel serves GDN prefill, and why (or why not);
    `turbo` is the Turbo hook's decision for the same facts and settings."""

    line: str
    active: bool
    reasons: tuple[str, ...]
    turbo: TurboDecision


def gdn_state(facts: Facts, settings: Settings, release: vv.Release, turbo: TurboDecision,
              shape: ModelShape | None = None) -> GdnState:
    """What serves GDN prefill with these facts, settings, vLLM release and Turbo decision, for the
    model of `shape` (None: not known, judged as the hybrid models we are made for)."""
    if shape is not None and not shape.is_hybrid:
        return GdnState(GDN_NO_LAYERS, False, (
            f"the model ({shape.architecture or shape.model_type or 'config.json'}) has no GDN layers",), turbo)
    if settings.gdn_legacy_disable:
        return GdnState(GDN_DISABLED, False, (
            f"CAOVAN_GDN_LEGACY_DISABLE=1 ({settings.source('gdn_legacy_disable')}) keeps vLLM's own GDN prefill",),
            turbo)
    reasons = []
    if facts.sm75_count == 0:
        reasons.append(f"no SM75 GPU (sm75=0/{len(facts.gpus)})")
    family = release.family("gdn")
    if not vv.supported(release):
        reasons.append(f"vLLM {release.version or '(not installed)'} is outside the supported "
                       f"releases {vv.SUPPORTED_MIN} to {vv.SUPPORTED_MAX_MINOR}.x")
    elif family is None:
        reasons.append(f"no known GDN interface for vLLM {release.version}")
    if settings.mode == "guards":
        reasons.append(f"mode=guards ({settings.source('mode')}) keeps vLLM's own kernels")
    if not reasons and not turbo.serves(GDN_KERNELS):
        reasons.append(turbo.not_served_reason("our GDN prefill") + ", so vLLM's own stays in charge")
    if reasons:
        return GdnState(GDN_UPSTREAM, False, tuple(reasons), turbo)
    # The active path is named by its interface family; plugin/dispatch confirms it in each vLLM
    # process (interface checks, precompile, self-check).
    return GdnState(str(family), True, (
        f"{facts.sm75_count} SM75 GPU(s); vLLM {release.version} has GDN interface {family}: "
        "our prefill replaces ChunkGatedDeltaRule",), turbo)




@dataclass(frozen=True)
class Turbo3:
    """Whether the model's hot Triton paths get tensor cores (`turbo3=active`): which do, or why none.
    `pending`: the model could not be read here, so each vLLM process decides from its real config."""

    active: bool
    paths: tuple[str, ...]      # what gets tensor cores, in words
    reasons: tuple[str, ...]    # why each hot path does not, when none does
    pending: bool = False

    @property
    def line(self) -> str:
        """The `turbo3=` value."""
        return AT_MODEL_LOAD if self.pending else "active" if self.active else "inactive"


def at_model_load(gdn: GdnState, t3: Turbo3, why: str) -> tuple[GdnState, Turbo3]:
    """gdn_legacy= and turbo3= for a model whose config is not readable here (`why`): what hangs on the
    model (our GDN prefill, any accelerated path) is decided when vLLM loads it, so neither line says
    active and require-turbo3 does not refuse here; the user's switch, a missing SM75 GPU or an
    unsupported release stay as they are. Our GDN dispatch stays armed: it attaches only where vLLM
    builds a GDN layer, and logs its own state there."""
    if gdn.active:   # still active: the dispatch attaches only where vLLM builds a GDN layer, and checks there
        gdn = GdnState(AT_MODEL_LOAD, True, (f"{why}: each vLLM process decides from the model's real config",),
                       gdn.turbo)
    if t3.active:
        t3 = Turbo3(False, (), (why,), pending=True)
    return gdn, t3


def turbo3_state(facts: Facts, settings: Settings, gdn: GdnState, attention: AttentionState,
                 shape: ModelShape | None, kv_cache_dtype: str | None) -> Turbo3:
    """The `turbo3=` decision. `kv_cache_dtype` is the launch's --kv-cache-dtype (given or filled)."""
    if not facts.sm75_count or settings.mode != "auto":
        return Turbo3(False, (), gdn.reasons)   # they name the missing GPU, the mode or the user's switch
    turbo, version = gdn.turbo, facts.versions.vllm
    paths: list[str] = []
    reasons: list[str] = []
    if gdn.line == GDN_NO_LAYERS:
        reasons += gdn.reasons
    elif gdn.active:
        paths.append("GDN prefill: ours, on tensor cores")
    elif turbo.serves_vllm_gdn(version):
        paths.append(f"GDN prefill: vLLM {version}'s own FLA kernels on tensor cores through the Turbo hook "
                     f"(gdn_legacy={gdn.line})")
    else:
        reasons.append("GDN prefill: " + "; ".join(gdn.reasons) + "; and vLLM's own: "
                       + turbo.not_served_reason(f"vLLM {version}'s FLA kernels"))
    if (kv_cache_dtype or "").startswith("fp8"):
        problem = attention.fp8_problem
        if problem is None:
            paths.append("attention: ours (fp8 KV on vLLM 0.24+), on tensor cores")
        elif attention.family is not None:
            reasons.append(f"attention: {problem}")
    if not paths and gdn.line == GDN_NO_LAYERS and len(reasons) == 1:
        reasons.append("attention: vLLM's own serves it (nothing of ours for this model's attention)")
    return Turbo3(bool(paths), tuple(paths), tuple(reasons))
