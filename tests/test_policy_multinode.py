"""Planning a launch over several machines (issue 40): each node's command, the refusals vLLM would
make later, memory per pipeline stage, and MTP with pipeline parallel."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

from helpers.facts import EXAMPLES, ROOT

from caovan_vllm_sm75_turbo3.launch import plan_for_launcher, read_args
from helpers.plans import plan_here
from caovan_vllm_sm75_turbo3.policy.memory_plan import MemoryInputs, plan_memory, stage_layers
from caovan_vllm_sm75_turbo3.policy.multinode import HEAD_ADDRESS, plan_nodes
from caovan_vllm_sm75_turbo3.policy.vllm_args import check_launch_args, read_vllm_args
from caovan_vllm_sm75_turbo3.runtime.model import model_shape, read_model

QWEN = str(ROOT / "examples" / "models" / "qwen3.6-27b-awq")
FACTS = str(EXAMPLES / "2x2080ti-22g.json")


def _nodes(*argv: str, gpus: int = 2):
    args = read_vllm_args(["/m", *argv])
    return plan_nodes(args, check_launch_args(args, gpus).numbers, gpus)


def test_one_node_has_no_node_plan():
    assert _nodes("-tp", "2") is None and _nodes("--nnodes", "1") is None


def test_nnodes_gives_each_node_its_rank_and_the_others_run_headless():
    plan = _nodes("-tp", "2", "-pp", "2", "--nnodes", "2", "--node-rank", "1", "--headless", "--max-model-len", "8k")
    assert plan.backend == "mp" and plan.nodes == 2 and plan.gpus_per_node == 2 and plan.refusal is None
    zero, one = (shlex.split(n.commands[0]) for n in plan.commands)
    assert zero[:2] == ["caovan-vllm-serve", "/m"] and "--headless" not in zero
    assert zero[zero.index("--node-rank") + 1] == "0" and one[one.index("--node-rank") + 1] == "1"
    assert one[-1] == "--headless" and zero.count("--node-rank") == one.count("--node-rank") == 1
    assert "--max-model-len" in one and "8k" in one   # the user's other arguments, on every node
    assert zero[zero.index("--master-addr") + 1] == HEAD_ADDRESS and any(HEAD_ADDRESS in n for n in plan.notes)
    given = _nodes("-tp", "2", "-pp", "2", "--nnodes", "2", "--master-addr", "10.0.0.1")
    assert all("--master-addr 10.0.0.1" in n.commands[0] for n in given.commands)
    assert not any(HEAD_ADDRESS in n for n in given.notes)


def test_nnodes_that_vllm_would_refuse_are_refused_with_the_numbers():
    assert "does not divide TP 2 x PP 2 = 4 GPUs" in _nodes("-tp", "2", "-pp", "2", "--nnodes", "3").refusal
    assert "needs 4 GPUs on every node; this node has 2 visible" in _nodes(
        "-tp", "4", "-pp", "2", "--nnodes", "2").refusal


def test_ray_spans_the_cluster_and_one_command_runs_on_the_head():
    args = read_vllm_args(["/m", "-tp", "2", "-pp", "2", "--distributed-executor-backend", "ray"])
    assert check_launch_args(args, 2).refusal() is None   # the cluster's GPUs count, not this node's
    alone = read_vllm_args(["/m", "-tp", "2", "-pp", "2"])
    assert "several nodes with --nnodes or --distributed-executor-backend ray" in check_launch_args(alone, 2).refusal()
    plan = plan_nodes(args, check_launch_args(args, 2).numbers, 2)
    assert plan.backend == "ray" and plan.nodes == 2
    head, other = plan.commands
    assert head.commands[0] == "ray start --head --port 6379" and head.commands[1].startswith("caovan-vllm-serve /m")
    assert other.commands == (f"ray start --address {HEAD_ADDRESS}:6379",)


def test_memory_is_planned_for_the_largest_stage():
    shape = model_shape(read_model(QWEN).config)
    base = MemoryInputs(gpu_memory_mib=22528, tensor_parallel=2, gpu_memory_utilization=0.9,
                        weights_bytes=20 * 2**30, headroom_mib=2048, kv_cache_bytes=1, max_num_seqs=2)
    one, two = plan_memory(shape, base), plan_memory(shape, replace(base, pipeline_parallel=2))
    assert stage_layers(shape.full_attention_layers, 2) * 2 >= shape.full_attention_layers
    assert two.kv_bytes_per_token == one.kv_bytes_per_token * stage_layers(shape.full_attention_layers, 2) // \
        shape.full_attention_layers
    assert two.state_bytes_per_seq < one.state_bytes_per_seq and two.free_mib > one.free_mib
    assert any("/ TP 2 x PP 2" in ln for ln in two.lines) and (two.max_model_len or 0) >= (one.max_model_len or 0)


def test_mtp_is_not_filled_with_pipeline_parallel_and_a_given_one_is_expected_to_fail(tmp_path):
    env = {"CAOVAN_FACTS": FACTS, "XDG_CACHE_HOME": str(tmp_path)}
    plan = plan_for_launcher(env, read_args([QWEN, "-tp", "2", "-pp", "2", "--nnodes", "2"]), write=False).plan
    assert not any(f.flag == "--speculative-config" for f in plan.filled_args)
    assert any("speculative: none: MTP with --pipeline-parallel-size 2" in n for n in plan.notes)
    assert plan.nodes is not None and json.loads(json.dumps(plan.to_dict()))["nodes"]["nodes"] == 2
    given = plan_for_launcher(env, read_args([QWEN, "-tp", "2", "-pp", "2", "--nnodes", "2", "--speculative-config",
                                        '{"method":"mtp","num_speculative_tokens":3}']), write=False).plan
    assert any(f.startswith("upstream bug mtp-pipeline-parallel-refused") for f in given.failures)
    tp_only = plan_for_launcher(env, read_args([QWEN, "-tp", "2"]), write=False).plan
    assert any(f.flag == "--speculative-config" for f in tp_only.filled_args)   # MTP stays where it starts
    assert not any("mtp-pipeline-parallel" in w for w in (*tp_only.failures, *tp_only.warnings))


def test_each_node_of_a_multinode_launch_names_itself_in_its_banner(tmp_path):
    env = {"CAOVAN_FACTS": FACTS, "XDG_CACHE_HOME": str(tmp_path)}
    spans = plan_here(env, read_args([QWEN, "-tp", "2", "--nnodes", "2", "--node-rank", "1"]), write=False).plan
    [line] = [n for n in spans.notes if n.startswith("node ")]
    assert "GPUs 2 x NVIDIA GeForce RTX 2080 Ti (sm_75), sm75=2/2, key=p" in line and f"cache={tmp_path}" in line
    alone = plan_here(env, read_args([QWEN, "-tp", "2"]), write=False).plan
    assert not any(n.startswith("node ") for n in alone.notes)
