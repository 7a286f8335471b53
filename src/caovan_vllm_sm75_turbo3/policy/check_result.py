"""One check's result and the roll-up: shared by the machine checks (checks.py) and the host
checks (host_checks.py), which checks.run_checks runs together."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Status(str, enum.Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"

    @property
    def exit_code(self) -> int:
        """The doctor's exit code for this roll-up: 0 PASS, 1 WARN, 2 FAIL."""
        return {"PASS": 0, "WARN": 1, "FAIL": 2}[self.value]


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str
    remedy: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail, "remedy": self.remedy}


def rollup(results: list[CheckResult]) -> Status:
    """The worst status among `results` (PASS when empty)."""
    order = [Status.PASS, Status.WARN, Status.FAIL]
    return max((r.status for r in results), key=order.index, default=Status.PASS)
