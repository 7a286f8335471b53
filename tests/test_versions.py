"""The one major.minor rule (versions.py) that the vLLM table, the profiles and the Turbo policy share."""

from __future__ import annotations

import pytest

from caovan_vllm_sm75_turbo3 import versions
from caovan_vllm_sm75_turbo3.policy import vllm_versions as vv


@pytest.mark.parametrize("text", ["0.21", "0.21.0", "0.21.0rc1", "0.21.0+cu130", "0.21.1.dev3+g1234abc", "v0.21.2"])
def test_every_spelling_of_a_release_gives_its_major_minor(text):
    assert versions.minor_key(text) == (0, 21)
    assert versions.minor(text) == vv.minor(text) == "0.21"


def test_triton_local_builds_keep_their_release():
    assert versions.minor("3.6.0+git9f3a1b2") == "3.6" and versions.minor("3.10.0") == "3.10"
    assert versions.minor_key("0.9") < versions.minor_key("0.10")  # numbers, not strings


@pytest.mark.parametrize("text", [None, "", "1", "main", "0.x", "zero.21"])
def test_no_release_is_none_or_a_value_error(text):
    assert versions.minor(text) is None
    with pytest.raises(ValueError):
        versions.minor_key(text or "")


def test_the_vllm_table_reads_versions_the_same_way():
    assert vv.parse("0.21.0+cu130").local == "cu130" and vv.parse("nonsense") is None
    assert vv.has("flashinfer-on-sm75", "0.23.0rc1") and not vv.has("flashinfer-on-sm75", "0.24.0+cu128")
    assert vv.support_status("0.34.9") == "supported-untested" and vv.support_status("0.35.0") == "too-new"
