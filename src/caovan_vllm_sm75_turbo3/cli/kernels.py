"""`caovan-sm75-kernels check`: compile every allowlisted Turbo kernel for sm_75, plain and turbo.

No GPU needed. The kernels come from the installed packages the allowlist names (vLLM's FLA
ops), compiled at the check shapes of the allowlist for `GPUTarget("cuda", 75, 32)`. Exit code
1 when any build misses its numbers (a regression), 0 when all pass.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .. import __version__
from .common import OneLineParser, print_json, run_cli

PROG = "caovan-sm75-kernels"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Offline checks of the Turbo kernels (Turing tensor cores for allowlisted Triton kernels).")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    check = sub.add_parser(
        "check", help="compile every allowlisted kernel for sm_75, plain and turbo, and judge the numbers",
        description="Compile every allowlisted kernel and config for sm_75 (no GPU needed), plain Triton "
                    "and through the turbo rewrite; print shared memory (<= 65536 bytes), registers, spill "
                    "bytes (must be 0 for turbo), mma.sync and fp32 FMA counts (turbo: mma present, at most "
                    "5% of the plain build's FMAs), and pass/fail.",
        epilog="Exit codes: 0 all pass, 1 a build misses its numbers, 2 bad input or kernels not importable.")
    check.add_argument("--json", action="store_true",
                       help="print a JSON list, one object per kernel, config and build")
    check.add_argument("--kernel", metavar="NAME", action="append",
                       help="only this Triton function (repeatable), e.g. chunk_fwd_kernel_o")
    return p


def _cfg(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def _num(v: object) -> str:
    return "-" if v is None else str(v)


def print_table(rows: list, rejected: list) -> None:
    head = f"{'kernel':<48} {'config':<26} {'build':<6} {'shared':>7} {'regs':>5} {'spill':>7} {'mma':>5} {'fma':>6}  ok"
    print(head)
    for r in rows:
        print(f"{r.kernel:<48} {_cfg(r.config):<26} {r.build:<6} {_num(r.shared_bytes):>7} {_num(r.registers):>5} "
              f"{_num(r.spill_bytes):>7} {_num(r.mma_count):>5} {_num(r.fma_count):>6}  "
              f"{'PASS' if r.ok else 'FAIL'}{'' if r.ok else ': ' + '; '.join(r.problems)}")
    bad = sum(1 for r in rows if not r.ok)
    print(f"{len(rows)} builds, {bad} failing")
    for rej in rejected:
        print(f"not allowlisted: {rej['name']}: {rej['reason']}")


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.command != "check":
        build_parser().print_help()
        return 2
    from ..errors import CaovanError
    from ..kernels.turbo.allowlist import load_allowlist
    from .turbo_sources import check_kernel, resolve, unlisted_specs

    allow = load_allowlist()
    entries = [e for e in allow.kernels if not args.kernel or e.name in args.kernel]
    if args.kernel and len(entries) != len(set(args.kernel)):
        known = ", ".join(e.name for e in allow.kernels)
        raise CaovanError(f"--kernel {', '.join(args.kernel)}: not all are allowlisted; allowlisted: {known}")
    rows, notes = [], []
    for e in entries:
        kernel = resolve(e)
        rows += check_kernel(kernel)
        notes += [{"name": f"{e.name} ({spec})", "reason": "pinned config not on the allowlist: builds plain"}
                  for spec in unlisted_specs(kernel)]
    if args.json:
        print_json([r.to_dict() for r in rows], indent=1)
    else:
        print_table(rows, notes + (list(allow.rejected) if not args.kernel else []))
    return 0 if all(r.ok for r in rows) else 1


def entry() -> None:
    """Console-script entry point."""
    raise SystemExit(run_cli(PROG, main))


if __name__ == "__main__":
    entry()
