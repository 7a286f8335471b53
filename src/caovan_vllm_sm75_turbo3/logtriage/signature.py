"""One known log message as data: how to spot it, whether it is harmless or fatal, its cause and fix
(the entries are in known_start.py and known_engine.py; signatures.py puts them in order)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

CONTEXT_LINES = 80


class Rule(str, enum.Enum):
    """How a match is judged."""

    FATAL = "fatal"            # the server cannot serve after this
    WARNING = "warning"        # it serves, but slower or degraded, or the log does not say how it ended
    HARMLESS = "harmless"      # looks alarming, is not
    UNTIL_READY = "until-ready"  # harmless if the server answers afterwards, fatal if it fails afterwards


class Role(str, enum.Enum):
    """Where a fatal match stands in the chain of events, for picking "the first real failure"."""

    CAUSE = "cause"              # a root cause in itself
    SYMPTOM = "symptom"          # a sign of trouble whose cause is usually another message
    CONSEQUENCE = "consequence"  # what a failure elsewhere leads to (engine dead, HTTP 500)


@dataclass(frozen=True)
class Wording:
    """How one release range of vLLM words a message: `text` is one literal piece of the message as
    its source writes it (no format fields), found in `source` of every release in `releases`
    ("0.21-0.34"); the serve, full and vllm034 test lanes check it in the vLLM they have."""

    text: str
    releases: str
    source: str


@dataclass(frozen=True)
class Signature:
    """One known message.

    A line matches when it contains one of `needles` (plain substrings, checked first because it is
    fast) and, if `confirm` is given, that regex also matches; its named groups and those of
    `extract` (which need not match) become details.
    `error_context`: count it only on an error/warning line or inside a traceback (for names that
    also appear in normal status lines). `context`: the match is this signature only if one of these
    substrings is within `CONTEXT_LINES` lines around it; otherwise it is `otherwise`.
    `fixes_by_phase` refines `fix` by the start-up phase the failure happened in. `shown` is how the
    table in docs/logtriage.md describes the message when the needles are only a prefilter.
    A line is counted for the first signature in SIGNATURES that matches it, so order matters.
    """

    id: str
    title: str
    needles: tuple[str, ...]
    rule: Rule
    role: Role
    cause: str
    fix: str
    confirm: re.Pattern[str] | None = None
    extract: re.Pattern[str] | None = None
    error_context: bool = False
    context: tuple[str, ...] = ()
    otherwise: str | None = None
    fixes_by_phase: dict[str, str] = field(default_factory=dict)
    shown: str = ""
    wordings: tuple[Wording, ...] = ()   # vLLM's own wordings of the message, by release; each is a needle too

    def __post_init__(self) -> None:
        extra = tuple(w.text for w in self.wordings if w.text not in self.needles)
        if extra:
            object.__setattr__(self, "needles", self.needles + extra)

    def matches(self, text: str) -> dict[str, str] | None:
        """The details of a match in `text` ({} when it has none), or None."""
        if not any(n in text for n in self.needles):
            return None
        details: dict[str, str] = {}
        for pattern, required in ((self.confirm, True), (self.extract, False)):
            if pattern is None:
                continue
            m = pattern.search(text)
            if m is None:
                if required:
                    return None
                continue
            details.update({k: v for k, v in m.groupdict().items() if v is not None})
        return details


WARMUP_FIX = ("Let the first start finish, then run `caovan-sm75-warmup --api-base http://127.0.0.1:8000 "
              "--model NAME` before sending real traffic (it does all first-request JIT in a controlled "
              "ladder). Start through `caovan-vllm-serve`, which raises the cold-start timeouts to "
              "CAOVAN_EXECUTE_TIMEOUT_S (1800 s); with plain `vllm serve` set "
              "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1800 yourself.")
GDN_FIX = ("Set CAOVAN_GDN_LEGACY_DISABLE=1 (or --additional-config '{\"caovan_gdn_legacy_disable\":true}') "
           "and restart: vLLM's own GDN prefill is used instead of the legacy SM75 path "
           "(the banner then says gdn_legacy=disabled-by-user). Please report the log.")
SAMPLER_FIX = ("Keep the FlashInfer sampler guard on: CAOVAN_FLASHINFER_SAMPLER=guard (the default of "
               "`caovan-vllm-serve`; it sets VLLM_USE_FLASHINFER_SAMPLER=0 on SM75), or with plain "
               "`vllm serve` set VLLM_USE_FLASHINFER_SAMPLER=0. CAOVAN_FLASHINFER_SAMPLER=probe keeps the "
               "sampler only where its test build works.")
