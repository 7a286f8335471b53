"""The log reader's fast path (triage.triage_stream: lines sorted by their shape, most never decoded)
changes no verdict: for every log of tests/data/logs, whole, cut into random mixes and roughened with
the text that makes shapes hard (colours, control characters, `\\r`, digits inside words, invalid
UTF-8, lines that clean to nothing), the triage equals the one that reads every line in full."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from caovan_vllm_sm75_turbo3.logtriage import shapes as shapes_mod
from caovan_vllm_sm75_turbo3.logtriage import triage as triage_mod
from caovan_vllm_sm75_turbo3.logtriage import words
from caovan_vllm_sm75_turbo3.logtriage.reader import clean, read_lines

LOGS = sorted((Path(__file__).parent / "data" / "logs").glob("*.log"))
POOL = [ln for p in LOGS for ln in p.read_bytes().splitlines(keepends=True)]
# What vLLM, uvicorn and log collectors put before a message, and what the shape must not be fooled by.
PREFIXES = [b"", b"(APIServer pid=7) ", b"(EngineCore_DP0 pid=1234) ", b"(Worker_TP1 pid=9, ip=10.0.0.1) ",
            b"INFO 12-05 01:02:03 [api_server.py:1] ", b"WARNING 12-05 01:02:03 [x.py:9] ",
            b"ERROR 12-05 01:02:03 [core.py:13] ", b"CRITICAL 12-05 01:02:03 [core.py:13] ", b"INFO:     ", b"2026-12-05T01:02:03.123Z ",
            b"Dec 05 01:02:03 host vllm[137]: ", b"(APIServer pid=7) INFO 12-05 01:02:03 [a.py:1] ",
            # issue 38: vLLM before 0.7, docker compose, RFC 3339 with a zone name
            b"ERROR 02-11 20:39:41 core.py:208] ", b"vllm-1  | ", b"2025-10-24T17:12:08.363544040 +08:00 CST ",
            b"vllm-12 | 2025-10-24T17:12:08.36Z "]
FRAGMENTS = [b"137", b"-9", b": -9}", b"(exit code: -9)", b"died with exit code -9", b"exited with code 137",
             b"fp8e4nv not supported", b"Failed core proc(s): {'EngineCore_DP0': -9}", b"Kil1led", b"Killed", b"HTTP/", b'"GET /v1/models HTTP/1.1" 200 OK',
             b'"POST /v1/completions HTTP/1.1" 500 Internal Server Error', b'"GET /a\xe3\x80\x80b HTTP/1.1" 200',
             b"Traceback (most recent call last):", b"  File \"x.py\", line 1, in load_model", b"RuntimeError: x",
             b"\x1b[32m", b"\x1b]0;title\x07", b"\r", b"\t", b"\x00", b"\x7f", b"\xff\xfe", b"\xe2\x80\xae",
             b"Application startup complete.", b"Avg prompt throughput: 1.0 tokens/s", b"sampling.cu",
             b"No available shared memory broadcast block found in 60 seconds", b"[Caovan] warmup=READY",
             b" ", b"0", b"5", b"version 0.27.0", b"vLLM", b"WARN", b"signal", b"\xe3\x80\x80", b"[shutdown] x",
             b"Shutting down", b"Segmentation fault", b"default", b"Application startup complete.",
             b"EngineCore failed to start.", b"Got fatal signal from worker processes, shutting down", b"START FAILED",
             b"  File \"/v/vllm/x.py\", line 3, in capture_model", b"Starting to load model", b" | ", b" CST"]


def _shapes() -> shapes_mod.Shapes:
    return shapes_mod.Shapes(triage_mod._TRIGGERS, triage_mod._NEEDLES, triage_mod.ACCESS, "HTTP/",
                             triage_mod._LOUD_LEVELS, triage_mod.goes_on_traceback)


def _both(data: bytes) -> tuple[dict, dict]:
    fast = triage_mod.triage_stream(io.BytesIO(data), "x").to_dict()
    slow = triage_mod.triage_lines(read_lines(io.BytesIO(data)), "x").to_dict()
    return fast, slow


@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_each_real_and_fixture_log_gets_the_same_verdict(log):
    fast, slow = _both(log.read_bytes())
    assert fast == slow


def _mix(rng: random.Random) -> list[bytes]:
    picked = [rng.choice(POOL) for _ in range(rng.randrange(200, 3000))]
    # runs of consecutive lines too, so tracebacks, banners and deferred findings stay whole
    for _ in range(rng.randrange(1, 6)):
        log = rng.choice(LOGS).read_bytes().splitlines(keepends=True)
        at = rng.randrange(len(log))
        picked[rng.randrange(len(picked)):0] = log[at:at + rng.randrange(5, 200)]
    return picked


@pytest.mark.parametrize("seed", range(8))
def test_random_mixes_of_every_logs_lines_get_the_same_verdict(seed):
    fast, slow = _both(b"".join(_mix(random.Random(seed * 7919 + random.randrange(1000)))))
    assert fast == slow


@pytest.mark.parametrize("seed", range(8))
def test_roughened_mixes_get_the_same_verdict(seed):
    """Lines of the logs with prefixes swapped, digits changed and hard fragments put inside."""
    rng = random.Random(seed * 104729 + random.randrange(1000))
    out = []
    for line in _mix(rng):
        body = line.rstrip(b"\n")
        roll = rng.random()
        if roll < 0.3:
            body = rng.choice(PREFIXES) + body
        elif roll < 0.5:
            body = bytes(rng.choice(b"0123456789") if c in b"0123456789" else c for c in body)
        elif roll < 0.7:
            at = rng.randrange(len(body) + 1)
            body = body[:at] + rng.choice(FRAGMENTS) + body[at:]
        elif roll < 0.75:
            body = rng.choice(PREFIXES)   # a line that cleans to nothing
        out.append(body + b"\n")
    fast, slow = _both(b"".join(out))
    assert fast == slow


@given(st.lists(st.tuples(st.sampled_from(PREFIXES), st.lists(st.sampled_from(FRAGMENTS), max_size=4),
                          st.text(max_size=12)), max_size=60))
def test_generated_lines_get_the_same_verdict(lines):
    data = b"".join(p + b"".join(f) + t.encode("utf-8", "surrogatepass") + b"\n" for p, f, t in lines)
    fast, slow = _both(data)
    assert fast == slow


def test_a_full_shape_memory_is_emptied_and_the_verdict_stays(monkeypatch):
    monkeypatch.setattr(shapes_mod, "MAX_SHAPES", 3)
    fast, slow = _both(b"".join(_mix(random.Random(5))))
    assert fast == slow


@pytest.mark.parametrize("line, word", [
    # (fp8e4nv's needle holds "support", a word without digits: its lines are read in full by their shape)
    (b"INFO 12-05 01:02:03 [x.py:1] GDN path legacy-gdn-linear-attn-v020 in use\n", "legacy-gdn-linear-attn-v020"),
    (b'(APIServer pid=7) INFO:     127.0.0.1:1 - "GET /v1/models HTTP/1.1" 503 Service Unavailable\n', "5xx"),
])
def test_words_with_digits_are_looked_for_in_the_raw_line(line, word):
    """The shape turns digits into 0: a word with digits must still send its line the long way."""
    shapes = _shapes()
    ln = clean(line.decode())
    shape = shapes.learn(shapes.key(line.rstrip()), ln, shapes.find([line]))
    assert not shape.full, word                            # the shape alone would only count it
    assert any(w in line for w in shape.raw_words), word   # the raw words catch it
    assert triage_mod.triage_stream(io.BytesIO(line)).to_dict() == triage_mod.triage_lines(
        read_lines(io.BytesIO(line))).to_dict()


def test_an_access_line_inside_a_prefix_is_not_counted():
    """The status is read after what `clean` strips: Ray's `ip=` part may hold anything but `)`."""
    line = b'(Worker pid=1, ip="GET /x HTTP/1.1" 200) INFO 12-05 01:02:03 [a.py:1] hello HTTP/\n'
    fast, slow = _both(line)
    assert fast == slow
    assert fast["http_ok"] == 0


@pytest.mark.parametrize("level", [b"CRITICAL", b"ERROR"])
def test_a_critical_or_error_line_is_read_in_full(level):
    """A CRITICAL or ERROR line holds no trigger word, yet it is the error of a start that never got
    ready (undecided), and with the server stopping after it, fatal."""
    line = level + b" 12-05 01:02:03 [x.py:13] the engine could not go on\n"
    fast, slow = _both(line)
    assert fast == slow and fast["verdict"] == "undecided"
    fast, slow = _both(line + b"INFO:     Shutting down\n")
    assert fast == slow and fast["verdict"] == "fatal"


def test_a_frame_without_its_traceback_header_opens_one():
    """An excerpt cut above 'Traceback (most recent call last)': its frames open the traceback, and
    the exception line after them is the first failure, in both paths."""
    p = b"(Worker_TP1 pid=1405) ERROR 07-01 14:35:41 [multiproc_executor.py:962] "
    data = b"".join([b"INFO 07-01 14:35:00 [x.py:1] Starting to load model /m\n",
                     p + b'  File "/v/vllm/compilation/backends.py", line 1214, in __call__\n',
                     p + b"    PiecewiseCompileInterpreter(\n", b"...\n",
                     p + b"torch._inductor.exc.InductorError: RuntimeError: Failed to run autotuning code block\n"])
    fast, slow = _both(data)
    assert fast == slow
    assert fast["verdict"] == "fatal" and fast["first_failure"]["line"] == 5
    assert "InductorError" in fast["first_failure"]["text"]


def test_tracebacks_of_two_workers_whose_names_differ_only_in_a_digit():
    """Lines of one shape may come from Worker_TP0 and Worker_TP1: the process is read from each
    raw line, so a frame pins the phase of its own worker's traceback only."""
    def tb(w: int, func: str) -> list[bytes]:
        p = f"(Worker_TP{w} pid=1{w}) ".encode()
        return [p + b"Traceback (most recent call last):\n", p + f'  File "/v/x.py", line 1{w}, in {func}\n'.encode(),
                p + b"    return f()\n"]
    data = b"".join([*tb(0, "load_model"), *tb(1, "capture_model"), tb(0, "x")[2], tb(1, "x")[2],
                     b"(Worker_TP0 pid=10) RuntimeError: boom\n", b"(Worker_TP1 pid=11) ValueError: bang\n"])
    fast, slow = _both(data)
    assert fast == slow
    assert "while loading the weights" in fast["first_failure"]["cause"]


def test_a_frame_of_a_worker_without_a_traceback_pins_no_other_workers_phase():
    """A shape learnt from Worker_TP1's line, met again in Worker_TP0's while only TP1 has a
    traceback open: the frame is TP0's, so TP1's failure gets no phase from it."""
    frame = '  File "/v/x.py", line 1{w}, in load_model\n'
    data = b"".join(s.encode() for s in [
        "(Worker_TP1 pid=11) " + frame.format(w=1), "(Worker_TP1 pid=11) Traceback (most recent call last):\n",
        "(Worker_TP0 pid=10) " + frame.format(w=0), "(Worker_TP1 pid=11) ValueError: bang\n"])
    fast, slow = _both(data)
    assert fast == slow
    assert "while loading the weights" not in fast["first_failure"]["cause"]


@pytest.mark.parametrize("p", ["(Worker_TP0 pid=10) ", ""])
def test_a_line_that_does_not_go_on_ends_its_processs_traceback(p):
    """'boom happened' ends the first traceback (it is no exception); the later frame opens another
    (an excerpt may begin at a frame), whose exception is the first failure, in the phase it pins."""
    data = "".join(p + s + "\n" for s in ["Traceback (most recent call last):", '  File "x.py", line 1, in f',
                                          "boom happened", '  File "x.py", line 2, in load_model',
                                          "ValueError: bang"]).encode()
    fast, slow = _both(data)
    assert fast == slow
    assert fast["first_failure"]["line"] == 5 and "while loading the weights" in fast["first_failure"]["cause"]


@pytest.mark.parametrize("line", ["(APIServer pid=7) \u3000", "INFO 12-05 01:02:03 [a.py:1]\u3000\u3000"])
def test_a_line_whose_unicode_space_end_leaves_only_a_prefix_is_no_line(line):
    """`clean` strips Unicode spaces at the end, bytes.rstrip does not: such a line is not told at sight."""
    data = f"{line}\nhello\n{line}\n".encode()
    fast, slow = _both(data)
    assert fast == slow and fast["lines"] == 2


def test_what_the_shapes_remember_stays_bounded(monkeypatch):
    """A new process name on every line of a traceback: the shared answers are bounded too."""
    monkeypatch.setattr(shapes_mod, "MAX_SHAPES", 8)
    reader = triage_mod._Reader()
    lines = [b"Traceback (most recent call last):"] + [
        f"(P{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}{chr(97 + i // 676)} pid=1)   x = y".encode() for i in range(500)]
    reader.read(list(enumerate(lines, 1)))
    assert len(reader.shapes.seen) <= 8 and len(reader.shapes._quiet) <= 8


def test_a_line_with_control_characters_has_no_shape():
    shapes = _shapes()
    assert shapes.key(b"INFO x\x1b[0m y") is None
    assert shapes.key(b"a\rb") is None
    assert shapes.key(b"a\x00b") is None
    assert shapes.key(b"INFO 12-05 x\ty") == b"INFO 00-00 x\ty"


def test_every_word_feed_looks_for_is_a_trigger():
    """The fast path rests on _TRIGGERS: each needle and marker feed reacts to is in it."""
    triggers = set(triage_mod._TRIGGERS)
    assert {n for n, _ in triage_mod._NEEDLES} <= triggers
    assert {m for m, _ in triage_mod.PHASE_MARKERS} <= triggers
    assert set(words.SHUTDOWN_MARKERS) | set(words._FATAL_WORDS) | {"Caovan", "HTTP/", "Traceback"} <= triggers
    assert set(words.STOP_WORDS) <= triggers   # the start rule's and a crash's words
