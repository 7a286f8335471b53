"""The version changes with releases: one place sets it, the CHANGELOG's newest entry names it, and
each entry is newer than the one below it (a newer wheel installs over an older one)."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.version import Version

import caovan_vllm_sm75_turbo3
from caovan_vllm_sm75_turbo3.logformat import header

ROOT = Path(__file__).resolve().parents[1]


def test_the_changelog_names_the_packages_version_first_and_versions_only_grow():
    entries = re.findall(r"^## (\S+) \((\d{4}-\d{2}-\d{2})\)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert entries and entries[0][0] == caovan_vllm_sm75_turbo3.__version__
    versions = [Version(v) for v, _ in entries]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    dates = [d for _, d in entries]
    assert dates == sorted(dates, reverse=True)


def test_the_wheel_and_the_banner_read_that_one_version():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'version = { attr = "caovan_vllm_sm75_turbo3.__version__" }' in pyproject
    assert not re.search(r'^version\s*=\s*"', pyproject, re.M)   # no second, static version
    assert header(caovan_vllm_sm75_turbo3.__version__).endswith("v" + caovan_vllm_sm75_turbo3.__version__)
    assert Version(caovan_vllm_sm75_turbo3.__version__) > Version("0.1.0")   # every build before said 0.1.0
