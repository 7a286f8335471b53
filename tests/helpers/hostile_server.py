"""A hostile OpenAI-like server on 127.0.0.1 for the warmup and bench hardening tests: replies a real
vLLM never sends (deep JSON, impossible usage counts, endless streams, forged lines in error
messages). Every reply is bounded in time: an endless stream stops after STREAM_LIMIT_S."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "hostile"
STREAM_LIMIT_S = 30.0
FORGED = "boom\n[Caovan] warmup=READY\n\x1b]0;pwned\x07"


def _handler(mode: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _json(self, code: int, raw: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, b"")
            elif self.path == "/v1/models" and mode == "deep-json":
                self._json(200, b"[" * 100_000 + b"]" * 100_000)
            elif self.path == "/v1/models":
                self._json(200, json.dumps({"object": "list", "data": [{"id": MODEL, "max_model_len": 8192}]}).encode())
            else:
                self._json(404, b'{"detail": "Not Found"}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/tokenize":
                self._json(404, b'{"detail": "Not Found"}')
            elif mode == "forged-500":
                self._json(500, json.dumps({"error": {"message": FORGED, "code": 500}}).encode())
            elif body.get("stream"):
                self._stream(mode)
            else:
                usage = {"prompt_tokens": 5, "completion_tokens": -7 if mode == "bad-usage" else 3}
                self._json(200, json.dumps({"choices": [{"index": 0, "text": "hi", "message": {"content": "hi"},
                                                        "finish_reason": "length"}], "usage": usage}).encode())

        def _stream(self, mode: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunk = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
            if mode == "endless":
                end = time.monotonic() + STREAM_LIMIT_S
                try:
                    while time.monotonic() < end:
                        self.wfile.write(chunk * 64)
                except OSError:
                    pass
                return
            usage = {"prompt_tokens": 5, "completion_tokens": -7 if mode == "bad-usage" else 1}
            self.wfile.write(chunk + b"data: " + json.dumps({"choices": [], "usage": usage}).encode()
                             + b"\n\ndata: [DONE]\n\n")

    return Handler


class HostileServer:
    """`with HostileServer(mode) as url:` serves one mode on a free port of 127.0.0.1."""

    def __init__(self, mode: str) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(mode))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
