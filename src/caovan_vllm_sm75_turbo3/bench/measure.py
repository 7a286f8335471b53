"""Timing streamed completions: TTFT, prefill and decode speed per stream, aggregate speed.

Tokens are counted by the server (the `usage` of the final chunk, which `stream_options.include_usage`
asks for, else POST /tokenize of the text), never by chunks: under speculative decoding one chunk
carries several tokens. Decode speed is the tokens after the first over the time after the first
(prefill excluded). Every prompt is fitted to its exact token length and starts with its own
nonce, so the prefix cache cannot make a prefill look fast.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..errors import CaovanError, SettingError
from ..server_api.client import Reply, ServerClient
from ..server_api.transport import Deadline, StepError
from ..server_api.prompts import FittedPrompt, PromptFitter, chat_messages, short_question

EXIT_RUN_FAILED = 1
SHORT_PROMPT = 128
DEFAULT_PROMPTS = (SHORT_PROMPT, 4096, 32768)
FALLBACK_CONCURRENCY = (1, 2)
_TOKENIZE_TIMEOUT_S = 60.0


class BenchFailed(CaovanError):
    """A bench request failed; `str()` names the run and the server's words. Exit 1."""

    exit_code = EXIT_RUN_FAILED


@dataclass(frozen=True)
class BenchConfig:
    """What to measure: every prompt length at every concurrency, `repeats` times each."""

    model: str
    prompt_tokens: tuple[int, ...]
    output_tokens: int
    concurrency: tuple[int, ...]
    repeats: int
    request_timeout_s: float


@dataclass(frozen=True)
class Sample:
    """One stream: its token counts (the server's) and timings."""

    prompt_tokens: int | None
    output_tokens: int | None
    ttft_s: float | None
    decode_s: float | None  # from the first to the last chunk that carried text
    tokens_from: str  # "usage", "tokenize" or "" (not countable)

    @property
    def prefill_tok_s(self) -> float | None:
        """Prompt tokens over the time to the first token."""
        if self.prompt_tokens is None or not self.ttft_s:
            return None
        return self.prompt_tokens / self.ttft_s

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first over the time after the first token."""
        if self.output_tokens is None or self.output_tokens < 2 or not self.decode_s:
            return None
        return (self.output_tokens - 1) / self.decode_s


@dataclass
class Run:
    """All repeats of one (prompt length, concurrency): every stream's sample, and per repeat the wall
    time from sending the first request to the end of the last stream with the tokens generated."""

    prompt_tokens: int
    concurrency: int
    output_tokens: int
    samples: list[Sample] = field(default_factory=list)
    repeats: list[tuple[float, int | None]] = field(default_factory=list)

    def aggregate_tok_s(self) -> list[float]:
        """Per repeat: all streams' generated tokens over the repeat's wall time."""
        return [tokens / wall for wall, tokens in self.repeats if tokens is not None and wall > 0]


def default_prompt_tokens(max_model_len: int | None, output_tokens: int) -> tuple[tuple[int, ...], str]:
    """Short, 4K and 32K prompts, each capped so that prompt + output fits max_model_len."""
    if max_model_len is None:
        return DEFAULT_PROMPTS, "the server did not say its max_model_len: prompts are not capped"
    room = max_model_len - output_tokens
    if room < 1:
        raise SettingError(f"--output-tokens {output_tokens} leaves no room for a prompt in the server's "
                          f"max_model_len {max_model_len}")
    lengths = tuple(sorted({min(n, room) for n in DEFAULT_PROMPTS}))
    capped = [n for n in DEFAULT_PROMPTS if n > room]
    note = f"prompts over max_model_len {max_model_len} - {output_tokens} output tokens capped at {room}" if capped \
        else ""
    return lengths, note


def default_concurrency(max_num_seqs: int | None, why: str) -> tuple[tuple[int, ...], str]:
    """1 and the server's max-num-seqs when it is known, else 1 and 2; the note says which."""
    if max_num_seqs is None:
        return FALLBACK_CONCURRENCY, f"concurrency 1 and 2: the server's --max-num-seqs is unknown ({why}); " \
                                     "pass --concurrency 1 N for yours"
    return tuple(sorted({1, max_num_seqs})), f"concurrency 1 and the server's --max-num-seqs {max_num_seqs} ({why})"


class Bench:
    """Sends the bench's requests through one client; `say(line)` reports progress."""

    def __init__(self, client: ServerClient, config: BenchConfig, say: Callable[[str], None]) -> None:
        self.client = client
        self.config = config
        self.say = say
        self.fitter = PromptFitter()
        self.nonce = secrets.token_hex(4)  # per bench: a second bench of the same server misses the cache too
        self.counted_by_tokenize = False

    def warm(self) -> None:
        """One short untimed request, so a cold server's first-request compile is not measured."""
        body = self.body(short_question(f"{self.nonce}-warm"), 2)
        self.send(body, "warm")

    def run_all(self) -> list[Run]:
        """Every prompt length at every concurrency, `repeats` times."""
        cfg = self.config
        runs = []
        for length in cfg.prompt_tokens:
            for concurrency in cfg.concurrency:
                run = Run(length, concurrency, cfg.output_tokens)
                for r in range(cfg.repeats):
                    self.say(f"prompt {length} tokens, {concurrency} at once, repeat {r + 1}/{cfg.repeats}")
                    self._repeat(run, r)
                runs.append(run)
        return runs

    def _repeat(self, run: Run, r: int) -> None:
        label = f"p{run.prompt_tokens}-c{run.concurrency}-r{r}"
        try:
            prompts = [self.fit(f"{self.nonce}-{label}-{i}", run.prompt_tokens) for i in range(run.concurrency)]
            start = time.monotonic()
            with ThreadPoolExecutor(max_workers=run.concurrency) as pool:
                futures = [pool.submit(self._stream, p, f"{label}:{self.nonce}:{i}") for i, p in enumerate(prompts)]
                samples = [f.result() for f in futures]
            wall = time.monotonic() - start
        except StepError as err:
            raise BenchFailed(self.client.redact(f"prompt {run.prompt_tokens} tokens, {run.concurrency} at once, "
                                                 f"repeat {r + 1}: {err}")) from None
        run.samples += samples
        counts = [s.output_tokens for s in samples]
        run.repeats.append((wall, None if None in counts else sum(c for c in counts if c is not None)))

    def fit(self, nonce: str, target: int) -> FittedPrompt:
        """A prompt of `target` tokens starting with `nonce` (fitted with the server's /tokenize)."""
        deadline = Deadline.after(self.config.request_timeout_s)
        return self.fitter.fit(nonce, target, partial(self._count, deadline))

    def _count(self, deadline: Deadline, messages: list[dict[str, str]]) -> int | None:
        limit = deadline if deadline.left() < _TOKENIZE_TIMEOUT_S else _TOKENIZE_TIMEOUT_S
        return self.client.tokenize({"model": self.config.model, "messages": messages}, limit)

    def body(self, text: str, max_tokens: int) -> dict[str, Any]:
        """A streamed chat request of exactly `max_tokens` generated tokens."""
        # ignore_eos: exactly max_tokens are generated, whatever the model would say. return_token_ids
        # (vLLM 0.21+): a chunk for every token, also those that decode to no text, so TTFT and decode
        # time are the tokens', not the first visible text's.
        return {"model": self.config.model, "messages": chat_messages(text), "max_tokens": max_tokens,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                "return_token_ids": True}

    def send(self, body: dict[str, Any], label: str) -> Reply:
        """One request under the bench's time limit, its id naming `label` in the server log."""
        return self.client.chat(body, Deadline.after(self.config.request_timeout_s), f"caovan-bench:{label}")

    def _stream(self, prompt: FittedPrompt, label: str) -> Sample:
        reply = self.send(self.body(prompt.text, self.config.output_tokens), label)
        out, source = reply.completion_tokens, "usage"
        if out is None:
            out, source = self._count_text(reply.text + reply.reasoning), "tokenize"
            self.counted_by_tokenize = self.counted_by_tokenize or out is not None
        prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None else \
            prompt.tokens if prompt.exact else None
        decode = None if reply.ttft_s is None or reply.last_token_s is None else reply.last_token_s - reply.ttft_s
        return Sample(prompt_tokens, out, reply.ttft_s, decode, source if out is not None else "")

    def _count_text(self, text: str) -> int | None:
        """The server's count of generated text, when the stream had no usage."""
        body = {"model": self.config.model, "prompt": text, "add_special_tokens": False}
        return self.client.tokenize(body, _TOKENIZE_TIMEOUT_S) if text else None


def spread(values: list[float]) -> dict[str, float | int] | None:
    """Median, min, max and standard deviation of `values`; None when there are none."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values)}
