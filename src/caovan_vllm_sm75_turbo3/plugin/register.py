"""The vLLM general-plugin entry point. vLLM calls `register()` in every process, maybe often."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("caovan_vllm_sm75_turbo3")

# The one piece of process-global state we allow: has this process registered already.
_REGISTERED = False


def register() -> None:
    """Apply the plugin once per process. Cheap, idempotent, and never raises into vLLM."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    try:
        from ..config import load_settings

        settings = load_settings(os.environ)
        if not settings.active:
            logger.info("Caovan SM75 Turbo3: disabled by settings (enable=%s, mode=%s)",
                        settings.enable, settings.mode)
            return
        logger.info("Caovan SM75 Turbo3 plugin loaded (pid %d)", os.getpid())
    except Exception as err:  # a plugin must not take vLLM down; require-turbo3 is handled by the guards
        logger.warning("Caovan SM75 Turbo3: plugin inactive in this process: %s", err)
