"""HTTP calls to a vLLM OpenAI-compatible server and reading its replies, SSE streams included.

Every call has a total time limit. A reply that is not what vLLM sends on success (an error
status, JSON that does not parse, an error chunk inside a stream, a stream that ends before
`data: [DONE]`) raises `StepError` with a reason a person can act on; nothing is hidden.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..errors import SettingError

USER_AGENT = "caovan-sm75-warmup"
_SNIPPET = 200


class StepError(Exception):
    """A request did not succeed; `str()` is the reason."""


class Rejected(StepError):
    """The server answered 400: it refuses this kind of request (e.g. no tool parser)."""


def normalize_api_base(url: str) -> str:
    """`http://host:port` from what users type (`.../v1`, a trailing slash); refuse anything not http(s)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingError(f"--api-base {url!r} is not accepted: use http://HOST:PORT, "
                           "for example http://127.0.0.1:8000.")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path}"


def is_loopback(api_base: str) -> bool:
    """True for localhost / 127.0.0.0/8 / ::1."""
    host = urlsplit(api_base).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    ttft_s: float | None = None  # streams only: time to the first generated text
    chunks: int = 0

    @property
    def empty(self) -> bool:
        """No text, no reasoning and no tool call: the engine produced nothing a client could use."""
        return not (self.text or self.reasoning or self.tool_calls)


def error_message(body: bytes) -> str:
    """The human part of an error body: vLLM's `{"error": {"message": ...}}`, `{"error": "..."}`,
    FastAPI's `{"detail": ...}`, or the start of the raw text."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "detail" in data:
            return str(data["detail"])
    text = body.decode("utf-8", "replace").strip()
    return text[:_SNIPPET] if text else "(empty body)"


def _usage(reply: Reply, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    reply.prompt_tokens = usage.get("prompt_tokens", reply.prompt_tokens)
    reply.completion_tokens = usage.get("completion_tokens", reply.completion_tokens)
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        reply.cached_tokens = details["cached_tokens"]


def _choice(data: Any, what: str) -> dict[str, Any]:
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise StepError(f"the {what} reply has no choices: {json.dumps(data)[:_SNIPPET]}")
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
        raise StepError(f"a stream chunk is not a JSON object: {json.dumps(data)[:_SNIPPET]}")
    if "error" in data:
        raise StepError(f"error inside the stream: {error_message(json.dumps(data).encode())}")
    for choice in data.get("choices") or []:
        delta = choice.get("delta") or {}
        reply.text += delta.get("content") or ""
        reply.reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
        reply.tool_calls += sum(1 for call in delta.get("tool_calls") or [] if call.get("id"))
        if choice.get("finish_reason"):
            reply.finish_reason = choice["finish_reason"]
    _usage(reply, data.get("usage"))


class ServerClient:
    """One server's HTTP client; thread-safe (the concurrency steps share it)."""

    def __init__(self, api_base: str, api_key: str | None = None, max_connections: int = 8) -> None:
        self.api_base = api_base
        headers = {"User-Agent": USER_AGENT}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        # Proxy variables are for the outside world; a loopback server is reached directly.
        self._http = httpx.Client(base_url=api_base, headers=headers, trust_env=not is_loopback(api_base),
                                  limits=httpx.Limits(max_connections=max_connections + 2))

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, path: str, timeout_s: float) -> httpx.Response:
        """A plain GET (readiness); httpx errors pass through for the caller to classify."""
        return self._http.get(path, timeout=timeout_s)

    def _post(self, path: str, body: dict[str, Any], timeout_s: float, request_id: str | None,
              stream: bool) -> tuple[Reply, Any]:
        """POST and read the whole reply within `timeout_s`; returns the reply timing and the decoded JSON
        (a list of chunk objects for a stream)."""
        headers = {"X-Request-Id": request_id} if request_id else {}
        start = time.monotonic()
        deadline = start + timeout_s
        reply = Reply()
        try:
            with self._http.stream("POST", path, json=body, headers=headers,
                                   timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))) as resp:
                if resp.status_code != 200 or not stream:
                    raw = b""
                    for part in resp.iter_bytes():
                        raw += part
                        _check_deadline(deadline, timeout_s)
                    reply.latency_s = time.monotonic() - start
                    _raise_for_status(resp, raw)
                    try:
                        return reply, json.loads(raw)
                    except ValueError:
                        raise StepError(f"malformed JSON in the 200 reply: {raw[:_SNIPPET]!r}") from None
                return reply, self._read_sse(resp, reply, start, deadline, timeout_s)
        except httpx.TimeoutException:
            raise StepError(f"timeout: no complete reply within {timeout_s:g} s") from None
        except httpx.ConnectError as err:
            raise StepError(f"cannot connect to {self.api_base}: {err}") from None
        except httpx.HTTPError as err:
            raise StepError(f"connection broken mid-reply: {err or type(err).__name__}") from None
        except (AttributeError, TypeError) as err:  # a JSON reply of the wrong shape (a list, a string...)
            raise StepError(f"unexpected reply shape: {err}") from None

    def _read_sse(self, resp: httpx.Response, reply: Reply, start: float, deadline: float,
                  timeout_s: float) -> list[Any]:
        chunks: list[Any] = []
        for line in resp.iter_lines():
            _check_deadline(deadline, timeout_s)
            if not line.startswith("data:"):
                continue  # blank separators, comments, event names
            payload = line[5:].strip()
            if payload == "[DONE]":
                reply.latency_s = time.monotonic() - start
                return chunks
            try:
                data = json.loads(payload)
            except ValueError:
                raise StepError(f"malformed JSON in stream chunk {len(chunks) + 1}: {payload[:_SNIPPET]!r}") from None
            chunks.append(data)
            had_text = bool(reply.text or reply.reasoning)
            add_stream_chunk(data, reply)
            if reply.ttft_s is None and not had_text and (reply.text or reply.reasoning):
                reply.ttft_s = time.monotonic() - start
        raise StepError(f"stream cut: it ended after {len(chunks)} chunks without data: [DONE]")

    def chat(self, body: dict[str, Any], timeout_s: float, request_id: str | None = None) -> Reply:
        """POST /v1/chat/completions; streams when `body["stream"]` is true."""
        stream = bool(body.get("stream"))
        reply, data = self._post("/v1/chat/completions", body, timeout_s, request_id, stream)
        if stream:
            reply.chunks = len(data)
            return reply
        return _parsed(parse_chat, data, reply)

    def completion(self, body: dict[str, Any], timeout_s: float, request_id: str | None = None) -> Reply:
        """POST /v1/completions (not streaming)."""
        reply, data = self._post("/v1/completions", body, timeout_s, request_id, stream=False)
        return _parsed(parse_completion, data, reply)

    def tokenize(self, body: dict[str, Any], timeout_s: float) -> int | None:
        """POST /tokenize -> the token count; None when the server has no such endpoint."""
        try:
            resp = self._http.post("/tokenize", json=body, timeout=timeout_s)
        except httpx.TimeoutException:
            raise StepError(f"timeout: POST /tokenize gave no reply within {timeout_s:g} s") from None
        except httpx.TransportError as err:
            raise StepError(f"POST /tokenize failed: {err}") from None
        # A missing route is FastAPI's {"detail": "Not Found"}; a 404 ErrorResponse names a wrong model.
        if resp.status_code in (404, 405, 501) and b'"error"' not in resp.content:
            return None
        _raise_for_status(resp, resp.content, "POST /tokenize: ")
        try:
            count = resp.json()["count"]
        except (ValueError, KeyError, TypeError):
            raise StepError(f"POST /tokenize: no token count in the reply: {resp.content[:_SNIPPET]!r}") from None
        if not isinstance(count, int):
            raise StepError(f"POST /tokenize: count is not a number: {count!r}")
        return count


def _parsed(parse: Callable[[Any, Reply], Reply], data: Any, reply: Reply) -> Reply:
    try:
        return parse(data, reply)
    except (AttributeError, TypeError) as err:  # valid JSON, but not the shape vLLM sends
        raise StepError(f"unexpected reply shape ({err}): {json.dumps(data)[:_SNIPPET]}") from None


def _check_deadline(deadline: float, timeout_s: float) -> None:
    if time.monotonic() > deadline:
        raise StepError(f"timeout: no complete reply within {timeout_s:g} s")


def _raise_for_status(resp: httpx.Response, body: bytes, prefix: str = "") -> None:
    code = resp.status_code
    if code == 200:
        return
    message = f"{prefix}HTTP {code} {resp.reason_phrase}: {error_message(body)}"
    if code == 400:
        raise Rejected(message)
    if code == 401:
        raise StepError(message + " (pass --api-key, or set OPENAI_API_KEY / VLLM_API_KEY, "
                        "to the key the server was started with)")
    raise StepError(message)
