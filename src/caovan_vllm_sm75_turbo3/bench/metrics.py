"""MTP acceptance from the server's Prometheus counters, as deltas over the bench run.

vLLM exports the counters per engine (labels `engine`, `model_name`); every label set is summed.
Only exact names count: `..._accepted_tokens_per_pos_total` is another metric.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..warmup.client import Deadline, ServerClient, StepError

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFT = "vllm:spec_decode_num_draft_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
COUNTERS = (ACCEPTED, DRAFT, DRAFTS)
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
    """The spec-decode counters from GET /metrics; None when the server has no readable /metrics."""
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
