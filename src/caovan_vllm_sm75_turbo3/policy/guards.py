"""The SM75 guards: each is a pure function from the process's decision (facts, settings, the vLLM
release) and the user's environment to
environment changes and a status value. A variable the user already set is never changed:
the change is recorded as "kept" with the user's value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from ..config import ENV_PREFIX
from ..runtime.flashinfer_probe import SamplerProbe
from . import vllm_versions as vv
from .decision import Decision
from .node import MARK_PREFIX

SAMPLER_VAR = "VLLM_USE_FLASHINFER_SAMPLER"
RAY_V2_VAR = "VLLM_USE_RAY_V2_EXECUTOR_BACKEND"
RAY_PREFIXES_VAR = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
RAY_CARRIED = (ENV_PREFIX, MARK_PREFIX)   # our settings, and the first process's mark and plan
ALL_RELEASES = "all"


@dataclass(frozen=True)
class EnvChange:
    """One environment variable the policy decided on.

    `action` is "set" (we set `value`) or "kept" (the user's `value` stays; we would have set
    `ours`). `releases` names the vLLM releases the variable applies to; `switch` is the
    setting that turns the guard off.
    """

    var: str
    value: str
    action: str
    ours: str
    reason: str
    releases: str
    switch: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class GuardResult:
    """What one guard decided: env changes, its status line value (if it has one) and warnings."""

    changes: tuple[EnvChange, ...] = ()
    status: str | None = None
    warnings: tuple[str, ...] = field(default=())


def releases_of(feature: str) -> str:
    """Human text for the vLLM releases a `vllm_versions` feature row covers: "all", "<=0.22", ">=0.26"."""
    row = vv.feature(feature)
    if row.since and row.until:
        return f"{row.since}-{row.until}"
    if row.until:
        return f"<={row.until}"
    if row.since:
        return f">={row.since}"
    return ALL_RELEASES


def decide(env: Mapping[str, str], var: str, ours: str, reason: str, releases: str, switch: str) -> EnvChange:
    """Set `var` to `ours` unless the user's environment already has it (then it is kept)."""
    if var in env:
        return EnvChange(var, env[var], "kept", ours, reason, releases, switch)
    return EnvChange(var, ours, "set", ours, reason, releases, switch)


def sampler_guard(decision: Decision, env: Mapping[str, str], probe: SamplerProbe | None) -> GuardResult:
    """FlashInfer sampler: off on SM75 (its JIT build fails on many toolchains), or, in probe mode,
    on only when a test build in this environment succeeded (`probe`, None if not run yet)."""
    settings, release = decision.settings, decision.release
    switch = "CAOVAN_FLASHINFER_SAMPLER"
    if settings.flashinfer_sampler == "keep":
        return GuardResult(status="kept-user" if SAMPLER_VAR in env else "vllm-default")
    releases = releases_of("env:" + SAMPLER_VAR)
    if SAMPLER_VAR in env:
        return GuardResult((decide(env, SAMPLER_VAR, "0", "the user's value wins", releases, switch),),
                           status="kept-user")
    guard_reason = ("SM75: FlashInfer's sampler is a JIT build that fails under several CUDA 12.9/13 "
                    "toolchains and then takes the engine down; the PyTorch sampler is used instead")
    if settings.flashinfer_sampler == "guard":
        return GuardResult((decide(env, SAMPLER_VAR, "0", guard_reason, releases, switch),),
                           status="disabled-sm75-guard")
    if not release.has("flashinfer-on-sm75"):
        reason = f"vLLM {release.version} refuses FlashInfer below SM80, so there is nothing to probe"
        return GuardResult((decide(env, SAMPLER_VAR, "0", reason, releases, switch),),
                           status="disabled-sm75-guard")
    if probe is None:
        reason = ("probe mode: the launcher test-builds FlashInfer's sampler before vLLM starts; "
                  "off until that build has succeeded")
        return GuardResult((decide(env, SAMPLER_VAR, "0", reason, releases, switch),),
                           status="probe-pending")
    if probe.ok:
        return GuardResult(status="enabled-probe-passed")
    reason = f"probe mode: the test build failed ({probe.reason})"
    return GuardResult((decide(env, SAMPLER_VAR, "0", reason, releases, switch),),
                       status="disabled-probe-failed",
                       warnings=(f"FlashInfer sampler test build failed: {probe.reason}; the sampler stays "
                                 "off (slower decode: docs/design.md#field-reports). "
                                 "Fix the CUDA toolkit (CUDA_HOME) and start again to re-test.",))


def timeout_guard(decision: Decision, env: Mapping[str, str]) -> GuardResult:
    """Cold-start timeouts: the first compile on SM75 takes longer than vLLM's defaults allow."""
    settings = decision.settings
    if not settings.timeout_guard:
        return GuardResult()
    secs = settings.execute_timeout_s
    switch = "CAOVAN_TIMEOUT_GUARD"
    rows = (("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(secs),
             f"multi-process execute_model timeout (vLLM default 300 s) to {secs} s: the first "
             "steps on SM75 compile kernels"),
            ("VLLM_ENGINE_ITERATION_TIMEOUT_S", str(secs),
             f"engine iteration timeout (vLLM default 60 s) to {secs} s for the cold start"),
            ("VLLM_RPC_TIMEOUT", str(secs * 1000),
             f"API server to engine RPC timeout (ms, vLLM default 10 s) to {secs} s for the cold start"))
    changes, warnings = [], []
    for var, value, reason in rows:
        present = decision.release.has("env:" + var)
        if present:
            changes.append(decide(env, var, value, reason, releases_of("env:" + var), switch))
        elif present is None:
            warnings.append(f"{var} not set: the vLLM version is unknown, so we cannot tell whether it exists")
    return GuardResult(tuple(changes), warnings=tuple(warnings))


def arch_guard(decision: Decision, env: Mapping[str, str]) -> GuardResult:
    """Build JIT extensions for the visible GPUs' architectures only (sm_75 on a Turing box)."""
    if not decision.settings.arch_guard:
        return GuardResult()
    archs = sorted({g.compute_capability for g in decision.facts.gpus if g.compute_capability},
                   key=lambda cc: tuple(int(p) for p in cc.split(".")))
    if not archs:
        return GuardResult()
    value = " ".join(archs)
    reason = (f"compile JIT extensions for {value} only: shorter builds, and no failure on "
              "architectures this toolkit lacks")
    return GuardResult(tuple(decide(env, var, value, reason, ALL_RELEASES, "CAOVAN_ARCH_GUARD")
                             for var in ("TORCH_CUDA_ARCH_LIST", "FLASHINFER_CUDA_ARCH_LIST")))


@dataclass(frozen=True)
class CacheState:
    """The isolated JIT cache for this environment key, as read (not written) by the caller."""

    root: str
    key: str
    path: str
    env_dirs: dict[str, str]
    empty: bool
    other_keys: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["other_keys"] = list(self.other_keys)
        return d


def cache_guard(decision: Decision, env: Mapping[str, str], cache: CacheState | None) -> GuardResult:
    """Point every JIT cache at this environment key's own directories."""
    if not decision.settings.cache_isolation or cache is None:
        return GuardResult()
    switch = "CAOVAN_CACHE_ISOLATION"
    changes = []
    for var, path in cache.env_dirs.items():
        reason = "this environment key's own JIT cache (cache_key)"
        if var == "TRITON_CACHE_DIR" and decision.release.has("vllm-overrides-triton-cache-dir"):
            reason += "; vLLM puts torch.compile's Triton kernels under VLLM_CACHE_ROOT itself"
        changes.append(decide(env, var, path, reason, ALL_RELEASES, switch))
    warnings = [f"{c.var} is your own ({c.value}) and stays: that cache is not isolated, so every environment "
                "that uses it (another torch, Triton or vLLM) shares it and may load builds of another stack; "
                f"unset it to give this environment its own ({cache.env_dirs[c.var]})"
                for c in changes if c.action == "kept"]
    if cache.empty and cache.other_keys:
        warnings.append(
            f"the JIT cache for this environment is empty but {len(cache.other_keys)} other environment(s) "
            f"are cached ({', '.join(cache.other_keys[:3])}{', ...' if len(cache.other_keys) > 3 else ''}): "
            "something in the stack changed, so the first start and the first request will compile again. "
            "`caovan-sm75-cache list` shows them; `caovan-sm75-cache clean` removes the stale ones")
    return GuardResult(tuple(changes), warnings=tuple(warnings))


def legacy_ray_chosen(env: Mapping[str, str]) -> bool:
    """True when the user chose vLLM's older Ray executor: VLLM_USE_RAY_V2_EXECUTOR_BACKEND read as vLLM
    reads it (`bool(int(value))`) is false."""
    try:
        return int(env.get(RAY_V2_VAR, "1")) == 0
    except ValueError:   # vLLM itself stops on it; nothing to carry
        return False


def ray_copy_guard(decision: Decision, env: Mapping[str, str]) -> GuardResult:
    """Under vLLM's older Ray executor, carry our settings and the head's plan to the workers of every node.

    That executor copies only VLLM_*, HF_*, NCCL_* and the like, over the workers' own values: without our
    prefixes a worker on another node never sees the head's plan, plans as if it were the head, and keeps the
    head's VLLM_CACHE_ROOT (a path of another machine) as if its user had set it; CAOVAN_* given on the head
    are lost there. RayExecutorV2 (the default) copies the whole environment, so nothing is needed.
    """
    if not legacy_ray_chosen(env) or not decision.release.has("ray-legacy-executor"):
        return GuardResult()
    ours = ",".join(RAY_CARRIED)
    reason = (f"{RAY_V2_VAR}={env[RAY_V2_VAR]} chose vLLM's older Ray executor, which copies only VLLM_*-like "
              f"variables to its workers: {ours} carries our settings and the head's plan to every node, so each "
              "node checks itself against the head and keeps no cache path of the head's machine")
    change = decide(env, RAY_PREFIXES_VAR, ours, reason, releases_of("ray-legacy-executor"),
                    f"your own {RAY_PREFIXES_VAR}")
    theirs = {p.strip() for p in env.get(RAY_PREFIXES_VAR, "").split(",") if p.strip()}
    missing = [p for p in RAY_CARRIED if not any(p.startswith(t) for t in theirs)]
    if change.action == "set" or not missing:
        return GuardResult((change,))
    warning = (f"{RAY_PREFIXES_VAR} is your own ({change.value}) and stays, without {', '.join(missing)}: "
               f"under the older Ray executor ({RAY_V2_VAR}=0) workers on other nodes then miss our settings "
               "and the head's plan, plan as if each were the head and keep the head's VLLM_CACHE_ROOT; add "
               f"{','.join(missing)} to it")
    return GuardResult((change,), warnings=(warning,))
