"""Settings.sources are typed (config.Source): where each value came from, kind and name, with the
text plan lines print and the place errors name derived from the fields, not parsed back."""

from __future__ import annotations

from caovan_vllm_sm75_turbo3.config import DEFAULT_SOURCE, Source, load_settings


def test_each_kind_of_source_is_recorded_and_printed() -> None:
    s = load_settings({"CAOVAN_MODE": "guards"}, {"caovan_turbo": "off"}, {"cache_dir": "/tmp/x", "profile": None})
    assert s.origin("mode") == Source("env", "CAOVAN_MODE") and s.source("mode") == "env CAOVAN_MODE"
    assert s.origin("turbo") == Source("additional-config", "caovan_turbo")
    assert s.source("turbo") == "additional-config caovan_turbo"
    assert s.origin("cache_dir").kind == "flag" and s.source("cache_dir") == f"flag {s.origin('cache_dir').name}"
    assert s.origin("enable") == DEFAULT_SOURCE and s.source("enable") == "default"


def test_errors_name_the_place_from_the_fields() -> None:
    s = load_settings({"CAOVAN_MODE": "guards"}, {"caovan_turbo": "off"}, None)
    assert s.where("mode") == "CAOVAN_MODE"
    assert s.where("turbo") == "--additional-config key 'caovan_turbo'"
    assert s.where("enable") == "CAOVAN_ENABLE"   # a default is named by its variable


def test_the_later_source_wins_in_order_env_config_flag() -> None:
    s = load_settings({"CAOVAN_PROFILE": "none"}, {"caovan_profile": "auto"}, {"profile": "none"})
    assert s.origin("profile").kind == "flag" and s.profile == "none"
