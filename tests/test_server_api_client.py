"""The warmup's HTTP client and readiness wait against the local fake vLLM server (127.0.0.1 only)."""

import json
import time

import httpx
import pytest

from caovan_vllm_sm75_turbo3.errors import SettingError
from caovan_vllm_sm75_turbo3.server_api.address import is_loopback, normalize_api_base
from caovan_vllm_sm75_turbo3.server_api.client import Reply, ServerClient, add_stream_chunk, parse_chat
from caovan_vllm_sm75_turbo3.server_api.transport import Refused, Rejected, StepError, error_message
from caovan_vllm_sm75_turbo3.server_api.readiness import EXIT_BAD_INPUT, EXIT_NOT_READY, NotReady, wait_until_ready

from helpers.fake_vllm_server import MODEL, fake  # noqa: F401  (fake is a pytest fixture)


def chat_body(label="x", **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": f"hello {label}"}], "max_tokens": 5,
            "ignore_eos": True, **extra}


def rid(label):
    return f"caovan-warmup:{label}:test:0"


@pytest.mark.parametrize("raw,expected", [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"), ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"), ("https://gpu1:8443/vllm/v1/", "https://gpu1:8443/vllm"),
])
def test_normalize_api_base(raw, expected):
    assert normalize_api_base(raw) == expected


@pytest.mark.parametrize("raw", ["127.0.0.1:8000", "ftp://x", "http://", ""])
def test_bad_api_base_names_the_flag(raw):
    with pytest.raises(SettingError, match="--api-base"):
        normalize_api_base(raw)


def test_loopback_detection():
    assert is_loopback("http://127.0.0.1:1") and is_loopback("http://localhost:1") and is_loopback("http://[::1]:1")
    assert not is_loopback("http://10.0.0.5:8000") and not is_loopback("http://gpu-box:8000")


def test_error_message_reads_each_shape():
    assert error_message(b'{"error": {"message": "boom", "type": "X", "param": null, "code": 500}}') == "boom"
    assert error_message(b'{"error": "Unauthorized"}') == "Unauthorized"
    assert error_message(b'{"detail": "Not Found"}') == "Not Found"
    assert error_message(b"<html>bad gateway</html>") == "<html>bad gateway</html>"
    assert error_message(b"") == "(empty body)"


def test_stream_chunks_accumulate_and_an_error_chunk_raises():
    reply = Reply()
    add_stream_chunk({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, reply)
    add_stream_chunk({"choices": [{"index": 0, "delta": {"reasoning": "hmm"}}]}, reply)
    add_stream_chunk({"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]}, reply)
    add_stream_chunk({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2,
                                               "prompt_tokens_details": {"cached_tokens": 0}}}, reply)
    assert (reply.text, reply.reasoning, reply.finish_reason) == ("Hi", "hmm", "stop")
    assert (reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens) == (7, 2, 0)
    with pytest.raises(StepError, match="error inside the stream: Internal server error"):
        add_stream_chunk({"error": {"message": "Internal server error", "type": "InternalServerError",
                                    "code": 500}}, reply)


def test_parse_chat_tool_call_and_missing_choices():
    reply = parse_chat({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [{"id": "t", "type": "function",
                                                              "function": {"name": "f", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4}}, Reply())
    assert reply.tool_calls == 1 and not reply.empty and reply.text == ""
    assert Reply().empty
    with pytest.raises(StepError, match="no choices"):
        parse_chat({"choices": []}, Reply())


def test_chat_completion_and_stream_against_the_fake(fake):
    srv = fake(prompt_tokens_details=True)
    with ServerClient(srv.url) as client:
        reply = client.chat(chat_body(), 5, rid("a"))
        assert reply.text == " w0 w1 w2 w3 w4" and reply.completion_tokens == 5 and reply.finish_reason == "length"
        assert reply.prompt_tokens == client.tokenize({"model": MODEL, "messages": chat_body()["messages"]}, 5)
        streamed = client.chat(chat_body(stream=True, stream_options={"include_usage": True}), 5, rid("b"))
        assert streamed.text == reply.text and streamed.completion_tokens == 5
        assert streamed.chunks == 8  # role, 5 tokens, finish, usage
        assert streamed.ttft_s is not None and streamed.ttft_s <= streamed.latency_s
        done = client.completion({"model": MODEL, "prompt": "Once", "max_tokens": 3, "ignore_eos": True}, 5, rid("c"))
        assert done.text == " w0 w1 w2" and done.prompt_tokens == 1
    assert srv.labels() == ["a", "b", "c"]


@pytest.mark.parametrize("fault,stream,needle", [
    ("500", False, "HTTP 500 Internal Server Error: EngineCore encountered an issue"),
    ("500", True, "HTTP 500 Internal Server Error"),
    ("cut", True, "connection broken mid-reply"),
    ("cut", False, "connection broken mid-reply"),
    ("cut-clean", True, "stream cut: it ended after 3 chunks without data: [DONE]"),
    ("malformed", False, "malformed JSON in the 200 reply"),
    ("malformed", True, "malformed JSON in stream chunk 2"),
    ("stream-error", True, "error inside the stream: Internal server error"),
    ("wrong-shape", False, "unexpected reply shape"),
    ("wrong-shape", True, "unexpected reply shape"),
])
def test_faults_raise_with_a_reason(fake, fault, stream, needle):
    srv = fake(faults={"f": fault})
    with ServerClient(srv.url) as client, pytest.raises(StepError) as err:
        client.chat(chat_body(stream=stream), 5, rid("f"))
    assert needle in str(err.value)
    assert not isinstance(err.value, Rejected)


def test_a_hang_past_the_timeout_fails_in_time(fake):
    srv = fake(faults={"h": "hang"}, hang_s=5)
    start = time.monotonic()
    with ServerClient(srv.url) as client, pytest.raises(StepError, match="timeout: no complete reply within 0.3 s"):
        client.chat(chat_body(), 0.3, rid("h"))
    assert time.monotonic() - start < 2


def test_400_is_rejected_and_401_names_the_key(fake):
    srv = fake(api_key="sekrit")
    with ServerClient(srv.url, api_key="wrong") as client, pytest.raises(StepError) as err:
        client.chat(chat_body(), 5)
    assert "HTTP 401" in str(err.value) and "--api-key" in str(err.value)
    with ServerClient(srv.url, api_key="sekrit") as client:
        assert client.chat(chat_body(), 5).completion_tokens == 5
        with pytest.raises(Rejected, match="--enable-auto-tool-choice"):
            client.chat(chat_body(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="auto"), 5)


def test_tokenize_missing_endpoint_is_none(fake):
    srv = fake(tokenize=False)
    with ServerClient(srv.url) as client:
        assert client.tokenize({"model": MODEL, "prompt": "a b c"}, 5) is None
    srv2 = fake()
    with ServerClient(srv2.url) as client:
        assert client.tokenize({"model": MODEL, "prompt": "a b c"}, 5) == 3
        with pytest.raises(StepError, match="does not exist"):
            client.tokenize({"model": "nope", "prompt": "a"}, 5)


# --- readiness ---------------------------------------------------------------------------------

def test_waits_through_refused_connections_until_the_port_listens(fake):
    srv = fake(listen_after_s=0.6)
    seen = []
    with ServerClient(srv.url) as client:
        with pytest.raises(Refused, match=f"nothing listens on 127.0.0.1:{srv.port}"):  # really refused at
            client.get("/health", 1)  # first, as vLLM while its engine loads
        ready = wait_until_ready(client, None, wait_s=5, poll_s=0.05, on_wait=lambda what, t: seen.append(what))
    assert ready.model == MODEL and ready.max_model_len == 32768
    assert 0.5 <= ready.waited_s < 3
    assert seen and "connection refused" in seen[0]


def test_gives_up_after_wait(fake):
    srv = fake(listen_after_s=30)
    start = time.monotonic()
    with ServerClient(srv.url) as client, pytest.raises(NotReady) as err:
        wait_until_ready(client, MODEL, wait_s=0.4, poll_s=0.05)
    # nothing ever listened: the message says so, not that an engine is loading
    assert err.value.exit_code == EXIT_NOT_READY and "nothing listens on" in str(err.value)
    assert "whole 0.4 s wait" in str(err.value) and "Is the server started" in str(err.value)
    assert 0.4 <= time.monotonic() - start < 2   # the whole wait, not a poll less


def test_503_stops_at_once(fake):
    srv = fake(health_status=503)
    start = time.monotonic()
    with ServerClient(srv.url) as client, pytest.raises(NotReady) as err:
        wait_until_ready(client, MODEL, wait_s=30, poll_s=0.05)
    assert "503" in str(err.value) and "engine is dead" in str(err.value)
    assert err.value.exit_code == EXIT_NOT_READY and time.monotonic() - start < 2


def test_model_not_served_lists_the_served_names(fake):
    srv = fake(models=("qwen-a", "qwen-b"))
    with ServerClient(srv.url) as client:
        with pytest.raises(NotReady) as err:
            wait_until_ready(client, "Qwen3.6-27B-AWQ-INT4", wait_s=5, poll_s=0.05)
        assert err.value.exit_code == EXIT_BAD_INPUT
        assert "'Qwen3.6-27B-AWQ-INT4' is not served" in str(err.value) and "qwen-a, qwen-b" in str(err.value)
        with pytest.raises(NotReady, match="several models .*qwen-a, qwen-b.*--model"):
            wait_until_ready(client, None, wait_s=5, poll_s=0.05)
        assert wait_until_ready(client, "qwen-b", wait_s=5, poll_s=0.05).model == "qwen-b"


def test_models_needs_the_key_but_health_does_not(fake):
    srv = fake(api_key="k1")
    with ServerClient(srv.url) as client:
        assert client.get("/health", 2).status_code == 200
        with pytest.raises(NotReady) as err:
            wait_until_ready(client, MODEL, wait_s=5, poll_s=0.05)
    assert err.value.exit_code == EXIT_BAD_INPUT and "401" in str(err.value) and "VLLM_API_KEY" in str(err.value)
    with ServerClient(srv.url, api_key="k1") as client:
        assert wait_until_ready(client, MODEL, wait_s=5, poll_s=0.05).model == MODEL


def test_fake_models_schema_is_vllms():
    # The fake's /v1/models card carries the fields of vLLM 0.21's ModelCard.
    from helpers.fake_vllm_server import FakeVllm
    srv = FakeVllm().start()
    try:
        data = httpx.get(srv.url + "/v1/models", timeout=5).json()
        health = httpx.get(srv.url + "/health", timeout=5)
    finally:
        srv.stop()
    assert data["object"] == "list"
    assert set(data["data"][0]) >= {"id", "object", "created", "owned_by", "root", "parent", "max_model_len",
                                    "permission"}
    assert health.status_code == 200 and health.content == b""
    json.dumps(data)
