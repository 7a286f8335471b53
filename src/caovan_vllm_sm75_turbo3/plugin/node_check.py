"""A Ray worker on any node of a launch: plan for this node, check it against the head, say so in one line.

vLLM's Ray workers get the head's environment with `setdefault` (a node's own values win), our plan's
variables and the head's mark among it; under the older executor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0)
only VLLM_*-like variables and the prefixes our plan adds (policy/guards.py `ray_copy_guard`), over the
node's own values, which this module gives back. Without this step a worker on node 2 would keep the head's
JIT cache paths and key, its TORCH_CUDA_ARCH_LIST, and log the head's guards as its own. Here the
worker plans with this node's facts (policy/decision.py, the same code as the head), sets this
node's plan (never a variable this node's user set), removes what the head's plan set and this
node's does not, holds its own cache directory, and logs one line: the node, its
GPUs, `sm75=N/M`, its stack key and cache directory, and whether it matches the head. A node that
differs is a warning with the fix, and stops the worker under require-turbo3.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping

from ..caches.layout import hold_in_use
from ..config import ENV_PREFIX
from ..errors import Turbo3Refused
from ..launch import APPLIED_MARK, plan_in_process
from ..logformat import node_line, own_settings_line
from ..policy.guards import legacy_ray_chosen
from ..policy.node import HEAD_VAR, NodeSummary, check_node, summarise
from ..runtime.node import node_name
from .context import ProcessContext

logger = logging.getLogger("caovan_vllm_sm75_turbo3")


def keep_own_settings(environ: MutableMapping[str, str], initial: Mapping[str, str] | None) -> list[str]:
    """Give back this node's own CAOVAN_* values where the head's were copied over them (vLLM's older Ray
    executor overwrites; RayExecutorV2's setdefault never does), before any setting is read; logs and
    returns the names. Only in a worker of that executor with the head's plan in hand: elsewhere a
    changed value is the process's own doing and stays."""
    if initial is None or HEAD_VAR not in environ or not legacy_ray_chosen(environ):
        return []
    back = sorted(k for k, v in initial.items() if k.startswith(ENV_PREFIX) and k in environ and environ[k] != v)
    for k in back:
        environ[k] = initial[k]
    if back:
        logger.info(own_settings_line(back))
    return back


def inherited(environ: Mapping[str, str], initial: Mapping[str, str] | None, head: NodeSummary) -> set[str]:
    """The head's planned variables whose value here came from the head rather than from this node: absent
    from the environment this process started with (vLLM added them), or holding the head's value over
    this node's own (the older Ray executor overwrites); where the start is unreadable, the head's value."""
    if initial is not None:
        return {v for v, value in head.set.items() if v in environ
                and (v not in initial or environ[v] == value != initial[v])}
    return {v for v, value in head.set.items() if environ.get(v) == value}


def node_env(environ: Mapping[str, str], initial: Mapping[str, str] | None, from_head: set[str]) -> dict[str, str]:
    """The environment as this node's user gave it: this node's own value of what the head planned (none
    where it had none), and without our marks."""
    own = initial or {}
    out = {k: v for k, v in environ.items() if k not in from_head and k not in (APPLIED_MARK, HEAD_VAR)}
    out.update({v: own[v] for v in from_head if v in own})
    return out


def plan_this_node(ctx: ProcessContext, head: NodeSummary, ray_node: str, environ: MutableMapping[str, str],
                   initial: Mapping[str, str] | None) -> str:
    """Re-plan this worker's node, correct the environment it inherited, log the node's line; returns it.
    Raises Turbo3Refused when require-turbo3 is on and this node differs from the head or is refused."""
    from_head = inherited(environ, initial, head)
    mine = node_env(environ, initial, from_head)
    prepared = plan_in_process(mine, ctx.args, ctx.decision, write=True)
    plan = prepared.plan
    ours = plan.env_updates()   # only variables this node's user did not set
    for var in from_head - ours.keys():   # the head's value is a path or a choice of another machine
        if var in mine:
            environ[var] = mine[var]
        else:
            environ.pop(var, None)
    environ.update(ours)
    if prepared.keydir and plan.stop_reason() is None:
        hold_in_use(prepared.keydir)
    here = summarise(node_name(ray_node), ctx.decision.facts, prepared.keydir.key.name if prepared.keydir else None,
                     str(prepared.keydir.path) if prepared.keydir else None, ours)
    settings = ctx.decision.settings
    check = check_node(head, here, settings.require_turbo3, settings.source("require_turbo3"))
    line = node_line(check.line)
    (logger.warning if check.differs else logger.info)(line)
    refusal = check.refusal or plan.refusal
    if refusal:
        raise Turbo3Refused(refusal)
    return line


def read_head(environ: Mapping[str, str]) -> NodeSummary | None:
    """The head's summary in this process's environment (None: none, or not one we can read)."""
    text = environ.get(HEAD_VAR)
    return NodeSummary.from_json(text) if text else None

