"""The warmup report: per step status and latency, cold and warm, per server; and the one status line."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..textsafe import shown
from ..logformat import READY_LINE, warmup_failed_line

OK, FAILED, SKIPPED, NOT_RUN = "ok", "failed", "skipped", "not-run"
READINESS = "readiness"


MAX_REASON = 1000   # characters of a reason or note printed (a server may send megabytes)


@dataclass
class StepResult:
    """How one step went. `latency_s` is the wall time of the whole step (all its requests)."""

    name: str
    kind: str
    status: str
    latency_s: float | None = None
    prompt_tokens: int | None = None  # as the server counted it (usage), else our target
    prompt_tokens_exact: bool | None = None  # True: the length was fitted with POST /tokenize
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None
    concurrency: int = 1
    note: str = ""
    reason: str = ""


@dataclass
class ServerReport:
    """One server's warmup: readiness, the cold ladder and the warm pass."""

    api_base: str
    model: str | None = None
    max_model_len: int | None = None
    ready_after_s: float | None = None
    token_lengths: str = ""  # "exact" (POST /tokenize) or "estimated"
    steps: list[StepResult] = field(default_factory=list)
    warm: list[StepResult] = field(default_factory=list)
    failed_step: str | None = None
    reason: str = ""
    exit_code: int = 0

    @property
    def ok(self) -> bool:
        """Every step succeeded or was skipped with a note."""
        return self.failed_step is None

    def fail(self, step: str, reason: str, exit_code: int) -> None:
        """Record the first failure; later ones never overwrite it."""
        if self.failed_step is None:
            self.failed_step, self.reason, self.exit_code = step, shown(reason, MAX_REASON), exit_code

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, with cold/warm latency side by side for the steps run twice."""
        out = asdict(self)
        out["status"] = "READY" if self.ok else "FAILED"
        cold = {s.name: s.latency_s for s in self.steps}
        out["cold_vs_warm"] = [{"step": w.name, "cold_s": cold.get(w.name), "warm_s": w.latency_s}
                               for w in self.warm]
        return out


@dataclass
class WarmupReport:
    """The whole run over one or more servers (a fleet is warmed one server after another)."""

    servers: list[ServerReport]
    not_attempted: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> ServerReport | None:
        """The server that failed, if any (the run stops at the first failure)."""
        return next((s for s in self.servers if not s.ok), None)

    @property
    def exit_code(self) -> int:
        """0 when every server is ready, else the failed server's code."""
        bad = self.failed
        return bad.exit_code if bad else 0

    def status_line(self) -> str:
        """`[Caovan] warmup=READY`, or `[Caovan] warmup=FAILED step=<name> reason=<...>` on one line."""
        bad = self.failed
        if bad is None:
            return READY_LINE
        reason = " ".join(bad.reason.split())
        if len(self.servers) + len(self.not_attempted) > 1:
            reason += f" (server {bad.api_base})"
        return warmup_failed_line(bad.failed_step, reason)

    def to_dict(self) -> dict[str, Any]:
        """JSON report for `--json`."""
        return {"status": "READY" if self.failed is None else "FAILED", "line": self.status_line(),
                "exit_code": self.exit_code, "settings": self.settings,
                "servers": [s.to_dict() for s in self.servers], "not_attempted": self.not_attempted}
