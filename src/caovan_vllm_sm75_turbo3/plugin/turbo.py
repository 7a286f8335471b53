"""Install the Turbo hook in this vLLM process when the policy says so. Never raises into vLLM.

Every process that compiles Triton kernels (engine core, each TP worker) needs its own hook,
so this runs in each one; the hook only touches allowlisted kernels built for sm_75.
"""

from __future__ import annotations

import logging

from .context import ProcessContext

logger = logging.getLogger("caovan_vllm_sm75_turbo3")


def install_turbo(ctx: ProcessContext | None = None) -> str:
    """Install or skip the hook; returns the `turbo=` status value (see policy.turbo). The decision
    is the process context's, the one the GDN gate and the attention backend read too."""
    try:
        # vLLM's spawned workers keep the server's argv, so a `caovan_turbo` additional-config
        # key counts in every process, as CAOVAN_TURBO does. The hook itself acts only on sm_75
        # compile targets, whatever the facts say.
        ctx = ctx or ProcessContext.of_this_process()
        settings, decision = ctx.settings, ctx.turbo
        if decision.install:
            import triton

            from ..kernels.turbo.allowlist import load_allowlist
            from ..kernels.turbo.hook import AllowlistSelector, install

            install(AllowlistSelector(load_allowlist(), triton.__version__, strict=decision.strict))
        # Quiet when all is as expected: each kernel's first turbo build (or fallback) is logged
        # by the hook. Say it only when the user asked for turbo and it is not what they get.
        if settings.turbo == "on" and decision.line != "on":
            logger.warning("Caovan SM75 Turbo3: turbo=%s (%s)", decision.line, decision.reason)
        return decision.line
    except Exception as err:  # the plugin must not take vLLM down: Triton then builds plain
        logger.warning("Caovan SM75 Turbo3: turbo=off-error (hook not installed: %s)", err)
        return "off-error"
