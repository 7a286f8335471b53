"""Shared by the hardening tests (issue 17): hostile values, and running a command's `main` in
process the way its console script does, with the promises every run must keep."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from unittest import mock

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from caovan_vllm_sm75_turbo3.cli.common import run_cli

SECRET = "sk-hostile-SECRET-0123456789"
# Enough examples to find the classes, few enough to keep the suite fast; the time bound is ours
# (a wall-clock assert per run), not hypothesis' deadline, which is flaky on a loaded machine.
FAST = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
BOUND_S = 3.0

_FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [float("nan"), float("inf"), -float("inf"), 1e300, -1e300, 1e-300])
_INTS = st.integers() | st.sampled_from([-1, 0, 2**63, 10**30, -(2**63)])
_TEXT = st.text(max_size=40) | st.sampled_from(["22528", "7.5", "[bold]x[/]", "[/nope]", "\x00", "NaN", ""])
SCALARS = st.none() | st.booleans() | _INTS | _FLOATS | _TEXT
# Values of every JSON shape, wrong types included, a few levels deep.
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


def deep(n: int, kind: str = "list") -> str:
    """JSON text nested `n` levels deep."""
    return "[" * n + "]" * n if kind == "list" else '{"a":' * n + "1" + "}" * n


@dataclass
class Run:
    code: int
    out: str
    err: str
    seconds: float


def run_main(prog: str, main: Callable[[Sequence[str]], int], argv: Sequence[str],
             env: Mapping[str, str] | None = None) -> Run:
    """`run_cli(prog, main, argv)` with captured output and an environment holding a secret."""
    out, err = io.StringIO(), io.StringIO()
    base = {k: v for k, v in os.environ.items() if not k.startswith("CAOVAN_")}
    full = {**base, "VLLM_API_KEY": SECRET, "OPENAI_API_KEY": SECRET, **(env or {})}
    start = time.monotonic()
    with mock.patch.dict(os.environ, full, clear=True), redirect_stdout(out), redirect_stderr(err):
        code = run_cli(prog, main, list(argv))
    return Run(code, out.getvalue(), err.getvalue(), time.monotonic() - start)


# Python's traceback header: generated bad input may well hold the word "Traceback" itself (Hypothesis
# draws strings from the code under test), and an error line quotes what it refuses.
TRACEBACK = "Traceback (most recent call last)"


def assert_clean(r: Run, codes: tuple[int, ...] = (0, 1, 2)) -> None:
    """The promises of issue 17 for one run: a known exit code, no traceback, at most one line
    on stderr, no secret, within the time bound."""
    both = r.out + r.err
    assert r.code in codes, both
    assert TRACEBACK not in both, both
    assert len(r.err.strip().splitlines()) <= 1, r.err
    assert SECRET not in both
    assert r.seconds < BOUND_S, f"took {r.seconds:.1f} s"
