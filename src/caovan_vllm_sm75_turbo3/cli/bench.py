"""`caovan-sm75-bench`: what a running vLLM server really decodes and prefills, compared with the field
report of the matched launch profile, with the host findings that explain a gap."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .. import __version__
from ..bench.measure import DEFAULT_PROMPTS
from ..errors import SettingError
from ..bench.plot import require_matplotlib, write_plot
from ..bench.report import print_report
from ..bench.runner import BenchOptions, run_bench, run_probe
from ..server_api.address import api_key_from, normalize_api_base
from .common import OneLineParser, print_json, run_cli, seconds, whole_number

PROG = "caovan-sm75-bench"
# Past these a value is a typo; they also bound prompt building and the thread pool.
MAX_TOKENS = 1 << 22
MAX_CONCURRENCY = 256
MAX_REPEATS = 100
MAX_SECONDS = 86400.0


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Measure a running vLLM server: TTFT, prefill tok/s, decode tok/s per stream (tokens "
                    "counted by the server, never by chunks) and aggregate tok/s per prompt length and "
                    "concurrency, MTP acceptance from /metrics; compare with the matched launch profile's "
                    "field numbers and, on the serving machine, list the host findings behind a gap.",
        epilog="Exit codes: 0 measured; 1 a request failed; 2 bad input (model not served, API key refused, "
               "--plot without matplotlib); 3 the server is not up within --wait. See docs/bench.md.")
    p.add_argument("--api-base", metavar="URL", required=True,
                   help="server address, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)")
    p.add_argument("--model", metavar="NAME", required=True, help="served model name (as --served-model-name)")
    p.add_argument("--api-key", metavar="KEY",
                   help="bearer key the server was started with (default: $VLLM_API_KEY, then $OPENAI_API_KEY)")
    p.add_argument("--prompt-tokens", metavar="N", nargs="+", action="extend", type=whole_number(8, MAX_TOKENS),
                   help="prompt lengths in tokens (default: " + ", ".join(map(str, DEFAULT_PROMPTS))
                        + ", capped by the server's max_model_len)")
    p.add_argument("--output-tokens", metavar="N", type=whole_number(2, MAX_TOKENS), default=256,
                   help="tokens generated per request (default: %(default)s)")
    p.add_argument("--concurrency", metavar="C", nargs="+", action="extend",
                   type=whole_number(1, MAX_CONCURRENCY),
                   help="streams at once (default: 1 and the server's --max-num-seqs when it can be read, "
                        "else 1 and 2)")
    p.add_argument("--repeats", metavar="R", type=whole_number(1, MAX_REPEATS), default=3,
                   help="repeats of each run; the spread is over them (default: %(default)s)")
    p.add_argument("--wait", type=seconds(MAX_SECONDS), default=10.0, metavar="SECONDS",
                   help="how long to wait for the server to answer (default: %(default)g)")
    p.add_argument("--timeout", type=seconds(MAX_SECONDS), default=900.0, metavar="SECONDS",
                   help="wall-clock limit of each request (default: %(default)g)")
    p.add_argument("--facts", metavar="FILE",
                   help="the serving machine's facts (caovan-sm75-doctor --json) instead of probing this one")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress goes to stderr)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="write decode tok/s against context length per concurrency as a PNG (needs the "
                        "[plot] extra: matplotlib)")
    p.add_argument("--prefix-probe", action="store_true",
                   help="instead of the speed runs: send one long prompt (the first --prompt-tokens, default "
                        "4096 capped by max_model_len) twice and report the prefix-cache hits the server counts "
                        "and the TTFT ratio (hybrid GDN models with MTP are known to lose their hits)")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    return p


def _say(line: str) -> None:
    print(f"[bench] {line}", file=sys.stderr, flush=True)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.plot and args.prefix_probe:
        raise SettingError("--plot draws the speed runs, and --prefix-probe runs none: give one of them")
    if args.plot:
        require_matplotlib()  # before any request: a missing extra is bad input
    api_base = normalize_api_base(args.api_base)
    api_key, key_source = api_key_from(args.api_key, os.environ)
    opts = BenchOptions(api_base=api_base, model=args.model, api_key=api_key,
                        prompt_tokens=tuple(sorted(set(args.prompt_tokens))) if args.prompt_tokens else None,
                        output_tokens=args.output_tokens,
                        concurrency=tuple(sorted(set(args.concurrency))) if args.concurrency else None,
                        repeats=args.repeats, wait_s=args.wait, request_timeout_s=args.timeout, facts=args.facts or "")
    if args.prefix_probe:
        server, probe = run_probe(opts, _say)
        if args.json:
            print_json({"server": server, "prefix_probe": probe.to_dict()})
        else:
            print("\n".join(probe.lines()))
        return 0
    report = run_bench(opts, _say)
    report.settings["api_key"] = key_source
    if args.plot:
        write_plot(report.runs, args.plot, f"{report.server['model']} at {report.server['api_base']}")
        _say(f"plot written to {args.plot}")
    if args.json:
        print_json(report.to_dict())
    else:
        print_report(report, sys.stdout)
    return 0


def entry() -> int:
    """Console-script entry point."""
    return run_cli(PROG, main)


if __name__ == "__main__":
    sys.exit(entry())
