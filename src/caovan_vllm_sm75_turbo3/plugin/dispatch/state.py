"""The one-line answer to "what runs GDN prefill in this process, and why"."""

from __future__ import annotations

from dataclasses import dataclass

from ...logformat import GDN_DISABLED as DISABLED
from ...logformat import GDN_UPSTREAM as UPSTREAM
from ...logformat import dispatch_failed_line

UPSTREAM_KERNEL = "vllm-upstream"


@dataclass(frozen=True)
class DispatchState:
    """Which interface family serves GDN prefill, with which kernel, and why.

    `status` is the `gdn_legacy=` value: the interface family's name (`legacy-gdn-linear-attn-v020`,
    `modular-qwen-gdn-v022`) when our kernel runs, `disabled-by-user`, or `upstream` (vLLM's own
    kernel). `interface` is the family detected, or `none` when no known layout was found.
    """

    status: str
    interface: str
    kernel: str
    why: str

    @property
    def active(self) -> bool:
        """True when our kernel serves GDN prefill."""
        return self.status not in (DISABLED, UPSTREAM)

    def line(self) -> str:
        """The single log line: `gdn_legacy=<status> interface=<family> kernel=<name> why=<text>`."""
        return (f"gdn_legacy={self.status} interface={self.interface} kernel={self.kernel} "
                f"why={self.why}")


def failure_line(interface: str, reason: str) -> str:
    """The exact line logged when our path is given up for this process."""
    return dispatch_failed_line(interface, reason)
