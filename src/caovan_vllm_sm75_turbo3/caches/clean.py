"""Safe deletion of JIT caches: plan what may go, then remove it without ever leaving a known root.

Rules (each one has a test):
- A deletion root is resolved first and refused when it is `/`, a top-level or system directory,
  $HOME or anything holding it, the whole ~/.cache or temp directory, or not owned by the running
  user (`layout.root_refusal`, the rule a launch applies to a cache root too).
- A shared default whose real path lies outside the home cache folders is its own group
  (`Target.outside`): the command asks for it separately.
- Every removal is done relative to an open directory descriptor that was opened with
  O_NOFOLLOW from the verified root, so a symlink is unlinked, never followed, and a path
  component swapped for a symlink mid-way makes that one removal fail instead of escaping.
- Other file systems mounted inside a cache, our own cache root and directories the user set
  are not entered.
- A key directory is removed only while we hold its `.in-use.lock` exclusively (a server holds it
  shared), unless `force`.
- Failures (permissions, vanished files, a changed tree) are collected, never raised.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .inventory import KEY, SHARED, USER_SET, CacheEntry, Inventory
from .layout import ENVS, IN_USE_LOCK, root_refusal, users
from .locations import home_cache_folders, is_inside

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 200  # deeper than any real cache; also bounds the open descriptors and the recursion
PROTECTED = "protected (a cache root or a directory set by you); not entered"


def refusal(path: Path, env: Mapping[str, str]) -> str | None:
    """Why `path` must never be a deletion root, or None when it may be one (`layout.root_refusal`,
    the rule `caovan-vllm-serve` applies to a cache root too; here the path must exist)."""
    return root_refusal(path, env, must_exist=True)


@dataclass
class Target:
    """One thing to delete: `names` under the directory `root` (None: everything in `root`).

    `root` is resolved (what really goes); `outside` is True when it lies outside the user's home
    cache folders (`locations.home_cache_folders`), so clean asks for it once more.
    """

    entry: CacheEntry
    root: Path
    names: tuple[str, ...] | None
    outside: bool = False

    @property
    def group(self) -> str:
        if self.outside:
            return "outside"
        return "shared" if self.entry.kind == SHARED else "ours"

    @property
    def real_path(self) -> Path:
        """The path that is really removed (or emptied), every symlink resolved."""
        return self.root if self.names is None else self.root / self.names[0]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.entry.to_dict(), group=self.group, real_path=str(self.real_path),
                    outside_home_caches=self.outside)


@dataclass
class Plan:
    """What clean would remove, and what it leaves with the reason."""

    targets: list[Target] = field(default_factory=list)
    skipped: list[tuple[CacheEntry, str]] = field(default_factory=list)  # left by design
    busy: list[tuple[CacheEntry, str]] = field(default_factory=list)     # would go, but in use: not done
    refused: list[tuple[Path, str]] = field(default_factory=list)        # unsafe root: never touched


def vllm_processes() -> list[int]:
    """Pids of running vLLM servers, read from command lines (shared caches have no lock). Never raises."""
    import psutil
    found = []
    try:
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = p.info.get("cmdline") or []
            if p.info["pid"] != os.getpid() and any(
                    os.path.basename(a) in ("vllm", "caovan-vllm-serve") or "vllm.entrypoints" in a for a in cmd):
                found.append(p.info["pid"])
    except Exception:  # best effort: a process list we cannot read is not an error
        pass
    return sorted(found)


def plan_clean(inv: Inventory, env: Mapping[str, str], *, everything: bool, shared: bool,
               force: bool, vllm_pids: list[int] | None = None) -> Plan:
    """Decide, from the inventory alone, what `clean` (or `clean --all`) removes.

    `vllm_pids`: running vLLM servers; they may be using the shared defaults, which are then
    left alone unless `force`.
    """
    plan = Plan()
    envs = inv.root / ENVS
    folders = home_cache_folders(env, inv.root)
    our_refusal = None
    if os.path.lexists(inv.root):
        our_refusal = refusal(inv.root, env) or (refusal(envs, env) if os.path.lexists(envs) else None)
    if our_refusal:
        plan.refused.append((inv.root, our_refusal + "; set CAOVAN_CACHE_DIR (or --cache-dir) to a "
                                                     "directory of its own"))
    for e in inv.entries:
        if e.kind == KEY:
            if e.current and not everything:
                plan.skipped.append((e, "the current environment's cache (clean --all removes it)"))
            elif our_refusal:
                continue
            elif e.in_use and not force:
                plan.busy.append((e, _in_use_text(e.users)))
            else:
                plan.targets.append(Target(e, Path(os.path.realpath(envs)), (e.name,)))
        elif e.kind == SHARED:
            if not (everything and shared) or not e.exists:
                continue
            why = refusal(e.path, env)
            if why:
                plan.refused.append((e.path, why))
            elif vllm_pids and not force:
                plan.busy.append((e, "vLLM is running (process " + ", ".join(map(str, vllm_pids))
                                     + ") and may be using it; stop it first or pass --force"))
            else:
                real = Path(os.path.realpath(e.path))
                plan.targets.append(Target(e, real, None, outside=not is_inside(real, folders)))
        elif e.kind == USER_SET:
            if everything and shared and e.exists:
                plan.skipped.append((e, f"set by you in {e.variable}; remove it yourself if you mean to"))
        elif everything:
            plan.skipped.append((e, "not created by caovan; left alone"))
    return plan


def _in_use_text(pids: list[int]) -> str:
    who = ("process " + ", ".join(str(p) for p in pids)) if pids else "a process that did not record its pid"
    return f"in use: {who} holds its lock (a running server); stop it first or pass --force"


@dataclass
class Outcome:
    """What a clean did. `not_removed`, `vanished` and `partly_removed` make the command exit non-zero.

    `partly_removed`: (target, entries left, the first one left, why) for a target that is not
    wholly gone (a key) or emptied (a shared default; our own protected root inside it aside).
    """

    removed: list[str] = field(default_factory=list)
    not_removed: list[tuple[str, str]] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)
    partly_removed: list[tuple[str, int, str, str]] = field(default_factory=list)
    files_removed: int = 0
    bytes_removed: int = 0

    @property
    def ok(self) -> bool:
        return not self.not_removed and not self.vanished and not self.partly_removed

    def to_dict(self) -> dict[str, Any]:
        return {"removed": self.removed, "files_removed": self.files_removed,
                "bytes_removed": self.bytes_removed,
                "not_removed": [{"path": p, "reason": r} for p, r in self.not_removed],
                "vanished": self.vanished, "kept": [{"path": p, "reason": r} for p, r in self.kept],
                "partly_removed": [{"path": p, "entries_left": n, "left": left, "reason": r}
                                   for p, n, left, r in self.partly_removed]}


class _Remover:
    """Removes entries under an open directory descriptor; never follows a link, never crosses a mount."""

    def __init__(self, dev: int, protected: set[tuple[int, int]], out: Outcome) -> None:
        self.dev, self.protected, self.out = dev, protected, out

    def remove(self, parent_fd: int, name: str, shown: str, depth: int = 0) -> bool:
        """Remove `name` (in `parent_fd`) and everything below it. True when it is gone."""
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            self.out.vanished.append(shown)
            return True
        except OSError as err:
            return self._fail(shown, err)
        if not stat.S_ISDIR(st.st_mode):  # files, symlinks, sockets...: unlink the entry itself
            try:
                os.unlink(name, dir_fd=parent_fd)
            except FileNotFoundError:
                self.out.vanished.append(shown)
                return True
            except OSError as err:
                return self._fail(shown, err)
            self.out.files_removed += 1
            self.out.bytes_removed += st.st_size
            return True
        if (st.st_dev, st.st_ino) in self.protected:
            self.out.kept.append((shown, PROTECTED))
            return False
        if st.st_dev != self.dev:
            self.out.kept.append((shown, "another file system is mounted here; not crossed"))
            return False
        if depth >= MAX_DEPTH:
            self.out.not_removed.append((shown, f"nested deeper than {MAX_DEPTH} levels"))
            return False
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            self.out.vanished.append(shown)
            return True
        except OSError as err:
            return self._fail(shown, err)
        try:
            fst = os.fstat(fd)
            if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
                self.out.not_removed.append((shown, "replaced while being removed; left alone"))
                return False
            try:
                with os.scandir(fd) as it:
                    names = [e.name for e in it]
            except OSError as err:
                return self._fail(shown, err)
            all_gone = True
            for child in names:
                all_gone = self.remove(fd, child, f"{shown}/{child}", depth + 1) and all_gone
        finally:
            os.close(fd)
        if not all_gone:
            return False  # what is left was reported below
        try:
            os.rmdir(name, dir_fd=parent_fd)
        except FileNotFoundError:
            self.out.vanished.append(shown)
        except OSError as err:
            return self._fail(shown, err)
        return True

    def _fail(self, shown: str, err: OSError) -> bool:
        reason = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                  # O_NOFOLLOW|O_DIRECTORY on what is now a link: ENOTDIR (Linux) or ELOOP
                  errno.ELOOP: "became a symlink meanwhile; not followed",
                  errno.ENOTDIR: "became a symlink or a file meanwhile; not followed",
                  errno.ENOTEMPTY: "new files appeared in it meanwhile"}.get(err.errno, err.strerror or str(err))
        self.out.not_removed.append((shown, reason))
        return False


def _open_root(root: Path) -> int:
    """Open the resolved root and check that the descriptor really is that directory."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        st, fst = os.stat(root), os.fstat(fd)
        opened = os.readlink(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") else str(root)
        if opened != str(root) or (st.st_dev, st.st_ino) != (fst.st_dev, fst.st_ino):
            raise OSError(errno.ELOOP, "changed while it was opened")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _lock_exclusive(envs_fd: int, name: str) -> tuple[int | None, bool]:
    """(lock fd or None, busy): take the key's in-use lock exclusively without waiting."""
    try:
        kfd = os.open(name, _DIR_FLAGS, dir_fd=envs_fd)
    except OSError:
        return None, False  # a link or gone: nobody can hold a lock in it through us
    try:  # never open what is not a regular file (a FIFO blocks, a device may act); non-blocking for a swap
        if not stat.S_ISREG(os.stat(IN_USE_LOCK, dir_fd=kfd, follow_symlinks=False).st_mode):
            return None, False  # hold_in_use never locks anything else: nobody holds it
        lfd = os.open(IN_USE_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=kfd)
    except OSError:
        return None, False
    finally:
        os.close(kfd)
    if not stat.S_ISREG(os.fstat(lfd).st_mode):  # hold_in_use never locks anything else: nobody holds it
        os.close(lfd)
        return None, False
    try:
        fcntl.flock(lfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lfd)
        return None, True
    return lfd, False


def _partly(out: Outcome, target: str, mark: tuple[int, int], by_design: tuple[str, ...] = ()) -> None:
    """Record `target` as partly removed with what was left since `mark` (lengths of not_removed, kept)."""
    left = out.not_removed[mark[0]:] + [k for k in out.kept[mark[1]:] if k[1] not in by_design]
    if left:
        out.partly_removed.append((target, len(left), left[0][0], left[0][1]))


def execute(targets: Iterable[Target], env: Mapping[str, str], *, protect: Iterable[Path],
            force: bool) -> Outcome:
    """Remove planned `targets`, re-checking each root first. Never raises for file-system trouble.

    `protect`: directories never entered (our cache root, $HOME, directories the user set).
    """
    out = Outcome()
    protected = {i for i in (_inode(p) for p in protect) if i}
    for t in targets:
        why = refusal(t.root, env)  # again, right before deleting: the tree may have changed since the plan
        if why:
            out.not_removed.append((str(t.entry.path), why))
            continue
        try:
            root_fd = _open_root(t.root)
        except OSError as err:
            out.not_removed.append((str(t.entry.path), f"cannot open {t.root}: {err.strerror or err}"))
            continue
        try:
            remover = _Remover(os.fstat(root_fd).st_dev, protected, out)
            if t.names is None:  # a shared directory: empty it, keep the directory itself
                try:
                    with os.scandir(root_fd) as it:
                        names = sorted(e.name for e in it)
                except OSError as err:
                    out.not_removed.append((str(t.root), err.strerror or str(err)))
                    continue
                mark = (len(out.not_removed), len(out.kept))
                gone = True
                for n in names:
                    gone = remover.remove(root_fd, n, f"{t.root}/{n}") and gone
                if gone:
                    out.removed.append(str(t.entry.path))
                else:
                    _partly(out, str(t.entry.path), mark, by_design=(PROTECTED,))
                continue
            for n in t.names:
                if "/" in n or n in ("", ".", ".."):
                    out.not_removed.append((f"{t.root}/{n}", "not a single file name"))
                    continue
                lock_fd, busy = _lock_exclusive(root_fd, n)
                if busy and not force:
                    out.not_removed.append((f"{t.root}/{n}", _in_use_text(users(t.root / n))))
                    continue
                try:
                    shown = f"{t.root}/{n}"
                    mark = (len(out.not_removed), len(out.kept))
                    if not remover.remove(root_fd, n, shown):
                        _partly(out, str(t.entry.path), mark)
                    elif shown not in out.vanished:
                        out.removed.append(str(t.entry.path))
                finally:
                    if lock_fd is not None:
                        os.close(lock_fd)
        finally:
            os.close(root_fd)
    return out
