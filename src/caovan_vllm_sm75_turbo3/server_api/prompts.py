"""Warmup prompt text and fitting a prompt to an exact token length. Pure: token counts come from a callback.

Every prompt starts with a per-run, per-step nonce: with prefix caching on, prompts that shared a
beginning would hit the cache and skip the very prefill shapes the ladder is meant to compile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ..errors import CaovanException

# Ordinary words; most are one token in common BPE vocabularies, some are two, which is why
# lengths are measured through /tokenize when the server has it.
WORDS = ("river", "stone", "light", "green", "table", "window", "garden", "morning", "paper", "music",
         "silver", "cloud", "bridge", "market", "winter", "forest", "letter", "simple", "orange", "harbor",
         "quiet", "number", "travel", "summer", "engine", "pencil", "mountain", "yellow", "station", "coffee",
         "island", "planet")
# Chat template and nonce overhead assumed when the server cannot count tokens.
ESTIMATED_OVERHEAD = 24
MAX_FIT_ROUNDS = 8

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def short_question(nonce: str) -> str:
    """A short question; the nonce keeps it out of the prefix cache."""
    return f"[{nonce}] In one sentence: why is the sea salty?"


def filler(nonce: str, n_words: int) -> str:
    """A prompt of `n_words` filler words after a nonce and a one-line instruction."""
    body = " ".join(WORDS[i % len(WORDS)] for i in range(n_words))
    return f"[{nonce}] Count the words below, then answer with one word.\n{body}"


def chat_messages(text: str) -> list[dict[str, str]]:
    """One user message."""
    return [{"role": "user", "content": text}]


@dataclass(frozen=True)
class FittedPrompt:
    """A prompt text and its length; `exact` when the server counted it (POST /tokenize)."""

    text: str
    tokens: int
    exact: bool


def fit_prompt(nonce: str, target: int, count: Callable[[str], int] | None) -> FittedPrompt:
    """The filler prompt whose token count (as `count` measures it) is `target`, or as close as it gets.

    `count(text)` returns the token count of the whole request (chat template included); None means
    the server cannot count, and the length is estimated at one token per word plus an overhead.
    A few rounds of secant steps converge because the count is close to linear in the words.
    """
    if count is None:
        n = max(1, target - ESTIMATED_OVERHEAD)
        return FittedPrompt(filler(nonce, n), n + ESTIMATED_OVERHEAD, exact=False)
    base = count(filler(nonce, 0))
    n = max(1, target - base)
    tried: dict[int, tuple[int, str]] = {}  # words -> (tokens, text)
    for _ in range(MAX_FIT_ROUNDS):
        text = filler(nonce, n)
        tokens = count(text)
        tried[n] = (tokens, text)
        if tokens == target:
            return FittedPrompt(text, tokens, exact=True)
        per_word = max((tokens - base) / n, 0.1)
        step = round((target - tokens) / per_word) or (1 if tokens < target else -1)
        n = max(1, n + step)
        if n in tried:  # oscillating around the target: two-token words overshoot by one
            break
    under = [v for v in tried.values() if v[0] < target]
    if under:  # close the last gap with one-token pads
        tokens, text = max(under)
        if target - tokens <= 4:
            padded = text + " a" * (target - tokens)
            padded_tokens = count(padded)
            if padded_tokens == target:
                return FittedPrompt(padded, padded_tokens, exact=True)
    tokens, text = min(tried.values(), key=lambda v: abs(v[0] - target))
    return FittedPrompt(text, tokens, exact=True)


class NoTokenize(CaovanException):
    """The server has no /tokenize endpoint: the fit falls back to an estimate (an internal signal)."""


class PromptFitter:
    """`fit_prompt` with the server's own counter (POST /tokenize) while it has one; after the first
    "no such endpoint" every later fit is an estimate. Shared by the warmup and the bench."""

    def __init__(self) -> None:
        self.tokenize_available: bool | None = None

    @property
    def token_lengths(self) -> str:
        """How prompt lengths were set: "exact" (measured by the server), "estimated", or "" (none yet)."""
        return {True: "exact", False: "estimated", None: ""}[self.tokenize_available]

    def fit(self, nonce: str, target: int,
            count_messages: Callable[[list[dict[str, str]]], int | None]) -> FittedPrompt:
        """The filler prompt of `target` tokens; `count_messages(messages)` is the server's count of a
        chat request, None when the server cannot count."""
        if self.tokenize_available is not False:
            try:
                return fit_prompt(nonce, target, partial(self._count, count_messages))
            except NoTokenize:
                pass
        return fit_prompt(nonce, target, None)

    def _count(self, count_messages: Callable[[list[dict[str, str]]], int | None], text: str) -> int:
        n = count_messages(chat_messages(text))
        if n is None:
            self.tokenize_available = False
            raise NoTokenize
        self.tokenize_available = True
        return n
