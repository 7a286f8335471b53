"""Gather the launch policy's inputs from this machine, run it, and (when asked) carry it out.

Shared by `caovan-vllm-serve` (cli/serve.py, before it execs vLLM) and by `register()`
(plugin/register.py) in the first vLLM process of a plain `vllm serve`, so both make the
same decisions. Neither a CLI nor a plugin module: both layers call it. With `write=False`
nothing is written anywhere (the `--dry-run` plan); with `write=True` the environment
key's cache directories are created and, in probe mode, FlashInfer's sampler is
test-built once per key and toolchain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .caches.key import env_key
from .caches.layout import KeyDir, checked_root, existing_keys, is_empty, prepare
from .config import Settings, load_settings
from .logformat import AppliedMark
from .policy.decision import Decision, decide
from .policy.guards import CacheState
from .policy.fill_base import LaunchFill
from .policy.launch_fill import fill_launch
from .policy.multinode import NodesPlan, plan_nodes
from .policy.node import HEAD_VAR, MARK_PREFIX, NodeSummary
from .policy.plan import Plan, guard_results, make_plan, node_summary, set_vars, would_stop
from .policy.profiles import load_table
from .policy.vllm_args import LaunchNumbers, VllmArgs, check_launch_args, read_vllm_args
from .runtime import flashinfer_probe as fp
from .runtime.config_file import expand_config_file
from .runtime.facts import Facts
from .runtime.model import ModelFacts, model_shape, read_model_arg
from .textsafe import shown
from .runtime.node import node_name
from .runtime.probe import load_facts

# Set in the environment vLLM's processes inherit once the guards are applied, so that
# workers log one short line instead of planning again. Not a CAOVAN_* setting.
APPLIED_MARK = MARK_PREFIX + "APPLIED"


@dataclass(frozen=True)
class Prepared:
    """A plan with the decision it was made from; `refused_args` is the one-line refusal of the
    user's vLLM arguments (also in `plan.refusal`), None when they passed or were not checked."""

    plan: Plan
    decision: Decision
    keydir: KeyDir | None
    refused_args: str | None = None

    @property
    def settings(self) -> Settings:
        return self.decision.settings

    @property
    def facts(self) -> Facts:
        return self.decision.facts


def spans_nodes(args: VllmArgs) -> bool:
    """Whether the launch spans several machines: --nnodes > 1 or vLLM's Ray executor."""
    nnodes = args.value("--nnodes")
    return args.value("--distributed-executor-backend") == "ray" or (
        isinstance(nnodes, str) and nnodes.strip().isdigit() and int(nnodes) > 1)


def read_args(argv: Sequence[str]) -> VllmArgs:
    """The user's `vllm serve` arguments as vLLM reads them: a `--config FILE.yaml` expanded where
    vLLM expands it (runtime/config_file.py). Raises SettingError for a bad file or additional-config."""
    return read_vllm_args(argv, expand_config_file(argv))


def _cache_state(keydir: KeyDir) -> CacheState:
    """The key directory as it is now (read-only)."""
    return CacheState(root=str(keydir.root), key=keydir.key.name, path=str(keydir.path),
                      env_dirs={var: str(p) for var, p in keydir.env_dirs().items()},
                      empty=is_empty(keydir),
                      other_keys=tuple(k for k in existing_keys(keydir.root) if k != keydir.key.name))


def given_kv_cache_dtype(args: VllmArgs) -> str | None:
    """The user's --kv-cache-dtype (None: not given, vLLM's auto)."""
    value = args.value("--kv-cache-dtype")
    return value if isinstance(value, str) else None


def plan_for_launcher(env: Mapping[str, str], args: VllmArgs, cli: Mapping[str, Any] | None = None, *,
                      write: bool, say: Callable[[str], None] = lambda _: None) -> Prepared:
    """caovan-vllm-serve's plan: inputs (settings, facts, the user's vLLM arguments checked once, the
    model read as vLLM finds it) -> the one decision -> the launch profile's fill and the nodes ->
    the sampler probe -> the plan, built once. Raises CaovanError for bad settings or facts files.

    `cli` holds our own flags' values (setting name -> value, None when not given); `say` receives
    progress lines for slow steps (the sampler test build); `write=False` (the dry run) writes nothing.
    A refusal of the user's arguments is in the plan, and then nothing is written."""
    settings, facts = _inputs(env, args, cli)
    checked = check_launch_args(args, len(facts.gpus))
    refused = checked.refusal()
    model = None if refused else _read_model(settings, args, env)
    decision = _decide(settings, facts, args, model)
    fill = _profile_fill(decision, args, checked.numbers, model) if not refused and settings.active else None
    if fill and not args.given("--kv-cache-dtype"):
        decision = decision.with_kv_cache_dtype(next((f.value for f in fill.args if f.flag == "--kv-cache-dtype"), None))
    nodes = None if refused else plan_nodes(args, checked.numbers, len(facts.gpus))
    refused = refused or (nodes.refusal if nodes else None)
    return _prepare(env, args, decision, write, say, fill=fill, nodes=nodes, refused=refused, in_launcher=True)


def plan_in_process(env: Mapping[str, str], args: VllmArgs, decision: Decision, *, write: bool) -> Prepared:
    """A vLLM process's plan from its one decision (its context made it): the sampler probe's cached
    result, then the plan, built once; no profile (vLLM has parsed its arguments itself)."""
    return _prepare(env, args, decision, write, lambda _: None)


def decide_launch(env: Mapping[str, str], args: VllmArgs, cli: Mapping[str, Any] | None = None) -> Decision:
    """The decision these inputs make where no process context made one (the launcher's own steps, without
    its profile): settings, facts, the model read as vLLM finds it. Raises CaovanError as plan_for_launcher."""
    settings, facts = _inputs(env, args, cli)
    return _decide(settings, facts, args, _read_model(settings, args, env))


def _inputs(env: Mapping[str, str], args: VllmArgs, cli: Mapping[str, Any] | None) -> tuple[Settings, Facts]:
    settings = load_settings(env, args.additional_config, cli)
    return settings, load_facts(settings.facts, env)


def _read_model(settings: Settings, args: VllmArgs, env: Mapping[str, str]) -> ModelFacts | None:
    return read_model_arg(args.model, env, *model_lookup(args)) if args.model and settings.active else None


def _decide(settings: Settings, facts: Facts, args: VllmArgs, model: ModelFacts | None) -> Decision:
    return decide(settings, facts, model_shape(model.config) if model else None, given_kv_cache_dtype(args),
                  model_unknown=unread_model(args.model, model))


def _prepare(env: Mapping[str, str], args: VllmArgs, decision: Decision, write: bool, say: Callable[[str], None], *,
             fill: LaunchFill | None = None, nodes: NodesPlan | None = None, refused: str | None = None,
             in_launcher: bool = False) -> Prepared:
    """The cache key's directory as it is, the sampler probe, this node's line, then the plan (once);
    with `write` and a launch that goes ahead, the key's directories are created."""
    settings, facts = decision.settings, decision.facts
    keydir = None
    if settings.active and settings.cache_isolation and facts.sm75_count:
        keydir = KeyDir(checked_root(settings.cache_dir, settings.source("cache_dir"), env), env_key(facts))
    # Read the cache before prepare() creates it, so the plan can tell a cold start.
    state = _cache_state(keydir) if keydir else None
    write = write and refused is None and not would_stop(decision, refused)
    pending = guard_results(decision, env, state)   # without a probe result: probe mode's sampler guard waits
    probe = None
    if pending and pending[0].status == "probe-pending":
        probe = _sampler_probe(env, decision, set_vars(c for r in pending for c in r.changes), keydir, write, say)
    node = node_name() if spans_nodes(args) else None   # each node of a multi-node launch names itself
    plan = make_plan(decision, env, args, state, probe, fill=fill, nodes=nodes, node=node, refused=refused,
                     in_launcher=in_launcher)
    if write and keydir:
        prepare(keydir)
    return Prepared(plan, decision, keydir, refused)


def _sampler_probe(env: Mapping[str, str], decision: Decision, guard_vars: Mapping[str, str], keydir: KeyDir | None,
                   write: bool, say: Callable[[str], None]) -> fp.SamplerProbe | None:
    """Probe mode: FlashInfer's sampler test build for this key and toolchain, cached (None: not run).
    The build's environment is the user's with the guards' variables, as vLLM's will be."""
    facts = decision.facts
    child_env = {**env, **guard_vars}
    fingerprint = fp.toolchain_fingerprint(child_env, facts.toolchain.nvcc_path, facts.versions.nvcc)
    result = fp.read_cached(keydir.path, fingerprint) if keydir else None
    if write and result is None:
        if keydir:
            prepare(keydir)
        timeout = decision.settings.probe_timeout_s
        say(f"flashinfer_sampler: test-building FlashInfer's sampler (up to {timeout} s) ...")
        result = fp.run_probe(child_env, timeout, fingerprint)
        if keydir:
            fp.store(keydir.path, result)
    return result


def model_lookup(args: VllmArgs) -> tuple[str | None, str | None]:
    """The user's --revision and --download-dir: where vLLM would look for the model's files."""
    values = (args.value("--revision"), args.value("--download-dir"))
    return tuple(v if isinstance(v, str) else None for v in values)   # type: ignore[return-value]


def unread_model(name: str | None, model: ModelFacts | None) -> str | None:
    """Why the model's config could not be read here, in words (None: it was)."""
    if model is not None and model.config is not None:
        return None
    if not name:
        return "no model named"
    if model is None or not model.is_dir:   # not found here: the lookup's own words say where it looked
        return f"the model {shown(name, 120)} is {model.found if model else 'not read'}"
    return f"the config.json of {shown(name, 120)} ({model.found}) could not be read"


def _profile_fill(decision: Decision, args: VllmArgs, numbers: LaunchNumbers, model: ModelFacts | None) -> LaunchFill:
    """The launch profile's decisions for this machine and the model directory in `args` (as read),
    with what could not be read in the model directory as notes."""
    settings = decision.settings
    table = load_table()
    if settings.profile not in ("auto", "none"):
        table.by_name(settings.profile, settings.where("profile"))   # an unknown name: named where it was given
    fill = fill_launch(decision, model, args, table, numbers)
    return replace(fill, lines=(*fill.lines, *(f"model: {n}" for n in (model.notes if model else ()))))


def head_summary(prepared: Prepared, node: str) -> NodeSummary:
    """The summary of this (first) process's plan that every other node checks itself against."""
    return node_summary(node, prepared.facts, prepared.plan.cache, prepared.plan.env_updates())


def apply_env(plan: Plan, environ: MutableMapping[str, str], applied_by: str, head: NodeSummary | None = None) -> None:
    """Set the plan's variables (never one the user set) and the mark children recognise; the mark
    says when nothing was set, so that no child claims guards it does not have. `head`: this plan's
    summary, for the workers of other nodes (Ray copies it to them with the rest of the environment)."""
    updates = plan.env_updates()
    environ.update(updates)
    if head is not None:
        environ[HEAD_VAR] = head.to_json()
    why = None if updates else ("no SM75 GPU visible" if not plan.sm75_gpus
                                else "every variable was the user's or not needed")
    environ[APPLIED_MARK] = AppliedMark(applied_by, why).encode()
