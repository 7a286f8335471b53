"""The one rule: our GDN prefill is in charge only where the Turbo hook gives it tensor cores."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from helpers.facts import ROOT, RTX3090, TI22, facts_dict

from caovan_vllm_sm75_turbo3.config import load_settings
from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import load_allowlist, triton_version_matches
from caovan_vllm_sm75_turbo3.plugin.dispatch.controller import turbo_problem
from caovan_vllm_sm75_turbo3.policy.decision import decide
from helpers.plans import plan_from
from caovan_vllm_sm75_turbo3.policy import vllm_versions as vv
from caovan_vllm_sm75_turbo3.policy.turbo import GDN_KERNELS, HOOK_TRITON_VERSIONS, decide_turbo
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args
from caovan_vllm_sm75_turbo3.runtime.facts import Facts

def _plan(triton: str | None, vllm: str = "0.21.0", env: dict[str, str] | None = None, gpus=None):
    data = facts_dict(versions={"triton": triton, "vllm": vllm}, **({"gpus": gpus} if gpus else {}))
    facts = Facts.from_dict(data)
    return plan_from(facts, load_settings(env or {}), env or {}, read_vllm_args(["m"]))


def test_verified_triton_puts_our_prefill_in_charge_and_says_turbo() -> None:
    plan = _plan("3.6.0")
    assert plan.status["turbo"] == "auto"
    assert plan.status["turbo3"] == "active" and plan.status["gdn_legacy"] != "upstream"
    keys = list(plan.status)
    assert keys.index("gdn_legacy") < keys.index("turbo") < keys.index("turbo3")  # the banner's order


def test_unverified_triton_keeps_vllms_prefill_with_one_line_why() -> None:
    # A Triton the hook was not verified with (3.9: no supported release pins it): no tensor cores, no claim.
    plan = _plan("3.9.0", vllm="0.33.0")
    assert plan.status["turbo"] == "off-unverified-triton-3.9.0"
    assert (plan.status["gdn_legacy"], plan.status["turbo3"]) == ("upstream", "inactive")
    why = [n for n in plan.notes if n.startswith("turbo3=inactive")]
    assert len(why) == 1 and "turbo=off-unverified-triton-3.9.0" in why[0] and "CUDA cores" in why[0]
    assert plan.refusal is None
    required = _plan("3.9.0", vllm="0.33.0", env={"CAOVAN_REQUIRE_TURBO3": "1"})
    assert required.refusal and "turbo=off-unverified-triton-3.9.0" in required.refusal


@pytest.mark.parametrize("env, triton, line", [
    ({"CAOVAN_TURBO": "off"}, "3.6.0", "off-by-user"),
    ({"CAOVAN_TURBO": "on"}, "3.9.0", "on-unverified-triton-3.9.0"),  # installed, but nothing verified there
    ({}, None, "off-no-triton"),
])
def test_no_tensor_cores_means_upstream(env, triton, line) -> None:
    plan = _plan(triton, env=env)
    assert plan.status["turbo"] == line
    assert plan.status["turbo3"] == "inactive" and plan.status["gdn_legacy"] == "upstream"


def test_forced_turbo_on_a_verified_triton_counts() -> None:
    plan = _plan("3.6.0", env={"CAOVAN_TURBO": "on"})
    assert (plan.status["turbo"], plan.status["turbo3"]) == ("on", "active")


def test_user_disable_keeps_its_own_line_and_vllms_gdn_kernels_on_tensor_cores() -> None:
    # The GDN switch for unstable machines: vLLM's own FLA kernels still get tensor cores through the hook.
    plan = _plan("3.6.0", env={"CAOVAN_GDN_LEGACY_DISABLE": "1", "CAOVAN_REQUIRE_TURBO3": "1"})
    assert (plan.status["gdn_legacy"], plan.status["turbo"], plan.status["turbo3"]) == (
        "disabled-by-user", "auto", "active")
    assert plan.refusal is None and any("vLLM 0.21.0's own FLA kernels" in n for n in plan.notes)
    off = _plan("3.6.0", env={"CAOVAN_GDN_LEGACY_DISABLE": "1", "CAOVAN_TURBO": "off", "CAOVAN_REQUIRE_TURBO3": "1"})
    assert off.status["turbo3"] == "inactive" and "CAOVAN_GDN_LEGACY_DISABLE=1" in off.refusal


def _model_plan(model: str, vllm: str, triton: str, *argv: str, env: dict[str, str] | None = None):
    from caovan_vllm_sm75_turbo3.runtime.model import model_shape, read_model
    shape = model_shape(read_model(str(ROOT / "examples" / "models" / model)).config)
    facts = Facts.from_dict(facts_dict(versions={"triton": triton, "vllm": vllm}))
    return plan_from(facts, load_settings(env or {}), env or {}, read_vllm_args(["m", *argv]), shape=shape)


def test_status_follows_the_model() -> None:
    llama = _model_plan("llama-3-8b-awq", "0.21.0", "3.6.0", env={"CAOVAN_REQUIRE_TURBO3": "1"})
    assert (llama.status["gdn_legacy"], llama.status["turbo3"]) == ("no-gdn-layers", "inactive")
    assert "has no GDN layers" in llama.refusal
    # On 0.24+ our attention backend serves fp8 KV: that is a hot path of ours for any model.
    fp8 = _model_plan("llama-3-8b-awq", "0.34.0", "3.8.0", "--kv-cache-dtype", "fp8")
    assert (fp8.status["gdn_legacy"], fp8.status["turbo3"]) == ("no-gdn-layers", "active")
    assert any(n.startswith("turbo3=active: attention: ours") for n in fp8.notes)
    qwen = _model_plan("qwen3.6-27b-awq", "0.21.0", "3.6.0")
    assert (qwen.status["gdn_legacy"], qwen.status["turbo3"]) == ("legacy-gdn-linear-attn-v020", "active")


@pytest.mark.parametrize("turbo, triton, vllm, mode, gpus", list(itertools.product(
    ("auto", "on", "off"), ("3.5.1", "3.6.0", "3.6.1+git", "3.7.0", "3.8.0", "3.9.0", None),
    ("0.21.0", "0.22.1", "0.24.0", "0.33.0", "0.34.0", "0.40.0"), ("auto", "guards"),
    ([dict(TI22, index=0), dict(TI22, index=1)], [dict(RTX3090, index=0)]))))
def test_never_claims_tensor_cores_the_hook_cannot_give(turbo, triton, vllm, mode, gpus) -> None:
    env = {"CAOVAN_TURBO": turbo, "CAOVAN_MODE": mode}
    facts = Facts.from_dict(facts_dict(versions={"triton": triton, "vllm": vllm}, gpus=gpus))
    settings = load_settings(env)
    state = decide(settings, facts).gdn
    hook = decide_turbo(facts, settings, triton)
    assert state.turbo == hook  # the plan reports the same decision register() acts on
    if state.active:
        assert hook.install and triton is not None
        assert any(triton_version_matches(triton, (v,)) for v in HOOK_TRITON_VERSIONS)
        assert state.turbo.line in ("auto", "on")


def test_every_hook_triton_is_one_our_gdn_kernels_were_verified_with() -> None:
    # A Triton the hook trusts but our kernels were never checked on would put an unverified build in charge.
    entries = {k.name: k for k in load_allowlist().kernels}
    for name in GDN_KERNELS:
        assert name in entries, name
        for version in HOOK_TRITON_VERSIONS:
            assert triton_version_matches(version + ".0", entries[name].triton_versions), (name, version)


def test_dispatch_confirms_the_rule_in_each_process() -> None:
    # Inside a vLLM process: no hook, or a build of ours that fell back, keeps vLLM's prefill.
    assert "not installed" in turbo_problem(None)
    hook = SimpleNamespace(fell_back={})
    assert turbo_problem(hook) is None
    hook.fell_back["some_fla_kernel"] = "ptxas failed"  # not ours: no reason to give ours up
    assert turbo_problem(hook) is None
    hook.fell_back[GDN_KERNELS[1]] = "shared memory 70000 > 65536"
    why = turbo_problem(hook)
    assert why and GDN_KERNELS[1] in why and "70000" in why and GDN_KERNELS[0] not in why


RELEASES = vv.all_release_pins()


def test_the_pins_cover_every_supported_minor_with_a_triton() -> None:
    minors = [vv.minor(p.vllm) for p in RELEASES]
    first, last = vv.minor_key(vv.minor(vv.SUPPORTED_MIN)), vv.minor_key(vv.SUPPORTED_MAX_MINOR)
    assert minors == [f"{a}.{b}" for a, b in sorted({vv.minor_key(m) for m in minors})]  # oldest first, no repeats
    assert (vv.minor_key(minors[0]), vv.minor_key(minors[-1])) == (first, last)
    assert len(minors) == last[1] - first[1] + 1
    assert all(p.triton_version and vv.parse(p.triton_version) for p in RELEASES)
    assert vv.release_pins("0.21.0").triton_version == "3.6.0"  # what DESIGN's facts record
    assert vv.release_pins("0.33.0+cu130").triton_version.startswith("3.8.")
    assert vv.release_pins("0.40.0") is None and vv.release_pins(None) is None


@pytest.mark.parametrize("pins", RELEASES, ids=[p.vllm for p in RELEASES])
def test_every_supported_release_with_its_own_triton_claims_only_what_the_hook_gives(pins) -> None:
    plan = _plan(pins.triton_version, vllm=pins.vllm)
    hook_trusts = any(triton_version_matches(pins.triton_version, (v,)) for v in HOOK_TRITON_VERSIONS)
    assert plan.status["turbo3"] == ("active" if hook_trusts else "inactive")
    assert plan.status["turbo"] == ("auto" if hook_trusts else f"off-unverified-triton-{pins.triton_version}")


def release_table() -> str:
    """docs/turbo.md's table of what each supported release gets, from the pins and the plan itself."""
    lines = ["| vLLM | torch | Triton | `turbo=` | `turbo3=` |", "|---|---|---|---|---|"]
    for p in RELEASES:
        status = _plan(p.triton_version, vllm=p.vllm).status
        lines.append(f"| {p.vllm} | {p.torch} | {p.triton} | `{status['turbo']}` | `{status['turbo3']}` |")
    return "\n".join(lines)


def test_turbo_doc_states_what_each_release_gets() -> None:
    doc = (ROOT / "docs" / "turbo.md").read_text(encoding="utf-8")
    got = doc.split("<!-- release-turbo:start -->\n", 1)[-1].split("\n<!-- release-turbo:end -->", 1)[0]
    assert got == release_table(), "docs/turbo.md's release table is stale; it should read:\n" + release_table()


def test_every_allowlisted_kernel_carries_its_evidence() -> None:
    # A tensor-core claim rests on recorded checks: no entry, and no source variant of one, may ship with a
    # placeholder instead ("PENDING": numbers still to be measured on a GPU).
    for entry in load_allowlist().kernels:
        holders = [(f"{entry.name}@{v.digest}", v.evidence) for v in entry.sources] or [(entry.name, entry.evidence)]
        for who, evidence in holders:
            assert {"compile", "numeric"} <= set(evidence), who
        for who, evidence in [*holders, (entry.name, entry.evidence)]:
            for key, text in evidence.items():
                assert isinstance(text, str) and text.strip(), (who, key)
                assert "TODO" not in text and "PENDING" not in text.upper(), (who, key, text)
