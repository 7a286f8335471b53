"""The profile validator: every profile, for every vLLM release it claims, must produce
arguments that release's `vllm serve` accepts, and no two profiles may match one setup.

Releases are checked against data/vllm_flags.json, the argument table read from each
released vLLM's source by tools/extract_vllm_flags.py (flags, choices, attention backends,
the keys and enumerated values of the JSON configs we fill, deprecated flags). The test
suite also feeds the 0.21 arguments to vLLM 0.21's own parser. Pure: the tables and
the example models come in as arguments.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from ..runtime.facts import Facts, GpuFact, HostFacts, Versions
from ..runtime.model import ModelFacts, model_shape
from . import vllm_versions as vv
from .attention import fp8_kv_on_sm75
from .check_result import Status
from .checks import check_host_memory
from .decision import decide_for_model
from .fill_base import FilledArg
from .launch_fill import fill_launch
from .profiles import Profile, ProfileTable, overlapping
from .vllm_args import read_vllm_args


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a profile (or a pair of them) for one release."""

    profile: str
    release: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.profile} @ vLLM {self.release}" if self.release else self.profile
        return f"{where}: {self.message}"


def load_flag_table() -> dict[str, Any]:
    """The committed argument table (package data)."""
    text = resources.files("caovan_vllm_sm75_turbo3").joinpath("data/vllm_flags.json").read_text(encoding="utf-8")
    return json.loads(text)


def _json_keys(flag: str, raw: str | None, keys: Sequence[str], enums: Mapping[str, Sequence[str]]) -> list[str]:
    try:
        cfg = json.loads(raw or "")
    except json.JSONDecodeError:
        return [f"{flag} {raw!r} is not JSON"]
    if not isinstance(cfg, dict):
        return [f"{flag} must be a JSON object"]
    out = [f"{flag} key {k!r} is not known to this release" for k in cfg if k not in keys]
    for key, allowed in enums.items():
        if key in cfg and str(cfg[key]) not in allowed:
            out.append(f"{flag} {key}={cfg[key]!r} is not one of {', '.join(allowed)}")
    return out


def check_args(args: Iterable[FilledArg], release: Mapping[str, Any], version: str) -> list[str]:
    """What in `args` vLLM `version` (its flag table entry `release`) would not accept, or
    could not serve on SM75."""
    flags = set(release["flags"])
    problems: list[str] = []
    for a in args:
        flag = a.flag
        base = "--" + flag[5:] if flag.startswith("--no-") and flag not in flags else flag
        if base not in flags:
            problems.append(f"{flag} is not an argument of vllm serve {version}")
            continue
        if base in release.get("deprecated", []):
            problems.append(f"{flag} is deprecated in vLLM {version}")
        allowed = release["choices"].get(base) or release.get("known_values", {}).get(base)
        if allowed and a.value is not None and a.value not in allowed:
            problems.append(f"{flag} {a.value!r} is not one of vLLM {version}'s values ({', '.join(allowed)})")
        if base == "--attention-backend":
            if a.value not in release["attention_backends"]:
                problems.append(f"--attention-backend {a.value!r} is not a backend of vLLM {version}")
            elif a.value == "FLASHINFER" and not vv.has("flashinfer-on-sm75", version):
                problems.append(f"--attention-backend FLASHINFER is refused below SM80 in vLLM {version}")
        if base == "--kv-cache-dtype" and a.value and a.value.startswith("fp8") and not fp8_kv_on_sm75(version):
            problems.append(f"--kv-cache-dtype {a.value} has no SM75 backend in vLLM {version}")
        if base == "--compilation-config":
            problems += _json_keys(flag, a.value, release["compilation_config_keys"],
                                   {"cudagraph_mode": release["cudagraph_modes"]})
        if base == "--speculative-config":
            problems += _json_keys(flag, a.value, release["speculative_config_keys"],
                                   {"method": release["speculative_methods"]})
    return problems


def example_facts(table: ProfileTable, profile: Profile, version: str) -> Facts:
    """A machine at the bottom of the profile's keys (fewest MiB of its GPU class, least host
    memory), with this vLLM release."""
    m = profile.match
    assert m is not None
    mib = table.gpu_classes[m.gpu_class][0]
    gpus = [GpuFact(index=i, name=f"example {m.gpu_class}", compute_capability="7.5", memory_total_mib=mib)
            for i in range(m.gpu_count)]
    return Facts(gpus=gpus, host=HostFacts(memory_total_mib=int(m.host_min_gib * 1024)),
                 versions=Versions(vllm=version), source=f"example for {profile.name}")


def without_mtp(model: ModelFacts) -> ModelFacts:
    """The same model with its MTP weights gone (a checkpoint that dropped them)."""
    return replace(model, mtp_weights=0)


def validate_table(table: ProfileTable, flag_table: Mapping[str, Any],
                   models: Mapping[str, Sequence[ModelFacts]]) -> list[Problem]:
    """Every problem with `table`: overlapping profiles, releases without an argument table,
    arguments a claimed release would refuse, and a documented minimum our own checks refuse. `models` gives example model directories
    per family (each is also checked without its MTP weights)."""
    problems = [Problem(f"{a} / {b}", None, "both match one setup (contradictory profiles: narrow a "
                        "vLLM range, host memory range or GPU class)") for a, b in overlapping(table)]
    if problems:
        return problems  # which profile a setup gets is undefined until they are separated
    releases = flag_table["releases"]
    for profile in table.profiles:
        assert profile.match is not None
        examples = models.get(profile.match.family, ())
        if not examples:
            problems.append(Problem(profile.name, None, f"no example model for family {profile.match.family}"))
        for mm in profile.match.releases():
            if mm not in releases:
                problems.append(Problem(profile.name, mm, "no argument table for this release "
                                        "(run tools/extract_vllm_flags.py on its wheel)"))
                continue
            version = f"{mm}.0"
            facts = example_facts(table, profile, version)
            host = check_host_memory(facts)
            if host.status is Status.FAIL:
                problems.append(Problem(profile.name, mm, f"our own check refuses its documented minimum: "
                                        f"host-memory=FAIL ({host.detail})"))
            for model in [m for ex in examples for m in (ex, without_mtp(ex))]:
                fill = fill_launch(decide_for_model(facts, model_shape(model.config)), model,
                                   read_vllm_args([model.path]), table)
                if fill.profile != profile.name:
                    problems.append(Problem(profile.name, mm, f"its own example machine selects {fill.profile}"))
                problems += [Problem(profile.name, mm, p) for p in check_args(fill.args, releases[mm], version)]
    for mm in releases:
        version = f"{mm}.0"
        facts = Facts(gpus=[GpuFact(index=i, compute_capability="7.5", memory_total_mib=8192) for i in range(2)],
                      host=HostFacts(memory_total_mib=32768), versions=Versions(vllm=version))
        for model in [m for exs in models.values() for ex in exs for m in (ex, without_mtp(ex))]:
            fill = fill_launch(decide_for_model(facts, model_shape(model.config)), model,
                               read_vllm_args([model.path]), table)
            problems += [Problem("conservative", mm, p) for p in check_args(fill.args, releases[mm], version)]
    return problems
