"""Which machine this process runs on, for the lines of a launch over several nodes. Read-only; never
imports Ray (a Ray worker process has imported it already) and never raises."""

from __future__ import annotations

import socket
import sys


def ray_worker_node() -> str | None:
    """This process's Ray node id when it is a Ray worker process (vLLM's Ray workers are), else None."""
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        context = ray.get_runtime_context()
        if context.worker.mode != 1:   # ray._private.worker.WORKER_MODE: an actor or task process, not the driver
            return None
        return str(context.get_node_id())
    except Exception:   # another Ray, half started: not a worker we can name
        return None


def node_name(ray_node: str | None = None) -> str:
    """'host' or, in a Ray worker, 'host (Ray node 1a2b3c4d)': two raylets may share a host."""
    try:
        host = socket.gethostname() or "localhost"
    except OSError:
        host = "localhost"
    return f"{host} (Ray node {ray_node[:8]})" if ray_node else host
