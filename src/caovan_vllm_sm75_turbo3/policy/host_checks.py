"""Host checks: what on the host, not in vLLM's arguments, slows decode. Pure
functions of facts: the CPU frequency governor, each GPU's PCIe link, power limit, persistence
mode and throttle reasons, and peer-to-peer between the GPUs (all visible ones: tensor parallel
uses the first of them).

Each finding is a WARN whose detail says what was seen and what the field measured for it, and
whose remedy is the one-line fix; both come from data/host_findings.json with their sources.
A value the facts do not know is no finding: a check with nothing known gives no row at all,
one with everything known and fine a PASS row, so the report shows that it ran.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

from ..runtime.facts import Facts, GpuFact
from .check_result import CheckResult, Status


@functools.cache
def findings() -> dict[str, Any]:
    """The finding table (data/host_findings.json): per check name its fix, measurement and source."""
    text = resources.files("caovan_vllm_sm75_turbo3").joinpath("data/host_findings.json").read_text(encoding="utf-8")
    return json.loads(text)


def _warn(name: str, seen: str, *keys: str, **fmt: str) -> CheckResult:
    """A finding: what was seen, then the field measurement and the fix of each entry in `keys`."""
    entries = [findings()[k] for k in keys]
    detail = seen + "".join(f"; field: {e['measured']}" for e in entries)
    return CheckResult(name, Status.WARN, detail, "; ".join(e["fix"].format(**fmt) for e in entries))


def _gpu_list(items: list[str]) -> str:
    return ", ".join(items)


def _smi_index(g: GpuFact) -> int:
    """The index nvidia-smi uses (NVML's, PCI bus order), which differs from CUDA's under
    CUDA_VISIBLE_DEVICES; the probe records it as `nvml_index` then."""
    nvml = g.extra.get("nvml_index")
    return nvml if isinstance(nvml, int) and not isinstance(nvml, bool) and 0 <= nvml < 4096 else g.index


def check_governor(f: Facts) -> CheckResult | None:
    """The CPU frequency governor: anything but `performance` on any CPU is a finding."""
    names = f.host.cpu_governors or ([f.host.cpu_governor] if f.host.cpu_governor else [])
    names = [n for n in names if n != "mixed"]
    if not names:
        return None
    good = findings()["host-cpu-governor"]["good"]
    seen = f"CPU frequency governor {'/'.join(sorted(set(names)))}"
    if all(n in good for n in names):
        return CheckResult("host-cpu-governor", Status.PASS, seen + " on every CPU")
    return _warn("host-cpu-governor", seen, "host-cpu-governor")


def _link(g: GpuFact) -> str:
    width = f"x{g.pcie_width if g.pcie_width is not None else '?'}"
    if g.pcie_width_max is not None and g.pcie_width != g.pcie_width_max:
        width += f" of x{g.pcie_width_max}"
    gen = f" gen {g.pcie_gen or '?'}/{g.pcie_gen_max or '?'}" if g.pcie_gen or g.pcie_gen_max else ""
    return f"GPU {g.index} {width}{gen}"


def check_pcie(f: Facts) -> CheckResult | None:
    """Each GPU's PCIe link: narrower than card and slot allow (reseat), or, with more than one
    GPU, a slot of x4 or less (tensor-parallel all-reduce crosses it). A current generation below
    the maximum is not judged: idle cards lower it to save power."""
    known = [g for g in f.gpus if g.pcie_width is not None or g.pcie_width_max is not None]
    if not known:
        return None
    narrow_max = findings()["gpu-pcie-narrow"]["max_width"]
    degraded = [g for g in known if None not in (g.pcie_width, g.pcie_width_max) and g.pcie_width < g.pcie_width_max]
    slot = {g.index: g.pcie_width_max if g.pcie_width_max is not None else g.pcie_width for g in known}
    narrow = [g for g in known if len(f.gpus) > 1 and slot[g.index] <= narrow_max]
    links = _gpu_list([_link(g) for g in known])
    if not degraded and not narrow:
        return CheckResult("gpu-pcie-link", Status.PASS,
                           f"PCIe {links} (a current gen below the max is idle power saving)")
    keys = (["gpu-pcie-narrow"] if narrow else []) + (["gpu-pcie-degraded"] if degraded else [])
    return _warn("gpu-pcie-link", f"PCIe {links}", *keys)


def check_power(f: Facts) -> CheckResult | None:
    """Each GPU's power limit against its default: below it is a finding (above is the user's choice)."""
    known = [g for g in f.gpus if g.power_limit_w is not None and g.power_limit_default_w is not None]
    if not known:
        return None
    tol = findings()["gpu-power-limit"]["tolerance_w"]
    low = [g for g in known if g.power_limit_w < g.power_limit_default_w - tol]  # type: ignore[operator]
    seen = _gpu_list([f"GPU {g.index} {g.power_limit_w:g} W of default {g.power_limit_default_w:g} W" for g in known])
    if not low:
        return CheckResult("gpu-power-limit", Status.PASS, "power limit " + seen)
    entry = findings()["gpu-power-limit"]
    if len(low) == len(f.gpus) and len({g.power_limit_default_w for g in low}) == 1:
        fix = entry["fix"].format(ids="", default_w=f"{low[0].power_limit_default_w:g}")
    else:
        fix = " && ".join(entry["fix"].format(ids=f"-i {_smi_index(g)} ", default_w=f"{g.power_limit_default_w:g}")
                          for g in low)
    return CheckResult("gpu-power-limit", Status.WARN, f"power limit {seen}; field: {entry['measured']}", fix)


def check_persistence(f: Facts) -> CheckResult | None:
    """Persistence mode: off on any GPU is a finding."""
    known = [g for g in f.gpus if g.persistence_mode is not None]
    if not known:
        return None
    off = [str(g.index) for g in known if not g.persistence_mode]
    if not off:
        on = ", ".join(str(g.index) for g in known)
        return CheckResult("gpu-persistence", Status.PASS, f"persistence mode on (GPU {on})")
    return _warn("gpu-persistence", f"persistence mode off on GPU {', '.join(off)}", "gpu-persistence")


def check_throttle(f: Facts) -> CheckResult | None:
    """Active clocks event reasons: thermal and hardware slowdowns are findings; idle, the power
    cap under load and the others are how a healthy card runs."""
    known = [g for g in f.gpus if g.throttle_reasons is not None]
    if not known:
        return None
    bad = set(findings()["gpu-throttle"]["warn_reasons"])
    seen = _gpu_list([f"GPU {g.index} {'+'.join(g.throttle_reasons or []) or 'none'}" for g in known])
    if not any(bad & set(g.throttle_reasons or []) for g in known):
        return CheckResult("gpu-throttle", Status.PASS, "clocks event reasons: " + seen)
    return _warn("gpu-throttle", "clocks event reasons: " + seen, "gpu-throttle")


def check_p2p(f: Facts) -> CheckResult | None:
    """Peer-to-peer reads between the GPUs, with their active NVLink links: a topology that rules
    P2P out (GPUs under different CPU sockets) or a driver option that turns it off is a finding;
    no P2P on cards that lack it is how those cards run."""
    if len(f.gpus) < 2:
        return None
    count = len(f.gpus)
    pairs = {(g.index, int(peer)): status for g in f.gpus for peer, status in (g.p2p_read or {}).items()
             if int(peer) < count and int(peer) != g.index}
    links = [f"GPU {g.index} {g.nvlink_active_links}" for g in f.gpus if g.nvlink_active_links is not None]
    if not pairs and not links:
        return None
    shown = [f"{i}-{j} {s}" for (i, j), s in sorted(pairs.items()) if i < j or pairs.get((j, i)) != s]
    seen = "; ".join(([f"P2P read {', '.join(shown)}"] if shown else [])
                     + ([f"NVLink active links {', '.join(links)}"] if links else []))
    if not set(findings()["gpu-p2p"]["warn_statuses"]) & set(pairs.values()):
        return CheckResult("gpu-p2p", Status.PASS, seen)
    return _warn("gpu-p2p", seen, "gpu-p2p")


HOST_CHECKS: tuple[Callable[[Facts], CheckResult | None], ...] = (
    check_governor, check_pcie, check_power, check_persistence, check_throttle, check_p2p)


def host_checks(facts: Facts) -> list[CheckResult]:
    """The host checks for `facts`, in report order; a check whose values are all unknown gives no row."""
    return [r for r in (check(facts) for check in HOST_CHECKS) if r is not None]
