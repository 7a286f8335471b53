"""`caovan-sm75-warmup`: a controlled ladder of requests that moves first-request JIT into deployment."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

from .. import __version__
from ..server_api.address import api_key_from, normalize_api_base
from ..warmup.ladder import (MAX_SECONDS, LadderConfig, Step, build_ladder, check_timeout_patterns, parse_timeout,
                             warm_pass)
from ..warmup.report import FAILED, OK, SKIPPED, ServerReport, StepResult
from ..warmup.runner import WarmupOptions, warm_fleet
from .common import OneLineParser, print_json, run_cli, seconds, whole_number

PROG = "caovan-sm75-warmup"
DEFAULT_API_BASE = "http://127.0.0.1:8000"
HEARTBEAT_S = 30.0
# Token counts and batch sizes past these are typos (vLLM's own limits are far below); they also keep
# prompt building (one word per token) and the thread pool of a concurrency step bounded.
MAX_TOKENS = 1 << 24
MAX_SEQS = 1024


_seconds = seconds(MAX_SECONDS)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Wait until a vLLM server is up (port open, GET /health 200, model listed), then send a "
                    "ladder of requests one at a time so that all first-request JIT (Triton, torch.compile, "
                    "MTP, GDN, CUDA graphs) happens now. Prints exactly '[Caovan] warmup=READY' on success; "
                    "any failure prints '[Caovan] warmup=FAILED step=<name> reason=<...>'.",
        epilog="Exit codes: 0 ready; 1 a step failed; 2 bad input (unknown model, API key refused); "
               "3 the server did not become ready within --wait or its engine is dead.")
    p.add_argument("--api-base", metavar="URL", action="extend", nargs="+", default=None,
                   help=f"server address, e.g. {DEFAULT_API_BASE} (a trailing /v1 is fine); several values "
                        f"warm a fleet one server after another (default: {DEFAULT_API_BASE})")
    p.add_argument("--model", metavar="NAME", help="served model name; omitted: the only model the server lists")
    p.add_argument("--api-key", metavar="KEY",
                   help="bearer key the server was started with (default: $VLLM_API_KEY, then $OPENAI_API_KEY)")
    p.add_argument("--max-num-batched-tokens", type=whole_number(16, MAX_TOKENS), default=8192, metavar="N",
                   help="the server's --max-num-batched-tokens: prefill prompts go up to and past it "
                        "(default: %(default)s)")
    p.add_argument("--max-num-seqs", type=whole_number(1, MAX_SEQS), default=2, metavar="N",
                   help="the server's --max-num-seqs: concurrency goes from 1 up to it (default: %(default)s)")
    p.add_argument("--decode-tokens", type=whole_number(1, MAX_TOKENS), default=256, metavar="N",
                   help="tokens of the long decode step (MTP draft/verify) (default: %(default)s)")
    p.add_argument("--wait", type=_seconds, default=1800.0, metavar="SECONDS",
                   help="how long to wait for the server to become ready (default: %(default)g)")
    p.add_argument("--poll-interval", type=_seconds, default=2.0, metavar="SECONDS",
                   help="seconds between readiness polls (default: %(default)g)")
    p.add_argument("--step-timeout", type=_seconds, default=900.0, metavar="SECONDS",
                   help="time limit of each step; the first ones pay the JIT (default: %(default)g)")
    p.add_argument("--timeout", action="append", default=[], metavar="STEP=SECONDS",
                   help="time limit for one step or a pattern of steps, e.g. 'prefill-*=1800' (repeatable; "
                        "see --list-steps)")
    p.add_argument("--no-warm-pass", action="store_true",
                   help="skip the second, warm pass of the short steps")
    p.add_argument("--list-steps", action="store_true", help="print the ladder and exit; contacts no server")
    p.add_argument("--json", action="store_true",
                   help="print the report as one JSON object on stdout (progress and the status line go to stderr)")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    return p


class PlainProgress:
    """One line per event, for logs and pipes; waiting lines only when something changes or every 30 s."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self._last: tuple[str, float] | None = None

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def server(self, api_base: str, index: int, total: int) -> None:
        self._last = None
        self._say(f"[Caovan] warmup server {index}/{total}: {api_base}")

    def waiting(self, what: str, elapsed_s: float) -> None:
        if self._last is None or self._last[0] != what or elapsed_s - self._last[1] >= HEARTBEAT_S:
            self._last = (what, elapsed_s)
            self._say(f"waiting {elapsed_s:.0f} s: {what}")

    def step_started(self, label: str, step: Step) -> None:
        self._say(f"step {label}: started (timeout {step.timeout_s:g} s)")

    def step_finished(self, label: str, result: StepResult) -> None:
        self._say(f"step {label}: {result_words(result)}")


class LiveProgress:
    """A live line on a terminal: spinner, what is happening, elapsed time; finished steps stay above it."""

    def __init__(self, out: IO[str]) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = Console(file=out, highlight=False, emoji=False)  # server text stays literal
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=self.console, transient=True)
        self._task: Any = None

    def __enter__(self) -> LiveProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def _show(self, description: str) -> None:
        from rich.markup import escape

        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(escape(description))

    def server(self, api_base: str, index: int, total: int) -> None:
        self._progress.console.print(f"warmup server {index}/{total}: {api_base}", markup=False)
        self._show(f"waiting for {api_base}")

    def waiting(self, what: str, elapsed_s: float) -> None:
        from rich.markup import escape

        self._progress.update(self._task, description=escape(f"waiting for {what}"))

    def step_started(self, label: str, step: Step) -> None:
        self._show(f"{label} (timeout {step.timeout_s:g} s)")

    def step_finished(self, label: str, result: StepResult) -> None:
        self._progress.console.print(f"{label}: {result_words(result)}", markup=False)


def result_words(r: StepResult) -> str:
    """`ok 1.23 s, prompt 512 tokens ...` / `FAILED: reason` / `skipped: note`."""
    if r.status == FAILED:
        return f"FAILED after {r.latency_s or 0:.2f} s: {r.reason}"
    if r.status == SKIPPED:
        return r.note
    parts = [f"{r.status} {r.latency_s or 0:.2f} s"]
    if r.prompt_tokens is not None:
        parts.append(f"prompt {r.prompt_tokens} tokens")
    if r.completion_tokens:
        parts.append(f"{r.completion_tokens} generated")
    if r.note:
        parts.append(r.note)
    return ", ".join(parts)


def print_table(server: ServerReport, out: IO[str]) -> None:
    """Per step: status, cold latency, warm latency, tokens and note or reason."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=out, highlight=False, emoji=False, width=None if out.isatty() else 120)
    title = f"{server.api_base}  model={server.model or '-'}"
    if server.ready_after_s is not None:
        title += f"  ready after {server.ready_after_s:.1f} s  token lengths {server.token_lengths or '-'}"
    table = Table(title=Text(title))
    for col in ("step", "status", "cold s", "warm s", "prompt", "out", "note"):
        table.add_column(col, overflow="fold")
    warm = {w.name: w for w in server.warm}
    colour = {OK: "green", FAILED: "red", SKIPPED: "yellow"}
    for s in server.steps:
        w = warm.get(s.name)
        table.add_row(Text(s.name), Text(s.status, style=colour.get(s.status, "")),
                      _secs(s.latency_s), _secs(w.latency_s if w else None),
                      "" if s.prompt_tokens is None else str(s.prompt_tokens),
                      "" if not s.completion_tokens else str(s.completion_tokens),
                      Text(s.reason or s.note or (w.reason if w else "")))
    console.print(table)


def _secs(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def list_steps(cfg: LadderConfig, out: IO[str]) -> None:
    """The ladder as it would run (before the server's max_model_len caps long prompts)."""
    steps = build_ladder(cfg)
    quick = {s.name for s in warm_pass(steps)}
    for s in steps:
        size = f"prompt {s.prompt_tokens} tokens, " if s.prompt_tokens else ""
        extra = f"x{s.concurrency} at once, " if s.concurrency > 1 else ""
        flags = "; optional" if s.optional else ""
        flags += "; warm pass" if s.name in quick else ""
        print(f"{s.name:<20} timeout {s.timeout_s:g} s: {size}{extra}{s.max_tokens} out; {s.purpose}{flags}", file=out)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    cfg = LadderConfig(max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                       decode_tokens=args.decode_tokens, step_timeout_s=args.step_timeout,
                       timeouts=tuple(parse_timeout(spec) for spec in args.timeout))
    check_timeout_patterns(cfg)
    if args.list_steps:
        list_steps(cfg, sys.stdout)
        return 0
    api_bases = [normalize_api_base(u) for u in (args.api_base or [DEFAULT_API_BASE])]
    api_key, key_source = api_key_from(args.api_key, os.environ)
    options = WarmupOptions(model=args.model, api_key=api_key, wait_s=args.wait, poll_s=args.poll_interval,
                            ladder=cfg, warm_pass=not args.no_warm_pass)
    err = sys.stderr
    progress = LiveProgress(err) if err.isatty() else PlainProgress(err)
    started = time.monotonic()
    with progress:
        report = warm_fleet(api_bases, options, progress)
    report.settings.update(api_key=key_source, elapsed_s=round(time.monotonic() - started, 3))
    line = report.status_line()
    if args.json:
        print_json(report.to_dict())
        print(line, file=err, flush=True)
    else:
        for server in report.servers:
            print_table(server, sys.stdout)
        for api_base in report.not_attempted:
            print(f"not attempted (an earlier server failed): {api_base}")
        print(line, flush=True)  # plain print: the exact text users grep for
    return report.exit_code


def entry() -> int:
    """Console-script entry point."""
    return run_cli(PROG, main)


if __name__ == "__main__":
    sys.exit(entry())
