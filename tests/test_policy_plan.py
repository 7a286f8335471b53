"""The launch policy: version tables, user-kept values, every guard switch, refusals, the banner."""

from __future__ import annotations

import pytest
from helpers.facts import RTX3090, TI22, facts_dict

from caovan_vllm_sm75_turbo3 import __version__
from caovan_vllm_sm75_turbo3.config import load_settings
from caovan_vllm_sm75_turbo3.policy import decision as decision_module
from caovan_vllm_sm75_turbo3.policy.accel import GdnState
from caovan_vllm_sm75_turbo3.policy.turbo import TurboDecision
from caovan_vllm_sm75_turbo3.logformat import HEADER_RE
from caovan_vllm_sm75_turbo3.policy.banner import banner_lines, header
from caovan_vllm_sm75_turbo3.policy.guards import CacheState
from caovan_vllm_sm75_turbo3.policy.plan import FilledArg
from helpers.plans import plan_from
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args
from caovan_vllm_sm75_turbo3.runtime.facts import Facts
from caovan_vllm_sm75_turbo3.runtime.flashinfer_probe import SamplerProbe

ARGS = read_vllm_args(["/models/qwen", "--tensor-parallel-size", "2", "--dtype", "half"])
TIMEOUTS = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "VLLM_ENGINE_ITERATION_TIMEOUT_S", "VLLM_RPC_TIMEOUT"}
CACHE_VARS = {"TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE",
              "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH"}


def facts(**changes) -> Facts:
    return Facts.from_dict(facts_dict(**changes), source="test")


def cache_state(empty: bool = False, others: tuple[str, ...] = ()) -> CacheState:
    root = "/tmp/cc"
    return CacheState(root=root, key="k-0123456789", path=f"{root}/envs/k-0123456789",
                      env_dirs={v: f"{root}/envs/k-0123456789/{v.lower()}" for v in sorted(CACHE_VARS)},
                      empty=empty, other_keys=others)


def plan_for(f: Facts | None = None, env: dict | None = None, cache: CacheState | None = None, **kw):
    env = dict(env or {})
    return plan_from(f or facts(), load_settings(env), env, kw.pop("args", ARGS), cache, **kw)


def changes(plan) -> dict[str, tuple[str, str]]:
    return {c.var: (c.action, c.value) for c in plan.env}


# Which variables each vLLM release has (docs/design.md): RPC up to 0.22, iteration up to 0.31,
# execute in all; the FlashInfer sampler can run on SM75 only up to 0.23.
@pytest.mark.parametrize("version,timeouts,probe_status", [
    ("0.21.0", {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800", "VLLM_ENGINE_ITERATION_TIMEOUT_S": "1800",
                "VLLM_RPC_TIMEOUT": "1800000"}, "probe-pending"),
    ("0.23.1", {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800", "VLLM_ENGINE_ITERATION_TIMEOUT_S": "1800"},
     "probe-pending"),
    ("0.26.0", {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800", "VLLM_ENGINE_ITERATION_TIMEOUT_S": "1800"},
     "disabled-sm75-guard"),
    ("0.34.0", {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800"}, "disabled-sm75-guard"),
])
def test_version_table(version, timeouts, probe_status):
    f = facts(versions={"vllm": version})
    plan = plan_for(f, cache=cache_state())
    got = changes(plan)
    assert {v: val for v, (_, val) in got.items() if v in TIMEOUTS} == timeouts
    assert got["VLLM_USE_FLASHINFER_SAMPLER"] == ("set", "0")
    assert got["TORCH_CUDA_ARCH_LIST"] == ("set", "7.5") and got["FLASHINFER_CUDA_ARCH_LIST"] == ("set", "7.5")
    assert {v for v in got if v in CACHE_VARS} == CACHE_VARS
    assert plan.status["flashinfer_sampler"] == "disabled-sm75-guard"
    assert plan.status["vllm"] == version
    releases = {c.var: c.releases for c in plan.env}
    assert releases["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "all"
    if "VLLM_RPC_TIMEOUT" in releases:
        assert releases["VLLM_RPC_TIMEOUT"] == "<=0.22"
    probe_plan = plan_for(f, env={"CAOVAN_FLASHINFER_SAMPLER": "probe"}, cache=cache_state())
    assert probe_plan.status["flashinfer_sampler"] == probe_status
    assert changes(probe_plan)["VLLM_USE_FLASHINFER_SAMPLER"] == ("set", "0")


def test_unknown_vllm_version_sets_only_what_all_releases_have():
    plan = plan_for(facts(versions={"vllm": None}))
    got = changes(plan)
    assert "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS" not in got and "VLLM_RPC_TIMEOUT" not in got
    assert any("version is unknown" in w for w in plan.warnings)
    assert plan.runtime.value == "FAIL" and "vllm" in (plan.stop_reason() or "")


def test_user_values_are_kept_and_never_in_the_updates():
    env = {"VLLM_RPC_TIMEOUT": "5000", "TORCH_CUDA_ARCH_LIST": "7.5 8.6", "TRITON_CACHE_DIR": "/mine",
           "VLLM_USE_FLASHINFER_SAMPLER": "1"}
    before = dict(env)
    plan = plan_for(env=env, cache=cache_state())
    assert env == before  # pure: the caller's mapping is untouched
    got = changes(plan)
    for var, value in before.items():
        assert got[var] == ("kept", value)
        assert var not in plan.env_updates()
    assert plan.status["flashinfer_sampler"] == "kept-user"
    kept = [ln for ln in banner_lines(plan) if " kept:" in ln]
    assert "env.VLLM_RPC_TIMEOUT=5000 kept: the user's value wins (we would set 1800000)" in kept
    assert len(kept) == 4


@pytest.mark.parametrize("env,absent,status", [
    ({"CAOVAN_FLASHINFER_SAMPLER": "keep"}, {"VLLM_USE_FLASHINFER_SAMPLER"}, ("flashinfer_sampler", "vllm-default")),
    ({"CAOVAN_TIMEOUT_GUARD": "0"}, TIMEOUTS, None),
    ({"CAOVAN_ARCH_GUARD": "off"}, {"TORCH_CUDA_ARCH_LIST", "FLASHINFER_CUDA_ARCH_LIST"}, None),
    ({"CAOVAN_CACHE_ISOLATION": "no"}, CACHE_VARS, None),
    ({"CAOVAN_GDN_LEGACY_DISABLE": "1"}, set(), ("gdn_legacy", "disabled-by-user")),
])
def test_each_guard_switch_turns_its_guard_off(env, absent, status):
    base = changes(plan_for(cache=cache_state()))
    plan = plan_for(env=env, cache=cache_state())
    got = changes(plan)
    assert absent <= set(base)
    assert not (absent & set(got))
    assert set(base) - absent == set(got)  # the other guards are untouched
    if status:
        assert plan.status[status[0]] == status[1]
    if "CAOVAN_CACHE_ISOLATION" in env:
        assert "cache_key" not in plan.status


def test_execute_timeout_setting_drives_all_three():
    got = changes(plan_for(env={"CAOVAN_EXECUTE_TIMEOUT_S": "900"}))
    assert got["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"][1] == "900"
    assert got["VLLM_ENGINE_ITERATION_TIMEOUT_S"][1] == "900"
    assert got["VLLM_RPC_TIMEOUT"][1] == "900000"


def test_plugin_off_changes_nothing_and_never_stops():
    for env in ({"CAOVAN_ENABLE": "0"}, {"CAOVAN_MODE": "off"}):
        plan = plan_for(facts(gpus=[]), env=env, cache=cache_state())
        assert plan.env == () and not plan.active and plan.stop_reason() is None
        assert plan.status["mode"] == "off"


def test_no_sm75_gpu_leaves_vllm_alone():
    plan = plan_for(facts(gpus=[dict(RTX3090, index=0)]), cache=cache_state())
    assert plan.env == ()
    assert plan.status["sm75"] == "0/1" and plan.status["flashinfer_sampler"] == "not-sm75"
    assert plan.stop_reason() is None  # WARN, not FAIL: vLLM serves there without us


def test_no_gpu_leaves_vllm_untouched_and_a_failing_check_on_turing_stops():
    plan = plan_for(facts(gpus=[]))
    assert plan.status["runtime"] == "FAIL" and plan.env == ()
    assert plan.stop_reason() is None   # our checks judge the machine for us; vLLM (a CPU build) may serve
    old = plan_for(facts(versions={"driver": "470.57.02"}))
    assert old.stop_reason().startswith("runtime=FAIL: driver: driver 470.57.02 is older")


def test_mixed_architectures_build_for_each():
    f = facts(gpus=[dict(TI22, index=0), dict(RTX3090, index=1)])
    assert changes(plan_for(f))["TORCH_CUDA_ARCH_LIST"] == ("set", "7.5 8.6")


def test_require_turbo3_refuses_with_every_reason():
    env = {"CAOVAN_REQUIRE_TURBO3": "1", "CAOVAN_MODE": "guards"}
    plan = plan_for(facts(gpus=[dict(RTX3090, index=0)], versions={"vllm": "0.40.0"}), env=env)
    r = plan.refusal
    assert r and "env CAOVAN_REQUIRE_TURBO3" in r
    for part in ("no SM75 GPU", "0.40.0 is outside the supported releases", "mode=guards"):
        assert part in r
    assert plan.stop_reason() == r
    # The GDN switch alone is no reason to refuse: vLLM's own GDN kernels get tensor cores through the hook.
    legacy = plan_for(env={"CAOVAN_REQUIRE_TURBO3": "1", "CAOVAN_GDN_LEGACY_DISABLE": "1"})
    assert legacy.refusal is None and legacy.status["turbo3"] == "active"
    no_hook = plan_for(env={"CAOVAN_REQUIRE_TURBO3": "1", "CAOVAN_GDN_LEGACY_DISABLE": "1", "CAOVAN_TURBO": "off"})
    assert no_hook.refusal and "CAOVAN_GDN_LEGACY_DISABLE=1" in no_hook.refusal and "no SM75" not in no_hook.refusal


@pytest.mark.parametrize("active", [True, False])
def test_refusal_follows_the_accelerated_path_state(monkeypatch, active):
    # Inactive: no hook either, so vLLM's own GDN kernels get no tensor cores and nothing of ours serves.
    turbo = (TurboDecision(True, True, "auto", "verified", "3.6.0") if active
             else TurboDecision(False, True, "off-by-user", "turbo off", "3.6.0"))
    state = GdnState("caovan-sm75" if active else "upstream", active, ("reason one", "reason two"), turbo)
    monkeypatch.setattr(decision_module, "gdn_state", lambda *a, **kw: state)
    required = plan_for(env={"CAOVAN_REQUIRE_TURBO3": "1"})
    assert required.status["gdn_legacy"] == state.line
    assert required.status["turbo3"] == ("active" if active else "inactive")
    if active:
        assert required.refusal is None and required.stop_reason() is None
    else:
        assert "reason one; reason two" in required.refusal
    fallback = plan_for()  # without the switch: fall back with a note, never refuse
    assert fallback.refusal is None
    assert any(n.startswith("turbo3=inactive") and "reason one" in n for n in fallback.notes) is (not active)


def test_require_turbo3_from_additional_config_names_its_source():
    args = read_vllm_args(["m", "--additional-config",
                           '{"caovan_require_turbo3":true,"caovan_gdn_legacy_disable":true,"caovan_turbo":"off"}'])
    settings = load_settings({}, args.additional_config)
    plan = plan_from(facts(), settings, {}, args)
    assert "additional-config caovan_require_turbo3" in plan.refusal


def test_cold_cache_warning_only_when_other_keys_exist():
    assert not any("compile again" in w for w in plan_for(cache=cache_state(empty=True)).warnings)
    warm = plan_for(cache=cache_state(empty=False, others=("old-key",)))
    assert not any("compile again" in w for w in warm.warnings)
    cold = plan_for(cache=cache_state(empty=True, others=("old-key",)))
    assert any("compile again" in w and "old-key" in w for w in cold.warnings)
    assert cold.status["cache_key"] == "/tmp/cc/envs/k-0123456789"


def test_sampler_probe_results():
    env = {"CAOVAN_FLASHINFER_SAMPLER": "probe"}
    passed = SamplerProbe(True, "sampling module built", 12.0, "fp", "t")
    plan = plan_for(env=env, sampler_probe=passed)
    assert plan.status["flashinfer_sampler"] == "enabled-probe-passed"
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in changes(plan)  # vLLM's default (on) stays
    failed = SamplerProbe(False, "fatal error: curand.h: No such file or directory", 3.0, "fp", "t")
    plan = plan_for(env=env, sampler_probe=failed)
    assert plan.status["flashinfer_sampler"] == "disabled-probe-failed"
    assert changes(plan)["VLLM_USE_FLASHINFER_SAMPLER"] == ("set", "0")
    assert any("curand.h" in w for w in plan.warnings)
    # guard mode ignores a probe result
    assert plan_for(sampler_probe=passed).status["flashinfer_sampler"] == "disabled-sm75-guard"


def test_filled_args_seam_keeps_what_the_user_gave():
    filled = [FilledArg("--dtype", "float16", "SM75 has no bf16"),
              FilledArg("--max-num-seqs", "4", "fits 22 GiB"), FilledArg("--enforce-eager", None, "test")]
    plan = plan_for(filled_args=filled)
    assert plan.argv == ["vllm", "serve", *ARGS.argv, "--max-num-seqs", "4", "--enforce-eager"]
    assert [f.flag for f in plan.filled_args] == ["--max-num-seqs", "--enforce-eager"]
    assert any("--dtype kept as given (half)" in n for n in plan.notes)
    assert plan_for().filled_args == () and plan_for().argv == ["vllm", "serve", *ARGS.argv]


def test_banner_starts_with_the_lines_users_grep_for():
    plan = plan_for(env={"CAOVAN_GDN_LEGACY_DISABLE": "1"}, cache=cache_state())
    lines = banner_lines(plan)
    assert lines[:6] == [f"Caovan vLLM SM75 Turbo3 external plugin v{__version__}", "runtime=PASS", "sm75=2/2",
                         "flashinfer_sampler=disabled-sm75-guard", "post_start_warmup=disabled-default",
                         "gdn_legacy=disabled-by-user"]
    assert "vllm=0.21.0" in lines and "cache_key=/tmp/cc/envs/k-0123456789" in lines
    set_lines = [ln for ln in lines if ln.startswith("env.") and " set: " in ln]
    assert len(set_lines) == len(plan.env)
    assert any(ln.startswith("env.VLLM_RPC_TIMEOUT=1800000 set: ") and "[vLLM <=0.22;" in ln for ln in set_lines)


def test_the_header_line_and_the_pattern_logtriage_reads_it_with_agree():
    assert header() == f"Caovan vLLM SM75 Turbo3 external plugin v{__version__}"
    for version in ("0.1.0", "0.2.0rc1+cu130"):
        m = HEADER_RE.search(f"(APIServer pid=7) INFO 12-03 {header(version)}")
        assert m is not None and m["version"] == version
    assert HEADER_RE.search("Caovan vLLM SM75 Turbo3 external plugin-v0.1.0") is None


def test_plan_json_round_trips_the_decisions():
    d = plan_for(cache=cache_state()).to_dict()
    assert d["runtime"] == "PASS" and d["argv"][:2] == ["vllm", "serve"] and d["refusal"] is None
    env = {e["var"]: e for e in d["env"]}
    assert env["VLLM_RPC_TIMEOUT"]["releases"] == "<=0.22" and env["VLLM_RPC_TIMEOUT"]["reason"]
    assert d["cache"]["key"] == "k-0123456789" and d["filled_args"] == []


def test_a_cache_variable_the_user_set_is_kept_and_named_as_shared():
    plan = plan_for(env={"TORCHINDUCTOR_CACHE_DIR": "/srv/inductor"}, cache=cache_state())
    kept = [c for c in plan.env if c.var == "TORCHINDUCTOR_CACHE_DIR"]
    assert kept and kept[0].action == "kept" and kept[0].value == "/srv/inductor"
    shared = [w for w in plan.warnings if w.startswith("TORCHINDUCTOR_CACHE_DIR is your own (/srv/inductor)")]
    assert len(shared) == 1 and "not isolated" in shared[0]
    assert not any("is your own" in w for w in plan_for(cache=cache_state()).warnings)
