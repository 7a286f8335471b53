"""Bad input to `caovan-sm75-bench` (issues 17 and 18): every refused --api-base, --api-key or number
(inf, nan, 1e300, 0, negatives, words) is one line on stderr, exit 2, no traceback, no secret, at
once — before any request."""

from __future__ import annotations

import argparse

import pytest
from helpers.hostile import FAST, SECRET, assert_clean, run_main
from hypothesis import assume, given
from hypothesis import strategies as st

from caovan_vllm_sm75_turbo3.cli.bench import MAX_CONCURRENCY, MAX_REPEATS, MAX_SECONDS, MAX_TOKENS, PROG, main
from caovan_vllm_sm75_turbo3.cli.common import seconds, whole_number
from caovan_vllm_sm75_turbo3.errors import SettingError
from caovan_vllm_sm75_turbo3.server_api.address import check_api_key, normalize_api_base

GOOD = "http://127.0.0.1:9"  # never contacted: every run below is refused first
NUMBERS = {"--prompt-tokens": whole_number(8, MAX_TOKENS), "--output-tokens": whole_number(2, MAX_TOKENS),
           "--concurrency": whole_number(1, MAX_CONCURRENCY), "--repeats": whole_number(1, MAX_REPEATS),
           "--wait": seconds(MAX_SECONDS), "--timeout": seconds(MAX_SECONDS)}
RAW_NUMBERS = st.sampled_from(["inf", "-inf", "nan", "NaN", "1e300", "-1e300", "0", "-1", "-0.0", "1.5", "", " ",
                               "ten", "0x10", "1_000_000_000_000", str(2**63), "+-3"]) | st.integers().map(str) \
    | st.floats().map(repr) | st.text(max_size=12)
BASES = st.sampled_from(["", "127.0.0.1:8000", "ftp://h:1", "http://", "http://h:0", "http://h:99999", "http://h:x",
                         f"http://u:{SECRET}@h:70000", "http://h h:1", "http://[::1:1", "http://\x00:1",
                         "http://" + "a" * 64 + ".x:1", "javascript:alert(1)"]) | st.text(max_size=30)


def _refused(parse, raw: str) -> bool:
    try:
        parse(raw)
    except (argparse.ArgumentTypeError, SettingError, ValueError):
        return True
    return False


def _main(argv: list[str]) -> int:
    """`main`, with argparse's refusal (SystemExit) turned into the exit code the process would have."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def _run(*args: str):
    return run_main(PROG, _main, ["--model", "m", *args])


@FAST
@given(option=st.sampled_from(sorted(NUMBERS)), raw=RAW_NUMBERS)
def test_a_refused_number_is_one_line_exit_2(option, raw):
    assume(_refused(NUMBERS[option], raw) and not raw.startswith("-"))  # "-x" reads as another option
    r = _run("--api-base", GOOD, option, raw)
    assert_clean(r, codes=(2,))
    assert r.out == "" and r.err.startswith(f"{PROG}: error:")


@FAST
@given(raw=BASES)
def test_a_refused_api_base_is_one_line_exit_2(raw):
    assume(not raw.startswith("-") and _refused(normalize_api_base, raw))
    r = _run("--api-base", raw)
    assert_clean(r, codes=(2,))
    assert "--api-base" in r.err


@FAST
@given(key=st.text(min_size=1, max_size=20).map(lambda t: SECRET + t))
def test_a_refused_api_key_is_one_line_exit_2_without_the_key(key):
    assume(not key.startswith("-") and _refused(lambda k: check_api_key(k, "x"), key))
    r = _run("--api-base", GOOD, "--api-key", key)
    assert_clean(r, codes=(2,))
    assert key not in r.err


@pytest.mark.parametrize("args", [[], ["--api-base", GOOD, "--model"], ["--api-base", GOOD, "--repeats", "1e300"],
                                  ["--api-base", GOOD, "--wait", "inf"], ["--api-base", GOOD, "--concurrency", "0"],
                                  ["--api-base", GOOD, "--output-tokens", "1"], ["--bogus"]])
def test_each_bad_input_kind(args):
    r = run_main(PROG, _main, args)
    assert_clean(r, codes=(2,))
    assert r.err.count("\n") == 1 and "usage:" not in r.err
