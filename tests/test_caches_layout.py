"""The cache layout: root, key directories, manifest under concurrency, the in-use lock across exec."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from caovan_vllm_sm75_turbo3.caches import layout
from caovan_vllm_sm75_turbo3.caches.key import key_from_components
from caovan_vllm_sm75_turbo3.caches.layout import (
    CACHE_DIRS, KeyDir, cache_root, existing_keys, hold_in_use, is_empty, prepare, read_manifest, users)
from caovan_vllm_sm75_turbo3.caches.locations import CACHE_VARIABLES, xdg_cache_dir
from caovan_vllm_sm75_turbo3.errors import CaovanError

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def keydir(root: Path, torch: str = "2.11.0") -> KeyDir:
    return KeyDir(root, key_from_components({
        "plugin": "0.1.0", "python": "3.11.7", "torch": torch, "torch_cuda": "13.0", "triton": "3.6.0",
        "vllm": "0.21.0", "flashinfer": "0.6.8.post1", "arch": "sm75"}))


def test_cache_root_precedence(tmp_path):
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert cache_root(str(tmp_path / "mine"), env) == tmp_path / "mine"
    assert cache_root("", env) == tmp_path / "xdg" / "caovan-sm75-turbo3"
    assert cache_root("", {"HOME": env["HOME"], "XDG_CACHE_HOME": "relative"}) == \
        tmp_path / "home" / ".cache" / "caovan-sm75-turbo3"
    assert cache_root("", {"HOME": env["HOME"]}) == tmp_path / "home" / ".cache" / "caovan-sm75-turbo3"


def test_one_table_of_cache_variables_for_the_layout_and_the_inventory(tmp_path):
    names = [(c.variable, c.name) for c in CACHE_VARIABLES]
    assert list(CACHE_DIRS.items()) == names and len({n for _, n in names}) == len(names)
    assert {"TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE",
            "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH"} == set(CACHE_DIRS)
    home = {"HOME": str(tmp_path / "home")}
    for xdg in ("", "relative", "./also/relative"):
        assert xdg_cache_dir({**home, "XDG_CACHE_HOME": xdg}) == tmp_path / "home" / ".cache"
    assert xdg_cache_dir({**home, "XDG_CACHE_HOME": str(tmp_path / "x")}) == tmp_path / "x"


def test_keydir_paths(tmp_path):
    kd = keydir(tmp_path)
    assert kd.path == tmp_path / "envs" / kd.key.name
    assert kd.manifest_path == kd.path / "manifest.json"
    assert kd.env_dirs() == {var: kd.path / sub for var, sub in CACHE_DIRS.items()}
    assert set(kd.env_dirs()) == {"TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT",
                                  "FLASHINFER_WORKSPACE_BASE", "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH"}


def test_prepare_creates_then_updates_and_never_deletes(tmp_path):
    kd, other = keydir(tmp_path), keydir(tmp_path, torch="2.10.0")
    assert existing_keys(tmp_path) == []
    prepare(other, now=T0)
    first = prepare(kd, now=T0)
    assert first.created and first.was_empty and first.other_keys == [other.key.name]
    for d in kd.env_dirs().values():
        assert d.is_dir()
    m = read_manifest(kd.path)
    assert m["key"] == kd.key.name and m["components"] == kd.key.components
    assert m["created"] == m["last_used"] == T0.isoformat()
    kept = kd.env_dirs()["TRITON_CACHE_DIR"] / "abc" / "kernel.cubin"
    kept.parent.mkdir()
    kept.write_bytes(b"\x7fELF")
    assert not is_empty(kd)
    later = T0 + timedelta(hours=5)
    second = prepare(kd, now=later)
    assert not second.created and not second.was_empty
    m2 = read_manifest(kd.path)
    assert m2["created"] == T0.isoformat() and m2["last_used"] == later.isoformat()
    assert kept.read_bytes() == b"\x7fELF"
    assert sorted(existing_keys(tmp_path)) == sorted([kd.key.name, other.key.name])


def test_a_symlink_in_a_cache_dir_is_a_file_for_is_empty(tmp_path):
    kd = keydir(tmp_path)
    prepare(kd)
    assert is_empty(kd)
    (kd.env_dirs()["CUDA_CACHE_PATH"] / "link").symlink_to(tmp_path / "nowhere")
    assert not is_empty(kd)


def test_corrupt_manifest_reads_as_none_and_prepare_repairs_it(tmp_path):
    kd = keydir(tmp_path)
    prepare(kd, now=T0)
    for junk in (b"{not json", b"\xff\xfe", b"[1, 2]", b""):
        kd.manifest_path.write_bytes(junk)
        assert read_manifest(kd.path) is None
    assert read_manifest(tmp_path / "absent") is None
    assert prepare(kd, now=T0).created
    assert read_manifest(kd.path)["key"] == kd.key.name


def _hammer(root: str, start: int, count: int) -> list[bool]:
    """Run prepare() `count` times with distinct timestamps; returns each call's `created`."""
    kd = keydir(Path(root))
    return [prepare(kd, now=T0 + timedelta(seconds=start + i)).created for i in range(count)]


def _watch(kd: KeyDir, stop: threading.Event, bad: list) -> None:
    """Read the manifest continuously; once it exists it must always parse."""
    seen = False
    while not stop.is_set():
        m = read_manifest(kd.path)
        if m is not None:
            seen = True
            if m.get("key") != kd.key.name:
                bad.append(m)
        elif seen:
            bad.append(None)


def _check_final(kd: KeyDir, created: list[bool], total: int) -> None:
    assert len(created) == total and created.count(True) == 1
    m = json.loads(kd.manifest_path.read_text())
    for stamp in (m["created"], m["last_used"]):  # one of the times the callers passed
        assert T0 <= datetime.fromisoformat(stamp) <= T0 + timedelta(seconds=1000)
    leftovers = [p.name for p in kd.path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_concurrent_prepare_threads_never_corrupt_the_manifest(tmp_path):
    kd = keydir(tmp_path)
    stop, bad, results = threading.Event(), [], []
    lock = threading.Lock()
    watcher = threading.Thread(target=_watch, args=(kd, stop, bad))
    watcher.start()

    def work(n: int) -> None:
        out = _hammer(str(tmp_path), n * 100, 15)
        with lock:
            results.extend(out)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    watcher.join(timeout=10)
    assert bad == []
    _check_final(kd, results, 90)


def test_concurrent_prepare_processes_never_corrupt_the_manifest(tmp_path):
    kd = keydir(tmp_path)
    stop, bad = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(kd, stop, bad))
    watcher.start()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        parts = pool.starmap(_hammer, [(str(tmp_path), n * 100, 15) for n in range(4)], chunksize=1)
    stop.set()
    watcher.join(timeout=10)
    assert bad == []
    _check_final(kd, [c for part in parts for c in part], 60)


def _wait_for(pred, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


# The child marks the key in use, then becomes another program with the same pid, as
# caovan-vllm-serve does when it execs vLLM. CLOEXEC tells the child whether to clear FD_CLOEXEC
# by hand-rolling the lock (the control case) or to use hold_in_use.
CHILD = r"""
import fcntl, json, os, sys
from pathlib import Path
from caovan_vllm_sm75_turbo3.caches import layout
from caovan_vllm_sm75_turbo3.caches.key import key_from_components
kd = layout.KeyDir(Path(sys.argv[1]), key_from_components(json.loads(sys.argv[2])))
layout.prepare(kd)
if sys.argv[3] == "hold":
    layout.hold_in_use(kd)
else:  # control: the same lock and pid file, but the fd keeps FD_CLOEXEC and dies at exec
    fd = os.open(kd.path / layout.IN_USE_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    (kd.path / layout.IN_USE_DIR).mkdir(exist_ok=True)
    (kd.path / layout.IN_USE_DIR / str(os.getpid())).write_text(json.dumps({"pid": os.getpid()}))
os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)"])
"""


def _run_child(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, KeyDir]:
    kd = keydir(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), json.dumps(kd.key.components), mode])
    # After exec the command line is the sleeper's alone (the child's script mentions `layout`).
    assert _wait_for(lambda: "time.sleep" in _cmdline(child.pid) and "layout" not in _cmdline(child.pid)), \
        "child did not exec"
    return child, kd


def test_hold_in_use_survives_exec_and_users_names_the_pid(tmp_path):
    child, kd = _run_child(tmp_path, "hold")
    try:
        assert users(kd.path) == [child.pid]
        assert layout.lock_is_held(kd.path)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert users(kd.path) == []  # the kernel released the lock with the process
    assert not layout.lock_is_held(kd.path)


def test_a_lock_that_did_not_survive_exec_reports_no_users(tmp_path):
    child, kd = _run_child(tmp_path, "cloexec")
    try:
        assert (kd.path / "in-use" / str(child.pid)).exists()
        assert users(kd.path) == []
    finally:
        child.kill()
        child.wait(timeout=30)


def test_users_in_this_process_and_after_close(tmp_path):
    kd = keydir(tmp_path)
    prepare(kd)
    assert users(kd.path) == []
    fd = hold_in_use(kd)
    try:
        assert os.get_inheritable(fd)
        assert users(kd.path) == [os.getpid()]
    finally:
        os.close(fd)
    assert users(kd.path) == []


def test_a_reused_pid_is_not_a_user(tmp_path):
    kd = keydir(tmp_path)
    prepare(kd)
    fd = hold_in_use(kd)
    try:
        # A record for a live pid whose start time is not that process's: pid reuse after a crash.
        record = kd.path / "in-use" / str(os.getppid())
        record.write_text(json.dumps({"pid": os.getppid(), "start_time": 12345.0}))
        assert users(kd.path) == [os.getpid()]
    finally:
        os.close(fd)


def test_hold_in_use_waits_for_a_cleaner_then_says_so(tmp_path):
    kd = keydir(tmp_path)
    prepare(kd)
    fd = os.open(kd.path / layout.IN_USE_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        t = time.monotonic()
        with pytest.raises(CaovanError, match="being cleaned"):
            hold_in_use(kd, wait_s=0.5)
        assert time.monotonic() - t >= 0.5
    finally:
        os.close(fd)
    os.close(hold_in_use(kd, wait_s=0.5))


def test_users_never_raises_on_odd_directories(tmp_path):
    assert users(tmp_path / "absent") == []
    (tmp_path / "in-use").mkdir()
    (tmp_path / "in-use" / "notapid").write_text("x")
    (tmp_path / ".in-use.lock").symlink_to(tmp_path / "elsewhere")
    assert users(tmp_path) == []
