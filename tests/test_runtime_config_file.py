"""vLLM's `--config FILE.yaml`, expanded as vLLM's FlexibleArgumentParser expands it: order, value forms,
and the errors, each checked against vLLM's own `_pull_args_from_config` where vLLM is installed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from caovan_vllm_sm75_turbo3.errors import SettingError
from caovan_vllm_sm75_turbo3.launch import read_args
from caovan_vllm_sm75_turbo3.runtime.config_file import config_args, expand_config_file

YAML = textwrap.dedent("""\
    tensor-parallel-size: 2
    enable-prefix-caching: true
    enforce-eager: false
    served-model-name: [qwen, q]
    additional-config:
      caovan_turbo: "off"
      caovan_require_turbo3: true
    max_model_len: 32768
""")


def test_the_file_becomes_arguments_as_vllm_makes_them(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(YAML)
    assert config_args(str(f)) == [
        "--tensor-parallel-size", "2", "--enable-prefix-caching", "--served-model-name", "qwen", "q",
        "--additional-config", json.dumps({"caovan_turbo": "off", "caovan_require_turbo3": True}),
        "--max_model_len", "32768"]


def test_placed_after_the_model_so_the_command_line_wins(tmp_path):
    f = tmp_path / "c.yml"
    f.write_text(YAML)
    argv = ["/models/q", "--config", str(f), "-tp", "1"]
    expanded = expand_config_file(argv)
    assert expanded[0] == "/models/q" and expanded[-2:] == ["-tp", "1"] and "--config" not in expanded
    args = read_args(argv)
    assert args.argv == tuple(argv)   # the user's argv is kept intact: vLLM expands the file itself
    assert args.value("--tensor-parallel-size") == "1" and args.value("--max-model-len") == "32768"
    assert args.additional_config == {"caovan_turbo": "off", "caovan_require_turbo3": True}
    assert any("--config FILE" in n for n in args.notes)


def test_a_model_named_in_the_file_counts(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model: /models/from-file\n")
    assert read_args(["--config", str(f)]).model == "/models/from-file"


@pytest.mark.parametrize("name,text,argv_tail,words", [
    ("c.json", "{}", None, "a .yaml or .yml file"),
    ("c.yaml", "[1, 2]\n", None, "must be a mapping"),
    ("c.yaml", "a: [\n", None, "not valid YAML"),
    ("missing.yaml", None, None, "cannot read it"),
    ("c.yaml", "a: 1\n", ["--config", "other.yaml"], "given 2 times"),
])
def test_bad_files_are_one_line_naming_the_flag(tmp_path, name, text, argv_tail, words):
    f = tmp_path / name
    if text is not None:
        f.write_text(text)
    with pytest.raises(SettingError) as err:
        expand_config_file(["/m", "--config", str(f), *(argv_tail or [])])
    assert "--config" in str(err.value) and words in str(err.value)
    with pytest.raises(SettingError, match="needs a file"):
        expand_config_file(["/m", "--config"])


def test_an_empty_file_adds_nothing(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("")
    assert expand_config_file(["/m", "--config", str(f)]) == ["/m"]


# vLLM's own expansion, in a child process (VLLM_PLUGINS="" keeps our plugin out of it).
VLLM_EXPAND = textwrap.dedent("""
    import json, sys
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    print(json.dumps(FlexibleArgumentParser()._pull_args_from_config(json.loads(sys.argv[1]))))
""")


@pytest.mark.vllm_source
@pytest.mark.parametrize("argv", [["serve", "/models/q", "--config", "{f}", "-tp", "1"],
                                  ["serve", "--config", "{f}", "--port", "8001"]])
def test_the_expansion_is_vllms(tmp_path, argv):
    f = tmp_path / "c.yaml"
    f.write_text(YAML + "model: /models/from-file\n")
    argv = [a.replace("{f}", str(f)) for a in argv]
    r = subprocess.run([sys.executable, "-c", VLLM_EXPAND, json.dumps(argv)], capture_output=True, text=True,
                       timeout=300, env={"VLLM_PLUGINS": "", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert ["serve", *expand_config_file(argv[1:])] == json.loads(r.stdout.strip().splitlines()[-1])
