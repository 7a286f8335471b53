"""The launch plan is checked before anything runs (issue 17, class 2): the user's model and
numeric vLLM arguments are read as vLLM 0.21's parser reads them (policy/vllm_args.ARG_RULES),
and a refusal is one line naming the argument and what is accepted, exit 2, before exec; in
--dry-run and --json the plan is printed first and shows the refusal."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from helpers.hostile import FAST, assert_clean, run_main

from caovan_vllm_sm75_turbo3.cli import serve
from caovan_vllm_sm75_turbo3.policy.vllm_args import (ARG_RULES, AUTO_LEN, LaunchNumbers, check_launch_args,
                                                      human_int, read_vllm_args)

from helpers.facts import EXAMPLES

FACTS = str(EXAMPLES / "2x2080ti-22g.json")  # two visible SM75 GPUs
MODEL = str(EXAMPLES / "models" / "qwen3.6-27b-awq")
ERR = "caovan-vllm-serve: error: "

BAD = [  # (vLLM arguments, the refusal's start)
    ([], "no model given: caovan-vllm-serve MODEL"),
    (["--model"], "--model needs a value: a local model directory or a Hugging Face model name"),
    (["--port", "8000", "--model"], "--model needs a value"),
    ([MODEL, "--tensor-parallel-size", "0"], "--tensor-parallel-size '0' is not accepted: a whole number >= 1"),
    ([MODEL, "-tp", "-2"], "--tensor-parallel-size '-2' is not accepted"),
    ([MODEL, "-tp", "two"], "--tensor-parallel-size 'two' is not accepted"),
    ([MODEL, "-tp", "4"], "--tensor-parallel-size 4 needs 4 GPUs, 2 are visible"),
    ([MODEL, "-tp", "2", "-pp", "2"], "--tensor-parallel-size 2 x --pipeline-parallel-size 2 needs 4 GPUs"),
    ([MODEL, "-pp", "3"], "--pipeline-parallel-size 3 x --tensor-parallel-size 1 needs 3 GPUs, 2 are visible"),
    ([MODEL, "--gpu-memory-utilization", "0"], "--gpu-memory-utilization '0' is not accepted: a number > 0 and <= 1"),
    ([MODEL, "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization '1.5' is not accepted"),
    ([MODEL, "--gpu-memory-utilization=nan"], "--gpu-memory-utilization 'nan' is not accepted"),
    ([MODEL, "--gpu-memory-utilization", "lots"], "--gpu-memory-utilization 'lots' is not accepted"),
    ([MODEL, "--max-model-len", "abc"], "--max-model-len 'abc' is not accepted: a whole number >= 1"),
    ([MODEL, "--max-model-len", "0"], "--max-model-len '0' is not accepted"),
    ([MODEL, "--max-model-len", "1.5K"], "--max-model-len '1.5K' is not accepted"),
    ([MODEL, "--max_model_len"], "--max-model-len needs a value: a whole number >= 1"),
    ([MODEL, "--max-num-seqs", "0"], "--max-num-seqs '0' is not accepted: a whole number >= 1"),
    ([MODEL, "--max-num-seqs", "1k"], "--max-num-seqs '1k' is not accepted"),
    ([MODEL, "--max-num-batched-tokens", "-3"], "--max-num-batched-tokens '-3' is not accepted"),
    ([MODEL, "--max-num-batched-tokens", "4", "--max-num-seqs", "8"],
     "--max-num-batched-tokens 4 is below --max-num-seqs 8: vLLM refuses that"),
]


def _env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.mark.parametrize("argv,start", BAD)
def test_each_bad_argument_is_one_line_exit_2_after_the_dry_run_plan(tmp_path, argv, start):
    r = run_main(serve.PROG, serve.main, [*argv, "--dry-run", "--facts", FACTS], _env(tmp_path))
    assert_clean(r, codes=(2,))
    assert r.err.startswith(ERR + start), r.err
    refusal = r.err[len(ERR):].strip()
    assert f"launch: would stop: {refusal}" in r.out  # the plan shows it
    assert "dry run: nothing was written" in r.out
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("argv,start", BAD[:7])
def test_the_json_plan_carries_the_refusal_and_exits_2(tmp_path, argv, start):
    r = run_main(serve.PROG, serve.main, [*argv, "--json", "--facts", FACTS], _env(tmp_path))
    assert_clean(r, codes=(2,))
    plan = json.loads(r.out, parse_constant=_no_constant)
    assert plan["refusal"].startswith(start) and plan["dry_run"] is True
    assert r.err.startswith(ERR + start)


def _no_constant(name: str) -> None:
    raise AssertionError(f"not strict JSON: {name}")


def test_a_real_launch_refuses_before_anything_is_written_or_started(tmp_path, monkeypatch):
    def no_exec(*a: object) -> None:
        raise AssertionError("vLLM was started")
    monkeypatch.setattr(os, "execve", no_exec)
    r = run_main(serve.PROG, serve.main, [MODEL, "--max-model-len", "abc", "--facts", FACTS], _env(tmp_path))
    assert_clean(r, codes=(2,))
    assert r.err == ERR + "--max-model-len 'abc' is not accepted: a whole number >= 1 " \
                          "(32k = 32,000, 32K = 32,768) or auto\n"
    assert "refused: --max-model-len 'abc'" in r.out  # the banner says it too
    assert not (tmp_path / "cache").exists()


def test_a_refusal_holds_with_the_plugin_off(tmp_path):
    env = {**_env(tmp_path), "CAOVAN_ENABLE": "0"}
    r = run_main(serve.PROG, serve.main, [MODEL, "-tp", "0", "--dry-run", "--facts", FACTS], env)
    assert r.code == 2 and "launch: would stop: --tensor-parallel-size '0'" in r.out


@pytest.mark.parametrize("flag,value,expect", [
    ("--max-model-len", "32k", 32000), ("--max-model-len", "1K", 1024), ("--max-model-len", "25.6k", 25600),
    ("--max-model-len", " 12 ", 12), ("--max-model-len", "1_000", 1000), ("--max-model-len", "auto", AUTO_LEN),
    ("--max-model-len", "-1", AUTO_LEN), ("--max-num-batched-tokens", "2K", 2048),
    ("--gpu-memory-utilization", "1", 1.0), ("--gpu-memory-utilization", "9e-1", 0.9),
    ("--tensor-parallel-size", "+2", 2), ("--max-num-seqs", "8", 8)])
def test_what_vllm_accepts_is_accepted_with_vllms_value(flag, value, expect):
    checked = check_launch_args(read_vllm_args(["/m", flag, value]), 2)
    assert checked.errors == ()
    assert getattr(checked.numbers, flag[2:].replace("-", "_")) == expect


def test_the_rule_table_and_the_checked_numbers_name_the_same_flags():
    assert {f.name for f in fields(LaunchNumbers)} == {r.flag[2:].replace("-", "_") for r in ARG_RULES}


def test_tensor_parallel_over_several_nodes_is_not_counted_against_this_one():
    assert check_launch_args(read_vllm_args(["/m", "-tp", "4", "--nnodes", "2"]), 2).errors == ()
    assert check_launch_args(read_vllm_args(["/m", "-tp", "4"]), 0).errors == ()  # no GPU: the checks say it


def test_human_int_matches_vllms_forms():
    assert [human_int(v) for v in ("8192", "1k", "1K", "2M", "1.5m", "3g", "1T")] == [
        8192, 1000, 1024, 2 * 2**20, 1_500_000, 3 * 10**9, 2**40]
    for bad in ("1.5K", "1e3", "", "k", "32kb", "None"):
        with pytest.raises(ValueError):
            human_int(bad)


def test_the_memory_plan_uses_the_value_vllm_will_use(tmp_path):
    r = run_main(serve.PROG, serve.main, [MODEL, "--max-model-len", "32K", "--dry-run", "--facts", FACTS],
                 _env(tmp_path))
    assert r.code == 0, r.err
    assert "kept: --max-model-len 32K as given (the memory plan uses it)" in r.out
    assert "x (32,768 tokens x" in r.out  # the arithmetic is about 32K = 32,768 tokens


def test_auto_max_model_len_is_kept_and_not_filled(tmp_path):
    r = run_main(serve.PROG, serve.main, [MODEL, "--max-model-len", "auto", "--dry-run", "--facts", FACTS],
                 _env(tmp_path))
    assert r.code == 0, r.err
    kept = [ln for ln in r.out.splitlines() if "kept: --max-model-len" in ln]
    assert kept == ["note: kept: --max-model-len auto as given (vLLM fits the length to the memory at start; "
                    "the memory lines show what fits)"]
    assert "arg --max-model-len" not in r.out


def test_a_kept_note_never_claims_a_memory_plan_that_was_not_made(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    shutil.copy(Path(MODEL) / "config.json", model)  # no weights, no index: the size is unknown
    r = run_main(serve.PROG, serve.main, [str(model), "-tp", "2", "--max-num-seqs", "4",
                                          "--gpu-memory-utilization", "0.8", "--dry-run", "--facts", FACTS],
                 _env(tmp_path))
    assert r.code == 0, r.err
    kept = [ln for ln in r.out.splitlines() if ln.startswith("note: kept: ")]  # not env lines another test set
    assert len(kept) == 3 and all("(no memory plan: GPU memory or checkpoint size unknown)" in ln for ln in kept)
    assert "the memory plan uses it" not in r.out


def test_what_the_model_directory_could_not_read_is_in_the_plan(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    os.mkfifo(model / "config.json")
    r = run_main(serve.PROG, serve.main, [str(model), "--json", "--facts", FACTS], _env(tmp_path))
    assert r.code == 0, r.err
    notes = json.loads(r.out)["notes"]
    assert any(n.startswith("model: config.json unreadable") for n in notes), notes


_FLAGS = [r.flag for r in ARG_RULES]
_RAW = st.text(max_size=12) | st.sampled_from(["0", "-1", "1e3", "nan", "inf", "1.5", "32k", "1K", "auto", "10**9"])


@FAST
@given(flag=st.sampled_from(_FLAGS), value=_RAW, as_json=st.booleans())
def test_any_value_is_a_plan_or_one_line_naming_the_flag(tmp_path_factory, flag, value, as_json):
    home = tmp_path_factory.mktemp("h")
    r = run_main(serve.PROG, serve.main, [MODEL, f"{flag}={value}", "--json" if as_json else "--dry-run",
                                          "--facts", FACTS], _env(home))
    assert_clean(r)
    if r.code == 2:
        assert r.err.startswith(f"{ERR}{flag}"), r.err
    else:
        assert r.code == 0 and r.err == ""
    if as_json:
        json.loads(r.out, parse_constant=_no_constant)


_SIZES = st.sampled_from([0, 1, 2**31, 2**53 + 1, 10**18]) | st.integers(min_value=0, max_value=2**40)


@FAST
@given(gpu_mib=_SIZES, host_mib=_SIZES, util=st.sampled_from(["0.01", "1", "1e-300", "0.999999999"]))
def test_every_json_plan_is_strict_json(tmp_path_factory, gpu_mib, host_mib, util):
    from helpers.facts import facts_dict
    data = facts_dict(host={"memory_total_mib": host_mib})
    for gpu in data["gpus"]:
        gpu["memory_total_mib"] = gpu_mib
    home = tmp_path_factory.mktemp("h")
    facts = home / "facts.json"
    facts.write_text(json.dumps(data))
    for argv in ([MODEL, "--gpu-memory-utilization", util, "--json", "--facts", str(facts)],):
        r = run_main(serve.PROG, serve.main, argv, _env(home))
        assert_clean(r)
        if r.out:
            json.loads(r.out, parse_constant=_no_constant)
