"""A worker on another node checks itself against the head's plan (issue 40): the summary the head
leaves, the comparison, and the corrections a worker makes to the environment it inherited."""

from __future__ import annotations

import json

import pytest
from helpers.facts import EXAMPLES, RTX3090, T4, facts_dict

from caovan_vllm_sm75_turbo3.errors import Turbo3Refused
from caovan_vllm_sm75_turbo3.launch import APPLIED_MARK, apply_env, head_summary, plan_in_process
from helpers.plans import plan_here
from caovan_vllm_sm75_turbo3.logformat import NODE_LINE
from caovan_vllm_sm75_turbo3.plugin import context as context_mod
from caovan_vllm_sm75_turbo3.plugin.context import ProcessContext
from caovan_vllm_sm75_turbo3.plugin.node_check import inherited, keep_own_settings, plan_this_node, read_head
from caovan_vllm_sm75_turbo3.policy.guards import RAY_PREFIXES_VAR
from caovan_vllm_sm75_turbo3.policy.node import HEAD_VAR, NodeSummary, check_node, differences
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args

HEAD_FACTS = str(EXAMPLES / "2x2080ti-22g.json")


@pytest.fixture(autouse=True)
def _versions(monkeypatch):
    monkeypatch.setattr(context_mod, "vllm_version", lambda: "0.21.0")
    monkeypatch.setattr(context_mod, "dist_version", lambda n: {"triton": "3.6.0", "torch": "2.11.0"}.get(n))


def _summary(**kw) -> NodeSummary:
    base = dict(node="a", gpus=("NVIDIA GeForce RTX 2080 Ti (sm_75)",) * 2, sm75="2/2",
                stack={"cuda": "13.0", "torch": "2.11.0", "triton": "3.6.0", "vllm": "0.21.0"}, key="k1", cache="/c/k1",
                set={"TRITON_CACHE_DIR": "/c/k1/triton"})
    return NodeSummary(**{**base, **kw})


def test_the_summary_survives_the_environment_and_garbage_is_not_one():
    s = _summary()
    assert NodeSummary.from_json(s.to_json()) == s
    for bad in ("", "{", "[]", '{"node": 1}', json.dumps({"node": "a", "gpus": 3, "sm75": "1/1", "stack": {}})):
        assert NodeSummary.from_json(bad) is None, bad


def test_each_difference_is_named_with_both_sides():
    head = _summary()
    same = _summary(node="b", key="k1", cache="/other/k1")   # another machine, same GPUs and stack
    assert differences(head, same) == []
    other = _summary(node="b", gpus=("Tesla T4 (sm_75)",), stack={**head.stack, "torch": "2.10.0", "vllm": None})
    assert differences(head, other) == [
        "GPUs: head 2 x NVIDIA GeForce RTX 2080 Ti (sm_75), here 1 x Tesla T4 (sm_75)",
        "torch: head 2.11.0, here 2.10.0", "vllm: head 0.21.0, here none"]


def test_a_differing_node_is_a_warning_with_the_fix_and_a_refusal_under_require_turbo3():
    head, here = _summary(), _summary(node="b", stack={**_summary().stack, "triton": "3.7.1"})
    ok = check_node(head, _summary(node="b"), True, "env CAOVAN_REQUIRE_TURBO3")
    assert not ok.differs and ok.refusal is None and ok.line.endswith("same GPUs and stack as the head (a)")
    assert ok.line.startswith("node b: GPUs 2 x NVIDIA GeForce RTX 2080 Ti (sm_75), sm75=2/2, key=k1, cache=/c/k1")
    warn = check_node(head, here, False, "default")
    assert warn.differs and warn.refusal is None
    assert "triton: head 3.6.0, here 3.7.1" in warn.line and "torch==2.11.0 triton==3.6.0 vllm==0.21.0" in warn.line
    refused = check_node(head, here, True, "env CAOVAN_REQUIRE_TURBO3")
    assert refused.refusal.startswith("require-turbo3 (env CAOVAN_REQUIRE_TURBO3) is on, but node b differs")
    assert NODE_LINE.match("Caovan SM75 Turbo3 " + warn.line)


def _head_environ(tmp_path, **user: str) -> dict[str, str]:
    """The environment the head's first process leaves: its plan's variables, its mark, its summary."""
    env = {"CAOVAN_FACTS": HEAD_FACTS, "XDG_CACHE_HOME": str(tmp_path / "head" / ".cache"), **user}
    ctx = ProcessContext(env)
    prepared = plan_in_process(env, read_vllm_args([]), ctx.decision, write=True)
    out = dict(env)
    apply_env(prepared.plan, out, "vLLM process pid 1", head_summary(prepared, "head-host"))
    return out


def _node2(tmp_path, gpus: list[dict], own: dict[str, str], head: dict[str, str]) -> tuple[dict, dict]:
    """Node 2's raylet environment (`own`) and a worker's environment after vLLM's setdefault of the head's."""
    facts = tmp_path / "node2.json"
    facts.write_text(json.dumps(facts_dict(gpus=gpus)))
    initial = {"CAOVAN_FACTS": str(facts), "XDG_CACHE_HOME": str(tmp_path / "node2" / ".cache"), **own}
    environ = dict(initial)
    for k, v in head.items():
        environ.setdefault(k, v)
    return initial, environ


def test_a_worker_on_another_node_plans_itself_and_keeps_its_users_values(tmp_path, caplog):
    head = _head_environ(tmp_path)
    summary = read_head(head)
    assert summary is not None and summary.node == "head-host" and summary.sm75 == "2/2"
    initial, environ = _node2(tmp_path, [dict(T4, index=0)], {"VLLM_CACHE_ROOT": "/node2/own"}, head)
    assert inherited(environ, initial, summary) == set(summary.set) - {"VLLM_CACHE_ROOT"}
    with caplog.at_level("INFO", logger="caovan_vllm_sm75_turbo3"):
        line = plan_this_node(ProcessContext(environ), summary, "0123456789ab", environ, initial)
    assert environ["VLLM_CACHE_ROOT"] == "/node2/own"   # the node's own value wins, as vLLM's setdefault left it
    assert head["TRITON_CACHE_DIR"].startswith(str(tmp_path / "head"))   # the head's path, on the head's disk
    assert environ["TRITON_CACHE_DIR"].startswith(str(tmp_path / "node2"))   # this node's own
    assert "(Ray node 01234567)" in line and "differs from the head (head-host)" in line
    assert [r.levelname for r in caplog.records if r.getMessage() == line] == ["WARNING"]


def test_a_worker_without_sm75_drops_the_heads_paths_and_arch(tmp_path):
    head = _head_environ(tmp_path)
    initial, environ = _node2(tmp_path, [dict(RTX3090, index=0)], {}, head)
    plan_this_node(ProcessContext(environ), read_head(head), "n2", environ, initial)
    for var in ("TORCH_CUDA_ARCH_LIST", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"):
        assert var not in environ, var
    assert environ[APPLIED_MARK] == head[APPLIED_MARK] and environ[HEAD_VAR] == head[HEAD_VAR]


def test_require_turbo3_stops_a_worker_on_a_differing_node(tmp_path):
    head = _head_environ(tmp_path)
    initial, environ = _node2(tmp_path, [dict(T4, index=0)], {"CAOVAN_REQUIRE_TURBO3": "1"}, head)
    with pytest.raises(Turbo3Refused, match="is on, but node .* differs from the head"):
        plan_this_node(ProcessContext(environ), read_head(head), "n2", environ, initial)


def test_same_machine_same_facts_is_the_head(tmp_path):
    head = _head_environ(tmp_path)
    environ, initial = dict(head), {k: v for k, v in head.items() if k in ("CAOVAN_FACTS", "XDG_CACHE_HOME")}
    line = plan_this_node(ProcessContext(environ), read_head(head), "n1", environ, initial)
    assert "same GPUs and stack as the head" in line
    assert environ["TRITON_CACHE_DIR"] == head["TRITON_CACHE_DIR"]


def test_under_the_older_executor_a_node_gets_back_what_the_heads_copy_overwrote(tmp_path, caplog):
    """RayDistributedExecutor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0) copies the prefixes it is given over the
    worker's own values: the head's plan makes it carry ours, and the node restores its own."""
    head = _head_environ(tmp_path, VLLM_USE_RAY_V2_EXECUTOR_BACKEND="0")
    prefixes = ("VLLM_", *head[RAY_PREFIXES_VAR].split(","))
    initial = _node2(tmp_path, [dict(T4, index=0)], {"VLLM_CACHE_ROOT": "/node2/own"}, {})[0]
    environ = dict(initial)
    environ.update({k: v for k, v in head.items() if k.startswith(prefixes)})   # vLLM's update_environment_variables
    assert environ["VLLM_CACHE_ROOT"] == head["VLLM_CACHE_ROOT"] and "TRITON_CACHE_DIR" not in environ
    assert environ["CAOVAN_FACTS"] == HEAD_FACTS   # the head's setting over this node's own
    with caplog.at_level("INFO", logger="caovan_vllm_sm75_turbo3"):
        assert keep_own_settings(environ, initial) == ["CAOVAN_FACTS"]
    assert environ["CAOVAN_FACTS"] == initial["CAOVAN_FACTS"]
    assert "this node's own CAOVAN_FACTS kept over the head's" in caplog.text
    assert keep_own_settings(environ, initial) == [] and keep_own_settings(environ, None) == []
    v2 = {**environ, "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "1"}
    no_head = {k: v for k, v in environ.items() if k != HEAD_VAR}
    for other in (v2, no_head):
        other["CAOVAN_FACTS"] = "/changed/in/process"   # not the older executor's copy: the process's own doing
        assert keep_own_settings(other, initial) == [] and other["CAOVAN_FACTS"] == "/changed/in/process"
    summary = read_head(environ)
    assert summary is not None and inherited(environ, initial, summary) >= {"VLLM_CACHE_ROOT", RAY_PREFIXES_VAR}
    with caplog.at_level("INFO", logger="caovan_vllm_sm75_turbo3"):
        line = plan_this_node(ProcessContext(environ), summary, "n2", environ, initial)
    assert environ["VLLM_CACHE_ROOT"] == "/node2/own"   # this node's user's value, not the head's path
    assert environ["TRITON_CACHE_DIR"].startswith(str(tmp_path / "node2"))
    assert environ[RAY_PREFIXES_VAR] == head[RAY_PREFIXES_VAR]
    assert "differs from the head" in line
