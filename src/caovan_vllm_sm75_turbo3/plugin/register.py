"""The vLLM general-plugin entry point. vLLM calls `register()` in every process, maybe often.

The first vLLM process of a launch (the API server, or the one `caovan-vllm-serve` became)
plans with the same policy as the launcher, sets the environment its children inherit and
logs the banner; every later process sees the mark it left and logs one short line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from ..caches.layout import hold_in_use
from ..errors import Turbo3Refused
from ..launch import APPLIED_MARK, apply_env, head_summary, plan_in_process
from ..logformat import disabled_line, expected_to_fail_line, not_applied_line
from ..textsafe import safe
from ..policy.banner import banner_lines, worker_line
from ..policy.plan import Plan
from .attention import install as install_attention
from .cache_hit_fix import install as install_cache_hit_fix
from .context import ProcessContext
from ..runtime.node import node_name, ray_worker_node
from .dispatch import install as install_gdn_dispatch
from .node_check import keep_own_settings, plan_this_node, read_head
from .turbo import install_turbo

logger = logging.getLogger("caovan_vllm_sm75_turbo3")

# The one piece of process-global state we allow: has this process registered already.
_REGISTERED = False


def _show_through_vllm_logging() -> None:
    """vLLM configures only its own `vllm` logger; without a handler of ours, use its handlers."""
    vllm_logger = logging.getLogger("vllm")
    if logger.handlers or not vllm_logger.handlers:
        return
    for handler in vllm_logger.handlers:
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


# Variables torch writes into os.environ when vLLM imports it (its own default), so their
# presence inside a vLLM process does not mean the user chose them.
_WRITTEN_AT_IMPORT = ("TORCHINDUCTOR_CACHE_DIR",)


def user_env(environ: Mapping[str, str], initial: Mapping[str, str] | None) -> dict[str, str]:
    """The environment as the user gave it: `environ` less what a library set at import time.

    `initial` is the environment this process started with (None when unknown: keep all).
    """
    out = dict(environ)
    if initial is not None:
        for var in _WRITTEN_AT_IMPORT:
            if var not in initial:
                out.pop(var, None)
    return out


def _initial_environ() -> dict[str, str] | None:
    """This process's environment at exec time (Linux /proc), or None when unreadable."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def apply_guards(ctx: ProcessContext | None = None) -> Plan | None:
    """Plan and apply the guards in the first process; log one line in the others.

    Returns the plan where one was made. Raises Turbo3Refused only when require-turbo3 is on
    and the accelerated path cannot be active; any other problem is logged, never raised.
    `ctx` is the process's one context (settings, facts), also handed to every installer.
    """
    mark = os.environ.get(APPLIED_MARK)
    if mark:
        _later_process(mark, ctx)
        return None
    try:
        ctx = ctx or ProcessContext.of_this_process()
        settings = ctx.settings
        if not settings.active:
            logger.info(disabled_line(settings.enable, settings.mode))
            return None
        prepared = plan_in_process(user_env(os.environ, _initial_environ()), ctx.args, ctx.decision, write=True)
        plan = prepared.plan
        if plan.refusal is None and prepared.keydir:
            hold_in_use(prepared.keydir)  # held until this process ends: the cleaner sees the server
    except Exception as err:  # a plugin must not take vLLM down
        logger.warning(not_applied_line(os.getpid(), err))
        return None
    logger.info("\n".join(banner_lines(plan)))
    for failure in plan.failures:   # vLLM's own arguments, judged here as the launcher judges them
        logger.warning(safe(expected_to_fail_line(failure)))
    if plan.refusal:
        raise Turbo3Refused(plan.refusal)
    apply_env(plan, os.environ, f"vLLM process pid {os.getpid()}", head_summary(prepared, node_name()))
    return plan


def _later_process(mark: str, ctx: ProcessContext | None) -> None:
    """A process after the first: one short line, or, in a Ray worker of a launch whose head left its
    plan, this node's own plan and check (plugin/node_check.py). Raises only for require-turbo3."""
    ray_node = ray_worker_node()
    head = read_head(os.environ) if ray_node else None
    if head is None:
        logger.info(worker_line(mark, os.getpid()))
        return
    try:
        plan_this_node(ctx or ProcessContext.of_this_process(), head, ray_node, os.environ, _initial_environ())
    except Turbo3Refused:
        raise
    except Exception as err:  # a plugin must not take vLLM down
        logger.warning(not_applied_line(os.getpid(), f"checking this node against the head failed: {err}"))


def register() -> None:
    """Apply the plugin once per process. Cheap, idempotent; raises only for require-turbo3."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    _show_through_vllm_logging()
    if ray_worker_node():
        keep_own_settings(os.environ, _initial_environ())
    ctx = ProcessContext.of_this_process()   # one reading of settings and facts for every decision below
    apply_guards(ctx)
    install_turbo(ctx)   # every process that compiles Triton kernels needs the hook
    install_gdn_dispatch(ctx=ctx)  # our GDN prefill, registered when vLLM imports its GDN layer
    install_attention(ctx=ctx)  # our fp8-KV attention backend (0.24+), registered when vLLM imports its registry
    install_cache_hit_fix(ctx)  # MTP + prefix caching on hybrid models (0.21-0.25), when vLLM imports its coordinator
