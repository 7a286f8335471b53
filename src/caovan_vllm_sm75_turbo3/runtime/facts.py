"""Runtime facts as data: what the machine is, serialisable to JSON and back.

A missing piece is `None` (unknown/absent). Unknown keys in a facts file are kept in
`extra` and written back, so a file shared by a user survives a round trip through us.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .. import safe_json
from ..errors import CaovanException, FactsError
from ..kernels.gdn_capability import DISPATCH_CAPABILITY

FACTS_SCHEMA = 1


def _split_known(cls: type, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    names = {f.name for f in fields(cls)} - {"extra"}
    known = {k: v for k, v in data.items() if k in names}
    extra = {k: v for k, v in data.items() if k not in names and k != "extra"}
    return known, extra


@dataclass
class GpuFact:
    """One visible GPU, as NVML reports it (index is the CUDA-visible index)."""

    index: int
    name: str | None = None
    compute_capability: str | None = None  # "7.5"
    memory_total_mib: int | None = None
    uuid: str | None = None
    # The link and power state the host checks judge (policy/host_checks.py); all from NVML.
    pcie_gen: int | None = None          # current generation: idle GPUs lower it to save power
    pcie_gen_max: int | None = None      # the most this card and its slot allow
    pcie_width: int | None = None        # current lanes
    pcie_width_max: int | None = None    # the most this card and its slot allow (a x4 slot: 4)
    power_limit_w: float | None = None
    power_limit_default_w: float | None = None
    persistence_mode: bool | None = None
    nvlink_active_links: int | None = None  # 0 where NVLink is not supported
    throttle_reasons: list[str] | None = None  # active clocks event reasons (THROTTLE_REASONS names)
    p2p_read: dict[str, str] | None = None  # peer CUDA index -> P2P read status (P2P_STATUSES name)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_sm75(self) -> bool:
        """A Turing GPU: the product's target, and where the dispatch runs our GDN kernel."""
        return self.compute_capability == "{}.{}".format(*DISPATCH_CAPABILITY)

    @property
    def sm(self) -> int | None:
        """75 for "7.5"; None when unknown or unreadable."""
        try:
            major, minor = (int(p) for p in str(self.compute_capability).split("."))
        except ValueError:
            return None
        return major * 10 + minor


@dataclass
class HostFacts:
    memory_total_mib: int | None = None
    memory_available_mib: int | None = None
    swap_total_mib: int | None = None
    cpu_model: str | None = None
    cpu_count: int | None = None
    cpu_governor: str | None = None  # the frequency governor of every CPU, or "mixed"
    cpu_governors: list[str] | None = None  # the distinct governors, sorted
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Versions:
    """Versions read from package metadata and tool output; never by importing torch/vllm."""

    python: str | None = None
    torch: str | None = None
    torch_cuda: str | None = None
    torch_sm75: bool | None = None  # does torch's CUDA arch list contain sm_75
    triton: str | None = None
    vllm: str | None = None
    flashinfer: str | None = None
    nvcc: str | None = None
    ptxas: str | None = None
    driver: str | None = None
    plugin: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Toolchain:
    nvcc_path: str | None = None
    ptxas_path: str | None = None
    triton_ptxas_path: str | None = None  # TRITON_PTXAS_PATH, when set
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Facts:
    """Everything the checks and the policy read about a machine."""

    gpus: list[GpuFact] = field(default_factory=list)
    host: HostFacts = field(default_factory=HostFacts)
    versions: Versions = field(default_factory=Versions)
    toolchain: Toolchain = field(default_factory=Toolchain)
    # Where the facts came from ("probe" or the file path) and notes on what could not be read.
    source: str = "probe"
    notes: list[str] = field(default_factory=list)
    nvml_ok: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def sm75_count(self) -> int:
        return sum(1 for g in self.gpus if g.is_sm75)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; `extra` keys are merged back at their level."""
        def flat(obj: Any) -> Any:
            if isinstance(obj, dict):
                extra = obj.pop("extra", None) or {}
                out = {k: flat(v) for k, v in obj.items()}
                out.update(extra)
                return out
            if isinstance(obj, list):
                return [flat(x) for x in obj]
            return obj
        data = flat(asdict(self))
        data["schema"] = FACTS_SCHEMA
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "file") -> Facts:
        """Load facts; missing keys mean unknown, unknown keys are kept. Raises FactsError
        naming the key path and what it accepts when a known key has the wrong type or range."""
        try:
            if not isinstance(data, dict):
                raise _Shape("must be a JSON object with gpus/host/versions")
            safe_json.check_depth(data)
            data = dict(data)
            data.pop("schema", None)
            gpus_raw = data.pop("gpus", None)
            gpus_raw = [] if gpus_raw is None else gpus_raw
            if not isinstance(gpus_raw, list):
                raise _Shape("'gpus' must be a list")
            if len(gpus_raw) > _LIMITS["index"][1] + 1:
                raise _Shape(f"'gpus' lists {len(gpus_raw)} GPUs; at most {_LIMITS['index'][1] + 1} are accepted")
            gpus = [_gpu(g, i) for i, g in enumerate(gpus_raw)]
            parts: dict[str, Any] = {}
            for key, kind in (("host", HostFacts), ("versions", Versions), ("toolchain", Toolchain)):
                raw = data.pop(key, None)
                raw = {} if raw is None else raw
                if not isinstance(raw, dict):
                    raise _Shape(f"'{key}' must be an object")
                known, extra = _section(kind, raw, key)
                parts[key] = kind(**known, extra=extra)
            data.pop("source", None)  # where these facts came from is where we read them now
            known, extra = _section(cls, data, "")
            v = parts["versions"]
            if v.torch_sm75 is None and v.torch_cuda:   # read as the probe reads it (torch_sm75_from_cuda)
                parts["versions"] = replace(v, torch_sm75=torch_sm75_from_cuda(v.torch_cuda))
            return cls(gpus=gpus, **parts, **known, source=source, extra=extra)
        except (_Shape, safe_json.BadJson) as err:
            detail = str(err) if isinstance(err, _Shape) else f"the data {err}"
            raise FactsError(f"facts from {source} do not have the expected shape: {detail}") from None

    @classmethod
    def load(cls, path: str | Path) -> Facts:
        """Read a facts JSON file (as written by `caovan-sm75-doctor --json` or by hand).

        Only a regular file up to 16 MiB of strict UTF-8 JSON is read; a FIFO or device is
        refused before reading, so it cannot hang the command. Raises FactsError.
        """
        p = Path(path).expanduser()
        try:
            data = safe_json.load_file(p, MAX_FACTS_BYTES)
        except OSError as err:
            raise FactsError(f"cannot read facts file {str(p)!r}: {err.strerror or err}") from None
        except safe_json.BadJson as err:
            raise FactsError(f"facts file {str(p)!r} {err}; it must be a JSON object as written by "
                             "caovan-sm75-doctor --json") from None
        if isinstance(data, dict) and isinstance(data.get("facts"), dict):
            data = data["facts"]  # accept a whole `caovan-sm75-doctor --json` report too
        return cls.from_dict(data, source=str(p))


# Official PyTorch CUDA wheels that ship sm_75 kernels (every CUDA 11.8 to 13.x build does; CUDA 13
# dropped sm_50 to sm_70 but kept Turing). A source build may differ.
_TORCH_CUDA_WITH_SM75 = re.compile(r"^(11\.8|12\.\d+|13\.\d+)$")


def torch_sm75_from_cuda(torch_cuda: str) -> bool:
    """Whether an official torch wheel built for this CUDA version carries sm_75 kernels."""
    return bool(_TORCH_CUDA_WITH_SM75.match(torch_cuda))


class _Shape(CaovanException, ValueError):
    """A facts value of the wrong type or range; the message names its key path."""


MAX_FACTS_BYTES = 16 * 2**20  # real facts files are a few KiB
_MAX_MIB = 2**31  # 2 PiB: far above any machine, far below float trouble
# Accepted ranges of the whole-number fields, by field name (the same name means the same unit).
_LIMITS: dict[str, tuple[int, int]] = {
    "index": (0, 1023), "memory_total_mib": (0, _MAX_MIB), "memory_available_mib": (0, _MAX_MIB),
    "swap_total_mib": (0, _MAX_MIB), "cpu_count": (1, 2**20), "pcie_gen": (1, 32), "pcie_gen_max": (1, 32),
    "pcie_width": (1, 64), "pcie_width_max": (1, 64), "nvlink_active_links": (0, 64)}
_FLOAT_LIMITS: dict[str, tuple[float, float]] = {"power_limit_w": (1.0, 5000.0), "power_limit_default_w": (1.0, 5000.0)}
# Names we print in check details and banner lines: short identifiers, never free text.
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,40}")  # used with fullmatch
_NAMED = {"cpu_governor", "cpu_governors", "throttle_reasons", "p2p_read"}


def _field_value(name: str, hint: str, value: Any, where: str) -> Any:
    """One known field checked against its declared type; None (unknown) always passes, and for a
    list or map field that cannot be None it means empty."""
    if value is None:
        if "None" not in hint and hint.startswith(("list", "dict")):
            return [] if hint.startswith("list") else {}
        return None
    path = f"{where}.{name}" if where else name
    if name == "compute_capability" and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)  # 7.5 written as a number is still "7.5"
    if hint.startswith("int"):
        lo, hi = _LIMITS.get(name, (0, 2**31))
        whole = int(value) if isinstance(value, float) and value.is_integer() else value
        if isinstance(whole, bool) or not isinstance(whole, int) or not lo <= whole <= hi:
            raise _Shape(f"'{path}' must be a whole number from {lo} to {hi} or null, not {safe_json.short(value)}")
        value = whole
    elif hint.startswith("str"):
        if not isinstance(value, str):
            raise _Shape(f"'{path}' must be a string or null, not {safe_json.short(value)}")
    elif hint.startswith("bool"):
        if not isinstance(value, bool):
            raise _Shape(f"'{path}' must be true, false or null, not {safe_json.short(value)}")
    elif hint.startswith("float"):
        lo_f, hi_f = _FLOAT_LIMITS[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo_f <= value <= hi_f:
            raise _Shape(f"'{path}' must be a number from {lo_f:g} to {hi_f:g} or null, not {safe_json.short(value)}")
        value = float(value)
    elif hint.startswith("list[str]"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _Shape(f"'{path}' must be a list of strings, not {safe_json.short(value)}")
    elif hint.startswith("dict[str, str]"):
        value = _peer_map(value, path)
    if name in _NAMED:
        _names(value, path)
    return value


def _peer_map(value: Any, path: str) -> dict[str, str]:
    """A map from a GPU index, written as a JSON key ("1"), to a status name."""
    lo, hi = _LIMITS["index"]

    def good(k: Any, v: Any) -> bool:
        return isinstance(k, str) and bool(re.fullmatch("[0-9]{1,4}", k)) and lo <= int(k) <= hi and isinstance(v, str)
    if not isinstance(value, dict) or not all(good(k, v) for k, v in value.items()):
        raise _Shape(f"'{path}' must map GPU indices (\"0\" to \"{hi}\") to status names, not {safe_json.short(value)}")
    return dict(value)


def _names(value: Any, path: str) -> None:
    """Names we print must be short identifiers: a facts file cannot smuggle text into a report line."""
    items = [value] if isinstance(value, str) else list(value.values()) if isinstance(value, dict) else value
    bad = next((v for v in items if not NAME_RE.fullmatch(v)), None)
    if bad is not None:
        raise _Shape(f"'{path}' must hold names of letters, digits, '_', '.' or '-' (up to 40), "
                     f"not {safe_json.short(bad)}")


def _section(cls: type, raw: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One section's known fields, each checked against its declared type, and its unknown keys."""
    known, extra = _split_known(cls, raw)
    hints = {f.name: str(f.type) for f in fields(cls)}
    return {k: _field_value(k, hints[k], v, where) for k, v in known.items()}, extra


def _gpu(raw: Any, i: int) -> GpuFact:
    if not isinstance(raw, dict):
        raise _Shape(f"gpus[{i}] must be an object")
    known, extra = _section(GpuFact, raw, f"gpus[{i}]")
    if known.get("index") is None:
        known["index"] = i
    return GpuFact(**known, extra=extra)
