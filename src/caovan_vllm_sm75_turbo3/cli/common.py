"""What every command shares: turning CaovanError into one line and an exit code, output that
never crashes, and strict JSON.

Output failures, the convention: a reader that went away (`| head -1`, EPIPE) ends the command
quietly, with the command's own exit code when its work was done and 141 (128 + SIGPIPE, what
a shell reports for a program killed by SIGPIPE) when the broken pipe cut it short. Any other
failure to write standard output (a full disk, `/dev/full`: ENOSPC) is one line on standard error
and exit 1. A closed standard output (`>&-`) is not an error: the output is dropped.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO

from ..errors import CaovanError
from ..textsafe import safe

EXIT_BROKEN_PIPE = 141
MAX_ERROR_CHARS = 2000   # an error line quoting outside text (200,000 model names) stays readable


class _OutputFailed(BaseException):
    """Writing standard output failed; BaseException so no `except Exception` in a command hides it."""

    def __init__(self, err: OSError) -> None:
        super().__init__(err)
        self.err = err


class _GuardedStdout:
    """sys.stdout, except that a failed write or flush is known to be the output's failure."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except UnicodeEncodeError:   # a lone surrogate or a narrow terminal encoding: escape, never crash
            enc = getattr(self._stream, "encoding", None) or "utf-8"
            return self.write(text.encode(enc, "backslashreplace").decode(enc))
        except OSError as err:
            raise _OutputFailed(err) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            raise _OutputFailed(err) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _drop_output(stream: TextIO) -> None:
    """Point standard output's file descriptor at /dev/null, so the interpreter's last flush of
    what is still buffered cannot fail again (and print 'Exception ignored ...')."""
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except (OSError, ValueError, AttributeError):  # no real file behind it (a test's capture)
        pass


def _say(line: str) -> None:
    """One line on standard error, which may itself be closed or full."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):
        pass


def run_cli(prog: str, main: Callable[[Sequence[str]], int], argv: Sequence[str] | None = None) -> int:
    """Run `main(argv)`; a CaovanError becomes `prog: error: message` on stderr and its exit code.

    Output failures follow the module's convention (EPIPE quiet, ENOSPC one line and exit 1).
    """
    real = sys.stdout
    # A closed standard output (Python's None) becomes /dev/null, so no command meets None.
    dropped = open(os.devnull, "w", encoding="utf-8") if real is None else None
    sys.stdout = _GuardedStdout(real or dropped)  # type: ignore[assignment]
    code: int | None = None
    try:
        code = main(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # fail here, while we can still say so, not at interpreter exit
        return code
    except CaovanError as err:
        _say(f"{prog}: error: {safe(err, MAX_ERROR_CHARS)}")
        return err.exit_code
    except KeyboardInterrupt:
        _say(f"{prog}: interrupted")
        return 130
    except _OutputFailed as failed:
        _drop_output(real or dropped)
        if failed.err.errno == errno.EPIPE:
            return EXIT_BROKEN_PIPE if code is None else code
        _say(f"{prog}: error: cannot write the output: {failed.err.strerror or failed.err}")
        return 1
    finally:
        sys.stdout = real
        if dropped is not None:
            dropped.close()


def _finite(value: Any) -> Any:
    """`value` with every NaN/Infinity float replaced by None, so the JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_text(value: Any, indent: int | None = 2) -> str:
    """Strict JSON for `--json` output: non-finite floats become null (never bare NaN/Infinity)."""
    return json.dumps(_finite(value), indent=indent, allow_nan=False)


def print_json(value: Any, indent: int | None = 2) -> None:
    """Print `value` as strict JSON on standard output (see `json_text`)."""
    print(json_text(value, indent))


class OneLineParser(argparse.ArgumentParser):
    """Refusals are one line (`prog: error: ...`, exit 2), without the usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {safe(' '.join(message.split()))} (see --help)", file=sys.stderr)
        sys.exit(2)


def whole_number(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `minimum` to `maximum`, anything else refused in one line."""
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{raw!r} is not accepted: a whole number >= {minimum} and <= {maximum}")
        return value
    return parse


def seconds(maximum: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds above 0 and at most `maximum` (no inf, nan, 0, negatives)."""
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not (math.isfinite(value) and 0 < value <= maximum):
            raise argparse.ArgumentTypeError(f"{raw!r} is not accepted: a number of seconds > 0 and <= {maximum}")
        return value
    return parse
