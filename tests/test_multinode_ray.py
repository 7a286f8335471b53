"""Several nodes for real (issue 40): a Ray cluster of two raylets on this machine with different
environments (node 2: another HOME and cache root, a facts file of other GPUs), the head's vLLM
process planning first, and vLLM-style Ray workers on both nodes.

vLLM's CPU build cannot run its Ray executor here (the CPU platform has no Ray device key), so the
workers are started the way vLLM 0.21-0.34's RayExecutorV2 starts them (ray_executor_v2.py): an actor
per worker, the driver's environment (`vllm.v1.executor.ray_env_utils.get_driver_env_vars`) applied
with `setdefault` in `initialize_worker`, then `WorkerWrapperBase.init_worker` loading the general
plugins with the VllmConfig in hand. Runs in the serve lane (vLLM's CPU build and Ray installed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers.facts import EXAMPLES, T4, facts_dict

pytestmark = pytest.mark.serve

DRIVER = textwrap.dedent("""
    import json, logging, os, sys
    import ray
    from ray.cluster_utils import Cluster

    records = []
    class Keep(logging.Handler):
        def emit(self, record): records.append(record.getMessage())
    log = logging.getLogger("caovan_vllm_sm75_turbo3"); log.addHandler(Keep()); log.setLevel(logging.INFO)

    sc = json.loads(sys.argv[1])
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"head": 1}, "include_dashboard": False, "env_vars": sc["head_env"]})
    cluster.add_node(num_cpus=1, resources={"node2": 1}, env_vars=sc["node2_env"])
    cluster.wait_for_nodes()
    try:
        import subprocess
        doctor = subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.doctor", "--json", "--ray",
                                 cluster.address], capture_output=True, text=True, timeout=180)
        # The head's first vLLM process: plans, sets the environment, leaves its mark and its plan.
        os.environ.update(sc["head_env"])
        import vllm.plugins
        vllm.plugins.load_general_plugins()
        if sc["executor"] == "legacy":   # RayDistributedExecutor._init_workers_ray: named variables, overwritten
            from vllm.platforms import current_platform
            from vllm.ray.ray_env import get_env_vars_to_copy
            from vllm.v1.executor.ray_utils import WORKER_SPECIFIC_ENV_VARS
            names = get_env_vars_to_copy(exclude_vars=WORKER_SPECIFIC_ENV_VARS,
                                         additional_vars=set(current_platform.additional_env_vars))
            driver_env = {n: os.environ[n] for n in names if n in os.environ}
        else:   # RayExecutorV2: the whole environment, with setdefault
            from vllm.v1.executor.ray_env_utils import get_driver_env_vars
            driver_env = get_driver_env_vars(worker_specific_vars=set())

        ray.init(address=cluster.address, logging_level="ERROR")

        @ray.remote(num_cpus=0)
        class Worker:   # vLLM's RayWorkerProc, reduced to what touches our plugin
            def initialize_worker(self, env_vars, driver_env_vars, additional_config, executor):
                if executor == "legacy":
                    from vllm.utils.system_utils import update_environment_variables
                    update_environment_variables(driver_env_vars)   # the head's values over the node's
                else:
                    for k, v in driver_env_vars.items():
                        os.environ.setdefault(k, v)      # a node's own values win
                    os.environ.update(env_vars)
                records = []
                class Keep(logging.Handler):
                    def emit(self, record): records.append((record.levelname, record.getMessage()))
                log = logging.getLogger("caovan_vllm_sm75_turbo3"); log.addHandler(Keep()); log.setLevel(logging.INFO)
                from types import SimpleNamespace
                cfg = SimpleNamespace(additional_config=additional_config, model_config=SimpleNamespace(model="/m"),
                                      cache_config=SimpleNamespace(cache_dtype="auto"))
                # vLLM's WorkerWrapperBase.init_worker loads the plugins with `vllm_config` in its frame: a
                # function in a namespace named as its module stands for it (plugin/vllm_source.py reads it).
                scope = {"__name__": "vllm.v1.worker.worker_base"}
                exec("import vllm.plugins\\ndef init_worker(vllm_config):\\n    vllm.plugins.load_general_plugins()\\n",
                     scope)
                error = None
                try:
                    scope["init_worker"](cfg)
                except Exception as err:
                    error = f"{type(err).__name__}: {err}"
                keep = ("TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "TORCH_CUDA_ARCH_LIST", "_CAOVAN_APPLIED", "HOME",
                        "CAOVAN_FACTS", "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY")
                return {"records": records, "env": {k: os.environ.get(k) for k in keep}, "error": error,
                        "node": ray.get_runtime_context().get_node_id()}

        out = {"doctor": json.loads(doctor.stdout).get("ray"), "head_records": records,
               "head_env": {k: os.environ.get(k) for k in
               ("TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "TORCH_CUDA_ARCH_LIST",
                "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY")},
               "copied": sorted(driver_env)}
        for name, resource in (("head", "head"), ("node2", "node2")):
            w = Worker.options(resources={resource: 0.01}).remote()
            out[name] = ray.get(w.initialize_worker.remote({}, driver_env, sc["additional_config"], sc["executor"]),
                                timeout=120)
        print("OUT " + json.dumps(out))
    finally:
        ray.shutdown()
        cluster.shutdown()
""")

def _run(tmp_path, node2_facts: dict, additional_config: dict | None = None, executor: str = "v2",
         head_user: dict | None = None, node2_user: dict | None = None) -> dict:
    pytest.importorskip("ray")
    pytest.importorskip("vllm")
    facts2 = tmp_path / "node2.json"
    facts2.write_text(json.dumps(node2_facts))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CAOVAN_", "_CAOVAN", "VLLM_", "TRITON_", "TORCH"))}
    head_env = {"HOME": str(tmp_path / "head-home"), "XDG_CACHE_HOME": str(tmp_path / "head-home" / ".cache"),
                "CAOVAN_FACTS": str(EXAMPLES / "2x2080ti-22g.json"), **(head_user or {})}
    node2_env = {"HOME": str(tmp_path / "node2-home"), "XDG_CACHE_HOME": str(tmp_path / "node2-home" / ".cache"),
                 "CAOVAN_FACTS": str(facts2), **(node2_user or {})}
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = dict(base, RAY_DISABLE_USAGE_STATS="1", **head_env)
    r = subprocess.run([sys.executable, str(driver), json.dumps({
        "head_env": head_env, "node2_env": node2_env, "additional_config": additional_config or {},
        "executor": executor})],
        capture_output=True, text=True, timeout=420, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("OUT ")), None)
    assert r.returncode == 0 and line, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(line[4:])


@pytest.fixture(scope="module")
def t4_cluster(tmp_path_factory):
    """One run: node 2 has another SM75 GPU model (a T4) and another HOME: another machine."""
    tmp_path = tmp_path_factory.mktemp("ray-t4")
    return tmp_path, _run(tmp_path, facts_dict(gpus=[dict(T4, index=0)]))


def test_each_node_plans_itself_and_says_how_it_differs_from_the_head(t4_cluster):
    tmp_path, out = t4_cluster
    head_line = [m for _, m in out["head"]["records"] if " node " in m]
    node2_line = [(lvl, m) for lvl, m in out["node2"]["records"] if " node " in m]
    assert out["head"]["node"] != out["node2"]["node"]   # two raylets
    # The head's own node: the same facts, the same key and cache as the head's plan.
    assert len(head_line) == 1 and "same GPUs and stack as the head" in head_line[0], out["head"]["records"]
    assert out["head"]["env"]["TRITON_CACHE_DIR"] == out["head_env"]["TRITON_CACHE_DIR"]
    # Node 2: a warning naming the difference and the fix, and its own cache under its own HOME.
    assert len(node2_line) == 1 and node2_line[0][0] == "WARNING", out["node2"]["records"]
    text = node2_line[0][1]
    assert "differs from the head" in text and "GPUs: head 2 x NVIDIA GeForce RTX 2080 Ti (sm_75)" in text
    assert "here 1 x Tesla T4 (sm_75)" in text and "Fix: give every node the head's GPU model" in text
    for var in ("TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"):
        here, head = out["node2"]["env"][var], out["head_env"][var]
        assert here and here != head and here.startswith(str(tmp_path / "node2-home")), (var, here, head)
    assert f"cache={os.path.dirname(out['node2']['env']['TRITON_CACHE_DIR'])}" in text
    assert out["node2"]["error"] is None and out["head"]["error"] is None
    # No worker logs the head's guards as its own ("guards from ... apply in this process").
    assert not any("apply in this process" in m for _, m in out["node2"]["records"] + out["head"]["records"])


def test_a_node_without_sm75_keeps_no_path_or_arch_of_the_head(tmp_path):
    from helpers.facts import RTX3090

    out = _run(tmp_path, facts_dict(gpus=[dict(RTX3090, index=0)]))
    env = out["node2"]["env"]
    assert out["head_env"]["TORCH_CUDA_ARCH_LIST"] == "7.5"
    assert env["TORCH_CUDA_ARCH_LIST"] is None and env["TRITON_CACHE_DIR"] is None   # nothing of ours applies there
    [(level, text)] = [(lvl, m) for lvl, m in out["node2"]["records"] if " node " in m]
    assert level == "WARNING" and "sm75=0/1" in text and "sm_86" in text


def test_doctor_lists_the_clusters_nodes(t4_cluster):
    _, out = t4_cluster
    ray = out["doctor"]
    assert ray["error"] is None and len(ray["nodes"]) == 2, ray
    assert all(n["alive"] and n["cpus"] == 1 for n in ray["nodes"])
    assert {n["node_id"] for n in ray["nodes"]} == {out["head"]["node"], out["node2"]["node"]}


def test_under_the_older_ray_executor_node2_still_plans_itself_with_its_own_values(tmp_path):
    """VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0 (vLLM 0.21-0.32): the executor copies only the variables vLLM's own
    get_env_vars_to_copy names, over the worker's. Our plan adds our prefixes to them; node 2 plans itself,
    and its own VLLM_CACHE_ROOT and CAOVAN_FACTS win over the head's copies."""
    out = _run(tmp_path, facts_dict(gpus=[dict(T4, index=0)]), executor="legacy",
               head_user={"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0"},
               node2_user={"VLLM_CACHE_ROOT": str(tmp_path / "node2-own-vllm")})
    assert out["head_env"]["VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"] == "CAOVAN_,_CAOVAN_"
    assert {"_CAOVAN_HEAD", "_CAOVAN_APPLIED", "CAOVAN_FACTS", "VLLM_CACHE_ROOT"} <= set(out["copied"])
    assert "TRITON_CACHE_DIR" not in out["copied"]   # what the older executor leaves out
    node2 = out["node2"]
    assert node2["error"] is None, node2
    [(level, text)] = [(lvl, m) for lvl, m in node2["records"] if " node " in m]
    assert level == "WARNING" and "here 1 x Tesla T4 (sm_75)" in text
    assert node2["env"]["VLLM_CACHE_ROOT"] == str(tmp_path / "node2-own-vllm")
    assert node2["env"]["CAOVAN_FACTS"] == str(tmp_path / "node2.json")
    assert any("this node's own CAOVAN_FACTS kept over the head's" in m for _, m in node2["records"])
    assert node2["env"]["TRITON_CACHE_DIR"].startswith(str(tmp_path / "node2-home"))
    [head_line] = [m for _, m in out["head"]["records"] if " node " in m]
    assert "same GPUs and stack as the head" in head_line
