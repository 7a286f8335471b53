"""What JIT caches exist on this machine: our key directories and the shared defaults of a plain vLLM run.

Read-only: walks trees without following symlinks and never opens a file for writing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .key import NAME_RE, EnvKey
from .layout import ENVS, IN_USE_LOCK, MANIFEST, MANIFEST_LOCK, lock_is_held, read_manifest, special_kind, users
from .locations import CACHE_VARIABLES

# kind of an entry
KEY = "key"            # one of our environment key directories (cleanable)
SHARED = "shared"      # a default location a plain vLLM / torch / Triton / CUDA run fills (clean --all, asked separately)
USER_SET = "user-set"  # a cache directory the user chose with an environment variable: listed, never cleaned
UNKNOWN = "unknown"    # something under envs/ that we did not create: listed, never cleaned


# Entries counted per tree before `list` stops and says "at least": bounds its time on a huge cache.
WALK_LIMIT = 200_000
_UNREADABLE_SHOWN = 20


@dataclass
class TreeStats:
    """Size (apparent bytes), entries that are not directories, newest mtime, and unreadable directories.

    `complete` is False when the walk stopped at WALK_LIMIT entries: size and files are then lower bounds.
    """

    size_bytes: int = 0
    files: int = 0
    newest_mtime: float | None = None
    unreadable: list[str] = field(default_factory=list)
    complete: bool = True


def tree_stats(top: Path) -> TreeStats:
    """Walk `top` iteratively (any depth) without following symlinks (a link counts as one file of its
    own size), stopping after WALK_LIMIT entries."""
    stats = TreeStats()
    stack = [str(top)]
    budget = WALK_LIMIT
    while stack and stats.complete:
        d = stack.pop()
        try:
            with os.scandir(d) as it:  # iterated, not listed: a directory of millions stops at the budget
                for e in it:
                    if budget <= 0:
                        stats.complete = False
                        break
                    budget -= 1
                    _count(e, stats, stack)
        except FileNotFoundError:
            continue
        except OSError:  # permissions, or a path longer than PATH_MAX (thousands of levels)
            if len(stats.unreadable) < _UNREADABLE_SHOWN:
                stats.unreadable.append(d)
    return stats


def _count(e: os.DirEntry, stats: TreeStats, stack: list[str]) -> None:
    """Add one entry to `stats`; a directory goes on `stack` (never a link to one)."""
    try:
        st = e.stat(follow_symlinks=False)
    except OSError:
        return  # vanished while we looked
    if e.is_dir(follow_symlinks=False):
        stack.append(e.path)
        return
    stats.files += 1
    stats.size_bytes += st.st_size
    stats.newest_mtime = max(stats.newest_mtime or st.st_mtime, st.st_mtime)


@dataclass
class CacheEntry:
    """One cache directory as `caovan-sm75-cache list` shows it."""

    kind: str
    name: str
    path: Path
    exists: bool
    current: bool  # the environment of these facts writes here
    stats: TreeStats
    resolved: Path | None = None  # where a symlinked path really points
    is_link: bool = False
    last_used: datetime | None = None
    users: list[int] = field(default_factory=list)
    in_use: bool = False
    variable: str = ""
    note: str = ""

    @property
    def status(self) -> str:
        """current or stale for our keys; otherwise the kind (shared, user-set, unknown)."""
        if self.kind == KEY:
            return "current" if self.current else "stale"
        return self.kind

    @property
    def cleaned_by(self) -> str:
        """Which command removes it: "clean", "clean --all" or "never"."""
        if self.kind == KEY:
            return "clean --all" if self.current else "clean"
        return "clean --all" if self.kind == SHARED else "never"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "name": self.name, "path": str(self.path), "exists": self.exists,
            "status": self.status, "cleaned_by": self.cleaned_by, "current": self.current, "is_link": self.is_link,
            "resolved": str(self.resolved) if self.resolved else None,
            "size_bytes": self.stats.size_bytes, "files": self.stats.files,
            "last_used": self.last_used.isoformat(timespec="seconds") if self.last_used else None,
            "complete": self.stats.complete,
            "in_use": self.in_use, "users": list(self.users), "unreadable": list(self.stats.unreadable),
            "variable": self.variable or None, "note": self.note or None}


@dataclass
class Inventory:
    """Everything `list` reports: our root, the current key, and every entry."""

    root: Path
    current: EnvKey
    entries: list[CacheEntry]

    @property
    def total_bytes(self) -> int:
        return sum(e.stats.size_bytes for e in self.entries)

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "current_key": self.current.name,
                "current_components": dict(self.current.components), "total_bytes": self.total_bytes,
                "entries": [e.to_dict() for e in self.entries]}


def _mtime_dt(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, tz=timezone.utc) if ts is not None else None


def _manifest_time(keydir: Path) -> datetime | None:
    m = read_manifest(keydir)
    try:
        t = datetime.fromisoformat(str(m["last_used"])) if m else None
    except (KeyError, ValueError):
        return None
    return t if t is None or t.tzinfo else t.replace(tzinfo=timezone.utc)


def key_entries(root: Path, current: EnvKey) -> list[CacheEntry]:
    """One entry per thing under `root/envs`; only real directories named like a key are KEY entries."""
    envs = root / ENVS
    try:
        with os.scandir(envs) as it:
            found = sorted(it, key=lambda e: e.name)
    except OSError:
        return []
    out = []
    for e in found:
        path = Path(e.path)
        is_link = e.is_symlink()
        named = bool(NAME_RE.match(e.name))
        if is_link:
            target = Path(os.path.realpath(path))
            out.append(CacheEntry(
                KEY if named else UNKNOWN, e.name, path, True, named and e.name == current.name,
                TreeStats(files=1, size_bytes=_lsize(path)), resolved=target, is_link=True,
                note=f"a symlink to {target}; never followed: clean removes the link, not what it points to"))
            continue
        if not (named and e.is_dir(follow_symlinks=False)):
            is_dir = e.is_dir(follow_symlinks=False)
            kind = special_kind(path)
            why = f"{kind}, not a directory" if named and kind else "not named like an environment key"
            out.append(CacheEntry(UNKNOWN, e.name, path, True, False, tree_stats(path) if is_dir
                                  else TreeStats(files=1, size_bytes=_lsize(path)),
                                  note=f"not created by caovan ({why}); never cleaned"))
            continue
        stats = tree_stats(path)
        held = lock_is_held(path)
        entry = CacheEntry(KEY, e.name, path, True, e.name == current.name, stats,
                           last_used=_manifest_time(path) or _mtime_dt(stats.newest_mtime),
                           users=users(path) if held else [], in_use=held)
        entry.note = _key_note(path)
        out.append(entry)
    return out


def _key_note(path: Path) -> str:
    """What is wrong with a key directory's own files: special files are named, never opened."""
    odd = [f"{name} is {kind}" for name in (MANIFEST, IN_USE_LOCK, MANIFEST_LOCK)
           if (kind := special_kind(path / name))]
    if not odd and read_manifest(path) is None:
        return "no readable manifest.json"
    return "; ".join(o + " (not opened; clean removes it with the key)" for o in odd)


def _lsize(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _dir_entry(kind: str, name: str, path: Path, current: bool, variable: str, note: str = "") -> CacheEntry:
    is_link = path.is_symlink()
    exists = path.is_dir()
    real = Path(os.path.realpath(path))
    resolved = real if is_link or real != path else None  # a link on the path, or in a parent
    stats = tree_stats(resolved or path) if exists else TreeStats()
    return CacheEntry(kind, name, path, exists, current, stats, resolved=resolved, is_link=is_link,
                      last_used=_mtime_dt(stats.newest_mtime), variable=variable, note=note)


def shared_entries(env: Mapping[str, str], isolation: bool, own_root: Path) -> list[CacheEntry]:
    """The shared defaults (always listed, existing or not) and the directories the user set.

    `current`: a user-set directory is what this environment writes to (the launcher keeps the
    user's variable); a shared default is only when cache isolation is off.
    """
    out = []
    own = os.path.realpath(own_root)
    for d in CACHE_VARIABLES:
        out.append(_dir_entry(SHARED, d.name, d.default(env), isolation is False and not env.get(d.variable),
                              d.variable))
        value = env.get(d.variable)
        if value:
            path = Path(value) / d.below_variable if d.below_variable else Path(value)
            if os.path.realpath(path) == own or os.path.realpath(path).startswith(own + os.sep):
                continue  # the variable points into our own store (a shell that sourced the launcher's env)
            out.append(_dir_entry(USER_SET, d.name, path, True, d.variable,
                                  note=f"set by you in {d.variable}; never cleaned by caovan-sm75-cache"))
    return out


def inventory(root: Path, current: EnvKey, env: Mapping[str, str], isolation: bool = True) -> Inventory:
    """Everything we know about: key directories first (current one first), then shared and user-set ones."""
    keys = sorted(key_entries(root, current), key=lambda e: (not e.current, e.kind != KEY, e.name))
    return Inventory(root=root, current=current, entries=keys + shared_entries(env, isolation, root))
