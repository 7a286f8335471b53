"""A local stand-in for vLLM 0.21's OpenAI-compatible server, with faults, for the warmup tests.

It answers on 127.0.0.1 only, with the shapes vLLM 0.21 sends (read from
vllm/entrypoints/openai/*/protocol.py and serve/tokenize/protocol.py; written here, not copied):

- `GET /health`: 200 with an empty body; 503 with an empty body after EngineDeadError.
- `GET /v1/models`: ModelList `{"object": "list", "data": [ModelCard...]}` with `max_model_len`.
- `POST /tokenize`: `{"model", "prompt"}` or `{"model", "messages"}` -> `{"count", "max_model_len", "tokens", "token_strs"}`.
- `POST /v1/chat/completions`: chat.completion, or SSE `data: {chat.completion.chunk}` lines ending
  with `data: [DONE]`; a failure after the 200 is sent is a `data: {"error": {...}}` chunk.
- `POST /v1/completions`: text_completion.
- Errors: ErrorResponse `{"error": {"message", "type", "param", "code"}}`; 401 `{"error": "Unauthorized"}`
  for `/v1/*` when an API key is set (as vLLM's AuthenticationMiddleware; /health and /tokenize are open).
- The port is bound at once but listens only after `listen_after_s`, as vLLM binds early and
  listens once the engine is up: until then connections are refused.
- Paced streams (the bench tests, `pace_tok_s` > 0): the first token after `first_token_delay_s` plus
  the prompt at `prefill_tok_s`, then `tokens_per_chunk` tokens per SSE chunk at `pace_tok_s`, as
  speculative decoding sends them; `GET /metrics` then serves vLLM's spec-decode counters (two
  engines, each step proposing `spec_tokens` drafts and accepting all but the bonus token of its chunk).

Its tokenizer is a toy: a word of up to 5 letters is one token, a longer word two, each
punctuation mark one, each chat-template marker one. Faults are picked per warmup step through
the `X-Request-Id` header the warmup sends (`caovan-warmup:<step>:<nonce>:<i>`).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

MODEL = "Qwen3.6-27B-AWQ-INT4"
BLOCK = 16  # prefix-cache block size in tokens
NATURAL_STOP = 12  # tokens generated before EOS when ignore_eos is not set
FAULTS = ("500", "engine-dies", "cut", "cut-clean", "malformed", "wrong-shape", "empty", "hang", "stream-error",
          "reject", *("drip", "slow-headers", "no-newline", "huge"))
# Replies that never end on their own (bytes trickle in) or grow without bound; each ends after `hang_s`.
SLOW_FAULTS = ("drip", "slow-headers", "no-newline", "huge")
_TOKEN_RE = re.compile(r"<\|im_start\|>|<\|im_end\|>|\w+|[^\w\s]")


@dataclass
class FakeConfig:
    """How the fake behaves; `faults` maps a step label (e.g. `prefill-512`, `warm/stream`) to a fault."""

    models: tuple[str, ...] = (MODEL,)
    max_model_len: int = 32768
    api_key: str | None = None
    listen_after_s: float = 0.0
    health_status: int = 200
    tokenize: bool = True
    tool_parser: bool = False
    reasoning_parser: bool = False
    prompt_tokens_details: bool = False
    reply_delay_s: float = 0.0  # every generation takes at least this long (to see requests overlap)
    hang_s: float = 5.0
    drip_s: float = 0.1  # seconds between the bytes of a "drip" / "slow-headers" reply
    health_fault: str = ""  # a SLOW_FAULTS entry: GET /health answers that way
    faults: dict[str, str] = field(default_factory=dict)
    pace_tok_s: float = 0.0  # > 0: streams are paced (see the module doc)
    first_token_delay_s: float = 0.0
    prefill_tok_s: float = 0.0  # > 0: the first token also waits prompt tokens / this
    tokens_per_chunk: int = 1
    spec_tokens: int = 0  # > 0: GET /metrics serves spec-decode counters
    stream_usage: bool = True  # False: no usage chunk even when include_usage asks for it

    def __post_init__(self) -> None:
        unknown = set(self.faults.values()) - set(FAULTS)
        assert not unknown, f"unknown fake faults {unknown}; known: {FAULTS}"


def tokenize(text: str) -> list[str]:
    """The toy tokenizer (see the module doc)."""
    out = []
    for piece in _TOKEN_RE.findall(text):
        if piece.isalnum() and len(piece) > 5:
            out += [piece[:5], piece[5:]]
        else:
            out.append(piece)
    return out


def render_chat(messages: list[dict[str, Any]], tools: list[Any] | None) -> str:
    """A ChatML-like template (the shape of Qwen's), with the generation prompt."""
    text = ""
    if tools:
        text += "<|im_start|>system\n# Tools\n" + json.dumps(tools) + "<|im_end|>\n"
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        text += f"<|im_start|>{m.get('role')}\n{content or ''}<|im_end|>\n"
    return text + "<|im_start|>assistant\n"


def _ids(tokens: list[str]) -> list[int]:
    return [zlib.crc32(t.encode()) % 151_000 for t in tokens]


def _error(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


class FakeVllm:
    """The server: `start()`, `url`, `stop()`; `requests` records (path, request id, body) in order."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.config = config or FakeConfig()
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.spans: list[tuple[str, float, float]] = []  # (request id, start, end) of each generation
        self._lock = threading.Lock()
        self._released = threading.Event()  # set at stop: hanging handlers give up
        self._cache: set[tuple[int, ...]] = set()
        self.spec = {"accepted": 0, "draft": 0, "drafts": 0}  # spec-decode counters of paced streams
        self._serving = False
        self._state = threading.Lock()  # start and stop may race: a server stopped early never listens
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self), bind_and_activate=False)
        self._httpd.daemon_threads = True
        self._httpd.allow_reuse_address = True
        self._httpd.server_bind()
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None

    def start(self) -> FakeVllm:
        """Start serving in a thread (listening after `listen_after_s`)."""
        def run() -> None:
            if self._released.wait(self.config.listen_after_s):
                return
            with self._state:
                if self._released.is_set():
                    return
                self._httpd.server_activate()
                self._serving = True
            self._httpd.serve_forever(poll_interval=0.05)
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release hanging handlers."""
        self._released.set()
        with self._state:
            serving = self._serving
        if serving:
            self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread:
            self._thread.join(timeout=5)

    def labels(self, path: str | None = None) -> list[str]:
        """The warmup step label of each recorded request, in arrival order."""
        return [rid.split(":")[1] for p, rid, _ in self.requests if rid.count(":") >= 2 and (path is None or p == path)]

    # --- the model --------------------------------------------------------------------------
    def prompt_tokens(self, body: dict[str, Any]) -> list[str]:
        if "messages" in body:
            return tokenize(render_chat(body["messages"], body.get("tools")))
        return tokenize(str(body.get("prompt", "")))

    def cached_tokens(self, ids: list[int]) -> int:
        """Leading full blocks already seen (a prefix cache like vLLM's, by chained block hashes)."""
        with self._lock:
            hit = 0
            for end in range(BLOCK, len(ids) + 1, BLOCK):
                if tuple(ids[:end]) not in self._cache:
                    break
                hit = end
            for end in range(BLOCK, len(ids) + 1, BLOCK):
                self._cache.add(tuple(ids[:end]))
        return hit


def _make_handler(server: FakeVllm) -> type[BaseHTTPRequestHandler]:
    cfg = server.config

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as uvicorn

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def setup(self) -> None:
            super().setup()
            # As uvicorn (asyncio sets TCP_NODELAY): no 40 ms Nagle / delayed-ACK stall per reply.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        # --- plumbing ---
        def _send_json(self, code: int, obj: Any) -> None:
            raw = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _send_empty(self, code: int) -> None:
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _sse(self, obj: Any) -> None:
            self._chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

        def _cut(self) -> None:
            """Drop the connection mid-reply, as a crashed server does."""
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

        def _authorized(self) -> bool:
            if cfg.api_key is None or not self.path.startswith("/v1"):
                return True
            if self.headers.get("Authorization", "") == f"Bearer {cfg.api_key}":
                return True
            self._send_json(401, {"error": "Unauthorized"})
            return False

        # --- routes ---
        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path == "/health" and cfg.health_fault:
                self._slow(cfg.health_fault)
            elif self.path == "/health":
                self._send_empty(cfg.health_status)
            elif self.path == "/metrics" and cfg.spec_tokens:
                self._metrics()
            elif self.path == "/v1/models":
                now = int(time.time())
                self._send_json(200, {"object": "list", "data": [
                    {"id": name, "object": "model", "created": now, "owned_by": "vllm",
                     "root": f"/models/{name}", "parent": None, "max_model_len": cfg.max_model_len,
                     "permission": [{"id": f"modelperm-{i}", "object": "model_permission", "created": now,
                                     "allow_create_engine": False, "allow_sampling": True,
                                     "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                     "allow_fine_tuning": False, "organization": "*", "group": None,
                                     "is_blocking": False}]}
                    for i, name in enumerate(cfg.models)]})
            else:
                self._send_json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            if not self._authorized():
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._send_json(400, _error("JSON decode error", "BadRequestError", 400))
                return
            rid = self.headers.get("X-Request-Id", "")
            with server._lock:
                server.requests.append((self.path, rid, body))
            if self.path == "/tokenize" and cfg.tokenize:
                self._tokenize(body)
            elif self.path in ("/v1/chat/completions", "/v1/completions"):
                with server._lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                began = time.monotonic()
                try:
                    self._generate(body, rid)
                finally:
                    with server._lock:
                        server.in_flight -= 1
                        server.spans.append((rid, began, time.monotonic()))
            else:
                self._send_json(404, {"detail": "Not Found"})

        def _metrics(self) -> None:
            """vLLM's Prometheus text: the counters split over two engines, and a per-position decoy."""
            with server._lock:
                spec = dict(server.spec)
            lines = []
            for key, name in (("accepted", "accepted_tokens"), ("draft", "draft_tokens"), ("drafts", "drafts")):
                metric = f"vllm:spec_decode_num_{name}_total"
                lines += [f"# HELP {metric} Number of {name}.", f"# TYPE {metric} counter"]
                half = spec[key] // 2
                for engine, value in (("0", half), ("1", spec[key] - half)):
                    lines.append(f'{metric}{{engine="{engine}",model_name="{cfg.models[0]}"}} {float(value)}')
            lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="0"}} 99999.0')
            raw = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _open_stream(self, model: str) -> dict[str, Any]:
            """Headers of a chunked event stream and vLLM's first (role) chunk; the chunks' common fields."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
            self._sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]})
            return base

        def _paced(self, model: str, words: list[str], usage: dict[str, Any], finish: str, n_prompt: int,
                   include_usage: bool) -> None:
            """A stream at a known pace, several tokens per chunk after the first (speculative decoding)."""
            began = time.monotonic()
            base = self._open_stream(model)
            first = began + cfg.first_token_delay_s + (n_prompt / cfg.prefill_tok_s if cfg.prefill_tok_s else 0.0)
            pieces = [words[:1]] + [words[i:i + cfg.tokens_per_chunk]
                                    for i in range(1, len(words), cfg.tokens_per_chunk)]
            sent = 0
            for piece in pieces:
                if not piece:
                    continue
                # An absolute schedule: a late wake-up does not push every later chunk back.
                due = first + max(0, sent + len(piece) - 1) / cfg.pace_tok_s if sent else first
                time.sleep(max(0.0, due - time.monotonic()))
                self._sse({**base, "choices": [{"index": 0, "delta": {"content": "".join(piece)}, "logprobs": None,
                                                "finish_reason": None}]})
                if sent and cfg.spec_tokens:
                    with server._lock:
                        server.spec["accepted"] += len(piece) - 1
                        server.spec["draft"] += cfg.spec_tokens
                        server.spec["drafts"] += 1
                sent += len(piece)
            self._sse({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish,
                                            "stop_reason": None}]})
            if include_usage and cfg.stream_usage:
                self._sse({**base, "choices": [], "usage": usage})
            self._sse(b"[DONE]")
            self._chunk(b"")

        def _tokenize(self, body: dict[str, Any]) -> None:
            if body.get("model") not in (None, *cfg.models):
                self._send_json(404, _error(f"The model `{body.get('model')}` does not exist.",
                                            "NotFoundError", 404, "model"))
                return
            if "messages" not in body and "prompt" not in body:
                self._send_json(400, _error("Field required: prompt or messages", "BadRequestError", 400))
                return
            tokens = server.prompt_tokens(body)
            self._send_json(200, {"count": len(tokens), "max_model_len": cfg.max_model_len,
                                  "tokens": _ids(tokens), "token_strs": tokens if body.get("return_token_strs") else None})

        def _generate(self, body: dict[str, Any], rid: str) -> None:
            chat = self.path == "/v1/chat/completions"
            label = rid.split(":")[1] if rid.count(":") >= 2 else ""
            fault = cfg.faults.get(label, "")
            model = body.get("model") or cfg.models[0]
            if model not in cfg.models:
                self._send_json(404, _error(f"The model `{model}` does not exist.", "NotFoundError", 404, "model"))
                return
            if chat and not isinstance(body.get("messages"), list):
                self._send_json(400, _error("messages: Field required", "BadRequestError", 400))
                return
            if chat and body.get("tools") and body.get("tool_choice", "auto") == "auto" and not cfg.tool_parser:
                self._send_json(400, _error('"auto" tool choice requires --enable-auto-tool-choice and '
                                            "--tool-call-parser to be set", "BadRequestError", 400))
                return
            if fault == "reject":
                self._send_json(400, _error("This request is not supported by this server.", "BadRequestError", 400))
                return
            prompt = server.prompt_tokens(body)
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or cfg.max_model_len - len(prompt)
            if len(prompt) + max_tokens > cfg.max_model_len:
                self._send_json(400, _error(
                    f"This model's maximum context length is {cfg.max_model_len} tokens. However, you requested "
                    f"{max_tokens} output tokens and your prompt contains {len(prompt)} input tokens, for a total "
                    f"of {len(prompt) + max_tokens} tokens. Please reduce the length of the input prompt or the "
                    "number of requested output tokens.", "BadRequestError", 400, "input_tokens"))
                return
            if fault == "hang":
                server._released.wait(cfg.hang_s)
            if fault in SLOW_FAULTS:
                self._slow(fault)
                return
            if fault in ("500", "engine-dies"):
                if fault == "engine-dies":
                    cfg.health_status = 503
                self._send_json(500, _error("EngineCore encountered an issue. See stack trace (above) for the "
                                            "root cause.", "InternalServerError", 500))
                return
            time.sleep(cfg.reply_delay_s)
            cached = server.cached_tokens(_ids(prompt))
            n_out = 0 if fault == "empty" else max_tokens if body.get("ignore_eos") else min(max_tokens, NATURAL_STOP)
            finish = "length" if n_out == max_tokens else "stop"
            words = [f" w{i}" for i in range(n_out)]
            usage: dict[str, Any] = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n_out,
                                     "completion_tokens": n_out, "prompt_tokens_details": None}
            if cfg.prompt_tokens_details:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            thinking = (chat and cfg.reasoning_parser
                        and (body.get("chat_template_kwargs") or {}).get("enable_thinking", True) is not False)
            tool_call = chat and cfg.tool_parser and body.get("tools") and body.get("tool_choice", "auto") != "none"
            if chat and body.get("stream") and cfg.pace_tok_s:
                self._paced(model, words, usage, finish, len(prompt),
                            bool((body.get("stream_options") or {}).get("include_usage")))
                return
            if chat and body.get("stream"):
                self._stream(body, model, words, usage, finish, fault, thinking)
                return
            if fault == "cut":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "4096")
                self.end_headers()
                self.wfile.write(b'{"id": "chatcmpl-1", "object": "chat.completion", "choi')
                self._cut()
                return
            if fault == "malformed":
                raw = b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "mess'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                return
            if fault == "wrong-shape":  # valid JSON, not vLLM's shape
                self._send_json(200, {"object": "chat.completion", "choices": [{"index": 0, "message": "hi"}]})
                return
            text = "".join(words)
            created = int(time.time())
            if not chat:
                self._send_json(200, {"id": "cmpl-1", "object": "text_completion", "created": created, "model": model,
                                      "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                                                   "stop_reason": None, "prompt_logprobs": None}],
                                      "service_tier": None, "system_fingerprint": None, "usage": usage,
                                      "kv_transfer_params": None})
                return
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                                       "audio": None, "function_call": None, "tool_calls": [], "reasoning": None}
            if thinking:
                half = len(words) // 2
                message["reasoning"], message["content"] = "".join(words[:half]), "".join(words[half:])
            if tool_call:
                name = body["tools"][0]["function"]["name"]
                message["content"] = None
                message["tool_calls"] = [{"id": "chatcmpl-tool-1", "type": "function",
                                          "function": {"name": name, "arguments": '{"city": "Hanoi"}'}}]
                finish = "tool_calls"
            self._send_json(200, {"id": "chatcmpl-1", "object": "chat.completion", "created": created, "model": model,
                                  "choices": [{"index": 0, "message": message, "logprobs": None,
                                               "finish_reason": finish, "stop_reason": None}],
                                  "service_tier": None, "system_fingerprint": None, "usage": usage,
                                  "prompt_logprobs": None, "kv_transfer_params": None})

        def _slow(self, fault: str) -> None:
            """A reply that trickles (`drip`: body bytes, `slow-headers`: header bytes, one per `drip_s`) or
            grows without a newline (`no-newline`: one SSE line, `huge`: a JSON body), until `hang_s`."""
            end = time.monotonic() + cfg.hang_s
            try:
                if fault == "slow-headers":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                else:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream" if fault == "no-newline" else "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                if fault == "no-newline":
                    self._chunk(b"data: ")
                while time.monotonic() < end and not server._released.is_set():
                    if fault in ("no-newline", "huge"):
                        self._chunk(b"a" * 65536)
                    elif not server._released.wait(cfg.drip_s):
                        self.wfile.write(b"a") if fault == "slow-headers" else self._chunk(b" ")
                        self.wfile.flush()
            except OSError:  # the client gave up: what the test wants
                pass
            self.close_connection = True

        def _stream(self, body: dict[str, Any], model: str, words: list[str], usage: dict[str, Any],
                    finish: str, fault: str, thinking: bool) -> None:
            base = self._open_stream(model)
            if fault == "malformed":
                self._sse(b'{"id": "chatcmpl-1", "choices": [{"delta": {"content": " w0"')
            if fault == "wrong-shape":
                self._sse({**base, "choices": [{"index": 0, "delta": " w0"}]})
            for i, w in enumerate(words):
                if fault in ("cut", "cut-clean", "stream-error") and i == 2:
                    break
                key = "reasoning" if thinking and i < len(words) // 2 else "content"
                self._sse({**base, "choices": [{"index": 0, "delta": {key: w}, "logprobs": None, "finish_reason": None}]})
            if fault == "cut":
                self._cut()
                return
            if fault == "stream-error":
                self._sse(_error("Internal server error", "InternalServerError", 500))
                self._sse(b"[DONE]")
                self._chunk(b"")
                return
            if fault != "cut-clean":
                self._sse({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish,
                                                "stop_reason": None}]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    self._sse({**base, "choices": [], "usage": usage})
                self._sse(b"[DONE]")
            self._chunk(b"")  # end of the chunked body

    return Handler


@pytest.fixture
def fake():
    """`fake(**FakeConfig fields)` starts a fake server; all are stopped after the test."""
    servers: list[FakeVllm] = []

    def start(**changes: Any) -> FakeVllm:
        server = FakeVllm(FakeConfig(**changes)).start()
        servers.append(server)
        return server
    yield start
    for server in servers:
        server.stop()
