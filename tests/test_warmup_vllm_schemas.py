"""The fake server and the warmup's requests checked against vLLM 0.21's own pydantic protocol models.

This keeps the fake honest (its replies parse as vLLM's response types) and the warmup honest
(every request body it sends is one vLLM's request types accept, with no field vLLM does not know).
"""

import json

import httpx
import pytest

from caovan_vllm_sm75_turbo3.cli.common import run_cli
from caovan_vllm_sm75_turbo3.cli.warmup import PROG, main

from helpers.fake_vllm_server import MODEL, fake  # noqa: F401  (fake is a pytest fixture)

pytestmark = pytest.mark.vllm

chat_proto = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")
completion_proto = pytest.importorskip("vllm.entrypoints.openai.completion.protocol")
engine_proto = pytest.importorskip("vllm.entrypoints.openai.engine.protocol")
tokenize_proto = pytest.importorskip("vllm.entrypoints.serve.tokenize.protocol")

FAST = ["--max-num-batched-tokens", "256", "--max-num-seqs", "2", "--decode-tokens", "8",
        "--wait", "5", "--poll-interval", "0.05", "--step-timeout", "5"]


def _strict(model_cls, body):
    """Validate like vLLM and also refuse fields it does not declare (vLLM only logs those)."""
    unknown = set(body) - set(model_cls.model_fields)
    assert not unknown, f"{model_cls.__name__} does not know {unknown}"
    return model_cls.model_validate(body)


def test_every_warmup_request_is_a_valid_vllm_request(fake, capsys):
    srv = fake(tool_parser=True, reasoning_parser=True)
    assert run_cli(PROG, main, ["--api-base", srv.url, *FAST]) == 0
    capsys.readouterr()
    kinds = set()
    for path, _, body in srv.requests:
        if path == "/v1/chat/completions":
            req = _strict(chat_proto.ChatCompletionRequest, body)
            kinds.add("stream" if req.stream else "tools" if req.tools else "chat")
        elif path == "/v1/completions":
            _strict(completion_proto.CompletionRequest, body)
            kinds.add("completion")
        elif path == "/tokenize":
            _strict(tokenize_proto.TokenizeChatRequest, body)
            kinds.add("tokenize")
        else:
            pytest.fail(f"unexpected request to {path}")
    assert kinds == {"chat", "stream", "tools", "completion", "tokenize"}


def test_fake_replies_parse_as_vllm_responses(fake):
    srv = fake(prompt_tokens_details=True, reasoning_parser=True, tool_parser=True,
               faults={"err": "stream-error"})
    msgs = [{"role": "user", "content": "hello there"}]
    with httpx.Client(base_url=srv.url, timeout=5) as http:
        engine_proto.ModelList.model_validate(http.get("/v1/models").json())
        tok = http.post("/tokenize", json={"model": MODEL, "messages": msgs}).json()
        assert tokenize_proto.TokenizeResponse.model_validate(tok).count == len(tok["tokens"])
        tok = http.post("/tokenize", json={"model": MODEL, "prompt": "hello there"}).json()
        assert tokenize_proto.TokenizeResponse.model_validate(tok).count == 2
        chat = http.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs, "max_tokens": 4}).json()
        parsed = chat_proto.ChatCompletionResponse.model_validate(chat)
        assert parsed.choices[0].message.reasoning and parsed.usage.prompt_tokens_details.cached_tokens == 0
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        called = http.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs, "tools": tools}).json()
        assert chat_proto.ChatCompletionResponse.model_validate(called).choices[0].message.tool_calls
        done = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3}).json()
        completion_proto.CompletionResponse.model_validate(done)
        for headers, error_code in (({}, None), ({"X-Request-Id": "caovan-warmup:err:n:0"}, 500)):
            body = {"model": MODEL, "messages": msgs, "max_tokens": 4, "stream": True,
                    "stream_options": {"include_usage": True}}
            with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
                lines = [ln for ln in resp.iter_lines() if ln]
            assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)
            for ln in lines[:-1]:
                data = json.loads(ln[6:])
                if "error" in data:
                    assert engine_proto.ErrorResponse.model_validate(data).error.code == error_code
                else:
                    chat_proto.ChatCompletionStreamResponse.model_validate(data)
        missing = http.post("/v1/chat/completions", json={"model": "other", "messages": msgs})
        assert missing.status_code == 404
        assert engine_proto.ErrorResponse.model_validate(missing.json()).error.type == "NotFoundError"
