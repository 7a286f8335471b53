"""What vLLM itself was given, read in the process that calls our `register()`.

vLLM calls its general plugins from places that already hold the parsed engine settings (read in
0.21.0 and 0.34.0): `EngineArgs.__post_init__` (an `LLM(...)` or any EngineArgs: `self`),
`EngineCore.__init__(vllm_config, ...)` and `WorkerWrapperBase.init_worker` (the local
`vllm_config`). Our `register()` reads `additional_config`, the model and `kv_cache_dtype` from
the first such frame above vLLM's `load_general_plugins`, so `LLM(additional_config=...)` counts
before anything is decided, as `--additional-config` on the command line does. `vllm serve`
loads plugins while it builds its parser, before any of that exists: there the command line
is the source (plugin/context.py).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

# How far above register() vLLM's caller may be: register <- load_general_plugins (<- its loop) <- caller.
MAX_FRAMES = 12


@dataclass(frozen=True)
class VllmSource:
    """The engine settings vLLM holds in this process: `origin` names the object they came from."""

    origin: str                                   # "EngineArgs" or "VllmConfig"
    additional_config: Mapping[str, Any] = field(default_factory=dict)
    model: str | None = None
    kv_cache_dtype: str | None = None
    hf_config: Mapping[str, Any] | None = None   # the model config vLLM loaded (a VllmConfig holds it)


def _from_engine_args(obj: Any) -> VllmSource | None:
    config = getattr(obj, "additional_config", None)
    if not isinstance(config, Mapping) or not hasattr(obj, "kv_cache_dtype"):
        return None
    model, kv = getattr(obj, "model", None), getattr(obj, "kv_cache_dtype", None)
    return VllmSource(type(obj).__name__, dict(config), model if isinstance(model, str) else None,
                      kv if isinstance(kv, str) else None)


def _from_vllm_config(obj: Any) -> VllmSource | None:
    config = getattr(obj, "additional_config", None)
    if not isinstance(config, Mapping) or not hasattr(obj, "model_config"):
        return None
    model = getattr(getattr(obj, "model_config", None), "model", None)
    kv = getattr(getattr(obj, "cache_config", None), "cache_dtype", None)
    return VllmSource("VllmConfig", dict(config), model if isinstance(model, str) else None,
                      kv if isinstance(kv, str) else None, _hf_config(obj))


def _hf_config(obj: Any) -> Mapping[str, Any] | None:
    """The loaded model config as a plain dict (transformers' PretrainedConfig.to_dict), or None."""
    to_dict = getattr(getattr(getattr(obj, "model_config", None), "hf_config", None), "to_dict", None)
    try:
        got = to_dict() if callable(to_dict) else None
    except Exception:   # a config class of its own kind: the shape stays unknown here
        return None
    return got if isinstance(got, dict) else None


def source_in_frames(frame: FrameType | None) -> VllmSource | None:
    """The engine settings held by the first vLLM frame at or above `frame` (None: none there)."""
    for _ in range(MAX_FRAMES):
        if frame is None:
            return None
        if frame.f_globals.get("__name__", "").startswith("vllm."):
            local = frame.f_locals
            found = (_from_vllm_config(local["vllm_config"]) if "vllm_config" in local else None) or (
                _from_engine_args(local["self"]) if "self" in local else None)
            if found is not None:
                return found
        frame = frame.f_back
    return None


def vllm_source() -> VllmSource | None:
    """The engine settings of vLLM's code that called (through its plugin loader) our caller."""
    return source_in_frames(sys._getframe(1))
