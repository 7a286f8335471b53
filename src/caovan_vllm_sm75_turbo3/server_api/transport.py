"""Moving bytes to and from a server under a wall-clock limit.

Every call has a total wall-clock limit (`Deadline`): each socket operation waits at most for what
is left of it, so a server that trickles bytes cannot hold a call past its limit. Reply bodies are
read in bounded size and linear time. A transport failure or an error status raises `StepError`
(or a kind of it) with a reason a person can act on; every message is redacted.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import httpcore
import httpx

from .. import safe_json
from ..errors import CaovanException, SettingError
from .address import check_api_key, is_loopback, redact, split_api_base

USER_AGENT = "caovan-sm75-warmup"
SNIPPET = 200
MAX_JSON_BYTES = 4 << 20  # a vLLM JSON reply is kilobytes; more is not a vLLM server
MAX_SSE_LINE_BYTES = 1 << 20  # one stream chunk is a few hundred bytes
_CONNECT_TIMEOUT_S = 10.0
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


def as_deadline(limit: float | Deadline) -> Deadline:
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


def parse_json(raw: bytes | str) -> Any:
    """A reply's JSON, depth- and size-checked (safe_json): a reply nested 100,000 deep is a bad reply
    (ValueError), never a RecursionError."""
    return safe_json.loads(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw)


def error_message(body: bytes) -> str:
    """The human part of an error body: vLLM's `{"error": {"message": ...}}`, `{"error": "..."}`,
    FastAPI's `{"detail": ...}`, or the start of the raw text."""
    try:
        data = parse_json(body)
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
    return text[:SNIPPET] if text else "(empty body)"


@dataclass(frozen=True)
class HttpReply:
    """A whole, size-bounded reply to a plain request."""

    status_code: int
    reason_phrase: str
    content: bytes

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""
        return parse_json(self.content)


class Transport:
    """One server's HTTP connection pool with wall-clock limits; thread-safe.

    `api_base` is the address as it may be shown (password redacted), `where` its `host:port`; every
    error it raises is redacted.
    """

    def __init__(self, api_base: str, api_key: str | None = None, max_connections: int = 8) -> None:
        parts = split_api_base(api_base, lambda why: SettingError(f"server address not accepted: {why}"))
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

    def get(self, path: str, limit: float | Deadline) -> HttpReply:
        """A plain GET, read whole within `limit` seconds (or a Deadline) and `MAX_JSON_BYTES`.

        Raises Refused / Unreachable (waiting may help), Misdirected (it will not), TimedOut, StepError.
        """
        deadline = as_deadline(limit)
        with self.exchange("GET", path, deadline) as resp:
            return HttpReply(resp.status_code, resp.reason_phrase, read_body(resp, deadline))

    @contextmanager
    def exchange(self, method: str, path: str, deadline: Deadline, prefix: str = "",
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


def _root_cause(err: BaseException) -> BaseException:
    """The innermost exception httpx wrapped (httpx -> httpcore -> ssl / socket error)."""
    seen = {id(err)}
    while (nxt := err.__cause__ or err.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        err = nxt
    return err


def read_body(resp: httpx.Response, deadline: Deadline, limit: int = MAX_JSON_BYTES) -> bytes:
    """The whole body, refused past `limit` bytes; the deadline is checked between pieces."""
    body = bytearray()
    for part in resp.iter_bytes():
        body += part
        if len(body) > limit:
            raise StepError(f"the reply body is over {limit >> 20} MiB: not a vLLM reply")
        deadline.check()
    return bytes(body)


def sse_lines(resp: httpx.Response, deadline: Deadline) -> Iterator[bytes]:
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


def raise_for_status(resp: httpx.Response, body: bytes) -> None:
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
