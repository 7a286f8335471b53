"""Runtime facts as data: what the machine is, serialisable to JSON and back.

A missing piece is `None` (unknown/absent). Unknown keys in a facts file are kept in
`extra` and written back, so a file shared by a user survives a round trip through us.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import FactsError

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
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_sm75(self) -> bool:
        return self.compute_capability == "7.5"

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
        """Load facts; missing keys mean unknown, unknown keys are kept. Raises FactsError."""
        if not isinstance(data, dict):
            raise FactsError(f"facts from {source} must be a JSON object with gpus/host/versions")
        data = dict(data)
        data.pop("schema", None)
        try:
            gpus_raw = data.pop("gpus", None)
            gpus_raw = [] if gpus_raw is None else gpus_raw
            if not isinstance(gpus_raw, list):
                raise TypeError("'gpus' must be a list")
            gpus = []
            for i, g in enumerate(gpus_raw):
                if not isinstance(g, dict):
                    raise TypeError(f"gpus[{i}] must be an object")
                known, extra = _split_known(GpuFact, g)
                known.setdefault("index", i)
                if known.get("compute_capability") is not None:
                    known["compute_capability"] = str(known["compute_capability"])
                gpus.append(GpuFact(**known, extra=extra))
            parts: dict[str, Any] = {}
            for key, kind in (("host", HostFacts), ("versions", Versions), ("toolchain", Toolchain)):
                raw = data.pop(key, None)
                raw = {} if raw is None else raw
                if not isinstance(raw, dict):
                    raise TypeError(f"'{key}' must be an object")
                known, extra = _split_known(kind, raw)
                parts[key] = kind(**known, extra=extra)
            known, extra = _split_known(cls, data)
            known.pop("source", None)  # where these facts came from is where we read them now
            return cls(gpus=gpus, **parts, **known, source=source, extra=extra)
        except TypeError as err:
            raise FactsError(f"facts from {source} do not have the expected shape: {err}") from None

    @classmethod
    def load(cls, path: str | Path) -> Facts:
        """Read a facts JSON file (as written by `caovan-sm75-doctor --json` or by hand)."""
        p = Path(path).expanduser()
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as err:
            raise FactsError(f"cannot read facts file {str(p)!r}: {err.strerror or err}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise FactsError(f"facts file {str(p)!r} is not valid JSON "
                             f"({err.msg} at line {err.lineno} column {err.colno})") from None
        if isinstance(data, dict) and isinstance(data.get("facts"), dict):
            data = data["facts"]  # accept a whole `caovan-sm75-doctor --json` report too
        return cls.from_dict(data, source=str(p))
