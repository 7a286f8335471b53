"""Where fp8 KV is served on SM75, and whether our attention backend can serve it: the one home of
the attention rule (the process decision, launch profiles, turbo3= and the notes read it). Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import Settings
from ..kernels.attention.configs import FP8_CACHE_DTYPES
from ..runtime.facts import Facts
from . import vllm_versions as vv
from .turbo import ATTENTION_KERNELS, TurboDecision

OUR_BACKEND = "CUSTOM"  # the --attention-backend name our backend registers as (plugin/attention): its one home


# vLLM's own backends that serve fp8 KV on SM75, each with the release feature that lets it.
VLLM_FP8_BACKENDS = {"TRITON_ATTN": "triton-attn-fp8-kv-on-sm75", "FLASHINFER": "flashinfer-on-sm75"}


def vllm_fp8_kv_on_sm75(version: str | vv.Release | None) -> bool:
    """Whether one of this vLLM release's own attention backends serves fp8 KV on SM75."""
    release = vv.release(version)
    return any(release.has(feature) for feature in VLLM_FP8_BACKENDS.values())


def our_backend_problem(version: str | vv.Release | None, turbo: TurboDecision) -> str | None:
    """Why our attention backend cannot serve fp8 KV with this release and Turbo decision (None: it can)."""
    release = vv.release(version)
    if release.family("attn") is None or release.status == "too-new":
        return f"vLLM {release.version} has no attention interface family of ours"
    if not turbo.serves(ATTENTION_KERNELS):
        return turbo.not_served_reason("our attention kernel") + ", so fp8 KV through our backend is not planned"
    return None


def fp8_kv_on_sm75(version: str | vv.Release | None, turbo: TurboDecision | None = None) -> bool:
    """Whether fp8 KV is served on SM75: by vLLM's own backends, or by ours given the Turbo decision."""
    return bool(fp8_kv_backends(version, turbo))


def fp8_kv_backends(version: str | vv.Release | None, turbo: TurboDecision | None = None) -> tuple[str, ...]:
    """The --attention-backend names that serve fp8 KV on SM75 with this release: ours given the Turbo
    decision, then vLLM's own where the release lets them (up to 0.23)."""
    release = vv.release(version)
    ours = (OUR_BACKEND,) if turbo is not None and our_backend_problem(release, turbo) is None else ()
    return ours + tuple(name for name, feature in VLLM_FP8_BACKENDS.items() if release.has(feature))


def backend_serves_fp8_kv(version: str | vv.Release | None, backend: str,
                          turbo: TurboDecision | None = None) -> bool:
    """Whether the attention backend a user named serves fp8 KV on SM75 with this release."""
    return backend.strip().upper() in fp8_kv_backends(version, turbo)


def drafter_backend_needed(version: str | vv.Release | None, kv: str | None) -> str | None:
    """The attention backend a speculative drafter must be named (speculative_config.attention_backend)
    for this KV cache dtype to start on SM75: ours where fp8 KV rests on it, since the drafter never
    takes the target's backend and picks TRITON_ATTN, which refuses fp8 from 0.24. None: its own pick serves."""
    release = vv.release(version)
    if kv not in FP8_CACHE_DTYPES or vllm_fp8_kv_on_sm75(release):
        return None
    return OUR_BACKEND if release.has("drafter-picks-own-attention-backend") else None


@dataclass(frozen=True)
class AttentionState:
    """Our attention backend in this process: whether it is registered (as OUR_BACKEND) when vLLM
    imports its backend registry, and whether its kernel gets tensor cores. `family` is the interface
    family of this release (None: none of ours); `reason` says why it is not registered, when not;
    `fp8_problem` why it cannot serve fp8 KV (our_backend_problem; None: it can)."""

    register: bool
    family: str | None
    tensor_cores: bool
    reason: str
    fp8_problem: str | None = None


def attention_state(facts: Facts, settings: Settings, release: vv.Release, turbo: TurboDecision) -> AttentionState:
    """Whether our attention backend is offered in this process; the registry's own checks (its
    sources and objects) follow in plugin/attention when vLLM imports it."""
    family = release.family("attn")
    cores = turbo.serves(ATTENTION_KERNELS)
    state = _offered(facts, settings, release, family, cores)
    return replace(state, fp8_problem=our_backend_problem(release, turbo))


def _offered(facts: Facts, settings: Settings, release: vv.Release, family: str | None, cores: bool) -> AttentionState:
    if not settings.active or settings.mode == "guards":
        return AttentionState(False, family, cores, f"mode={settings.mode} ({settings.source('mode')}) keeps "
                              "vLLM's own attention backends" if settings.enable else "the plugin is off")
    if not vv.supported(release):
        return AttentionState(False, family, cores, f"vLLM {release.version} is outside the supported releases "
                              f"{vv.SUPPORTED_MIN} to {vv.SUPPORTED_MAX_MINOR}.x")
    if family is None:
        return AttentionState(False, None, cores, f"vLLM {release.version}'s own backends serve fp8 KV on SM75")
    if not facts.sm75_count:
        return AttentionState(False, family, cores, f"no SM75 GPU (sm75=0/{len(facts.gpus)})")
    return AttentionState(True, family, cores, "")
