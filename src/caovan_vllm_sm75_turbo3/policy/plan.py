"""The launch plan: one pure function from the process's decision, the user's env and vLLM args
(and, in caovan-vllm-serve, what its profile filled and its nodes) to environment changes, the
final vLLM argv, status lines, warnings and, when it must, a refusal.

`caovan-vllm-serve` and the in-process `register()` both call `make_plan` (through launch.py), so
a plain `vllm serve` gets the same decisions. A launch's `LaunchFill` is where profiles add the vLLM
arguments the user did not give (each with its reason); the argv is the user's, intact, followed
by those. `guard_results` and `would_stop` answer, before the plan is built, what the FlashInfer
sampler probe needs: the guards' environment and whether the launch stops.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .. import __version__
from ..config import Settings
from ..runtime.facts import Facts
from ..runtime.flashinfer_probe import SamplerProbe
from .accel import Turbo3
from .checks import CheckResult, Status, rollup, run_checks, sm75_line
from .guards import (CacheState, EnvChange, GuardResult, arch_guard, cache_guard, ray_copy_guard, sampler_guard,
                     timeout_guard)
from .decision import Decision
from .drafter import drafter_failure
from .fill_base import FilledArg, LaunchFill
from .multinode import NodesPlan
from .node import NodeSummary, summarise
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
        return _stop_reason(self.active, self.sm75_gpus, self.checks, self.refusal)

    def env_updates(self) -> dict[str, str]:
        """The variables to set (kept ones are already in the environment)."""
        return set_vars(self.env)

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


def _stop_reason(active: bool, sm75_gpus: int, checks: Sequence[CheckResult], refusal: str | None) -> str | None:
    """Plan.stop_reason's rule, for a plan built or about to be (would_stop)."""
    if not active:
        return None
    if not sm75_gpus:
        return refusal
    failed = [f"{c.name}: {c.detail}" + (f" ({c.remedy})" if c.remedy else "")
              for c in checks if c.status is Status.FAIL]
    reasons = ["runtime=FAIL: " + "; ".join(failed)] if failed else []
    if refusal:
        reasons.append(refusal)
    return ". ".join(reasons) or None


def set_vars(changes: Iterable[EnvChange]) -> dict[str, str]:
    """The variables these changes set (kept ones are already in the environment)."""
    return {c.var: c.value for c in changes if c.action == "set"}


def node_summary(node: str, facts: Facts, cache: CacheState | None, updates: Mapping[str, str]) -> NodeSummary:
    """A node's summary of its plan: the facts, its cache key and directory, the variables it sets."""
    return summarise(node, facts, cache.key if cache else None, cache.path if cache else None, updates)


def _node_line(node: str | None, facts: Facts, cache: CacheState | None, changes: Iterable[EnvChange]) -> tuple[str, ...]:
    """This node's summary line where the launch spans several machines (`node` named), else none."""
    return (node_summary(node, facts, cache, set_vars(changes)).line(),) if node is not None else ()


def _turbo3_refuses(decision: Decision) -> bool:
    """require-turbo3 is on and no hot path of the model gets tensor cores (decided here, not at model load)."""
    t3 = decision.turbo3
    return decision.settings.require_turbo3 and not t3.active and not t3.pending


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
    elif _turbo3_refuses(decision):
        refusal = _turbo3_refusal(settings, t3)
    elif facts.sm75_count and settings.mode == "auto":
        notes.append("turbo3=inactive, serving on vLLM's own kernels with the guards: " + "; ".join(t3.reasons))
    if settings.profile != "none" and not filled and not in_launcher:
        notes.append(f"profile={settings.profile} ({settings.source('profile')}): no vLLM argument filled here "
                     "(launch profiles fill only in caovan-vllm-serve, only what the user did not give)")
    return refusal


def guard_results(decision: Decision, env: Mapping[str, str], cache: CacheState | None = None,
                  sampler_probe: SamplerProbe | None = None) -> tuple[GuardResult, ...]:
    """The guards' results for this decision (none when the plugin is off or no SM75 GPU is seen)."""
    if not decision.settings.active or not decision.facts.sm75_count:
        return ()
    return (sampler_guard(decision, env, sampler_probe), timeout_guard(decision, env), arch_guard(decision, env),
            cache_guard(decision, env, cache), ray_copy_guard(decision, env))


def would_stop(decision: Decision, refused: str | None = None) -> bool:
    """Whether the plan of this decision (with `refused`, the user's arguments' refusal) stops a real
    launch, known before the plan is built: Plan.stop_reason's rule on the same checks and refusals."""
    refusal = refused or ("require-turbo3" if _turbo3_refuses(decision) else None)
    return _stop_reason(decision.settings.active, decision.facts.sm75_count, run_checks(decision.facts),
                        refusal) is not None


def _off_because(settings: Settings) -> str:
    return (f"enable=0 ({settings.source('enable')})" if not settings.enable
            else f"mode=off ({settings.source('mode')})")


def _failures(decision: Decision, args: VllmArgs, fill: LaunchFill | None) -> tuple[str, ...]:
    """What says vLLM will fail to start: the profile's step (an upstream bug, a memory plan that does
    not fit), and a drafter that cannot serve the launch's KV dtype (the user's and filled arguments)."""
    drafter = drafter_failure(decision.facts.versions.vllm, args, fill.args if fill else ())
    memory = fill.memory.warnings if fill and fill.memory is not None and fill.memory.fits is False else ()
    return (*(fill.failures if fill else ()), *memory, *((drafter,) if drafter else ()))


def _not_given(proposed: Sequence[FilledArg], args: VllmArgs, notes: list[str]) -> list[FilledArg]:
    """The profile's arguments the user did not give; a note for each one they did."""
    filled = []
    for f in proposed:
        if args.given(f.flag):
            notes.append(f"{f.flag} kept as given ({args.value(f.flag)}); the profile would use {f.value}")
        else:
            filled.append(f)
    return filled


def make_plan(decision: Decision, env: Mapping[str, str], args: VllmArgs,
              cache: CacheState | None = None, sampler_probe: SamplerProbe | None = None, *,
              fill: LaunchFill | None = None, nodes: NodesPlan | None = None, node: str | None = None,
              refused: str | None = None, in_launcher: bool = False) -> Plan:
    """Plan the launch from the process's one decision, once. Pure: reads only its arguments, writes nothing.

    `cache` is the environment key's cache directory as read by the caller (None: no isolation);
    `sampler_probe` the FlashInfer test build's result (None: not run). What caovan-vllm-serve adds
    (`in_launcher`): `fill`, its launch profile's step (the vLLM arguments it proposes, of which only
    those the user did not give are used, its lines, warnings and failures); `nodes`, a launch over
    several machines; `node`, this machine's name where the launch spans several (its summary
    line, from the plan's own variables, goes in the notes); `refused`, the refusal of the user's vLLM
    arguments, which comes first in the plan's refusal.
    """
    facts, settings = decision.facts, decision.settings
    checks = tuple(run_checks(facts))
    runtime = rollup(list(checks))
    status = {"runtime": runtime.value, "sm75": sm75_line(facts)}
    warnings = list(settings.warnings)
    notes = list(args.notes)
    if facts.source != "probe":   # what reading the facts file changed (CUDA_VISIBLE_DEVICES)
        notes += [f"facts: {n}" for n in facts.notes]
    launcher_notes = [*(fill.lines if fill else ()), *(nodes.lines() if nodes else ())]
    common = dict(runtime=runtime, checks=checks, user_argv=args.argv, sm75_gpus=facts.sm75_count, nodes=nodes,
                  failures=_failures(decision, args, fill))

    def refusal_with(own: str | None) -> str | None:
        return own if refused is None else refused + (f". {own}" if own else "")

    if not settings.active:
        status.update(mode="off", vllm=facts.versions.vllm or "none")
        notes.append(f"the plugin is off ({_off_because(settings)}): vLLM runs untouched")
        return Plan(status=status, env=(), warnings=(*warnings, *(fill.warnings if fill else ())), active=False,
                    refusal=refusal_with(None), notes=(*notes, *launcher_notes, *_node_line(node, facts, cache, ())), **common)

    gdn, t3 = decision.gdn, decision.turbo3
    results = guard_results(decision, env, cache, sampler_probe)
    if results:
        sampler_line = results[0].status or "vllm-default"
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

    proposed = fill.args if fill else ()
    refusal = _turbo3_notes(decision, notes, bool(proposed), in_launcher)
    filled = _not_given(proposed, args, notes)
    return Plan(status=status, env=env_changes, warnings=(*warnings, *(fill.warnings if fill else ())),
                refusal=refusal_with(refusal), cache=cache, sampler_probe=sampler_probe, filled_args=tuple(filled),
                notes=(*notes, *launcher_notes, *_node_line(node, facts, cache, env_changes)),
                **common)
