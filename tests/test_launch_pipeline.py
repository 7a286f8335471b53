"""launch.py as one pipeline: inputs -> decide -> fill -> probe -> plan, the Plan built once, behind
two entry points (the launcher, a vLLM process). Properties over the bundled facts files and
settings: the pre-plan stop rule is the plan's, each entry point builds one Plan, and both entry
points decide alike where no profile fills anything."""

from __future__ import annotations

import itertools

import pytest
from helpers.facts import EXAMPLES

from caovan_vllm_sm75_turbo3 import launch
from caovan_vllm_sm75_turbo3.policy import plan as plan_mod
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args

QWEN = str(EXAMPLES / "models" / "qwen3.6-27b-awq")
FACTS = sorted(EXAMPLES.glob("*.json"))
SETTINGS = [{}, {"CAOVAN_REQUIRE_TURBO3": "1", "CAOVAN_GDN_LEGACY_DISABLE": "1", "CAOVAN_TURBO": "off"},
            {"CAOVAN_MODE": "guards"}, {"CAOVAN_MODE": "off"}, {"CAOVAN_FLASHINFER_SAMPLER": "probe"}]


@pytest.mark.parametrize("facts,extra", list(itertools.product(FACTS, SETTINGS)),
                         ids=lambda v: getattr(v, "stem", None) or ",".join(v) or "defaults")
def test_the_pre_plan_stop_rule_is_the_plans_and_one_plan_is_built(facts, extra, tmp_path, monkeypatch):
    built = []
    real = launch.make_plan
    monkeypatch.setattr(launch, "make_plan", lambda *a, **k: built.append(1) or real(*a, **k))
    env = {"HOME": str(tmp_path), "CAOVAN_FACTS": str(facts), **extra}
    args = read_vllm_args([QWEN])
    for prepared in (launch.plan_for_launcher(env, args, write=False),
                     launch.plan_in_process(env, args, launch.decide_launch(env, args), write=False)):
        assert plan_mod.would_stop(prepared.decision, prepared.refused_args) == (prepared.plan.stop_reason() is not None)
    assert len(built) == 2


@pytest.mark.parametrize("facts", FACTS, ids=lambda p: p.stem)
def test_both_entry_points_decide_alike_where_no_profile_fills(facts, tmp_path):
    env = {"HOME": str(tmp_path), "CAOVAN_FACTS": str(facts), "CAOVAN_PROFILE": "none"}
    args = read_vllm_args([QWEN, "--kv-cache-dtype", "auto"])
    ours = launch.plan_for_launcher(env, args, write=False)
    theirs = launch.plan_in_process(env, args, launch.decide_launch(env, args), write=False)
    assert ours.decision == theirs.decision
    assert ours.plan.status == theirs.plan.status and ours.plan.env == theirs.plan.env
