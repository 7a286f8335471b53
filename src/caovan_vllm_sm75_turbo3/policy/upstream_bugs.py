"""Upstream vLLM bugs a launch plan must answer for, as data with their sources
(data/upstream_bugs.json): which hold for a launch, and the warning the plan prints. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from ..versions import minor_key


@dataclass(frozen=True)
class SourceMarker:
    """A code line whose presence in vLLM's `file` marks a change the bug's reading rests on."""

    file: str
    text: str
    present_from: str      # the first release (major.minor) whose source has it

    def expected_in(self, version: str) -> bool:
        return minor_key(version) >= minor_key(self.present_from)


@dataclass(frozen=True)
class PluginFix:
    """Our fix of a bug inside vLLM: the releases it installs on, what it does, the upstream change it
    follows, and the releases (major.minor) where the engine check proved it."""

    releases: str
    what: str
    upstream: str
    proven: tuple[str, ...] = ()
    proof: str = ""          # where the proof's raw results are, and what they showed

    def installs_on(self, version: str | None) -> bool:
        """Whether the fix installs on `version` (never on an unknown one: it patches known code)."""
        return bool(version) and _within(self.releases, version or "", unknown=False)

    def proven_on(self, version: str | None) -> bool:
        """Whether the engine check proved the fix on `version`'s minor release."""
        return self.installs_on(version) and any(minor_key(p) == minor_key(version or "") for p in self.proven)


def _within(releases: str, version: str, unknown: bool) -> bool:
    """Whether `version` lies in "0.21-0.28" (or "0.21"); `unknown` where it cannot be read."""
    low, _, high = releases.partition("-")
    try:
        return minor_key(low) <= minor_key(version) <= minor_key(high or low)
    except ValueError:
        return unknown


@dataclass(frozen=True)
class UpstreamBug:
    """One bug: the launch it needs (`when`), the releases it was reported on, what the releases'
    source shows, its public sources."""

    id: str
    when: dict[str, bool]
    reported: str          # "0.21-0.28": releases (major.minor) where users reported it
    in_source: str         # what we read in each release's source
    markers: tuple[SourceMarker, ...]
    effect: str
    sources: tuple[str, ...]
    check: str
    fatal: bool = False    # the launch does not start at all (the plan says vLLM is expected to fail)
    fix: PluginFix | None = None
    wrong_output: bool = False   # the server answers, with wrong text (never a default we fill)

    def reported_on(self, version: str | None) -> bool:
        """Whether `version` is within the reported releases (unknown versions count: warn rather than not)."""
        return not version or _within(self.reported, version, unknown=True)

    def fixed_by_us(self, version: str | None) -> bool:
        """Whether our plugin's fix holds on `version` (installed there and proven by the engine check)."""
        return self.fix is not None and self.fix.proven_on(version)

    def warning(self, version: str | None) -> str:
        """The plan's line: what goes wrong, where it was seen, how to check this server."""
        return (f"upstream bug {self.id} (reported on vLLM {self.reported}; this is vLLM {version}): "
                f"{self.effect}. In the source: {self.in_source}. Sources: {'; '.join(self.sources)}. "
                f"Check: {self.check}")


def load_bugs() -> tuple[UpstreamBug, ...]:
    """The table shipped with the package."""
    data = json.loads(resources.files("caovan_vllm_sm75_turbo3").joinpath("data", "upstream_bugs.json").read_text())
    return tuple(UpstreamBug(b["id"], dict(b["when"]), b["reported"], b["in_source"],
                             tuple(SourceMarker(**m) for m in b["markers"]), b["effect"], tuple(b["sources"]),
                             b["check"], bool(b.get("fatal", False)), _fix(b.get("plugin_fix")),
                             bool(b.get("wrong_output", False)))
                 for b in data["bugs"])


def _fix(raw: dict | None) -> PluginFix | None:
    return None if raw is None else PluginFix(raw["releases"], raw["what"], raw["upstream"], tuple(raw["proven"]),
                                              raw.get("proof", ""))


def plugin_fixes(version: str | None) -> tuple[UpstreamBug, ...]:
    """The bugs our plugin fixes inside vLLM `version` (installed whether or not yet proven)."""
    return tuple(b for b in load_bugs() if b.fix is not None and b.fix.installs_on(version))


def bugs_for(version: str | None, fixes: tuple[str, ...] = (), **launch: bool) -> list[UpstreamBug]:
    """The bugs whose every condition holds for this launch (speculative, prefix_caching, hybrid_gdn,
    pipeline_parallel; a condition not given is false) on `version`, less those whose id is in
    `fixes` (the plugin's fixes this launch installs) where the fix is proven on `version`."""
    return [b for b in load_bugs() if b.reported_on(version) and all(launch.get(k, False) == v for k, v in b.when.items())
            and not (b.id in fixes and b.fixed_by_us(version))]


def wrong_output_with_prefix_cache(version: str | None, hybrid_gdn: bool, fixes: tuple[str, ...]) -> UpstreamBug | None:
    """The bug that makes MTP with prefix caching give wrong output on this launch (None: none
    holds, or our proven fix removes it)."""
    return next((b for b in bugs_for(version, fixes, speculative=True, prefix_caching=True, hybrid_gdn=hybrid_gdn)
                 if b.wrong_output), None)
