"""vLLM's OpenAI endpoints on top of the transport: chat and text completions (SSE streams
included), /tokenize, and reading replies into `Reply`.

A reply that is not what vLLM sends on success (JSON that does not parse, an error chunk inside a
stream, a stream that ends before `data: [DONE]`, the wrong shape) raises `StepError` with a
reason a person can act on; nothing is hidden, except secrets.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from .transport import (SNIPPET, parse_json, Deadline, HttpReply, StepError, Transport, as_deadline, error_message,
                        raise_for_status, read_body, sse_lines)


@dataclass
class Reply:
    """What one generation request produced."""

    text: str = ""
    reasoning: str = ""
    tool_calls: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    latency_s: float = 0.0
    ttft_s: float | None = None  # streams only: time to the first generated text or token id
    last_token_s: float | None = None  # streams only: time to the last chunk that added text or token ids
    chunks: int = 0
    token_ids: int = 0  # streams only: generated token ids seen in chunks (vLLM's return_token_ids)

    @property
    def empty(self) -> bool:
        """The engine generated nothing: the server counted 0 completion tokens, or (no count given)
        the reply holds no text, reasoning or tool call. Judged by what was generated, not by the
        decoded text: tokens that decode to nothing (special tokens under ignore_eos) still ran."""
        if self.completion_tokens is not None:
            return self.completion_tokens <= 0
        return not (self.text or self.reasoning or self.tool_calls)


MAX_COUNT = 1 << 31   # a token count past this is not a count


def _count(value: Any, what: str) -> int:
    """A token count as the server sent it: a whole number from 0 to MAX_COUNT, else a bad reply."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise StepError(f"the reply's usage.{what} is not a token count: {json.dumps(value)[:SNIPPET]}")
    return value


def _usage(reply: Reply, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    for key in ("prompt_tokens", "completion_tokens"):
        if usage.get(key) is not None:
            setattr(reply, key, _count(usage[key], key))
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        reply.cached_tokens = _count(details["cached_tokens"], "prompt_tokens_details.cached_tokens")


def _choice(data: Any, what: str) -> dict[str, Any]:
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise StepError(f"the {what} reply has no choices: {json.dumps(data)[:SNIPPET]}")
    return choices[0]


def parse_chat(data: Any, reply: Reply) -> Reply:
    """Fill `reply` from a non-streaming chat.completion object."""
    choice = _choice(data, "chat")
    message = choice.get("message") or {}
    reply.text = message.get("content") or ""
    # vLLM 0.21 names it `reasoning`; older releases and some proxies `reasoning_content`.
    reply.reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
    reply.tool_calls = len(message.get("tool_calls") or [])
    reply.finish_reason = choice.get("finish_reason")
    _usage(reply, data.get("usage"))
    return reply


def parse_completion(data: Any, reply: Reply) -> Reply:
    """Fill `reply` from a non-streaming text_completion object."""
    choice = _choice(data, "completion")
    reply.text = choice.get("text") or ""
    reply.finish_reason = choice.get("finish_reason")
    _usage(reply, data.get("usage"))
    return reply


def add_stream_chunk(data: Any, reply: Reply) -> None:
    """Fold one `chat.completion.chunk` into `reply`; an `{"error": ...}` chunk (vLLM's way of
    failing after the 200 was sent) raises."""
    if not isinstance(data, dict):
        raise StepError(f"a stream chunk is not a JSON object: {json.dumps(data)[:SNIPPET]}")
    if "error" in data:
        raise StepError(f"error inside the stream: {error_message(json.dumps(data).encode())}")
    if not isinstance(data.get("choices"), list):   # vLLM's chunks all carry it (the usage chunk: [])
        raise StepError(f"a stream chunk without choices, not vLLM's shape: {json.dumps(data)[:SNIPPET]}")
    for choice in data.get("choices") or []:
        delta = choice.get("delta") or {}
        reply.text += delta.get("content") or ""
        reply.reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
        reply.tool_calls += sum(1 for call in delta.get("tool_calls") or [] if call.get("id"))
        ids = choice.get("token_ids")   # with return_token_ids: tokens that decode to no text count too
        reply.token_ids += len(ids) if isinstance(ids, list) else 0
        if choice.get("finish_reason"):
            reply.finish_reason = choice["finish_reason"]
    _usage(reply, data.get("usage"))


class ServerClient:
    """vLLM's OpenAI endpoints of one server; thread-safe (the concurrency steps share it)."""

    def __init__(self, api_base: str, api_key: str | None = None, max_connections: int = 8) -> None:
        self.transport = Transport(api_base, api_key, max_connections)
        self.api_base = self.transport.api_base
        self.where = self.transport.where

    def redact(self, text: str) -> str:
        """`text` without this client's secrets (API key, URL password)."""
        return self.transport.redact(text)

    def close(self) -> None:
        """Close the connection pool."""
        self.transport.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, path: str, limit: float | Deadline) -> HttpReply:
        """A plain GET (readiness, /metrics): see Transport.get."""
        return self.transport.get(path, limit)

    def _post(self, path: str, body: dict[str, Any], limit: float | Deadline, request_id: str | None,
              stream: bool) -> tuple[Reply, Any]:
        """POST and read the whole reply within `limit`; returns the reply timing and the decoded JSON
        (for a stream: the number of chunks, folded into the reply as they came)."""
        headers = {"X-Request-Id": request_id} if request_id else {}
        start = time.monotonic()
        deadline = as_deadline(limit)
        reply = Reply()
        try:
            with self.transport.exchange("POST", path, deadline, json=body, headers=headers) as resp:
                if resp.status_code != 200 or not stream:
                    raw = read_body(resp, deadline)
                    reply.latency_s = time.monotonic() - start
                    raise_for_status(resp, raw)
                    try:
                        return reply, parse_json(raw)
                    except ValueError:
                        raise StepError(f"malformed JSON in the 200 reply: {raw[:SNIPPET]!r}") from None
                return reply, self._read_sse(resp, reply, start, deadline, body.get("max_tokens"))
        except (AttributeError, TypeError) as err:  # a JSON reply of the wrong shape (a list, a string...)
            raise StepError(self.redact(f"unexpected reply shape: {err}")) from None

    def _read_sse(self, resp: httpx.Response, reply: Reply, start: float, deadline: Deadline,
                  max_tokens: int | None) -> int:
        """Fold the event stream into `reply`; the number of chunks. A stream that sends far more than
        `max_tokens` asked for is a bad reply: stopped there, memory flat."""
        chunks = 0
        most = 4 * (max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 4096) + 64
        for raw_line in sse_lines(resp, deadline):
            line = raw_line.decode("utf-8", "replace")
            if not line.startswith("data:"):
                continue  # blank separators, comments, event names
            payload = line[5:].strip()
            if payload == "[DONE]":
                reply.latency_s = time.monotonic() - start
                return chunks
            try:
                data = parse_json(payload)
            except ValueError:
                raise StepError(f"malformed JSON in stream chunk {chunks + 1}: {payload[:SNIPPET]!r}") from None
            chunks += 1
            if chunks > most or len(reply.text) + len(reply.reasoning) > 64 * most:
                raise StepError(f"the stream sent over {chunks - 1:,} chunks for at most {max_tokens} tokens "
                                "asked: not a vLLM reply; stopped reading")
            had = (len(reply.text) + len(reply.reasoning), reply.token_ids)
            add_stream_chunk(data, reply)
            if (len(reply.text) + len(reply.reasoning), reply.token_ids) > had:   # a token arrived
                reply.last_token_s = time.monotonic() - start
                if reply.ttft_s is None:
                    reply.ttft_s = reply.last_token_s
        raise StepError(f"stream cut: it ended after {chunks} chunks without data: [DONE]")

    def chat(self, body: dict[str, Any], limit: float | Deadline, request_id: str | None = None) -> Reply:
        """POST /v1/chat/completions; streams when `body["stream"]` is true. `limit`: seconds or a Deadline."""
        stream = bool(body.get("stream"))
        reply, data = self._post("/v1/chat/completions", body, limit, request_id, stream)
        if stream:
            reply.chunks = data
            return reply
        return _parsed(parse_chat, data, reply, self.redact)

    def completion(self, body: dict[str, Any], limit: float | Deadline, request_id: str | None = None) -> Reply:
        """POST /v1/completions (not streaming). `limit`: seconds or a Deadline."""
        reply, data = self._post("/v1/completions", body, limit, request_id, stream=False)
        return _parsed(parse_completion, data, reply, self.redact)

    def tokenize(self, body: dict[str, Any], limit: float | Deadline) -> int | None:
        """POST /tokenize -> the token count; None when the server has no such endpoint."""
        deadline = as_deadline(limit)
        with self.transport.exchange("POST", "/tokenize", deadline, prefix="POST /tokenize: ", json=body) as resp:
            raw = read_body(resp, deadline)
            # A missing route is FastAPI's {"detail": "Not Found"}; a 404 ErrorResponse names a wrong model.
            if resp.status_code in (404, 405, 501) and b'"error"' not in raw:
                return None
            raise_for_status(resp, raw)
            try:
                count = parse_json(raw)["count"]
            except (ValueError, KeyError, TypeError):
                raise StepError(f"no token count in the reply: {raw[:SNIPPET]!r}") from None
            if not isinstance(count, int):
                raise StepError(f"count is not a number: {count!r}")
            return count


def _parsed(parse: Callable[[Any, Reply], Reply], data: Any, reply: Reply, hide: Callable[[str], str]) -> Reply:
    try:
        return parse(data, reply)
    except (AttributeError, TypeError) as err:  # valid JSON, but not the shape vLLM sends
        raise StepError(hide(f"unexpected reply shape ({err}): {json.dumps(data)[:SNIPPET]}")) from None
