"""The environment key changes when any component changes, and only then."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import pytest

from caovan_vllm_sm75_turbo3 import __version__
from caovan_vllm_sm75_turbo3.caches.key import NAME_RE, env_key
from caovan_vllm_sm75_turbo3.runtime.facts import Facts, GpuFact

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "2x2080ti-22g.json"
COMPONENTS = {"plugin", "python", "torch", "torch_cuda", "triton", "vllm", "flashinfer", "arch"}


def example() -> Facts:
    return Facts.load(EXAMPLE)


def test_example_key_reads_as_the_contract_says():
    key = env_key(example())
    assert set(key.components) == COMPONENTS
    assert key.readable == (f"p{__version__}-py3.11.7-torch2.11.0-cu13.0-triton3.6.0-vllm0.21.0"
                            "-fi0.6.8.post1-sm75")
    expected = hashlib.sha256(json.dumps(dict(sorted(key.components.items())), sort_keys=True)
                              .encode()).hexdigest()[:10]
    assert key.digest == expected
    assert key.name == f"{key.readable}-{key.digest}"
    assert NAME_RE.match(key.name)


@pytest.mark.parametrize("field,value", [
    ("python", "3.12.1"), ("torch", "2.10.0"), ("torch_cuda", "12.8"), ("triton", "3.5.1"),
    ("vllm", "0.22.0"), ("flashinfer", "0.6.9"), ("plugin", "9.9.9")])
def test_each_version_component_changes_the_key(field, value):
    base = example()
    changed = copy.deepcopy(base)
    assert getattr(changed.versions, field) != value
    setattr(changed.versions, field, value)
    a, b = env_key(base), env_key(changed)
    assert a.digest != b.digest and a.name != b.name
    assert b.components[field] == value
    assert {k for k in COMPONENTS if a.components[k] != b.components[k]} == {field}


def test_gpu_arch_changes_the_key():
    base = example()
    changed = copy.deepcopy(base)
    changed.gpus[1].compute_capability = "8.6"
    assert env_key(changed).components["arch"] == "sm75+sm86"
    assert env_key(changed).name != env_key(base).name
    no_gpu = copy.deepcopy(base)
    no_gpu.gpus = []
    assert env_key(no_gpu).components["arch"] == "nogpu"
    assert env_key(no_gpu).name != env_key(base).name


def test_facts_outside_the_key_do_not_change_it():
    base = example()
    other = copy.deepcopy(base)
    other.versions.driver = "999.1"
    other.versions.nvcc = "12.1"
    other.versions.ptxas = "12.1"
    other.host.memory_total_mib = 1
    other.toolchain.nvcc_path = "/elsewhere/nvcc"
    other.notes.append("something")
    other.source = "somewhere.json"
    other.gpus = [GpuFact(index=0, name="Tesla T4", compute_capability="7.5", memory_total_mib=15360)]
    assert env_key(other) == env_key(base)


def test_arch_is_sorted_and_distinct_whatever_the_gpu_order():
    a, b = example(), example()
    a.gpus = [GpuFact(0, compute_capability="8.6"), GpuFact(1, compute_capability="7.5"),
              GpuFact(2, compute_capability="7.5")]
    b.gpus = [GpuFact(0, compute_capability="7.5"), GpuFact(1, compute_capability="8.6")]
    assert env_key(a).components["arch"] == "sm75+sm86"
    assert env_key(a) == env_key(b)


def test_missing_versions_are_none():
    facts = Facts.from_dict({"gpus": [{"index": 0, "compute_capability": "7.5"}]})
    key = env_key(facts)
    for name in ("python", "torch", "torch_cuda", "triton", "vllm", "flashinfer"):
        assert key.components[name] == "none"
    assert key.components["plugin"] == __version__  # the running plugin fills the cache
    assert key.components["arch"] == "sm75"


def test_name_is_filesystem_safe_and_bounded_even_for_odd_versions():
    a, b = example(), example()
    long = "1.0.0+" + "x" * 300
    a.versions.torch = long + "a/../b c"
    b.versions.torch = long + "a/../b d"  # differs only beyond the truncated readable part
    ka, kb = env_key(a), env_key(b)
    for k in (ka, kb):
        assert re.fullmatch(r"[A-Za-z0-9._+-]+", k.name)
        assert "/" not in k.name and len(k.name) <= 255
    assert ka.readable == kb.readable
    assert ka.name != kb.name
