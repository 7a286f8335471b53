"""A launch over several machines: the command for each node, from the user's own arguments. Pure.

Two ways vLLM spans nodes (read in 0.21.0's arg_utils.py and executors):
- `--nnodes N --node-rank R --master-addr HOST` (multiprocessing, no Ray): the same command on every
  node with its rank; nodes other than 0 run `--headless` (no API server). The world (TP x PP) must
  divide by N, and each node brings world / N GPUs.
- `--distributed-executor-backend ray`: a Ray cluster (`ray start --head` on this node, `ray start
  --address HEAD:6379` on the others), then one command on the head; vLLM places the workers.
Each node's `caovan-vllm-serve` (or our plugin in its Ray workers) plans that node itself.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from .vllm_args import LaunchNumbers, VllmArgs, canonical

RAY_PORT = 6379
HEAD_ADDRESS = "HEAD_IP"   # a placeholder the user replaces (named in the notes)
_PER_NODE = ("--node-rank", "--headless", "--master-addr")


@dataclass(frozen=True)
class NodeCommand:
    """What to run on one node, in order."""

    node: str
    commands: tuple[str, ...]


@dataclass(frozen=True)
class NodesPlan:
    """The nodes of a launch: how many, the way vLLM joins them, each one's commands, and what to know."""

    backend: str            # "mp" (--nnodes) or "ray"
    nodes: int
    gpus_per_node: int
    commands: tuple[NodeCommand, ...]
    notes: tuple[str, ...] = ()
    refusal: str | None = None

    def lines(self) -> list[str]:
        """The plan's note lines: one per node, then the notes."""
        return ([f"nodes: {n.node}: " + " ; then ".join(f"`{c}`" for c in n.commands) for n in self.commands]
                + [f"nodes: {n}" for n in self.notes])

    def to_dict(self) -> dict[str, object]:
        return {"backend": self.backend, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "commands": [{"node": n.node, "commands": list(n.commands)} for n in self.commands],
                "notes": list(self.notes), "refusal": self.refusal}


def _without_per_node(argv: tuple[str, ...]) -> list[str]:
    """The user's arguments without those that differ per node (rank, headless, master address)."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        name, eq, _ = a.partition("=")
        if canonical(name) in _PER_NODE:
            skip = not eq and canonical(name) != "--headless" and i + 1 < len(argv)
            continue
        out.append(a)
    return out


def _command(prog: str, argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in [prog, *argv])


def plan_nodes(args: VllmArgs, numbers: LaunchNumbers, visible_gpus: int, prog: str = "caovan-vllm-serve") -> NodesPlan | None:
    """The nodes' commands for a launch over several machines; None for one node (no --nnodes > 1 and no Ray)."""
    tp, pp = numbers.tensor_parallel_size or 1, numbers.pipeline_parallel_size or 1
    world = tp * pp
    ray = args.value("--distributed-executor-backend") == "ray"
    nnodes = numbers.nnodes or 1
    if not ray and nnodes <= 1:
        return None
    base = _without_per_node(args.argv)
    shape = f"TP {tp} x PP {pp} = {world} GPUs"
    if ray:
        per_node = visible_gpus or world
        nodes = max(nnodes, -(-world // per_node))
        head = NodeCommand("node 0 (this machine, Ray head)", (f"ray start --head --port {RAY_PORT}", _command(prog, base)))
        others = tuple(NodeCommand(f"node {i}", (f"ray start --address {HEAD_ADDRESS}:{RAY_PORT}",)) for i in range(1, nodes))
        notes = (f"{shape} over a Ray cluster of {nodes} node(s) with {per_node} GPU(s) each (as this one): start each "
                 "node's `ray start` where this wheel is installed; vLLM copies the head's environment to every "
                 "worker (a node's own variables win) and our plugin plans each node in its workers: its own GPUs, "
                 "stack key and caches, a warning where it differs from the head",
                 f"replace {HEAD_ADDRESS} with the address at which the other nodes reach this one")
        return NodesPlan("ray", nodes, per_node, (head, *others), notes)
    refusal = None
    if world % nnodes:
        refusal = f"--nnodes {nnodes} does not divide {shape}: vLLM needs the same number of GPUs on every node"
    elif visible_gpus and world // nnodes > visible_gpus:
        refusal = (f"--nnodes {nnodes} with {shape} needs {world // nnodes} GPUs on every node; this node has "
                   f"{visible_gpus} visible")
    master = args.value("--master-addr")
    addr = shlex.quote(master) if isinstance(master, str) else HEAD_ADDRESS
    commands = tuple(NodeCommand(f"node {r}" + (" (this machine)" if r == 0 else ""), (
        _command(prog, [*base, "--node-rank", str(r)]) + f" --master-addr {addr}"
        + (" --headless" if r else ""),)) for r in range(nnodes))
    notes = [f"{shape} over {nnodes} nodes with {world // nnodes if not world % nnodes else '?'} GPU(s) each "
             "(vLLM's multiprocessing backend): run each command on its node; every node plans itself"]
    if not master:
        notes.append(f"--master-addr not given: replace {HEAD_ADDRESS} with the address at which the other nodes reach node 0")
    return NodesPlan("mp", nnodes, world // nnodes if not world % nnodes else 0, commands, tuple(notes), refusal)
