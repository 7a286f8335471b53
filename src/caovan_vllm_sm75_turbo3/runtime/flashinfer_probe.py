"""Test-build FlashInfer's sampling module in a child process, with a time limit.

The build runs with the environment vLLM will get (so into the isolated FlashInfer
workspace, for the guarded architectures) and in its own process group, so a timeout,
Ctrl-C or SIGTERM of the launcher kills nvcc and ninja too. The launcher never imports flashinfer or torch itself.
The result is stored beside the environment key's caches (one file per key) with a
fingerprint of the CUDA toolkit it used; a changed toolkit means a new test build.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

RESULT_FILE = "flashinfer_sampler_probe.json"
_TAIL_CHARS = 4000
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# Lines that name the cause of a failed nvcc/ninja build, most telling first.
_CAUSE_MARKERS = ("fatal error", "error:", "No such file", "not found", "FAILED", "Error")


@dataclass(frozen=True)
class SamplerProbe:
    """One test build's outcome. `toolchain` is the fingerprint it was made with."""

    ok: bool
    reason: str
    seconds: float
    toolchain: str
    checked_at: str
    cached: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def toolchain_fingerprint(env: Mapping[str, str], nvcc_path: str | None, nvcc_version: str | None) -> str:
    """What decides whether the build can work, beyond the environment key: the CUDA toolkit."""
    return "|".join([f"nvcc={nvcc_path or 'none'}", f"release={nvcc_version or 'none'}",
                     f"CUDA_HOME={env.get('CUDA_HOME', '')}",
                     f"arch={env.get('FLASHINFER_CUDA_ARCH_LIST', '')}"])


def read_cached(keydir_path: Path, fingerprint: str) -> SamplerProbe | None:
    """The stored result for this key and toolchain; None when absent, corrupt or for another toolchain."""
    try:
        data = json.loads((keydir_path / RESULT_FILE).read_text(encoding="utf-8"))
        result = SamplerProbe(ok=bool(data["ok"]), reason=str(data["reason"]), seconds=float(data["seconds"]),
                              toolchain=str(data["toolchain"]), checked_at=str(data["checked_at"]), cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return result if result.toolchain == fingerprint else None


def store(keydir_path: Path, result: SamplerProbe) -> None:
    """Write the result atomically (temporary file + rename), so concurrent launches never see half."""
    data = result.to_dict()
    data.pop("cached")
    fd, tmp = tempfile.mkstemp(dir=keydir_path, prefix=f".{RESULT_FILE}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, keydir_path / RESULT_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _cause(output: str) -> str:
    """The most telling line of a failed build's output."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for marker in _CAUSE_MARKERS:
        for ln in lines:
            if marker in ln:
                return ln[:300]
    return lines[-1][:300] if lines else "no output"


class _Terminated(BaseException):
    """SIGTERM arrived during the test build (BaseException: no `except Exception` swallows it)."""


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that asks Linux to SIGKILL the child when the launcher dies (even by SIGKILL);
    None where prctl is unavailable. libc is loaded here, before the fork."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)
    return preexec


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated()


def run_probe(env: Mapping[str, str], timeout_s: int, fingerprint: str,
              python: str = sys.executable) -> SamplerProbe:
    """Build FlashInfer's sampling module in a child process with `env`; never raises, except
    that Ctrl-C (KeyboardInterrupt) and SIGTERM end the build first and then go on as usual.

    The child runs in its own process group, so a timeout, Ctrl-C or SIGTERM of the launcher
    kills nvcc and ninja too; and it dies with the launcher even when that is SIGKILLed.
    """
    start = time.monotonic()
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")

    def result(ok: bool, reason: str) -> SamplerProbe:
        return SamplerProbe(ok, reason, round(time.monotonic() - start, 1), fingerprint, now)

    # SIGTERM's default action would end us without a chance to kill the build: raise instead
    # (only from the main thread, where Python delivers signals; an ignored SIGTERM stays ignored).
    old_term = None
    if threading.current_thread() is threading.main_thread():
        old_term = signal.getsignal(signal.SIGTERM)
        if old_term is signal.SIG_IGN:
            old_term = None
        else:
            signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        try:
            proc = subprocess.Popen([python, "-m", __name__], env=dict(env), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                    process_group=0, preexec_fn=_die_with_parent())
        except OSError as err:
            return result(False, f"cannot start {python}: {err.strerror or err}")
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return result(False, f"no result within {timeout_s} s (CAOVAN_PROBE_TIMEOUT_S)")
        except BaseException:  # Ctrl-C, SIGTERM: the build must not outlive us
            _kill_group(proc)
            raise
    except _Terminated:
        signal.signal(signal.SIGTERM, old_term)
        old_term = None
        signal.raise_signal(signal.SIGTERM)  # as if it arrived now: the old handler (or death) decides
        raise KeyboardInterrupt from None  # the handler returned: still no result to keep
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    if proc.returncode == 0 and "CAOVAN-PROBE-OK" in out:
        return result(True, "sampling module built")
    return result(False, _cause(out[-_TAIL_CHARS:]))


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the child's whole process group (the build's compilers too) and reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.kill()  # no-op when already dead; covers a group that was already gone
    proc.communicate()


def _child() -> int:
    """In the child: build (not load: loading could touch the GPU) FlashInfer's sampling module."""
    from flashinfer.jit.sampling import gen_sampling_module

    spec = gen_sampling_module()
    if not spec.is_aot:
        spec.build(verbose=False)
    print("CAOVAN-PROBE-OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child())
