"""Reading the user's `vllm serve` arguments without vLLM."""

from __future__ import annotations

import json

import pytest

from caovan_vllm_sm75_turbo3.errors import SettingError
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args, serve_args

from helpers.facts import REFERENCE



def test_reference_command_is_read_and_kept_intact():
    a = read_vllm_args(REFERENCE)
    assert a.argv == tuple(REFERENCE)
    assert a.model == "/data/qwen/Qwen3.6-27B-AWQ-INT4"
    assert a.additional_config == {"caovan": True, "caovan_mode": "auto", "caovan_require_turbo3": True}
    assert a.value("--tensor-parallel-size") == "2"
    assert a.value("--max-model-len") == "262144"
    # bare flags followed by another flag take no value
    assert a.value("--disable-custom-all-reduce") is True
    assert a.value("--enable-auto-tool-choice") is True
    assert a.value("--tool-call-parser") == "qwen3_coder"
    assert not a.given("--gpu-memory-utilization")


@pytest.mark.parametrize("argv,flag,value", [
    (["m", "--max_model_len", "4096"], "--max-model-len", "4096"),
    (["m", "--max-model-len=4096"], "--max-model-len", "4096"),
    (["m", "-tp", "2"], "--tensor-parallel-size", "2"),
    (["m", "-tp=4"], "--tensor-parallel-size", "4"),
    (["m", "--seed", "-1"], "--seed", "-1"),
    (["m", "--no-enable-prefix-caching"], "--enable-prefix-caching", False),
    (["m", "--gpu_memory_utilization=0.9"], "--gpu-memory-utilization", "0.9"),
])
def test_spellings_vllm_accepts_resolve_to_one_flag(argv, flag, value):
    assert read_vllm_args(argv).value(flag) == value


def test_model_flag_and_missing_model():
    assert read_vllm_args(["--model", "/m", "--port", "9000"]).model == "/m"
    assert read_vllm_args(["--port", "9000"]).model is None


def test_dotted_additional_config_is_merged_as_vllm_does():
    a = read_vllm_args(["m", "--additional-config.caovan_mode", "guards",
                        "--additional_config.caovan_probe_timeout_s=60", "--additional-config.other.x", "1"])
    assert a.additional_config == {"caovan_mode": "guards", "caovan_probe_timeout_s": 60, "other": {"x": 1}}
    # a plain JSON is replaced by the dotted keys (vLLM appends those last); it is still validated
    b = read_vllm_args(["m", "--additional-config", '{"caovan_mode":"off"}', "--additional-config.caovan", "true"])
    assert b.additional_config == {"caovan": True} and b.notes
    with pytest.raises(SettingError):
        read_vllm_args(["m", "--additional-config", "{bad", "--additional-config.caovan", "true"])


def test_other_keys_of_additional_config_are_kept():
    text = json.dumps({"caovan": True, "someone_else": {"a": [1, 2]}})
    a = read_vllm_args(["m", "--additional-config", text])
    assert a.additional_config["someone_else"] == {"a": [1, 2]}
    assert a.argv[-1] == text


@pytest.mark.parametrize("argv,words", [
    (["m", "--additional-config", "{not json"], ["not valid JSON", "--additional-config"]),
    (["m", "--additional-config", "[1, 2]"], ["must be a JSON object"]),
    (["m", "--additional-config"], ["needs a JSON object"]),
    (["m", "--additional-config=\"caovan\""], ["must be a JSON object"]),
    (["m", "--additional-config.caovan"], ["needs a value"]),
])
def test_malformed_additional_config_is_one_clear_error(argv, words):
    with pytest.raises(SettingError) as err:
        read_vllm_args(argv)
    assert err.value.exit_code == 2
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("argv,expected", [
    (["/venv/bin/vllm", "serve", "/m", "-tp", "2"], ["/m", "-tp", "2"]),
    (["/x/vllm/entrypoints/openai/api_server.py", "--model", "/m"], ["--model", "/m"]),
    (["/venv/bin/vllm", "bench", "serve"], []),
    (["-c"], []),
    ([], []),
])
def test_serve_args_from_a_process_command_line(argv, expected):
    assert serve_args(argv) == expected
