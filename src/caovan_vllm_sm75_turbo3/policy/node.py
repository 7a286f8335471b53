"""Several machines: what the head planned, as data every node can read, and one node's
check against it. Pure.

vLLM's Ray executor copies the head's environment to the workers on every node with `setdefault`
(vllm/v1/executor/ray_executor_v2.py `initialize_worker`, read in 0.21.0; a node's own values win),
so the first process writes a summary of its plan (`HEAD_VAR`, by launch.apply_env) and a Ray worker
on any node compares its own facts and plan with it: the node, its GPUs, `sm75=N/M`, its stack key and
cache directory in one line; a node whose GPUs or stack (CUDA, torch, Triton, vLLM) differ is a
warning with the fix, and a refusal under require-turbo3.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from ..runtime.facts import Facts

# Our process marks (the first process's mark, the head's plan) start with this; not CAOVAN_* settings.
MARK_PREFIX = "_CAOVAN_"
HEAD_VAR = MARK_PREFIX + "HEAD"   # the head's plan, for the other nodes
STACK = ("cuda", "torch", "triton", "vllm")


@dataclass(frozen=True)
class NodeSummary:
    """One node's plan, short: which GPUs, which stack, which cache key and directory, and the
    variables the plan set there (`set`: name -> value)."""

    node: str
    gpus: tuple[str, ...]
    sm75: str
    stack: dict[str, str | None]
    key: str | None = None
    cache: str | None = None
    set: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> NodeSummary | None:
        """The summary in `text`; None when it is not one (another plugin version, a damaged value)."""
        try:
            d = json.loads(text)
            return cls(str(d["node"]), tuple(str(g) for g in d["gpus"]), str(d["sm75"]),
                       {k: d["stack"].get(k) for k in STACK}, d.get("key"), d.get("cache"),
                       {str(k): str(v) for k, v in d.get("set", {}).items()})
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def line(self) -> str:
        """'node NAME: GPUs ..., sm75=N/M, key=..., cache=...': what a node says of itself."""
        return (f"node {self.node}: GPUs {self.describe_gpus()}, sm75={self.sm75}, key={self.key or 'none'}, "
                f"cache={self.cache or 'none'}")

    def describe_gpus(self) -> str:
        """'2 x NVIDIA GeForce RTX 2080 Ti (sm_75)', or 'no GPU'."""
        if not self.gpus:
            return "no GPU"
        kinds = sorted(set(self.gpus))
        return ", ".join(f"{self.gpus.count(k)} x {k}" for k in kinds)


def summarise(node: str, facts: Facts, key: str | None, cache: str | None, set_vars: Mapping[str, str]) -> NodeSummary:
    """This node's summary from its facts and its plan's cache key, directory and variables."""
    gpus = tuple(f"{g.name or 'unknown GPU'} (sm_{g.sm or '?'})" for g in facts.gpus)
    v = facts.versions
    return NodeSummary(node, gpus, f"{facts.sm75_count}/{len(facts.gpus)}",
                       {"cuda": v.torch_cuda, "torch": v.torch, "triton": v.triton, "vllm": v.vllm},
                       key, cache, dict(set_vars))


@dataclass(frozen=True)
class NodeCheck:
    """The node's one line, whether it differs from the head, and the refusal require-turbo3 makes of it."""

    line: str
    differs: bool
    refusal: str | None = None


def differences(head: NodeSummary, here: NodeSummary) -> list[str]:
    """What differs between the head and this node, one clause each ('GPUs: head ..., here ...')."""
    out = []
    if sorted(head.gpus) != sorted(here.gpus):
        out.append(f"GPUs: head {head.describe_gpus()}, here {here.describe_gpus()}")
    out += [f"{name}: head {head.stack.get(name) or 'none'}, here {here.stack.get(name) or 'none'}"
            for name in STACK if head.stack.get(name) != here.stack.get(name)]
    return out


def _fix(head: NodeSummary, diffs: list[str]) -> str:
    pins = " ".join(f"{p}=={head.stack[n]}" for n, p in (("torch", "torch"), ("triton", "triton"), ("vllm", "vllm"))
                    if head.stack.get(n))
    parts = []
    if any(d.startswith("GPUs") for d in diffs):
        parts.append("give every node the head's GPU model (our kernels and the guards are planned per GPU "
                     "architecture), or leave this node out")
    if any(not d.startswith("GPUs") for d in diffs):
        parts.append(f"install the head's stack on this node ({pins or 'the same versions'}, a torch built for CUDA "
                     f"{head.stack.get('cuda') or 'as the head'}): tensor and pipeline parallel across different "
                     "stacks fail or compute differently")
    return "; ".join(parts)


def check_node(head: NodeSummary, here: NodeSummary, require_turbo3: bool, where: str) -> NodeCheck:
    """Compare this node with the head (`where` names the require-turbo3 setting's source)."""
    line = here.line()
    diffs = differences(head, here)
    if not diffs:
        return NodeCheck(f"{line}: same GPUs and stack as the head ({head.node})", False)
    why = f"differs from the head ({head.node}): " + "; ".join(diffs)
    refusal = None
    if require_turbo3:
        refusal = (f"require-turbo3 ({where}) is on, but node {here.node} {why}. Fix: {_fix(head, diffs)}.")
    return NodeCheck(f"{line}: {why}. Fix: {_fix(head, diffs)}", True, refusal)
