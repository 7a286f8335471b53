"""The log reader's fast path (triage.feed_block: lines holding none of the trigger words only count)
changes no verdict: for every log of tests/data/logs, whole and cut into random mixes, the triage
equals the one that feeds every line through the full path."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest

from caovan_vllm_sm75_turbo3.logtriage import triage as triage_mod
from caovan_vllm_sm75_turbo3.logtriage.reader import read_lines

LOGS = sorted((Path(__file__).parent / "data" / "logs").glob("*.log"))


class _SlowReader(triage_mod._Reader):
    """The full path for every line: the reference the fast path must agree with."""

    def feed_block(self, block):
        text = "\n".join(ln.text for ln in block)
        self.needles = tuple((n, i) for n, i in triage_mod._NEEDLES if n in text)
        for ln in block:
            self.feed(ln)


def _both(data: bytes) -> tuple[dict, dict]:
    fast = triage_mod.triage_lines(read_lines(io.BytesIO(data)), "x").to_dict()
    reader = _SlowReader()
    lines = list(read_lines(io.BytesIO(data)))
    for start in range(0, len(lines), triage_mod.BLOCK_LINES):
        reader.feed_block(lines[start:start + triage_mod.BLOCK_LINES])
    return fast, reader.finish("x").to_dict()


@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_each_real_and_fixture_log_gets_the_same_verdict(log):
    fast, slow = _both(log.read_bytes())
    assert fast == slow


@pytest.mark.parametrize("seed", range(8))
def test_random_mixes_of_every_logs_lines_get_the_same_verdict(seed):
    rng = random.Random(seed * 7919 + random.randrange(1000))
    pool = [ln for p in LOGS for ln in p.read_bytes().splitlines(keepends=True)]
    picked = [rng.choice(pool) for _ in range(rng.randrange(200, 3000))]
    # runs of consecutive lines too, so tracebacks, banners and deferred findings stay whole
    for _ in range(rng.randrange(1, 6)):
        log = rng.choice(LOGS).read_bytes().splitlines(keepends=True)
        at = rng.randrange(len(log))
        picked[rng.randrange(len(picked)):0] = log[at:at + rng.randrange(5, 200)]
    fast, slow = _both(b"".join(picked))
    assert fast == slow


def test_every_word_feed_looks_for_is_a_trigger():
    """The fast path rests on _TRIGGERS: each needle and marker feed reacts to is in it."""
    triggers = set(triage_mod._TRIGGERS)
    assert {n for n, _ in triage_mod._NEEDLES} <= triggers
    assert {m for m, _ in triage_mod.PHASE_MARKERS} <= triggers
    assert set(triage_mod.SHUTDOWN_MARKERS) | set(triage_mod._FATAL_HINTS) | {"Caovan", "HTTP/", "Traceback"} <= triggers
