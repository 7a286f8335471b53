"""vLLM's older Ray executor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0, 0.21-0.32) copies only VLLM_*-like
variables to its workers: the plan adds our prefixes to what it copies, never over the user's own list."""

from __future__ import annotations

import pytest
from helpers.facts import RTX3090, facts_dict

from caovan_vllm_sm75_turbo3.config import load_settings
from caovan_vllm_sm75_turbo3.launch import APPLIED_MARK
from caovan_vllm_sm75_turbo3.policy.banner import banner_lines
from caovan_vllm_sm75_turbo3.policy.guards import RAY_CARRIED, RAY_PREFIXES_VAR, legacy_ray_chosen
from caovan_vllm_sm75_turbo3.policy.node import HEAD_VAR
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args
from caovan_vllm_sm75_turbo3.runtime.facts import Facts
from helpers.plans import plan_from

LEGACY = {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0"}


def plan(env: dict, vllm: str = "0.27.0", gpus=None):
    f = Facts.from_dict(facts_dict(versions={"vllm": vllm}, **({"gpus": gpus} if gpus is not None else {})),
                        source="test")
    return plan_from(f, load_settings(env), env, read_vllm_args(["/m", "--distributed-executor-backend", "ray"]))


def change(p):
    return next(((c.action, c.value) for c in p.env if c.var == RAY_PREFIXES_VAR), None)


def test_our_marks_and_settings_are_what_the_prefixes_carry():
    for var in (APPLIED_MARK, HEAD_VAR, "CAOVAN_TURBO"):
        assert any(var.startswith(p) for p in RAY_CARRIED), var


@pytest.mark.parametrize("value,legacy", [("0", True), ("00", True), ("1", False), ("", False), ("no", False)])
def test_the_older_executor_is_read_as_vllm_reads_the_switch(value, legacy):
    assert legacy_ray_chosen({"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": value}) is legacy
    assert not legacy_ray_chosen({})


@pytest.mark.parametrize("vllm,expected", [("0.21.0", True), ("0.32.1", True), ("0.33.0", False), ("0.34.0", False)])
def test_set_only_where_the_older_executor_exists_and_was_chosen(vllm, expected):
    p = plan(dict(LEGACY), vllm)
    assert change(p) == (("set", ",".join(RAY_CARRIED)) if expected else None)
    assert change(plan({}, vllm)) is None   # RayExecutorV2, the default, copies the whole environment
    if expected:
        [line] = [ln for ln in banner_lines(p) if ln.startswith(f"env.{RAY_PREFIXES_VAR}=")]
        assert "older Ray executor" in line and "vLLM <=0.32" in line


def test_no_sm75_gpu_sets_nothing():
    assert change(plan(dict(LEGACY), gpus=[dict(RTX3090, index=0)])) is None


@pytest.mark.parametrize("theirs,missing", [
    ("LMCACHE_", "CAOVAN_, _CAOVAN_"), ("CAOVAN_", "_CAOVAN_"), ("CAOVAN_,_CAOVAN", None), ("C,_", None)])
def test_the_users_list_is_kept_and_what_it_lacks_is_named(theirs, missing):
    p = plan({**LEGACY, RAY_PREFIXES_VAR: theirs})
    assert change(p) == ("kept", theirs)
    warned = [w for w in p.warnings if RAY_PREFIXES_VAR in w]
    if missing is None:
        assert warned == []
    else:
        [w] = warned
        assert f"without {missing}:" in w and f"add {missing.replace(', ', ',')} to it" in w
