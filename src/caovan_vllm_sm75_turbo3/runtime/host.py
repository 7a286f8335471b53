"""Host facts the host checks judge: the CPU and its frequency governor from /proc and sysfs
(under a root path, so tests can point at a fake tree), and per GPU its PCIe link, NVLink,
power limit, persistence mode, throttle reasons and peer-to-peer status from NVML.

Read-only, no root, no CUDA context. Every read may be missing or fail: the value is then
None (unknown), never an exception and never a note, since most of them are simply not
supported on some boards or drivers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .facts import NAME_RE

MAX_CPUS = 8192  # more cpu* directories than any machine has: a bound on the sysfs walk
# NVML's clocks event (throttle) reason bits (nvml.h, nvmlClocksEventReason*), by our name.
THROTTLE_REASONS: dict[str, int] = {
    "gpu_idle": 0x1, "applications_clocks": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clocks": 0x100}
# NVML's nvmlGpuP2PStatus_t values, by our name.
P2P_STATUSES: dict[int, str] = {
    0: "ok", 1: "chipset_not_supported", 2: "gpu_not_supported", 3: "ioh_topology_not_supported",
    4: "disabled_by_regkey", 5: "not_supported", 6: "unknown"}
# nvmlGpuP2PCapsIndex_t READ. pynvml's own NVML_P2P_CAPS_INDEX_READ is the tuple `(0,)` (a stray
# comma in nvidia-ml-py), which ctypes cannot pass.
_P2P_CAPS_INDEX_READ = 0
_NVML_FEATURE_ENABLED = 1
_MAX_NVLINKS = 64


def _read_small(path: Path, limit: int = 256) -> str | None:
    try:
        with path.open("rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def cpu_model(root: Path = Path("/")) -> str | None:
    """The first "model name" of /proc/cpuinfo (None where there is none, as on many ARM hosts)."""
    try:
        with (root / "proc/cpuinfo").open(encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh):
                if n > 200:  # the first CPU's block is a few dozen lines
                    break
                if line.startswith("model name") and ":" in line:
                    return line.split(":", 1)[1].strip()[:200] or None
    except OSError:
        return None
    return None


def cpu_governors(root: Path = Path("/")) -> list[str]:
    """The scaling governor of every CPU that has one (a VM or container often has none)."""
    base = root / "sys/devices/system/cpu"
    try:
        cpus = sorted(p for p in base.iterdir() if re.fullmatch(r"cpu[0-9]+", p.name))[:MAX_CPUS]
    except OSError:
        return []
    out = []
    for cpu in cpus:
        text = _read_small(cpu / "cpufreq" / "scaling_governor")
        name = text.strip() if text else ""
        if NAME_RE.fullmatch(name):
            out.append(name)
    return out


def governor_summary(governors: Sequence[str]) -> tuple[str | None, list[str] | None]:
    """(`cpu_governor`, `cpu_governors`): the one governor or "mixed", and the distinct ones."""
    distinct = sorted(set(governors))
    if not distinct:
        return None, None
    return (distinct[0] if len(distinct) == 1 else "mixed"), distinct


def _call(fn: Callable[..., Any] | None, *args: Any) -> Any:
    """One NVML call; None when the function is missing (old driver or nvidia-ml-py) or fails."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported, FunctionNotFound, NoPermission, GpuIsLost ...
        return None


def _whole(value: Any, lo: int, hi: int) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi else None


def _watts(milliwatts: Any) -> float | None:
    w = _whole(milliwatts, 1000, 5_000_000)
    return round(w / 1000, 1) if w is not None else None


def nvlink_active_links(nvml: Any, handle: Any) -> int | None:
    """Active NVLink links: 0 where NVLink is not supported, None where the answer is unknown."""
    fn = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
    links = _whole(getattr(nvml, "NVML_NVLINK_MAX_LINKS", None), 1, _MAX_NVLINKS)
    if fn is None or links is None:
        return None
    not_supported = getattr(nvml, "NVMLError_NotSupported", None)
    if not (isinstance(not_supported, type) and issubclass(not_supported, BaseException)):
        not_supported = ()  # catches nothing: every failure then reads as unknown
    active = 0
    for link in range(links):
        try:
            state = _whole(fn(handle, link), 0, 1)
        except not_supported:
            break  # no NVLink here, or no link with this number: the count so far is the answer
        except Exception:  # a link number past the board's (InvalidArgument), or a failure
            return active if link else None
        if state is None:
            return None
        active += state == _NVML_FEATURE_ENABLED
    return active


def throttle_reasons(nvml: Any, handle: Any) -> list[str] | None:
    """The active clocks event reasons by name (the newer NVML call first, then the older)."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        bits = _whole(_call(getattr(nvml, name, None), handle), 0, 2**64 - 1)
        if bits is not None:
            return [n for n, bit in THROTTLE_REASONS.items() if bits & bit]
    return None


def gpu_fields(nvml: Any, handle: Any) -> dict[str, Any]:
    """The GpuFact host fields of one GPU (a key per field, None where unknown)."""
    def get(name: str) -> Any:
        return _call(getattr(nvml, name, None), handle)
    persistence = _whole(get("nvmlDeviceGetPersistenceMode"), 0, 1)
    return {
        "pcie_gen": _whole(get("nvmlDeviceGetCurrPcieLinkGeneration"), 1, 32),
        "pcie_gen_max": _whole(get("nvmlDeviceGetMaxPcieLinkGeneration"), 1, 32),
        "pcie_width": _whole(get("nvmlDeviceGetCurrPcieLinkWidth"), 1, 64),
        "pcie_width_max": _whole(get("nvmlDeviceGetMaxPcieLinkWidth"), 1, 64),
        "power_limit_w": _watts(get("nvmlDeviceGetPowerManagementLimit")),
        "power_limit_default_w": _watts(get("nvmlDeviceGetPowerManagementDefaultLimit")),
        "persistence_mode": None if persistence is None else persistence == _NVML_FEATURE_ENABLED,
        "nvlink_active_links": nvlink_active_links(nvml, handle),
        "throttle_reasons": throttle_reasons(nvml, handle)}


def p2p_read(nvml: Any, handles: Sequence[Any]) -> list[dict[str, str] | None]:
    """Per GPU (in `handles` order, the CUDA-visible order), its P2P read status with every other
    GPU, keyed by the peer's position; None for a GPU where no pair could be read."""
    fn = getattr(nvml, "nvmlDeviceGetP2PStatus", None)
    out: list[dict[str, str] | None] = []
    for i, h in enumerate(handles):
        peers = {}
        for j, other in enumerate(handles):
            status = _whole(_call(fn, h, other, _P2P_CAPS_INDEX_READ), 0, 255) if i != j else None
            if status in P2P_STATUSES:
                peers[str(j)] = P2P_STATUSES[status]
        out.append(peers or None)
    return out
