"""`caovan-vllm-serve MODEL [vLLM args]`: check, guard, isolate caches, print the banner, exec `vllm serve`.

Our own flags are taken out of the argument list wherever they appear; everything else
goes to vLLM exactly as typed. The process becomes vLLM (os.execvpe), so signals, exit
codes and logs are vLLM's own.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from ..caches.layout import hold_in_use
from ..errors import CaovanError
from ..launch import Prepared, apply_env, head_summary, plan_for_launcher, read_args
from ..policy.banner import banner_lines
from ..policy.plan import Plan
from ..policy.vllm_args import canonical
from ..textsafe import redact_argv, safe
from ..runtime.node import node_name
from .common import OneLineParser, print_json, run_cli

PROG = "caovan-vllm-serve"
# Our flags; a test checks that vLLM 0.21's `vllm serve` parser has none of them.
BOOL_FLAGS = ("--dry-run", "--json", "--help", "-h", "--version")
VALUE_FLAGS = ("--facts", "--profile", "--cache-dir")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG, allow_abbrev=False,
        usage=f"{PROG} MODEL [vLLM serve arguments] [--dry-run] [--json] [--facts FILE] "
              "[--profile NAME] [--cache-dir DIR]",
        description="Start vLLM's OpenAI server on Turing (SM75) GPUs: check the runtime, apply the SM75 "
                    "guards, give this environment its own JIT caches, print the status banner, then "
                    "exec `vllm serve MODEL [vLLM serve arguments]` with your arguments unchanged "
                    "(see `vllm serve --help` for those). Your own environment variables and "
                    "arguments always win.",
        epilog="Exit codes: --dry-run/--json 0, also when the plan says the launch would stop for "
               "runtime=FAIL or require-turbo3 (the dry run did its job), but 2 for bad input, including "
               "refused vLLM arguments (the plan is printed first, with the refusal); a launch exits 2 "
               "for bad input, runtime=FAIL (where an SM75 GPU is visible) or a require-turbo3 refusal "
               "(before vLLM starts); otherwise vLLM's own. Without a visible SM75 GPU nothing of ours "
               "applies: vLLM is started untouched.")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (environment changes with reasons, final argv) and exit; writes nothing")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object and exit (implies --dry-run)")
    p.add_argument("--facts", metavar="FILE",
                   help="plan with machine facts from this JSON file (caovan-sm75-doctor --json) instead of "
                        "probing this machine (also CAOVAN_FACTS)")
    p.add_argument("--profile", metavar="NAME",
                   help="launch profile: a name, auto (match this machine and the model directory) or "
                        "none (also CAOVAN_PROFILE); a profile fills only the vLLM arguments you did not give, "
                        "each with its reason (see docs/profiles.md)")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="root of the isolated JIT caches (also CAOVAN_CACHE_DIR; default "
                        "${XDG_CACHE_HOME:-$HOME/.cache}/caovan-sm75-turbo3)")
    return p


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate our flags (wherever they are) from vLLM's arguments, keeping each list's order."""
    ours: list[str] = []
    theirs: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, _ = token.partition("=")
        name = canonical(name) if name.startswith("--") else name
        if name in BOOL_FLAGS and eq:   # `--dry-run=true` must never reach vLLM and start a real launch
            raise CaovanError(f"{name} takes no value (got {token!r}): give {name} alone")
        if name in BOOL_FLAGS and _awaits_value(argv[i - 1] if i else ""):
            # `--additional-config --version`: the token is that option's value (where our settings
            # live), which its reader then refuses in one line; never our action run mid-argv.
            theirs.append(token)
        elif name in BOOL_FLAGS:
            ours.append(name)
        elif name in VALUE_FLAGS:
            if eq:
                ours.append(name + token[token.index("="):])
            else:
                ours.append(name)
                if i + 1 < len(argv):
                    ours.append(argv[i + 1])
                    i += 1
        else:
            theirs.append(token)
        i += 1
    return ours, theirs


def _awaits_value(previous: str) -> bool:
    """Whether `previous` is vLLM's --additional-config (or a dotted key of it) still without its value."""
    return previous.startswith("--additional-config") and "=" not in previous


def find_vllm() -> str:
    """The `vllm` command of this Python environment, else the one on PATH."""
    beside = Path(sys.executable).parent / "vllm"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("vllm")
    if not found:
        raise CaovanError("vLLM's `vllm` command was not found next to this Python or on PATH: "
                          "install vLLM (pip install vllm==0.21.0) into this environment.")
    return found


def _program() -> str | None:
    try:
        return find_vllm()
    except CaovanError:
        return None


def stop_reason(prepared: Prepared, program: str | None) -> str | None:
    """Why a launch must not start: the plan's reasons, (the plugin off) refused arguments, or no
    `vllm` command to exec."""
    stop = prepared.plan.stop_reason() or prepared.refused_args
    if program is None and stop is None:   # the first reason is enough: bad input is fixed first
        stop = ("vLLM's `vllm` command was not found next to this Python or on PATH: install vLLM "
                "(pip install vllm==0.21.0) into this environment")
    return stop


def plan_text(plan: Plan, program: str | None, stop: str | None) -> list[str]:
    """The dry-run report: the banner, then the final command and what a launch would do."""
    lines = banner_lines(plan)
    lines.append("argv: " + safe(shlex.join(redact_argv(plan.argv))))
    lines.append("vllm_program: " + safe(program or "not found"))
    if stop:
        lines.append(f"launch: would stop: {safe(stop)}")
    elif plan.failures:
        lines.append("launch: would exec vLLM, which is expected to fail: " + safe("; ".join(plan.failures)))
    elif plan.active and not plan.sm75_gpus:
        lines.append("launch: would exec vLLM untouched (no SM75 GPU visible: nothing of ours applies)")
    else:
        lines.append("launch: would exec vLLM with the environment above")
    lines.append("dry run: nothing was written and vLLM was not started")
    return lines


def main(argv: Sequence[str]) -> int:
    ours, theirs = split_argv(argv)
    opts = build_parser().parse_args(ours)
    args = read_args(theirs)
    dry = opts.dry_run or opts.json
    cli = {"facts": opts.facts, "profile": opts.profile, "cache_dir": opts.cache_dir}
    prepared = plan_for_launcher(os.environ, args, cli, write=not dry, say=lambda s: print(s, flush=True))
    plan = prepared.plan
    program = _program()
    stop = stop_reason(prepared, program)
    if opts.json:
        print_json({**plan.to_dict(), "argv": redact_argv(plan.argv), "vllm_program": program, "dry_run": True,
                    "launch": "stop" if stop else "exec-expected-to-fail" if plan.failures else "exec",
                    "stop_reason": stop})
    elif dry:
        print("\n".join(plan_text(plan, program, stop)))
    if dry:
        if prepared.refused_args:  # bad input: exit 2 after the plan, as for any bad input
            raise CaovanError(prepared.refused_args)
        return 0
    print("\n".join(banner_lines(plan)), flush=True)
    if stop or program is None:
        raise CaovanError(stop or "no vllm command")
    if plan.failures:
        print("warning: vLLM is expected to fail: " + "; ".join(plan.failures), flush=True)
    env = dict(os.environ)
    if plan.active:
        if prepared.keydir:
            hold_in_use(prepared.keydir)  # the fd survives exec: the cleaner sees this server
        apply_env(plan, env, f"{PROG} (pid {os.getpid()})", head_summary(prepared, node_name()))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(program, plan.argv, env)
    except OSError as err:
        raise CaovanError(f"cannot start {program}: {err.strerror or err}") from None


def entry() -> int:
    """Console-script entry point."""
    return run_cli(PROG, main)


if __name__ == "__main__":
    sys.exit(entry())
