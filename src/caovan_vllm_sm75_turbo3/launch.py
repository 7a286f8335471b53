"""Gather the launch policy's inputs from this machine, run it, and (when asked) carry it out.

Shared by `caovan-vllm-serve` (cli/serve.py, before it execs vLLM) and by `register()`
(plugin/register.py) in the first vLLM process of a plain `vllm serve`, so both make the
same decisions. Neither a CLI nor a plugin module: both layers call it. With `write=False`
nothing is written anywhere (the `--dry-run` plan); with `write=True` the environment
key's cache directories are created and, in probe mode, FlashInfer's sampler is
test-built once per key and toolchain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, replace
from typing import Any

from .caches.key import env_key
from .caches.layout import KeyDir, checked_root, existing_keys, is_empty, prepare
from .config import Settings, load_settings
from .policy.banner import NOTHING_APPLIED
from .policy.guards import CacheState
from .policy.launch_fill import LaunchFill, fill_launch
from .policy.plan import FilledArg, Plan, make_plan
from .policy.profiles import load_table
from .policy.turbo import decide_turbo
from .policy.vllm_args import LaunchNumbers, VllmArgs, check_launch_args
from .runtime import flashinfer_probe as fp
from .runtime.facts import Facts
from .runtime.model import ModelFacts, model_shape, read_model
from .runtime.probe import load_facts

# Set in the environment vLLM's processes inherit once the guards are applied, so that
# workers log one short line instead of planning again. Not a CAOVAN_* setting.
APPLIED_MARK = "_CAOVAN_APPLIED"


@dataclass(frozen=True)
class Prepared:
    """A plan with the inputs it was made from; `refused_args` is the one-line refusal of the
    user's vLLM arguments (also in `plan.refusal`), None when they passed or were not checked."""

    plan: Plan
    settings: Settings
    facts: Facts
    keydir: KeyDir | None
    refused_args: str | None = None


def _cache_state(keydir: KeyDir) -> CacheState:
    """The key directory as it is now (read-only)."""
    return CacheState(root=str(keydir.root), key=keydir.key.name, path=str(keydir.path),
                      env_dirs={var: str(p) for var, p in keydir.env_dirs().items()},
                      empty=is_empty(keydir),
                      other_keys=tuple(k for k in existing_keys(keydir.root) if k != keydir.key.name))


def plan_launch(env: Mapping[str, str], args: VllmArgs, cli: Mapping[str, Any] | None = None, *,
                write: bool, say: Callable[[str], None] = lambda _: None, fill_args: bool = False,
                facts: Facts | None = None) -> Prepared:
    """Plan a launch for `args` in `env`. Raises CaovanError for bad settings or facts files.

    `cli` holds our own flags' values (setting name -> value, None when not given); `say`
    receives progress lines for slow steps (the sampler test build); `fill_args` checks the
    user's vLLM arguments (check_launch_args, once: a refusal is in the plan and nothing is
    written) and adds the launch profile's (only caovan-vllm-serve does: it builds vLLM's argv;
    a plain `vllm serve` has parsed its arguments itself). `facts`: already read (a vLLM process's
    one context), else read here.
    """
    settings = load_settings(env, args.additional_config, cli)
    facts = facts if facts is not None else load_facts(settings.facts, env)
    keydir = None
    if settings.active and settings.cache_isolation and facts.sm75_count:
        keydir = KeyDir(checked_root(settings.cache_dir, settings.source("cache_dir"), env), env_key(facts))
    # Read the cache before prepare() creates it, so the plan can tell a cold start.
    state = _cache_state(keydir) if keydir else None
    checked = check_launch_args(args, len(facts.gpus)) if fill_args else None
    refused = checked.refusal() if checked else None
    model = read_model(args.model) if args.model and settings.active and not refused else None
    shape = model_shape(model.config) if model else None
    fill = (_profile_fill(facts, settings, args, checked.numbers, model)
            if checked and not refused and settings.active else None)
    filled = [FilledArg(a.flag, a.value, a.reason) for a in fill.args] if fill else []
    plan = _refused(_with_fill(make_plan(facts, settings, env, args, state, filled_args=filled, shape=shape), fill), refused)
    write = write and refused is None
    if plan.status.get("flashinfer_sampler") != "probe-pending":
        if write and keydir and plan.stop_reason() is None:
            prepare(keydir)
        return Prepared(plan, settings, facts, keydir, refused)
    child_env = {**env, **plan.env_updates()}
    fingerprint = fp.toolchain_fingerprint(child_env, facts.toolchain.nvcc_path, facts.versions.nvcc)
    result = fp.read_cached(keydir.path, fingerprint) if keydir else None
    if write and plan.stop_reason() is None:
        if keydir:
            prepare(keydir)
        if result is None:
            say(f"flashinfer_sampler: test-building FlashInfer's sampler (up to {settings.probe_timeout_s} s) ...")
            result = fp.run_probe(child_env, settings.probe_timeout_s, fingerprint)
            if keydir:
                fp.store(keydir.path, result)
    if result is not None:
        plan = _refused(_with_fill(make_plan(facts, settings, env, args, state, result, filled_args=filled, shape=shape), fill),
                        refused)
    return Prepared(plan, settings, facts, keydir, refused)


def _profile_fill(facts: Facts, settings: Settings, args: VllmArgs, numbers: LaunchNumbers,
                  model: ModelFacts | None) -> LaunchFill:
    """The launch profile's decisions for this machine and the model directory in `args` (as read),
    with what could not be read in the model directory as notes."""
    turbo = decide_turbo(facts, settings, facts.versions.triton)  # the user's CAOVAN_TURBO counts here too
    table = load_table()
    if settings.profile not in ("auto", "none"):
        table.by_name(settings.profile, settings.where("profile"))   # an unknown name: named where it was given
    fill = fill_launch(facts, model, settings.profile, args, table, numbers, turbo=turbo)
    return replace(fill, lines=(*fill.lines, *(f"model: {n}" for n in (model.notes if model else ()))))


def _refused(plan: Plan, refused: str | None) -> Plan:
    """The plan with the refusal of the user's arguments first in its refusal."""
    if refused is None:
        return plan
    return replace(plan, refusal=refused + (f". {plan.refusal}" if plan.refusal else ""))


def _with_fill(plan: Plan, fill: LaunchFill | None) -> Plan:
    """The plan with the profile's arithmetic and decisions as notes, and its warnings."""
    if fill is None:
        return plan
    failures = fill.memory.warnings if fill.memory is not None and fill.memory.fits is False else ()
    return replace(plan, notes=(*plan.notes, *fill.lines), warnings=(*plan.warnings, *fill.warnings),
                   failures=(*plan.failures, *failures))


def apply_env(plan: Plan, environ: MutableMapping[str, str], applied_by: str) -> None:
    """Set the plan's variables (never one the user set) and the mark children recognise; the mark
    says when nothing was set, so that no child claims guards it does not have."""
    updates = plan.env_updates()
    environ.update(updates)
    if updates:
        environ[APPLIED_MARK] = applied_by
    else:
        why = ("no SM75 GPU visible" if not plan.sm75_gpus
               else "every variable was the user's or not needed")
        environ[APPLIED_MARK] = f"{applied_by}{NOTHING_APPLIED}{why}"
