"""The turbo allowlist: which Triton kernels get the sm_75 tensor-core rewrite. Data, not code.

The list lives in `data/turbo_allowlist.json`. Each entry names one Triton function (its name and
the modules it may live in), the Triton versions and the source digest it was verified with, the
tile configs (constexprs plus num_warps) that passed, the shapes the offline check compiles it at,
and the evidence (compile and numeric checks, with dates and cards).

A kernel that vLLM's releases ship in several texts (the FLA GDN kernels, docs/fla-releases.md) lists
them as `sources`: each source variant (one digest) with the Tritons its releases pin and the configs
that passed there. A digest is verified only on its own variant's Tritons, never on another
variant's: the entry's `source_sha256` x `triton_versions` is not a verified cross product.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from ... import versions

ALLOWLIST_FILE = "turbo_allowlist.json"


@dataclass(frozen=True)
class SourceVariant:
    """One text of an allowlisted kernel: its digest, the vLLM releases shipping it, the Tritons it was
    checked with (the ones those releases pin) and the configs that passed on every one of them."""

    digest: str                               # first 16 hex of sha256 of the function's source
    releases: str                             # the vLLM releases shipping it, e.g. "0.21.0-0.25.1"
    triton_versions: tuple[str, ...]          # major.minor, e.g. ("3.6", "3.7")
    constexprs: Mapping[str, Any] = field(default_factory=dict)   # extra check constexprs, at vLLM's GDN values
    configs: tuple[Mapping[str, Any], ...] = ()   # empty: the entry's configs
    evidence: Mapping[str, Any] = field(default_factory=dict)


def _config_in(configs: tuple[Mapping[str, Any], ...], constants: Mapping[str, Any], num_warps: int) -> bool:
    """True when one of `configs` equals these constexprs (on its keys) and num_warps."""
    for cfg in configs:
        if cfg.get("num_warps", num_warps) != num_warps:
            continue
        if all(constants.get(k) == v for k, v in cfg.items() if k != "num_warps"):
            return True
    return False


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
    # vLLM's texts of this kernel; when given, source_sha256 and triton_versions are their unions
    sources: tuple[SourceVariant, ...] = ()

    def config_matches(self, constants: Mapping[str, Any], num_warps: int) -> bool:
        """True when one of the entry's configs equals these constexprs (on its keys) and num_warps."""
        return _config_in(self.configs, constants, num_warps)

    def variant_for(self, digest: str, triton_version: str) -> SourceVariant | None:
        """The source variant verified for this digest on this Triton; None when that pair was not checked."""
        return next((v for v in self.sources
                     if v.digest == digest and triton_version_matches(triton_version, v.triton_versions)), None)

    def covers_release(self, vllm_version: str, triton_version: str) -> bool:
        """Whether a variant shipped by vLLM `vllm_version` was verified on this Triton (the release's
        text of this kernel gets tensor cores under CAOVAN_TURBO=auto)."""
        return any(release_in(vllm_version, v.releases) and triton_version_matches(triton_version, v.triton_versions)
                   for v in self.sources)

    def configs_for(self, variant: SourceVariant | None) -> tuple[Mapping[str, Any], ...]:
        """The configs verified for `variant` (the entry's own when it lists none, or for no variant)."""
        return variant.configs if variant is not None and variant.configs else self.configs

    def verified(self, digest: str, triton_version: str, constants: Mapping[str, Any], num_warps: int) -> bool:
        """Whether this source on this Triton in this config was checked (what CAOVAN_TURBO=auto builds).

        With `sources`, the (digest, Triton) pair must be one variant's, the launch must carry that
        variant's constexprs and match one of its configs; otherwise the entry's Tritons, digests
        (none: our own kernels, pinned by the package) and configs.
        """
        if self.sources:
            variant = self.variant_for(digest, triton_version)
            return (variant is not None
                    and all(constants.get(k) == v for k, v in variant.constexprs.items())
                    and _config_in(self.configs_for(variant), constants, num_warps))
        return (triton_version_matches(triton_version, self.triton_versions)
                and (not self.source_sha256 or digest in self.source_sha256)
                and self.config_matches(constants, num_warps))


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
    return versions.matches(version, verified)


def release_in(version: str, releases: str) -> bool:
    """'0.27.0' (or '0.27.0+cpu') is in '0.26.0-0.31.0' or equal to '0.27.0'."""
    return versions.in_range(version, releases)


def _parse_sources(raw: Mapping[str, Any]) -> tuple[SourceVariant, ...]:
    """An entry's `sources`; ValueError when it also gives the fields they determine, or a variant
    lists a config the entry does not (CAOVAN_TURBO=on would then refuse what auto builds)."""
    if "source_sha256" in raw or "triton_versions" in raw:
        raise ValueError("gives sources and source_sha256/triton_versions (those are derived from sources)")
    variants = tuple(SourceVariant(
        digest=v["digest"], releases=v["releases"], triton_versions=tuple(v["triton_versions"]),
        constexprs=dict(v.get("constexprs", {})), configs=tuple(dict(c) for c in v.get("configs", ())),
        evidence=dict(v.get("evidence", {}))) for v in raw["sources"])
    for v in variants:
        extra = [c for c in v.configs if c not in raw["configs"]]
        if extra:
            raise ValueError(f"source {v.digest} lists configs the entry does not: {extra}")
    return variants


def _parse_entry(raw: Mapping[str, Any]) -> KernelEntry:
    sources = _parse_sources(raw) if "sources" in raw else ()
    if sources:
        digests = tuple(dict.fromkeys(v.digest for v in sources))
        tritons = tuple(sorted({t for v in sources for t in v.triton_versions}, key=versions.release_key))
    else:
        digests, tritons = tuple(raw.get("source_sha256", ())), tuple(raw["triton_versions"])
    return KernelEntry(
        name=raw["name"], modules=tuple(raw["modules"]), source_sha256=digests, triton_versions=tritons,
        configs=tuple(dict(c) for c in raw["configs"]), check=dict(raw["check"]), numeric=raw.get("numeric", ""),
        evidence=dict(raw.get("evidence", {})), fp32_dots=raw.get("fp32_dots", ""), sources=sources)


def parse_allowlist(data: Mapping[str, Any]) -> Allowlist:
    """Build the allowlist from its JSON object; raises ValueError naming a malformed entry."""
    entries = []
    for i, raw in enumerate(data.get("kernels", [])):
        try:
            entries.append(_parse_entry(raw))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{ALLOWLIST_FILE}: kernels[{i}] is malformed ({err})") from None
        if entries[-1].fp32_dots not in ("", "f16x3"):
            raise ValueError(f"{ALLOWLIST_FILE}: kernels[{i}] has unknown fp32_dots {entries[-1].fp32_dots!r}")
    return Allowlist(kernels=tuple(entries), rejected=tuple(dict(r) for r in data.get("rejected", [])))


def load_allowlist() -> Allowlist:
    """The allowlist shipped with the package."""
    text = resources.files("caovan_vllm_sm75_turbo3").joinpath("data", ALLOWLIST_FILE).read_text()
    return parse_allowlist(json.loads(text))
