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
    from helpers.facts import facts_dict
    p = write_facts(facts_dict())
    assert probe_mod.load_facts(str(p)).sm75_count == 2


# The host fields (issue 18): each NVML call may be missing or fail; the value is then unknown.
import pynvml as _real  # noqa: E402  (the real error classes, raised by the fake below)


class _HostNvml(_FakeNvml):
    """_FakeNvml plus the host calls; `values[name][nvml_index]` is a return value or an exception."""

    NVMLError_NotSupported = _real.NVMLError_NotSupported
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, gpus, values):
        super().__init__(gpus)
        self.p2p_calls = []
        for name, per in values.items():
            setattr(self, name, self._answer(per))

    @staticmethod
    def _answer(per):
        def call(h, *rest):
            v = per(h, *rest) if callable(per) else per[h]
            if isinstance(v, BaseException):
                raise v
            return v
        return call


TWO = [("NVIDIA GeForce RTX 2080 Ti", (7, 5), 22528, f"GPU-{i}") for i in range(3)]
GOOD = {
    "nvmlDeviceGetCurrPcieLinkGeneration": [1, 1, 3],
    "nvmlDeviceGetMaxPcieLinkGeneration": [3, 3, 3],
    "nvmlDeviceGetCurrPcieLinkWidth": [16, 4, 8],
    "nvmlDeviceGetMaxPcieLinkWidth": [16, 16, 8],
    "nvmlDeviceGetPowerManagementLimit": [250000, 200000, 260500],
    "nvmlDeviceGetPowerManagementDefaultLimit": [250000, 250000, 250000],
    "nvmlDeviceGetPersistenceMode": [1, 0, 1],
    "nvmlDeviceGetCurrentClocksEventReasons": [0x1, 0x4 | 0x40, 0],
    # two links on GPU 0 then a link number past the board's; no NVLink on 1; lost GPU 2
    "nvmlDeviceGetNvLinkState": lambda h, link: (
        (1 if link < 2 else _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)) if h == 0
        else _real.NVMLError_NotSupported() if h == 1 else _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)),
    "nvmlDeviceGetP2PStatus": lambda a, b, cap: (
        TypeError("the caps index must be an int") if cap != 0 else 0 if {a, b} == {0, 1} else 3),
}


def test_host_fields_from_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _HostNvml(TWO, GOOD))
    f = probe_mod.probe({})
    g0, g1, g2 = f.gpus
    assert (g0.pcie_gen, g0.pcie_gen_max, g0.pcie_width, g0.pcie_width_max) == (1, 3, 16, 16)
    assert (g1.pcie_width, g1.pcie_width_max, g2.pcie_width) == (4, 16, 8)
    assert (g0.power_limit_w, g0.power_limit_default_w, g1.power_limit_w, g2.power_limit_w) == (250.0, 250.0, 200.0, 260.5)
    assert [g.persistence_mode for g in f.gpus] == [True, False, True]
    assert [g.throttle_reasons for g in f.gpus] == [["gpu_idle"], ["sw_power_cap", "hw_thermal_slowdown"], []]
    assert [g.nvlink_active_links for g in f.gpus] == [2, 0, None]
    assert g0.p2p_read == {"1": "ok", "2": "ioh_topology_not_supported"}
    assert g2.p2p_read == {"0": "ioh_topology_not_supported", "1": "ioh_topology_not_supported"}
    assert f.notes == []  # unsupported host fields are unknown, never a note


def test_p2p_is_keyed_by_cuda_index_under_visible_devices(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _HostNvml(TWO, GOOD))
    f = probe_mod.probe({"CUDA_VISIBLE_DEVICES": "2,0"})
    assert f.gpus[0].p2p_read == {"1": "ioh_topology_not_supported"} and f.gpus[1].pcie_width == 16
    assert f.gpus[0].extra == {"nvml_index": 2}


@pytest.mark.parametrize("error", [_real.NVMLError_NotSupported(), _real.NVMLError_FunctionNotFound(),
                                   _real.NVMLError_NoPermission(), RuntimeError("driver gone")])
def test_failing_host_calls_are_unknown(monkeypatch, error):
    failing = {name: (lambda *a, e=error: e) for name in GOOD}
    failing["nvmlDeviceGetCurrentClocksThrottleReasons"] = lambda *a, e=error: e
    monkeypatch.setitem(sys.modules, "pynvml", _HostNvml(TWO, failing))
    f = probe_mod.probe({})
    for g in f.gpus:
        assert (g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max) == (None,) * 4
        assert (g.power_limit_w, g.power_limit_default_w, g.persistence_mode) == (None,) * 3
        assert g.throttle_reasons is None and g.p2p_read is None
        # NVLink "not supported" means no active link; any other failure leaves it unknown
        assert g.nvlink_active_links == (0 if isinstance(error, _real.NVMLError_NotSupported) else None)
    assert len(f.gpus) == 3 and f.notes == [] and f.gpus[0].memory_total_mib == 22528


def test_missing_host_functions_and_the_older_throttle_call(monkeypatch):
    fake = _HostNvml(TWO, {"nvmlDeviceGetCurrentClocksThrottleReasons": [0x8, 0x20, 0x80]})
    monkeypatch.setitem(sys.modules, "pynvml", fake)  # an old nvidia-ml-py: no other host call
    f = probe_mod.probe({})
    assert [g.throttle_reasons for g in f.gpus] == [["hw_slowdown"], ["sw_thermal_slowdown"],
                                                    ["hw_power_brake_slowdown"]]
    assert all(g.pcie_width is None and g.nvlink_active_links is None and g.p2p_read is None for g in f.gpus)


@pytest.mark.parametrize("bad", [-1, 2**70, True, "16", 16.0, None, b"1"])
def test_odd_nvml_values_are_unknown(monkeypatch, bad):
    odd = {name: [bad] * 3 for name in GOOD if name not in ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetP2PStatus")}
    odd["nvmlDeviceGetP2PStatus"] = lambda a, b, cap: bad
    odd["nvmlDeviceGetNvLinkState"] = lambda h, link: bad
    monkeypatch.setitem(sys.modules, "pynvml", _HostNvml(TWO, odd))
    g = probe_mod.probe({}).gpus[0]
    assert (g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max) == (None,) * 4
    assert (g.power_limit_w, g.power_limit_default_w, g.persistence_mode) == (None,) * 3
    assert g.p2p_read is None and g.throttle_reasons is None
    assert g.nvlink_active_links is None
