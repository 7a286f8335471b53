"""What our in-engine check proved (data/engine_proofs.json), by vLLM release, attention backend and
KV cache dtype: the launch profile fills a combination the field warns about only where a proof
holds. A record with `missing` set is evidence short of a proof: it never holds, and the plan quotes
what it lacks. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from ..versions import minor_key

MTP_FULL_GRAPHS = "mtp-full-cudagraphs"
MTP_FP8_KV = "mtp-fp8-kv"   # MTP with fp8 KV, the drafter on our backend (policy/attention.drafter_backend_needed)


@dataclass(frozen=True)
class Proof:
    """One combination the engine check proved, where, and what it showed."""

    id: str
    release: str             # major.minor
    attention_backend: str   # vLLM's name (CUSTOM: ours)
    kv_cache_dtype: str      # auto: the model's dtype
    result: str
    card: str
    date: str
    results: str             # the committed raw results
    missing: str = ""        # what the check has not shown yet: such a record is evidence, not a proof

    def holds_for(self, version: str | None, backend: str | None, kv: str | None) -> bool:
        try:
            same_release = bool(version) and minor_key(version or "") == minor_key(self.release)
        except ValueError:
            return False
        return same_release and (backend or "").upper() == self.attention_backend and (kv or "auto") == self.kv_cache_dtype


def load_proofs() -> tuple[Proof, ...]:
    """The table shipped with the package."""
    data = json.loads(resources.files("caovan_vllm_sm75_turbo3").joinpath("data", "engine_proofs.json").read_text())
    return tuple(Proof(**p) for p in data["proofs"])


def _record(what: str, version: str | None, backend: str | None, kv: str | None, whole: bool) -> Proof | None:
    """The record of `what` for this release, backend and KV dtype: a whole proof, or one with `missing`."""
    return next((p for p in load_proofs()
                 if p.id == what and (not p.missing) == whole and p.holds_for(version, backend, kv)), None)


def proof_for(what: str, version: str | None, backend: str | None, kv: str | None) -> Proof | None:
    """The proof of `what` for this release, backend and KV dtype, if the engine check made one."""
    return _record(what, version, backend, kv, whole=True)


def gap_for(what: str, version: str | None, backend: str | None, kv: str | None) -> str:
    """Where the check ran `what` for this release, backend and KV dtype but fell short of a proof:
    what it has not shown, with the date and the raw results ("" where it never ran)."""
    partial = _record(what, version, backend, kv, whole=False)
    return f"; it ran on {partial.date} ({partial.results.rsplit('/', 1)[-1]}) but {partial.missing}" if partial else ""
