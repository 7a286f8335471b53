"""`caovan-sm75-cache`: show the JIT caches, and clean them safely."""

from __future__ import annotations

import argparse
import os
import select
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

from .. import __version__
from ..caches.clean import Outcome, Plan, Target, execute, plan_clean, vllm_processes
from ..caches.inventory import KEY, USER_SET, Inventory, inventory
from ..caches.key import env_key
from ..caches.layout import ENVS, cache_root
from ..config import load_settings
from ..errors import CaovanError
from ..runtime.probe import load_facts
from ..textsafe import shown
from .common import OneLineParser, print_json, run_cli

PROG = "caovan-sm75-cache"
OUTSIDE_FLAG = "--yes-outside-home-cache"
OUTSIDE_WHY = "a symlink points there, or it is the temp directory's per-user folder, which every HOME of yours shares"
OUTSIDE_WAIT_S = 120.0  # the second question on a terminal: no answer in time is no


def _s(value: object) -> str:
    """`value` printable on any terminal, on one line: bytes of a file name that are not UTF-8 shown as
    \\xNN, then control and invisible characters escaped (textsafe.shown)."""
    return shown(str(value).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))


def _common(p: argparse.ArgumentParser, suppress: bool) -> None:
    # On the subcommands the defaults are suppressed so that an option given before the
    # subcommand is not reset by it.
    d = {"default": argparse.SUPPRESS} if suppress else {}
    p.add_argument("--facts", metavar="FILE", help="runtime facts JSON instead of probing; decides the "
                   "current environment key (also CAOVAN_FACTS)", **d)
    p.add_argument("--cache-dir", metavar="DIR", help="our cache root (also CAOVAN_CACHE_DIR; default "
                   "${XDG_CACHE_HOME:-$HOME/.cache}/caovan-sm75-turbo3)", **d)
    p.add_argument("--json", action="store_true", help="print one JSON object", **d)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Show the JIT caches (ours, one directory per environment key, and the shared "
                    "defaults a plain vLLM run fills) and clean them safely.",
        epilog="Exit codes: 0 done; 1 something was not removed (in use, permissions, vanished, "
               "declined); 2 refused or bad input.")
    _common(p, suppress=False)
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{list,clean}")
    ls = sub.add_parser("list", help="every cache we know: size, files, last used, current or stale (default)",
                        description="List every cache we know: our environment keys (current or stale), "
                                    "the shared defaults and directories you set. Read-only.")
    _common(ls, suppress=True)
    cl = sub.add_parser(
        "clean", help="remove stale environment keys (--all: everything, shared defaults asked separately)",
        description="Remove stale environment keys (not the current one). --all also removes the current "
                    "key and, asked separately, empties the shared defaults (~/.cache/vllm, ~/.triton/cache, "
                    "...). Directories you set in an environment variable are never removed.")
    _common(cl, suppress=True)
    cl.add_argument("--all", action="store_true", dest="everything",
                    help="everything we own, the current key too, and the shared defaults (asked separately)")
    cl.add_argument("--no-shared", action="store_true", help="with --all: leave the shared defaults alone")
    cl.add_argument("--dry-run", action="store_true", help="show what would be removed; touch nothing")
    cl.add_argument("--yes", "-y", action="store_true",
                    help="do not ask (for scripts); without a terminal clean refuses unless --yes is given")
    cl.add_argument(OUTSIDE_FLAG, action="store_true", dest="yes_outside",
                    help="also empty shared defaults whose real path (symlinks resolved) lies outside your home "
                         "cache folders; without it they are asked for again on a terminal, else left alone")
    cl.add_argument("--force", action="store_true",
                    help="also remove caches a running server holds (and shared ones while vLLM runs)")
    return p


def _size(n: int, complete: bool = True) -> str:
    if not complete:
        return "at least " + _size(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return ""


def _when(t: datetime | None) -> str:
    return t.astimezone().strftime("%Y-%m-%d %H:%M") if t else "-"


def _print_list(inv: Inventory) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    current_dir = inv.root / ENVS / inv.current.name
    console.print(f"cache root: {_s(inv.root)} (environment keys in {_s(inv.root / ENVS)})", markup=False)
    console.print(f"current environment key: {_s(inv.current.name)}"
                  + ("" if current_dir.exists() else " (not created yet)"), markup=False)
    table = Table()
    for col in ("status", "name", "size", "files", "last used", "path / note"):
        table.add_column(col, overflow="fold")
    for e in inv.entries:
        status = e.status + (" (in use: " + ", ".join(map(str, e.users)) + ")" if e.in_use else "")
        if e.kind != KEY and e.current:
            status += ", current"
        # a key's path is <cache root>/envs/<name>, printed above; say only where a link points
        where = (f"-> {e.resolved}" if e.is_link else "") if e.kind == KEY else \
            str(e.path) + (f" -> {e.resolved}" if e.resolved else "") + ("" if e.exists else " (absent)")
        notes = [e.note] if e.note else []
        if e.stats.unreadable:
            notes.append(f"{len(e.stats.unreadable)} unreadable director{'y' if len(e.stats.unreadable) == 1 else 'ies'}"
                         f", e.g. {e.stats.unreadable[0]}")
        files = str(e.stats.files) if e.stats.complete else f"at least {e.stats.files}"
        cells = (status, e.name, _size(e.stats.size_bytes, e.stats.complete) if e.exists else "-",
                 files if e.exists else "-", _when(e.last_used), "\n".join(x for x in [where] + notes if x))
        table.add_row(*(Text(_s(c)) for c in cells))  # Text: a "[bold]" in a file name stays literal
    console.print(table)
    console.print(f"total: {_size(inv.total_bytes, all(e.stats.complete for e in inv.entries))}", markup=False)


def _target_line(t: Target) -> str:
    e = t.entry
    what = "empty" if t.names is None else "remove"
    real = f" -> {t.real_path}" if str(t.real_path) != str(e.path) else ""  # what really goes
    link = " (a symlink: only the link goes)" if e.is_link and t.names is not None else ""
    files = f"{'' if e.stats.complete else 'at least '}{e.stats.files} files"
    return _s(f"  {what} {e.path}{real}{link}  [{e.status}, {_size(e.stats.size_bytes, e.stats.complete)}, {files}]")


def _is_tty() -> bool:
    try:
        return bool(sys.stdin and sys.stdin.isatty())
    except (OSError, ValueError, AttributeError):
        return False


def _confirm(question: str, timeout_s: float | None = None) -> bool:
    """Ask on stderr, read one line from stdin; anything but y/yes is no. With `timeout_s`, no answer
    within that many seconds is no as well (a stdin without a file descriptor is read as it comes)."""
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        if timeout_s is not None:
            try:
                fd = sys.stdin.fileno()
            except (OSError, ValueError, AttributeError):
                fd = None
            if fd is not None and not select.select([fd], [], [], timeout_s)[0]:
                print(f"\nno answer within {timeout_s:.0f} s: no", file=sys.stderr, flush=True)
                return False
        answer = sys.stdin.readline()
    except (OSError, ValueError):
        return False
    return answer.strip().lower() in ("y", "yes")


def _choose(args: argparse.Namespace, plan: Plan) -> tuple[list[Target], list[str]]:
    """Ask (or take --yes / --yes-outside-home-cache for) each group; (chosen targets, declined groups)."""
    groups = {g: [t for t in plan.targets if t.group == g] for g in ("ours", "shared", "outside")}
    ours, shared, outside = groups["ours"], groups["shared"], groups["outside"]
    chosen: list[Target] = []
    declined: list[str] = []
    if not args.yes and not _is_tty():
        raise CaovanError("clean deletes files and stdin is not a terminal, so it cannot ask: pass --yes "
                          "to delete without asking, or --dry-run to see what would go")
    if ours:
        if args.yes or _confirm(f"Remove {len(ours)} of our cache entr{'y' if len(ours) == 1 else 'ies'} "
                                f"({_size(sum(t.entry.stats.size_bytes for t in ours))})?"):
            chosen += ours
        else:
            declined.append("ours")
    if shared:
        if args.yes or _confirm("The shared defaults above are also used by plain vLLM, torch, Triton "
                                "and CUDA runs and other tools. Empty them too?"):
            chosen += shared
        else:
            declined.append("shared")
    if outside:  # --yes does not cover these: a symlink took them out of the home cache folders, or the temp dir
        where = ", ".join(_s(t.real_path) for t in outside)
        if args.yes_outside or (_is_tty() and _confirm(
                f"Really empty {where}? It lies outside your home cache folders ({OUTSIDE_WHY})",
                timeout_s=OUTSIDE_WAIT_S)):
            chosen += outside
        else:
            declined.append("outside")
    return chosen, declined


def _clean(args: argparse.Namespace, inv: Inventory, env: Mapping[str, str]) -> int:
    shared_wanted = args.everything and not args.no_shared
    plan = plan_clean(inv, env, everything=args.everything, shared=shared_wanted, force=args.force,
                      vllm_pids=vllm_processes() if shared_wanted else [])
    chosen: list[Target] = []
    declined: list[str] = []
    if not args.json:
        _print_plan(plan, args.dry_run)
    if not args.dry_run and plan.targets:
        chosen, declined = _choose(args, plan)
    protect = [inv.root, inv.root / ENVS, Path(env.get("HOME") or os.path.expanduser("~"))]
    protect += [e.path for e in inv.entries if e.kind == USER_SET]
    protect += [e.path for e in inv.entries if e.kind == KEY and e.path not in {t.entry.path for t in chosen}]
    outcome = execute(chosen, env, protect=protect, force=args.force) if chosen else Outcome()
    code = 2 if plan.refused else (1 if (not outcome.ok or plan.busy or declined) else 0)
    if args.json:
        print_json({
            "dry_run": args.dry_run, "all": args.everything, "current_key": inv.current.name,
            "root": str(inv.root),
            "planned": [t.to_dict() for t in plan.targets],
            "skipped": [{"path": str(e.path), "reason": r} for e, r in plan.skipped],
            "in_use": [{"path": str(e.path), "reason": r} for e, r in plan.busy],
            "refused": [{"path": str(p), "reason": r} for p, r in plan.refused],
            "declined": declined, "outcome": outcome.to_dict(), "exit_code": code})
    elif not args.dry_run:
        _print_outcome(outcome, declined, [t for t in plan.targets if t.group == "outside"])
    return code


def _print_plan(plan: Plan, dry_run: bool) -> None:
    verb = "would" if dry_run else "will"
    if not plan.targets:
        print("nothing to clean")
    headers = {"ours": f"{PROG} {verb} remove our caches:",
               "shared": f"{PROG} {verb} empty these shared defaults (other tools may use them):",
               "outside": f"{PROG} {verb} empty these shared defaults only after a second yes: their real path "
                          f"lies outside your home cache folders ({OUTSIDE_FLAG} for scripts):"}
    for group, header in headers.items():
        targets = [t for t in plan.targets if t.group == group]
        if targets:
            print(header)
            for t in targets:
                print(_target_line(t))
    for e, reason in plan.skipped:
        print(_s(f"kept {e.path}: {reason}"))
    for e, reason in plan.busy:
        print(_s(f"NOT removing {e.path}: {reason}"))
    for path, reason in plan.refused:
        print(_s(f"refused {path}: {reason}"))
    if dry_run:
        print("dry run: nothing was touched")


def _print_outcome(out: Outcome, declined: list[str], outside: list[Target]) -> None:
    for p in out.removed:
        print(_s(f"removed {p}"))
    for p, reason in out.kept:
        print(_s(f"kept {p}: {reason}"))
    for p, reason in out.not_removed:
        print(_s(f"NOT removed {p}: {reason}"))
    for p, n, left, reason in out.partly_removed:
        more = f" and {n - 1} more" if n > 1 else ""
        print(_s(f"partly removed {p}: left {left} ({reason}){more}"))
    for p in out.vanished:
        print(_s(f"vanished {p}: removed by something else meanwhile"))
    for group in declined:
        if group != "outside":
            print(f"declined: nothing of {group} removed")
    for t in outside if "outside" in declined else []:
        print(_s(f"declined: {t.entry.path} -> {t.real_path} lies outside your home cache folders "
                 f"({OUTSIDE_WHY}); left alone (pass {OUTSIDE_FLAG}, or answer yes on a terminal)"))
    print(f"{out.files_removed} files, {_size(out.bytes_removed)} removed"
          + ("" if out.ok else "; some entries were NOT removed (see above)"))


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    env = os.environ
    settings = load_settings(env, None, {"facts": args.facts, "cache_dir": args.cache_dir})
    key = env_key(load_facts(settings.facts, env))
    root = Path(os.path.abspath(cache_root(settings.cache_dir, env)))
    inv = inventory(root, key, env, isolation=settings.cache_isolation)
    if args.command == "clean":
        return _clean(args, inv, env)
    if args.json:
        print_json(dict(inv.to_dict(), plugin_version=__version__))
    else:
        _print_list(inv)
    return 0


def entry() -> int:
    """Console-script entry point."""
    return run_cli(PROG, main)


if __name__ == "__main__":
    sys.exit(entry())
