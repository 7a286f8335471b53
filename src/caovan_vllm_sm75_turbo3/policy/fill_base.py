"""What a launch profile's filling collects: the arguments it adds, its lines and warnings (one pass)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from .memory_plan import MemoryPlan
from .profiles import Setup
from .vllm_args import LaunchNumbers, VllmArgs

COMPILATION = "--compilation-config"


@dataclass(frozen=True)
class FilledArg:
    """A vLLM argument the user did not give that a launch profile fills (value None: a flag
    without a value), and why."""

    flag: str
    value: str | None
    reason: str

    def argv(self) -> list[str]:
        return [self.flag] if self.value is None else [self.flag, self.value]


def effective_value(args: VllmArgs, filled: Sequence[FilledArg], flag: str) -> str | None:
    """The flag's value in a launch: the user's (a value they gave), else the one filled, else None."""
    given = args.value(flag)
    if isinstance(given, str):
        return given
    return next((a.value for a in filled if a.flag == flag), None)


@dataclass(frozen=True)
class LaunchFill:
    """What the profile step decided."""

    profile: str | None            # the profile's name, "conservative", or None (none/off)
    args: tuple[FilledArg, ...] = ()
    lines: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    memory: MemoryPlan | None = None
    setup: Setup | None = None
    failures: tuple[str, ...] = ()   # what says vLLM will not start (an upstream bug this launch meets)


class Filler:
    """Collects filled arguments, kept notes and lines for one decision pass."""

    def __init__(self, args: VllmArgs, numbers: LaunchNumbers) -> None:
        self.user = args
        self.numbers = numbers  # the user's numeric arguments, checked: the only ones used
        self.args: list[FilledArg] = []
        self.lines: list[str] = []
        self.warnings: list[str] = []
        self.failures: list[str] = []

    def given(self, flag: str) -> bool:
        # `--compilation-config.mode 3`, `-O3` and `-O.mode` count as giving the compilation config.
        if self.user.given(flag):
            return True
        if any(k.startswith(flag + ".") for k in self.user.flags):
            return True
        return flag == COMPILATION and any(k.startswith("-O") for k in self.user.flags)

    def user_value(self, flag: str) -> str | bool | None:
        return self.user.value(flag)

    def effective(self, flag: str) -> str | None:
        """The flag's value in this launch so far: the user's, else the one filled."""
        return effective_value(self.user, self.args, flag)

    def shown(self, flag: str) -> str:
        """The user's value of `flag` as they gave it, for a `kept:` line."""
        got = self.user_value(flag)
        if got is not None:
            return "on" if got is True else "off" if got is False else str(got)
        forms = [f"{k} {v}" if isinstance(v, str) else k for k, v in self.user.flags.items()
                 if k.startswith(flag + ".") or (flag == COMPILATION and k.startswith("-O"))]
        return ", ".join(forms) or "given"

    def kept(self, flag: str, note: str) -> None:
        self.lines.append(f"kept: {flag} {self.shown(flag)} as given ({note})")

    def fill(self, flag: str, value: Any, reason: str) -> None:
        """Add `flag value` unless the user gave the flag; then say it is kept."""
        text = None if value is None else (value if isinstance(value, str) else json.dumps(value, separators=(",", ":")))
        if self.given(flag):
            self.kept(flag, "the profile would use " + ("the flag" if text is None else text))
            return
        self.args.append(FilledArg(flag, text, reason))
