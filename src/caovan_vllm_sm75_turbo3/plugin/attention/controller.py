"""The process's attention backend: detect the family, check it, register ours as CUSTOM, say so.

`install()` (from `register()`, every vLLM process) reads the process's one decision (no vLLM
import). When vLLM itself imports its backend registry, `attach` follows that decision (SM75, the
plugin's mode, tensor cores), checks the family's sources (interface.py) and the registry's objects, then calls
`register_backend(AttentionBackendEnum.CUSTOM, <our class path>)`; vLLM imports our classes only
if `--attention-backend CUSTOM` selects them. Anything missing: one line, nothing registered (a
launch that asked for CUSTOM then stops in vLLM's selector, naming it). With require-turbo3 a
missing piece raises Turbo3Refused instead, as the GDN dispatch does.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from types import ModuleType

from ...config import Settings
from ...errors import CaovanError, Turbo3Refused
from ...policy import vllm_versions as vv
from ...logformat import ATTENTION_PREFIX, attention_line
from ...policy.attention import OUR_BACKEND
from ..context import ProcessContext
from ..dispatch.after_import import call_after_import
from ..installed_vllm import installed_source
from . import triton_attn_v024
from .interface import AttentionInterface, check_sources

logger = logging.getLogger("caovan_vllm_sm75_turbo3")

FAMILIES: tuple[AttentionInterface, ...] = (triton_attn_v024.INTERFACE,)
BACKEND = OUR_BACKEND  # the AttentionBackendEnum member ours takes: --attention-backend CUSTOM
CLASS_PATH = "caovan_vllm_sm75_turbo3.plugin.attention.backend.CaovanAttentionBackend"
KERNEL = "caovan-paged-attention"


def family_for(version: str | vv.Release | None) -> AttentionInterface | None:
    """The family the release table names for `version` (None: vLLM's own backends serve it)."""
    name = vv.attention_family(version)
    return next((f for f in FAMILIES if f.name == name), None)


def say(status: str, interface: str, why: str) -> str:
    """Log and return the one line: `attention_backend=<status> interface=<family> kernel=... why=...`."""
    kernel = KERNEL if status == BACKEND else "vllm-upstream"
    line = f"attention_backend={status} interface={interface} kernel={kernel} why={why}"
    logger.info(attention_line(line))
    return line


def refuse_if_required(settings: Settings, reason: str) -> None:
    """require-turbo3: our fp8-capable backend is part of the accelerated path on 0.24+."""
    if settings.require_turbo3:
        raise Turbo3Refused(
            f"require-turbo3 ({settings.source('require_turbo3')}) is on, but our attention backend cannot serve "
            f"this process: {reason}. Unset CAOVAN_REQUIRE_TURBO3 / drop caovan_require_turbo3 to start with fp16 "
            "KV on vLLM's TRITON_ATTN.")


def registry_problems(module: ModuleType) -> list[str]:
    """What the imported registry lacks that the source check cannot see."""
    enum = getattr(module, "AttentionBackendEnum", None)
    problems = [] if enum is not None and BACKEND in getattr(enum, "__members__", {}) else [
        f"{module.__name__}.AttentionBackendEnum has no {BACKEND} member"]
    if not callable(getattr(module, "register_backend", None)):
        problems.append(f"{module.__name__} has no register_backend")
    return problems


def attach(iface: AttentionInterface, ctx: ProcessContext, module: ModuleType) -> str:
    """Check and register (vLLM just imported its backend registry). Returns the line logged."""
    decision = ctx.decision
    settings, state = decision.settings, decision.attention
    try:
        if not state.register:
            return say("upstream", iface.name, state.reason)
        problems = list(check_sources(iface, installed_source).problems) or registry_problems(module)
        if problems:
            reason = f"vLLM does not match {iface.name}: " + "; ".join(problems)
            refuse_if_required(settings, reason)
            return say("upstream", iface.name, f"not supported: {reason}")
        enum = module.AttentionBackendEnum
        if enum.CUSTOM.is_overridden() and enum.CUSTOM.get_path() != CLASS_PATH:
            reason = f"{BACKEND} is taken by {enum.CUSTOM.get_path()}"
            refuse_if_required(settings, reason)
            return say("upstream", iface.name, f"not registered: {reason}")
        turbo = decision.turbo
        if not state.tensor_cores:
            refuse_if_required(settings, f"turbo={turbo.line} ({turbo.reason}): our kernel would run on CUDA cores")
        module.register_backend(enum.CUSTOM, CLASS_PATH)
        cores = "tensor cores" if state.tensor_cores else f"CUDA cores (turbo={turbo.line})"
        return say(BACKEND, iface.name, f"{decision.facts.sm75_count} SM75 GPU(s); registered as --attention-backend "
                   f"{BACKEND} (fp8/fp16 KV, our kernel on {cores}, our fp8 cache write)")
    except Turbo3Refused:
        raise
    except Exception as err:  # a plugin must not take vLLM down unless require-turbo3 asks for it
        reason = f"checking raised {type(err).__name__}: {err}"
        refuse_if_required(settings, reason)
        return say("upstream", iface.name, f"not registered: {reason}")


def install(env: Mapping[str, str] | None = None, ctx: ProcessContext | None = None) -> AttentionInterface | None:
    """Arrange registration for when vLLM imports its backend registry; cheap (no vLLM import).
    Returns the family arranged, or None (plugin off, or a release whose own backends serve SM75).
    `ctx` is the process's one context (register() passes it); without it one is read from `env`."""
    ctx = ctx or ProcessContext(os.environ if env is None else env)
    try:
        decision = ctx.decision
    except CaovanError as err:
        logger.warning("%s not registered: %s", ATTENTION_PREFIX, err)
        return None
    if not decision.kernels:
        return None
    if not vv.supported(decision.release):
        say("upstream", "none", f"vLLM {decision.release.version} is outside the supported releases "
            f"{vv.SUPPORTED_MIN} to {vv.SUPPORTED_MAX_MINOR}.x")
        return None
    iface = family_for(decision.release)
    if iface is None:
        return None  # 0.21-0.23: vLLM's own backends serve fp8 KV on SM75
    call_after_import(iface.registry_module, functools.partial(attach, iface, ctx))
    return iface
