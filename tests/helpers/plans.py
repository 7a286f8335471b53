"""A plan from facts and settings the way a launch makes one: the process's decision first
(policy.decision.decide, with the launch's --kv-cache-dtype, given or filled), then make_plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from caovan_vllm_sm75_turbo3.config import Settings
from caovan_vllm_sm75_turbo3.policy.decision import decide
from caovan_vllm_sm75_turbo3.policy.plan import FilledArg, Plan, make_plan
from caovan_vllm_sm75_turbo3.policy.vllm_args import VllmArgs
from caovan_vllm_sm75_turbo3.runtime.facts import Facts


def plan_from(facts: Facts, settings: Settings, env: Mapping[str, str], args: VllmArgs, cache: Any = None,
              sampler_probe: Any = None, filled_args: Sequence[FilledArg] = (), shape: Any = None) -> Plan:
    given = args.value("--kv-cache-dtype")
    kv = given if isinstance(given, str) else next((f.value for f in filled_args if f.flag == "--kv-cache-dtype"), None)
    return make_plan(decide(settings, facts, shape, kv), env, args, cache, sampler_probe, filled_args)
