"""The launch profile table (data/profiles.json) and matching a machine and model to it.

A profile is keyed by GPU count, GPU memory class, host memory, vLLM release range and model
family; `match` returns every profile whose keys all hold. The table is checked when loaded
(known keys and types only) and by the validator (no two profiles can match one setup), so
`select` finding two is a broken table, never a choice. Loading reads only package data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import CaovanError, SettingError
from ..runtime.facts import Facts
from ..runtime.model import ModelShape
from ..versions import minor, minor_key

SCHEMA = 1
# Launch fields a profile may set, with their JSON types (bool is checked before int).
LAUNCH_FIELDS: dict[str, type | tuple[type, ...]] = {
    "tensor_parallel_size": int, "dtype": str, "gpu_memory_utilization": float, "headroom_mib": int,
    "kv_cache_dtype": str, "attention_backend": str, "max_num_seqs": int, "max_model_len_cap": int,
    "max_num_batched_tokens": int, "prefix_caching": bool, "speculative_tokens": int,
    "cudagraph_mode": str, "custom_all_reduce": bool, "extra_args": dict,
}
MATCH_FIELDS = ("gpu_count", "gpu_class", "host_memory_gib", "vllm", "family")
_MIB_PER_GIB = 1024


class ProfileTableError(CaovanError):
    """The profile table (ours or one given to the validator) is not well formed."""


@dataclass(frozen=True)
class Source:
    """Where a profile's numbers came from: field-report, carried, derived or rule."""

    kind: str
    detail: str
    where: str = ""


@dataclass(frozen=True)
class Expected:
    """What a field-report profile measured, for the bench to compare with: decode tok/s per stream
    (with and without MTP), the prefill tok/s range at `prompt_tokens`, at `concurrency` streams."""

    decode_tok_s: float
    decode_tok_s_without_mtp: float | None
    prefill_tok_s: tuple[float, float] | None
    prompt_tokens: int | None
    output_tokens: int | None
    concurrency: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, as in profiles.json."""
        return {"decode_tok_s": self.decode_tok_s, "decode_tok_s_without_mtp": self.decode_tok_s_without_mtp,
                "prefill_tok_s": list(self.prefill_tok_s) if self.prefill_tok_s else None,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "concurrency": self.concurrency, "source": self.source}


@dataclass(frozen=True)
class Match:
    """The setup a profile is for. Ranges are inclusive; `None` is open."""

    gpu_count: int
    gpu_class: str
    host_min_gib: float
    host_max_gib: float | None
    vllm_min: str
    vllm_max: str
    family: str

    def overlaps(self, other: Match) -> bool:
        """Whether some machine and model could satisfy both."""
        if (self.gpu_count, self.gpu_class, self.family) != (other.gpu_count, other.gpu_class, other.family):
            return False
        lo = max(self.host_min_gib, other.host_min_gib)
        hi = min(x for x in (self.host_max_gib, other.host_max_gib, float("inf")) if x is not None)
        if lo > hi:
            return False
        return max(minor_key(self.vllm_min), minor_key(other.vllm_min)) <= \
            min(minor_key(self.vllm_max), minor_key(other.vllm_max))

    def releases(self) -> list[str]:
        """Every release (major.minor) the profile claims, within one major version."""
        (major, lo), (_, hi) = minor_key(self.vllm_min), minor_key(self.vllm_max)
        return [f"{major}.{m}" for m in range(lo, hi + 1)]

    def describe(self) -> str:
        host = f">= {self.host_min_gib:g}" + (f" and <= {self.host_max_gib:g}" if self.host_max_gib else "")
        return (f"{self.gpu_count} x {self.gpu_class} GPU, host {host} GiB, vLLM {self.vllm_min}-{self.vllm_max}, "
                f"{self.family}")


@dataclass(frozen=True)
class Profile:
    name: str
    match: Match | None            # None for the conservative fallback
    launch: dict[str, Any]
    source: Source
    expected: Expected | None = None  # measured numbers: field-report profiles only


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    speculative_method: str | None = None


@dataclass(frozen=True)
class ProfileTable:
    gpu_classes: dict[str, tuple[int, int]]
    families: dict[str, Family]
    profiles: tuple[Profile, ...]
    conservative: Profile
    origin: str = "package data"

    def by_name(self, name: str, where: str = "--profile / CAOVAN_PROFILE") -> Profile:
        """The named profile; SettingError naming where the name came from (`where`) and listing the
        names when there is none."""
        for p in self.profiles:
            if p.name == name:
                return p
        names = ", ".join(p.name for p in self.profiles)
        raise SettingError(f"{where}={name!r} is not a launch profile: use auto, none or one of {names}.")


@dataclass(frozen=True)
class Setup:
    """What matching reads: the machine's GPUs, host memory and vLLM, and the model's family.
    `why_unknown` says why a key could not be read (mixed GPUs, an unknown memory size, ...)."""

    gpu_count: int
    gpu_class: str | None
    gpu_memory_mib: int | None
    host_gib: float | None
    vllm: str | None
    family: str | None
    why_unknown: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        host = f"{self.host_gib:.0f} GiB" if self.host_gib is not None else "unknown"
        return (f"{self.gpu_count} x {self.gpu_class or 'unknown-class'} GPU, host {host}, "
                f"vLLM {self.vllm or 'unknown'}, {self.family or 'unknown family'}")


def _need(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise ProfileTableError(f"{where}: missing {key!r}")
    value = obj[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise ProfileTableError(f"{where}: {key!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _launch(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProfileTableError(f"{where}: 'launch' must be an object")
    out: dict[str, Any] = {}
    for key in raw:
        if key not in LAUNCH_FIELDS:
            raise ProfileTableError(f"{where}: unknown launch field {key!r} (known: {', '.join(LAUNCH_FIELDS)}); "
                                    "a vLLM flag without a rule goes in extra_args")
        out[key] = _need(raw, key, LAUNCH_FIELDS[key], where)
    for flag in out.get("extra_args", {}):
        if not str(flag).startswith("--"):
            raise ProfileTableError(f"{where}: extra_args key {flag!r} must be a long vLLM flag (--name)")
    return out


def _source(raw: Any, where: str) -> Source:
    if not isinstance(raw, dict):
        raise ProfileTableError(f"{where}: 'source' must say where the numbers came from")
    return Source(kind=_need(raw, "kind", str, where), detail=_need(raw, "detail", str, where),
                  where=str(raw.get("where", "")))


_EXPECTED_KEYS = ("decode_tok_s", "decode_tok_s_without_mtp", "prefill_tok_s", "prompt_tokens", "output_tokens",
                  "concurrency", "source")
_MAX_TOK_S = 1e6  # no Turing setup decodes or prefills a million tokens a second


def _rate(raw: dict[str, Any], key: str, where: str) -> float:
    value = _need(raw, key, float, where)
    if not 0 < value < _MAX_TOK_S:
        raise ProfileTableError(f"{where}: {key!r} must be a number of tokens per second above 0, got {value!r}")
    return value


def _expected(raw: Any, source: Source, where: str) -> Expected | None:
    """The `expected` block: only a field report measured anything, so only it may carry one."""
    if raw is None:
        return None
    where = f"{where} expected"
    if not isinstance(raw, dict):
        raise ProfileTableError(f"{where}: must be an object")
    if source.kind != "field-report":
        raise ProfileTableError(f"{where}: only a field-report profile has measured numbers (this one is "
                                f"{source.kind!r})")
    unknown = sorted(set(raw) - set(_EXPECTED_KEYS))
    if unknown:
        raise ProfileTableError(f"{where}: unknown keys {unknown} (known: {', '.join(_EXPECTED_KEYS)})")
    prefill = None
    if raw.get("prefill_tok_s") is not None:
        pair = _need(raw, "prefill_tok_s", list, where)
        if len(pair) != 2:
            raise ProfileTableError(f"{where}: 'prefill_tok_s' must be [low, high]")
        low, high = (_rate({"prefill_tok_s": v}, "prefill_tok_s", where) for v in pair)
        if low > high:
            raise ProfileTableError(f"{where}: 'prefill_tok_s' low {low:g} is above high {high:g}")
        prefill = (low, high)
    without = None if raw.get("decode_tok_s_without_mtp") is None else _rate(raw, "decode_tok_s_without_mtp", where)
    tokens = {k: None if raw.get(k) is None else _need(raw, k, int, where) for k in ("prompt_tokens", "output_tokens")}
    concurrency = _need(raw, "concurrency", int, where)
    if any(v is not None and v < 1 for v in (concurrency, *tokens.values())):
        raise ProfileTableError(f"{where}: 'concurrency', 'prompt_tokens' and 'output_tokens' must be whole "
                                "numbers >= 1")
    text = _need(raw, "source", str, where)
    if not text.strip():
        raise ProfileTableError(f"{where}: 'source' must say who measured it, on what")
    return Expected(_rate(raw, "decode_tok_s", where), without, prefill, tokens["prompt_tokens"],
                    tokens["output_tokens"], concurrency, text)


def parse_table(data: Any, origin: str = "package data") -> ProfileTable:
    """Build a table from its JSON form. Raises ProfileTableError naming the first problem."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ProfileTableError(f"profile table ({origin}): expected an object with schema {SCHEMA}")
    classes = {}
    for name, c in _need(data, "gpu_classes", dict, origin).items():
        classes[name] = (_need(c, "min_mib", int, f"gpu class {name}"), _need(c, "max_mib", int, f"gpu class {name}"))
    families = {}
    for name, f in _need(data, "families", dict, origin).items():
        archs = _need(f, "architectures", list, f"family {name}")
        families[name] = Family(name, tuple(str(a) for a in archs), f.get("speculative_method"))
    cons_raw = _need(data, "conservative", dict, origin)
    conservative = Profile("conservative", None, _launch(cons_raw.get("launch"), "conservative"),
                           _source(cons_raw.get("source"), "conservative"))
    profiles = []
    seen: set[str] = set()
    for i, raw in enumerate(_need(data, "profiles", list, origin)):
        where = f"profiles[{i}]"
        name = _need(raw, "name", str, where)
        where = f"profile {name}"
        if name in seen or name in ("auto", "none", "conservative"):
            raise ProfileTableError(f"{where}: the name is taken (duplicate or reserved)")
        seen.add(name)
        m = _need(raw, "match", dict, where)
        unknown = set(m) - set(MATCH_FIELDS)
        if unknown:
            raise ProfileTableError(f"{where}: unknown match keys {sorted(unknown)} (known: {', '.join(MATCH_FIELDS)})")
        host = _need(m, "host_memory_gib", dict, where)
        vllm = _need(m, "vllm", dict, where)
        match = Match(gpu_count=_need(m, "gpu_count", int, where), gpu_class=_need(m, "gpu_class", str, where),
                      host_min_gib=float(host.get("min", 0)),
                      host_max_gib=float(host["max"]) if host.get("max") is not None else None,
                      vllm_min=_need(vllm, "min", str, where), vllm_max=_need(vllm, "max", str, where),
                      family=_need(m, "family", str, where))
        if match.gpu_class not in classes:
            raise ProfileTableError(f"{where}: gpu_class {match.gpu_class!r} is not one of {sorted(classes)}")
        if match.family not in families:
            raise ProfileTableError(f"{where}: family {match.family!r} is not one of {sorted(families)}")
        try:
            if minor_key(match.vllm_min) > minor_key(match.vllm_max):
                raise ProfileTableError(f"{where}: vllm min {match.vllm_min} is above max {match.vllm_max}")
        except ValueError:
            raise ProfileTableError(f"{where}: vllm min/max must be releases like '0.21'") from None
        source = _source(raw.get("source"), where)
        profiles.append(Profile(name, match, _launch(raw.get("launch"), where), source,
                                _expected(raw.get("expected"), source, where)))
    return ProfileTable(classes, families, tuple(profiles), conservative, origin)


def load_table(path: str | Path | None = None) -> ProfileTable:
    """Our table from package data, or the JSON file at `path` (the validator's input)."""
    if path is None:
        text = resources.files("caovan_vllm_sm75_turbo3").joinpath("data/profiles.json").read_text(encoding="utf-8")
        origin = "package data/profiles.json"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise ProfileTableError(f"cannot read profile table {str(path)!r}: {err.strerror or err}") from None
        origin = str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileTableError(f"profile table {origin} is not valid JSON ({err.msg} at line {err.lineno})") from None
    return parse_table(data, origin)


def gpu_class(table: ProfileTable, memory_mib: int | None) -> str | None:
    """The memory class ('11G', '22G', ...) of a GPU with this much memory, or None."""
    if memory_mib is None:
        return None
    for name, (lo, hi) in table.gpu_classes.items():
        if lo <= memory_mib <= hi:
            return name
    return None


def family_of(table: ProfileTable, shape: ModelShape | None) -> str | None:
    """The model family of a parsed config, by architecture name."""
    if shape is None or shape.architecture is None:
        return None
    for fam in table.families.values():
        if shape.architecture in fam.architectures:
            return fam.name
    return None


def setup_of(table: ProfileTable, facts: Facts, shape: ModelShape | None) -> Setup:
    """Read the matching keys from the facts and the model."""
    why: list[str] = []
    sm75 = [g for g in facts.gpus if g.is_sm75]
    if len(sm75) != len(facts.gpus):
        why.append(f"{len(facts.gpus) - len(sm75)} visible GPU(s) are not SM75")
    mems = [g.memory_total_mib for g in sm75]
    known = [m for m in mems if m is not None]
    classes = {gpu_class(table, m) for m in mems}
    cls = classes.pop() if len(classes) == 1 else None
    if sm75 and len(known) != len(mems):
        why.append("GPU memory size unknown")
    elif sm75 and cls is None:
        sizes = ", ".join(f"{m} MiB" for m in sorted(set(known)))
        why.append(f"GPU memory ({sizes}) is not one class of {', '.join(table.gpu_classes)}")
    host = facts.host.memory_total_mib
    family = family_of(table, shape)
    if shape is None:
        why.append("the model's config.json could not be read")
    elif family is None:
        why.append(f"no profile family for architecture {shape.architecture}")
    if facts.versions.vllm is None:
        why.append("vLLM version unknown")
    all_sm75 = len(sm75) == len(facts.gpus)
    return Setup(gpu_count=len(sm75), gpu_class=cls if all_sm75 else None,
                 gpu_memory_mib=min(known) if known else None,
                 host_gib=host / _MIB_PER_GIB if host is not None else None,
                 vllm=minor(facts.versions.vllm), family=family, why_unknown=tuple(why))


def matches(profile: Profile, setup: Setup) -> bool:
    """Whether every key of `profile` holds for `setup` (unknown keys never match)."""
    m = profile.match
    if m is None or setup.vllm is None or setup.host_gib is None or setup.gpu_class is None:
        return False
    if (m.gpu_count, m.gpu_class, m.family) != (setup.gpu_count, setup.gpu_class, setup.family):
        return False
    if setup.host_gib < m.host_min_gib or (m.host_max_gib is not None and setup.host_gib > m.host_max_gib):
        return False
    return minor_key(m.vllm_min) <= minor_key(setup.vllm) <= minor_key(m.vllm_max)


def missed_rule(profile: Profile, setup: Setup) -> str | None:
    """The one rule of `profile` for this GPU setup and model family that `setup` fails (host memory
    or the vLLM range), in words with both numbers; None when it fails none, more than one, or is
    for other GPUs or models (then it is not a near miss)."""
    m = profile.match
    if m is None or setup.vllm is None or setup.host_gib is None or setup.gpu_class is None:
        return None
    if (m.gpu_count, m.gpu_class, m.family) != (setup.gpu_count, setup.gpu_class, setup.family):
        return None   # another machine or model: nothing to force
    failed = []
    if setup.host_gib < m.host_min_gib or (m.host_max_gib is not None and setup.host_gib > m.host_max_gib):
        failed.append(f"it needs host memory >= {m.host_min_gib:g} GiB; this host has {setup.host_gib:.0f} GiB")
    if not minor_key(m.vllm_min) <= minor_key(setup.vllm) <= minor_key(m.vllm_max):
        failed.append(f"it is for vLLM {m.vllm_min}-{m.vllm_max}; this is vLLM {setup.vllm}")
    return failed[0] if len(failed) == 1 else None


def select(table: ProfileTable, setup: Setup) -> Profile | None:
    """The one profile for `setup`, or None. Two matches mean the table is broken."""
    found = [p for p in table.profiles if matches(p, setup)]
    if len(found) > 1:
        raise ProfileTableError(f"profiles {', '.join(p.name for p in found)} all match {setup.describe()}: "
                                "the table must not overlap (run the profile validator)")
    return found[0] if found else None


def overlapping(table: ProfileTable) -> list[tuple[str, str]]:
    """Pairs of profiles that some setup would match both of."""
    out = []
    for i, a in enumerate(table.profiles):
        for b in table.profiles[i + 1:]:
            if a.match and b.match and a.match.overlaps(b.match):
                out.append((a.name, b.name))
    return out
