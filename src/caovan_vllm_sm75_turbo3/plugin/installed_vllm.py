"""The installed vLLM's files, read without importing vLLM (the source checks of plugin/ read them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def vllm_root() -> Path | None:
    """site-packages (the folder holding `vllm/`) of the importable vLLM, without importing it."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def installed_source(path: str) -> str | None:
    """The text of `path` (e.g. `vllm/model_executor/custom_op.py`) in the installed vLLM."""
    root = vllm_root()
    file = root / path if root else None
    return file.read_text(encoding="utf-8") if file and file.is_file() else None
