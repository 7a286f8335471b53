"""The launch plan's JIT-cache isolation: the key directory follows every component version,
concurrent launches share one valid manifest, and the in-process env reading ignores torch's default."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest
from helpers.facts import facts_dict
from helpers.plans import plan_here

from caovan_vllm_sm75_turbo3.caches.layout import read_manifest
from caovan_vllm_sm75_turbo3.plugin.register import user_env
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args

ARGS = read_vllm_args(["/m"])


def _cache_key(tmp_path: Path, name: str, **changes) -> str:
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps(facts_dict(**changes)))
    plan = plan_here({"HOME": str(tmp_path / "h"), "CAOVAN_FACTS": str(f)}, ARGS, write=False).plan
    return plan.status["cache_key"]


@pytest.mark.parametrize("field,value", [
    ("python", "3.10.14"), ("torch", "2.10.0"), ("torch_cuda", "12.8"), ("triton", "3.5.0"),
    ("vllm", "0.22.0"), ("flashinfer", "0.6.9")])
def test_cache_dir_changes_with_each_component(tmp_path, field, value):
    base = _cache_key(tmp_path, "base")
    assert _cache_key(tmp_path, "same", host={"memory_total_mib": 131072}) == base  # not a component
    assert _cache_key(tmp_path, "changed", versions={field: value}) != base


def test_cache_dir_changes_with_the_gpu_arch(tmp_path):
    base = _cache_key(tmp_path, "base")
    mixed = _cache_key(tmp_path, "mixed", gpus=[
        {"index": 0, "name": "2080 Ti", "compute_capability": "7.5"},
        {"index": 1, "name": "3090", "compute_capability": "8.6"}])
    assert mixed != base and "-sm75+sm86-" in mixed


def _launch_plans(args: tuple[str, str, int, object]) -> list[str]:
    home, facts, rounds, barrier = args
    barrier.wait(timeout=60)
    seen = []
    for _ in range(rounds):
        p = plan_here({"HOME": home, "CAOVAN_FACTS": facts}, ARGS, write=True)
        seen.append(str(p.keydir.path))
    return seen


def test_concurrent_launch_plans_share_one_valid_manifest(tmp_path):
    facts = tmp_path / "f.json"
    facts.write_text(json.dumps(facts_dict()))
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(2)
        with ctx.Pool(2) as pool:
            results = pool.map(_launch_plans, [(str(tmp_path / "home"), str(facts), 15, barrier)] * 2)
    assert [len(r) for r in results] == [15, 15]
    paths = {p for r in results for p in r}
    assert len(paths) == 1
    keydir = Path(paths.pop())
    manifest = read_manifest(keydir)
    assert manifest is not None and manifest["key"] == keydir.name
    assert manifest["created"] <= manifest["last_used"]
    assert not list(keydir.glob(".manifest.json.*.tmp"))  # no half-written leftovers


def test_torch_default_inside_vllm_is_not_taken_for_the_users_choice():
    now = {"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_me", "VLLM_RPC_TIMEOUT": "5"}
    assert user_env(now, {"VLLM_RPC_TIMEOUT": "5"}) == {"VLLM_RPC_TIMEOUT": "5"}
    assert user_env(now, dict(now)) == now  # the user set it before start: kept
    assert user_env(now, None) == now  # unknown start environment: keep everything
