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

    def reported_on(self, version: str | None) -> bool:
        """Whether `version` is within the reported releases (unknown versions count: warn rather than not)."""
        if not version:
            return True
        low, _, high = self.reported.partition("-")
        try:
            return minor_key(low) <= minor_key(version) <= minor_key(high or low)
        except ValueError:
            return True

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
                             b["check"], bool(b.get("fatal", False))) for b in data["bugs"])


def bugs_for(version: str | None, **launch: bool) -> list[UpstreamBug]:
    """The bugs whose every condition holds for this launch (speculative, prefix_caching, hybrid_gdn,
    pipeline_parallel; a condition not given is false) on `version`."""
    return [b for b in load_bugs() if b.reported_on(version) and all(launch.get(k, False) == v for k, v in b.when.items())]
