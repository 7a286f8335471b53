"""The warmup ladder: which requests, in which order, how long and with which time limits. Pure, no I/O.

Each step exists to make one family of first-request compilation happen now instead of on a
user's request: the sampler and small prefill shapes (tiny chat / completion), every prefill
bucket and chunked prefill (prompts up to and past `max_num_batched_tokens`), the MTP
draft/verify decode path (a long decode), top-k/top-p sampling, the streaming path, the prefix
cache hit, the tool and reasoning parsers, and the batch shapes / CUDA-graph sizes
(concurrency 1 .. `max_num_seqs`).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import SettingError

# Output length of prefill steps: long enough to leave prefill, short enough to keep the step about prefill.
PREFILL_OUTPUT_TOKENS = 4
SMALLEST_PREFILL = 128
# Chat template and question overhead kept free below max_model_len when a prompt is capped.
CONTEXT_MARGIN = 64
# The longest time limit accepted anywhere (a week): more is a typo, and inf / 1e300 overflow the clocks.
MAX_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class LadderConfig:
    """What the ladder is built from: the server's scheduler limits and the user's time limits."""

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 2
    max_model_len: int | None = None  # from GET /v1/models; None: not reported, prompts are not capped
    decode_tokens: int = 256
    step_timeout_s: float = 900.0
    # (pattern, seconds) from --timeout NAME=SECONDS; shell-style patterns, the last match wins.
    timeouts: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Step:
    """One named request (or group of simultaneous requests) of the ladder."""

    name: str
    kind: str  # chat | completion | stream | prefix-cache | tool-call | reasoning | concurrency | mixed
    purpose: str
    timeout_s: float
    max_tokens: int
    prompt_tokens: int | None = None  # target prompt length in tokens (chat template included); None: a short question
    concurrency: int = 1
    ignore_eos: bool = True  # a fixed output length makes the decode shapes deterministic and never empty
    sampling: dict[str, Any] = field(default_factory=dict)
    optional: bool = False  # a 400 from the server skips it with a note (parser not enabled), not a failure
    quick: bool = False  # repeated in the warm pass to show warm latency next to cold


def prefill_lengths(cfg: LadderConfig) -> list[int]:
    """Prompt lengths: powers of two from 128 below the batch budget, the budget itself, then 1.5x past it.

    The step past `max_num_batched_tokens` is split by chunked prefill; every length is capped so
    that prompt + output fits `max_model_len`.
    """
    budget = cfg.max_num_batched_tokens
    lengths = []
    n = SMALLEST_PREFILL
    while n < budget:
        lengths.append(n)
        n *= 2
    lengths += [budget, budget + budget // 2]
    if cfg.max_model_len is not None:
        cap = cfg.max_model_len - PREFILL_OUTPUT_TOKENS - CONTEXT_MARGIN
        lengths = [min(n, cap) for n in lengths if cap > 0]
    return sorted(set(n for n in lengths if n > 0))


def concurrency_levels(max_num_seqs: int) -> list[int]:
    """1, 2, 4, ... below `max_num_seqs`, then `max_num_seqs` itself: the batch sizes to run."""
    levels, k = [], 1
    while k < max_num_seqs:
        levels.append(k)
        k *= 2
    return levels + [max_num_seqs]


def _fits(cfg: LadderConfig, prompt_tokens: int, max_tokens: int) -> int:
    """`prompt_tokens`, shortened where the server's context would not hold prompt and output."""
    if cfg.max_model_len is None:
        return prompt_tokens
    return max(1, min(prompt_tokens, cfg.max_model_len - max_tokens - CONTEXT_MARGIN))


def build_ladder(cfg: LadderConfig) -> list[Step]:
    """The ordered steps for one server; run strictly one after another."""
    t = cfg.step_timeout_s
    decode = cfg.decode_tokens
    if cfg.max_model_len is not None:
        decode = max(1, min(decode, cfg.max_model_len - CONTEXT_MARGIN))
    steps = [
        Step("chat-tiny", "chat", "first chat request: chat template, sampler, smallest prefill and decode",
             t, max_tokens=8, quick=True),
        Step("completion-tiny", "completion", "the /v1/completions path", t, max_tokens=8, quick=True),
    ]
    lengths = prefill_lengths(cfg)
    for n in lengths:
        steps.append(Step(f"prefill-{n}", "chat",
                          "prefill bucket" + (" past max-num-batched-tokens: chunked prefill"
                                              if n > cfg.max_num_batched_tokens else ""),
                          t, max_tokens=PREFILL_OUTPUT_TOKENS, prompt_tokens=n, quick=n == lengths[0]))
    steps += [
        Step(f"decode-{decode}", "chat", "long greedy decode: MTP draft/verify and decode CUDA graphs",
             t, max_tokens=decode, sampling={"temperature": 0.0}, quick=True),
        Step("sampling", "chat", "top-k / top-p / temperature sampling kernels", t, max_tokens=32,
             sampling={"temperature": 0.8, "top_p": 0.95, "top_k": 40}, quick=True),
        Step("stream", "stream", "server-sent events streaming path", t, max_tokens=64, quick=True),
        Step("prefix-cache", "prefix-cache", "the same prompt twice: the second one hits the prefix cache",
             t, max_tokens=PREFILL_OUTPUT_TOKENS,
             prompt_tokens=_fits(cfg, min(1024, cfg.max_num_batched_tokens), PREFILL_OUTPUT_TOKENS)),
        Step("tool-call", "tool-call", "tool-call parser (skipped when the server has none)", t,
             max_tokens=128, ignore_eos=False, optional=True),
        Step("reasoning", "reasoning", "reasoning parser (skipped when the server rejects it)", t,
             max_tokens=128, ignore_eos=False, optional=True),
    ]
    for k in concurrency_levels(cfg.max_num_seqs):
        together = "one request alone" if k == 1 else f"{k} requests at once"
        steps.append(Step(f"concurrency-{k}", "concurrency", f"{together}: batch shape and CUDA graph size {k}",
                          t, max_tokens=32, concurrency=k))
    if cfg.max_num_seqs >= 2:
        steps.append(Step("mixed", "mixed", "one long prefill while the others decode: chunked prefill mixed "
                          "with a decode batch", t, max_tokens=32, concurrency=cfg.max_num_seqs,
                          prompt_tokens=_fits(cfg, cfg.max_num_batched_tokens, 32)))
    return [replace(s, timeout_s=timeout_for(s.name, cfg)) for s in steps]


def warm_pass(steps: list[Step]) -> list[Step]:
    """The short steps again, for warm latency next to cold."""
    return [s for s in steps if s.quick]


def timeout_for(name: str, cfg: LadderConfig) -> float:
    """The time limit of step `name`: the last matching `--timeout` pattern, else the default."""
    seconds = cfg.step_timeout_s
    for pattern, value in cfg.timeouts:
        if fnmatch.fnmatchcase(name, pattern):
            seconds = value
    return seconds


def parse_timeout(spec: str) -> tuple[str, float]:
    """`NAME=SECONDS` (NAME may be a pattern such as `prefill-*`) -> (pattern, seconds)."""
    pattern, sep, raw = spec.partition("=")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not sep or not pattern.strip() or not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise SettingError(f"--timeout {spec!r} is not accepted: use STEP=SECONDS with SECONDS > 0 and "
                           f"<= {MAX_SECONDS}, for example prefill-*=1200 or chat-tiny=600.")
    return pattern.strip(), seconds


def check_timeout_patterns(cfg: LadderConfig) -> None:
    """Refuse a `--timeout` pattern that names no step (a typo would silently keep the default)."""
    names = [s.name for s in build_ladder(replace(cfg, timeouts=()))]
    for pattern, _ in cfg.timeouts:
        if not fnmatch.filter(names, pattern):
            raise SettingError(f"--timeout {pattern!r} matches no step; the steps are: {', '.join(names)}.")
