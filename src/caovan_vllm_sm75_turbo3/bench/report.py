"""The bench's result: one JSON object (`to_dict`), and the text a person reads (a rich table)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import IO, Any

from .measure import Run, spread
from .metrics import Acceptance

_METRICS = ("ttft_s", "prefill_tok_s", "decode_tok_s", "aggregate_tok_s")


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def summarize(run: Run) -> dict[str, Any]:
    """One row of `runs`: medians over every stream of every repeat (aggregate: over repeats), and
    each metric's spread (median, min, max, stdev, n)."""
    values = {
        "ttft_s": [s.ttft_s for s in run.samples if s.ttft_s is not None],
        "prefill_tok_s": [v for s in run.samples if (v := s.prefill_tok_s) is not None],
        "decode_tok_s": [v for s in run.samples if (v := s.decode_tok_s) is not None],
        "aggregate_tok_s": run.aggregate_tok_s(),
    }
    spreads = {k: spread(v) for k, v in values.items()}
    counted = [s.prompt_tokens for s in run.samples if s.prompt_tokens is not None]
    generated = [s.output_tokens for s in run.samples if s.output_tokens is not None]
    row: dict[str, Any] = {
        "concurrency": run.concurrency, "prompt_tokens": run.prompt_tokens,
        "prompt_tokens_counted": statistics.median(counted) if counted else None,
        "output_tokens": statistics.median(generated) if generated else None,
        "output_tokens_requested": run.output_tokens,
        "tokens_from": sorted({s.tokens_from or "uncounted" for s in run.samples}),
    }
    for k in _METRICS:
        sp = spreads[k]
        row[k] = _round(sp["median"], 4) if sp else None
    row["spread"] = {k: None if sp is None else {m: _round(v, 4) if isinstance(v, float) else v for m, v in sp.items()}
                     for k, sp in spreads.items()}
    return row


@dataclass
class BenchReport:
    """Everything the command prints."""

    server: dict[str, Any]
    settings: dict[str, Any]
    runs: list[dict[str, Any]]
    mtp: Acceptance | None
    profile: dict[str, Any]
    expected: dict[str, Any] | None
    causes: list[dict[str, str]] | None
    notes: list[str] = field(default_factory=list)
    server_metrics: dict[str, Any] | None = None   # the server's own /metrics over the run (metrics.server_figures)

    def to_dict(self) -> dict[str, Any]:
        """The `--json` object."""
        return {"server": self.server, "settings": self.settings, "runs": self.runs,
                "mtp_acceptance": self.mtp.to_dict() if self.mtp else None, "profile": self.profile,
                "expected": self.expected, "causes": self.causes, "notes": self.notes,
                "server_metrics": self.server_metrics}


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _range(sp: dict[str, Any] | None, fmt: str) -> str:
    return "" if not sp or sp["n"] < 2 else f"{format(sp['min'], fmt)}-{format(sp['max'], fmt)}"


def print_report(report: BenchReport, out: IO[str]) -> None:
    """The runs as a table, then acceptance, the comparison, the causes and the notes."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=out, highlight=False, width=None if out.isatty() else 120)
    title = f"{report.server.get('api_base')}  model={report.server.get('model')}"
    table = Table(title=Text(title))
    for col in ("prompt", "streams", "out", "TTFT s", "prefill tok/s", "decode tok/s", "(range)", "aggregate tok/s"):
        table.add_column(col, justify="right")
    for r in report.runs:
        sp = r["spread"]
        table.add_row(str(r["prompt_tokens"]), str(r["concurrency"]), _num(r["output_tokens"], ".0f"),
                      _num(r["ttft_s"], ".3f"), _num(r["prefill_tok_s"], ".0f"), _num(r["decode_tok_s"], ".1f"),
                      _range(sp["decode_tok_s"], ".1f"), _num(r["aggregate_tok_s"], ".1f"))
    console.print(table)
    for line in summary_lines(report):
        print(line, file=out)  # whole lines, never wrapped: people grep them


def _server_line(report: BenchReport) -> str:
    """The server's own figures over the run, beside ours (medians over every stream of the table)."""
    m = report.server_metrics
    if m is None:
        return "server /metrics over the run: none (no readable /metrics, or no request counted there)"
    ttft = [r["ttft_s"] for r in report.runs if r["ttft_s"] is not None]
    decode = [r["decode_tok_s"] for r in report.runs if r["decode_tok_s"] is not None]
    ours_ttft = f"; ours {statistics.median(ttft):.3f} s" if ttft else ""
    ours_decode = f"; ours {statistics.median(decode):.1f}" if decode else ""
    return (f"server /metrics over the run: {m['requests']} requests, TTFT mean {_num(m['ttft_s'], '.3f')} s"
            f"{ours_ttft}, decode {_num(m['decode_tok_s'], '.1f')} tok/s per stream (1 / mean inter-token "
            f"latency){ours_decode}, {_num(m['generation_tokens'], '.0f')} tokens generated")


def summary_lines(report: BenchReport) -> list[str]:
    """The lines under the table: MTP acceptance, the CUDA graphs asked for, the comparison, the likely
    causes, the notes."""
    lines = []
    mtp = report.mtp
    lines.append("MTP acceptance: " + (f"{mtp.rate:.1%} ({mtp.accepted:.0f} of {mtp.draft:.0f} draft tokens)"
                                       if mtp else "none (the server reports no speculative-decoding counters)"))
    graphs = report.server.get("cudagraph_mode")
    lines.append(f"CUDA graphs: {graphs or 'not known'} ({report.server.get('cudagraph_mode_how') or 'not read'})")
    lines.append(_server_line(report))
    lines.append(f"profile: {report.profile['why']}")
    exp = report.expected
    if exp:
        for key, unit in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill")):
            v = exp.get(key)
            if v:
                want = "-".join(f"{x:g}" for x in v["expected"]) if isinstance(v["expected"], list) \
                    else f"{v['expected']:g}"
                lines.append(f"{unit}: {v['measured']:.1f} tok/s against about {want} tok/s in the field "
                             f"({v['ratio']:.0%}; prompt {v['prompt_tokens']}, {v['concurrency']} stream(s))")
        lines.append(f"field numbers: {exp['source']}")
        if exp.get("gap"):
            lines.append("GAP: slower than the field report")
    if report.causes is not None:
        if report.causes:
            lines.append("likely causes (host checks):")
            lines += [f"  WARN {c['name']}: {c['detail']} -> {c['remedy']}" for c in report.causes]
        else:
            lines.append("host checks: no finding on this machine")
    lines += [f"note: {n}" for n in report.notes]
    return lines
