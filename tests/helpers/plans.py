"""A plan from facts and settings the way a launch makes one: the process's decision first
(policy.decision.decide, with the launch's --kv-cache-dtype, given or filled), then make_plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from caovan_vllm_sm75_turbo3.config import Settings
from caovan_vllm_sm75_turbo3.policy.decision import decide
from caovan_vllm_sm75_turbo3.policy.fill_base import FilledArg, LaunchFill
from caovan_vllm_sm75_turbo3.policy.plan import Plan, make_plan
from caovan_vllm_sm75_turbo3.policy.vllm_args import VllmArgs
from caovan_vllm_sm75_turbo3.runtime.facts import Facts


def plan_from(facts: Facts, settings: Settings, env: Mapping[str, str], args: VllmArgs, cache: Any = None,
              sampler_probe: Any = None, filled_args: Sequence[FilledArg] = (), shape: Any = None) -> Plan:
    given = args.value("--kv-cache-dtype")
    kv = given if isinstance(given, str) else next((f.value for f in filled_args if f.flag == "--kv-cache-dtype"), None)
    fill = LaunchFill("test", tuple(filled_args)) if filled_args else None
    return make_plan(decide(settings, facts, shape, kv), env, args, cache, sampler_probe, fill=fill)


def plan_here(env: Mapping[str, str], args: VllmArgs, *, write: bool) -> Any:
    """A vLLM process's plan where no process context made the decision: the launch's own inputs decide
    (launch.decide_launch), then launch.plan_in_process."""
    from caovan_vllm_sm75_turbo3.launch import decide_launch, plan_in_process

    return plan_in_process(env, args, decide_launch(env, args), write=write)
