"""`caovan-sm75-doctor`: the environment report, without starting anything."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .. import __version__
from ..config import Settings, load_settings, specs
from ..errors import CaovanError
from ..policy.banner import header
from ..policy.checks import CheckResult, Status, rollup, run_checks, sm75_line
from ..runtime.facts import Facts
from ..runtime.model import ModelFacts, read_model_arg
from ..runtime.probe import load_facts
from ..runtime.ray_cluster import RayCluster, read_cluster
from ..textsafe import redact_tree, safe
from .common import json_text, OneLineParser, print_json, run_cli

PROG = "caovan-sm75-doctor"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Report whether this machine can serve vLLM on Turing (SM75) GPUs, what is wrong "
                    "and how to fix it. Starts nothing and never creates a CUDA context.",
        epilog="Exit codes: 0 runtime=PASS, 1 runtime=WARN, 2 runtime=FAIL or bad input. "
               "With --log: 0 clean or only harmless messages, 1 warnings only (degraded, or a wait "
               "the log does not resolve), 2 a fatal failure, or a log that cannot be read.")
    p.add_argument("--facts", metavar="FILE",
                   help="read machine facts from this JSON file instead of probing (also CAOVAN_FACTS)")
    p.add_argument("--model", metavar="PATH", help="model directory: also check its checkpoint size")
    p.add_argument("--json", action="store_true", help="print one JSON object (report, checks and facts)")
    p.add_argument("--log", metavar="FILE",
                   help="instead of the machine report, explain a vLLM server log (- reads standard input): "
                        "the first real failure, its likely cause and the fix")
    p.add_argument("--ray", metavar="ADDRESS", nargs="?", const="auto",
                   help="also list the nodes of a running Ray cluster (default address: auto, the cluster this "
                        "machine is part of); connects, starts nothing")
    p.add_argument("--settings", action="store_true",
                   help="also show every CAOVAN_* setting with its value and where it came from")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    return p


def settings_rows(settings: Settings) -> list[dict[str, object]]:
    """Each setting's variable, value and source, for the report."""
    return [{"variable": s.env_var, "value": getattr(settings, s.name), "source": settings.source(s.name)}
            for s in specs()]


def report(facts: Facts, results: list[CheckResult], settings: Settings, with_settings: bool,
           model: ModelFacts | None = None) -> dict:
    """The doctor's JSON report (`model_notes`: what `--model` could not read)."""
    status = rollup(results)
    out: dict[str, object] = {
        "plugin_version": __version__, "runtime": status.value, "sm75": sm75_line(facts),
        "exit_code": status.exit_code, "checks": [r.to_dict() for r in results],
        "warnings": list(settings.warnings), "facts": facts.to_dict()}
    if model is not None:
        out["model_notes"] = list(model.notes)
    if with_settings:
        out["settings"] = settings_rows(settings)
    return out


def print_text(facts: Facts, results: list[CheckResult], settings: Settings, with_settings: bool,
               model: ModelFacts | None = None) -> None:
    """The human report. Every string that may come from a file (GPU and model names, notes) is
    printed literally: a rich Text (no markup) in tables, markup=False in lines, and no :emoji:
    codes anywhere; markup is used only in our own constant text."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 110)
    status = rollup(results)
    for line in (header(), f"runtime={status.value}", f"sm75={sm75_line(facts)}"):
        console.print(line, markup=False)
    if facts.source != "probe":
        console.print(f"facts={safe(facts.source)}", markup=False)
    if not facts.gpus:
        console.print("[bold]No NVIDIA GPU is visible on this machine: it cannot serve with vLLM here.[/bold]")
    colour = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "red"}
    table = Table(show_lines=False)
    for col in ("check", "status", "detail", "remedy"):
        table.add_column(col, overflow="fold")
    for r in results:
        table.add_row(Text(r.name), Text(r.status.value, style=colour[r.status]), Text(safe(r.detail)),
                      Text(safe(r.remedy)))
    console.print(table)
    v = facts.versions
    console.print(safe(f"python {v.python or '-'}  torch {v.torch or '-'}  triton {v.triton or '-'}  "
                       f"vllm {v.vllm or '-'}  flashinfer {v.flashinfer or '-'}  driver {v.driver or '-'}"), markup=False)
    for note in [*facts.notes, *(f"model: {n}" for n in (model.notes if model else []))]:
        console.print(f"note: {safe(note)}", markup=False)
    for w in settings.warnings:
        console.print(f"warning: {safe(w)}", markup=False)
    if with_settings:
        st = Table(title="settings")
        for col in ("variable", "value", "source"):
            st.add_column(col)
        for row in settings_rows(settings):
            st.add_row(*(Text(safe(row[k])) for k in ("variable", "value", "source")))
        console.print(st)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.log is not None:
        return triage_log(args)
    settings = load_settings(os.environ, None, {"facts": args.facts})
    facts = load_facts(settings.facts)
    model = read_model_arg(args.model, os.environ) if args.model else None
    results = run_checks(facts, model)
    cluster = read_cluster(args.ray) if args.ray else None
    if args.json:
        out = report(facts, results, settings, args.settings, model)
        if cluster is not None:
            out["ray"] = cluster.to_dict()
        print_json(out)
    else:
        print_text(facts, results, settings, args.settings, model)
        if cluster is not None:
            print("\n".join(ray_lines(cluster)))
    return rollup(results).exit_code


def ray_lines(cluster: RayCluster) -> list[str]:
    """The Ray cluster's nodes, one line each (`ray:` first)."""
    if cluster.error:
        return [safe(f"ray: {cluster.error}")]
    alive = [n for n in cluster.nodes if n.alive]
    lines = [f"ray: {len(alive)} of {len(cluster.nodes)} node(s) alive at {safe(cluster.address)}"]
    for n in cluster.nodes:
        gpus = f"{n.gpus:g} GPU(s)" + (f" ({safe(n.accelerator)})" if n.accelerator else "")
        lines.append(f"ray: node {safe(n.node_id[:8])} {safe(n.address)} {'alive' if n.alive else 'dead'}, "
                     f"{gpus}, {n.cpus:g} CPU(s)")
    if len({(n.gpus, n.accelerator) for n in alive}) > 1:
        lines.append("ray: the nodes differ in GPUs: each node's workers check themselves against the head at "
                     "start (one line each in vLLM's log); tensor parallel across different GPUs runs at the slowest")
    return lines


def triage_log(args: argparse.Namespace) -> int:
    """`--log FILE|-`: the log triage instead of the machine report."""
    from ..logtriage.render import render_text
    from ..logtriage.triage import triage_path

    if args.facts or args.model or args.settings:
        raise CaovanError("--log reads a log only: drop --facts, --model and --settings")
    result = triage_path(args.log)
    print(json_text(redact_tree(result.to_dict())) if args.json else render_text(result))
    return result.exit_code


def entry() -> int:
    """Console-script entry point."""
    return run_cli(PROG, main)


if __name__ == "__main__":
    sys.exit(entry())
