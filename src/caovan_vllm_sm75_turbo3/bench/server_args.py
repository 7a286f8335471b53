"""The server's --max-num-seqs and CUDA-graph mode, read from the command line of the process that
listens on its port.

vLLM's HTTP API and its /metrics say neither how many sequences it schedules at once nor which
CUDA graphs it captured; on the serving machine the process that listens on the port shows what it
was asked (`vllm serve ... --max-num-seqs N --compilation-config {...}`; caovan-vllm-serve execs
vllm with its filled arguments). Only this user's processes can be read, without root.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar
from urllib.parse import urlsplit

import psutil

from .. import safe_json
from ..server_api.address import is_loopback

FLAG = "--max-num-seqs"
T = TypeVar("T")


def flag_value(cmdline: Sequence[str], flag: str = FLAG) -> int | None:
    """The whole-number value of `flag` (`--flag N` or `--flag=N`), the last one winning; None when absent."""
    value = None
    for i, arg in enumerate(cmdline):
        raw = arg[len(flag) + 1:] if arg.startswith(flag + "=") else \
            cmdline[i + 1] if arg == flag and i + 1 < len(cmdline) else None
        if raw is not None and raw.isdigit() and int(raw) > 0:
            value = int(raw)
    return value


def listeners(api_base: str) -> tuple[list[tuple[int, list[str]]], str]:
    """The (pid, command line) of each process of this user listening on the server's port, with the
    port's words for a line; ([], why not) where none can be read."""
    if not is_loopback(api_base):
        return [], "the server is on another machine"
    parts = urlsplit(api_base)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        pids = sorted({c.pid for c in psutil.net_connections(kind="tcp")
                       if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid})
        found = [(pid, psutil.Process(pid).cmdline()) for pid in pids]
    except (OSError, psutil.Error):
        return [], f"cannot read which process listens on port {port}"
    return found, (f"port {port}" if found else f"no process of this user listens on port {port}")


def _learn(api_base: str, read: Callable[[Sequence[str]], T | None], missing: str) -> tuple[T | None, str]:
    """The first listener's value that `read` finds, with how it was learned; (None, why not)."""
    found, where = listeners(api_base)
    if not found:
        return None, where
    for pid, cmdline in found:
        value = read(cmdline)
        if value is not None:
            return value, f"from the command line of process {pid}, which listens on {where}"
    return None, f"the process listening on {where} {missing}"


def learn_max_num_seqs(api_base: str) -> tuple[int | None, str]:
    """(max-num-seqs, how it was learned) or (None, why not)."""
    return _learn(api_base, flag_value, f"does not set {FLAG} (vLLM's default applies)")


COMPILATION = "--compilation-config"


def cudagraph_mode(cmdline: Sequence[str]) -> str | None:
    """The CUDA-graph mode the command line asks for (`--compilation-config` as JSON or with
    `=`, its `.cudagraph_mode` / `-O.cudagraph_mode` form, `--enforce-eager`: NONE); the last wins;
    None where it asks none (vLLM's default for its release and backend applies)."""
    mode = None
    for i, arg in enumerate(cmdline):
        nxt = cmdline[i + 1] if i + 1 < len(cmdline) else None
        key, eq, inline = arg.partition("=")
        value = inline if eq else nxt
        if arg == "--enforce-eager":
            mode = "NONE"
        elif key == COMPILATION and value is not None:
            try:
                got = safe_json.loads(value)   # another process's text: bounded nesting
            except ValueError:   # safe_json.BadJson is one
                continue
            if isinstance(got, dict) and isinstance(got.get("cudagraph_mode"), str):
                mode = got["cudagraph_mode"].upper()
        elif key in (COMPILATION + ".cudagraph_mode", "-O.cudagraph_mode") and value:
            mode = value.upper()
    return mode


def learn_cudagraph_mode(api_base: str) -> tuple[str | None, str]:
    """(the CUDA-graph mode the server was asked for, how it was learned) or (None, why not)."""
    mode, how = _learn(api_base, cudagraph_mode, "asks for no CUDA-graph mode (vLLM's default for its release and "
                       "attention backend applies)")
    return mode, how + (" (as asked: vLLM may lower it for an attention backend)" if mode else "")
