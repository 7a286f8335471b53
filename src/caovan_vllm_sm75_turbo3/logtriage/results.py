"""What a triage finds, as values: each known message (Finding), our own status lines
(CaovanSummary), the first real failure (Failure) and the whole result with its verdict (Triage)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..logformat import GDN_DISABLED, GDN_UPSTREAM

# What our banner's values mean, for the summary (docs/design.md's status lines).
STATUS_MEANINGS: dict[tuple[str, str], str] = {
    ("runtime", "PASS"): "our runtime checks passed",
    ("runtime", "WARN"): "a runtime check warned (caovan-sm75-doctor says which)",
    ("runtime", "FAIL"): ("a check of our plugin failed (caovan-sm75-doctor says which): caovan-vllm-serve stops "
                          "where an SM75 GPU is visible; elsewhere nothing of ours applies"),
    ("flashinfer_sampler", "disabled-sm75-guard"): "FlashInfer sampler off by the SM75 guard (PyTorch sampler)",
    ("post_start_warmup", "disabled-default"): "no automatic warmup: run caovan-sm75-warmup after start",
    ("gdn_legacy", GDN_DISABLED): "vLLM's own GDN prefill kept (CAOVAN_GDN_LEGACY_DISABLE=1)",
    ("gdn_legacy", GDN_UPSTREAM): "vLLM's own GDN prefill (ours is not active)",
    ("turbo3", "active"): "our accelerated SM75 path is active",
    ("turbo3", "inactive"): "our accelerated SM75 path is not active (guards only)",
}



@dataclass
class Finding:
    """Every line of one known message, judged."""

    id: str
    title: str
    status: str                 # fatal | warning | harmless
    role: str
    first_line: int
    last_line: int
    count: int
    text: str                   # the first matching line, cleaned
    process: str | None
    cause: str
    fix: str
    details: dict[str, str] = field(default_factory=dict)
    phase: str | None = None
    note: str = ""              # why this status (for messages judged by what follows them)

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "title": self.title, "status": self.status, "role": self.role,
                "first_line": self.first_line, "last_line": self.last_line, "count": self.count,
                "text": self.text, "process": self.process, "phase": self.phase, "details": self.details,
                "note": self.note, "cause": self.cause, "fix": self.fix}


@dataclass
class CaovanSummary:
    """Our own status lines, as found in the log."""

    version: str | None = None
    line: int | None = None
    banners: int = 0
    status: dict[str, str] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)      # the banner's non-PASS `check ...` lines
    warmup: str | None = None
    warmup_line: int | None = None
    processes: int = 0                                   # worker lines: guards applied in a process
    inactive_processes: int = 0                          # worker lines: nothing of ours applies there
    states: dict[str, int] = field(default_factory=dict)  # GDN prefill / turbo state line -> count

    def meanings(self) -> dict[str, str]:
        """A plain-words reading of each status value we know."""
        out = {k: STATUS_MEANINGS[(k, v)] for k, v in self.status.items() if (k, v) in STATUS_MEANINGS}
        if m := re.fullmatch(r"(\d+)/(\d+)", self.status.get("sm75", "")):
            n, total = int(m.group(1)), int(m.group(2))
            out["sm75"] = (f"{n} of {total} visible GPUs are Turing (SM75)" if n else
                           "no Turing GPU visible: the plugin stays inactive")
        if "gdn_legacy" in self.status and "gdn_legacy" not in out:
            out["gdn_legacy"] = f"GDN prefill path: {self.status['gdn_legacy']}"
        return out

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "line": self.line, "banners": self.banners, "status": self.status,
                "meanings": self.meanings(), "checks": self.checks, "warmup": self.warmup,
                "warmup_line": self.warmup_line, "processes": self.processes,
                "inactive_processes": self.inactive_processes, "states": self.states}


@dataclass
class Failure:
    """The first real failure: a known cause, or the first unknown exception when the engine died."""

    line: int
    text: str
    id: str
    cause: str
    fix: str

    def to_dict(self) -> dict[str, object]:
        return {"line": self.line, "text": self.text, "id": self.id, "cause": self.cause, "fix": self.fix}


@dataclass
class Triage:
    """The result: what the log shows, ordered by importance."""

    source: str
    lines: int
    vllm_version: str | None
    ready_line: int | None
    http_ok: int
    http_error: int
    caovan: CaovanSummary
    first_failure: Failure | None
    findings: list[Finding]

    @property
    def verdict(self) -> str:
        """fatal | undecided (a start the log does not finish) | warning | harmless-only | clean."""
        statuses = {f.status for f in self.findings}
        if "fatal" in statuses:
            return "fatal"
        if any(f.id == "start-undecided" for f in self.findings):
            return "undecided"
        if "warning" in statuses:
            return "warning"
        return "harmless-only" if statuses else "clean"

    @property
    def exit_code(self) -> int:
        """2 fatal, 1 undecided or warning (degraded, or not decided by the end of the log), 0 otherwise."""
        return {"fatal": 2, "undecided": 1, "warning": 1}.get(self.verdict, 0)

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "lines": self.lines, "verdict": self.verdict,
                "exit_code": self.exit_code, "vllm_version": self.vllm_version,
                "ready_line": self.ready_line, "http_ok": self.http_ok, "http_error": self.http_error,
                "caovan": self.caovan.to_dict(),
                "first_failure": self.first_failure.to_dict() if self.first_failure else None,
                "findings": [f.to_dict() for f in self.findings]}
