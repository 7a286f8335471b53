"""Read JSON the user hands us (facts, settings, model files) without hanging, spinning or tracing back.

One reader for every boundary: a regular file only (a FIFO, socket or device is refused before
a single byte is read, so it cannot block), a bounded size, strict UTF-8, strict JSON (no
NaN/Infinity, which `json.loads` accepts by default) and a bounded nesting depth. Each boundary
turns `BadJson` into its own error class naming the file or key.
"""

from __future__ import annotations

import json
import math
import os
import reprlib
import stat
from pathlib import Path
from typing import Any

from .errors import CaovanException

MAX_DEPTH = 64  # no file we read nests deeper; the limit keeps later recursion (asdict, dumps) safe
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 2, 40, 40, 3, 3


def short(value: object) -> str:
    """A value for an error line: one line, about 60 characters at most, safe at any nesting."""
    return _SHORT.repr(value)


class BadJson(CaovanException, ValueError):
    """The text or file is not what we accept; `str()` is one line without the file name."""


def file_kind(mode: int) -> str:
    """Human words for a non-regular file type ("a FIFO", "a directory", ...)."""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | Path) -> tuple[int, int]:
    """Open `path` for reading; return (fd, size). The caller closes the fd.

    Opened non-blocking and checked with fstat before any read, so a FIFO or a device never
    blocks. Raises OSError when it cannot be opened, BadJson when it is not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise BadJson(f"is {file_kind(st.st_mode)}, not a regular file")
    return fd, st.st_size


def read_fd(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes from `fd`'s position (fewer at the end of the file)."""
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, 2**20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_bytes(path: str | Path, limit: int) -> bytes:
    """The whole regular file `path`, refused (BadJson) when larger than `limit` bytes."""
    fd, size = open_regular(path)
    try:
        data = b"" if size > limit else read_fd(fd, limit + 1)  # +1: did it grow?
    finally:
        os.close(fd)
    if size > limit or len(data) > limit:  # the second: it grew while we read it
        raise BadJson(f"is larger than {limit // 2**20} MiB")
    return data


def decode(data: bytes) -> str:
    """Strict UTF-8; BadJson names the first bad byte's offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadJson(f"is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})") from None


def _no_constant(name: str) -> Any:
    raise BadJson(f"is not strict JSON ({name} is not a JSON number)")


def loads(text: str, max_depth: int = MAX_DEPTH, *, finite: bool = True) -> Any:
    """`json.loads` that refuses deep nesting and, with `finite`, NaN/Infinity and numbers that
    overflow to infinity. `finite=False` is for files other tools write (Python's json.dump
    writes NaN): the reader then checks the numbers it uses."""
    try:
        value = json.loads(text, parse_constant=_no_constant if finite else None)
    except json.JSONDecodeError as err:
        raise BadJson(f"is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise BadJson(f"is nested more than {max_depth} levels deep") from None
    except BadJson:
        raise
    except ValueError as err:  # e.g. an integer longer than Python's digit limit
        raise BadJson(f"is not valid JSON ({str(err).splitlines()[0]})") from None
    check_depth(value, max_depth, finite=finite)
    return value


def check_depth(value: Any, max_depth: int = MAX_DEPTH, *, finite: bool = True) -> None:
    """BadJson when `value` nests deeper than `max_depth` or (with `finite`) holds NaN or infinity."""
    stack = [(value, 1)]
    while stack:  # iterative: the value may be deeper than Python's recursion limit
        item, depth = stack.pop()
        if finite and isinstance(item, float) and not math.isfinite(item):
            raise BadJson("is not strict JSON (a non-finite number: NaN, Infinity or one too large)")
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                raise BadJson(f"is nested more than {max_depth} levels deep")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def load_file(path: str | Path, limit: int, *, finite: bool = True) -> Any:
    """Read, decode and parse a JSON file with every check above. Raises OSError or BadJson."""
    return loads(decode(read_bytes(path, limit)), finite=finite)
