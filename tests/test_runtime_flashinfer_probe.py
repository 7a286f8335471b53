"""The FlashInfer probe ends with its parent: Ctrl-C, SIGTERM or SIGKILL of the launcher during the
test build leaves no build process behind (issue 17). Real process trees, every pid ended in a finally."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gone(pid: int) -> bool:
    """True when `pid` no longer runs (a zombie waiting for init to reap it counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait(cond, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _kill(pid: int | None) -> None:
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture
def tree(tmp_path):
    """A launcher running run_probe on a fake build that starts a 60 s grandchild; yields
    (launcher, fake build pid, grandchild pid) once all three run, then kills any left."""
    fake = tmp_path / "fake-python"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, subprocess, sys, time
        kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(tmp_path / 'pids.tmp')!r}, "w").write(f"{{os.getpid()}} {{kid.pid}}")
        os.replace({str(tmp_path / 'pids.tmp')!r}, {str(tmp_path / 'pids')!r})
        time.sleep(60)
    """))
    fake.chmod(0o755)
    code = textwrap.dedent(f"""\
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
        from caovan_vllm_sm75_turbo3.runtime.flashinfer_probe import run_probe
        try:
            run_probe({{"PATH": "/usr/bin:/bin"}}, 60, "fp", python={str(fake)!r})
        except KeyboardInterrupt:
            raise SystemExit(130)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    pids: list[int] = []
    try:
        assert _wait(lambda: (tmp_path / "pids").exists(), 30), "the fake build never started"
        pids = [int(x) for x in (tmp_path / "pids").read_text().split()]
        yield launcher, pids[0], pids[1]
    finally:
        for pid in (launcher.pid, *pids):
            _kill(pid)
        launcher.wait(timeout=10)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 130)])
def test_signal_to_the_launcher_ends_the_whole_build(tree, sig, code):
    launcher, build, grandchild = tree
    os.kill(launcher.pid, sig)
    assert launcher.wait(timeout=10) == code
    assert _wait(lambda: _gone(build) and _gone(grandchild), 10), "the build outlived the launcher"


def test_sigkill_of_the_launcher_ends_the_build_process(tree):
    launcher, build, _ = tree
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait(timeout=10)
    # PR_SET_PDEATHSIG reaches the direct child (its compilers are its own to end)
    assert _wait(lambda: _gone(build), 10), "the build outlived a SIGKILLed launcher"


def test_sigterm_handler_is_restored_after_the_probe(tmp_path):
    from caovan_vllm_sm75_turbo3.runtime import flashinfer_probe as fp

    fake = tmp_path / "py"
    fake.write_text("#!/bin/sh\necho CAOVAN-PROBE-OK\n")
    fake.chmod(0o755)
    before = signal.getsignal(signal.SIGTERM)
    assert fp.run_probe({}, 30, "fp", python=str(fake)).ok
    assert signal.getsignal(signal.SIGTERM) is before
