"""Where a model argument's files are on this machine, found as vLLM finds them, offline.

vLLM takes a local folder, a GGUF file, or a hub id, which it downloads into the Hugging Face cache
(ModelScope's where VLLM_USE_MODELSCOPE is set) and reads from there afterwards. We only look:
never a download, never the network. The Hugging Face cache is the layout huggingface_hub writes
(`<cache>/models--<org>--<name>/refs/<revision>` holds a commit, `snapshots/<commit>/` the files),
in the folder it would use: `--download-dir`, else HF_HUB_CACHE, else HF_HOME/hub, else
XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub (a test holds this equal to
huggingface_hub's own lookup). A revision that is a commit hash names its snapshot directly.
Read-only; never raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class ModelSource:
    """Where a model argument was found: `folder` to read (None: nothing local), and how, in words."""

    name: str
    folder: Path | None
    how: str
    gguf: bool = False


def hf_cache_dir(env: Mapping[str, str], download_dir: str | None = None) -> Path:
    """The Hugging Face hub cache vLLM's download would use."""
    if download_dir:
        return Path(download_dir).expanduser()
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(env[var]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path(env.get("HOME", "~")).expanduser() / ".cache"
    return base / "huggingface" / "hub"


def modelscope_cache_dir(env: Mapping[str, str]) -> Path:
    """ModelScope's cache (MODELSCOPE_CACHE, else ~/.cache/modelscope/hub)."""
    if env.get("MODELSCOPE_CACHE"):
        return Path(env["MODELSCOPE_CACHE"]).expanduser()
    return Path(env.get("HOME", "~")).expanduser() / ".cache" / "modelscope" / "hub"


def _hf_snapshot(cache: Path, repo: str, revision: str | None) -> Path | None:
    root = cache / ("models--" + repo.replace("/", "--"))
    rev = revision or "main"
    try:
        commit = rev if COMMIT.match(rev) else (root / "refs" / rev).read_text().strip()
    except OSError:
        return None
    snap = root / "snapshots" / commit
    return snap if snap.is_dir() else None


def find_model(name: str, env: Mapping[str, str], revision: str | None = None,
               download_dir: str | None = None) -> ModelSource:
    """Where `name` (vLLM's model argument) is on this machine, without downloading anything."""
    p = Path(name).expanduser()
    try:
        if p.is_dir():
            return ModelSource(name, p, "a local folder")
        if p.is_file() and p.suffix.lower() == ".gguf":
            return ModelSource(name, None, "a GGUF file (vLLM reads its metadata; it has no config.json)", gguf=True)
    except OSError:   # a name the system refuses to look up (too long, a loop): read_model says why
        return ModelSource(name, p, "a local path that cannot be checked")
    if not HUB_ID.match(name):
        return ModelSource(name, None, "neither a local folder nor a hub id")
    if env.get("VLLM_USE_MODELSCOPE", "").strip().lower() in TRUE:
        cache = modelscope_cache_dir(env)
        for folder in (cache / "models" / name, cache / name):
            if folder.is_dir():
                return ModelSource(name, folder, f"ModelScope's cache ({folder})")
        return ModelSource(name, None, f"not in ModelScope's cache ({cache}, VLLM_USE_MODELSCOPE set): vLLM "
                           "downloads it at start")
    cache = hf_cache_dir(env, download_dir)
    snap = _hf_snapshot(cache, name, revision)
    if snap is not None:
        return ModelSource(name, snap, f"the Hugging Face cache ({snap})")
    offline = " (HF_HUB_OFFLINE is set: vLLM will not download it either)" if env.get(
        "HF_HUB_OFFLINE", "").strip().lower() in TRUE else ": vLLM downloads it at start"
    return ModelSource(name, None, f"not in the Hugging Face cache ({cache}, revision {revision or 'main'})"
                       + offline)
