"""The turbo allowlist: which Triton kernels get the sm_75 tensor-core rewrite. Data, not code.

The list lives in `data/turbo_allowlist.json`. Each entry names one Triton function (its name and
the modules it may live in), the Triton versions and the source digest it was verified with, the
tile configs (constexprs plus num_warps) that passed, the shapes the offline check compiles it at,
and the evidence (compile and numeric checks, with dates and cards).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

ALLOWLIST_FILE = "turbo_allowlist.json"


@dataclass(frozen=True)
class KernelEntry:
    """One allowlisted Triton function."""

    name: str                       # the Triton function's name, e.g. chunk_fwd_kernel_o
    modules: tuple[str, ...]        # Python modules it may be defined in
    source_sha256: tuple[str, ...]  # digests (first 16 hex) of the verified sources
    triton_versions: tuple[str, ...]
    configs: tuple[Mapping[str, Any], ...]   # constexprs and num_warps that passed
    check: Mapping[str, Any]        # how the offline check compiles it: signature, constexprs, attrs
    numeric: str                    # which numeric case checks it (kernels.turbo.cases)
    evidence: Mapping[str, Any] = field(default_factory=dict)
    # "f16x3": its IEEE fp32 dots are planned as tf32 and built as split-fp16 products (pipeline.py)
    fp32_dots: str = ""

    def config_matches(self, constants: Mapping[str, Any], num_warps: int) -> bool:
        """True when one verified config equals these constexprs (on its keys) and num_warps."""
        for cfg in self.configs:
            if cfg.get("num_warps", num_warps) != num_warps:
                continue
            if all(constants.get(k) == v for k, v in cfg.items() if k != "num_warps"):
                return True
        return False


@dataclass(frozen=True)
class Allowlist:
    """All entries, looked up by function name; `rejected` lists kernels checked and left off, with why."""

    kernels: tuple[KernelEntry, ...]
    rejected: tuple[Mapping[str, Any], ...] = ()

    def find(self, name: str, module: str) -> KernelEntry | None:
        """The entry for function `name` defined in `module`, or None."""
        return next((k for k in self.kernels if k.name == name and module in k.modules), None)


def source_digest(source: str) -> str:
    """The digest recorded as `source_sha256`: first 16 hex of sha256 of the function's source."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


def triton_version_matches(version: str, verified: tuple[str, ...]) -> bool:
    """'3.6.0' matches an entry '3.6.0' or '3.6'; local suffixes ('+git') are ignored."""
    base = version.split("+", 1)[0]
    return any(base == v or base.startswith(v + ".") for v in verified)


def parse_allowlist(data: Mapping[str, Any]) -> Allowlist:
    """Build the allowlist from its JSON object; raises ValueError naming a malformed entry."""
    entries = []
    for i, raw in enumerate(data.get("kernels", [])):
        try:
            entries.append(KernelEntry(
                name=raw["name"], modules=tuple(raw["modules"]),
                source_sha256=tuple(raw.get("source_sha256", ())),
                triton_versions=tuple(raw["triton_versions"]),
                configs=tuple(dict(c) for c in raw["configs"]),
                check=dict(raw["check"]), numeric=raw.get("numeric", ""),
                evidence=dict(raw.get("evidence", {})), fp32_dots=raw.get("fp32_dots", "")))
        except (KeyError, TypeError) as err:
            raise ValueError(f"{ALLOWLIST_FILE}: kernels[{i}] is malformed ({err})") from None
        if entries[-1].fp32_dots not in ("", "f16x3"):
            raise ValueError(f"{ALLOWLIST_FILE}: kernels[{i}] has unknown fp32_dots {entries[-1].fp32_dots!r}")
    return Allowlist(kernels=tuple(entries), rejected=tuple(dict(r) for r in data.get("rejected", [])))


def load_allowlist() -> Allowlist:
    """The allowlist shipped with the package."""
    text = resources.files("caovan_vllm_sm75_turbo3").joinpath("data", ALLOWLIST_FILE).read_text()
    return parse_allowlist(json.loads(text))
