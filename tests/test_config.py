import json
import re

import pytest

from caovan_vllm_sm75_turbo3.config import (load_settings, parse_additional_config, settings_table_markdown,
                                            specs)
from caovan_vllm_sm75_turbo3.errors import SettingError

from helpers.facts import ROOT


def test_defaults_when_nothing_is_given():
    s = load_settings({}, None, None)
    for spec in specs():
        assert getattr(s, spec.name) == spec.default
        assert s.source(spec.name) == "default"


def test_precedence_env_then_additional_config_then_cli():
    env = {"CAOVAN_PROFILE": "from-env", "CAOVAN_EXECUTE_TIMEOUT_S": "900", "CAOVAN_REQUIRE_TURBO3": "0"}
    s = load_settings(env, None, None)
    assert (s.profile, s.execute_timeout_s, s.require_turbo3) == ("from-env", 900, False)
    assert s.source("profile") == "env CAOVAN_PROFILE"

    s = load_settings(env, '{"caovan_profile": "from-config", "caovan_require_turbo3": true}', None)
    assert (s.profile, s.require_turbo3, s.execute_timeout_s) == ("from-config", True, 900)
    assert s.source("profile") == "additional-config caovan_profile"

    s = load_settings(env, '{"caovan_profile": "from-config"}', {"profile": "from-cli", "facts": None})
    assert s.profile == "from-cli" and s.source("profile") == "flag --profile"
    assert s.facts == "" and s.source("facts") == "default"  # None means "flag not given"


def test_public_additional_config_keys():
    s = load_settings({}, '{"caovan":true,"caovan_mode":"auto","caovan_require_turbo3":true,"other":1}')
    assert s.enable is True and s.mode == "auto" and s.require_turbo3 is True
    s = load_settings({}, {"caovan": False})
    assert s.enable is False and not s.active


@pytest.mark.parametrize("raw,expected", [("1", True), ("yes", True), ("ON", True), (" true ", True),
                                          ("0", False), ("no", False), ("Off", False), ("FALSE", False)])
def test_bool_spellings(raw, expected):
    assert load_settings({"CAOVAN_REQUIRE_TURBO3": raw}).require_turbo3 is expected


@pytest.mark.parametrize("env,needle", [
    ({"CAOVAN_REQUIRE_TURBO3": "maybe"}, "CAOVAN_REQUIRE_TURBO3='maybe' is not accepted: use 1/0, true/false"),
    ({"CAOVAN_MODE": "fast"}, "CAOVAN_MODE='fast' is not accepted: one of auto, guards, off"),
    ({"CAOVAN_EXECUTE_TIMEOUT_S": "ten"}, "CAOVAN_EXECUTE_TIMEOUT_S='ten' is not accepted: a whole number >= 300"),
    ({"CAOVAN_EXECUTE_TIMEOUT_S": "5"}, "a whole number >= 300"),
    ({"CAOVAN_PROFILE": "  "}, "CAOVAN_PROFILE='  ' is not accepted"),
])
def test_bad_env_values_name_the_variable_and_accepted_values(env, needle):
    with pytest.raises(SettingError) as err:
        load_settings(env)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text,needle", [
    ('{"caovan": true,', "--additional-config is not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('"caovan"', "must be a JSON object"),
    ('{"caovan_require_turbo3": "maybe"}', "--additional-config key 'caovan_require_turbo3'='maybe' is not accepted"),
    ('{"caovan_require_turbo": true}', "unknown Caovan key 'caovan_require_turbo'"),
    ('{"caovan_execute_timeout_s": true}', "'caovan_execute_timeout_s'=True is not accepted"),
    ('{"caovan_mode": 3}', "'caovan_mode'=3 is not accepted: one of auto, guards, off"),
])
def test_bad_additional_config(text, needle):
    with pytest.raises(SettingError) as err:
        load_settings({}, text)
    assert needle in str(err.value)


def test_bad_cli_value_names_the_flag():
    with pytest.raises(SettingError, match=r"--profile='' is not accepted"):
        load_settings({}, None, {"profile": ""})


def test_additional_config_is_returned_whole():
    text = '{"caovan": true, "foo": {"bar": [1, 2]}}'
    assert parse_additional_config(text) == json.loads(text)
    assert parse_additional_config("") == {} and parse_additional_config(None) == {}


def test_unknown_caovan_env_var_warns_and_is_ignored():
    s = load_settings({"CAOVAN_REQUIRE_TURBO": "1", "OTHER": "x"})
    assert s.require_turbo3 is False
    assert len(s.warnings) == 1 and "CAOVAN_REQUIRE_TURBO is not a Caovan setting" in s.warnings[0]


def test_every_setting_has_doc_env_var_and_key():
    seen_env, seen_keys = set(), set()
    for spec in specs():
        assert spec.doc and spec.doc.endswith(".")
        assert re.fullmatch(r"CAOVAN_[A-Z0-9_]+", spec.env_var)
        assert spec.env_var not in seen_env and spec.config_key not in seen_keys
        seen_env.add(spec.env_var)
        seen_keys.add(spec.config_key)
    assert {"CAOVAN_GDN_LEGACY_DISABLE", "CAOVAN_REQUIRE_TURBO3", "CAOVAN_FLASHQLA_PRECOMPILE",
            "CAOVAN_CACHE_DIR"} <= seen_env  # the names docs/design.md promises users


def test_readme_settings_table_matches_the_code():
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- settings-table:start -->\n(.*?)\n<!-- settings-table:end -->", readme, re.S)
    assert m, "README.md lost its settings-table markers"
    assert m.group(1).strip() == settings_table_markdown().strip(), (
        "README settings table is stale: regenerate with `python -m caovan_vllm_sm75_turbo3.config`")
