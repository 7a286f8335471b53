"""The server's own figures from its Prometheus page, as deltas over the bench run: MTP acceptance,
and TTFT, decode speed, tokens and prefix-cache hits to print beside ours.

vLLM exports the counters per engine (labels `engine`, `model_name`); every label set is summed.
Only exact names count: `..._accepted_tokens_per_pos_total` is another metric. Names as in
vllm/v1/metrics/loggers.py (0.21-0.34): histograms export `_sum` and `_count` series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..server_api.client import ServerClient
from ..server_api.transport import Deadline, StepError

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFT = "vllm:spec_decode_num_draft_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
ITL_SUM = "vllm:inter_token_latency_seconds_sum"
ITL_COUNT = "vllm:inter_token_latency_seconds_count"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
COUNTERS = (ACCEPTED, DRAFT, DRAFTS, TTFT_SUM, TTFT_COUNT, ITL_SUM, ITL_COUNT, PROMPT_TOKENS, GENERATION_TOKENS,
            PREFIX_HITS, PREFIX_QUERIES)
_METRICS_TIMEOUT_S = 10.0


def parse_counters(text: str, names: tuple[str, ...] = COUNTERS) -> dict[str, float]:
    """The sum over label sets of each metric in `names` found in a Prometheus text page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        name = line[:brace] if brace >= 0 else line.split(" ", 1)[0]
        if name not in names:
            continue
        rest = line[line.rfind("}") + 1:] if brace >= 0 else line[len(name):]
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if math.isfinite(value):
            out[name] = out.get(name, 0.0) + value
    return out


def read_counters(client: ServerClient) -> dict[str, float] | None:
    """The counters we read (COUNTERS) from GET /metrics; None when the server has no readable /metrics."""
    try:
        reply = client.get("/metrics", Deadline.after(_METRICS_TIMEOUT_S))
    except StepError:
        return None
    if reply.status_code != 200:
        return None
    return parse_counters(reply.content.decode("utf-8", "replace"))


@dataclass(frozen=True)
class Acceptance:
    """Draft tokens proposed and accepted during the run; `rate` = accepted / draft."""

    accepted: float
    draft: float
    drafts: float | None  # speculation steps; None when the server does not export them

    @property
    def rate(self) -> float:
        return self.accepted / self.draft

    def to_dict(self) -> dict[str, Any]:
        """JSON form: rate, the deltas, and accepted tokens per speculation step when known."""
        per_step = self.accepted / self.drafts if self.drafts else None
        return {"rate": round(self.rate, 4), "accepted_tokens": self.accepted, "draft_tokens": self.draft,
                "accepted_per_step": None if per_step is None else round(per_step, 3)}


def acceptance(before: Mapping[str, float] | None, after: Mapping[str, float] | None) -> Acceptance | None:
    """The run's acceptance from two counter readings; None without counters or without drafts in between."""
    if before is None or after is None or not all(k in before and k in after for k in (ACCEPTED, DRAFT)):
        return None
    draft = after[DRAFT] - before[DRAFT]
    accepted = after[ACCEPTED] - before[ACCEPTED]
    if draft <= 0 or accepted < 0:  # no speculation during the run, or the server restarted
        return None
    drafts = after[DRAFTS] - before[DRAFTS] if DRAFTS in before and DRAFTS in after else None
    return Acceptance(accepted, draft, drafts if drafts and drafts > 0 else None)


def delta(before: Mapping[str, float] | None, after: Mapping[str, float] | None, name: str) -> float | None:
    """How much counter `name` grew between two readings; None when either lacks it or it fell (a restart)."""
    if before is None or after is None or name not in before or name not in after:
        return None
    grown = after[name] - before[name]
    return grown if grown >= 0 else None


def server_figures(before: Mapping[str, float] | None, after: Mapping[str, float] | None) -> dict[str, Any] | None:
    """What the server itself measured over the run: requests (TTFT observations), mean TTFT, decode
    tok/s per stream (1 / mean inter-token latency), prompt and generated tokens, prefix-cache hits.
    None when the server has no readable /metrics or served no request in between."""
    requests = delta(before, after, TTFT_COUNT)
    if not requests:
        return None
    ttft_sum = delta(before, after, TTFT_SUM)
    itl_sum, itl_count = delta(before, after, ITL_SUM), delta(before, after, ITL_COUNT)
    return {
        "requests": int(requests),
        "ttft_s": None if ttft_sum is None else round(ttft_sum / requests, 4),
        "decode_tok_s": round(itl_count / itl_sum, 2) if itl_sum and itl_count else None,
        "prompt_tokens": delta(before, after, PROMPT_TOKENS),
        "generation_tokens": delta(before, after, GENERATION_TOKENS),
        "prefix_cache_hits": delta(before, after, PREFIX_HITS),
        "prefix_cache_queries": delta(before, after, PREFIX_QUERIES),
    }
