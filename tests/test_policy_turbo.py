"""Whether register() installs the Turbo hook, and how one check row is judged. Pure."""

from __future__ import annotations

import pytest

from caovan_vllm_sm75_turbo3.config import load_settings
from caovan_vllm_sm75_turbo3.policy.turbo import decide_turbo, judge_turbo_build
from caovan_vllm_sm75_turbo3.runtime.facts import Facts

from helpers.facts import RTX3090, TI22, facts_dict


def _facts(gpus=None) -> Facts:
    return Facts.from_dict(facts_dict(**({"gpus": gpus} if gpus is not None else {})))


@pytest.mark.parametrize("env, gpus, triton, install, strict, line", [
    ({}, None, "3.6.0", True, True, "auto"),
    ({}, None, "3.6.1+git", True, True, "auto"),
    ({}, None, "3.7.1", True, True, "auto"),
    ({}, None, "3.8.0", True, True, "auto"),
    ({}, None, "3.9.0", False, True, "off-unverified-triton-3.9.0"),
    ({"CAOVAN_TURBO": "on"}, None, "3.9.0", True, False, "on-unverified-triton-3.9.0"),
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


def test_serves_checks_each_kernel_against_its_own_allowlist_versions() -> None:
    from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import load_allowlist, triton_version_matches
    from caovan_vllm_sm75_turbo3.policy.turbo import ATTENTION_KERNELS, GDN_KERNELS, HOOK_TRITON_VERSIONS

    entries = {k.name: k for k in load_allowlist().kernels}
    for version in ("3.6.0", "3.7.1", "3.8.0", "3.9.0"):
        d = decide_turbo(_facts(), load_settings({}), version)
        assert d.triton == version
        for kernels in (GDN_KERNELS, ATTENTION_KERNELS):
            listed = all(triton_version_matches(version, entries[n].triton_versions) for n in kernels)
            hooked = any(triton_version_matches(version, (v,)) for v in HOOK_TRITON_VERSIONS)
            assert d.serves(kernels) == (listed and hooked), (version, kernels)
            if not d.serves(kernels):
                assert "was not verified with Triton" in d.not_served_reason("x") or not d.tensor_cores
    off = decide_turbo(_facts(), load_settings({"CAOVAN_TURBO": "off"}), "3.6.0")
    assert not off.serves(GDN_KERNELS) and "turbo=off-by-user" in off.not_served_reason("our GDN prefill")
    assert not decide_turbo(_facts(), load_settings({}), "3.6.0").serves(("_no_such_kernel",))
