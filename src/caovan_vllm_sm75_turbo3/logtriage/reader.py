"""Streaming reader for vLLM server logs: one clean `LogLine` per line, in bounded memory.

It undoes what vLLM and the tools around it add to each message: ANSI colours, the worker prefix
`(EngineCore_DP0 pid=123) ` / `(Worker_TP1 pid=456) ` / `(APIServer pid=7) `, the logger header
`INFO 12-02 17:44:10 [shm_broadcast.py:681] ` (vllm/logger.py's `_FORMAT`; before 0.7 it had no
`[` : `ERROR 02-11 20:39:41 core.py:208] `), uvicorn's `INFO:     `, docker/journald/RFC 3339
stamps (`2025-10-24T17:12:08.36 +08:00 CST `), docker compose's `vllm-1  | `, and a prefix of no
known form that most lines of the log's head carry before vLLM's own line (`learn_prefix`). A log
pasted without its newlines is split again where vLLM's lines began (`split_pasted`). It never holds
more than one chunk and one capped line.

Input: `-` is standard input, read to its end as `cat` would (the user chose it: a slow pipe is
waited for; a closed standard input is refused). A FILE is opened without blocking; a FIFO
(`mkfifo`, `<(cmd)`) is then read as a stream like standard input, once something arrives: when
nothing is written to it (and no writer closes it) within FIFO_WAIT_S, it is refused instead of
waiting forever. A read error in the middle (a truncated gzip, an I/O error) is one line too.
"""

from __future__ import annotations

import gzip
import itertools
import os
import re
import select
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO, NamedTuple

from ..errors import CaovanError

CHUNK_BYTES = 32 * 1024   # split whole at once: the list of its lines is what the reader holds
# A line longer than this keeps its start and its end (KEEP_BYTES each): a log line that long is a
# dumped tensor or a pasted binary; what a signature needs is at its start or its end.
MAX_LINE_BYTES = 8 * 1024
KEEP_BYTES = MAX_LINE_BYTES // 2
SNIFF_BYTES = 8 * 1024
FIFO_WAIT_S = 30.0  # a FIFO given as FILE: how long to wait for its first byte (or its writer's end)

# An OSC sequence stops at a line's end too: none spans lines, so lines joined by `\n` lose the
# same as each alone (what logtriage/shapes.py relies on).
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\n\r]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_ANSI_BYTES = re.compile(_ANSI.pattern.encode())
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# `docker logs -t`, RFC 3339 stamps (a zone name may follow the offset), journald, and docker
# compose's service column put their own prefix before vLLM's line; up to two of them nest.
_OUTER_STAMP = re.compile(
    r"^(?:\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?: ?(?:Z|[+-]\d\d:?\d\d))?(?: (?!(?:DEBUG|INFO|WARN|ERROR)\b)[A-Z]{2,5}(?= ))?\s+"
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^\s:\[]+(?:\[\d+\])?: "
    r"|[a-z0-9][\w.-]*\s*\| "
    # torch.distributed's rank on each line of a worker's error ("[rank0]: Traceback ..."), and
    # torch's / glog's C++ header ("[W1206 03:01:58.473247741 ProcessGroupNCCL.cpp:1575] ",
    # "E1206 03:01:58.473247 12345 nccl.cc:9] "), whose one-letter level is left unread
    r"|\[rank\d+\]: ?|\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +(?:\d+ )?[\w.-]+:\d+\] ?)")
# "(NAME pid=PID) ": added to stdout/stderr by vllm/utils/system_utils.py `_add_prefix` (0.21), part of
# the logger format itself in 0.34; older releases named workers "VllmWorker TP0"; Ray adds ", ip=...".
_PROCESS = re.compile(r"^\((?P<proc>[A-Za-z_][\w.\- ]*?) pid=\d+(?:, ip=[^)]*)?\) ?")
# vllm/logger.py: "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s", date "%m-%d %H:%M:%S".
# Before vLLM 0.7 the source had no opening bracket: "ERROR 02-11 20:39:41 core.py:208] ".
_VLLM_HEADER = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? "
    r"(?:\[(?P<src>[^\]\s]+:\d+)\]|(?P<old_src>[\w./-]+\.py:\d+)\]) ?")
# Where one of vLLM's own lines starts (its worker prefix, then its logger header): what a prefix
# of no known form is learnt before (learn_prefix), and where a pasted log is split (split_pasted).
_LINE_START = (r"(?:\([A-Za-z_][\w.\- ]*? pid=\d+(?:, ip=[^)]*)?\) )?"
               r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d")
_LINE_START_TEXT = re.compile(_LINE_START + r"|\((?:APIServer|EngineCore\w*|Worker\w*) pid=\d+")
_PASTED_SPLIT = re.compile(rb"(?<=\s)(?=" + _LINE_START.encode() + rb")"
                           rb"|(?<=\s)(?<!\] )(?=Traceback \(most recent call last\):)")
PASTED_MIN_BYTES = 200    # a shorter line is one line
LEARN_LINES = 128         # lines of the head a prefix of no known form is learnt from
LEARN_SHARE = 0.5         # the share of them it must stand before vLLM's own line in
MAX_PREFIX_CHARS = 80
# uvicorn's default formatter: "INFO:     Application startup complete."
_UVICORN_HEADER = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+")


@dataclass(frozen=True, slots=True)
class LogLine:
    """One log line as a person reads it: `number` counts newlines from 1, like an editor."""

    number: int
    text: str
    process: str | None = None
    level: str | None = None
    source: str | None = None


def clean(raw: str, number: int = 0, prefix: LearntPrefix | None = None) -> LogLine:
    """Strip colours, control characters and the prefixes vLLM, uvicorn and log collectors add;
    first `prefix`, where the log's head taught one (learn_prefix)."""
    text = _ANSI.sub("", raw) if "\x1b" in raw else raw   # the fast paths keep reading at tens of MB/s
    if not text.isprintable():
        text = _CONTROL.sub("", text)
    text = text.rstrip()
    if prefix is not None and (m := prefix.pattern.match(text)) is not None:
        text = text[m.end():]
    for _ in range(2):   # `docker compose logs -t`: the service column, then the stamp
        if not ((text[:1].isalnum() or text[:1] == "[") and (m := _OUTER_STAMP.match(text))):
            break
        text = text[m.end():]
    process = None
    while (m := _PROCESS.match(text)) is not None:   # nested launchers may add more than one
        process = process or m.group("proc")
        text = text[m.end():]
    level = source = None
    if (m := _VLLM_HEADER.match(text)) is not None:
        level, source = m.group("level"), m.group("src") or m.group("old_src")
        text = text[m.end():]
    elif (m := _UVICORN_HEADER.match(text)) is not None:
        level = m.group("level")
        text = text[m.end():]
    if level == "WARN":
        level = "WARNING"
    return LogLine(number, text, process, level, source)


class LearntPrefix(NamedTuple):
    """A prefix of no known form a log's head taught (learn_prefix)."""

    pattern: re.Pattern[str]   # what `clean` strips first: digit runs match any digits, space runs any spaces
    end: bytes                 # its last character that is not a space: a line ending in it may be only the
    #                            prefix (logtriage/shapes.py tells no such line at sight)


def learn_prefix(raws: list[bytes]) -> LearntPrefix | None:
    """A prefix of no known form that most of these lines (a log's head) carry before vLLM's own
    line. None when no one prefix stands before vLLM's line in LEARN_SHARE of them (at least 3)."""
    counts: dict[str, int] = {}
    lines = 0
    for raw in raws[:LEARN_LINES]:
        if b"\r" in raw:
            continue
        lines += 1
        text = clean(raw.decode("utf-8", "replace")).text   # the known prefixes gone first
        m = _LINE_START_TEXT.search(text, 1, MAX_PREFIX_CHARS + 64)
        if m is None or m.start() > MAX_PREFIX_CHARS:
            continue
        shape = re.sub(r" +", " ", re.sub(r"\d+", "0", text[:m.start()]))
        counts[shape] = counts.get(shape, 0) + 1
    if not counts:
        return None
    shape, n = max(counts.items(), key=lambda kv: kv[1])
    if n < 3 or n < LEARN_SHARE * lines:
        return None
    pattern = "".join(r"\d+" if ch == "0" else " +" if ch == " " else re.escape(ch) for ch in shape)
    return LearntPrefix(re.compile(pattern), shape.rstrip()[-1:].encode("ascii", "replace"))


def split_pasted(line: bytes, min_bytes: int = PASTED_MIN_BYTES) -> list[bytes]:
    """A line holding several of vLLM's lines (a log pasted without its newlines) split where each
    began (its worker prefix or logger header, or a traceback's first line); any other line alone.
    `min_bytes` 0: the end of a paste already found, whatever its length."""
    if len(line) < min_bytes or line.count(b"] ") + line.count(b"Traceback (") < 2:
        return [line]
    cuts = [m.start() for m in _PASTED_SPLIT.finditer(line, 1)]
    if len(cuts) < (2 if min_bytes else 1):   # one line with something after it that looks like a start
        return [line]
    return [p for p in (line[a:b] for a, b in zip([0, *cuts], [*cuts, len(line)])) if p.strip()]


def _capped(line: bytes) -> bytes:
    """A line of at most MAX_LINE_BYTES: a longer one keeps its first and last KEEP_BYTES."""
    return line if len(line) <= MAX_LINE_BYTES else line[:KEEP_BYTES] + b" ... " + line[-KEEP_BYTES:]


def strip_colours(raw: bytes) -> bytes:
    """`raw` without the ANSI sequences `clean` drops, on bytes: for a line without other
    control characters, `clean` of the result is `clean` of `raw`."""
    return _ANSI_BYTES.sub(b"", raw)


def numbered_lines(stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) for each non-blank line, each at most MAX_LINE_BYTES (a `\r` inside is
    kept: `line_pieces` splits there). An over-long line keeps its first and last KEEP_BYTES with
    ` ... ` between: an error at the end of a long prefix (a dumped tensor, a long config) is still
    read. Whole chunks are split at once (what keeps this fast); only a line longer than
    MAX_LINE_BYTES is carried across chunks, capped."""
    number = 0
    rest = b""          # the unfinished last line of the chunks so far (at most MAX_LINE_BYTES)
    head: bytes | None = None   # an over-long line's first KEEP_BYTES, while its end is awaited
    tail = b""          # and its last KEEP_BYTES so far
    pasted = False      # `rest` is what is left of a paste split already: split its end too, however short
    while chunk := stream.read(CHUNK_BYTES):
        if head is not None:   # inside an over-long line: look for its end
            nl = chunk.find(b"\n")
            if nl < 0:
                tail = (tail + chunk)[-KEEP_BYTES:]
                continue
            number += 1
            yield number, head + b" ... " + (tail + chunk[:nl])[-KEEP_BYTES:]
            head, tail, chunk = None, b"", chunk[nl + 1:]
        lines = chunk.split(b"\n")
        chunk = b""   # the lines hold its bytes now: not twice
        lines[0] = rest + lines[0]
        rest = lines.pop()
        for i, line in enumerate(lines):
            number += 1
            least = 0 if pasted and i == 0 else PASTED_MIN_BYTES
            if len(line) >= least and len(pieces := split_pasted(line, least)) > 1:
                yield from ((number, _capped(p)) for p in pieces)
                continue
            if len(line) > MAX_LINE_BYTES:   # the test inline: a call per line costs at tens of MB/s
                line = _capped(line)
            if line.strip():
                yield number, line
        pasted = pasted and not lines
        if len(rest) > MAX_LINE_BYTES:
            *pieces, rest = split_pasted(rest)   # a pasted log: its lines go out as they are found
            yield from ((number + 1, _capped(p)) for p in pieces)
            pasted = pasted or bool(pieces)
        if len(rest) > MAX_LINE_BYTES:
            head, tail, rest = rest[:KEEP_BYTES], rest[-KEEP_BYTES:], b""
    if head is not None:
        yield number + 1, head + b" ... " + tail
    else:
        yield from ((number + 1, _capped(p)) for p in split_pasted(rest, 0 if pasted else PASTED_MIN_BYTES)
                    if p.strip())


def line_pieces(number: int, line: bytes, prefix: LearntPrefix | None = None) -> Iterator[LogLine]:
    """The cleaned, non-empty pieces of one line: `\r` splits it (tqdm progress bars, and vLLM's
    multi-line messages end their lines with `\r\n`); bytes that are not UTF-8 become U+FFFD.
    A piece without a process prefix keeps the one its line's first piece named."""
    process = None
    for i, piece in enumerate(p for p in line.split(b"\r") if p.strip()):
        ln = clean(piece.decode("utf-8", "replace"), number, prefix)
        if i == 0:
            process = ln.process
        elif ln.process is None and process is not None:
            ln = LogLine(ln.number, ln.text, process, ln.level, ln.source)
        if ln.text:
            yield ln


def read_lines(stream: BinaryIO) -> Iterator[LogLine]:
    """Every non-empty line of `stream`, cleaned (see `numbered_lines` and `line_pieces`), with the
    prefix its first LEARN_LINES lines teach (learn_prefix)."""
    lines = numbered_lines(stream)
    head = list(itertools.islice(lines, LEARN_LINES))
    prefix = learn_prefix([raw for _, raw in head])
    for number, line in itertools.chain(head, lines):
        yield from line_pieces(number, line, prefix)


def looks_binary(head: bytes) -> bool:
    """True when the first bytes of a file are not text: NUL bytes, or mostly non-printable."""
    if not head:
        return False
    if b"\x00" in head:
        return True
    text = head.decode("utf-8", "replace")
    bad = sum(1 for ch in text if ch == "\ufffd" or (ch < " " and ch not in "\t\n\r\x1b"))
    return bad > len(text) * 0.1


def _unreadable(label: str, err: BaseException) -> CaovanError:
    return CaovanError(f"--log {label}: cannot read it ({getattr(err, 'strerror', None) or err})")


class _Prefixed:
    """A byte stream that first returns `head` (already read to sniff it), then the rest of `rest`;
    a read error of `rest` is the one-line CaovanError."""

    def __init__(self, head: bytes, rest: BinaryIO, label: str) -> None:
        self._head = head
        self._rest = rest
        self._label = label

    def read(self, size: int = -1) -> bytes:
        if self._head:
            out = self._head if size < 0 else self._head[:size]
            self._head = self._head[len(out):]
            return out
        try:
            return self._rest.read(size)
        except (OSError, EOFError) as err:  # gzip's BadGzipFile is an OSError
            raise _unreadable(self._label, err) from None


def _read_head(stream: BinaryIO, label: str) -> bytes:
    try:
        return stream.read(SNIFF_BYTES)
    except (OSError, EOFError) as err:
        raise _unreadable(label, err) from None


def _stdin() -> BinaryIO:
    """Standard input as bytes; a closed one (`<&-`) is refused."""
    if sys.stdin is None or getattr(sys.stdin, "buffer", None) is None:
        raise CaovanError("--log -: standard input is closed; pipe a log into it (... | caovan-sm75-doctor "
                          "--log -) or give the log's path")
    return sys.stdin.buffer


def _wait_for_fifo(fd: int, label: str) -> None:
    """Wait up to FIFO_WAIT_S for a FIFO's first byte or its writer's end; refuse after that."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if not poller.poll(int(FIFO_WAIT_S * 1000)):
        raise CaovanError(f"--log {label}: a FIFO that nothing wrote to within {FIFO_WAIT_S:g} s; start the "
                          "writer first, or pipe the log into --log -")


def _open_file(path: str, label: str) -> BinaryIO:
    """Open `path` without blocking (a FIFO without a writer would block in open), then read it
    blocking: a FIFO once it has data (see the module doc)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            _wait_for_fifo(fd, label)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def open_log(path: str) -> Iterator[BinaryIO]:
    """Open a log for reading as bytes: `-` is standard input; gzip content is unpacked on the fly.

    Raises CaovanError (one line, no traceback) when the path cannot be read or holds no text.
    """
    label = "standard input" if path == "-" else repr(path)
    try:
        raw: BinaryIO = _stdin() if path == "-" else _open_file(path, label)
    except OSError as err:
        raise CaovanError(f"--log {label}: cannot read it ({err.strerror or err}); "
                          "give the path of a vLLM server log, or - for standard input") from None
    try:
        head = _read_head(raw, label)
        stream: BinaryIO = _Prefixed(head, raw, label)  # type: ignore[assignment]
        if head[:2] == b"\x1f\x8b":
            unpacked: BinaryIO = gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[assignment]
            head = _read_head(unpacked, label)
            stream = _Prefixed(head, unpacked, label)  # type: ignore[assignment]
        if looks_binary(head):
            raise CaovanError(f"--log {label}: this is not a text log (binary data in its first "
                              f"{len(head):,} bytes); give the file that vLLM's output was written to")
        yield stream
    finally:
        if path != "-":
            raw.close()
