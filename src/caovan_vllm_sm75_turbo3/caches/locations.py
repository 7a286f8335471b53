"""The JIT cache variables, where each tool puts its cache when none is set, and the XDG rule.

One table (`CACHE_VARIABLES`) serves both the isolated layout (one subdirectory per variable under
a key directory) and the inventory (the shared defaults a plain vLLM run fills).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path


def home_dir(env: Mapping[str, str]) -> Path:
    """$HOME from `env` (else the password database)."""
    return Path(env.get("HOME") or os.path.expanduser("~"))


def xdg_cache_dir(env: Mapping[str, str]) -> Path:
    """${XDG_CACHE_HOME:-$HOME/.cache}; an empty or relative XDG_CACHE_HOME is ignored, as the XDG spec says.

    (vLLM and torch would take a relative one relative to their working directory, which a
    later `caovan-sm75-cache` run cannot know; ignoring it never points a cleaner at a path
    relative to wherever that command happens to run.)
    """
    xdg = env.get("XDG_CACHE_HOME", "")
    return Path(xdg) if xdg and os.path.isabs(xdg) else home_dir(env) / ".cache"


def _user_name(env: Mapping[str, str]) -> str:
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):  # the order getpass.getuser() reads
        if env.get(var):
            return env[var]
    import pwd
    return pwd.getpwuid(os.getuid()).pw_name


def tmp_dir(env: Mapping[str, str]) -> Path:
    """The temporary directory torch would use: $TMPDIR, else Python's default."""
    return Path(env.get("TMPDIR") or tempfile.gettempdir())


@dataclass(frozen=True)
class CacheVariable:
    """A JIT cache: the variable that moves it, its name (also its subdirectory in a key directory),
    where the tool puts it when the variable is unset, and its place under the variable's value."""

    variable: str
    name: str
    default: Callable[[Mapping[str, str]], Path]
    below_variable: str = ""  # FlashInfer: .cache/flashinfer under FLASHINFER_WORKSPACE_BASE


CACHE_VARIABLES: tuple[CacheVariable, ...] = (
    # Triton: $TRITON_HOME (default $HOME)/.triton/cache
    CacheVariable("TRITON_CACHE_DIR", "triton",
                  lambda env: Path(env.get("TRITON_HOME") or home_dir(env)) / ".triton" / "cache"),
    # torch's inductor default: <tempdir>/torchinductor_<user>, user name sanitised as torch does
    CacheVariable("TORCHINDUCTOR_CACHE_DIR", "inductor",
                  lambda env: tmp_dir(env) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", _user_name(env)))),
    CacheVariable("VLLM_CACHE_ROOT", "vllm", lambda env: xdg_cache_dir(env) / "vllm"),
    CacheVariable("FLASHINFER_WORKSPACE_BASE", "flashinfer", lambda env: home_dir(env) / ".cache" / "flashinfer",
                  below_variable=".cache/flashinfer"),
    CacheVariable("TORCH_EXTENSIONS_DIR", "torch_extensions", lambda env: xdg_cache_dir(env) / "torch_extensions"),
    CacheVariable("CUDA_CACHE_PATH", "cuda", lambda env: home_dir(env) / ".nv" / "ComputeCache"),
)


# Directories of the operating system: never a cache root, never emptied, whatever links say.
SYSTEM_DIRS: tuple[Path, ...] = tuple(Path(p) for p in (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys", "/usr"))


def too_broad(resolved: Path, home: Path) -> str | None:
    """Why the resolved absolute path `resolved` holds too much to be a cache (None when it does not).

    `home` is the resolved home directory. Shared by the root check and `home_cache_folders`.
    """
    if resolved == Path("/"):
        return "the file-system root /"
    if resolved == home or resolved in home.parents:
        return f"your home directory or holds it ({home})"
    if len(resolved.parts) < 3:
        return f"the top-level directory {resolved}"
    for system in SYSTEM_DIRS:
        if resolved == system or system in resolved.parents:
            return f"inside the system directory {system}"
    return None


def home_cache_folders(env: Mapping[str, str], own_root: Path) -> tuple[Path, ...]:
    """The user's home cache folders, resolved: what `clean` empties without asking again.

    ${XDG_CACHE_HOME:-~/.cache}, ~/.cache, ~/.nv, ~/.triton (or $TRITON_HOME/.triton) and our own
    cache root. A shared default whose real path (every symlink resolved) lies outside all of them
    needs a second yes: one reached through a symlink, and torch inductor's per-user folder in the
    temp directory ($TMPDIR/torchinductor_$USER), which every HOME of the user shares.
    A folder that resolves to something too broad (a link to $HOME or /) is left out.
    """
    home = Path(os.path.realpath(home_dir(env)))
    triton_home = Path(env.get("TRITON_HOME") or home_dir(env))
    candidates = (xdg_cache_dir(env), home_dir(env) / ".cache", home_dir(env) / ".nv", triton_home / ".triton",
                  own_root)
    out: list[Path] = []
    for c in candidates:
        resolved = Path(os.path.realpath(c))
        if c.is_absolute() and too_broad(resolved, home) is None and resolved not in out:
            out.append(resolved)
    return tuple(out)


def is_inside(path: Path, folders: tuple[Path, ...]) -> bool:
    """True when `path` (already resolved) is one of `folders` or lies below one."""
    return any(path == f or f in path.parents for f in folders)
