"""The allowlist per source variant: an entry's `sources` name each text vLLM's releases ship with the
Tritons those releases pin, so auto mode trusts exactly the (digest, Triton) pairs that were checked
(no cross product), and the offline check compiles the installed text's variant.

Fast lane: no torch or Triton (the selector and the check's build list get fake sources)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from caovan_vllm_sm75_turbo3.cli.turbo_sources import ResolvedKernel, check_builds
from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import (
    KernelEntry, SourceVariant, load_allowlist, parse_allowlist, source_digest)
from caovan_vllm_sm75_turbo3.kernels.turbo.hook import AllowlistSelector

ROOT = Path(__file__).resolve().parents[1]
RELEASES = json.loads((ROOT / "tests/data/fla_variants/fla_release_kernels.json").read_text(encoding="utf-8"))

OLD_TEXT = "def k(x, BV: tl.constexpr): pass"
NEW_TEXT = "def k(x, BV: tl.constexpr, USE_EXP2: tl.constexpr): pass"


def _raw(**extra: Any) -> dict[str, Any]:
    return {"name": "k", "modules": ["m.a", "m.b"], "configs": [{"BV": 32, "num_warps": 4}, {"BV": 64, "num_warps": 4}],
            "check": {"signature": {"x": "*fp16", "BV": "constexpr"}, "constexprs": {"BV": 32}}, **extra}


SOURCES = [
    {"digest": source_digest(OLD_TEXT), "releases": "0.21.0", "triton_versions": ["3.6"],
     "configs": [{"BV": 32, "num_warps": 4}, {"BV": 64, "num_warps": 4}], "evidence": {"compile": "c", "numeric": "n"}},
    {"digest": source_digest(NEW_TEXT), "releases": "0.22.1-0.34.0", "triton_versions": ["3.7", "3.8"],
     "constexprs": {"USE_EXP2": False}, "configs": [{"BV": 32, "num_warps": 4}]},
]


def _entry() -> KernelEntry:
    return parse_allowlist({"kernels": [_raw(sources=SOURCES)]}).kernels[0]


# --- parsing -----------------------------------------------------------------------------------

def test_sources_give_the_digests_and_tritons_as_their_unions() -> None:
    e = _entry()
    assert e.source_sha256 == (source_digest(OLD_TEXT), source_digest(NEW_TEXT))
    assert e.triton_versions == ("3.6", "3.7", "3.8")
    assert e.sources[1] == SourceVariant(digest=source_digest(NEW_TEXT), releases="0.22.1-0.34.0",
                                         triton_versions=("3.7", "3.8"), constexprs={"USE_EXP2": False},
                                         configs=({"BV": 32, "num_warps": 4},))


def test_the_old_form_still_parses_and_has_no_sources() -> None:
    e = parse_allowlist({"kernels": [_raw(source_sha256=["ab"], triton_versions=["3.6"])]}).kernels[0]
    assert (e.source_sha256, e.triton_versions, e.sources) == (("ab",), ("3.6",), ())
    # the constructor the tools and benchmarks call keeps working without sources
    built = KernelEntry(name="k", modules=("m",), source_sha256=("ab",), triton_versions=("3.6.0",),
                        configs=({"num_warps": 4},), check={}, numeric="")
    assert built.sources == () and built.verified("ab", "3.6.0", {}, 4) and not built.verified("cd", "3.6.0", {}, 4)


@pytest.mark.parametrize("field", ["source_sha256", "triton_versions"])
def test_sources_with_a_derived_field_given_too_are_refused(field) -> None:
    with pytest.raises(ValueError, match=r"kernels\[0\].*derived"):
        parse_allowlist({"kernels": [_raw(sources=SOURCES, **{field: ["3.6"]})]})


def test_a_variant_config_the_entry_does_not_list_is_refused() -> None:
    bad = [{**SOURCES[0], "configs": [{"BV": 128, "num_warps": 4}]}]
    with pytest.raises(ValueError, match="does not"):
        parse_allowlist({"kernels": [_raw(sources=bad)]})


# --- pair lookup -------------------------------------------------------------------------------

def test_a_digest_is_verified_only_on_its_own_variants_tritons() -> None:
    e = _entry()
    old, new = source_digest(OLD_TEXT), source_digest(NEW_TEXT)
    assert e.variant_for(old, "3.6.0").releases == "0.21.0"
    assert e.variant_for(new, "3.8.0+git").releases == "0.22.1-0.34.0"
    # the cross product of the entry's unions is not verified: 0.21's text was never built by 3.7
    assert old in e.source_sha256 and "3.7" in e.triton_versions
    assert e.variant_for(old, "3.7.1") is None and e.variant_for(new, "3.6.0") is None
    assert e.variant_for("0" * 16, "3.6.0") is None


def test_the_configs_that_apply_are_the_variants_or_else_the_entrys() -> None:
    e = _entry()
    assert e.configs_for(e.variant_for(source_digest(NEW_TEXT), "3.7.1")) == ({"BV": 32, "num_warps": 4},)
    assert e.configs_for(None) == e.configs
    bare = SourceVariant(digest="x", releases="0.21.0", triton_versions=("3.6",))
    assert e.configs_for(bare) == e.configs


def test_verified_needs_the_variants_constexprs_and_configs() -> None:
    e, new = _entry(), source_digest(NEW_TEXT)
    assert e.verified(new, "3.7.1", {"BV": 32, "USE_EXP2": False}, 4)
    assert not e.verified(new, "3.7.1", {"BV": 32, "USE_EXP2": True}, 4)    # KDA's exp2 path: not checked
    assert not e.verified(new, "3.7.1", {"BV": 64, "USE_EXP2": False}, 4)   # the entry's, not this variant's
    assert not e.verified(new, "3.6.0", {"BV": 32, "USE_EXP2": False}, 4)   # pair not checked


# --- the hook's selector -----------------------------------------------------------------------

def _src(text: str, module: str = "m.b", **constants: Any) -> SimpleNamespace:
    names = ["x", "BV", "USE_EXP2"]
    fn = SimpleNamespace(__name__="k", module=module, arg_names=names, src=text)
    return SimpleNamespace(fn=fn, name="k", constants={(names.index(k),): v for k, v in constants.items()})


SM75 = SimpleNamespace(target=SimpleNamespace(arch=75))


def _opts(num_warps: int = 4) -> SimpleNamespace:
    return SimpleNamespace(arch="sm75", num_warps=num_warps)


def test_strict_selector_accepts_a_verified_pair_and_refuses_the_cross_product() -> None:
    allow = parse_allowlist({"kernels": [_raw(sources=SOURCES)]})
    on_37 = AllowlistSelector(allow, "3.7.1", strict=True)
    assert on_37(_src(NEW_TEXT, BV=32, USE_EXP2=False), SM75, _opts())
    assert not on_37(_src(OLD_TEXT, BV=32), SM75, _opts())                  # 0.21's text on 3.7: not checked
    assert AllowlistSelector(allow, "3.6.0", strict=True)(_src(OLD_TEXT, BV=64), SM75, _opts())
    assert not AllowlistSelector(allow, "3.6.0", strict=True)(_src(NEW_TEXT, BV=32, USE_EXP2=False), SM75, _opts())


def test_on_mode_keeps_the_entrys_configs_and_ignores_digest_and_triton() -> None:
    allow = parse_allowlist({"kernels": [_raw(sources=SOURCES)]})
    on = AllowlistSelector(allow, "3.9.0", strict=False)
    assert on(_src(OLD_TEXT, BV=64), SM75, _opts())
    assert not on(_src(OLD_TEXT, BV=64), SM75, _opts(num_warps=8))


# --- the offline check's builds ----------------------------------------------------------------

def _resolved(text: str, triton: str) -> ResolvedKernel:
    fn = SimpleNamespace(arg_names=["x", "BV", "USE_EXP2"])
    return ResolvedKernel(_entry(), fn, "m.b", source_digest(text), triton_version=triton)


def test_check_compiles_the_installed_texts_variant() -> None:
    builds = list(check_builds(_resolved(NEW_TEXT, "3.7.1")))
    assert [b[0] for b in builds] == [{"BV": 32, "num_warps": 4}]
    cfg, sig, cx, warps, divisible = builds[0]
    assert sig == {"x": "*fp16", "BV": "constexpr", "USE_EXP2": "constexpr"}   # in the kernel's order
    assert cx == {"BV": 32, "USE_EXP2": False} and warps == 4 and divisible == ["x"]
    old = list(check_builds(_resolved(OLD_TEXT, "3.6.0")))
    assert [b[0] for b in old] == [{"BV": 32, "num_warps": 4}, {"BV": 64, "num_warps": 4}]
    assert old[0][1] == {"x": "*fp16", "BV": "constexpr"}


def test_check_says_why_an_unverified_source_builds_plain() -> None:
    assert _resolved(NEW_TEXT, "3.8.0").source_verified
    known = _resolved(NEW_TEXT, "3.6.0")
    assert not known.source_verified and known.variant.releases == "0.22.1-0.34.0"
    assert "verified with Triton 3.7, 3.8, not 3.6.0" in known.unverified_reason()
    unknown = ResolvedKernel(_entry(), SimpleNamespace(arg_names=["x", "BV"]), "m.b", "f" * 16, triton_version="3.6.0")
    assert not unknown.source_verified and unknown.variant is None
    assert unknown.unverified_reason() == (f"source digest {'f' * 16} is not the verified "
                                           f"{source_digest(OLD_TEXT)}, {source_digest(NEW_TEXT)} "
                                           "(auto mode builds it plain)")
    assert [b[0] for b in check_builds(unknown)] == list(_entry().configs)   # today's builds, today's message


# --- the shipped allowlist against the per-release data ------------------------------------------

def _minor(pin: str) -> str:
    return ".".join(pin.lstrip("~=<>!").split(".")[:2])


def _passed(v: dict[str, Any], triton_minor: str, cfg: dict[str, Any], base: dict[str, Any]) -> bool:
    """Whether `cfg` (its keys at the check's base constexprs dropped) passed turbo on that Triton."""
    own = {k: x for k, x in cfg.items() if base.get(k, object()) != x}
    runs = [rows for t, rows in v["checks"].items() if _minor(t) == triton_minor]
    return bool(runs) and all(any(r["build"] == "turbo" and r["ok"] and r["config"] == own for r in rows)
                              for rows in runs)


def test_every_shipped_pair_is_allowlisted_with_configs_that_passed_there() -> None:
    entries = {e.name: e for e in load_allowlist().kernels}
    for v in RELEASES["variants"]:
        entry = entries[v["kernel"]]
        for pin in v["tritons"]:
            variant = entry.variant_for(v["digest"], _minor(pin) + ".0")
            assert variant is not None, (v["kernel"], v["digest"], pin)
            assert dict(variant.constexprs) == v["constexprs"], v["digest"]
            assert variant.releases in (f"{v['first']}-{v['last']}", v["first"]), v["digest"]
            configs = entry.configs_for(variant)
            assert configs, v["digest"]
            for cfg in configs:
                assert _passed(v, _minor(pin), dict(cfg), entry.check["constexprs"]), (v["digest"], pin, cfg)
    shipped = {(v["kernel"], v["digest"]) for v in RELEASES["variants"]}
    listed = {(e.name, s.digest) for e in entries.values() for s in e.sources}
    assert listed == shipped


def test_every_release_module_path_is_on_its_entry() -> None:
    entries = {e.name: e for e in load_allowlist().kernels}
    for version, row in RELEASES["releases"].items():
        for kernel, module in row["modules"].items():
            assert module in entries[kernel].modules, (version, kernel, module)


def test_every_entry_names_a_numeric_check_that_exists() -> None:
    # `numeric` is either a case of kernels/turbo/cases.py (read without importing torch) or the
    # benchmark that checks our own kernels; evidence text belongs in `evidence`, never here
    import ast

    cases_py = ROOT / "src/caovan_vllm_sm75_turbo3/kernels/turbo/cases.py"
    tree = ast.parse(cases_py.read_text(encoding="utf-8"))
    table = next(n for n in tree.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "CASES")
    case_names = {k.value for k in table.value.keys}
    assert "kkt" in case_names   # guards the parse: an empty set would fail every FLA entry below
    for entry in load_allowlist().kernels:
        if "/" in entry.numeric:
            assert (ROOT / entry.numeric).is_file(), f"{entry.name}: numeric {entry.numeric!r} is no file"
        else:
            assert entry.numeric in case_names, f"{entry.name}: numeric {entry.numeric!r} is no case"
