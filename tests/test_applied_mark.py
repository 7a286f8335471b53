"""The applied mark (what the first vLLM process leaves its children) is one typed value, encoded and
read back in logformat only: what one process writes, the next reads the same."""

from __future__ import annotations

import random
import string

from caovan_vllm_sm75_turbo3.launch import APPLIED_MARK, apply_env
from caovan_vllm_sm75_turbo3.logformat import NOTHING_APPLIED, WORKER_LINE, AppliedMark, worker_line


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits + " :;()=-_.") for _ in range(rng.randint(1, 40)))


def test_every_mark_reads_back_as_written() -> None:
    rng = random.Random(7)
    for _ in range(500):
        by = _text(rng).replace(NOTHING_APPLIED, " ")
        mark = AppliedMark(by, rng.choice([None, _text(rng), ""]))
        assert AppliedMark.decode(mark.encode()) == mark


def test_the_worker_line_says_what_the_mark_says() -> None:
    applied = worker_line("9.9", AppliedMark("vLLM process pid 12"), 34)
    nothing = worker_line("9.9", AppliedMark("caovan-vllm-serve", "no SM75 GPU visible"), 34)
    assert WORKER_LINE.match(applied) and "guards from vLLM process pid 12 apply" in applied
    assert WORKER_LINE.match(nothing) and "no SM75 GPU visible" in nothing and "caovan-vllm-serve" in nothing


class _Plan:
    def __init__(self, updates: dict[str, str], sm75: int) -> None:
        self._updates, self.sm75_gpus = updates, sm75

    def env_updates(self) -> dict[str, str]:
        return dict(self._updates)


def test_apply_env_writes_a_mark_that_decodes_to_who_and_why() -> None:
    env: dict[str, str] = {}
    apply_env(_Plan({"VLLM_USE_FLASHINFER_SAMPLER": "0"}, 2), env, "me")
    assert AppliedMark.decode(env[APPLIED_MARK]) == AppliedMark("me")
    env = {}
    apply_env(_Plan({}, 0), env, "me")
    assert AppliedMark.decode(env[APPLIED_MARK]) == AppliedMark("me", "no SM75 GPU visible")
