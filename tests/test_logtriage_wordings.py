"""Each vLLM wording kept in the signatures (Wording: text, releases, source file) is checked in the
source of the vLLM this lane installs: 0.21.0 (full lane), 0.27.0 (serve lane), 0.34.0 (vllm034 lane)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from caovan_vllm_sm75_turbo3.logtriage.signatures import SIGNATURES
from caovan_vllm_sm75_turbo3.runtime.probe import vllm_version
from caovan_vllm_sm75_turbo3.versions import minor_key

pytestmark = pytest.mark.vllm_source


def _covers(releases: str, version: str) -> bool:
    low, _, high = releases.partition("-")
    return minor_key(low) <= minor_key(version) <= minor_key(high or low)


WORDINGS = [(s.id, w) for s in SIGNATURES for w in s.wordings]


def test_there_are_wordings_to_check():
    assert {sid for sid, _ in WORDINGS} >= {"kv-cache-too-small", "model-not-found", "gpu-memory-busy"}


@pytest.mark.parametrize("sid,wording", WORDINGS, ids=[f"{sid}:{w.text[:30]}" for sid, w in WORDINGS])
def test_each_wording_is_in_the_installed_vllm_source(sid, wording):
    version = vllm_version()
    spec = importlib.util.find_spec("vllm")
    assert version and spec and spec.submodule_search_locations
    if not _covers(wording.releases, version):
        pytest.skip(f"{wording.releases} does not cover vLLM {version}")
    root = Path(next(iter(spec.submodule_search_locations))).parent
    source = (root / wording.source).read_text(encoding="utf-8")
    assert wording.text in source, f"{sid}: {wording.text!r} not in {wording.source} of vLLM {version}"
