"""The probe reads this machine (no GPU here) and, through a fake NVML, machines we lack."""

import sys
import types

import pytest

from caovan_vllm_sm75_turbo3.runtime import probe as probe_mod


def test_probe_without_a_driver_never_raises_and_says_why(monkeypatch):
    f = probe_mod.probe({"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "0"})
    assert f.gpus == [] and f.source == "probe"
    assert f.versions.python and f.versions.plugin
    assert f.host.memory_total_mib and f.host.memory_total_mib > 0
    if f.nvml_ok is False:
        assert any("NVML" in n for n in f.notes)


@pytest.mark.vllm
def test_probe_reads_versions_from_metadata_without_importing_them():
    before = set(sys.modules)
    f = probe_mod.probe({})
    assert f.versions.vllm == "0.21.0" and f.versions.torch.startswith("2.11")
    assert f.versions.triton and f.versions.flashinfer == "0.6.8.post1"
    assert f.versions.torch_cuda and f.versions.torch_sm75 is True
    newly = set(sys.modules) - before
    assert not {"torch", "triton", "vllm", "flashinfer"} & newly


def test_missing_tools_are_absent_not_errors(tmp_path):
    f = probe_mod.probe({"PATH": str(tmp_path)})
    assert f.toolchain.nvcc_path is None and f.versions.nvcc is None


def test_triton_ptxas_path_is_honoured(tmp_path):
    tool = tmp_path / "ptxas"
    tool.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    tool.chmod(0o755)
    f = probe_mod.probe({"PATH": "/nonexistent", "TRITON_PTXAS_PATH": str(tool)})
    assert f.toolchain.triton_ptxas_path == str(tool) == f.toolchain.ptxas_path
    assert f.versions.ptxas == "12.8"


class _FakeNvml(types.ModuleType):
    """Just enough of pynvml for the probe: GPUs given as (name, (major, minor), MiB, uuid)."""

    def __init__(self, gpus):
        super().__init__("pynvml")
        self.gpus, self.shut = gpus, False

    def nvmlInit(self): pass
    def nvmlShutdown(self): self.shut = True
    def nvmlSystemGetDriverVersion(self): return b"580.95.05"
    def nvmlDeviceGetCount(self): return len(self.gpus)
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetName(self, h): return self.gpus[h][0]
    def nvmlDeviceGetCudaComputeCapability(self, h): return self.gpus[h][1]
    def nvmlDeviceGetMemoryInfo(self, h): return types.SimpleNamespace(total=self.gpus[h][2] * 2**20)
    def nvmlDeviceGetUUID(self, h): return self.gpus[h][3]


MIX = [("NVIDIA GeForce RTX 3090", (8, 6), 24576, "GPU-aaaa-1111"),
       ("NVIDIA GeForce RTX 2080 Ti", (7, 5), 22528, "GPU-bbbb-2222"),
       ("NVIDIA GeForce RTX 2080 Ti", (7, 5), 22528, "GPU-cccc-3333")]


@pytest.mark.parametrize("visible,expect", [
    (None, ["8.6", "7.5", "7.5"]),
    ("1,2", ["7.5", "7.5"]),
    ("2,0", ["7.5", "8.6"]),
    ("GPU-bbbb", ["7.5"]),
    ("1,7,2", ["7.5"]),        # CUDA stops at the first invalid entry
    ("", []),
    ("-1", []),
])
def test_cuda_visible_devices_is_honoured(monkeypatch, visible, expect):
    fake = _FakeNvml(MIX)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    f = probe_mod.probe(env)
    assert [g.compute_capability for g in f.gpus] == expect
    assert [g.index for g in f.gpus] == list(range(len(expect)))
    assert f.versions.driver == "580.95.05" and f.nvml_ok and fake.shut


def test_nvml_failure_midway_is_recorded(monkeypatch):
    fake = _FakeNvml(MIX)

    def broken(h):
        raise RuntimeError("GPU is lost")
    fake.nvmlDeviceGetMemoryInfo = broken
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    f = probe_mod.probe({})
    assert len(f.gpus) == 3 and all(g.memory_total_mib is None for g in f.gpus)
    assert any("GPU is lost" in n for n in f.notes)


def test_load_facts_prefers_the_named_file(write_facts):
    from conftest import facts_dict
    p = write_facts(facts_dict())
    assert probe_mod.load_facts(str(p)).sm75_count == 2
