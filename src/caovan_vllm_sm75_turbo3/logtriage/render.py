"""The plain-text report of a triage, in order of importance."""

from __future__ import annotations

import textwrap

from ..policy.banner import header
from ..textsafe import safe
from .results import Finding, Triage

WIDTH = 100
VERDICT_WORDS = {
    "fatal": "FATAL: the server failed; fix the first real failure above",
    "undecided": "UNDECIDED: the log does not show how the start ended; see above what it waits on",
    "warning": "WARNING: it runs, but see the warnings above",
    "harmless-only": "OK: only harmless messages",
    "clean": "OK: no known problem",
}


def _wrap(label: str, text: str, indent: int = 4) -> list[str]:
    """`text` made safe first, then wrapped: a secret cut across two lines would not be seen as one."""
    pad = " " * indent
    return textwrap.wrap(safe(text), WIDTH, initial_indent=f"{pad}{label}", subsequent_indent=pad + "  ",
                         break_on_hyphens=False, break_long_words=False) or [f"{pad}{label}"]


def _lines_of(f: Finding) -> str:
    where = f"line {f.first_line}" if f.first_line == f.last_line else f"lines {f.first_line}-{f.last_line}"
    return f"{where}, {f.count}x" if f.count > 1 else where


def render_text(t: Triage) -> str:
    """The report a person reads: our status, the first real failure, each known message, the verdict."""
    out: list[str] = []
    version = f", vLLM {t.vllm_version}" if t.vllm_version else ""
    out.append(f"Log: {'standard input' if t.source == '-' else t.source} ({t.lines:,} lines{version})")
    c = t.caovan
    if c.version:
        out.append(f"{header(c.version)} (line {c.line}"
                   + (f"; {c.banners} launches in this log, the first is shown" if c.banners > 1 else "") + ")")
        meanings = c.meanings()
        for key, value in c.status.items():
            kv = f"{key}={value}"
            out.append(f"  {kv:<40} {meanings[key]}" if key in meanings else f"  {kv}")
    else:
        out.append("No Caovan status banner: the server was started without caovan-vllm-serve, or the log "
                   "begins after it.")
    for check in c.checks:
        out.append(f"  check {check}")
    if c.processes:
        out.append(f"  guards applied in {c.processes} vLLM processes")
    if c.inactive_processes:
        out.append(f"  nothing of ours applied in {c.inactive_processes} vLLM processes")
    for state, count in c.states.items():
        out.append(f"  {state}" + (f" ({count} processes)" if count > 1 else ""))
    if c.warmup:
        out.append(f"  [Caovan] {c.warmup} (line {c.warmup_line})")
    out.append("")
    shown: set[str] = set()   # each fix is spelled out once
    if t.first_failure:
        ff = t.first_failure
        shown.add(ff.fix)
        out.append(f"FIRST REAL FAILURE (line {ff.line}): {ff.text}")
        out += _wrap("cause: ", ff.cause, 2)
        out += _wrap("fix:   ", ff.fix, 2)
        out.append("")
    if t.findings:
        out.append("Known messages:")
        for f in t.findings:
            out.append(f"  {f.status.upper():<9}{_lines_of(f)}: {f.title}")
            out += _wrap("> ", f.text, 11)
            if f.note:
                out += _wrap("", f.note, 11)
            out += _wrap("fix: ", "as above" if f.fix in shown else f.fix, 11)
            shown.add(f.fix)
        out.append("")
    ready = (f"the server started (line {t.ready_line}: Application startup complete)" if t.ready_line
             else "the log shows the server answering (2xx) but not its ready line" if t.http_ok
             else "the log does not show the server becoming ready (no 'Application startup complete')")
    http = f"; HTTP answers: {t.http_ok} 2xx, {t.http_error} 5xx" if t.http_ok or t.http_error else ""
    out.append(f"Verdict: {VERDICT_WORDS[t.verdict]} (exit {t.exit_code}); {ready}{http}.")
    return "\n".join(safe(line) for line in out)   # the log's text: printable, one line each, no secret
