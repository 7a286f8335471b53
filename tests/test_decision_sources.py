"""One decision per process, whatever source the settings come from (issue 39).

Every source vLLM accepts gives the same decision as the CAOVAN_* variables do, and the banner, the
Turbo hook's installer, the GDN dispatch's gate and the attention backend all report that decision.
Before, `caovan_turbo=off`, `mode=guards` or `require_turbo3` given in a `--config` YAML file or in
`LLM(additional_config=...)` reached only the dispatch's op build: the banner and the hook stayed
on auto, and the attention backend claimed tensor cores while the GDN gate said off.
"""

from __future__ import annotations

import importlib.util
import json
import os
from types import ModuleType, SimpleNamespace

import pytest
from helpers.facts import EXAMPLES

from caovan_vllm_sm75_turbo3.config import load_settings
from caovan_vllm_sm75_turbo3.launch import plan_in_process
from helpers.plans import plan_here
from caovan_vllm_sm75_turbo3.plugin import context as context_mod
from caovan_vllm_sm75_turbo3.plugin.context import ProcessContext
from caovan_vllm_sm75_turbo3.plugin.dispatch.controller import Dispatch
from caovan_vllm_sm75_turbo3.plugin.dispatch.modular_qwen_gdn_v022 import INTERFACE as GDN
from caovan_vllm_sm75_turbo3.plugin.turbo import install_turbo
from caovan_vllm_sm75_turbo3.policy.decision import decide
from caovan_vllm_sm75_turbo3.runtime.facts import Facts

FACTS = str(EXAMPLES / "2x2080ti-22g.json")
# The versions a process reads from its own installation (a facts file cannot know them better):
# a release whose GDN and attention families are ours, and a Triton the hook was verified with.
VLLM, TRITON = "0.24.0", "3.6.0"

CASES = {
    "turbo-off": {"caovan_turbo": "off"},
    "guards": {"caovan_mode": "guards"},
    "gdn-off": {"caovan_gdn_legacy_disable": True},
    "require-turbo3-unmet": {"caovan_require_turbo3": True, "caovan_turbo": "off"},
    "defaults": {},
}
SOURCES = ("env", "additional-config", "dotted", "config-yaml", "llm-engine-args", "worker-vllm-config")


@pytest.fixture(autouse=True)
def _installed(monkeypatch):
    monkeypatch.setattr(context_mod, "vllm_version", lambda: VLLM)
    monkeypatch.setattr(context_mod, "dist_version", lambda name: {"triton": TRITON, "torch": "2.11.0"}.get(name))


def _env_form(config: dict) -> dict[str, str]:
    return {"CAOVAN_" + k.removeprefix("caovan_").upper(): json.dumps(v) if isinstance(v, bool) else v
            for k, v in config.items()}


def _in_vllm_frame(module: str, code: str, **names) -> ProcessContext:
    """Run `code` as if it were vLLM's `module` calling the plugin loader; returns the context that
    `register()` would build there (ProcessContext.of_this_process)."""
    scope = {"__name__": module, "ProcessContext": ProcessContext, **names}
    exec(code, scope)   # noqa: S102  (a stand-in frame of vLLM's own code, made here)
    return scope["ctx"]


ENGINE_ARGS = """
class EngineArgs:
    def __init__(self, model, additional_config, kv_cache_dtype="auto"):
        self.model, self.additional_config, self.kv_cache_dtype = model, additional_config, kv_cache_dtype
        self.__post_init__()
    def __post_init__(self):
        global ctx
        ctx = ProcessContext.of_this_process()   # vLLM: load_general_plugins() -> our register()
EngineArgs(MODEL, CONFIG)
"""
INIT_WORKER = """
def init_worker(all_kwargs):
    global ctx
    vllm_config = all_kwargs[0]["vllm_config"]
    ctx = ProcessContext.of_this_process()
init_worker([{"vllm_config": VLLM_CONFIG}])
"""


def context_from(source: str, config: dict, tmp_path, monkeypatch) -> ProcessContext:
    """The context a vLLM process builds when the user gave `config` through `source`."""
    env = {"CAOVAN_FACTS": FACTS, "CAOVAN_CACHE_DIR": str(tmp_path / "cache")}
    monkeypatch.setattr(os, "environ", env)   # of_this_process reads os.environ
    argv = ["/venv/bin/vllm", "serve", "/models/m"]
    if source == "env":
        env.update(_env_form(config))
    elif source == "additional-config":
        argv += ["--additional-config", json.dumps(config)]
    elif source == "dotted":
        for k, v in config.items():
            argv += [f"--additional-config.{k}", json.dumps(v) if isinstance(v, bool) else v]
    elif source == "config-yaml":
        cfg = tmp_path / "serve.yaml"
        cfg.write_text("max-model-len: 4096\nadditional-config:\n"
                       + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in config.items()) if config else "port: 8001\n")
        argv += ["--config", str(cfg)]
    monkeypatch.setattr(context_mod.sys, "argv", argv)
    if source == "llm-engine-args":
        monkeypatch.setattr(context_mod.sys, "argv", ["my_script.py"])   # LLM(...) in a user's script
        return _in_vllm_frame("vllm.engine.arg_utils", ENGINE_ARGS, MODEL="/models/m", CONFIG=config)
    if source == "worker-vllm-config":
        vllm_config = SimpleNamespace(additional_config=config, model_config=SimpleNamespace(model="/models/m"),
                                      cache_config=SimpleNamespace(cache_dtype="auto"))
        return _in_vllm_frame("vllm.v1.worker.worker_base", INIT_WORKER, VLLM_CONFIG=vllm_config)
    return ProcessContext.of_this_process()


def _summary(d) -> dict:
    s = d.settings
    return {"settings": (s.enable, s.mode, s.turbo, s.require_turbo3, s.gdn_legacy_disable),
            "turbo": (d.turbo.install, d.turbo.line), "gdn": (d.gdn.line, d.gdn.active),
            "attention": (d.attention.register, d.attention.tensor_cores), "turbo3": d.turbo3.active}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_source_gives_the_same_decision_and_everyone_reports_it(case, source, tmp_path, monkeypatch):
    config = CASES[case]
    facts = Facts.load(FACTS)
    facts.versions.vllm, facts.versions.triton = VLLM, TRITON
    ctx = context_from(source, config, tmp_path, monkeypatch)
    decision = ctx.decision
    # /models/m is not on this machine (only a worker holds its loaded config): the same decision,
    # with what hangs on the model decided at model load
    reference = decide(load_settings(_env_form(config)), facts, model_unknown=decision.model_unknown)
    assert decision.model_unknown is not None   # none of these stand-ins holds a loaded config
    assert _summary(decision) == _summary(reference), source
    if config:
        assert all(decision.settings.source(k.removeprefix("caovan_")) != "default" for k in config)
    # The banner: the plan register() logs is made from this very decision.
    plan = plan_in_process(ctx.env, ctx.args, decision, write=False).plan
    assert plan.status["turbo"] == decision.turbo.line and plan.status["gdn_legacy"] == decision.gdn.line
    assert plan.status["turbo3"] == decision.turbo3.line
    assert plan.status["mode"] == decision.settings.mode
    assert (plan.refusal is not None) == (case == "require-turbo3-unmet" and not decision.turbo3.pending)
    # The Turbo hook's installer reports (and acts on) the same decision.
    monkeypatch.setattr("caovan_vllm_sm75_turbo3.kernels.turbo.hook.install", lambda selector: None, raising=False)
    if not decision.turbo.install or importlib.util.find_spec("triton") is not None:   # installing needs Triton
        assert install_turbo(ctx) == decision.turbo.line
    # The GDN dispatch's gate: where the decision says vLLM's own, the dispatch says so at attach.
    if not decision.gdn.active:
        dispatch = Dispatch(ctx)
        dispatch.attach(GDN, ModuleType("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"))
        assert dispatch.state is not None and dispatch.state.status == decision.gdn.line
        assert dispatch.interface is None   # nothing registered
    # Our attention kernel claims tensor cores exactly where the GDN prefill (ours) gets them.
    if decision.gdn.active:
        assert decision.attention.tensor_cores and decision.turbo.tensor_cores
    if not decision.turbo.tensor_cores:
        assert not decision.attention.tensor_cores and not decision.gdn.active


def test_the_disagreement_of_before_cannot_come_back(tmp_path, monkeypatch):
    # `caovan_turbo: off` in a --config YAML: hook, GDN gate, attention and banner all say off.
    ctx = context_from("config-yaml", {"caovan_turbo": "off"}, tmp_path, monkeypatch)
    d = ctx.decision
    assert d.settings.source("turbo") == "additional-config caovan_turbo"
    assert (d.turbo.install, d.gdn.active, d.attention.tensor_cores) == (False, False, False)
    assert ctx.args.value("--max-model-len") == "4096"   # the file's other arguments are read too
    assert "turbo=off-by-user" in " ".join(d.gdn.reasons)


def test_a_bare_off_in_yaml_means_off(tmp_path, monkeypatch):
    # YAML 1.1 reads `caovan_turbo: off` as false; vLLM passes it on as JSON false. It means off.
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("additional-config:\n  caovan_turbo: off\n")
    monkeypatch.setattr(os, "environ", {"CAOVAN_FACTS": FACTS})
    monkeypatch.setattr(context_mod.sys, "argv", ["vllm", "serve", "/m", "--config", str(cfg)])
    assert ProcessContext.of_this_process().decision.turbo.line == "off-by-user"


def test_the_decision_is_made_once_per_context(tmp_path, monkeypatch):
    calls = []
    real = context_mod.decide
    monkeypatch.setattr(context_mod, "decide", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    ctx = context_from("additional-config", {"caovan_turbo": "off"}, tmp_path, monkeypatch)
    for _ in range(3):
        install_turbo(ctx)
        Dispatch(ctx).attach(GDN, ModuleType("m"))
        plan_in_process(ctx.env, ctx.args, ctx.decision, write=False)
    assert len(calls) == 1


def test_vllms_own_settings_win_over_a_command_line_it_did_not_parse(tmp_path, monkeypatch):
    # A worker's VllmConfig is what vLLM runs with; the argv of the script that made it is not.
    monkeypatch.setattr(os, "environ", {"CAOVAN_FACTS": FACTS})
    monkeypatch.setattr(context_mod.sys, "argv", ["vllm", "serve", "/m", "--additional-config",
                                                  '{"caovan_turbo":"on"}'])
    vllm_config = SimpleNamespace(additional_config={"caovan_turbo": "off"}, model_config=SimpleNamespace(model="/m"),
                                  cache_config=SimpleNamespace(cache_dtype="fp8"))
    ctx = _in_vllm_frame("vllm.v1.worker.worker_base", INIT_WORKER, VLLM_CONFIG=vllm_config)
    assert ctx.source is not None and ctx.source.origin == "VllmConfig"
    assert ctx.decision.settings.turbo == "off" and ctx.decision.kv_cache_dtype == "fp8"


def test_a_frame_of_someone_elses_code_is_not_taken_for_vllms():
    # Only vLLM's modules are read: a user's own `vllm_config` variable is not a source.
    vllm_config = SimpleNamespace(additional_config={"caovan_turbo": "off"}, model_config=None, cache_config=None)
    ctx = _in_vllm_frame("my_tool", INIT_WORKER, VLLM_CONFIG=vllm_config)
    assert ctx.source is None
