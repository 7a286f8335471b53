import json

import pytest

from caovan_vllm_sm75_turbo3.errors import FactsError
from caovan_vllm_sm75_turbo3.runtime.facts import Facts

from helpers.facts import EXAMPLES, facts_dict

MINIMAL = {  # the shape issue #2 promises users can share
    "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 2080 Ti", "compute_capability": "7.5",
              "memory_total_mib": 22528}],
    "host": {"memory_total_mib": 65536, "cpu_count": 12},
    "versions": {"python": "3.11.7", "torch": "2.11.0", "torch_cuda": "13.0", "triton": "3.6.0",
                 "vllm": "0.21.0", "flashinfer": "0.6.8.post1", "nvcc": "13.0", "driver": "580.95.05"}}


def test_minimal_shape_loads_and_missing_means_unknown(write_facts):
    f = Facts.load(write_facts(MINIMAL))
    assert f.sm75_count == 1 and f.gpus[0].sm == 75 and f.gpus[0].memory_total_mib == 22528
    assert f.host.memory_available_mib is None
    assert f.versions.torch_sm75 is (True if f.versions.torch_cuda else None)   # read as the probe reads it
    assert f.toolchain.ptxas_path is None
    assert f.source.endswith("facts.json")


def test_round_trip_keeps_unknown_keys_at_every_level(write_facts):
    data = facts_dict()
    data["gpus"][1]["pci_bus"] = "0000:02:00.0"
    data["host"]["numa_nodes"] = 2
    data["versions"]["cutlass"] = "4.1"
    data["rack"] = {"row": 3}
    f = Facts.load(write_facts(data))
    again = Facts.from_dict(json.loads(f.to_json()))
    out = again.to_dict()
    assert out["gpus"][1]["pci_bus"] == "0000:02:00.0"
    assert out["host"]["numa_nodes"] == 2 and out["versions"]["cutlass"] == "4.1"
    assert out["rack"] == {"row": 3}
    first, second = f.to_dict(), again.to_dict()
    assert first.pop("source").endswith("facts.json") and second.pop("source") == "file"
    assert first == second
    for key in ("gpus", "host", "versions"):
        assert out[key] == Facts.from_dict(data).to_dict()[key]


def test_numeric_compute_capability_is_accepted(write_facts):
    f = Facts.load(write_facts({"gpus": [{"compute_capability": 7.5}]}))
    assert f.gpus[0].is_sm75 and f.gpus[0].index == 0


def test_doctor_json_report_loads_as_facts(write_facts):
    report = {"runtime": "PASS", "facts": facts_dict()}
    f = Facts.load(write_facts(report))
    assert f.sm75_count == 2


@pytest.mark.parametrize("content,needle", [
    ("{not json", "is not valid JSON"),
    ("[1]", "must be a JSON object"),
    ('{"gpus": {"0": 1}}', "'gpus' must be a list"),
    ('{"gpus": [3]}', "gpus[0] must be an object"),
    ('{"host": []}', "'host' must be an object"),
    ('{"gpus": [{"index": 0, "name": "x", "bogus": 1, "memory_total_mib": 1}], "host": {"cpu_count": 2}}', None),
])
def test_bad_facts_files(tmp_path, content, needle):
    p = tmp_path / "f.json"
    p.write_text(content)
    if needle is None:
        assert Facts.load(p).gpus[0].extra == {"bogus": 1}
        return
    with pytest.raises(FactsError) as err:
        Facts.load(p)
    assert needle in str(err.value) and str(p) in str(err.value)


def test_missing_facts_file_is_a_clear_error(tmp_path):
    with pytest.raises(FactsError, match="cannot read facts file"):
        Facts.load(tmp_path / "nope.json")


@pytest.mark.parametrize("name", ["2x2080ti-22g.json", "1x2080ti-11g.json", "4xt4-16g.json"])
def test_bundled_examples_load(name):
    f = Facts.load(EXAMPLES / name)
    assert f.gpus and f.sm75_count == len(f.gpus)
    assert f.versions.vllm and f.host.memory_total_mib
