"""The server's --max-num-seqs, read from the command line of the process that listens on its port.

vLLM's HTTP API does not say how many sequences it schedules at once; on the serving machine the
process that listens on the port does (`vllm serve ... --max-num-seqs N`; caovan-vllm-serve execs
vllm with its filled arguments). Only this user's processes can be read, without root.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

import psutil

from ..server_api.address import is_loopback

FLAG = "--max-num-seqs"


def flag_value(cmdline: Sequence[str], flag: str = FLAG) -> int | None:
    """The whole-number value of `flag` (`--flag N` or `--flag=N`), the last one winning; None when absent."""
    value = None
    for i, arg in enumerate(cmdline):
        raw = arg[len(flag) + 1:] if arg.startswith(flag + "=") else \
            cmdline[i + 1] if arg == flag and i + 1 < len(cmdline) else None
        if raw is not None and raw.isdigit() and int(raw) > 0:
            value = int(raw)
    return value


def learn_max_num_seqs(api_base: str) -> tuple[int | None, str]:
    """(max-num-seqs, how it was learned) or (None, why not)."""
    if not is_loopback(api_base):
        return None, "the server is on another machine"
    parts = urlsplit(api_base)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        pids = {c.pid for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
        for pid in sorted(pids):
            value = flag_value(psutil.Process(pid).cmdline())
            if value is not None:
                return value, f"from the command line of process {pid}, which listens on port {port}"
    except (OSError, psutil.Error):
        return None, f"cannot read which process listens on port {port}"
    if not pids:
        return None, f"no process of this user listens on port {port}"
    return None, f"the process listening on port {port} does not set {FLAG} (vLLM's default applies)"
