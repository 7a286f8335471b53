"""Helpers for the cache tests: an isolated HOME/XDG/TMPDIR, key directories, tree hashes, CLI runs.

Every test works in temporary directories only; the real home caches are never touched.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from caovan_vllm_sm75_turbo3.caches.key import EnvKey, env_key, key_from_components
from caovan_vllm_sm75_turbo3.caches.layout import KeyDir, prepare
from caovan_vllm_sm75_turbo3.cli import cache as cli
from caovan_vllm_sm75_turbo3.cli.common import run_cli
from caovan_vllm_sm75_turbo3.runtime.facts import Facts

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "2x2080ti-22g.json"
CACHE_VARS = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
              "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH", "TRITON_HOME", "XDG_CACHE_HOME", "CAOVAN_CACHE_DIR",
              "CAOVAN_FACTS", "CAOVAN_CACHE_ISOLATION")


@dataclass
class Env:
    base: Path   # everything the test creates lives under here
    home: Path
    tmp: Path
    outside: Path  # files that no clean may ever touch
    root: Path   # our cache root (HOME/.cache/caovan-sm75-turbo3)
    current: EnvKey

    def keydir(self, key: EnvKey | None = None) -> KeyDir:
        return KeyDir(self.root, key or self.current)

    def stale_key(self, torch: str = "2.10.0") -> EnvKey:
        return key_from_components(dict(self.current.components, torch=torch))


def make_env(base: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    """Point HOME, TMPDIR and the user name at `base`, and unset every cache variable."""
    home, tmp, outside = base / "home", base / "tmp", base / "outside"
    for d in (home, tmp, outside):
        d.mkdir(parents=True)
    for var in CACHE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("USER", "tester")
    monkeypatch.setenv("LOGNAME", "tester")
    # Other people's vLLM servers on this machine must not change what the tests see.
    monkeypatch.setattr(cli, "vllm_processes", lambda: [])
    return Env(base, home, tmp, outside, home / ".cache" / "caovan-sm75-turbo3",
               env_key(Facts.load(EXAMPLE)))


@pytest.fixture
def cenv(tmp_path, monkeypatch) -> Env:
    return make_env(tmp_path, monkeypatch)


def fill(kd: KeyDir, files: dict[str, bytes] | None = None) -> int:
    """prepare() the key directory and write files into its caches; returns the bytes written."""
    prepare(kd)
    files = files or {"TRITON_CACHE_DIR/abc/kernel.cubin": os.urandom(3000),
                      "VLLM_CACHE_ROOT/torch_compile_cache/x/graph.py": b"print(1)\n"}
    for rel, data in files.items():
        var, _, sub = rel.partition("/")
        p = kd.env_dirs()[var] / sub
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return sum(len(v) for v in files.values())


def tree_hash(top: Path) -> str:
    """A digest of every entry under `top`: names, types, modes, sizes, mtimes, contents, link targets."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            line = f"{os.path.relpath(p, top)}|{st.st_mode}|{st.st_size}|{st.st_mtime_ns}"
            h.update(line.encode("utf-8", "surrogateescape"))  # names need not be UTF-8
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(p).encode("utf-8", "surrogateescape"))
            elif stat.S_ISREG(st.st_mode):
                try:
                    h.update(Path(p).read_bytes())
                except PermissionError:
                    h.update(b"unreadable")
    return h.hexdigest()


class FakeStdin(io.StringIO):
    """stdin that claims to be a terminal (or not) and answers prompts from a script."""

    def __init__(self, answers: str = "", tty: bool = False) -> None:
        super().__init__(answers)
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def run(argv: list[str], capsys, monkeypatch, *, answers: str = "", tty: bool = False,
        facts: bool = True) -> tuple[int, str, str]:
    """Run caovan-sm75-cache in this process (with the example facts unless `facts` is False or
    the arguments name some); returns (code, stdout, stderr)."""
    monkeypatch.setattr(sys, "stdin", FakeStdin(answers, tty))
    if facts and "--facts" not in argv:
        argv = argv + ["--facts", str(EXAMPLE)]
    capsys.readouterr()
    code = run_cli(cli.PROG, cli.main, argv)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(argv: list[str], capsys, monkeypatch, **kw) -> tuple[int, dict]:
    code, out, err = run(argv + ["--json"], capsys, monkeypatch, **kw)
    return code, json.loads(out)


def _drop_capabilities() -> None:
    """In the child, before exec: take the file-permission overrides out of the capability bounding
    set (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER), so root keeps uid 0 but, after exec,
    obeys file modes like anyone."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop = 24
    for cap in (1, 2, 3):
        if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def run_unprivileged(base: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """Run caovan-sm75-cache with HOME=base/home, TMPDIR=base/tmp where file permissions apply.

    Root ignores permissions, so under root the child drops all its capabilities first."""
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
    env.update(HOME=str(base / "home"), TMPDIR=str(base / "tmp"), USER="tester", LOGNAME="tester")
    return subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.cache", *argv,
                           "--facts", str(EXAMPLE)], capture_output=True, text=True, timeout=120,
                          env=env, stdin=subprocess.DEVNULL, cwd="/",
                          preexec_fn=_drop_capabilities if os.geteuid() == 0 else None)


def restore_modes(top: Path) -> None:
    """Make every directory under `top` accessible again so the temporary tree can be removed."""
    for dirpath, dirnames, _ in os.walk(top):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                os.chmod(p, 0o755)


def make_deep(top: Path, levels: int, name: str = "d") -> None:
    """`top/d/d/.../d` `levels` deep, made through directory descriptors (the path is far over PATH_MAX)."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def remove_deep(top: Path, name: str = "d") -> None:
    """Remove what make_deep left (any depth), without recursion: rename each level up to `top`, then rmdir."""
    if not top.is_dir():
        return
    n = 0
    while (top / name).is_dir():
        inner = top / name / name
        if inner.is_dir():
            os.rename(inner, top / f".up{n}")  # lift the grandchild one level, so the child is empty
            os.rmdir(top / name)
            os.rename(top / f".up{n}", top / name)
            n += 1
        else:
            for p in (top / name).iterdir():
                p.unlink()
            os.rmdir(top / name)
