"""HTTP calls to a vLLM OpenAI-compatible server and reading its replies, SSE streams included.

Every call has a total wall-clock limit (`Deadline`): each socket operation waits at most for what
is left of it, so a server that trickles bytes cannot hold a call past its limit. Reply bodies are
read in bounded size and linear time. A reply that is not what vLLM sends on success (an error
status, JSON that does not parse, an error chunk inside a stream, a stream that ends before
`data: [DONE]`) raises `StepError` with a reason a person can act on; nothing is hidden, except
secrets: every message goes through `redact` (URL passwords, the API key).

The connection conventions here (address check, API key source and check, redaction, limits) are
shared by every command that talks to a vLLM server.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

import httpcore
import httpx

from ..errors import CaovanException, SettingError

USER_AGENT = "caovan-sm75-warmup"
_SNIPPET = 200
# The server's own key variable first: OPENAI_API_KEY may belong to another service.
API_KEY_VARS = ("VLLM_API_KEY", "OPENAI_API_KEY")
MAX_JSON_BYTES = 4 << 20  # a vLLM JSON reply is kilobytes; more is not a vLLM server
MAX_SSE_LINE_BYTES = 1 << 20  # one stream chunk is a few hundred bytes
_CONNECT_TIMEOUT_S = 10.0
_MIN_SECRET = 4  # shorter "secrets" would blank out ordinary words
# scheme://user:password@ -> scheme://user:***@ (the password may itself hold '@': up to the last one)
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/?#\s:@]*):[^/?#\s]*@")
_HEADER_SAFE_KEY = re.compile(r"[\x21-\x7e]+")
# What OpenSSL says when the other side speaks plain HTTP to a TLS handshake.
_PLAIN_HTTP_TLS_REASONS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST")


class StepError(CaovanException):
    """A request did not succeed; `str()` is the reason. Internal: recorded as the step's outcome."""


class Rejected(StepError):
    """The server answered 400: it refuses this kind of request (e.g. no tool parser)."""


class TimedOut(StepError):
    """No complete reply within the call's wall-clock limit."""


class Unreachable(StepError):
    """Nothing answered at the address (name not resolved, connection reset): waiting may help."""


class Refused(Unreachable):
    """Connection refused: nothing listens on the port (yet: vLLM listens once its engine is up)."""


class Misdirected(StepError):
    """Something answers, but not as the address says (plain HTTP to https://, a TLS failure), or the
    request cannot be sent at all: waiting will not help."""


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with URL passwords (`user:pass@` -> `user:***@`) and each of `secrets` replaced by `***`."""
    text = _URL_PASSWORD.sub(r"\g<head>:***@", text)
    for secret in secrets:
        if len(secret) >= _MIN_SECRET:
            text = text.replace(secret, "***")
    return text


def check_api_key(key: str, source: str) -> None:
    """Refuse a key that cannot travel in an HTTP header; the message names `source`, never the key."""
    if not _HEADER_SAFE_KEY.fullmatch(key):
        raise SettingError(f"the API key from {source} contains characters not allowed in an HTTP header "
                           "(accepted: printable ASCII without spaces)")


def api_key_from(flag: str | None, env: Mapping[str, str]) -> tuple[str | None, str]:
    """The API key and where it came from (`flag --api-key`, `env VLLM_API_KEY`, or `none`), checked."""
    key, source = None, "none"
    if flag:
        key, source = flag, "flag --api-key"
    else:
        var = next((v for v in API_KEY_VARS if env.get(v)), None)
        if var:
            key, source = env[var], f"env {var}"
    if key is not None:
        check_api_key(key, source)
    return key, source


def normalize_api_base(url: str) -> str:
    """`http://host:port` from what users type (`.../v1`, a trailing slash); refuse anything not http(s),
    a bad port, an over-long host name, spaces or control characters. Messages never show a password."""
    url = url.strip()
    parts = _split_api_base(url, lambda why: SettingError(f"--api-base {redact(url)!r} is not accepted: {why}"))
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path}"


def _split_api_base(url: str, refuse: Callable[[str], SettingError]) -> SplitResult:
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise refuse("it contains a space or a control character")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:  # "Port out of range", "Port could not be cast", "Invalid IPv6 URL"
        raise refuse("the port must be a whole number from 1 to 65535" if "port" in str(err).lower()
                     else f"{err}; use http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise refuse("use http://HOST:PORT, for example http://127.0.0.1:8000.")
    if port == 0 or (port is None and parts.netloc.endswith(":")):  # `host:` with nothing after the colon
        raise refuse("the port must be a whole number from 1 to 65535")
    host = parts.hostname
    if len(host) > 253:
        raise refuse("the host name is longer than 253 characters")
    if ":" not in host and any(len(label) > 63 for label in host.split(".")):
        raise refuse("a label of the host name is longer than 63 characters")
    try:
        httpx.URL(url)
    except (httpx.InvalidURL, UnicodeError) as err:
        raise refuse(redact(str(err))) from None
    return parts


@dataclass(frozen=True)
class Deadline:
    """A wall-clock limit: `limit_s` as the user set it, ending at `time.monotonic()` value `at`."""

    limit_s: float
    at: float

    @classmethod
    def after(cls, limit_s: float) -> Deadline:
        """The deadline `limit_s` seconds from now."""
        return cls(limit_s, time.monotonic() + limit_s)

    def left(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - time.monotonic()

    def check(self) -> None:
        """Raise TimedOut once the deadline has passed."""
        if self.left() <= 0:
            raise TimedOut(f"timeout: no complete reply within {self.limit_s:g} s")


def _as_deadline(limit: float | Deadline) -> Deadline:
    return limit if isinstance(limit, Deadline) else Deadline.after(limit)


# The deadline of the request the calling thread is making; each thread makes one request at a time.
_current = threading.local()


def _clamp(timeout: float | None, expired: type[Exception]) -> float | None:
    """`timeout` cut to what is left of the calling thread's request deadline."""
    at = getattr(_current, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise expired("the request's wall-clock limit has passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write waits at most until the current request's deadline:
    httpx's own timeouts restart at each read, so a trickle of bytes would never end a request."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname,
                                                     _clamp(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """Opens `_DeadlineStream` connections; connecting is cut to the deadline too."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_tcp(host, port, _clamp(timeout, httpcore.ConnectTimeout),
                                                       local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_unix_socket(path, _clamp(timeout, httpcore.ConnectTimeout),
                                                               socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _install_deadlines(http: httpx.Client) -> None:
    """Put `_DeadlineBackend` under every transport of `http` (the direct one and env proxies).

    httpx has no public hook for the network backend; its transports keep an httpcore pool in `_pool`,
    whose backend is `_network_backend`. The wall-clock tests fail loudly if that ever changes.
    """
    for transport in (http._transport, *http._mounts.values()):
        if transport is None:  # a no_proxy pattern
            continue
        pool = getattr(transport, "_pool", None)
        if pool is None or not hasattr(pool, "_network_backend"):
            raise RuntimeError("httpx internals changed: cannot enforce wall-clock limits per request")
        pool._network_backend = _DeadlineBackend(pool._network_backend)


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
    last_token_s: float | None = None  # streams only: time to the last chunk that added text
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


@dataclass(frozen=True)
class HttpReply:
    """A whole, size-bounded reply to a plain request."""

    status_code: int
    reason_phrase: str
    content: bytes

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""
        return json.loads(self.content)


class ServerClient:
    """One server's HTTP client; thread-safe (the concurrency steps share it).

    `api_base` is the address as it may be shown (password redacted), `where` its `host:port`; every
    error it raises is redacted.
    """

    def __init__(self, api_base: str, api_key: str | None = None, max_connections: int = 8) -> None:
        parts = _split_api_base(api_base, lambda why: SettingError(f"server address not accepted: {why}"))
        self.api_base = redact(api_base)
        self._secrets = [s for s in (api_key, parts.password, unquote(parts.password or "")) if s]
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        self.where = f"{host}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}  # no compression bombs
        if api_key:
            check_api_key(api_key, "the client settings")
            headers["Authorization"] = f"Bearer {api_key}"
        # Proxy variables are for the outside world; a loopback server is reached directly.
        self._http = httpx.Client(base_url=api_base, headers=headers, trust_env=not is_loopback(api_base),
                                  limits=httpx.Limits(max_connections=max_connections + 2))
        _install_deadlines(self._http)

    def redact(self, text: str) -> str:
        """`text` without this client's secrets (API key, URL password)."""
        return redact(text, self._secrets)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, path: str, limit: float | Deadline) -> HttpReply:
        """A plain GET (readiness), read whole within `limit` seconds (or a Deadline) and `MAX_JSON_BYTES`.

        Raises Refused / Unreachable (waiting may help), Misdirected (it will not), TimedOut, StepError.
        """
        deadline = _as_deadline(limit)
        with self._exchange("GET", path, deadline) as resp:
            return HttpReply(resp.status_code, resp.reason_phrase, _read_body(resp, deadline))

    @contextmanager
    def _exchange(self, method: str, path: str, deadline: Deadline, prefix: str = "",
                  **kwargs: Any) -> Iterator[httpx.Response]:
        """One request under `deadline` (every socket wait is cut to it); transport errors become
        StepError kinds, every message is redacted and starts with `prefix`."""
        deadline.check()
        left = deadline.left()
        previous, _current.at = getattr(_current, "at", None), deadline.at
        try:
            with self._http.stream(method, path, timeout=httpx.Timeout(left, connect=min(left, _CONNECT_TIMEOUT_S)),
                                   **kwargs) as resp:
                yield resp
        except httpx.TimeoutException:
            raise TimedOut(prefix + f"timeout: no complete reply within {deadline.limit_s:g} s") from None
        except httpx.HTTPError as err:
            failure = self._transport_failure(err)
            raise type(failure)(prefix + self.redact(str(failure))) from None
        except StepError as err:
            raise type(err)(prefix + self.redact(str(err))) from None
        finally:
            _current.at = previous

    def _transport_failure(self, err: httpx.HTTPError) -> StepError:
        """What an httpx error means for the user, by its kind and its cause (an ssl or socket error)."""
        cause = _root_cause(err)
        if isinstance(err, httpx.ConnectError):
            if isinstance(cause, ssl.SSLError):
                if cause.reason in _PLAIN_HTTP_TLS_REASONS:
                    return Misdirected(f"the server at {self.api_base} answered plain HTTP to an https:// "
                                       "request: use http://")
                return Misdirected(f"TLS with {self.api_base} failed: {cause.reason or cause}")
            if isinstance(cause, ConnectionRefusedError):
                return Refused(f"nothing listens on {self.where} (connection refused)")
            if isinstance(cause, socket.gaierror):
                return Unreachable(f"cannot resolve the host of {self.api_base}: {cause.strerror or cause}")
            return Unreachable(f"cannot connect to {self.api_base}: {err or type(err).__name__}")
        if isinstance(err, (httpx.LocalProtocolError, httpx.UnsupportedProtocol, httpx.InvalidURL)):
            return Misdirected(f"the request to {self.api_base} cannot be sent: {err or type(err).__name__}")
        return StepError(f"connection broken mid-reply: {err or type(err).__name__}")

    def _post(self, path: str, body: dict[str, Any], limit: float | Deadline, request_id: str | None,
              stream: bool) -> tuple[Reply, Any]:
        """POST and read the whole reply within `limit`; returns the reply timing and the decoded JSON
        (a list of chunk objects for a stream)."""
        headers = {"X-Request-Id": request_id} if request_id else {}
        start = time.monotonic()
        deadline = _as_deadline(limit)
        reply = Reply()
        try:
            with self._exchange("POST", path, deadline, json=body, headers=headers) as resp:
                if resp.status_code != 200 or not stream:
                    raw = _read_body(resp, deadline)
                    reply.latency_s = time.monotonic() - start
                    _raise_for_status(resp, raw)
                    try:
                        return reply, json.loads(raw)
                    except ValueError:
                        raise StepError(f"malformed JSON in the 200 reply: {raw[:_SNIPPET]!r}") from None
                return reply, self._read_sse(resp, reply, start, deadline)
        except (AttributeError, TypeError) as err:  # a JSON reply of the wrong shape (a list, a string...)
            raise StepError(self.redact(f"unexpected reply shape: {err}")) from None

    def _read_sse(self, resp: httpx.Response, reply: Reply, start: float, deadline: Deadline) -> list[Any]:
        chunks: list[Any] = []
        for raw_line in _sse_lines(resp, deadline):
            line = raw_line.decode("utf-8", "replace")
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
            had_text = len(reply.text) + len(reply.reasoning)
            add_stream_chunk(data, reply)
            if len(reply.text) + len(reply.reasoning) > had_text:
                reply.last_token_s = time.monotonic() - start
                if reply.ttft_s is None:
                    reply.ttft_s = reply.last_token_s
        raise StepError(f"stream cut: it ended after {len(chunks)} chunks without data: [DONE]")

    def chat(self, body: dict[str, Any], limit: float | Deadline, request_id: str | None = None) -> Reply:
        """POST /v1/chat/completions; streams when `body["stream"]` is true. `limit`: seconds or a Deadline."""
        stream = bool(body.get("stream"))
        reply, data = self._post("/v1/chat/completions", body, limit, request_id, stream)
        if stream:
            reply.chunks = len(data)
            return reply
        return _parsed(parse_chat, data, reply, self.redact)

    def completion(self, body: dict[str, Any], limit: float | Deadline, request_id: str | None = None) -> Reply:
        """POST /v1/completions (not streaming). `limit`: seconds or a Deadline."""
        reply, data = self._post("/v1/completions", body, limit, request_id, stream=False)
        return _parsed(parse_completion, data, reply, self.redact)

    def tokenize(self, body: dict[str, Any], limit: float | Deadline) -> int | None:
        """POST /tokenize -> the token count; None when the server has no such endpoint."""
        deadline = _as_deadline(limit)
        with self._exchange("POST", "/tokenize", deadline, prefix="POST /tokenize: ", json=body) as resp:
            raw = _read_body(resp, deadline)
            # A missing route is FastAPI's {"detail": "Not Found"}; a 404 ErrorResponse names a wrong model.
            if resp.status_code in (404, 405, 501) and b'"error"' not in raw:
                return None
            _raise_for_status(resp, raw)
            try:
                count = json.loads(raw)["count"]
            except (ValueError, KeyError, TypeError):
                raise StepError(f"no token count in the reply: {raw[:_SNIPPET]!r}") from None
            if not isinstance(count, int):
                raise StepError(f"count is not a number: {count!r}")
            return count


def _parsed(parse: Callable[[Any, Reply], Reply], data: Any, reply: Reply, hide: Callable[[str], str]) -> Reply:
    try:
        return parse(data, reply)
    except (AttributeError, TypeError) as err:  # valid JSON, but not the shape vLLM sends
        raise StepError(hide(f"unexpected reply shape ({err}): {json.dumps(data)[:_SNIPPET]}")) from None


def _root_cause(err: BaseException) -> BaseException:
    """The innermost exception httpx wrapped (httpx -> httpcore -> ssl / socket error)."""
    seen = {id(err)}
    while (nxt := err.__cause__ or err.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        err = nxt
    return err


def _read_body(resp: httpx.Response, deadline: Deadline, limit: int = MAX_JSON_BYTES) -> bytes:
    """The whole body, refused past `limit` bytes; the deadline is checked between pieces."""
    body = bytearray()
    for part in resp.iter_bytes():
        body += part
        if len(body) > limit:
            raise StepError(f"the reply body is over {limit >> 20} MiB: not a vLLM reply")
        deadline.check()
    return bytes(body)


def _sse_lines(resp: httpx.Response, deadline: Deadline) -> Iterator[bytes]:
    """The lines of an event stream, each scanned once (linear however the bytes arrive), none over
    `MAX_SSE_LINE_BYTES`; the deadline is checked between pieces."""
    pending = bytearray()
    for part in resp.iter_bytes():
        deadline.check()
        start = 0
        while (end := part.find(b"\n", start)) >= 0:
            pending += part[start:end]
            _check_line(pending)
            yield bytes(pending).rstrip(b"\r")
            pending.clear()
            start = end + 1
        pending += part[start:]
        _check_line(pending)
    if pending:
        yield bytes(pending).rstrip(b"\r")


def _check_line(line: bytearray) -> None:
    if len(line) > MAX_SSE_LINE_BYTES:
        raise StepError(f"a line of the event stream is over {MAX_SSE_LINE_BYTES >> 20} MiB: not a vLLM stream")


def _raise_for_status(resp: httpx.Response, body: bytes) -> None:
    code = resp.status_code
    if code == 200:
        return
    message = f"HTTP {code} {resp.reason_phrase}: {error_message(body)}"
    if code == 400:
        raise Rejected(message)
    if code == 401:
        raise StepError(message + " (pass --api-key, or set OPENAI_API_KEY / VLLM_API_KEY, "
                        "to the key the server was started with)")
    raise StepError(message)
