"""The lines our code writes into vLLM's log and the log triage reads back: one home for both sides.

Every writer (the banner, the worker line, the Turbo, GDN-dispatch and attention state lines, the
hook's build lines, warmup's verdict) builds its line here, and `logtriage` matches them with the
patterns beside each builder, so a changed wording cannot leave the triage behind (a test writes
each line and reads it back). The banner header and `[Caovan] warmup=READY` are public contract
(docs/design.md). A leaf module: standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PRODUCT = "Caovan SM75 Turbo3"

# --- the banner: header, key=value status lines, then more lines of the same launch -------------
HEADER_PREFIX = "Caovan vLLM SM75 Turbo3 external plugin v"
HEADER_RE = re.compile(re.escape(HEADER_PREFIX) + r"(?P<version>\S+)")
STATUS_LINE = re.compile(r"^(?:\[Caovan\] )?(?P<key>[a-z][a-z0-9_]*)=(?P<value>\S.*)$")
BANNER_MORE = ("env.", "arg ", "check ", "warning: ", "note: ", "refused: ")


def header(version: str) -> str:
    """The banner's first line for plugin version `version`."""
    return HEADER_PREFIX + version


# --- one line per later vLLM process (the first one logged the banner) --------------------------
# The applied mark's value when the first process set nothing: "<who>; nothing applied: <why>".
NOTHING_APPLIED = "; nothing applied: "
WORKER_LINE = re.compile(rf"^{PRODUCT} v\S+: (?P<what>guards from .+ apply|nothing of ours applies) in this process")


@dataclass(frozen=True)
class AppliedMark:
    """What the first process left for its children in the environment: who applied the guards,
    and, when it set nothing, why. Encoded and read here only."""

    by: str
    nothing_because: str | None = None

    def encode(self) -> str:
        return self.by if self.nothing_because is None else f"{self.by}{NOTHING_APPLIED}{self.nothing_because}"

    @classmethod
    def decode(cls, value: str) -> "AppliedMark":
        by, nothing, why = value.partition(NOTHING_APPLIED)
        return cls(by, why if nothing else None)


def worker_line(version: str, mark: AppliedMark, pid: int) -> str:
    """The short line of a process that found the first process's applied `mark`."""
    if mark.nothing_because is not None:
        return (f"{PRODUCT} v{version}: nothing of ours applies in this process (pid {pid}): {mark.nothing_because} "
                f"(decided by {mark.by})")
    return f"{PRODUCT} v{version}: guards from {mark.by} apply in this process (pid {pid})"


NODE_LINE = re.compile(rf"^{PRODUCT} (?P<state>node .+)$")


def node_line(check: str) -> str:
    """A Ray worker's line on its node (policy/node.py): `node <name>: GPUs ..., sm75=..., key=..., ...`."""
    return f"{PRODUCT} {check}"


def own_settings_line(names: list[str]) -> str:
    """A Ray worker's line when this node's own settings win over the head's copies of them."""
    return (f"{PRODUCT}: this node's own {', '.join(names)} kept over the head's (vLLM's older Ray executor "
            "copied the head's values over them; a node's own values win, as with RayExecutorV2)")


def disabled_line(enable: bool, mode: str) -> str:
    """The first process's line when settings switch the plugin off."""
    return f"{PRODUCT}: disabled by settings (enable={enable}, mode={mode})"


NOT_APPLIED = f"{PRODUCT}: guards not applied"


def not_applied_line(pid: int, err: object) -> str:
    """The first process's line when planning failed (the plugin never takes vLLM down)."""
    return f"{NOT_APPLIED} in this process (pid {pid}): {err}"


EXPECTED_TO_FAIL = f"{PRODUCT}: vLLM is expected to fail:"


def expected_to_fail_line(why: str) -> str:
    """A vLLM process's warning that its own arguments will not start (the plan's failures)."""
    return f"{EXPECTED_TO_FAIL} {why}"


# --- per-process state lines: summarised by the triage, never judged as failures ----------------
TURBO_PREFIX = f"{PRODUCT}:"
TURBO_LINE = re.compile(rf"^{PRODUCT}: (?P<state>turbo=.*)$")
GDN_PREFIX = f"{PRODUCT} GDN prefill:"
# The `gdn_legacy=` values besides an interface family's name (which means ours serves GDN prefill);
# `at-model-load` is also `turbo3=`'s for a model not readable where the plan was made.
GDN_NO_LAYERS = "no-gdn-layers"
GDN_DISABLED = "disabled-by-user"
GDN_UPSTREAM = "upstream"
AT_MODEL_LOAD = "at-model-load"
GDN_WORDS = (GDN_NO_LAYERS, GDN_DISABLED, GDN_UPSTREAM, AT_MODEL_LOAD)
GDN_STATE = re.compile(rf"^{PRODUCT} GDN prefill: (?P<state>gdn_legacy=\S+ interface=.*)$")
ATTENTION_PREFIX = f"{PRODUCT} attention:"
ATTENTION_STATE = re.compile(rf"^{PRODUCT} attention: (?P<state>attention_backend=\S+ interface=.*)$")


CACHE_FIX_PREFIX = f"{PRODUCT} fix"
CACHE_FIX_LINE = re.compile(rf"^{PRODUCT} fix (?P<id>[a-z0-9-]+): (?P<state>on|off)\b")


def cache_fix_line(fix: str, state: str) -> str:
    """An upstream-bug fix of ours (plugin/cache_hit_fix.py): `on: what` or `off: why`."""
    return f"{CACHE_FIX_PREFIX} {fix}: {state}"


def turbo_line(line: str, reason: str) -> str:
    """The Turbo hook's state, logged when it is not what the user asked for."""
    return f"{TURBO_PREFIX} turbo={line} ({reason})"


def gdn_line(state: str) -> str:
    """The GDN dispatch's state line; `state` is `gdn_legacy=... interface=... kernel=... why=...`."""
    return f"{GDN_PREFIX} {state}"


def attention_line(state: str) -> str:
    """Our attention backend's state line; `state` is `attention_backend=... interface=... ...`."""
    return f"{ATTENTION_PREFIX} {state}"


NOT_DISPATCHED = f"{GDN_PREFIX} not dispatched"


def dispatch_failed_line(interface: str, reason: str) -> str:
    """The exact line logged when our GDN path is given up for this process."""
    return f"{PRODUCT} dispatch failed on interface {interface}: {reason}"


# --- the Turbo hook's build lines (kernels/turbo/hook.py) ---------------------------------------
HOOK_PREFIX = "Caovan turbo:"

# --- caovan-sm75-warmup's verdict (public contract) ---------------------------------------------
READY_LINE = "[Caovan] warmup=READY"
WARMUP_LINE = re.compile(r"\[Caovan\] (?P<line>warmup=\S+.*)$")


def warmup_failed_line(step: str, reason: str) -> str:
    """Warmup's one failure line: `[Caovan] warmup=FAILED step=<name> reason=<...>`."""
    return f"[Caovan] warmup=FAILED step={step} reason={reason}"
