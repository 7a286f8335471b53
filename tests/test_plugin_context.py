"""One decision per vLLM process: settings (with vLLM's --additional-config), facts and the Turbo
decision are read once and every installer decides from them."""

from __future__ import annotations

import pytest
from helpers.facts import EXAMPLES

from caovan_vllm_sm75_turbo3 import config
from caovan_vllm_sm75_turbo3.plugin import context as context_mod
from caovan_vllm_sm75_turbo3.plugin.context import ProcessContext
from caovan_vllm_sm75_turbo3.runtime.probe import dist_version, vllm_version

FACTS = str(EXAMPLES / "2x2080ti-22g.json")
ARGV = ["vllm", "serve", "/m", "--additional-config", '{"caovan_turbo":"off","caovan_gdn_legacy_disable":true}']


def test_settings_and_facts_are_read_once(monkeypatch):
    calls = {"settings": 0, "facts": 0}
    real_settings, real_facts = config.load_settings, context_mod.load_facts

    def count_settings(*a, **kw):
        calls["settings"] += 1
        return real_settings(*a, **kw)

    def count_facts(*a, **kw):
        calls["facts"] += 1
        return real_facts(*a, **kw)

    monkeypatch.setattr(context_mod, "load_settings", count_settings)
    monkeypatch.setattr(context_mod, "load_facts", count_facts)
    ctx = ProcessContext({"CAOVAN_FACTS": FACTS}, ARGV)
    for _ in range(3):
        assert ctx.settings.turbo == "off" and ctx.facts.sm75_count == 2 and ctx.decision.turbo.line == "off-by-user"
    assert calls == {"settings": 1, "facts": 1}


def test_additional_config_reaches_every_installer():
    from caovan_vllm_sm75_turbo3.plugin.turbo import install_turbo

    ctx = ProcessContext({"CAOVAN_FACTS": FACTS}, ARGV)
    assert install_turbo(ctx) == "off-by-user"   # vLLM's --additional-config, not only CAOVAN_* variables
    assert ctx.settings.gdn_legacy_disable is True


def test_a_facts_files_versions_give_way_to_this_processes():
    ctx = ProcessContext({"CAOVAN_FACTS": FACTS})
    assert ctx.facts.versions.vllm == vllm_version() and ctx.facts.versions.triton == dist_version("triton")
    assert len(ctx.facts.gpus) == 2   # the file's GPUs stand for this machine's


def test_a_malformed_additional_config_is_raised_where_it_is_read_not_at_construction():
    ctx = ProcessContext({}, ["vllm", "serve", "/m", "--additional-config", "{bad"])
    with pytest.raises(config.SettingError):
        ctx.settings
