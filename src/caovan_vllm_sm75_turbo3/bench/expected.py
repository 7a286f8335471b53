"""Which launch profile the server's machine matches, and how the measured speed compares with what
that profile's field report measured.

Matching is caovan-vllm-serve's (facts of the machine, the model's family from its config.json);
the bench sees the model only through the server, so when its config cannot be read here the
profile is picked by the hardware keys alone, and the output says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..errors import CaovanError
from ..policy.profiles import Expected, Profile, ProfileTable, matches, select, setup_of
from ..runtime.facts import Facts
from ..runtime.model import ModelShape, model_shape, read_model

# Below this share of the field number the setup is slower than it should be ("about 100 tok/s").
GAP_RATIO = 0.85


@dataclass(frozen=True)
class ProfileMatch:
    """The matched profile (None when none) and why, in words."""

    profile: Profile | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.profile.name if self.profile else None, "why": self.why}


def model_family_shape(root: str | None) -> ModelShape | None:
    """The model's shape from its directory on this machine (the `root` /v1/models gives), or None."""
    if not root:
        return None
    try:
        model = read_model(root)
    except CaovanError:  # a config no model can have: treat as unreadable here
        return None
    return model_shape(model.config) if model.config else None


def match_profile(table: ProfileTable, facts: Facts, root: str | None, served: str) -> ProfileMatch:
    """The profile for this machine and model; by hardware alone when the model's family is unknown."""
    setup = setup_of(table, facts, model_family_shape(root))
    profile = select(table, setup)
    if profile is not None:
        return ProfileMatch(profile, f"{profile.name} matches {setup.describe()}")
    if setup.family is None:
        by_hardware = [p for p in table.profiles
                       if p.match is not None and matches(p, replace(setup, family=p.match.family))]
        if len(by_hardware) == 1:
            p = by_hardware[0]
            return ProfileMatch(p, f"{p.name} matches this hardware ({setup.describe()}); the config.json of "
                                   f"{served!r} is not readable here, so the model is taken to be "
                                   f"{p.match.family if p.match else '?'}")
        if by_hardware:
            return ProfileMatch(None, f"several profiles fit this hardware ({', '.join(p.name for p in by_hardware)}) "
                                      "and the model's family is unknown")
    why = "; ".join(setup.why_unknown) or "no profile for this setup"
    return ProfileMatch(None, f"no launch profile for {setup.describe()} ({why})")


def no_expected_reason(match: ProfileMatch) -> str:
    """Why there is nothing to compare with."""
    if match.profile is None:
        return f"nothing to compare with: {match.why}"
    return (f"nothing to compare with: profile {match.profile.name} is {match.profile.source.kind}, "
            "not measured (only field-report profiles carry numbers)")


def _closest(runs: list[dict[str, Any]], exp: Expected, metric: str) -> dict[str, Any] | None:
    """The run nearest the field's conditions (its concurrency, then its prompt length) with `metric`."""
    same = [r for r in runs if r["concurrency"] == exp.concurrency and r.get(metric) is not None]
    if not same:
        return None
    target = exp.prompt_tokens or 0
    return min(same, key=lambda r: (abs(r["prompt_tokens"] - target), r["prompt_tokens"]))


def compare(profile: Profile, exp: Expected, runs: list[dict[str, Any]], mtp_seen: bool) -> dict[str, Any]:
    """Measured against expected: decode (with MTP when the server speculates, else without) and prefill."""
    out: dict[str, Any] = {"profile": profile.name, "source": exp.source, "field": exp.to_dict()}
    want = exp.decode_tok_s if mtp_seen or exp.decode_tok_s_without_mtp is None else exp.decode_tok_s_without_mtp
    run = _closest(runs, exp, "decode_tok_s")
    out["decode_tok_s"] = None if run is None else {
        "measured": run["decode_tok_s"], "expected": want, "ratio": round(run["decode_tok_s"] / want, 3),
        "with_mtp": want == exp.decode_tok_s, "prompt_tokens": run["prompt_tokens"], "concurrency": run["concurrency"]}
    run = _closest(runs, exp, "prefill_tok_s")
    if exp.prefill_tok_s is None or run is None:
        out["prefill_tok_s"] = None
    else:
        low = exp.prefill_tok_s[0]
        out["prefill_tok_s"] = {"measured": run["prefill_tok_s"], "expected": list(exp.prefill_tok_s),
                                "ratio": round(run["prefill_tok_s"] / low, 3), "prompt_tokens": run["prompt_tokens"],
                                "concurrency": run["concurrency"]}
    ratios = [v["ratio"] for v in (out["decode_tok_s"], out["prefill_tok_s"]) if v]
    out["gap"] = any(r < GAP_RATIO for r in ratios) if ratios else None
    return out
