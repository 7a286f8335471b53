"""Whether register() installs the Turbo hook, and how one check row is judged. Pure."""

from __future__ import annotations

import pytest

from caovan_vllm_sm75_turbo3.config import load_settings
from caovan_vllm_sm75_turbo3.policy.turbo import decide_turbo, judge_turbo_build
from caovan_vllm_sm75_turbo3.runtime.facts import Facts

from conftest import RTX3090, TI22, facts_dict


def _facts(gpus=None) -> Facts:
    return Facts.from_dict(facts_dict(**({"gpus": gpus} if gpus is not None else {})))


@pytest.mark.parametrize("env, gpus, triton, install, strict, line", [
    ({}, None, "3.6.0", True, True, "auto"),
    ({}, None, "3.6.1+git", True, True, "auto"),
    ({}, None, "3.7.0", False, True, "off-unverified-triton-3.7.0"),
    ({"CAOVAN_TURBO": "on"}, None, "3.7.0", True, False, "on-unverified-triton-3.7.0"),
    ({"CAOVAN_TURBO": "on"}, None, "3.6.0", True, False, "on"),
    ({"CAOVAN_TURBO": "off"}, None, "3.6.0", False, True, "off-by-user"),
    ({"CAOVAN_MODE": "guards"}, None, "3.6.0", False, True, "off"),
    ({}, [dict(RTX3090, index=0)], "3.6.0", False, True, "off-not-sm75"),
    ({}, [dict(RTX3090, index=0), dict(TI22, index=1)], "3.6.0", True, True, "auto"),
    ({}, None, None, False, True, "off-no-triton"),
])
def test_decide_turbo(env, gpus, triton, install, strict, line) -> None:
    d = decide_turbo(_facts(gpus), load_settings(env), triton)
    assert (d.install, d.strict, d.line) == (install, strict, line)
    assert d.reason


def test_judge_turbo_build_names_each_problem() -> None:
    assert judge_turbo_build(16384, 0, 128, 16, 4096) == []
    problems = judge_turbo_build(70000, 12, 0, 900, 4096)
    assert len(problems) == 4
    assert any("70000" in p for p in problems) and any("12 bytes" in p for p in problems)
    assert judge_turbo_build(16384, None, 8, 0, 100) == ["spills None bytes"]
