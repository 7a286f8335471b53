"""Running the warmup: wait for each server, walk its ladder one step at a time, then the warm pass.

Steps run strictly one after another (only the concurrency steps send several requests at once),
so the engine compiles one shape at a time. The first failure stops that server's ladder and
the fleet; it is recorded with the step name and the server's own words.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from ..server_api.address import redact
from ..textsafe import shown
from ..server_api.client import Reply, ServerClient
from ..server_api.transport import Deadline, Rejected, StepError, Unreachable
from .ladder import LadderConfig, Step, build_ladder, warm_pass
from ..server_api.prompts import TOOLS, FittedPrompt, PromptFitter, chat_messages, short_question
from ..server_api.readiness import NotReady, wait_until_ready
from .report import FAILED, MAX_REASON, NOT_RUN, OK, READINESS, SKIPPED, ServerReport, StepResult, WarmupReport

EXIT_STEP_FAILED = 1
_TOKENIZE_TIMEOUT_S = 60.0
_HEALTH_AFTER_FAILURE_TIMEOUT_S = 5.0


class Progress(Protocol):
    """What the command shows while it works (a live display on a terminal, plain lines otherwise)."""

    def server(self, api_base: str, index: int, total: int) -> None: ...
    def waiting(self, what: str, elapsed_s: float) -> None: ...
    def step_started(self, label: str, step: Step) -> None: ...
    def step_finished(self, label: str, result: StepResult) -> None: ...


@dataclass(frozen=True)
class WarmupOptions:
    """Everything one run needs besides the server addresses."""

    model: str | None = None
    api_key: str | None = None
    wait_s: float = 1800.0
    poll_s: float = 1.0
    ladder: LadderConfig = field(default_factory=LadderConfig)
    warm_pass: bool = True


def warm_fleet(api_bases: Sequence[str], options: WarmupOptions, progress: Progress) -> WarmupReport:
    """Warm each server in turn; stop at the first one that fails."""
    report = WarmupReport(servers=[], settings={
        "model": options.model, "wait_s": options.wait_s,
        "max_num_batched_tokens": options.ladder.max_num_batched_tokens,
        "max_num_seqs": options.ladder.max_num_seqs, "decode_tokens": options.ladder.decode_tokens,
        "step_timeout_s": options.ladder.step_timeout_s,
        "timeouts": {p: s for p, s in options.ladder.timeouts}, "warm_pass": options.warm_pass})
    for i, api_base in enumerate(api_bases):
        progress.server(redact(api_base), i + 1, len(api_bases))
        server = warm_server(api_base, options, progress)
        report.servers.append(server)
        if not server.ok:
            report.not_attempted = [redact(u) for u in api_bases[i + 1:]]
            break
    return report


def warm_server(api_base: str, options: WarmupOptions, progress: Progress) -> ServerReport:
    """Readiness, the cold ladder and the warm pass for one server; no secret reaches the report."""
    report = ServerReport(api_base=redact(api_base))
    cfg = options.ladder
    with ServerClient(api_base, options.api_key, max_connections=cfg.max_num_seqs) as client:
        try:
            ready = wait_until_ready(client, options.model, options.wait_s, options.poll_s, progress.waiting)
        except NotReady as err:
            report.fail(READINESS, client.redact(str(err)), err.exit_code)
            return report
        report.model, report.max_model_len, report.ready_after_s = ready.model, ready.max_model_len, ready.waited_s
        steps = build_ladder(replace(cfg, max_model_len=ready.max_model_len))
        runner = _StepRunner(client, ready.model)
        report.steps = _run_all(runner, steps, "", report, progress)
        report.token_lengths = runner.token_lengths
        if report.ok and options.warm_pass:
            report.warm = _run_all(runner, warm_pass(steps), "warm/", report, progress)
    return report


def _run_all(runner: _StepRunner, steps: list[Step], prefix: str, report: ServerReport,
             progress: Progress) -> list[StepResult]:
    results = []
    for step in steps:
        label = prefix + step.name
        if not report.ok:
            results.append(StepResult(step.name, step.kind, NOT_RUN, concurrency=step.concurrency))
            continue
        progress.step_started(label, step)
        result = runner.run(step, label)
        # Server text is data: one printable line, bounded, no secret (textsafe).
        result.reason = shown(runner.client.redact(result.reason), MAX_REASON)
        result.note = shown(runner.client.redact(result.note), MAX_REASON)
        progress.step_finished(label, result)
        results.append(result)
        if result.status == FAILED:
            report.fail(label, result.reason, EXIT_STEP_FAILED)
    return results


class _StepRunner:
    """Builds each step's requests, sends them and judges the replies."""

    def __init__(self, client: ServerClient, model: str) -> None:
        self.client = client
        self.model = model
        self.nonce = secrets.token_hex(4)  # per run: a second warmup of the same server misses the cache too
        self.fitter = PromptFitter()

    @property
    def token_lengths(self) -> str:
        """How prompt lengths were set: measured by the server or estimated."""
        return self.fitter.token_lengths

    def run(self, step: Step, label: str) -> StepResult:
        """Run one step; never raises for a server problem (it becomes a failed result).

        The step's time limit is wall-clock and covers all its requests, the /tokenize calls that size
        the prompt included; the latency covers the generation requests only.
        """
        result = StepResult(step.name, step.kind, OK, concurrency=step.concurrency)
        deadline = Deadline.after(step.timeout_s)
        start = None
        try:
            requests = self._prepare(step, label, result, deadline)
            start = time.monotonic()
            replies = self._send_all(step, requests, deadline)
        except StepError as err:
            result.latency_s = None if start is None else time.monotonic() - start
            if isinstance(err, Rejected) and step.optional:
                result.status, result.note = SKIPPED, f"skipped: the server rejected it ({err})"
            else:
                result.status, result.reason = FAILED, f"{err}{self._engine_state()}"
            return result
        result.latency_s = time.monotonic() - start
        empty = [i for i, r in enumerate(replies) if r.empty]
        if empty:
            r = replies[empty[0]]
            which = f" (request {empty[0] + 1} of {len(replies)})" if len(replies) > 1 else ""
            result.status = FAILED
            counted = ("the server counted 0 generated tokens" if r.completion_tokens is not None
                       else "no token count, and no text, reasoning or tool call")
            result.reason = (f"empty completion{which}: {counted} "
                             f"(completion_tokens={r.completion_tokens}, finish_reason={r.finish_reason})")
            return result
        last = replies[-1]
        result.completion_tokens = sum(r.completion_tokens or 0 for r in replies)
        if step.concurrency == 1 and last.prompt_tokens is not None:
            result.prompt_tokens = last.prompt_tokens  # the server's own count beats our target
        result.ttft_s = last.ttft_s
        result.note = _note(step, replies, result.note)
        if step.kind == "prefix-cache":
            result.cached_tokens = last.cached_tokens
        return result

    def _prepare(self, step: Step, label: str, result: StepResult, deadline: Deadline) -> list[_Request]:
        """The step's requests, prompts sized; the request id names the step in the server log."""
        rid = f"caovan-warmup:{label}:{self.nonce}"
        nonce = f"{self.nonce}-{label}"
        if step.kind == "completion":
            body = {"model": self.model, "prompt": short_question(nonce), "max_tokens": step.max_tokens,
                    "ignore_eos": step.ignore_eos}
            return [_Request("/v1/completions", body, f"{rid}:0")]
        if step.kind in ("concurrency", "mixed"):
            texts = [short_question(f"{nonce}-{i}") for i in range(step.concurrency)]
            if step.kind == "mixed":  # the first request is the long prefill, the others decode beside it
                texts[0] = self._prompt(step, f"{nonce}-0", result, deadline)
            return [_Request("/v1/chat/completions", self._chat_body(step, t), f"{rid}:{i}")
                    for i, t in enumerate(texts)]
        body = self._chat_body(step, self._prompt(step, nonce, result, deadline))
        copies = 2 if step.kind == "prefix-cache" else 1  # the second copy hits the prefix cache
        return [_Request("/v1/chat/completions", body, f"{rid}:{i}") for i in range(copies)]

    def _send_one(self, req: _Request, deadline: Deadline) -> Reply:
        send = self.client.completion if req.path == "/v1/completions" else self.client.chat
        return send(req.body, deadline, req.request_id)

    def _send_all(self, step: Step, requests: list[_Request], deadline: Deadline) -> list[Reply]:
        """One after another, or all at once for a concurrency step; the first error is raised."""
        if step.concurrency == 1:
            return [self._send_one(req, deadline) for req in requests]
        with ThreadPoolExecutor(max_workers=len(requests)) as pool:
            futures = [pool.submit(self._send_one, req, deadline) for req in requests]
            replies, errors = [], []
            for i, fut in enumerate(futures):
                try:
                    replies.append(fut.result())
                except StepError as err:
                    errors.append((i, err))
        if errors:
            i, err = errors[0]
            more = f" ({len(errors)} of {len(requests)} failed)" if len(errors) > 1 else ""
            raise type(err)(f"request {i + 1} of {len(requests)}: {err}{more}")
        return replies

    def _chat_body(self, step: Step, text: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": chat_messages(text),
                                "max_tokens": step.max_tokens, **step.sampling}
        if step.ignore_eos:
            body["ignore_eos"] = True
        if step.kind == "stream":
            body.update(stream=True, stream_options={"include_usage": True})
        elif step.kind == "tool-call":
            body.update(tools=TOOLS, tool_choice="auto")
        elif step.kind == "reasoning":
            body.update(chat_template_kwargs={"enable_thinking": True})
        return body

    def _prompt(self, step: Step, nonce: str, result: StepResult, deadline: Deadline) -> str:
        """The step's prompt text; fitted to its token target when it has one."""
        if step.prompt_tokens is None:
            if step.kind == "reasoning":
                return f"[{nonce}] Think it through step by step: what is 17 * 23?"
            if step.kind == "tool-call":
                return f"[{nonce}] What is the weather in Hanoi right now? Use the get_weather tool."
            return short_question(nonce)
        fitted = self._fit(nonce, step.prompt_tokens, deadline)
        result.prompt_tokens, result.prompt_tokens_exact = fitted.tokens, fitted.exact
        return fitted.text

    def _fit(self, nonce: str, target: int, deadline: Deadline) -> FittedPrompt:
        return self.fitter.fit(nonce, target, partial(self._count, deadline))

    def _count(self, deadline: Deadline, messages: list[dict[str, str]]) -> int | None:
        limit = deadline if deadline.left() < _TOKENIZE_TIMEOUT_S else _TOKENIZE_TIMEOUT_S
        return self.client.tokenize({"model": self.model, "messages": messages}, limit)

    def _engine_state(self) -> str:
        """After a failure: what GET /health says now, so an engine death is named as such."""
        try:
            code = self.client.get("/health", _HEALTH_AFTER_FAILURE_TIMEOUT_S).status_code
        except Unreachable:
            return "; the server no longer accepts connections (vLLM exits when its engine dies)"
        except StepError:
            return ""
        if code == 503:
            return "; GET /health now returns 503: the engine died"
        return ""


@dataclass(frozen=True)
class _Request:
    path: str
    body: dict[str, Any]
    request_id: str


def _note(step: Step, replies: list[Reply], note: str) -> str:
    last = replies[-1]
    if step.kind == "tool-call":
        return "tool parser active: the model called the tool" if last.tool_calls else \
            "answered without a tool call (the server accepted tools)"
    if step.kind == "reasoning":
        return "reasoning parser active" if last.reasoning else \
            "no separate reasoning in the reply (server started without --reasoning-parser?)"
    if step.kind == "prefix-cache":
        if last.cached_tokens is None:
            return "the server does not report cached tokens (vLLM: --enable-prompt-tokens-details)"
        return f"second request: {last.cached_tokens} of {last.prompt_tokens} prompt tokens from the prefix cache"
    if step.kind == "stream":
        return f"{last.chunks} chunks"
    return note
