"""What the log reader looks for in a line: the shapes of our own status lines, the words that make
it read a line in full, start-up phases, the words of a process stopping, and what a traceback is.
Kept apart from the reading (triage.py) and the judging (judge.py), which both use them."""

from __future__ import annotations

import re

from .signatures import SIGNATURES

MAX_TEXT = 300            # characters of a matched line kept as its excerpt
MAX_STATUS_KEYS = 64      # key=value lines kept from one banner
MAX_PROCESSES = 256       # processes whose open traceback is tracked
BLOCK_LINES = 128         # raw lines whose words are looked for at once (for new shapes only)

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
# "Error executing method": vLLM's worker_base.py logs it, then raises, so the call (and a start
# waiting on it) fails; a Ray worker's excerpt often ends right there.
STOP_WORDS = ("EngineCore failed to start", "Engine core initialization failed", "EngineDeadError",
              "Got fatal signal", "WorkerProc was terminated", "WorkerProc failed to start",
              "died unexpectedly", "Startup failed", "START FAILED", "Failed core proc", "Error executing method")
# vLLM's handlers that log a process's exception (logger.exception, at ERROR) just before that process
# ends: EngineCore's run_engine_core (v1/engine/core.py; V0's engine/multiprocessing too) and the
# workers' worker_main (v1/executor/multiproc_executor.py). A traceback they log is a process stopping.
EXIT_HANDLERS = ("core.py:", "multiproc_executor.py:")
# vLLM's code that logs an ERROR and then raises, so what waits on it fails: worker_base.py's
# execute_method ("Error executing method ... This might cause deadlock in distributed execution").
RAISING_LOGGERS = ("worker_base.py:",)
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
        "nvcc", "SIG", "signal", "died ", "Loading ",
        # the judge's evidence (evidence.py): crash signs after serving, JIT builds
        "illegal memory access", "device-side assert", "unspecified launch failure", "ProcessGroupNCCL",
        "atchdog", "ninja", "CUDA_HOME", "rror building",
        "disable_custom_all_reduce", "disable-custom-all-reduce"))))
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

def goes_on_traceback(text: str) -> tuple[bool, str | None]:
    """Whether a line goes on with an open traceback of its process (indented, a frame, a caret
    line), and the phase its frame pins (PHASE_FRAMES), if any."""
    if text[:1].isspace() or text.lstrip().startswith(("File ", "^", "~")):
        m = FRAME.search(text)
        return True, PHASE_FRAMES.get(m.group("func")) if m else None
    return False, None


def fatal_signal(text: str) -> bool:
    """Whether a line says a process ended by a signal (the regex runs only where a word of it is)."""
    return any(w in text for w in _FATAL_WORDS) and FATAL_SIGNAL.search(text) is not None


def stop_word(text: str) -> str | None:
    """What in a line shows the engine or server stopping: one of STOP_WORDS, or a fatal signal."""
    return next((w for w in STOP_WORDS if w in text), None) or ("a fatal signal" if fatal_signal(text) else None)
