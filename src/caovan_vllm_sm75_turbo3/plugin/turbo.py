"""Install the Turbo hook in this vLLM process when its decision says so. Never raises into vLLM.

Every process that compiles Triton kernels (engine core, each TP worker) needs its own hook,
so this runs in each one; the hook only touches allowlisted kernels built for sm_75.
"""

from __future__ import annotations

import logging

from ..logformat import turbo_line
from .context import ProcessContext

logger = logging.getLogger("caovan_vllm_sm75_turbo3")


def install_turbo(ctx: ProcessContext | None = None) -> str:
    """Install or skip the hook; returns the `turbo=` status value (see policy.turbo). The decision
    is the process context's, the one the plan, the GDN gate and the attention backend read too."""
    try:
        # Every process reads the same settings sources (plugin/context.py), so a `caovan_turbo`
        # additional-config key counts in every process, as CAOVAN_TURBO does. The hook itself acts
        # only on sm_75 compile targets, whatever the facts say.
        ctx = ctx or ProcessContext.of_this_process()
        decision = ctx.decision
        turbo = decision.turbo
        if turbo.install and turbo.allowlist is not None:
            import triton

            from ..kernels.turbo.hook import AllowlistSelector, install

            install(AllowlistSelector(turbo.allowlist, triton.__version__, strict=turbo.strict))
        # Quiet when all is as expected: each kernel's first turbo build (or fallback) is logged
        # by the hook. Say it only when the user asked for turbo and it is not what they get.
        if decision.settings.turbo == "on" and turbo.line != "on":
            logger.warning(turbo_line(turbo.line, turbo.reason))
        return turbo.line
    except Exception as err:  # the plugin must not take vLLM down: Triton then builds plain
        logger.warning(turbo_line("off-error", f"hook not installed: {err}"))
        return "off-error"
