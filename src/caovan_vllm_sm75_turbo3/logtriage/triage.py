"""Read a vLLM server log once, in order, and say what went wrong: our status lines first, then the
first real failure and its likely cause, then every known message judged harmless or fatal."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import CaovanError
from ..logformat import (ATTENTION_STATE, BANNER_MORE, GDN_STATE, HEADER_RE, STATUS_LINE, TURBO_LINE, WARMUP_LINE,
                         WORKER_LINE)
from .reader import (LEARN_LINES, LearntPrefix, LogLine, clean, learn_prefix, line_pieces, numbered_lines, open_log,
                     strip_colours)
from .evidence import APPLIED_WORDS, Evidence
from .judge import judge
from .results import CaovanSummary, Failure, Finding, Triage
from .shapes import Shape, Shapes
from .signature import CONTEXT_LINES, Role, Rule, Signature
from .signatures import BY_ID, SIGNATURES
from .words import (_LOUD_LEVELS, _NEEDLES, _TRIGGERS, ACCESS, BLOCK_LINES, ERROR_WORDS, EXCEPTION, FRAME,
                    KERNEL_LAUNCH, MAX_PROCESSES, MAX_STATES, MAX_STATUS_KEYS, MAX_TEXT, NOT_FAILURES, PHASE_FRAMES,
                    PHASE_MARKERS, SHUTDOWN_MARKERS, VLLM_VERSION, fatal_signal, goes_on_traceback)

__all__ = ["CaovanSummary", "Failure", "Finding", "Triage", "triage_lines", "triage_path", "triage_stream"]


@dataclass
class _Hit:
    sig: Signature
    line: LogLine
    details: dict[str, str]
    phase: str | None
    until: int = 0
    count: int = 1


class _Reader:
    """One pass over a log: it reads lines, matches the known messages, and feeds the evidence
    trackers (evidence.py); `finish` hands both to the judge (judge.py). Everything it keeps is bounded."""

    def __init__(self) -> None:
        self.ev = Evidence()
        self.in_banner = False
        # Open tracebacks by process: lines of other processes may come between a traceback's lines.
        self.tracebacks: dict[str | None, str | None] = {}   # process -> phase pinned by its frames
        self.recent: deque[str | bytes] = deque(maxlen=CONTEXT_LINES)   # bytes: not cleaned yet
        self.shapes = Shapes(_TRIGGERS, _NEEDLES, ACCESS, "HTTP/", _LOUD_LEVELS, goes_on_traceback, SHUTDOWN_MARKERS,
                             b'File "')
        self.findings: dict[str, Finding] = {}
        self.pending: list[_Hit] = []
        self.frame_hits: dict[str | None, _Hit] = {}   # process -> a match in its open traceback's frames
        self.needles: tuple[tuple[str, int], ...] = _NEEDLES   # those that may be in the current line
        self.prefix: LearntPrefix | None = None   # a prefix of no known form the log's head taught

    # -- one line -------------------------------------------------------------------------------
    def read(self, lines: Iterable[tuple[int, bytes]]) -> None:
        """Read raw lines (see reader.numbered_lines) in order, BLOCK_LINES at a time, with the
        prefix the first LEARN_LINES teach (reader.learn_prefix, as reader.read_lines does)."""
        it = iter(lines)
        head = list(itertools.islice(it, LEARN_LINES))
        self.prefix = learn_prefix([raw for _, raw in head])
        if self.prefix is not None:
            self.shapes.prefix_ends += self.prefix.end
        it = itertools.chain(head, it)
        while block := list(itertools.islice(it, BLOCK_LINES)):
            self._read_block(block)

    def clean(self, raw: bytes, number: int = 0) -> LogLine:
        """`reader.clean` of a raw line (one piece: no `\r` in it), with the learnt prefix."""
        return clean(raw.decode("utf-8", "replace"), number, self.prefix)

    def _read_block(self, block: list[tuple[int, bytes]]) -> None:
        """While no traceback, banner or deferred finding is open, a line of a shape (see shapes.py)
        holding none of the words `feed` reacts to (_TRIGGERS) at no loud level only counts, and
        one whose only such word is `HTTP/` only counts its status: most lines are never decoded.
        The words that may be in the lines of shapes not seen yet are looked for once in them all;
        most such lines are then told at sight, the others cleaned. This loop runs once per line
        of logs of gigabytes, hence its local names."""
        shapes, seen, key_of = self.shapes, self.shapes.seen, Shapes.key
        rows: list[tuple[int, bytes, bytes | None, Shape | None]] = []
        new: list[bytes] = []
        for number, raw in block:
            if (key := key_of(raw)) is None and b"\x1b" in raw:   # colours: `clean` drops them first too
                plain = strip_colours(raw)
                if (key := key_of(plain)) is not None:   # with `\r` in it, its pieces are read as they are
                    raw = plain
            shape = None
            if key is not None and (shape := seen.get(key)) is None:
                new.append(raw)
            rows.append((number, raw, key, shape))
        found = shapes.find(new) if new else None
        for number, raw, key, shape in rows:
            if key is None:   # other control characters or `\r` inside: cleaned and read in full
                self.needles = _NEEDLES   # `_match` keeps those in the text
                for piece in line_pieces(number, raw, self.prefix):
                    self.feed(piece)
                continue
            ln = None
            if shape is None:   # a new shape (or one an earlier line of this block taught)
                shape = seen.get(key) or shapes.at_sight(key, raw, found)  # type: ignore[arg-type]
                if shape is None:
                    ln = self.clean(raw, number)
                    shape = shapes.learn(key, ln, found)  # type: ignore[arg-type]
            if shape.empty:
                continue
            full = (shape.full or self.pending or self.in_banner
                    or (shape.raw_words and any(map(raw.__contains__, shape.raw_words)))
                    or (shape.frame and not self.tracebacks))   # a frame opens a traceback
            if not full and self.tracebacks:   # open: a line going on with its process's only pins a phase
                if shape.goes_on is None:   # told at sight: what it is in a traceback is learnt now
                    ln = ln or self.clean(raw, number)
                    shape = shapes.learn(key, ln, shapes.find([raw]))
                process = raw[shape.process[0]:shape.process[1]].decode() if isinstance(
                    shape.process, tuple) else shape.process
                full = shape.full or not shape.goes_on or process not in self.tracebacks
                if not full and shape.pins and self.tracebacks[process] is None:
                    self.tracebacks[process] = shape.pins
            if full:
                self.needles = shape.needles
                self.feed(ln or self.clean(raw, number))
                continue
            self.ev.lines = number
            if shape.marks:   # as `feed` notes them
                self._note_marks(number)
            if shape.status is not None:
                self._count_status(int(raw[shape.status]), number, raw)
            self.recent.append(raw)   # cleaned only if something reads it (_recent)

    def feed(self, ln: LogLine) -> None:
        ev = self.ev
        ev.lines = ln.number
        text = ln.text
        self._resolve_pending(ln)
        self._track_phase(text)
        own_state = self._track_caovan(ln)
        if ev.vllm_version is None and ("version" in text) and (m := VLLM_VERSION.search(text)):
            if "vLLM" in text or "\u2588" in text:   # the plain line or vLLM's logo
                ev.vllm_version = m.group("version")
        kind, tb_phase = self._track_traceback(ln)
        serving = ev.serving.since is not None
        if not serving:
            if not ev.start.done:
                ev.start.feed(ln, kind, ln.level in _LOUD_LEVELS)
        elif not own_state:
            ev.after.feed(ln, kind, ev.start.opened)
        if "nvcc" in text or "ninja" in text or "CUDA_HOME" in text or "rror building" in text:
            ev.build.feed(ln, ln.level in _LOUD_LEVELS)
        if "custom" in text and any(w in text for w in APPLIED_WORDS):
            ev.note_applied(text)
        matched = own_state or self._match(ln, kind, tb_phase)
        if kind == "exception":
            frame_hit = self.frame_hits.pop(ln.process, None)
            if frame_hit is not None and not matched:
                # A known name in a frame (flashqla_legacy/...) explains the exception it leads to:
                # report it at the exception line, which is what a person looks for.
                frame_hit.details.setdefault("frame", frame_hit.line.text.strip()[:MAX_TEXT])
                frame_hit.line = ln
                self._record(frame_hit.sig, frame_hit)
            elif not matched:
                self._note_unknown_exception(ln, tb_phase)
        elif not matched and ev.first_alarm is None and not own_state and (
                ln.level == "CRITICAL" or text.startswith("AssertionError") or fatal_signal(text)):
            ev.first_alarm = (ln, tb_phase or ev.phase or "")
        self._track_http(ln)
        if any(m in text for m in SHUTDOWN_MARKERS):
            self._note_marks(ln.number)
        if "Application startup complete" in text:
            ev.serving.ready_line = ev.serving.ready_line or ln.number
            ev.waits.close("harmless", ln)
        elif "init engine (profile, create kv cache, warmup model) took" in text:
            ev.waits.close("harmless", ln)
        self.recent.append(text)

    def _note_marks(self, number: int) -> None:
        """A shutdown's mark: asked for once the server served (unless a crash came first), the server
        stopping before."""
        if self.ev.serving.since is not None:
            self.ev.after.shutdown(number)
        else:
            self.ev.start.shutdown(number)

    def _track_phase(self, text: str) -> None:
        for marker, phase in PHASE_MARKERS:
            if marker in text:
                self.ev.phase = phase

    def _track_caovan(self, ln: LogLine) -> bool:
        """Summarise our own status lines; True for a per-process state line (not to be judged)."""
        text = ln.text
        c = self.ev.caovan
        if self.in_banner:
            m = STATUS_LINE.match(text)
            if m is not None:
                if len(c.status) < MAX_STATUS_KEYS:
                    c.status.setdefault(m.group("key"), m.group("value")[:MAX_TEXT])
                return False
            if text.startswith(BANNER_MORE):
                if text.startswith("check ") and len(c.checks) < MAX_STATUS_KEYS:
                    c.checks.append(text[len("check "):MAX_TEXT])
                return False
            self.in_banner = False
        if "Caovan" not in text:
            return False
        if m := HEADER_RE.search(text):
            c.banners += 1
            self.in_banner = c.banners == 1   # the first launch is summarised
            if self.in_banner:
                c.version, c.line = m.group("version"), ln.number
        elif m := WARMUP_LINE.search(text):
            if c.warmup is None or c.warmup.startswith("warmup=READY"):
                c.warmup, c.warmup_line = m.group("line")[:MAX_TEXT], ln.number
        elif m := WORKER_LINE.match(text):
            if m.group("what") == "nothing of ours applies":
                c.inactive_processes += 1
            else:
                c.processes += 1
            return True
        elif m := (GDN_STATE.match(text) or TURBO_LINE.match(text) or ATTENTION_STATE.match(text)):
            state = m.group("state")[:MAX_TEXT]
            if state in c.states or len(c.states) < MAX_STATES:
                c.states[state] = c.states.get(state, 0) + 1
            return True
        return False

    def _track_traceback(self, ln: LogLine) -> tuple[str, str | None]:
        """('' | 'error' | 'traceback' | 'exception', the phase its frames pin) for this line."""
        text = ln.text
        stripped = text.lstrip()
        if stripped.startswith("Traceback (most recent call last)"):
            if ln.process in self.tracebacks or len(self.tracebacks) < MAX_PROCESSES:
                self.tracebacks[ln.process] = None
                self.ev.start.opened = ln.number
            return "traceback", None
        if 'File "' in text and ln.process not in self.tracebacks and (m := FRAME.search(text)) is not None and (
                len(self.tracebacks) < MAX_PROCESSES):   # frames without their header: an excerpt cut above it
            self.tracebacks[ln.process] = PHASE_FRAMES.get(m.group("func"))
            self.ev.start.opened = ln.number
            return "traceback", self.tracebacks[ln.process]
        if ln.process in self.tracebacks:
            phase = self.tracebacks[ln.process]
            goes_on, pins = goes_on_traceback(text)
            if goes_on:
                self.tracebacks[ln.process] = phase or pins
                return "traceback", self.tracebacks[ln.process]
            del self.tracebacks[ln.process]
            if EXCEPTION.match(stripped):
                return "exception", phase
        if ln.level in ("WARNING", "ERROR", "CRITICAL") or (
                ("rror" in text or "ailed" in text or "FAILED" in text) and ERROR_WORDS.search(text)):
            return "error", None
        return "", None

    def _track_http(self, ln: LogLine) -> None:
        if "HTTP/" in ln.text and (m := ACCESS.search(ln.text)) is not None:
            self._count_status(int(m.group("status")), ln.number, ln)

    def _count_status(self, status: int, number: int, line: LogLine | bytes) -> None:
        """Count an access line's status; a 2xx ends a shared-memory wait (the line is cleaned then)."""
        self.ev.serving.status(status, number)
        if 200 <= status < 300 and self.ev.waits.open:
            self.ev.waits.close("harmless", line if isinstance(line, LogLine) else self.clean(line, number))

    def _recent(self) -> list[str]:
        """The last CONTEXT_LINES cleaned texts; lines that only counted are cleaned here, when read."""
        for i in range(len(self.recent)):
            if isinstance(text := self.recent[i], bytes):
                self.recent[i] = self.clean(text).text
        return [str(text) for text in self.recent]

    # -- signatures -----------------------------------------------------------------------------
    def _match(self, ln: LogLine, kind: str, tb_phase: str | None) -> bool:
        candidates = {i for n, i in self.needles if n in ln.text}
        for sig in (SIGNATURES[i] for i in sorted(candidates)):
            details = sig.matches(ln.text)
            if details is None or (sig.error_context and not kind):
                continue
            phase = (tb_phase or self.ev.phase) if sig.fixes_by_phase or sig.id == "host-oom-kill" else None
            hit = _Hit(sig, ln, details, phase)
            if sig.id == "triton-shared-memory":
                hit.details.update(self._kernel_name())
            if sig.rule is Rule.UNTIL_READY:
                self.ev.waits.open = True
            elif sig.rule is Rule.FATAL:
                self.ev.waits.close("fatal", ln)
            if kind == "traceback":
                if ln.process not in self.frame_hits and len(self.frame_hits) < MAX_PROCESSES:
                    self.frame_hits[ln.process] = hit
            elif sig.context and not any(c in r for r in self._recent() for c in sig.context):
                self._defer(hit)
            else:
                self._record(sig, hit)
            return True
        return False

    def _kernel_name(self) -> dict[str, str]:
        """The Triton kernel a shared-memory error is about: its launch line in the traceback above."""
        recent = self._recent()
        for text in reversed(recent):
            if m := KERNEL_LAUNCH.search(text):
                return {"kernel": m.group("kernel")}
        for text in reversed(recent):
            if (m := FRAME.search(text)) and "/triton/" not in m.group("path"):
                return {"kernel": m.group("func")}
        return {}

    def _defer(self, hit: _Hit) -> None:
        for p in self.pending:
            if p.sig is hit.sig:
                p.count += 1
                return
        hit.until = hit.line.number + CONTEXT_LINES
        self.pending.append(hit)

    def _resolve_pending(self, ln: LogLine) -> None:
        for p in list(self.pending):
            if any(c in ln.text for c in p.sig.context):
                self.pending.remove(p)
                self._record(p.sig, p)
            elif ln.number > p.until:
                self.pending.remove(p)
                self._record(BY_ID[p.sig.otherwise or p.sig.id], p)

    def _record(self, sig: Signature, hit: _Hit) -> None:
        f = self.findings.get(sig.id)
        shutdown = self.ev.after.shutdown_line
        if f is None and shutdown is not None and sig.role is Role.CONSEQUENCE:
            # the engine "died" because it was stopped: harmless, and said so
            sig_status, note = "harmless", f"after the shutdown that began at line {shutdown}"
        else:
            sig_status, note = "fatal" if sig.rule is Rule.UNTIL_READY else sig.rule.value, ""   # decided in finish()
        if f is None:
            status = sig_status
            fix = sig.fixes_by_phase.get(hit.phase or "", sig.fix)
            self.findings[sig.id] = Finding(
                sig.id, sig.title, status, sig.role.value, hit.line.number, hit.line.number, hit.count,
                hit.line.text[:MAX_TEXT], hit.line.process, sig.cause, fix, dict(hit.details), hit.phase, note)
            return
        f.last_line = max(f.last_line, hit.line.number)
        f.count += hit.count

    def _note_unknown_exception(self, ln: LogLine, tb_phase: str | None) -> None:
        ev = self.ev
        if ev.after.shutdown_line is not None:   # what a requested shutdown breaks is no failure
            return
        if ev.first_unknown is None and not any(n in ln.text for n in NOT_FAILURES):
            ev.first_unknown = (ln, tb_phase or ev.phase or "")
            ev.first_alarm = ev.first_alarm or ev.first_unknown


    def finish(self, source: str) -> Triage:
        """The result of the pass: the matches still open recorded (tracebacks the log cut off before
        their exception line, deferred ones), then the judge's verdict on the evidence."""
        for hit in self.frame_hits.values():
            self._record(hit.sig, hit)
        for p in list(self.pending):
            self.pending.remove(p)
            self._record(BY_ID[p.sig.otherwise or p.sig.id], p)
        ev = self.ev
        ev.cut_in_traceback = bool(self.tracebacks)
        findings, first = judge(ev, self.findings)
        return Triage(source, ev.lines, ev.vllm_version, ev.serving.ready_line, ev.serving.http_ok,
                      ev.serving.http_error, ev.caovan, first, findings)


def triage_lines(lines: Iterable[LogLine], source: str = "-") -> Triage:
    """Triage cleaned log lines (see reader.read_lines), each read in full: the reference the fast
    path of `triage_stream` agrees with, and what tests with hand-made lines use."""
    state = _Reader()
    for ln in lines:
        state.feed(ln)
    return state.finish(source)


def triage_stream(stream: BinaryIO, source: str = "-") -> Triage:
    """Triage a raw log stream in one pass (see _Reader.read)."""
    state = _Reader()
    state.read(numbered_lines(stream))
    return state.finish(source)


def triage_path(path: str) -> Triage:
    """Triage the log at `path` (`-`: standard input). Raises CaovanError when it cannot be read."""
    with open_log(path) as stream:
        try:
            return triage_stream(stream, path)
        except (OSError, EOFError) as err:
            label = "standard input" if path == "-" else repr(path)
            raise CaovanError(f"--log {label}: reading failed part-way ({getattr(err, 'strerror', None) or err})"
                              ) from None
