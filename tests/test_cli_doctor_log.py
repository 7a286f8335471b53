"""`caovan-sm75-doctor --log FILE|-` as a user runs it: text and JSON, stdin, exit codes, bad paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LOGS = Path(__file__).resolve().parent / "data" / "logs"


def doctor(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAOVAN_")}
    r = subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.doctor", *args],
                       input=stdin, capture_output=True, env=env, timeout=60)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(), r.stderr.decode())


def test_text_report_in_order_of_importance():
    r = doctor("--log", str(LOGS / "mixed_wait_harmless_then_gdn_invalid_handle.log"))
    assert r.returncode == 2, r.stderr
    out = r.stdout
    # our status lines first, then the first real failure, then each known message, then the verdict
    banner = out.index("Caovan vLLM SM75 Turbo3 external plugin v0.1.0")
    first = out.index("FIRST REAL FAILURE (line 23): RuntimeError: CUDA error: invalid resource handle")
    known = out.index("Known messages:")
    verdict = out.index("Verdict: FATAL")
    assert banner < first < known < verdict
    assert "runtime=PASS" in out[banner:first] and "sm75=2/2" in out[banner:first]
    assert "CAOVAN_GDN_LEGACY_DISABLE=1" in out[first:known]
    section = out[known:verdict]
    assert section.index("FATAL") < section.index("HARMLESS")
    assert "the server answered afterwards" in section
    assert r.stderr == ""


def test_json_report_matches_the_text_one():
    r = doctor("--log", str(LOGS / "shm_wait_then_execute_timeout.log"), "--json")
    assert r.returncode == 2
    data = json.loads(r.stdout)
    assert data["verdict"] == "fatal" and data["exit_code"] == 2 and data["vllm_version"] == "0.21.0"
    assert data["first_failure"]["id"] == "execute-timeout" and data["first_failure"]["line"] == 35
    ids = {f["id"]: f for f in data["findings"]}
    assert ids["shm-broadcast-wait"]["status"] == "fatal" and ids["shm-broadcast-wait"]["count"] == 4
    assert set(ids["execute-timeout"]) >= {"cause", "fix", "first_line", "last_line", "text", "details"}
    assert data["caovan"]["version"] is None


@pytest.mark.parametrize("name,code,verdict", [
    ("clean_plain_vllm.log", 0, "clean"),
    ("harmless_tp2_colour.log", 0, "harmless-only"),
    ("shm_wait_then_ready.log", 0, "harmless-only"),
    ("caovan_dispatch_failed_fallback.log", 1, "warning"),
    ("shm_wait_log_ends.log", 1, "undecided"),   # the start never finished in this log
    ("bf16_on_turing.log", 2, "fatal"),
])
def test_exit_codes(name, code, verdict):
    r = doctor("--log", str(LOGS / name), "--json")
    assert r.returncode == code, r.stdout + r.stderr
    assert json.loads(r.stdout)["verdict"] == verdict


def test_clean_log_says_so_in_words():
    r = doctor("--log", str(LOGS / "clean_plain_vllm.log"))
    assert r.returncode == 0
    assert "Verdict: OK: no known problem (exit 0); the server started (line 16" in r.stdout
    assert "Known messages" not in r.stdout and "FIRST REAL FAILURE" not in r.stdout


def test_standard_input():
    data = (LOGS / "triton_shared_memory_gdn.log").read_bytes()
    r = doctor("--log", "-", "--json", stdin=data)
    assert r.returncode == 2, r.stderr
    out = json.loads(r.stdout)
    assert out["source"] == "-" and out["first_failure"]["id"] == "triton-shared-memory"
    text = doctor("--log", "-", stdin=data)
    assert text.stdout.startswith("Log: standard input (16 lines, vLLM 0.21.0)")


@pytest.mark.parametrize("make,words", [
    (lambda d: d / "missing.log", "No such file"),
    (lambda d: d, "Is a directory"),
    (lambda d: (d / "f.log").write_text("x") and d / "f.log" / "inner.log", "Not a directory"),
])
def test_unreadable_path_is_one_error_line(tmp_path, make, words):
    r = doctor("--log", str(make(tmp_path)))
    assert r.returncode == 2 and r.stdout == ""
    [line] = r.stderr.splitlines()
    assert line.startswith("caovan-sm75-doctor: error: --log ") and words in line
    assert "Traceback" not in r.stderr


def test_binary_file_is_one_error_line(tmp_path):
    path = tmp_path / "vllm.log"
    path.write_bytes(bytes(range(256)) * 64)
    r = doctor("--log", str(path))
    assert r.returncode == 2 and "not a text log" in r.stderr and len(r.stderr.splitlines()) == 1


def test_log_does_not_mix_with_machine_options():
    r = doctor("--log", str(LOGS / "clean_plain_vllm.log"), "--settings")
    assert r.returncode == 2 and "--log reads a log only" in r.stderr


def test_help_documents_log_and_its_exit_codes():
    r = doctor("--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "--log FILE" in text and "standard input" in text
    assert "With --log: 0 clean or only harmless messages, 1 warnings only" in text
    assert "2 a fatal failure" in text
