"""Each check on crafted facts for machines we do not have."""

import pytest

from caovan_vllm_sm75_turbo3.policy import checks as C
from caovan_vllm_sm75_turbo3.policy.checks import Status
from caovan_vllm_sm75_turbo3.runtime.facts import Facts
from caovan_vllm_sm75_turbo3.runtime.model import ModelFacts, read_model

from helpers.facts import RTX3090, T4, TI22, facts_dict


def by_name(facts: Facts, model=None) -> dict[str, C.CheckResult]:
    return {r.name: r for r in C.run_checks(facts, model)}


def test_reference_machine_passes_everything():
    results = C.run_checks(Facts.from_dict(facts_dict()))
    assert [r.status for r in results] == [Status.PASS] * len(results)
    assert C.rollup(results) is Status.PASS and C.sm75_line(Facts.from_dict(facts_dict())) == "2/2"


def test_one_t4_on_32g_host_warns_about_memory_only():
    f = Facts.from_dict(facts_dict(gpus=[dict(T4, index=0)], host={"memory_total_mib": 32768}))
    r = by_name(f)
    assert r["sm75-gpus"].status is Status.PASS and "sm75=1/1" in r["sm75-gpus"].detail
    assert r["host-memory"].status is Status.WARN and "< 64 GiB" in r["host-memory"].detail
    assert C.rollup(list(r.values())) is Status.WARN


def test_3090_plus_2080ti_mix():
    f = Facts.from_dict(facts_dict(gpus=[dict(RTX3090, index=0), dict(TI22, index=1)]))
    r = by_name(f)
    assert r["sm75-gpus"].status is Status.WARN and "sm75=1/2" in r["sm75-gpus"].detail
    assert "CUDA_VISIBLE_DEVICES" in r["sm75-gpus"].remedy
    assert r["mixed-gpus"].status is Status.WARN and "7.5" in r["mixed-gpus"].detail and "8.6" in r["mixed-gpus"].detail
    assert C.sm75_line(f) == "1/2"


def test_no_gpu_fails_plainly():
    f = Facts.from_dict(facts_dict(gpus=[], versions={"driver": None}))
    r = by_name(f)
    assert r["sm75-gpus"].status is Status.FAIL and "no NVIDIA GPU" in r["sm75-gpus"].detail
    assert r["driver"].status is Status.FAIL
    assert C.rollup(list(r.values())) is Status.FAIL


def test_no_turing_gpu_warns_plugin_inactive():
    r = by_name(Facts.from_dict(facts_dict(gpus=[dict(RTX3090, index=0)])))
    assert r["sm75-gpus"].status is Status.WARN and "inactive" in r["sm75-gpus"].remedy


@pytest.mark.parametrize("mib,status", [(16384, Status.FAIL), (32767, Status.FAIL), (32768, Status.WARN),
                                        (65535, Status.WARN), (65536, Status.PASS), (None, Status.WARN)])
def test_host_memory_thresholds(mib, status):
    r = by_name(Facts.from_dict(facts_dict(host={"memory_total_mib": mib})))
    assert r["host-memory"].status is status


def test_mixed_memory_sizes_warn():
    f = Facts.from_dict(facts_dict(gpus=[dict(TI22, index=0), dict(TI22, index=1, memory_total_mib=11264)]))
    assert by_name(f)["mixed-gpus"].status is Status.WARN


@pytest.mark.parametrize("versions,status,needle", [
    ({"torch": None}, Status.FAIL, "not installed"),
    ({"torch_cuda": None}, Status.FAIL, "no CUDA build"),
    ({"torch_sm75": False}, Status.FAIL, "lacks sm_75"),
    ({"torch_sm75": None}, Status.PASS, "sm_75 kernels"),          # derived from torch's CUDA 13.0
    ({"torch_sm75": None, "torch_cuda": "10.2"}, Status.FAIL, "lacks sm_75"),
])
def test_torch_checks(versions, status, needle):
    r = by_name(Facts.from_dict(facts_dict(versions=versions)))["torch"]
    assert r.status is status and needle in r.detail


def test_torch_sm75_unknown_only_where_nothing_tells():
    import dataclasses
    f = Facts.from_dict(facts_dict())
    f = dataclasses.replace(f, versions=dataclasses.replace(f.versions, torch_sm75=None))
    r = C.check_torch(f)
    assert r.status is Status.WARN and "unknown" in r.detail


@pytest.mark.parametrize("vllm,status,needle", [
    ("0.21.0", Status.PASS, "reference"),
    ("0.21.0+cu130", Status.PASS, "reference"),
    ("0.26.1", Status.WARN, "not run end to end"),
    ("0.34.2", Status.WARN, "not run end to end"),
    ("0.35.0", Status.WARN, "newer than any release"),
    ("0.20.2", Status.FAIL, "older than we support"),
    (None, Status.FAIL, "not installed"),
    ("banana", Status.FAIL, "unreadable"),
])
def test_vllm_range(vllm, status, needle):
    r = by_name(Facts.from_dict(facts_dict(versions={"vllm": vllm})))["vllm"]
    assert r.status is status and needle in r.detail


@pytest.mark.parametrize("vllm,fi,status", [("0.21.0", "0.6.8.post1", Status.PASS), ("0.21.0", "0.6.9", Status.WARN),
                                            ("0.21.0", None, Status.WARN), ("0.26.0", "0.7.0", Status.WARN)])
def test_flashinfer_pairing(vllm, fi, status):
    r = by_name(Facts.from_dict(facts_dict(versions={"vllm": vllm, "flashinfer": fi})))["flashinfer"]
    assert r.status is status
    if status is Status.WARN and fi and vllm == "0.21.0":
        assert "flashinfer-python==0.6.8.post1" in r.remedy


def test_toolchain_mismatch_and_absence():
    r = by_name(Facts.from_dict(facts_dict(versions={"nvcc": "12.9"})))["toolchain"]
    assert r.status is Status.WARN and "torch CUDA 13.0" in r.detail
    r = by_name(Facts.from_dict(facts_dict(toolchain={"nvcc_path": None})))["toolchain"]
    assert r.status is Status.WARN and "no nvcc" in r.detail
    r = by_name(Facts.from_dict(facts_dict(toolchain={"ptxas_path": None})))["toolchain"]
    assert r.status is Status.WARN and "no ptxas" in r.detail


@pytest.mark.parametrize("driver,status", [("580.95.05", Status.PASS), ("570.1", Status.FAIL), ("x", Status.WARN)])
def test_driver_against_torch_cuda(driver, status):
    assert by_name(Facts.from_dict(facts_dict(versions={"driver": driver})))["driver"].status is status


def test_checkpoint_against_free_memory(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen3_5ForConditionalGeneration"]}')
    with open(tmp_path / "model-00001.safetensors", "wb") as fh:
        fh.truncate(3 * 2**30)  # sparse: 3 GiB on paper, nothing on disk
    model = read_model(str(tmp_path))
    assert model.checkpoint_bytes == 3 * 2**30 and model.config["architectures"]
    roomy = Facts.from_dict(facts_dict())
    assert by_name(roomy, model)["checkpoint"].status is Status.PASS
    tight = Facts.from_dict(facts_dict(host={"memory_total_mib": 2048, "memory_available_mib": 1024,
                                             "swap_total_mib": 0}))
    assert by_name(tight, model)["checkpoint"].status is Status.FAIL
    swapping = Facts.from_dict(facts_dict(host={"memory_total_mib": 2048, "memory_available_mib": 1024,
                                                "swap_total_mib": 8192}))
    assert by_name(swapping, model)["checkpoint"].status is Status.WARN


def test_checkpoint_on_a_hub_name():
    r = by_name(Facts.from_dict(facts_dict()), ModelFacts(path="Qwen/Qwen3.6-27B"))["checkpoint"]
    assert r.status is Status.WARN


def test_host_checks_run_last_and_only_for_what_the_facts_know(tmp_path):
    machine = [c.__name__ for c in C.MACHINE_CHECKS]
    plain = C.run_checks(Facts.from_dict(facts_dict()), read_model(str(tmp_path)))
    assert len(plain) == len(machine) + 1 and plain[-1].name == "checkpoint"  # no host field known: no host row
    slow = C.run_checks(Facts.from_dict(facts_dict(host={"cpu_governor": "powersave"})), read_model(str(tmp_path)))
    assert [r.name for r in slow[:-1]] == [r.name for r in plain] and slow[-1].name == "host-cpu-governor"
    assert slow[-1].status is Status.WARN and C.rollup(slow[-1:]) is Status.WARN
