"""Where the isolated JIT caches live, their manifest, and the in-use lock a running server holds.

    <root>/envs/<key name>/            one environment (see caches.key)
        triton/ inductor/ vllm/ ...    one directory per cache variable (CACHE_DIRS)
        manifest.json                  key, components, created, last_used, plugin_version
        .manifest.lock                 serialises manifest writers (filelock)
        .in-use.lock                   SHARED flock held by every process serving from this key;
                                       the cleaner takes it EXCLUSIVE, so it never deletes under a server
        in-use/<pid>                   who holds it (pid and process start time)

Nothing here deletes a cache; that is caches.clean.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
from filelock import FileLock, Timeout

from .. import __version__
from ..errors import CaovanError, SettingError
from .key import EnvKey
from .locations import CACHE_VARIABLES, home_dir, tmp_dir, too_broad, xdg_cache_dir

CACHE_DIRS: dict[str, str] = {c.variable: c.name for c in CACHE_VARIABLES}  # variable -> subdirectory
ROOT_NAME = "caovan-sm75-turbo3"
ENVS = "envs"
MANIFEST = "manifest.json"
MANIFEST_LOCK = ".manifest.lock"
IN_USE_LOCK = ".in-use.lock"
IN_USE_DIR = "in-use"
MANIFEST_SCHEMA = 1
LOCK_TIMEOUT_S = 30.0
PREPARE_ATTEMPTS = 3   # a key directory removed under us (a racing clean) is made again this often
_MANIFEST_MAX_BYTES = 1 << 20


def cache_root(cache_dir_setting: str, env: Mapping[str, str]) -> Path:
    """The root of our caches: the setting if non-empty, else ${XDG_CACHE_HOME:-$HOME/.cache}/caovan-sm75-turbo3.

    A relative XDG_CACHE_HOME is ignored, as the XDG spec says (`locations.xdg_cache_dir`).
    """
    if cache_dir_setting:
        return Path(cache_dir_setting)
    return xdg_cache_dir(env) / ROOT_NAME


ACCEPTED_ROOTS = ("an absolute directory of its own: not /, $HOME or a directory holding it, a top-level "
                  "or system directory (/usr, /etc, ...), nor the whole ~/.cache or temp directory")


def root_refusal(path: Path, env: Mapping[str, str], *, must_exist: bool = True) -> str | None:
    """Why `path` may be neither a cache root nor a deletion root; None when it may be one.

    The one rule `caovan-vllm-serve` (before it creates a key directory) and `caovan-sm75-cache
    clean` (before it deletes) both apply. A symlinked path is judged where it points. With
    `must_exist` False a path that does not exist yet is judged by its name alone.
    """
    try:
        if not path.is_absolute():
            return f"{path} is not an absolute path"
        resolved = Path(os.path.realpath(path))
        home = Path(os.path.realpath(home_dir(env)))
        broad = too_broad(resolved, home)
        if broad:
            return f"{path} is {broad}" if resolved == path else f"{path} resolves to {resolved}, {broad}"
        for shared in (xdg_cache_dir(env), home / ".cache", tmp_dir(env), Path("/tmp"), Path("/var/tmp")):
            if resolved == Path(os.path.realpath(shared)):
                return f"{path} resolves to {resolved}, a directory shared by everything"
        if not must_exist and not os.path.lexists(path):
            return None
        st = os.stat(resolved)
        if not stat.S_ISDIR(st.st_mode):
            return f"{path} is not a directory"
        if st.st_uid != os.geteuid():
            return f"{resolved} belongs to uid {st.st_uid}, not to you"
        lst = os.lstat(path)
        if stat.S_ISLNK(lst.st_mode) and lst.st_uid != os.geteuid():
            return f"{path} is a symlink made by uid {lst.st_uid}, not by you"
    except OSError as err:
        return f"{path} cannot be checked: {err.strerror or err}"
    except ValueError as err:  # a NUL byte in a path from the environment
        return f"{path!r} cannot be checked: {err}"
    return None


def _setting_name(source: str) -> str:
    """How the user spelled the setting, from `Settings.source("cache_dir")`."""
    if source.startswith("env "):
        return source[4:]
    if source.startswith("flag "):
        return source[5:]
    if source.startswith("additional-config "):
        return f"--additional-config key {source.split(' ', 1)[1]!r}"
    return "the default root ${XDG_CACHE_HOME:-$HOME/.cache}/caovan-sm75-turbo3 (set CAOVAN_CACHE_DIR)"


def checked_root(cache_dir_setting: str, source: str, env: Mapping[str, str]) -> Path:
    """`cache_root()` after `root_refusal()`: the root a launch may create. Raises SettingError (exit 2)
    naming where the value came from (`source`, as `Settings.source` says) and what is accepted."""
    root = cache_root(cache_dir_setting, env)
    why = root_refusal(root, env, must_exist=False)
    if why:
        raise SettingError(f"{_setting_name(source)}={str(root)!r} is not accepted as the JIT cache root: "
                           f"{why}. Accepted: {ACCEPTED_ROOTS}.")
    return root


@dataclass(frozen=True)
class KeyDir:
    """One environment key's directory under a cache root."""

    root: Path
    key: EnvKey

    @property
    def path(self) -> Path:
        return self.root / ENVS / self.key.name

    def env_dirs(self) -> dict[str, Path]:
        """Cache environment variable -> its directory for this key."""
        return {var: self.path / sub for var, sub in CACHE_DIRS.items()}

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST


def existing_keys(root: Path) -> list[str]:
    """Names of the key directories under `root/envs`, sorted; [] when there are none. Read-only."""
    try:
        with os.scandir(root / ENVS) as it:
            return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _has_file(top: Path) -> bool:
    """True when `top` holds any non-directory entry (symlinks are not followed); unreadable counts as True."""
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(Path(e.path))
                    else:
                        return True
        except FileNotFoundError:
            continue
        except OSError:
            return True  # cannot prove it empty
    return False


def is_empty(keydir: KeyDir) -> bool:
    """True when no cache subdirectory of `keydir` holds a file yet (a cold start will compile)."""
    return not any(_has_file(d) for d in keydir.env_dirs().values())


@dataclass
class PrepareResult:
    """What prepare() found: `created` when this call wrote the key's first manifest."""

    created: bool
    was_empty: bool
    other_keys: list[str] = field(default_factory=list)


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="seconds")


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write to a temporary file in the same directory, fsync, then os.replace: readers see old or new."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def prepare(keydir: KeyDir, now: datetime | None = None) -> PrepareResult:
    """Create the key directory and its cache subdirectories, and create or update manifest.json.

    Safe to call from many threads and processes at once (the manifest is written under
    `.manifest.lock`, atomically). Never deletes anything. Raises CaovanError when the
    directory cannot be created or the lock is not free within LOCK_TIMEOUT_S.
    """
    now = now or datetime.now(timezone.utc)
    path = keydir.path
    for attempt in range(1, PREPARE_ATTEMPTS + 1):
        try:
            created, was_empty = _prepare_once(keydir, now)
            break
        except Timeout:
            raise CaovanError(f"the cache manifest lock {path / MANIFEST_LOCK} was not free within "
                              f"{LOCK_TIMEOUT_S:.0f} s; another caovan process is stuck holding it") from None
        except (FileNotFoundError, FileExistsError, NotADirectoryError) as err:
            blocked = _file_in_the_way(path)
            if blocked is not None:
                raise CaovanError(f"cannot prepare the JIT cache directory {path}: {blocked} is a file, not a "
                                  "directory. Set CAOVAN_CACHE_DIR (or --cache-dir) to a writable directory.") from None
            # A directory vanished or appeared between two of our steps: something removed it meanwhile
            # (`caovan-sm75-cache clean --all` racing this launch). Start over; say so if it keeps on.
            if attempt == PREPARE_ATTEMPTS:
                raise CaovanError(f"the JIT cache directory {path} kept changing while it was being prepared "
                                  f"({err.strerror or err}: {err.filename}); is `caovan-sm75-cache clean` running at "
                                  f"the same time? Start again once it has finished.") from None
        except OSError as err:
            raise CaovanError(f"cannot prepare the JIT cache directory {path}: {err.strerror or err}. "
                              "Set CAOVAN_CACHE_DIR (or --cache-dir) to a writable directory.") from None
    other = [k for k in existing_keys(keydir.root) if k != keydir.key.name]
    return PrepareResult(created=created, was_empty=was_empty, other_keys=other)


def _file_in_the_way(path: Path) -> Path | None:
    """The first of `path` and its parents that exists and is not a directory (one stat each, so a
    directory removed meanwhile reads as absent, never as a file)."""
    for q in (path, *path.parents):
        try:
            if not stat.S_ISDIR(os.stat(q).st_mode):
                return q
        except OSError:
            continue
    return None


def _prepare_once(keydir: KeyDir, now: datetime) -> tuple[bool, bool]:
    """One pass of `prepare`: (manifest created, directory was empty)."""
    path = keydir.path
    path.mkdir(parents=True, exist_ok=True)
    was_empty = is_empty(keydir)
    for d in keydir.env_dirs().values():
        d.mkdir(exist_ok=True)
    _require_regular(path / MANIFEST_LOCK)
    _require_regular(keydir.manifest_path)
    with FileLock(str(path / MANIFEST_LOCK), timeout=LOCK_TIMEOUT_S):
        old = read_manifest(path)
        first = old.get("created") if old else None
        _write_json_atomic(keydir.manifest_path, {
            "schema": MANIFEST_SCHEMA, "key": keydir.key.name, "components": keydir.key.components,
            "created": first if isinstance(first, str) else _iso(now), "last_used": _iso(now),
            "plugin_version": __version__})
    return old is None, was_empty


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"))


def special_kind(path: Path) -> str | None:
    """What `path` is when it exists but is not a regular file ("a FIFO", "a socket", ...); else None.

    Never opens it: a FIFO would block an open() until a writer comes, a device may never end."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return next((name for test, name in _KINDS if test(mode)), None)


def _require_regular(path: Path) -> None:
    """Raise CaovanError when a file we are about to open is there but is not a regular file."""
    kind = special_kind(path)
    if kind:
        raise CaovanError(f"{path} is {kind}, not a regular file; remove it (a caovan process will create "
                          "it again)")


def read_small(path: Path, limit: int = _MANIFEST_MAX_BYTES) -> bytes | None:
    """Up to `limit` bytes of the regular file `path`; None when absent, larger, unreadable or not a
    regular file. Checked first and opened non-blocking without following a link, so a FIFO or device
    never hangs us."""
    if special_kind(path):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return raw if len(raw) <= limit else None


def read_manifest(keydir_path: Path) -> dict | None:
    """The key directory's manifest as a dict; None when absent, unreadable, corrupt or not a regular file.
    Never raises, never blocks."""
    raw = read_small(Path(keydir_path) / MANIFEST)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return data if isinstance(data, dict) else None


def _start_time(pid: int) -> float | None:
    """The process's start time, or None when it does not exist (or is a zombie)."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except psutil.AccessDenied:
        return -1.0  # alive, start time unknown
    except psutil.Error:
        return None


def _alive(pid: int, recorded_start: float | None) -> bool:
    """Alive and, where both start times are known, the same process (not a reused pid)."""
    started = _start_time(pid)
    if started is None:
        return False
    if started < 0 or recorded_start is None:
        return True
    return abs(started - recorded_start) < 1.0


def _pid_files(keydir_path: Path) -> list[tuple[int, float | None, Path]]:
    out = []
    try:
        with os.scandir(Path(keydir_path) / IN_USE_DIR) as it:
            entries = [e for e in it if e.name.isdigit() and e.is_file(follow_symlinks=False)]
    except OSError:
        return []
    for e in entries:
        start: float | None = None
        try:
            data = json.loads((read_small(Path(e.path), 4096) or b"").decode("utf-8"))
            start = float(data["start_time"]) if isinstance(data, dict) and data.get("start_time") else None
        except (ValueError, KeyError, TypeError):
            pass
        out.append((int(e.name), start, Path(e.path)))
    return out


def _locked_live(fd: int, lock_path: Path) -> bool:
    """True when `fd` is still the file at `lock_path` (a cleaner may have removed it before we locked)."""
    try:
        st, fst = os.stat(lock_path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def hold_in_use(keydir: KeyDir, wait_s: float = LOCK_TIMEOUT_S) -> int:
    """Mark `keydir` in use by this process until it exits; returns the lock's file descriptor.

    Takes a SHARED flock on `.in-use.lock` and clears FD_CLOEXEC, so the lock survives
    os.execvp into vLLM (same pid) and is released by the kernel when the process ends.
    Records the pid in `in-use/<pid>` so the cleaner can say who holds it. Waits up to
    `wait_s` while `caovan-sm75-cache clean` holds the lock exclusively.
    """
    path = keydir.path
    lock_path = path / IN_USE_LOCK
    deadline = time.monotonic() + wait_s
    try:
        while True:
            (path / IN_USE_DIR).mkdir(parents=True, exist_ok=True)
            _require_regular(lock_path)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped after the check above
                    raise OSError(0, f"{lock_path} is not a regular file")
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                if _locked_live(fd, lock_path):
                    break
            except BlockingIOError:
                pass  # the cleaner holds it exclusively: wait
            except OSError:
                os.close(fd)
                raise
            os.close(fd)
            if time.monotonic() > deadline:
                raise CaovanError(f"the JIT cache {path} is being cleaned (caovan-sm75-cache holds "
                                  f"{lock_path}); wait for it to finish, then start again")
            time.sleep(0.1)
        os.set_inheritable(fd, True)
        pid = os.getpid()
        _write_json_atomic(path / IN_USE_DIR / str(pid), {"pid": pid, "start_time": _start_time(pid)})
    except OSError as err:
        raise CaovanError(f"cannot mark the JIT cache {path} in use: {err.strerror or err}") from None
    for other, start, pid_file in _pid_files(path):
        if other != pid and not _alive(other, start):
            try:  # a record left by a process that died; best effort
                os.unlink(pid_file)
            except OSError:
                pass
    return fd


def lock_is_held(keydir_path: Path) -> bool:
    """True when some process holds `.in-use.lock` (shared or exclusive). Never raises, never blocks."""
    if special_kind(Path(keydir_path) / IN_USE_LOCK):
        return False  # hold_in_use never locks anything but a regular file, so nobody holds it
    try:
        fd = os.open(Path(keydir_path) / IN_USE_LOCK, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False  # hold_in_use never locks anything else, so nobody holds it
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def users(keydir_path: Path) -> list[int]:
    """Pids that hold the key's in-use lock (recorded, alive, lock not free); [] when nobody does. Never raises."""
    try:
        if not lock_is_held(keydir_path):
            return []
        return sorted(pid for pid, start, _ in _pid_files(keydir_path) if _alive(pid, start))
    except Exception:  # contract: never raises
        return []
