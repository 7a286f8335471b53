"""Against vLLM 0.21.0's own `vllm serve` argument parser (built on this CPU machine):
the launcher's final argv is accepted, our flags do not collide with vLLM's, and our
reading of aliases and `--additional-config` matches vLLM's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from caovan_vllm_sm75_turbo3.cli.serve import BOOL_FLAGS, VALUE_FLAGS
from caovan_vllm_sm75_turbo3.policy.vllm_args import SHORT_ALIASES, check_launch_args, read_vllm_args

from helpers.facts import REFERENCE

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
FACTS = ROOT / "examples" / "2x2080ti-22g.json"
# Values of the flags our launch check reads: what vLLM's parser refuses we refuse; what we accept,
# vLLM reads as the same number (beyond that we refuse only nonsense: 0, negatives, a share > 1).
VALUE_CASES = [(flag, v) for flag, values in {
    "--max-model-len": ["32k", "1K", "25.6k", "1.5K", "auto", "AUTO", "-1", "0", " 12 ", "1_000", "+7", "1e3",
                        "None", "32kb", "nan", "2M"],
    "--max-num-seqs": ["0", "8", "1k", "None", "+3"],
    "--max-num-batched-tokens": ["0", "1k", "2K", "-3", "8192", "1.5m"],
    "--tensor-parallel-size": ["0", "2", "x", "1.0"],
    "--gpu-memory-utilization": ["0", "1", "1.5", "nan", "inf", "0.9", "9e-1", "x"]}.items() for v in values]
DOTTED = ["/m", "--additional-config", '{"x":1}', "--additional-config.caovan_mode", "guards",
          "--additional_config.caovan_probe_timeout_s=60", "-tp", "2"]

# Builds vLLM's parser the way docs/design.md says works without a GPU, then parses each argv
# given on stdin. VLLM_PLUGINS="" keeps our own plugin out of this process.
PARSER = textwrap.dedent("""
    import json, sys
    import vllm.platforms as P
    from vllm.platforms.cpu import CpuPlatform
    P._current_platform = CpuPlatform()
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    argvs = json.load(sys.stdin)
    parser = make_arg_parser(FlexibleArgumentParser())
    aliases = {}
    for a in parser._actions:
        longs = [o for o in a.option_strings if o.startswith("--") and not o.startswith("--no-")]
        for o in a.option_strings:
            if not o.startswith("--") and o != "-h":
                aliases[o] = longs[0]
    out = {"options": sorted(o for a in parser._actions for o in a.option_strings),
           "aliases": aliases, "parsed": []}
    for argv in argvs:
        try:
            ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        except SystemExit as e:
            out["parsed"].append({"exit": e.code})
            continue
        out["parsed"].append({"exit": 0, "model_tag": ns.model_tag,
                              "additional_config": ns.additional_config,
                              "tensor_parallel_size": ns.tensor_parallel_size,
                              "max_model_len": ns.max_model_len, "dtype": ns.dtype,
                              "max_num_seqs": ns.max_num_seqs, "max_num_batched_tokens": ns.max_num_batched_tokens,
                              "gpu_memory_utilization": ns.gpu_memory_utilization,
                              "enable_prefix_caching": ns.enable_prefix_caching,
                              "disable_custom_all_reduce": ns.disable_custom_all_reduce})
    print("RESULT " + json.dumps(out))
""")


def _final_argv(extra_env: dict[str, str] | None = None) -> list[str]:
    env = {**os.environ, "HOME": "/nonexistent-home", **(extra_env or {})}
    r = subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.serve", *REFERENCE,
                        "--json", "--facts", str(FACTS)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["argv"]


@pytest.fixture(scope="module")
def vllm_parser() -> dict:
    final = _final_argv()
    assert final[:2] == ["vllm", "serve"]
    argvs = [final[2:], DOTTED, [*REFERENCE, "--not-a-vllm-flag"], ["/m", "--additional-config", '{"a": }'],
             ["/m", "--additional-config", "{bad"], *(["/m", f"{flag}={v}"] for flag, v in VALUE_CASES)]
    env = {**os.environ, "VLLM_PLUGINS": "", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", PARSER], input=json.dumps(argvs), capture_output=True,
                       text=True, env=env, timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert r.returncode == 0 and line, r.stderr[-3000:]
    out = json.loads(line[len("RESULT "):])
    out["final"] = final
    return out


def test_reference_final_argv_is_accepted_by_vllm(vllm_parser):
    # the user's arguments come first, intact and in order (a launch profile may append more)
    assert vllm_parser["final"][2:2 + len(REFERENCE)] == REFERENCE
    got = vllm_parser["parsed"][0]
    assert got["exit"] == 0
    assert got["model_tag"] == "/data/qwen/Qwen3.6-27B-AWQ-INT4"
    assert got["additional_config"] == {"caovan": True, "caovan_mode": "auto", "caovan_require_turbo3": True}
    assert got["tensor_parallel_size"] == 2 and got["max_model_len"] == 262144 and got["dtype"] == "half"
    assert got["enable_prefix_caching"] is True and got["disable_custom_all_reduce"] is True


def test_the_parser_check_can_fail(vllm_parser):
    # an unknown flag and malformed JSON in braces are rejected by vLLM with exit code 2
    assert vllm_parser["parsed"][2]["exit"] == 2
    assert vllm_parser["parsed"][3]["exit"] == 2


def test_vllm_lets_some_malformed_json_through_and_we_do_not(vllm_parser):
    # vLLM 0.21 takes '{bad' as a plain string config and fails much later; we stop before start
    assert vllm_parser["parsed"][4] == {**vllm_parser["parsed"][4], "exit": 0, "additional_config": "{bad"}
    r = subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.serve", "/m",
                        "--additional-config", "{bad", "--dry-run", "--facts", str(FACTS)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("caovan-vllm-serve: error: --additional-config is not valid JSON")
    assert "Traceback" not in r.stderr


def test_our_reading_of_additional_config_matches_vllms(vllm_parser):
    got = vllm_parser["parsed"][1]
    assert got["exit"] == 0
    ours = read_vllm_args(DOTTED)
    assert ours.additional_config == got["additional_config"]
    assert int(ours.value("--tensor-parallel-size")) == got["tensor_parallel_size"]


def test_our_flags_do_not_collide_with_vllm_serve(vllm_parser):
    options = set(vllm_parser["options"])
    ours = set(BOOL_FLAGS + VALUE_FLAGS) - {"-h", "--help"}
    assert ours == {"--dry-run", "--json", "--facts", "--profile", "--cache-dir", "--version"}
    assert not (ours & options), ours & options
    assert "--additional-config" in options  # the check sees the real option list


def test_short_aliases_match_vllm(vllm_parser):
    assert SHORT_ALIASES == vllm_parser["aliases"]


@pytest.mark.parametrize("case", range(len(VALUE_CASES)))
def test_our_launch_check_reads_numbers_as_vllm_does(vllm_parser, case):
    flag, value = VALUE_CASES[case]
    got = vllm_parser["parsed"][5 + case]
    checked = check_launch_args(read_vllm_args(["/m", f"{flag}={value}"]), 8)
    ours = getattr(checked.numbers, flag[2:].replace("-", "_"))
    if got["exit"] != 0:
        assert checked.errors, (flag, value)  # vLLM refuses it: so do we
    if not checked.errors:
        assert got["exit"] == 0 and got[flag[2:].replace("-", "_")] == ours, (flag, value, got)
