"""Read a vLLM server log once, in order, and say what went wrong: our status lines first, then the
first real failure and its likely cause, then every known message judged harmless or fatal."""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

from ..errors import CaovanError
from ..policy import vllm_versions as vv
from ..policy.banner import HEADER_RE
from .reader import (LEARN_LINES, LogLine, clean, learn_prefix, line_pieces, numbered_lines, open_log, prefix_end,
                     strip_colours)
from .shapes import Shape, Shapes
from .signatures import BY_ID, CONTEXT_LINES, SIGNATURES, Role, Rule, Signature

MAX_TEXT = 300            # characters of a matched line kept as its excerpt
MAX_STATUS_KEYS = 64      # key=value lines kept from one banner
MAX_PROCESSES = 256       # processes whose open traceback is tracked
BLOCK_LINES = 128         # raw lines whose words are looked for at once (for new shapes only)

STATUS_LINE = re.compile(r"^(?:\[Caovan\] )?(?P<key>[a-z][a-z0-9_]*)=(?P<value>\S.*)$")
WARMUP_LINE = re.compile(r"\[Caovan\] (?P<line>warmup=\S+.*)$")
# Lines of the banner after its status lines (policy/banner.py): kept in the block, checks kept.
BANNER_MORE = ("env.", "arg ", "check ", "warning: ", "note: ", "refused: ")
# Our per-process status lines (plugin/): summarised, never judged as failures themselves.
GDN_STATE = re.compile(r"^Caovan SM75 Turbo3 GDN prefill: (?P<state>gdn_legacy=\S+ interface=.*)$")
WORKER_LINE = re.compile(r"^Caovan SM75 Turbo3 v\S+: (?P<what>guards from .+ apply|nothing of ours applies) "
                         r"in this process")
TURBO_LINE = re.compile(r"^Caovan SM75 Turbo3: (?P<state>turbo=.*)$")
MAX_STATES = 16           # distinct per-process state lines kept
ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})\b')
VLLM_VERSION = re.compile(r"(?:vLLM (?:API )?server version|\bversion) v?(?P<version>\d+\.\d+\.\d+[\w.+-]*)")
ERROR_WORDS = re.compile(r"Error\b|error:|[Ff]ailed|FAILED")
KERNEL_LAUNCH = re.compile(r"(?P<kernel>\w+)\[[^\]]*\]\(")
FRAME = re.compile(r'File "(?P<path>[^"]+)", line \d+, in (?P<func>\w+)')
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?::|$)")
NOT_FAILURES = ("KeyboardInterrupt", "SystemExit", "CancelledError")
# A shutdown someone asked for (Ctrl-C, SIGTERM): vLLM 0.27+ tags its steps "[shutdown]" and may then
# log EngineDeadError from a force-killed engine core; uvicorn says "Shutting down" in every release.
SHUTDOWN_MARKERS = ("[shutdown]", "Shutting down", "received signal=SIGINT", "received signal=SIGTERM")
# Lines that end a process without a Python exception: the interpreter's and the shell's words for
# signals (a signal's name as a whole word). The regex runs only where one of the words is there.
_FATAL_WORDS = ("Fatal Python error", "Segmentation fault", "SIGSEGV", "SIGABRT", "SIGBUS", "SIGILL", "SIGFPE",
                "core dumped", "terminated by signal", "died with signal")
FATAL_SIGNAL = re.compile("|".join(rf"\b{w}\b" if w.startswith("SIG") else re.escape(w) for w in _FATAL_WORDS))
# Every needle with its signature's position: one pass of `in` over these picks the candidates,
# which is what keeps a 20 MB log at seconds.
_NEEDLES: tuple[tuple[str, int], ...] = tuple((n, i) for i, sig in enumerate(SIGNATURES) for n in sig.needles)

# Words that show the engine or the server stopping (vLLM 0.x-0.34, the launchers around it): with an
# error before the server was ready, they make the start FATAL; an error without them, UNDECIDED.
STOP_WORDS = ("EngineCore failed to start", "Engine core initialization failed", "EngineDeadError",
              "Got fatal signal", "WorkerProc was terminated", "WorkerProc failed to start",
              "died unexpectedly", "Startup failed", "START FAILED", "Failed core proc")
# vLLM's handlers that log a process's exception (logger.exception, at ERROR) just before that process
# ends: EngineCore's run_engine_core (v1/engine/core.py; V0's engine/multiprocessing too) and the
# workers' worker_main (v1/executor/multiproc_executor.py). A traceback they log is a process stopping.
EXIT_HANDLERS = ("core.py:", "multiproc_executor.py:")
# The phases a start passes before it is ready: a log that ends in one, with no error, is undecided.
START_PHASES = ("load", "profile", "kv-cache", "graph-capture", "warmup")

# Start-up phases, from vLLM 0.21's and 0.34's progress messages (later matches win).
PHASE_MARKERS: tuple[tuple[str, str], ...] = (
    ("Starting to load model", "load"),
    ("Loading model from scratch", "load"),                 # 0.34
    ("Loading safetensors checkpoint shards", "load"),
    ("Model loading took", "profile"),
    ("Available KV cache memory", "kv-cache"),
    ("Capturing CUDA graphs", "graph-capture"),
    ("Graph capturing finished", "warmup"),
    ("init engine (profile, create kv cache, warmup model) took", "serving"),
    ("Application startup complete", "serving"),
)
# Every word whose presence makes `feed` do more than count a line (the shape fast path of
# _read_block rests on this list: a word `feed` reacts to and missing here would go unseen).
_TRIGGERS: tuple[str, ...] = tuple(dict.fromkeys((
    *(n for n, _ in _NEEDLES), *(m for m, _ in PHASE_MARKERS), "Caovan", "version", "Traceback",
    "rror", "ailed", "FAILED", *_FATAL_WORDS, "HTTP/", *SHUTDOWN_MARKERS, "Application startup complete",
    "init engine (profile, create kv cache, warmup model) took", *STOP_WORDS, *(
        # Short words many of the above hold: each block's new lines are searched once for each word
        # that holds no other (shapes.Shapes.find), so these stand in for the needles that hold them.
        # Speed only: a line holding one is read in full, which changes nothing `feed` does.
        "sampling", "capability", "nccl", "WorkerProc", "is larger than the", "support", "quantization",
        "nvcc", "SIG", "signal", "died ", "Loading "))))
# The levels that make `feed` do more than count a line holding none of _TRIGGERS: a CRITICAL line
# is an alarm, an ERROR line the evidence of an error (the start rule). A WARNING line matters only
# through its words (an error-context needle).
_LOUD_LEVELS = ("CRITICAL", "ERROR")

# Traceback frames that pin the phase of a failure more exactly than the last progress message.
PHASE_FRAMES: dict[str, str] = {
    "load_model": "load", "load_weights": "load",
    "profile_run": "profile", "determine_available_memory": "profile", "_dummy_sampler_run": "profile",
    "check_enough_kv_cache_memory": "kv-cache", "get_kv_cache_configs": "kv-cache",
    "capture_model": "graph-capture",
}
PHASE_WORDS: dict[str, str] = {
    "load": "while loading the weights", "profile": "during the memory-profile run",
    "kv-cache": "while sizing the KV cache", "graph-capture": "during CUDA-graph capture",
    "warmup": "during start-up warm-up", "serving": "while serving",
}
# What our banner's values mean, for the summary (docs/design.md's status lines).
STATUS_MEANINGS: dict[tuple[str, str], str] = {
    ("runtime", "PASS"): "our runtime checks passed",
    ("runtime", "WARN"): "a runtime check warned (caovan-sm75-doctor says which)",
    ("runtime", "FAIL"): ("a check of our plugin failed (caovan-sm75-doctor says which): caovan-vllm-serve stops "
                          "where an SM75 GPU is visible; elsewhere nothing of ours applies"),
    ("flashinfer_sampler", "disabled-sm75-guard"): "FlashInfer sampler off by the SM75 guard (PyTorch sampler)",
    ("post_start_warmup", "disabled-default"): "no automatic warmup: run caovan-sm75-warmup after start",
    ("gdn_legacy", "disabled-by-user"): "vLLM's own GDN prefill kept (CAOVAN_GDN_LEGACY_DISABLE=1)",
    ("gdn_legacy", "upstream"): "vLLM's own GDN prefill (ours is not active)",
    ("turbo3", "active"): "our accelerated SM75 path is active",
    ("turbo3", "inactive"): "our accelerated SM75 path is not active (guards only)",
}


def goes_on_traceback(text: str) -> tuple[bool, str | None]:
    """Whether a line goes on with an open traceback of its process (indented, a frame, a caret
    line), and the phase its frame pins (PHASE_FRAMES), if any."""
    if text[:1].isspace() or text.lstrip().startswith(("File ", "^", "~")):
        m = FRAME.search(text)
        return True, PHASE_FRAMES.get(m.group("func")) if m else None
    return False, None


@dataclass
class Finding:
    """Every line of one known message, judged."""

    id: str
    title: str
    status: str                 # fatal | warning | harmless
    role: str
    first_line: int
    last_line: int
    count: int
    text: str                   # the first matching line, cleaned
    process: str | None
    cause: str
    fix: str
    details: dict[str, str] = field(default_factory=dict)
    phase: str | None = None
    note: str = ""              # why this status (for messages judged by what follows them)

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "title": self.title, "status": self.status, "role": self.role,
                "first_line": self.first_line, "last_line": self.last_line, "count": self.count,
                "text": self.text, "process": self.process, "phase": self.phase, "details": self.details,
                "note": self.note, "cause": self.cause, "fix": self.fix}


@dataclass
class CaovanSummary:
    """Our own status lines, as found in the log."""

    version: str | None = None
    line: int | None = None
    banners: int = 0
    status: dict[str, str] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)      # the banner's non-PASS `check ...` lines
    warmup: str | None = None
    warmup_line: int | None = None
    processes: int = 0                                   # worker lines: guards applied in a process
    inactive_processes: int = 0                          # worker lines: nothing of ours applies there
    states: dict[str, int] = field(default_factory=dict)  # GDN prefill / turbo state line -> count

    def meanings(self) -> dict[str, str]:
        """A plain-words reading of each status value we know."""
        out = {k: STATUS_MEANINGS[(k, v)] for k, v in self.status.items() if (k, v) in STATUS_MEANINGS}
        if m := re.fullmatch(r"(\d+)/(\d+)", self.status.get("sm75", "")):
            n, total = int(m.group(1)), int(m.group(2))
            out["sm75"] = (f"{n} of {total} visible GPUs are Turing (SM75)" if n else
                           "no Turing GPU visible: the plugin stays inactive")
        if "gdn_legacy" in self.status and "gdn_legacy" not in out:
            out["gdn_legacy"] = f"GDN prefill path: {self.status['gdn_legacy']}"
        return out

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "line": self.line, "banners": self.banners, "status": self.status,
                "meanings": self.meanings(), "checks": self.checks, "warmup": self.warmup,
                "warmup_line": self.warmup_line, "processes": self.processes,
                "inactive_processes": self.inactive_processes, "states": self.states}


@dataclass
class Failure:
    """The first real failure: a known cause, or the first unknown exception when the engine died."""

    line: int
    text: str
    id: str
    cause: str
    fix: str

    def to_dict(self) -> dict[str, object]:
        return {"line": self.line, "text": self.text, "id": self.id, "cause": self.cause, "fix": self.fix}


@dataclass
class Triage:
    """The result: what the log shows, ordered by importance."""

    source: str
    lines: int
    vllm_version: str | None
    ready_line: int | None
    http_ok: int
    http_error: int
    caovan: CaovanSummary
    first_failure: Failure | None
    findings: list[Finding]

    @property
    def verdict(self) -> str:
        """fatal | undecided (a start the log does not finish) | warning | harmless-only | clean."""
        statuses = {f.status for f in self.findings}
        if "fatal" in statuses:
            return "fatal"
        if any(f.id == "start-undecided" for f in self.findings):
            return "undecided"
        if "warning" in statuses:
            return "warning"
        return "harmless-only" if statuses else "clean"

    @property
    def exit_code(self) -> int:
        """2 fatal, 1 undecided or warning (degraded, or not decided by the end of the log), 0 otherwise."""
        return {"fatal": 2, "undecided": 1, "warning": 1}.get(self.verdict, 0)

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "lines": self.lines, "verdict": self.verdict,
                "exit_code": self.exit_code, "vllm_version": self.vllm_version,
                "ready_line": self.ready_line, "http_ok": self.http_ok, "http_error": self.http_error,
                "caovan": self.caovan.to_dict(),
                "first_failure": self.first_failure.to_dict() if self.first_failure else None,
                "findings": [f.to_dict() for f in self.findings]}


@dataclass
class _Hit:
    sig: Signature
    line: LogLine
    details: dict[str, str]
    phase: str | None
    until: int = 0
    count: int = 1


class _Reader:
    """The state of one pass over a log; everything it keeps is bounded."""

    def __init__(self) -> None:
        self.lines = 0
        self.phase: str | None = None
        self.vllm_version: str | None = None
        self.ready_line: int | None = None
        self.http_ok = 0
        self.http_error = 0
        self.caovan = CaovanSummary()
        self.in_banner = False
        # Open tracebacks by process: lines of other processes may come between a traceback's lines.
        self.tracebacks: dict[str | None, str | None] = {}   # process -> phase pinned by its frames
        self.recent: deque[str | bytes] = deque(maxlen=CONTEXT_LINES)   # bytes: not cleaned yet
        self.shapes = Shapes(_TRIGGERS, _NEEDLES, ACCESS, "HTTP/", _LOUD_LEVELS, goes_on_traceback, SHUTDOWN_MARKERS,
                             b'File "')
        self.findings: dict[str, Finding] = {}
        self.pending: list[_Hit] = []
        self.frame_hits: dict[str | None, _Hit] = {}   # process -> a match in its open traceback's frames
        self.first_unknown: tuple[LogLine, str] | None = None
        self.shutdown_line: int | None = None   # where a requested shutdown of a server that was ready began
        self.needles: tuple[tuple[str, int], ...] = _NEEDLES   # those that may be in the current line
        self.prefix: re.Pattern[str] | None = None   # a prefix of no known form the log's head taught
        # The first alarm of any kind not explained by a signature: an unknown exception, an
        # AssertionError, a CRITICAL line, a fatal signal (with its phase), for a start that never got ready.
        self.first_alarm: tuple[LogLine, str] | None = None
        # The start rule (finish): the first evidence of an error (an ERROR/CRITICAL line, a traceback
        # or a frame), and the first of the engine or server stopping (STOP_WORDS, a shutdown, a
        # traceback logged by a process's exit handler), both before the server was ready.
        self.first_error: LogLine | None = None
        self.stop: tuple[int, str] | None = None
        # Once the server was ready: the first sign of a crash (STOP_WORDS, a fatal signal) before any
        # shutdown mark; a shutdown after it is the crash's, not one someone asked for.
        self.crash: int | None = None
        self._opened = 0   # the line that opened the latest traceback
        # Shared-memory waits are judged per episode: from the first wait to what ends it.
        self.wait_open = False
        self.wait_outcome: dict[str, str] = {}   # "harmless"/"fatal" -> the deciding line, first seen

    # -- one line -------------------------------------------------------------------------------
    def read(self, lines: Iterable[tuple[int, bytes]]) -> None:
        """Read raw lines (see reader.numbered_lines) in order, BLOCK_LINES at a time, with the
        prefix the first LEARN_LINES teach (reader.learn_prefix, as reader.read_lines does)."""
        it = iter(lines)
        head = list(itertools.islice(it, LEARN_LINES))
        self.prefix = learn_prefix([raw for _, raw in head])
        self.shapes.prefix_ends += prefix_end(self.prefix)
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
                    or (shape.raw_words and any(map(raw.__contains__, shape.raw_words))))
            if not full and shape.frame and not self.tracebacks:   # a frame opens a traceback
                full = True
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
            self.lines = number
            if shape.marks:   # as `feed` notes them
                self._note_marks(number)
            if shape.status is not None:
                self._count_status(int(raw[shape.status]), number, raw)
            self.recent.append(raw)   # cleaned only if something reads it (_recent)

    def feed(self, ln: LogLine) -> None:
        self.lines = ln.number
        text = ln.text
        self._resolve_pending(ln)
        self._track_phase(text)
        own_state = self._track_caovan(ln)
        if self.vllm_version is None and ("version" in text) and (m := VLLM_VERSION.search(text)):
            if "vLLM" in text or "\u2588" in text:   # the plain line or vLLM's logo
                self.vllm_version = m.group("version")
        kind, tb_phase = self._track_traceback(ln)
        if self.ready_line is None and (self.first_error is None or self.stop is None):
            self._note_start_evidence(ln, kind)
        elif self.ready_line is not None and self.crash is None and self.shutdown_line is None and (
                any(w in text for w in STOP_WORDS)
                or (any(w in text for w in _FATAL_WORDS) and FATAL_SIGNAL.search(text))):
            self.crash = ln.number
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
        elif not matched and self.first_alarm is None and not own_state and (
                ln.level == "CRITICAL" or text.startswith("AssertionError")
                or (any(w in text for w in _FATAL_WORDS) and FATAL_SIGNAL.search(text))):
            self.first_alarm = (ln, tb_phase or self.phase or "")
        self._track_http(ln)
        if (self.shutdown_line is None and self.crash is None if self.ready_line is not None else self.stop is None) and any(
                m in text for m in SHUTDOWN_MARKERS):
            self._note_marks(ln.number)
        if "Application startup complete" in text:
            self.ready_line = self.ready_line or ln.number
            self._close_wait("harmless", ln)
        elif "init engine (profile, create kv cache, warmup model) took" in text:
            self._close_wait("harmless", ln)
        self.recent.append(text)

    def _note_marks(self, number: int) -> None:
        """A shutdown's mark: asked for once the server was ready, the server stopping before."""
        if self.ready_line is not None:
            if self.crash is None:   # after a crash, the shutdown is the crash's
                self.shutdown_line = self.shutdown_line or number
        elif self.stop is None:
            self.stop = (number, "a shutdown")

    def _note_start_evidence(self, ln: LogLine, kind: str) -> None:
        """Evidence for the start rule (see finish): an error, and the engine or server stopping."""
        text = ln.text
        if self.first_error is None and (ln.level in _LOUD_LEVELS or kind in ("traceback", "exception")) and (
                text.strip(" ^~")):   # a caret line under a frame says nothing by itself
            self.first_error = ln
        if self.stop is None:
            word = next((w for w in STOP_WORDS if w in text), None)
            if word is None and kind == "traceback" and self._opened == ln.number and ln.level == "ERROR" and (
                    ln.source or "").startswith(EXIT_HANDLERS):
                word = f"a traceback logged by {ln.source.split(':')[0]}, whose process then ends"
            elif word is None and kind == "traceback" and self._opened == ln.number and ln.level is None:
                word = "a traceback Python printed for an uncaught exception, whose process then ends"
            if word is None and any(w in text for w in _FATAL_WORDS) and FATAL_SIGNAL.search(text):
                word = "a fatal signal"
            if word is not None:
                self.stop = (ln.number, word)

    def _track_phase(self, text: str) -> None:
        for marker, phase in PHASE_MARKERS:
            if marker in text:
                self.phase = phase

    def _track_caovan(self, ln: LogLine) -> bool:
        """Summarise our own status lines; True for a per-process state line (not to be judged)."""
        text = ln.text
        c = self.caovan
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
        elif m := (GDN_STATE.match(text) or TURBO_LINE.match(text)):
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
                self._opened = ln.number
            return "traceback", None
        if 'File "' in text and ln.process not in self.tracebacks and (m := FRAME.search(text)) is not None and (
                len(self.tracebacks) < MAX_PROCESSES):   # frames without their header: an excerpt cut above it
            self.tracebacks[ln.process] = PHASE_FRAMES.get(m.group("func"))
            self._opened = ln.number
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
        if 200 <= status < 300:
            self.http_ok += 1
            if self.wait_open:
                self._close_wait("harmless", line if isinstance(line, LogLine) else self.clean(line, number))
        elif status >= 500:
            self.http_error += 1

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
            phase = (tb_phase or self.phase) if sig.fixes_by_phase or sig.id == "host-oom-kill" else None
            hit = _Hit(sig, ln, details, phase)
            if sig.id == "triton-shared-memory":
                hit.details.update(self._kernel_name())
            if sig.rule is Rule.UNTIL_READY:
                self.wait_open = True
            elif sig.rule is Rule.FATAL:
                self._close_wait("fatal", ln)
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
        if f is None and self.shutdown_line is not None and sig.role is Role.CONSEQUENCE:
            # the engine "died" because it was stopped: harmless, and said so
            sig_status, note = "harmless", f"after the shutdown that began at line {self.shutdown_line}"
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

    def _close_wait(self, outcome: str, ln: LogLine) -> None:
        if self.wait_open:
            self.wait_open = False
            self.wait_outcome.setdefault(outcome, f"line {ln.number}: {ln.text[:120]}")

    def _note_unknown_exception(self, ln: LogLine, tb_phase: str | None) -> None:
        if self.shutdown_line is not None:   # what a requested shutdown breaks is no failure
            return
        if self.first_unknown is None and not any(n in ln.text for n in NOT_FAILURES):
            self.first_unknown = (ln, tb_phase or self.phase or "")
            self.first_alarm = self.first_alarm or self.first_unknown

    # -- the end --------------------------------------------------------------------------------
    def finish(self, source: str) -> Triage:
        for hit in self.frame_hits.values():   # tracebacks the log cut off before their exception line
            self._record(hit.sig, hit)
        for p in list(self.pending):
            self.pending.remove(p)
            self._record(BY_ID[p.sig.otherwise or p.sig.id], p)
        wait = self.findings.get("shm-broadcast-wait")
        if wait is not None:
            if "fatal" in self.wait_outcome:
                wait.status, wait.note = "fatal", f"followed by a failure ({self.wait_outcome['fatal']})"
            elif self.wait_open:
                wait.status = "warning"
                wait.note = ("not decided: the log ends while a process was still waiting; "
                             "if the server answers /health with 200 later, it was harmless")
            else:
                wait.status = "harmless"
                wait.note = f"the server answered afterwards ({self.wait_outcome.get('harmless', '')})"
        self._judge_own_banner()
        self._start_rule()
        self._explain_details()
        roles = [r.value for r in Role]
        findings = sorted(self.findings.values(), key=lambda f: (
            ("fatal", "warning", "harmless").index(f.status), roles.index(f.role), f.first_line))
        return Triage(source, self.lines, self.vllm_version, self.ready_line, self.http_ok, self.http_error,
                      self.caovan, self._first_failure(findings), findings)

    def _judge_own_banner(self) -> None:
        """runtime=FAIL is about our plugin, not the engine: harmless where no SM75 GPU was visible
        (nothing of ours applies), a warning otherwise; a stopped launch has its own line."""
        f = self.findings.get("caovan-runtime-fail")
        if f is not None and self.caovan.status.get("sm75", "").startswith("0/"):
            f.status = "harmless"
            f.note = "no SM75 GPU was visible to the plugin: nothing of ours applied, vLLM ran untouched"

    def _start_rule(self) -> None:
        """One rule before every signature: a log that never shows the server ready is never OK.
        With an error (first_error, first_alarm) nothing known explains, it is FATAL where it shows
        the engine or server stopping (or a fatal consequence), else UNDECIDED; without an error it
        is UNDECIDED where it ends in a start-up phase."""
        if self.ready_line is not None or self.http_ok:
            return
        fatal = [f for f in self.findings.values() if f.status == "fatal"]
        if any(f.role == Role.CAUSE.value for f in fatal):
            return
        alarm = self.first_alarm or ((self.first_error, self.phase or "") if self.first_error else None)
        if alarm is None:
            if self.phase in START_PHASES and not fatal:
                self._undecided(self.lines, "", f"the log ends {PHASE_WORDS[self.phase]}, before the server was "
                                "ready: the start may still be going on")
            return
        ln, phase = alarm
        if self.first_alarm is None and fatal:
            return   # the errors are a known consequence's own (EngineDeadError): the cause is not in the log
        stopped = self.stop or (fatal and (fatal[0].first_line, fatal[0].title))
        if not stopped:
            self._undecided(ln.number, ln.text, f"the log shows an error at line {ln.number} but ends before it "
                            "shows whether the engine stopped or the server became ready")
            return
        sig = BY_ID["unexplained-failure"]
        where = f" It happened {PHASE_WORDS[phase]}." if phase in PHASE_WORDS else ""
        cut = (" The exception itself (the traceback's last line) is not in the log: the excerpt ends inside it."
               if self.first_unknown is None and self.tracebacks else "")
        self.findings[sig.id] = Finding(
            sig.id, sig.title, "fatal", sig.role.value, ln.number, ln.number, 1, ln.text[:MAX_TEXT], ln.process,
            sig.cause + where + cut, sig.fix.replace("the lines around it", f"the lines around line {ln.number}"),
            note=f"the log never shows the server ready, and shows it stopping (line {stopped[0]}: {stopped[1]})")

    def _undecided(self, number: int, text: str, why: str) -> None:
        sig = BY_ID["start-undecided"]
        self.findings[sig.id] = Finding(sig.id, sig.title, "warning", sig.role.value, number, number, 1,
                                        text[:MAX_TEXT], None, f"{why[0].upper()}{why[1:]}. {sig.cause}", sig.fix,
                                        note="the log never shows the server ready")

    def _explain_details(self) -> None:
        """Put what the log itself says (numbers, names, the vLLM release) into the advice."""
        f = self.findings.get("triton-shared-memory")
        if f and "required" in f.details:
            kernel = f.details.get("kernel", "a Triton kernel")
            f.cause = (f"{kernel} asks for {int(f.details['required']):,} bytes of shared memory per block; "
                       f"this GPU allows {int(f.details.get('limit', 0)):,}. " + f.cause)
        f = self.findings.get("fp8-kv-unsupported")
        if f and self.vllm_version and vv.has("triton-attn-fp8-kv-on-sm75", self.vllm_version) is False:
            f.cause = (f"This log is from vLLM {self.vllm_version}, which has no attention backend for fp8 KV "
                       "below SM89. " + f.cause)
        f = self.findings.get("cuda-oom")
        if f and f.phase in PHASE_WORDS:
            f.cause = f"{f.cause} It happened {PHASE_WORDS[f.phase]}."
            if "estimated_max_len" in f.details:
                f.fix += f" vLLM estimates that --max-model-len {f.details['estimated_max_len']} would fit."
        if f and f.phase == "load" and "total" in f.details and "allocated" in f.details:
            f.cause += (f" {f.details['allocated']} of the GPU's {f.details['total']} held the weights loaded so "
                        "far: the weights alone are larger than this GPU's share.")
        f = self.findings.get("kv-cache-too-small")
        if f and "v0_max_model_len" in f.details:   # V0's wording: the length and what fits, no GiB
            f.details["max_model_len"] = f.details.pop("v0_max_model_len")
            f.details["estimated_max_len"] = f.details.pop("v0_estimated_max_len")
            f.cause = (f"--max-model-len {f.details['max_model_len']} is more than the "
                       f"{f.details['estimated_max_len']} tokens the KV cache holds. " + f.cause)
        if f and "needed" in f.details:
            f.cause = (f"One request of --max-model-len {f.details['max_model_len']} tokens needs "
                       f"{f.details['needed']} GiB of KV cache; {f.details['available']} GiB is left for it. "
                       + f.cause)
        if f and "estimated_max_len" in f.details:
            f.fix = f.fix.replace("Lower --max-model-len,", f"Lower --max-model-len to at most "
                                  f"{f.details['estimated_max_len']} (vLLM's estimate for this memory),", 1)
        f = self.findings.get("gpu-memory-busy")
        if f and "free" in f.details:
            share = float(f.details["free"]) / max(float(f.details["total"]), 1e-9)
            f.cause = (f"{f.details['free']} of {f.details['total']} GiB was free at start, and "
                       f"--gpu-memory-utilization {f.details['utilization']} asks for more. " + f.cause)
            f.fix = f.fix.replace("below the free share", f"below {share:.2f} (the free share)")
        f = self.findings.get("host-oom-kill")
        if f and f.phase in PHASE_WORDS:
            f.cause = f"{f.cause} It happened {PHASE_WORDS[f.phase]}."
        f = self.findings.get("bf16-unsupported")
        if f and "gpu" in f.details:
            f.cause = (f"{f.details['gpu']} has compute capability {f.details.get('capability', '?')}. "
                       + f.cause)

    def _first_failure(self, findings: list[Finding]) -> Failure | None:
        fatal = [f for f in findings if f.status == "fatal"]
        if not fatal:
            return None
        causes = [f for f in fatal if f.role == Role.CAUSE.value]
        if causes:
            f = min(causes, key=lambda x: x.first_line)
            return Failure(f.first_line, f.text, f.id, f.cause, f.fix)
        if self.first_unknown is not None:
            ln, phase = self.first_unknown
            sig = BY_ID["unexplained-failure"]
            where = f" It happened {PHASE_WORDS[phase]}." if phase in PHASE_WORDS else ""
            return Failure(ln.number, ln.text[:MAX_TEXT], sig.id,
                           "No known cause: this is the first exception in the log, which is usually the root "
                           "cause." + where,
                           f"Read the traceback that ends at line {ln.number}; search the vLLM issues for "
                           "its last line, and report it to us with the log if it is about SM75.")
        f = min(fatal, key=lambda x: (x.role != Role.SYMPTOM.value, x.first_line))
        if f.role == Role.CONSEQUENCE.value:   # never named as the cause: the cause is not in this log
            sig = BY_ID["cause-not-in-log"]
            return Failure(f.first_line, f.text, sig.id, f"Line {f.first_line} ({f.title}) is a consequence of a "
                           f"failure elsewhere, not its cause. {sig.cause}",
                           sig.fix.replace("this line", f"line {f.first_line}"))
        return Failure(f.first_line, f.text, f.id, f.cause, f.fix)


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
