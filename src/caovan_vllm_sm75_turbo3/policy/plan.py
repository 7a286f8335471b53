"""The launch plan: one pure function from (facts, settings, the user's env and vLLM args) to
environment changes, the final vLLM argv, status lines, warnings and, when it must, a refusal.

`caovan-vllm-serve` and the in-process `register()` both call `make_plan`, so a plain
`vllm serve` gets the same decisions. `filled_args` is where launch profiles add the vLLM
arguments the user did not give (each with its reason); the argv is the user's, intact,
followed by those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .. import __version__
from ..config import Settings
from ..runtime.flashinfer_probe import SamplerProbe
from .accel import Turbo3
from .checks import CheckResult, Status, rollup, run_checks, sm75_line
from .guards import (CacheState, EnvChange, GuardResult, arch_guard, cache_guard, ray_copy_guard, sampler_guard,
                     timeout_guard)
from .decision import Decision
from .fill_base import FilledArg
from .multinode import NodesPlan
from .vllm_args import VllmArgs

POST_START_WARMUP = "disabled-default"  # never warm up from inside the server: it raced the first compile


@dataclass(frozen=True)
class Plan:
    """Everything a launch decides, before anything is written or started."""

    runtime: Status
    checks: tuple[CheckResult, ...]
    status: dict[str, str]          # the banner's key=value lines, in order
    env: tuple[EnvChange, ...]
    user_argv: tuple[str, ...]
    filled_args: tuple[FilledArg, ...] = ()
    warnings: tuple[str, ...] = ()
    refusal: str | None = None      # why the launch is refused: bad vLLM arguments, require-turbo3
    cache: CacheState | None = None
    active: bool = True
    sampler_probe: SamplerProbe | None = None
    notes: tuple[str, ...] = field(default=())
    sm75_gpus: int = 0              # visible SM75 GPUs: without one, nothing of ours applies
    failures: tuple[str, ...] = ()  # what says vLLM will fail to start (the memory arithmetic); a warning each
    nodes: NodesPlan | None = None  # a launch over several machines: each node's commands


    @property
    def argv(self) -> list[str]:
        """The final command: `vllm serve` with the user's arguments, then the filled ones."""
        out = ["vllm", "serve", *self.user_argv]
        for f in self.filled_args:
            out += f.argv()
        return out

    def stop_reason(self) -> str | None:
        """Why a real launch must not start: FAIL checks, require-turbo3's refusal; None to go.

        Always None when the plugin is off. Without a visible SM75 GPU our checks judge a machine we do
        not act on (a CPU build of vLLM, another GPU): vLLM runs untouched, only a refusal stops it."""
        if not self.active:
            return None
        if not self.sm75_gpus:
            return self.refusal
        failed = [f"{c.name}: {c.detail}" + (f" ({c.remedy})" if c.remedy else "")
                  for c in self.checks if c.status is Status.FAIL]
        reasons = ["runtime=FAIL: " + "; ".join(failed)] if failed else []
        if self.refusal:
            reasons.append(self.refusal)
        return ". ".join(reasons) or None

    def env_updates(self) -> dict[str, str]:
        """The variables to set (kept ones are already in the environment)."""
        return {c.var: c.value for c in self.env if c.action == "set"}

    def to_dict(self) -> dict[str, object]:
        return {
            "plugin_version": __version__, "runtime": self.runtime.value,
            "active": self.active and bool(self.sm75_gpus),   # something of ours applies on this machine
            "enabled": self.active,
            "status": dict(self.status), "refusal": self.refusal,
            "env": [c.to_dict() for c in self.env], "argv": self.argv,
            "filled_args": [{"flag": f.flag, "value": f.value, "reason": f.reason} for f in self.filled_args],
            "warnings": list(self.warnings), "notes": list(self.notes), "failures": list(self.failures),
            "cache": self.cache.to_dict() if self.cache else None,
            "nodes": self.nodes.to_dict() if self.nodes else None,
            "sampler_probe": self.sampler_probe.to_dict() if self.sampler_probe else None,
            "checks": [c.to_dict() for c in self.checks]}


def _turbo3_refusal(settings: Settings, t3: Turbo3) -> str:
    where = settings.source("require_turbo3")
    return (f"require-turbo3 ({where}) is on, but no hot path of this model gets tensor cores: "
            + "; ".join(t3.reasons)
            + ". Start without it (unset CAOVAN_REQUIRE_TURBO3 / drop caovan_require_turbo3) to serve on "
              "vLLM's own kernels with the SM75 guards.")


def _turbo3_notes(decision: Decision, notes: list[str], filled: bool, in_launcher: bool) -> str | None:
    """Add the turbo3= and profile notes (`filled`: a profile filled arguments; `in_launcher`:
    caovan-vllm-serve planned, where profiles fill); return require-turbo3's refusal (None: none)."""
    settings, facts, t3 = decision.settings, decision.facts, decision.turbo3
    refusal = None
    if t3.active:
        notes.append("turbo3=active: " + "; ".join(t3.paths))
    elif t3.pending:
        notes.append(f"gdn_legacy= and turbo3= are decided when vLLM loads the model ({'; '.join(t3.reasons)}): "
                     "the plugin decides in each vLLM process from the model's real config"
                     + (", and require-turbo3 refuses there" if settings.require_turbo3 else ""))
    elif settings.require_turbo3:
        refusal = _turbo3_refusal(settings, t3)
    elif facts.sm75_count and settings.mode == "auto":
        notes.append("turbo3=inactive, serving on vLLM's own kernels with the guards: " + "; ".join(t3.reasons))
    if settings.profile != "none" and not filled and not in_launcher:
        notes.append(f"profile={settings.profile} ({settings.source('profile')}): no vLLM argument filled here "
                     "(launch profiles fill only in caovan-vllm-serve, only what the user did not give)")
    return refusal


def make_plan(decision: Decision, env: Mapping[str, str], args: VllmArgs,
              cache: CacheState | None = None, sampler_probe: SamplerProbe | None = None,
              filled_args: Sequence[FilledArg] = (), in_launcher: bool = False) -> Plan:
    """Plan the launch from the process's one decision. Pure: reads only its arguments, writes nothing.

    `cache` is the environment key's cache directory as read by the caller (None: no isolation);
    `sampler_probe` the FlashInfer test build's result (None: not run); `filled_args` the vLLM
    arguments a launch profile proposes, of which only those the user did not give are used;
    `in_launcher`: caovan-vllm-serve is planning (its profile step ran, filling something or not).
    """
    facts, settings = decision.facts, decision.settings
    checks = tuple(run_checks(facts))
    runtime = rollup(list(checks))
    status = {"runtime": runtime.value, "sm75": sm75_line(facts)}
    warnings = list(settings.warnings)
    notes = list(args.notes)
    if facts.source != "probe":   # what reading the facts file changed (CUDA_VISIBLE_DEVICES)
        notes += [f"facts: {n}" for n in facts.notes]
    common = dict(runtime=runtime, checks=checks, user_argv=args.argv, notes=tuple(notes),
                  sm75_gpus=facts.sm75_count)
    if not settings.active:
        why = (f"enable=0 ({settings.source('enable')})" if not settings.enable
               else f"mode=off ({settings.source('mode')})")
        status.update(mode="off", vllm=facts.versions.vllm or "none")
        return Plan(status=status, env=(), warnings=tuple(warnings), active=False,
                    **{**common, "notes": (*notes, f"the plugin is off ({why}): vLLM runs untouched")})

    gdn, t3 = decision.gdn, decision.turbo3
    results: list[GuardResult] = []
    if facts.sm75_count:
        sampler = sampler_guard(decision, env, sampler_probe)
        results += [sampler, timeout_guard(decision, env), arch_guard(decision, env),
                    cache_guard(decision, env, cache), ray_copy_guard(decision, env)]
        sampler_line = sampler.status or "vllm-default"
    else:
        sampler_line = "not-sm75"
        notes.append("no SM75 GPU visible: nothing of ours applies (no guards, no kernels) and vLLM runs "
                     "untouched; runtime= judges this machine for our plugin, not for vLLM")
    env_changes = tuple(c for r in results for c in r.changes)
    for r in results:
        warnings += r.warnings
    status.update(flashinfer_sampler=sampler_line, post_start_warmup=POST_START_WARMUP,
                  gdn_legacy=gdn.line, turbo=gdn.turbo.line, turbo3=t3.line,
                  mode=settings.mode, vllm=facts.versions.vllm or "none")
    if cache is not None and facts.sm75_count and settings.cache_isolation:
        status["cache_key"] = cache.path

    refusal = _turbo3_notes(decision, notes, bool(filled_args), in_launcher)
    filled = []
    for f in filled_args:
        if args.given(f.flag):
            notes.append(f"{f.flag} kept as given ({args.value(f.flag)}); the profile would use {f.value}")
        else:
            filled.append(f)
    return Plan(status=status, env=env_changes, warnings=tuple(warnings), refusal=refusal, cache=cache,
                sampler_probe=sampler_probe, filled_args=tuple(filled), **{**common, "notes": tuple(notes)})
