"""MTP with prefix caching on hybrid GDN models, vLLM 0.21-0.25: a cache hit the attention layers can serve.

The cause (data/upstream_bugs.json, mtp-prefix-cache-wrong-output): the hybrid cache coordinator
(`HybridKVCacheCoordinator.find_longest_cache_hit`) lets each Eagle/MTP group look one block past
the hit found so far, then drop that block. Every group of a hybrid model counts as an Eagle group
under MTP, the Mamba/GDN finder (`MambaManager.find_longest_cache_hit`) never drops, so the GDN
group's hit can end a block after the attention groups' and the request resumes past a block whose
attention KV was never computed. vLLM 0.26 gives Mamba groups no margin (`drop_eagle_block and
not isinstance(spec, MambaSpec)`); this does the same from outside: inside that loop, with the
Eagle flag set, the Mamba finder searches one block less, which is no further than the hit the
groups before it reached. The flag is `use_eagle` in 0.21 and `drop_eagle_block` in 0.24.

Installed where the decision names the fix (the release data's range), when vLLM imports its
coordinator (the engine core; never the API server), and only where the source still has the
shape it was read from; where upstream's own rule is there already it stays off.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from types import ModuleType
from typing import Any

from ..logformat import cache_fix_line
from .context import ProcessContext
from .dispatch.after_import import call_after_import

logger = logging.getLogger("caovan_vllm_sm75_turbo3")

FIX_ID = "mtp-prefix-cache-wrong-output"
COORDINATOR = "vllm.v1.core.kv_cache_coordinator"
EAGLE_FLAGS = ("use_eagle", "drop_eagle_block")
UPSTREAM_RULE = "not isinstance(spec, MambaSpec)"   # 0.26's line: the fix is vLLM's own there

# Set while the coordinator's hit loop runs: only there does the Eagle flag come with a margin
# (0.24's per-group lookup passes the flag without one).
_IN_HIT_LOOP: contextvars.ContextVar[bool] = contextvars.ContextVar("caovan_in_hit_loop", default=False)


def install(ctx: ProcessContext) -> None:
    """Register the fix for when vLLM imports its cache coordinator, where this process's
    decision names it. Never raises: a fix that cannot be placed is logged and left off."""
    try:
        if FIX_ID not in ctx.decision.fixes:
            return
    except Exception:   # bad settings: apply_guards reported them
        return
    call_after_import(COORDINATOR, _patch)


def mamba_search_limit(max_length: int, block_size: int, eagle: bool, in_hit_loop: bool) -> int:
    """How far the Mamba finder may search: the coordinator's limit less the Eagle margin it added
    (one block, inside the hit loop, with the flag set), never below 0."""
    return max(0, max_length - block_size) if eagle and in_hit_loop else max_length


def _patch(module: ModuleType) -> None:
    from vllm.v1.core import single_type_kv_cache_manager as managers

    coordinator = getattr(module, "HybridKVCacheCoordinator", None)
    mamba = getattr(managers, "MambaManager", None)
    problem = _shape_problem(coordinator, mamba)
    if problem:
        logger.info(cache_fix_line(FIX_ID, f"off: {problem}"))
        return
    flag = next(f for f in EAGLE_FLAGS if f in inspect.signature(mamba.find_longest_cache_hit).parameters)
    coordinator.find_longest_cache_hit = _in_hit_loop(coordinator.find_longest_cache_hit)
    mamba.find_longest_cache_hit = classmethod(_no_margin(mamba.find_longest_cache_hit.__func__, flag))
    logger.info(cache_fix_line(FIX_ID, f"on: Mamba/GDN groups get no Eagle/MTP lookup margin ({flag})"))


def _shape_problem(coordinator: Any, mamba: Any) -> str | None:
    """Why the installed vLLM is not the code this fix was read from (None: it is)."""
    if coordinator is None or mamba is None:
        return "HybridKVCacheCoordinator or MambaManager not found"
    try:
        loop = inspect.getsource(coordinator.find_longest_cache_hit)
        params = inspect.signature(mamba.find_longest_cache_hit).parameters
    except (OSError, TypeError) as err:
        return f"its source cannot be read ({err})"
    if UPSTREAM_RULE in loop:
        return "this vLLM gives Mamba groups no margin itself"
    if "max_length" not in params or not any(f in params for f in EAGLE_FLAGS):
        return "MambaManager.find_longest_cache_hit has not the arguments read in 0.21-0.25"
    if "block_size" not in loop or "_max_length" not in loop:
        return "the coordinator's hit loop is not the one read in 0.21-0.25"
    return None


def _in_hit_loop(fn: Any) -> Any:
    @functools.wraps(fn)
    def find_longest_cache_hit(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _IN_HIT_LOOP.set(True)
        try:
            return fn(self, *args, **kwargs)
        finally:
            _IN_HIT_LOOP.reset(token)
    return find_longest_cache_hit


def _no_margin(fn: Any, flag: str) -> Any:
    @functools.wraps(fn)
    def find_longest_cache_hit(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if "max_length" in kwargs and "kv_cache_spec" in kwargs:   # the coordinator passes keywords
            kwargs["max_length"] = mamba_search_limit(kwargs["max_length"], kwargs["kv_cache_spec"].block_size,
                                                      bool(kwargs.get(flag)), _IN_HIT_LOOP.get())
        return fn(cls, *args, **kwargs)
    return find_longest_cache_hit
