"""What a log shows, gathered line by line in small trackers that judge nothing (judge.py does).

Each tracker keeps a bounded amount of state and is fed by the reader (triage.py) with lines it
reads in full: whether and since when the server served (a ready line, 2xx answers), how far a
start got and whether it shows an error or the engine stopping, the crash signs after serving, a
JIT build that failed, and shared-memory waits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .reader import LogLine
from .results import CaovanSummary
from .words import EXIT_HANDLERS, MAX_TEXT, RAISING_LOGGERS, stop_word

MAX_SIGNS = 8   # crash signs kept after serving: the first is the cause, the rest its consequences

# CUDA's words for a kernel that broke the context (torch raises them as `CUDA error: ...`).
CUDA_ERRORS = re.compile(r"illegal memory access|device-side assert|unspecified launch failure|"
                         r"misaligned address|illegal instruction")
# torch's NCCL watchdog (ProcessGroupNCCL.cpp): an [E...] header, a watchdog or a collective timeout.
NCCL_WATCHDOG = re.compile(r"ProcessGroupNCCL\.cpp:\d+\].*(?:Watchdog|CUDA error|timeout|Timeout)|"
                           r"\[E\d{3,4} [^\]]*ProcessGroupNCCL|Process group watchdog thread terminated|"
                           r"Watchdog caught collective operation timeout")
# vLLM's words for an engine process that ended: the monitor's, the front end's.
PROCESS_DIED = re.compile(r"died unexpectedly|Engine process \(pid \d+\) died|Failed core proc|"
                          r"WorkerProc was terminated|EngineCore encountered a fatal error")
# A compiler or build tool's command line inside an ERROR line (FlashInfer's and torch's JIT print them).
BUILD_COMMAND = re.compile(r"(?P<path>(?:^|(?<=[\s'\"\[(]))\S*?(?:nvcc|ninja)(?:\.exe)?)(?=\s+-)")
BUILD_STOPPED = ("ninja: build stopped", "Error building extension", "Ninja build failed",
                 "CalledProcessError: Command '['ninja'")
NO_CUDA_HOME = re.compile(r"CUDA_HOME environment variable is not set|Could not find nvcc|nvcc: not found|"
                          r"nvcc not found|nvcc: command not found|No such file or directory: '[^']*nvcc'")
OLD_NVCC = re.compile(r"Unsupported gpu architecture(?: '(?P<arch>[^']+)')?")


@dataclass
class Serving:
    """Evidence of a server serving: vLLM's ready line, and 2xx answers in its access log."""
    ready_line: int | None = None
    first_ok_line: int | None = None
    http_ok: int = 0
    http_error: int = 0

    @property
    def since(self) -> int | None:
        """The first line that shows the server serving (None: the log never shows it)."""
        lines = [n for n in (self.ready_line, self.first_ok_line) if n is not None]
        return min(lines) if lines else None

    def status(self, code: int, number: int) -> None:
        """Count one access line's status."""
        if 200 <= code < 300:
            self.http_ok += 1
            self.first_ok_line = self.first_ok_line or number
        elif code >= 500:
            self.http_error += 1


@dataclass
class StartEvidence:
    """Before serving: the first error, and the first sign of stopping."""
    first_error: LogLine | None = None
    stop: tuple[int, str] | None = None
    opened: int = 0   # the line that opened the latest traceback

    @property
    def done(self) -> bool:
        return self.first_error is not None and self.stop is not None

    def feed(self, ln: LogLine, kind: str, loud: bool) -> None:
        """An error: a loud line or a traceback's line; stopping: STOP_WORDS, or a traceback whose first
        line an exit handler logged (or Python printed: an uncaught exception ends its process)."""
        text = ln.text
        if self.first_error is None and (loud or kind in ("traceback", "exception")) and text.strip(" ^~"):
            self.first_error = ln   # a caret line under a frame says nothing by itself
        if self.stop is None:
            word = stop_word(text)
            if word is None and ln.level == "ERROR" and (ln.source or "").startswith(RAISING_LOGGERS):
                word = f"an error {ln.source.split(':')[0]} logs before it raises"
            if word is None and kind == "traceback" and self.opened == ln.number:
                if ln.level == "ERROR" and (ln.source or "").startswith(EXIT_HANDLERS):
                    word = f"a traceback logged by {ln.source.split(':')[0]}, whose process then ends"
                elif ln.level is None:
                    word = "a traceback Python printed for an uncaught exception, whose process then ends"
            if word is not None:
                self.stop = (ln.number, word)

    def shutdown(self, number: int) -> None:
        self.stop = self.stop or (number, "a shutdown")


@dataclass(frozen=True)
class Sign:
    """One sign of a crash after the server served."""
    line: int
    kind: str     # error-traceback | cuda-error | nccl-watchdog | process-died | engine-dead | stopped
    text: str
    process: str | None


KIND_WORDS = {"error-traceback": "an engine or worker error traceback", "cuda-error": "a CUDA error",
              "nccl-watchdog": "an NCCL watchdog failure", "process-died": "an engine process that died",
              "engine-dead": "EngineDeadError", "stopped": "the engine stopping"}


@dataclass
class AfterServing:
    """After the server served: a requested shutdown, and the signs of a crash before it."""
    shutdown_line: int | None = None
    signs: list[Sign] = field(default_factory=list)

    def shutdown(self, number: int) -> None:
        """A shutdown mark: asked for, unless a crash came first (then it is the crash's)."""
        if not self.signs and self.shutdown_line is None:
            self.shutdown_line = number

    def feed(self, ln: LogLine, kind: str, opened: int) -> None:
        """Note a crash sign in a line read in full (nothing after a requested shutdown counts)."""
        if self.shutdown_line is not None or len(self.signs) >= MAX_SIGNS:
            return
        text = ln.text
        what = None
        if "EngineDeadError" in text:
            what = "engine-dead"
        elif PROCESS_DIED.search(text):
            what = "process-died"
        elif "ProcessGroupNCCL" in text or "atchdog" in text:
            what = "nccl-watchdog" if NCCL_WATCHDOG.search(text) else None
        elif (cuda := "CUDA error" in text or CUDA_ERRORS.search(text) is not None) or "cudaError" in text:
            what = "cuda-error" if cuda else None
        elif kind == "traceback" and opened == ln.number and _engine_side(ln):
            what = "error-traceback"
        elif stop_word(text):
            what = "stopped"
        if what is not None and not any(s.kind == what and s.process == ln.process for s in self.signs):
            self.signs.append(Sign(ln.number, what, text[:MAX_TEXT], ln.process))


def _engine_side(ln: LogLine) -> bool:
    """A traceback (or its frames) of the engine core or a worker, or one that ends its process: not
    a request's error, which the API server logs and survives."""
    process = ln.process or ""
    if process.startswith(("EngineCore", "Worker", "RayWorker", "VllmWorker", "rank")):
        return True
    if (ln.source or "").startswith(EXIT_HANDLERS):
        return True
    return not process and ln.level is None and ln.text.startswith("Traceback")   # Python's own: uncaught


@dataclass
class JitBuild:
    """A JIT build that failed: the first build-tool command line or stop line, and what it shows."""
    line: LogLine | None = None
    command: str | None = None
    no_cuda_home: str | None = None
    old_nvcc: str | None = None

    def feed(self, ln: LogLine, loud: bool) -> None:
        text = ln.text
        if self.command is None and loud and ("nvcc" in text or "ninja" in text) and (m := BUILD_COMMAND.search(text)):
            self.command = m.group("path")
            self.line = self.line or ln
        if any(w in text for w in BUILD_STOPPED):
            self.line = self.line or ln
        if self.no_cuda_home is None and ("nvcc" in text or "CUDA_HOME" in text):
            if (m := NO_CUDA_HOME.search(text)) is not None:
                self.no_cuda_home = m.group(0)
                self.line = self.line or ln
        if self.old_nvcc is None and "Unsupported gpu architecture" in text and (m := OLD_NVCC.search(text)):
            self.old_nvcc = m.group("arch") or "an architecture of the list"
            self.line = self.line or ln

    @property
    def failed(self) -> bool:
        return self.line is not None

    def diagnosis(self) -> tuple[str, str]:
        """(cause, fix) from what the build's lines show."""
        if self.command and self.command.startswith(":"):
            path = self.command.lstrip(":")
            return (f"The build ran the compiler as `{self.command}`: a path with a stray ':' in front, which "
                    "comes from an empty entry in CUDA_HOME or PATH (a leading, trailing or doubled ':'), so "
                    "no compiler of that name exists.",
                    f"Set CUDA_HOME to the toolkit folder alone (e.g. `{path.rsplit('/bin/', 1)[0]}`), remove the "
                    "empty ':' entries from PATH, and start again.")
        if self.no_cuda_home:
            return (f"The build found no CUDA compiler ({self.no_cuda_home}): no CUDA toolkit on PATH and no "
                    "CUDA_HOME, which kernels compiled on first use need.",
                    "Install a CUDA toolkit matching torch's CUDA release and set CUDA_HOME to it (or put its "
                    "bin/ on PATH); `caovan-sm75-doctor` shows what it finds.")
        if self.old_nvcc:
            return (f"nvcc is older than an architecture the build was asked for ({self.old_nvcc}): the arch "
                    "list (TORCH_CUDA_ARCH_LIST, FLASHINFER_CUDA_ARCH_LIST) names a GPU this CUDA does not know.",
                    "Build for your card only: TORCH_CUDA_ARCH_LIST=7.5 (caovan-vllm-serve sets it with "
                    "CAOVAN_ARCH_GUARD=1), or install a newer CUDA toolkit.")
        return ("A kernel compiled on first use could not be built (nvcc or ninja failed).",
                "Run `caovan-sm75-doctor`: its nvcc/ptxas check names the mismatch. Put a CUDA toolkit matching "
                "torch's CUDA on PATH (or set CUDA_HOME), and start through `caovan-vllm-serve` so builds "
                "target sm_75 only.")


@dataclass
class Waits:
    """Shared-memory waits, judged per episode: from the first wait to what ends it."""
    open: bool = False
    outcome: dict[str, str] = field(default_factory=dict)   # "harmless"/"fatal" -> the deciding line

    def close(self, outcome: str, ln: LogLine) -> None:
        if self.open:
            self.open = False
            self.outcome.setdefault(outcome, f"line {ln.number}: {ln.text[:120]}")


# What a log can show already applied, so that no advice asks for it again: key -> (how the log
# shows it, the advice it makes moot, what to say instead).
APPLIED = {
    "custom-all-reduce-off": (re.compile(r"disable_custom_all_reduce'?\s*[:=]\s*True|--disable-custom-all-reduce"),
                              "pass --disable-custom-all-reduce",
                              "Nothing to do: this launch already runs with custom all-reduce off "
                              "(--disable-custom-all-reduce, as its own lines show)."),
}
APPLIED_WORDS = ("disable_custom_all_reduce", "disable-custom-all-reduce")


@dataclass
class Evidence:
    """Everything the judge reads, gathered by one pass of the reader."""
    lines: int = 0
    vllm_version: str | None = None
    phase: str | None = None   # the last progress message's phase (words.PHASE_MARKERS)
    caovan: CaovanSummary = field(default_factory=CaovanSummary)
    serving: Serving = field(default_factory=Serving)
    start: StartEvidence = field(default_factory=StartEvidence)
    after: AfterServing = field(default_factory=AfterServing)
    build: JitBuild = field(default_factory=JitBuild)
    waits: Waits = field(default_factory=Waits)
    # The first exception no signature explains, and the first alarm of any kind (an unknown
    # exception, an AssertionError, a CRITICAL line, a fatal signal), each with its phase.
    first_unknown: tuple[LogLine, str] | None = None
    first_alarm: tuple[LogLine, str] | None = None
    cut_in_traceback: bool = False   # the log ends inside a traceback
    applied: set[str] = field(default_factory=set)   # APPLIED keys the log shows

    def note_applied(self, text: str) -> None:
        """Note what a line shows already applied (APPLIED)."""
        for key, (shows, _, _) in APPLIED.items():
            if key not in self.applied and shows.search(text):
                self.applied.add(key)
