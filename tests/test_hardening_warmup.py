"""Issue 17 for `caovan-sm75-warmup`: every time limit is wall-clock, bad connection input is exit 2 at once,
no secret is printed, server replies are read bounded in size and time, `--json` is strict JSON.

Real loopback servers only (the fake vLLM on 127.0.0.1, or a port nothing listens on); every server is
stopped by the `fake` fixture.
"""

from __future__ import annotations

import json
import socket
import string
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caovan_vllm_sm75_turbo3.cli.common import run_cli
from caovan_vllm_sm75_turbo3.cli.common import json_text
from caovan_vllm_sm75_turbo3.cli.warmup import PROG, main
from caovan_vllm_sm75_turbo3.errors import SettingError
from caovan_vllm_sm75_turbo3.server_api.address import normalize_api_base, redact
from caovan_vllm_sm75_turbo3.server_api.client import ServerClient
from caovan_vllm_sm75_turbo3.server_api.transport import StepError
from caovan_vllm_sm75_turbo3.server_api.readiness import NotReady, wait_until_ready

from helpers.fake_vllm_server import MODEL, fake  # noqa: F401  (fake is a pytest fixture)
from helpers.hostile import TRACEBACK

SMALL = ["--max-num-batched-tokens", "128", "--max-num-seqs", "1", "--decode-tokens", "4", "--no-warm-pass",
         "--poll-interval", "0.05"]
PASSWORD = "hunter2-Pa55word"
KEY = "sk-Very-Secret-Key-123"


def chat_body(stream: bool = False) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}


def rid(label: str) -> str:
    return f"caovan-warmup:{label}:test:0"


def closed_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(capsys, *args: str) -> tuple[int, str, str, float]:
    start = time.monotonic()
    try:
        code = run_cli(PROG, main, list(args))
    except SystemExit as exit_:  # argparse refusals
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err, time.monotonic() - start


# --- 1. wall-clock limits ----------------------------------------------------------------------

@pytest.mark.parametrize("fault,stream", [("drip", True), ("drip", False), ("slow-headers", False)])
def test_a_trickling_reply_ends_at_the_request_limit(fake, fault, stream):
    srv = fake(faults={"t": fault}, drip_s=0.05, hang_s=6)
    start = time.monotonic()
    with ServerClient(srv.url) as client, pytest.raises(StepError, match=r"timeout: no complete reply within 0.6 s"):
        client.chat(chat_body(stream), 0.6, rid("t"))
    assert time.monotonic() - start < 1.5


def test_a_trickling_health_check_ends_at_wait(fake):
    srv = fake(health_fault="drip", drip_s=0.05, hang_s=6)
    start = time.monotonic()
    with ServerClient(srv.url) as client, pytest.raises(NotReady, match="not ready after 0.8 s"):
        wait_until_ready(client, MODEL, wait_s=0.8, poll_s=0.05)
    assert time.monotonic() - start < 1.8


def test_a_trickling_stream_does_not_hold_the_warmup(fake, capsys):
    srv = fake(faults={"stream": "drip"}, drip_s=0.05, hang_s=8)
    code, out, _, took = cli(capsys, "--api-base", srv.url, *SMALL, "--wait", "2", "--step-timeout", "2",
                             "--timeout", "stream=0.7")
    assert code == 1 and took < 6
    assert out.strip().splitlines()[-1] == ("[Caovan] warmup=FAILED step=stream "
                                            "reason=timeout: no complete reply within 0.7 s")


# --- 2. bounded reads --------------------------------------------------------------------------

@pytest.mark.parametrize("fault,stream,needle", [
    ("no-newline", True, "a line of the event stream is over 1 MiB"),
    ("huge", False, "the reply body is over 4 MiB"),
])
def test_a_reply_that_grows_without_end_is_refused_at_a_size(fake, fault, stream, needle):
    srv = fake(faults={"g": fault}, hang_s=5)
    start = time.monotonic()
    with ServerClient(srv.url) as client, pytest.raises(StepError, match=needle):
        client.chat(chat_body(stream), 4, rid("g"))
    assert time.monotonic() - start < 3


# --- 3. bad input: exit 2 at once, one line ------------------------------------------------------

@pytest.mark.parametrize("key", ["abc\ndef-key", "clé-secrète", "tab\tkey", "nul\x00key", "bell\x07", " lead"])
def test_a_header_breaking_api_key_is_bad_input(fake, capsys, key):
    srv = fake()
    code, out, err, took = cli(capsys, "--api-base", srv.url, f"--api-key={key}", "--wait", "5")
    assert code == 2 and took < 2 and out == ""
    assert err == (f"{PROG}: error: the API key from flag --api-key contains characters not allowed in an HTTP "
                   "header (accepted: printable ASCII without spaces)\n")
    assert srv.requests == [] and key not in err


def test_a_header_breaking_key_from_the_environment_names_the_variable(fake, capsys, monkeypatch):
    srv = fake()
    monkeypatch.setenv("VLLM_API_KEY", "line\r\nX-Evil: 1")
    code, _, err, _ = cli(capsys, "--api-base", srv.url, "--wait", "5")
    assert code == 2 and "the API key from env VLLM_API_KEY contains characters not allowed" in err
    assert "Evil" not in err and err.count("\n") == 1


@pytest.mark.parametrize("url,needle", [
    ("http://127.0.0.1:99999", "the port must be a whole number from 1 to 65535"),
    ("http://127.0.0.1:abc", "the port must be a whole number from 1 to 65535"),
    ("http://127.0.0.1:0", "the port must be a whole number from 1 to 65535"),
    ("http://127.0.0.1:/v1", "the port must be a whole number from 1 to 65535"),  # a colon with no port
    ("http://" + "a" * 254 + ":8000", "the host name is longer than 253 characters"),
    ("http://" + "b" * 64 + ".example:8000", "a label of the host name is longer than 63 characters"),
    ("file:///etc/passwd", "use http://HOST:PORT"),
    ("ws://127.0.0.1:8000", "use http://HOST:PORT"),
    ("http://127.0.0.1:8000/a b\nc", "is not accepted"),
])
def test_a_bad_api_base_is_bad_input(capsys, url, needle):
    code, out, err, took = cli(capsys, "--api-base", url, "--wait", "30")
    assert code == 2 and took < 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"{PROG}: error: --api-base ") and needle in err


OPTIONS = ["--wait", "--poll-interval", "--step-timeout", "--max-num-batched-tokens", "--max-num-seqs",
           "--decode-tokens"]


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "-1", "-inf", "99999999999999999999999"])
@pytest.mark.parametrize("option", OPTIONS)
def test_a_non_finite_or_absurd_number_is_bad_input(capsys, option, value):
    code, out, err, took = cli(capsys, "--list-steps", f"{option}={value}")
    assert code == 2 and took < 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"{PROG}: error: argument {option}: {value!r} is not accepted: a ")


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "-1"])
def test_a_non_finite_step_timeout_is_bad_input(capsys, value):
    code, _, err, _ = cli(capsys, "--list-steps", "--timeout", f"chat-tiny={value}")
    assert code == 2 and err.count("\n") == 1 and "--timeout 'chat-tiny=" in err and "SECONDS > 0 and <=" in err


# --- 4. what a wrong address is --------------------------------------------------------------------

def test_https_against_plain_http_says_so_at_once(fake, capsys):
    srv = fake()
    url = srv.url.replace("http://", "https://")
    code, out, _, took = cli(capsys, "--api-base", url, *SMALL, "--wait", "30")
    assert code == 2 and took < 3
    assert (f"reason=the server at {url} answered plain HTTP to an https:// request: use http://"
            in out.strip().splitlines()[-1])


def test_a_closed_port_says_nothing_listens(capsys):
    port = closed_port()
    code, out, err, took = cli(capsys, "--api-base", f"http://127.0.0.1:{port}", *SMALL, "--wait", "0.5")
    assert code == 3 and took < 3
    assert f"nothing listens on 127.0.0.1:{port}" in out.strip().splitlines()[-1]
    assert "connection refused" in err  # while waiting, a refused connection is the normal not-yet-up case


# --- 5. no secret is printed -------------------------------------------------------------------------

def test_redact_hides_url_passwords_and_the_key():
    text = f"GET http://user:{PASSWORD}@gpu:8000/v1 failed; key {KEY}; https://:{PASSWORD}@h/"
    shown = redact(text, [KEY])
    assert PASSWORD not in shown and KEY not in shown
    assert "http://user:***@gpu:8000/v1" in shown and "https://:***@h/" in shown
    assert redact("http://user@gpu:8000") == "http://user@gpu:8000"


@pytest.mark.parametrize("as_json", [False, True])
def test_no_secret_in_text_json_progress_or_errors(fake, capsys, as_json):
    srv = fake()  # (a password in the URL is sent as Basic auth, which would replace the bearer key)
    url = srv.url.replace("http://", f"http://user:{PASSWORD}@")
    extra = ["--json"] if as_json else []
    code, out, err, _ = cli(capsys, "--api-base", url, f"--api-key={KEY}", *SMALL, "--wait", "5", *extra)
    assert code == 0
    for secret in (PASSWORD, KEY):
        assert secret not in out and secret not in err
    assert "user:***@127.0.0.1" in (out + err)
    if as_json:
        assert json.loads(out)["settings"]["api_key"] == "flag --api-key"
    # Failures: a closed port, a bad port and a model not served print the address without the password.
    closed = f"http://user:{PASSWORD}@127.0.0.1:{closed_port()}"
    for args in (["--api-base", closed, "--wait", "0.3"], ["--api-base", f"http://u:{PASSWORD}@h:99999"],
                 ["--api-base", url, f"--api-key={KEY}", "--model", "not-served", "--wait", "5"]):
        code, out, err, _ = cli(capsys, *args, *SMALL, *extra)
        assert code in (2, 3) and PASSWORD not in out + err and KEY not in out + err
        assert "u:***@" in out + err or "user:***@" in out + err


def test_a_bad_api_base_message_hides_the_password():
    with pytest.raises(SettingError) as err:
        normalize_api_base(f"http://me:{PASSWORD}@host:99999")
    assert PASSWORD not in str(err.value) and "me:***@host:99999" in str(err.value)


# --- 6. strict JSON --------------------------------------------------------------------------------

def test_strict_json_writes_null_for_non_finite_numbers():
    text = json_text({"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": -float("inf")}})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": {"d": None}}
    assert "NaN" not in text and "Infinity" not in text


# --- property: hostile values through the whole command -------------------------------------------

_HOSTILE = string.printable + "\x00\x07\x1b\x7f\u00e9\u2028\u202e\ufeff\U0001f600"
_numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                     st.integers(min_value=-10**30, max_value=10**30).map(str),
                     st.text(alphabet=_HOSTILE, max_size=12))


@pytest.fixture(scope="module")
def quiet_server():
    """One fake for all examples; it serves another model, so a valid command ends at readiness (exit 2)."""
    from helpers.fake_vllm_server import FakeConfig, FakeVllm
    srv = FakeVllm(FakeConfig(models=("other-model",))).start()
    try:
        yield srv
    finally:
        srv.stop()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_values_end_fast_with_one_line_and_no_secret(quiet_server, capsys, data):
    key = "KeY" + data.draw(st.text(alphabet=_HOSTILE, min_size=5, max_size=30), label="key")
    port = data.draw(st.one_of(st.just(str(quiet_server.port)), st.integers(65536, 10**12).map(str),
                               st.text(alphabet=_HOSTILE, max_size=6)), label="port")
    host = data.draw(st.sampled_from(["127.0.0.1", "a" * 300, ("x" * 70) + ".y", "[::1", "h\u00e9\x00st"]),
                     label="host")
    scheme = data.draw(st.sampled_from(["http", "https", "ftp", "HTTP", "javascript"]), label="scheme")
    option, value = data.draw(st.sampled_from(OPTIONS + ["--timeout"]), label="option"), data.draw(_numbers)
    if option == "--timeout":
        option, value = "--timeout", f"chat-tiny={value}"
    as_json = data.draw(st.booleans(), label="json")
    url = f"{scheme}://user:{PASSWORD}@{host}:{port}/v1"
    args = ["--api-base", url, f"--api-key={key}", "--model", MODEL, f"{option}={value}", *SMALL,
            "--wait", "0.5", "--step-timeout", "1"] + (["--json"] if as_json else [])
    code, out, err, took = cli(capsys, *args)
    assert code in (0, 1, 2) and took < 5
    assert TRACEBACK not in out + err
    assert PASSWORD not in out + err and key not in out + err
    if not out:  # refused before any server was contacted
        assert err.count("\n") == 1 and err.startswith(f"{PROG}: error: ")
    elif as_json:
        json.loads(out)
