"""A running Ray cluster's nodes, as `caovan-sm75-doctor --ray` shows them. Read-only: connects to a
cluster that is already running (never starts one), in a child process with a wall-clock limit
(ray.init can wait long on an address nothing answers at), and never raises."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass, field

RAY_TIMEOUT_S = 60.0
_CHILD = """
import json, sys
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False, include_dashboard=False)
try:
    print("NODES " + json.dumps(ray.nodes()))
finally:
    ray.shutdown()
"""


@dataclass(frozen=True)
class RayNode:
    """One node of the cluster as Ray reports it: its GPUs are Ray's count and accelerator type."""

    node_id: str
    address: str
    alive: bool
    gpus: float
    accelerator: str | None
    cpus: float

    def to_dict(self) -> dict[str, object]:
        return {"node_id": self.node_id, "address": self.address, "alive": self.alive, "gpus": self.gpus,
                "accelerator": self.accelerator, "cpus": self.cpus}


@dataclass(frozen=True)
class RayCluster:
    """The cluster at `address`, or why it could not be read (`error`)."""

    address: str
    nodes: tuple[RayNode, ...] = ()
    error: str | None = None
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, object]:
        return {"address": self.address, "nodes": [n.to_dict() for n in self.nodes], "error": self.error}


def _node(raw: dict) -> RayNode:
    res = raw.get("Resources") or {}
    accel = next((k.removeprefix("accelerator_type:") for k in res if k.startswith("accelerator_type:")), None)
    return RayNode(str(raw.get("NodeID", "")), str(raw.get("NodeManagerAddress", "")), bool(raw.get("Alive")),
                   float(res.get("GPU", 0)), accel, float(res.get("CPU", 0)))


def read_cluster(address: str = "auto", timeout_s: float = RAY_TIMEOUT_S) -> RayCluster:
    """The nodes of the Ray cluster at `address` ('auto': the one this machine is part of)."""
    if importlib.util.find_spec("ray") is None:
        return RayCluster(address, error="Ray is not installed here (pip install ray: vLLM's Ray executor needs it)")
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD, address], capture_output=True, text=True,
                           timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return RayCluster(address, error=f"no answer from a Ray cluster at {address} within {timeout_s:g} s")
    except OSError as err:
        return RayCluster(address, error=f"cannot run Python to ask Ray: {err}")
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("NODES ")), None)
    if r.returncode != 0 or line is None:
        last = next((ln for ln in reversed(r.stderr.strip().splitlines()) if ln.strip()), "no output")
        return RayCluster(address, error=f"no Ray cluster at {address}: {last[:300]}")
    try:
        nodes = tuple(_node(n) for n in json.loads(line[len("NODES "):]) if isinstance(n, dict))
    except (ValueError, TypeError) as err:
        return RayCluster(address, error=f"Ray answered something unreadable: {err}")
    return RayCluster(address, nodes)
