"""Settings at the boundary (issue 17): `--additional-config` (plain JSON and vLLM's dotted form)
and CAOVAN_* variables of any shape end in a plan or one `error:` line naming the key, exit 2."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from helpers.hostile import FAST, VALUES, assert_clean, deep, run_main

from caovan_vllm_sm75_turbo3.cli import doctor, serve
from caovan_vllm_sm75_turbo3.config import load_settings, specs
from caovan_vllm_sm75_turbo3.errors import SettingError
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args

from helpers.facts import EXAMPLES

FACTS = str(EXAMPLES / "2x2080ti-22g.json")
_KEYS = [s.config_key for s in specs()] + ["caovan_bogus", "other_plugin"]


def _serve(tmp_path, *extra: str):
    return run_main(serve.PROG, serve.main, [str(tmp_path), "--dry-run", "--facts", FACTS, *extra])


@FAST
@given(key=st.sampled_from(_KEYS), value=VALUES, dotted=st.booleans())
def test_any_additional_config_value_is_a_plan_or_one_error_line(tmp_path_factory, key, value, dotted):
    model = tmp_path_factory.mktemp("m")
    text = json.dumps(value) if dotted else json.dumps({key: value})
    r = _serve(model, *([f"--additional-config.{key}", text] if dotted else ["--additional-config", text]))
    assert_clean(r)
    if r.code == 2 and r.err:
        assert "--additional-config" in r.err and r.err.startswith("caovan-vllm-serve: error: ")


@FAST
@given(text=st.text(max_size=80) | st.integers(1, 5000).map(deep) | st.integers(1, 5000).map(lambda n: deep(n, "obj")),
       dotted=st.booleans())
def test_any_additional_config_text_is_a_plan_or_one_error_line(tmp_path_factory, text, dotted):
    model = tmp_path_factory.mktemp("m")
    r = _serve(model, *(["--additional-config.caovan_mode", text] if dotted else ["--additional-config", text]))
    assert_clean(r)


@pytest.mark.parametrize("flag", ["--version", "--help", "-h", "--json"])
@pytest.mark.parametrize("dotted", [False, True])
def test_our_flag_where_the_additional_config_value_belongs_is_that_value(tmp_path, flag, dotted):
    """Found by the property test above: `--additional-config --version` printed our version and exited
    0 in the middle of a launch's arguments; the token is the option's value, refused in one line."""
    r = _serve(tmp_path, *(["--additional-config.caovan_mode", flag] if dotted else ["--additional-config", flag]))
    assert_clean(r)
    assert r.code == 2 and "--additional-config" in r.err and "caovan-vllm-serve 0." not in r.out


@FAST
@given(var=st.sampled_from([s.env_var for s in specs()]), value=st.text(max_size=60).filter(lambda v: "\x00" not in v))
def test_any_environment_value_is_a_report_or_one_error_line(var, value):
    r = run_main(doctor.PROG, doctor.main, ["--facts", FACTS, "--json"], env={var: value})
    assert_clean(r)
    if r.err:
        assert r.code == 2 and var in r.err


@pytest.mark.parametrize("config,needle", [
    (deep(5000), "--additional-config is nested more than 64 levels deep"),
    ('{"caovan_probe_timeout_s": NaN}', "--additional-config is not strict JSON (NaN is not a JSON number)"),
    ('{"caovan_probe_timeout_s": Infinity}', "Infinity is not a JSON number"),
    ('{"caovan_probe_timeout_s": "300"}', None),  # a number as a string is what the env gives too: fine
    ('{"caovan_probe_timeout_s": 1e300}', "key 'caovan_probe_timeout_s'=1e+300 is not accepted: a whole number >= 10"),
    ('{"caovan_probe_timeout_s": 100000000000000000000}', "at most 1000000000"),
    ('{"caovan_mode": ["auto"]}', "key 'caovan_mode'=['auto'] is not accepted: one of auto, guards, off"),
    ('{"caovan_mode": {"a": {"b": {"c": 1}}}}', "key 'caovan_mode'={'a': {'b': {...}}} is not accepted"),
])
def test_each_bad_kind_names_the_key(config, needle):
    if needle is None:
        assert load_settings({}, config).probe_timeout_s == 300
        return
    with pytest.raises(SettingError) as err:
        load_settings({}, config)
    assert needle in str(err.value) and len(str(err.value)) < 300 and "\n" not in str(err.value)


@pytest.mark.parametrize("argv,needle", [
    (["m", "--additional-config.caovan_mode", deep(5000)], "key 'caovan_mode'='[[[["),
    (["m", "--additional-config.caovan_probe_timeout_s", "NaN"], "key 'caovan_probe_timeout_s'='NaN' is not accepted"),
    (["m", "--additional-config." + ".".join(["a"] * 3000), "1"], "takes at most 64 dotted levels, not 3000"),
])
def test_dotted_form_names_the_key(argv, needle):
    with pytest.raises(SettingError) as err:
        load_settings({}, read_vllm_args(argv).additional_config)
    assert needle in str(err.value) and len(str(err.value)) < 300


def test_dotted_deep_value_for_another_plugin_is_kept_as_text():
    args = read_vllm_args(["m", "--additional-config.other", deep(5000)])
    assert args.additional_config["other"] == deep(5000) and load_settings({}, args.additional_config).mode == "auto"
