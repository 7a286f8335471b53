"""What differs between vLLM releases, in one table. Every version-dependent decision reads it.

Ranges are by release (major.minor), inclusive at both ends; `None` means open.
Sources are docs/design.md's "vLLM facts" (read from each release's source).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from packaging.version import Version

from ..versions import minor, minor_key, parse

REFERENCE = "0.21.0"
SUPPORTED_MIN = "0.21.0"
SUPPORTED_MAX_MINOR = "0.34"   # 0.34.x is the newest release we read
TESTED = ("0.21.0",)           # run end to end in CI; the rest is read from source


@dataclass(frozen=True)
class ReleaseFeature:
    """A fact that holds for vLLM releases `since` ... `until` (inclusive, major.minor)."""

    name: str
    since: str | None
    until: str | None
    why: str


FEATURES: tuple[ReleaseFeature, ...] = (
    ReleaseFeature("env:VLLM_RPC_TIMEOUT", None, "0.22", "RPC timeout (ms) between API server and engine"),
    ReleaseFeature("env:VLLM_ENGINE_ITERATION_TIMEOUT_S", None, "0.31", "engine iteration timeout"),
    ReleaseFeature("env:VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", None, None,
                   "multi-process execute_model timeout (default 300 s, used with TP>1)"),
    ReleaseFeature("env:VLLM_USE_FLASHINFER_SAMPLER", None, None, "FlashInfer top-k/top-p sampler switch"),
    ReleaseFeature("flashinfer-on-sm75", None, "0.23",
                   "FlashInfer attention and sampler still run below SM80 (refused from 0.24)"),
    ReleaseFeature("triton-attn-fp8-kv-on-sm75", None, "0.23",
                   "Triton attention accepts fp8 KV below SM89 (rejected from 0.24)"),
    ReleaseFeature("custom-attention-backend-registry", None, None,
                   "AttentionBackendEnum.CUSTOM and register_backend(backend, class_path) in "
                   "vllm/v1/attention/backends/registry.py (read 0.21.0 to 0.34.0)"),
    ReleaseFeature("vllm-fp8-cache-write-on-sm75", None, "0.23",
                   "TRITON_ATTN's cache write (triton_reshape_and_cache_flash, a Triton kernel) stores fp8 below "
                   "SM89; from 0.24 it asserts has_device_capability(89) for any fp8 cache"),
    ReleaseFeature("drafter-picks-own-attention-backend", None, None,
                   "speculative decoding's drafter never takes --attention-backend: it picks its own unless "
                   "speculative_config.attention_backend names one (_create_draft_vllm_config in "
                   "vllm/v1/spec_decode/llm_base_proposer.py, \"Never inherit the attention backend\", read "
                   "0.21.0, 0.24.0, 0.27.0; 0.34.0's v1/worker/gpu/spec_decode resets it alike). On SM75 from "
                   "0.24 its pick is TRITON_ATTN, which refuses fp8 KV: MTP with fp8 KV stopped at start on "
                   "vLLM 0.24.0 with our backend for the target (benchmarks/results/"
                   "engine_h100_2026-12-07_vllm0.24_fp8_mtp_tritonattn)"),
    ReleaseFeature("triton-attn-cudagraph-always", None, None,
                   "TritonAttentionMetadataBuilder declares AttentionCGSupport.ALWAYS (FULL and PIECEWISE)"),
    ReleaseFeature("attn:triton-attn-v024", "0.24", None,
                   "our attention backend (CUSTOM) subclasses TRITON_ATTN of vllm/v1/attention/backends/"
                   "triton_attn.py: fp8 KV on SM75 with our kernel and cache write"),
    ReleaseFeature("vllm-overrides-triton-cache-dir", None, "0.30",
                   "vLLM sets TRITON_CACHE_DIR inside its own compile cache"),
    ReleaseFeature("gdn:legacy-gdn-linear-attn-v020", None, "0.21",
                   "GDN layer in mamba/gdn_linear_attn.py (GatedDeltaNetAttention)"),
    ReleaseFeature("gdn:modular-qwen-gdn-v022", "0.22", None,
                   "GDN layer in mamba/gdn/qwen_gdn_linear_attn.py (QwenGatedDeltaNetAttention)"),
    ReleaseFeature("fla-ops-in-third-party", "0.26", None,
                   "FLA ops live in vllm.third_party.flash_linear_attention.ops"),
    ReleaseFeature("ray-legacy-executor", None, "0.32",
                   "RayDistributedExecutor (v1/executor/ray_executor.py), chosen with "
                   "VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0 (default 1): copies to its workers only the variables "
                   "ray_env.get_env_vars_to_copy names (VLLM_*, HF_*, NCCL_*, ... and the prefixes in "
                   "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY), overwriting theirs; read in the 0.21.0 to 0.32.0 "
                   "wheels, gone in 0.33.0"),
    ReleaseFeature("arg:--mamba-cache-mode", None, None, "mamba cache mode flag"),
    ReleaseFeature("mamba-align-for-prefix-cache", None, "0.33",
                   "--mamba-cache-mode align is needed for prefix caching on hybrid models"),
    ReleaseFeature("arg-deprecated:--mamba-cache-mode", "0.33", None,
                   "--mamba-cache-mode is deprecated and has no effect (mamba prefix caching follows "
                   "--enable-prefix-caching), read from 0.33.0's arg_utils.py"),
)

PINS_FILE = "vllm_release_pins.json"   # written by tools/release_pins.py from the wheels' metadata


@dataclass(frozen=True)
class ReleasePins:
    """What one vLLM release's Linux wheel pins (Triton through its torch); None: no pin read."""

    vllm: str
    torch: str | None
    triton: str | None       # a version, or `~=X.Y.Z` where torch pins a compatible range
    flashinfer: str | None

    @property
    def triton_version(self) -> str | None:
        """The Triton version this release runs with (the base of a compatible range)."""
        return self.triton.removeprefix("~=") if self.triton else None


def all_release_pins() -> tuple[ReleasePins, ...]:
    """Every supported release's pins, oldest first (the newest patch of each minor)."""
    text = resources.files("caovan_vllm_sm75_turbo3").joinpath("data", PINS_FILE).read_text(encoding="utf-8")
    rows = json.loads(text)["releases"]
    return tuple(ReleasePins(v, r.get("torch"), r.get("triton"), r.get("flashinfer")) for v, r in rows.items())


def release_pins(version: str | None) -> ReleasePins | None:
    """The pins read for this release's minor (None: a minor we have not read)."""
    mm = minor(version)
    return next((p for p in all_release_pins() if minor(p.vllm) == mm), None) if mm else None


# Each row's bounds, parsed once when this module loads (the table is constant).
_BOUNDS: dict[str, tuple[tuple[int, int] | None, tuple[int, int] | None]] = {
    f.name: (minor_key(f.since) if f.since else None, minor_key(f.until) if f.until else None) for f in FEATURES}


@dataclass(frozen=True)
class Release:
    """One vLLM version, parsed once: its (major, minor), its support status and which table rows hold.

    A decision holds one (policy/decision.py), so a process parses its vLLM version once; every
    function below also takes a version string for one-off questions (a log's version, a profile's)."""

    version: str | None
    key: tuple[int, int] | None         # None: absent or unparseable (every feature is then unknown)
    status: str                         # support_status()
    features: frozenset[str]            # the FEATURES rows that hold for this release

    def has(self, name: str) -> bool | None:
        """Whether this release has feature `name`; None when the version is unknown."""
        if name not in _BOUNDS:
            raise KeyError(f"unknown vLLM release feature {name!r}")
        return None if self.key is None else name in self.features

    def family(self, kind: str) -> str | None:
        """The interface family of `kind` ("gdn" or "attn") the table names for this release."""
        return next((f.name.removeprefix(kind + ":") for f in FEATURES
                     if f.name.startswith(kind + ":") and f.name in self.features), None)


def release(version: str | Release | None) -> Release:
    """`version` parsed against the table (a Release is returned as it is)."""
    if isinstance(version, Release):
        return version
    v = parse(version)   # the one parse of this version
    key = (v.release[0], v.release[1]) if v is not None and len(v.release) >= 2 else None
    held = frozenset() if key is None else frozenset(
        name for name, (since, until) in _BOUNDS.items()
        if (since is None or key >= since) and (until is None or key <= until))
    return Release(version, key, _status(v), held)


def has(feature: str, version: str | Release | None) -> bool | None:
    """Whether vLLM `version` has `feature`; None when the version is unknown."""
    return release(version).has(feature)


def feature(name: str) -> ReleaseFeature:
    """The table row for `name`."""
    return next(f for f in FEATURES if f.name == name)


def support_status(version: str | Release | None) -> str:
    """'reference', 'tested', 'supported-untested', 'too-old', 'too-new' or 'unknown'."""
    return version.status if isinstance(version, Release) else _status(parse(version))


def supported(version: str | Release | None) -> bool:
    """Whether `version` is a release we read (known, not too old, not too new)."""
    return support_status(version) not in ("unknown", "too-old", "too-new")


_SUPPORTED_MIN = Version(SUPPORTED_MIN)
_SUPPORTED_MAX = minor_key(SUPPORTED_MAX_MINOR)


def _status(v: Version | None) -> str:
    if v is None:
        return "unknown"
    if v < _SUPPORTED_MIN:
        return "too-old"
    if (v.major, v.minor) > _SUPPORTED_MAX:
        return "too-new"
    if v.base_version == REFERENCE:
        return "reference"
    if v.base_version in TESTED:
        return "tested"
    return "supported-untested"


def attention_family(version: str | Release | None) -> str | None:
    """Our attention backend's interface family for this release (None: vLLM's own serve SM75)."""
    return release(version).family("attn")


def gdn_family(version: str | Release | None) -> str | None:
    """The GDN interface family name we expect for this release (detection confirms it)."""
    return release(version).family("gdn")
