"""Text from outside is data, secrets never leave, our flags mean what they say (issue 29): the one
escaping function and the one redaction function, and the real commands that print through them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from helpers.facts import EXAMPLES, ROOT
from helpers.hostile import FAST

from caovan_vllm_sm75_turbo3.textsafe import redact, redact_argv, safe, shown

BIN = Path(sys.executable).parent
FACTS = str(EXAMPLES / "2x2080ti-22g.json")
HF = "hf_AbCdEfGhIjKlMnOpQrStUv0123"
HOSTILE = ["\n", "\r", "\x1b[2J", "\x1b]0;pwned\x07", "\u202e", "\u2066", "\u200b", "\x85", "\u2028", "\ud800",
           "\x00", "\x7f", "\x9b31m"]


def _printable(line: str) -> bool:
    return all(unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Zl", "Zp") for ch in line)


@FAST
@given(text=st.text() | st.lists(st.sampled_from(HOSTILE + ["a", "runtime=FAIL", " "])).map("".join))
def test_shown_is_one_printable_line(text):
    out = shown(text)
    assert "\n" not in out and _printable(out)
    assert shown(out) == out or "\\" in out   # escaping what is escaped only adds backslashes


@FAST
@given(prefix=st.text(max_size=20), suffix=st.text(max_size=20))
def test_redact_hides_every_kind_of_secret(prefix, suffix):
    for secret, text in [(HF, f"token {HF}"), ("p4ssw0rd", "http://user:p4ssw0rd@host:8000/v1"),
                         ("sk-abcdef123456", "Authorization: Bearer sk-abcdef123456"),
                         ("k3y-value", "--api-key k3y-value"), ("k3y-value", "--api-key=k3y-value"),
                         ("t0ken-value", "HF_TOKEN=t0ken-value"), ("t0ken-value", "VLLM_API_KEY: t0ken-value")]:
        out = redact(prefix + " " + text + " " + suffix)
        assert secret not in out and "***" in out


def test_redact_argv_hides_secret_flag_values():
    argv = ["vllm", "serve", "m", "--api-key", "k3y", "--hf-token=hf_x", "--port", "8000"]
    assert redact_argv(argv) == ["vllm", "serve", "m", "--api-key", "***", "--hf-token=***", "--port", "8000"]


def _run(args, tmp_path, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("CAOVAN_")}
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=120,
                          env={**base, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c"), **env},
                          stdin=subprocess.DEVNULL)


def test_a_hostile_model_path_and_config_cannot_fake_our_lines(tmp_path):
    model = tmp_path / "m\nruntime=FAIL\x1b]0;x\x07"
    model.mkdir()
    config = json.loads((ROOT / "examples" / "models" / "qwen3.6-27b-awq" / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config).replace("Qwen3_5ForConditionalGeneration",
                                                                  "Qwen\\ud800\\n[Caovan] warmup=READY"))
    r = _run(["caovan-vllm-serve", "--dry-run", "--facts", FACTS, str(model)], tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines.count("runtime=PASS") == 1 and "runtime=FAIL" not in lines
    assert not any(line.startswith("[Caovan] warmup=") for line in lines)
    assert all(_printable(line) for line in lines)


def test_the_dry_run_never_prints_a_secret(tmp_path):
    args = ["caovan-vllm-serve", "--facts", FACTS, "m", "--api-key", "sk-SECRET-123456", "--hf-token", HF]
    for extra in (["--dry-run"], ["--json"]):
        r = _run([*args, *extra], tmp_path)
        assert r.returncode == 0, r.stderr
        assert "sk-SECRET-123456" not in r.stdout + r.stderr and HF not in r.stdout + r.stderr
        assert "***" in r.stdout


def test_doctor_log_never_prints_a_secret_or_a_control(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(f"INFO 12-05 02:00:00 [x.py:1] downloading with {HF} from https://u:p4ssw0rd@hub/x\n"
                   "ERROR 12-05 02:00:01 [x.py:2] Authorization: Bearer sk-abcdef123456 \u202eevil\n"
                   "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    for extra in ([], ["--json"]):
        r = _run(["caovan-sm75-doctor", "--log", str(log), *extra], tmp_path)
        out = r.stdout + r.stderr
        assert r.returncode == 2 and HF not in out and "p4ssw0rd" not in out and "sk-abcdef123456" not in out
        assert "\u202e" not in out


SECRET_TEXTS = [(HF, "downloading with {}"), ("p4ssw0rd", "from https://u:{}@hub/x"),
                ("sk-abcdef123456", "Authorization: Bearer {}")]


@FAST
@given(secret=st.sampled_from(SECRET_TEXTS), around=st.lists(st.sampled_from(HOSTILE + ["a", " ", ":"]),
                                                            max_size=5).map("".join),
       line=st.sampled_from(["ERROR 12-05 02:00:01 [x.py:2] {}", "torch.OutOfMemoryError: CUDA out of memory. {}",
                             "ValueError: {}", "(EngineCore_DP0 pid=1) CRITICAL 12-05 02:00:01 [c.py:9] {}"]))
def test_doctor_log_prints_no_secret_and_no_control_wherever_the_log_holds_them(secret, around, line):
    """Every printed form of a log line (the finding's excerpt, the first failure, --json) is
    redacted and escaped, whichever kind of line the secret and the hostile text sit in."""
    from helpers.hostile import TRACEBACK, run_main

    from caovan_vllm_sm75_turbo3.cli import doctor
    value, template = secret
    text = line.format(around + template.format(value) + around)
    with tempfile.TemporaryDirectory() as d:
        log = Path(d, "vllm.log")
        log.write_bytes((text + "\n").encode("utf-8", "surrogatepass"))
        plain = run_main(doctor.PROG, doctor.main, ["--log", str(log)])
        as_json = run_main(doctor.PROG, doctor.main, ["--log", str(log), "--json"])
    for r in (plain, as_json):
        assert r.code in (0, 1, 2) and TRACEBACK not in r.out + r.err
        assert value not in r.out + r.err
        assert all(_printable(ln) for ln in (r.out + r.err).splitlines())
    if as_json.code == 2 and not as_json.out:   # a NUL byte: refused as "not a text log", one line
        assert as_json.err.startswith(f"{doctor.PROG}: error: ") and "not a text log" in as_json.err
    else:
        json.loads(as_json.out)


@pytest.mark.parametrize("args", [["caovan-vllm-serve", "m", "--dry-run=true"],
                                  ["caovan-vllm-serve", "m", "--json=1"],
                                  ["caovan-vllm-serve", "--facts", FACTS, "--dry-run", "m", "--model"]])
def test_our_flags_mean_what_they_say(tmp_path, args):
    r = _run(args, tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "vllm serve" not in r.stdout or "would" in r.stdout


def test_a_repeated_model_flag_plans_for_what_vllm_serves(tmp_path):
    r = _run(["caovan-vllm-serve", "--facts", FACTS, "--json", "--model", "A", "--model", "B"], tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["argv"][2:6] == ["--model", "A", "--model", "B"]
    from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args
    assert read_vllm_args(["--model", "A", "--model", "B"]).model == "B"   # argparse keeps the last


@pytest.mark.parametrize("command", ["caovan-sm75-doctor", "caovan-sm75-cache", "caovan-sm75-kernels",
                                     "caovan-sm75-verify", "caovan-sm75-warmup", "caovan-sm75-bench"])
def test_an_unknown_flag_is_one_line_everywhere(tmp_path, command):
    r = _run([command, "--no-such-flag"], tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"{command}: error: ") and "usage:" not in r.stderr


def test_an_error_line_is_escaped_and_redacted():
    assert safe("bad\n[Caovan] warmup=READY\x1b]0;t\x07 " + HF) == "bad\\n[Caovan] warmup=READY\\x1b]0;t\\x07 hf_***"


# -- a server's reply is checked before it is believed ----------------------------------------------

from helpers.hostile_server import MODEL as HOSTILE_MODEL  # noqa: E402
from helpers.hostile_server import HostileServer  # noqa: E402


def _client(command: str, url: str, *args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    r = subprocess.run([str(BIN / command), "--api-base", url, "--model", HOSTILE_MODEL, *args], capture_output=True,
                       text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return r, time.monotonic() - start


@pytest.mark.parametrize("command", ["caovan-sm75-warmup", "caovan-sm75-bench"])
def test_deep_json_is_a_bad_reply_not_a_traceback(command):
    with HostileServer("deep-json") as url:
        r, _ = _client(command, url, "--wait", "5")
    assert r.returncode != 0 and "Traceback" not in r.stderr and "RecursionError" not in r.stdout + r.stderr


def test_impossible_usage_counts_are_a_bad_reply():
    with HostileServer("bad-usage") as url:
        bench, _ = _client("caovan-sm75-bench", url, "--prompt-tokens", "16", "--output-tokens", "4",
                           "--concurrency", "1", "--repeats", "1")
        warm, _ = _client("caovan-sm75-warmup", url)
    assert bench.returncode == 1 and "not a token count" in bench.stderr, bench.stderr
    assert warm.returncode == 1 and "READY" not in warm.stdout.splitlines()[-1]


def test_an_endless_stream_is_stopped_and_said():
    with HostileServer("endless") as url:
        r, took = _client("caovan-sm75-bench", url, "--prompt-tokens", "16", "--output-tokens", "8",
                          "--concurrency", "1", "--repeats", "1", timeout=120)
    assert r.returncode == 1 and "stopped reading" in r.stderr, r.stderr[-500:]
    assert took < 25   # the server would stream for 30 s: we stop long before (a hang guard, not a speed test)


def test_a_forged_line_in_a_server_error_cannot_print_our_success_line():
    with HostileServer("forged-500") as url:
        r, _ = _client("caovan-sm75-warmup", url)
    lines = (r.stdout + r.stderr).splitlines()
    assert r.returncode == 1 and "[Caovan] warmup=READY" not in lines
    assert not any("\x1b" in line for line in lines)


# -- operating-system limits are bad input; what we generate stays small ---------------------------

@pytest.mark.parametrize("command", [["caovan-vllm-serve", "--dry-run", "--facts", FACTS],
                                     ["caovan-sm75-doctor", "--facts", FACTS, "--model"]])
def test_a_path_component_over_255_bytes_is_one_line_exit_2(tmp_path, command):
    r = _run([*command, str(tmp_path / ("a" * 300))], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "over 255 bytes" in r.stderr


def test_a_weight_file_that_is_a_device_is_named(tmp_path):
    (tmp_path / "model.safetensors").symlink_to("/dev/zero")
    (tmp_path / "config.json").write_text("{}")
    r = _run(["caovan-sm75-doctor", "--facts", FACTS, "--model", str(tmp_path)], tmp_path)
    assert "model.safetensors is not a regular file (a character device)" in r.stdout
    assert "not a local model directory" not in r.stdout


def test_a_huge_max_num_seqs_keeps_the_plan_small(tmp_path):
    from caovan_vllm_sm75_turbo3.policy.fill_decode import MAX_CAPTURE_TOKENS, capture_sizes
    assert capture_sizes(10**8, 3)[-1] <= MAX_CAPTURE_TOKENS and len(capture_sizes(10**8, 3)) == MAX_CAPTURE_TOKENS // 4
    assert capture_sizes(2, 3) == [4, 8] and capture_sizes(1, 1000) == [1001]
    model = str(ROOT / "examples" / "models" / "qwen3.6-27b-awq")
    start = time.monotonic()
    r = _run(["caovan-vllm-serve", "--dry-run", "--facts", FACTS, model, "--max-num-seqs", "100000000"], tmp_path)
    assert r.returncode == 0 and len(r.stdout) < 20_000 and time.monotonic() - start < 30


@pytest.mark.parametrize("command", ["caovan-sm75-warmup", "caovan-sm75-bench"])
def test_a_host_that_fails_idna_is_one_line(tmp_path, command):
    r = _run([command, "--api-base", "http://a..b:1", "--model", "x", "--wait", "2"], tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "not a valid name" in r.stderr


def test_an_error_line_quoting_a_huge_reply_stays_short():
    from caovan_vllm_sm75_turbo3.cli.common import MAX_ERROR_CHARS
    assert len(safe("x" * 2_000_000, MAX_ERROR_CHARS)) < MAX_ERROR_CHARS + 100
