"""Upstream vLLM bugs a launch plan must answer for, as data with their sources
(data/upstream_bugs.json): which hold for a launch, and the warning the plan prints. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from ..versions import minor_key


@dataclass(frozen=True)
class UpstreamBug:
    """One bug: the launch it needs (`when`), the releases it was reported on, its public sources."""

    id: str
    when: dict[str, bool]
    reported: str          # "0.21-0.28": releases (major.minor) where users reported it
    source_read: bool      # whether those releases' source was read to confirm it
    effect: str
    sources: tuple[str, ...]
    check: str

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
        read = "" if self.source_read else ", not confirmed in its source by us"
        return (f"upstream bug {self.id} (reported on vLLM {self.reported}{read}; this is vLLM {version}): "
                f"{self.effect}. Sources: {'; '.join(self.sources)}. Check: {self.check}")


def load_bugs() -> tuple[UpstreamBug, ...]:
    """The table shipped with the package."""
    data = json.loads(resources.files("caovan_vllm_sm75_turbo3").joinpath("data", "upstream_bugs.json").read_text())
    return tuple(UpstreamBug(b["id"], dict(b["when"]), b["reported"], bool(b["source_read"]), b["effect"],
                             tuple(b["sources"]), b["check"]) for b in data["bugs"])


def bugs_for(version: str | None, **launch: bool) -> list[UpstreamBug]:
    """The bugs whose every condition holds for this launch (speculative, prefix_caching, hybrid_gdn) on `version`."""
    return [b for b in load_bugs() if b.reported_on(version) and all(launch.get(k) == v for k, v in b.when.items())]
