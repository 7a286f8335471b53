"""The status banner, printed once per launch: the header, the `key=value` lines users grep for
(docs/design.md), then every environment variable we set or kept, checks that did not pass,
warnings and notes. Pure text from a plan.
"""

from __future__ import annotations

from .. import __version__, logformat
from ..textsafe import safe
from .checks import Status
from .plan import Plan

def header(version: str = __version__) -> str:
    """The header line for plugin version `version` (this package's by default)."""
    return logformat.header(version)


def banner_lines(plan: Plan) -> list[str]:
    """The banner, one line each; the first lines are exactly docs/design.md's."""
    lines = [header()]
    lines += [f"{k}={v}" for k, v in plan.status.items()]
    if plan.refusal:
        lines.append(f"refused: {plan.refusal}")
    for c in plan.env:
        if c.action == "set":
            lines.append(f"env.{c.var}={c.value} set: {c.reason} [vLLM {c.releases}; switch {c.switch}]")
        else:
            lines.append(f"env.{c.var}={c.value} kept: the user's value wins (we would set {c.ours})")
    for f in plan.filled_args:
        lines.append(f"arg {f.flag}{'' if f.value is None else ' ' + f.value} filled: {f.reason}")
    for c in plan.checks:
        if c.status is not Status.PASS:
            lines.append(f"check {c.name}={c.status.value}: {c.detail}" + (f" -> {c.remedy}" if c.remedy else ""))
    lines += [f"warning: {w}" for w in plan.warnings]
    lines += [f"note: {n}" for n in plan.notes]
    return [safe(line) for line in lines]   # user and model text inside: one printable line each, no secret


def worker_line(mark: str, pid: int) -> str:
    """The one short line a vLLM worker logs instead of the banner, true of this process: `mark` is
    what the first process left in the environment (launch.apply_env: who, and why nothing was set
    if so), as it was found there."""
    return logformat.worker_line(__version__, logformat.AppliedMark.decode(mark), pid)
