"""Output never crashes (issue 17): a full disk, a closed or early-closed standard output end the
installed console scripts quietly with the documented exit code; `--json` is strict JSON."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from helpers.hostile import FAST, VALUES, run_main

from caovan_vllm_sm75_turbo3.cli import common, doctor

from helpers.facts import EXAMPLES, ROOT

BIN = Path(sys.executable).parent
FACTS = str(EXAMPLES / "2x2080ti-22g.json")
COMMANDS = [
    (["caovan-sm75-doctor", "--facts", FACTS], 0),
    (["caovan-sm75-doctor", "--facts", FACTS, "--json"], 0),
    (["caovan-sm75-cache", "--facts", FACTS, "list", "--json"], 0),
]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAOVAN_")}
    return {**env, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.mark.parametrize("argv,code", COMMANDS)
def test_full_disk_is_one_line_and_exit_1(tmp_path, argv, code):
    with open("/dev/full", "w") as full:
        r = subprocess.run([str(BIN / argv[0]), *argv[1:]], stdout=full, stderr=subprocess.PIPE, text=True,
                           env=_env(tmp_path), timeout=60, cwd=ROOT)
    assert r.returncode == 1
    assert r.stderr == f"{argv[0]}: error: cannot write the output: No space left on device\n"


@pytest.mark.parametrize("argv,code", COMMANDS)
def test_closed_stdout_is_quiet_with_the_usual_code(tmp_path, argv, code):
    r = subprocess.run([str(BIN / argv[0]), *argv[1:]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, env=_env(tmp_path), timeout=60, cwd=ROOT,
                       preexec_fn=lambda: os.close(1))
    assert (r.returncode, r.stderr) == (code, "")


@pytest.mark.parametrize("argv,code", COMMANDS)
def test_pipe_closed_after_one_line_is_quiet(tmp_path, argv, code):
    proc = subprocess.Popen([str(BIN / argv[0]), *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(tmp_path), cwd=ROOT)
    try:
        first = proc.stdout.readline()
        proc.stdout.close()  # as `| head -1` does
        err = proc.stderr.read().decode()
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert first and err == ""
    assert rc in (code, common.EXIT_BROKEN_PIPE)  # 141 only when the broken pipe cut the command short


def test_broken_pipe_mid_output_is_141_and_after_the_work_the_commands_code(capsys):
    def cut_short(argv):
        print("x")
        raise common._OutputFailed(BrokenPipeError(32, "Broken pipe"))
    assert common.run_cli("p", cut_short, []) == 141
    assert capsys.readouterr().err == ""


def test_closed_stdout_inside_run_cli_becomes_devnull(monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)
    seen = []
    assert common.run_cli("p", lambda argv: seen.append(sys.stdout.isatty()) or print("dropped") or 3, []) == 3
    assert seen == [False] and sys.stdout is None


@FAST
@given(value=VALUES | st.lists(st.floats(), max_size=4))
def test_json_output_is_strict(value):
    text = common.json_text({"v": value})
    got = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in --json output"))

    def finite_equal(a, b):
        if isinstance(a, float):
            return b is None if not math.isfinite(a) else a == b
        if isinstance(a, dict):
            return list(a) == list(b) and all(finite_equal(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(finite_equal(x, y) for x, y in zip(a, b))
        return a == b
    assert finite_equal({"v": value}, got)


def test_doctor_json_parses_strictly():
    r = run_main(doctor.PROG, doctor.main, ["--facts", FACTS, "--json"])
    assert r.code == 0 and json.loads(r.out, parse_constant=lambda c: pytest.fail(c))["runtime"] == "PASS"
