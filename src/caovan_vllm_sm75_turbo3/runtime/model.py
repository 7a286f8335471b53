"""Facts about a model directory: its config.json and checkpoint size on disk. Read-only."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


@dataclass
class ModelFacts:
    """What we could read of a model argument. A hub name (not a directory) has `is_dir` False."""

    path: str
    is_dir: bool = False
    checkpoint_bytes: int | None = None
    config: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def read_model(path: str) -> ModelFacts:
    """Read `path`'s config.json and add up its weight files. Never raises."""
    p = Path(path).expanduser()
    facts = ModelFacts(path=str(p), is_dir=p.is_dir())
    if not facts.is_dir:
        facts.notes.append(f"{path} is not a local directory; its size and config are unknown")
        return facts
    total = 0
    try:
        for f in p.rglob("*"):
            if f.suffix in _WEIGHT_SUFFIXES and f.is_file():
                total += f.stat().st_size
        facts.checkpoint_bytes = total
    except OSError as err:
        facts.notes.append(f"cannot size the checkpoint: {err}")
    cfg = p / "config.json"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
        facts.config = data if isinstance(data, dict) else None
    except FileNotFoundError:
        facts.notes.append("no config.json in the model directory")
    except (OSError, json.JSONDecodeError) as err:
        facts.notes.append(f"config.json unreadable: {err}")
    return facts
