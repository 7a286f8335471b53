"""`caovan-sm75-bench --prefix-probe`: does this server's prefix cache hit?

One long prompt, sent twice, with the server's prefix-cache counters read around each request.
The second request should find most of the prompt cached (vLLM caches whole blocks) and start
faster. On hybrid GDN models with MTP, prefix caching is known to lose its hits silently (vLLM
#54360 and #53504; vLLM-2080Ti-Definitive #149): the counters say so where the speed alone
would not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..server_api.client import ServerClient
from ..server_api.transport import StepError
from .measure import Bench, BenchConfig, BenchFailed
from .metrics import PREFIX_HITS, PREFIX_QUERIES, delta, read_counters

OUTPUT_TOKENS = 4
HIT_SHARE = 0.5   # a repeat that finds at least half its prompt cached is a hit (vLLM caches whole blocks)
UPSTREAM = ("on hybrid GDN models with MTP this is a known upstream problem (vLLM #54360, #53504; "
            "vLLM-2080Ti-Definitive #149); check --enable-prefix-caching and, for GDN models, "
            "--mamba-cache-mode align")


@dataclass(frozen=True)
class PrefixProbe:
    """The two requests as the server counted them."""

    prompt_tokens: int | None
    first_hit_tokens: float | None
    hit_tokens: float | None          # cached tokens the repeat found, from vllm:prefix_cache_hits_total
    queried_tokens: float | None
    cached_tokens: int | None         # usage.prompt_tokens_details.cached_tokens of the repeat, if reported
    ttft_first_s: float | None
    ttft_repeat_s: float | None

    @property
    def verdict(self) -> str:
        """hit | partial | miss | unknown (the server exports no prefix-cache counters)."""
        if self.hit_tokens is None or not self.prompt_tokens:
            return "unknown"
        if self.hit_tokens >= HIT_SHARE * self.prompt_tokens:
            return "hit"
        return "partial" if self.hit_tokens > 0 else "miss"

    @property
    def ttft_ratio(self) -> float | None:
        """The repeat's TTFT over the first's: well below 1 when the cache hits."""
        if not self.ttft_first_s or self.ttft_repeat_s is None:
            return None
        return self.ttft_repeat_s / self.ttft_first_s

    def lines(self) -> list[str]:
        """What a person reads."""
        ratio = "-" if self.ttft_ratio is None else f"{self.ttft_ratio:.2f}"
        hits = "unknown" if self.hit_tokens is None else f"{self.hit_tokens:.0f}"
        out = [f"prefix probe: prompt {self.prompt_tokens} tokens sent twice; the repeat found {hits} tokens in "
               f"the prefix cache (vllm:prefix_cache_hits_total); TTFT {self.ttft_first_s or 0:.3f} s then "
               f"{self.ttft_repeat_s or 0:.3f} s (ratio {ratio})",
               f"prefix cache: {self.verdict.upper()}"]
        if self.verdict == "miss":
            out.append("the repeat found nothing cached: prefix caching is off or lost its hits; " + UPSTREAM)
        elif self.verdict == "partial":
            out.append("the repeat found less than half its prompt cached; " + UPSTREAM)
        elif self.verdict == "unknown":
            out.append("the server exports no prefix-cache counters (GET /metrics): judge by the TTFT ratio")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "prompt_tokens": self.prompt_tokens, "hit_tokens": self.hit_tokens,
                "first_hit_tokens": self.first_hit_tokens, "queried_tokens": self.queried_tokens,
                "cached_tokens": self.cached_tokens, "ttft_first_s": self.ttft_first_s,
                "ttft_repeat_s": self.ttft_repeat_s,
                "ttft_ratio": None if self.ttft_ratio is None else round(self.ttft_ratio, 4)}


def run_prefix_probe(client: ServerClient, model: str, prompt_tokens: int, timeout_s: float,
                     say: Callable[[str], None]) -> PrefixProbe:
    """Send one prompt of about `prompt_tokens` tokens twice. Raises BenchFailed when a request fails."""
    bench = Bench(client, BenchConfig(model, (prompt_tokens,), OUTPUT_TOKENS, (1,), 1, timeout_s), say)
    prompt = bench.fit(f"{bench.nonce}-prefix-probe", prompt_tokens)
    body = bench.body(prompt.text, OUTPUT_TOKENS)
    readings = [read_counters(client)]
    replies = []
    try:
        for label in ("first", "repeat"):
            say(f"prefix probe: {label} request ({prompt_tokens} tokens)")
            replies.append(bench.send(body, f"prefix-probe-{label}"))
            readings.append(read_counters(client))
    except StepError as err:
        raise BenchFailed(client.redact(f"prefix probe: {err}")) from None
    first, repeat = replies
    return PrefixProbe(
        prompt_tokens=repeat.prompt_tokens if repeat.prompt_tokens is not None else
        prompt.tokens if prompt.exact else None,
        first_hit_tokens=delta(readings[0], readings[1], PREFIX_HITS),
        hit_tokens=delta(readings[1], readings[2], PREFIX_HITS),
        queried_tokens=delta(readings[1], readings[2], PREFIX_QUERIES),
        cached_tokens=repeat.cached_tokens, ttft_first_s=first.ttft_s, ttft_repeat_s=repeat.ttft_s)
