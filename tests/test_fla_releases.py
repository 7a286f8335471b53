"""vLLM's FLA GDN forward kernels per supported release (tools/fla_releases.py, docs/fla-releases.md).

The data file and the standalone copies in tests/data/fla_variants/ are committed; these tests check
them against each other, against the release pins and the allowlist, and compile, with the Triton
installed here, one recorded passing config of each variant that ships with it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers.turbo_isolation import in_clean_child

from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import load_allowlist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import fla_releases  # noqa: E402

DATA = fla_releases.load()


def test_every_supported_release_has_a_row_with_its_triton_pin() -> None:
    pins = fla_releases.release_pins()
    assert list(DATA["releases"]) == list(pins)
    for version, row in DATA["releases"].items():
        assert row["triton"] == pins[version], version
        assert set(row["digests"]) == set(fla_releases.KERNELS), version


def test_each_release_digest_is_one_variant_that_lists_that_release() -> None:
    variants = {(v["kernel"], v["digest"]): v for v in DATA["variants"]}
    assert len(variants) == len(DATA["variants"])
    for version, row in DATA["releases"].items():
        for kernel, digest in row["digests"].items():
            v = variants[(kernel, digest)]
            assert version in v["releases"] and row["triton"] in v["tritons"], (version, kernel)
    for v in DATA["variants"]:
        assert v["first"] == v["releases"][0] and v["last"] == v["releases"][-1]


def test_committed_copies_carry_the_release_digests() -> None:
    for v in DATA["variants"]:
        assert fla_releases.digest_of_file(fla_releases.VARIANTS / v["file"], v["kernel"]) == v["digest"], v["file"]
    listed = {v["file"] for v in DATA["variants"]}
    assert {p.name for p in fla_releases.VARIANTS.glob("*.py")} == listed


def test_0_21_digests_are_the_allowlisted_ones() -> None:
    # The allowlist's digests come from the installed vLLM 0.21; the extractor must agree with them.
    allow = {e.name: e.source_sha256 for e in load_allowlist().kernels if e.source_sha256}
    first = DATA["releases"]["0.21.0"]["digests"]
    for name, digests in allow.items():
        if name in first:
            assert first[name] in digests, name


def test_changed_variants_carry_a_read_summary() -> None:
    for v in DATA["variants"]:
        assert v["change"] == "the 0.21.0 text" or fla_releases.CHANGES[v["digest"]] in v["change"], v["file"]


def test_doc_table_is_what_the_data_says() -> None:
    doc = fla_releases.DOC.read_text(encoding="utf-8")
    got = doc.split(fla_releases.BEGIN + "\n", 1)[1].split("\n" + fla_releases.END, 1)[0]
    assert got == fla_releases.render(DATA), "docs/fla-releases.md is stale: run tools/fla_releases.py check --record"


def test_pin_matching() -> None:
    assert fla_releases.pin_matches("~=3.8.0", "3.8.0") and fla_releases.pin_matches("~=3.8.0", "3.8.1")
    assert fla_releases.pin_matches("3.7.1", "3.7.1+git1") and not fla_releases.pin_matches("3.7.1", "3.7.0")
    assert not fla_releases.pin_matches("~=3.8.0", "3.9.0")


@pytest.mark.triton
def test_each_copy_loads_with_the_release_digest_as_triton_sees_it() -> None:
    # load_variant raises when the JITFunction's src (what the hook digests) is not the release's text
    for v in DATA["variants"]:
        fn = fla_releases.load_variant(v)
        spec = fla_releases.check_spec(v, fn)
        assert list(spec["signature"]) == [p.name for p in fn.params]


@in_clean_child
@pytest.mark.triton_compile
def test_variants_shipped_with_this_triton_still_pass_their_recorded_config() -> None:
    import triton

    shipped = fla_releases.shipped_here(DATA, triton.__version__)
    if not shipped:
        pytest.skip(f"no supported vLLM release pins Triton {triton.__version__}")
    recorded = [v for v in shipped if triton.__version__ in v["checks"]]
    assert recorded == shipped, f"no recorded check on Triton {triton.__version__}: run fla_releases.py check --record"
    compiled = 0
    for v in shipped:
        # one passing config per variant keeps the lane short (docs/fla-releases.md); the record has the rest
        passing = [r["config"] for r in v["checks"][triton.__version__] if r["build"] == "turbo" and r["ok"]]
        if not passing:
            continue
        rows = fla_releases.check_variant(v, passing[:1])
        assert all(r.ok for r in rows), json.dumps([fla_releases.row_dict(r) for r in rows])
        compiled += 1
    assert compiled, "no variant has a passing config recorded for this Triton"


SYNTHETIC = '''import os
from vllm.triton_utils import tl, triton
from .op import exp
BKV_LIST = [64, 128] if check_shared_mem() else [32, 64]
SCALE = 2
RUNTIME = os.environ.get("X", "a")


@triton.jit
def helper(x):
    return x * SCALE


@triton.heuristics({"USE_G": lambda args: args["g"] is not None})
@triton.autotune(
    configs=[triton.Config({"BK": BK}, num_warps=w, num_stages=s) for BK in BKV_LIST for w in [2, 4] for s in [2, 3]],
    key=["K"],
)
@triton.jit(do_not_specialize=["T"])
def kern(x, T, BK: tl.constexpr):
    y = helper(exp(x))
    return min(y, T)


@triton.jit
def bad(x):
    return x + RUNTIME
'''
OP = "import triton.language as tl\nif os.environ.get('FLA_USE_FAST_OPS') == '1':\n    exp = 1\nelse:\n    exp = tl.exp\n"


def test_turing_configs_evaluate_the_autotune_list_as_a_2080_ti_and_drop_stages() -> None:
    assert fla_releases.turing_configs(SYNTHETIC, "kern") == [
        {"BK": 32, "num_warps": 2}, {"BK": 32, "num_warps": 4}, {"BK": 64, "num_warps": 2}, {"BK": 64, "num_warps": 4}]


def test_standalone_copy_keeps_the_jit_text_and_copies_what_it_reads() -> None:
    text = fla_releases.standalone_module(SYNTHETIC, "kern", {"op": OP}, "a test")
    assert "exp = tl.exp\n" in text and "SCALE = 2\n" in text and "def helper(x):" in text
    assert "@triton.autotune(" not in text and "@triton.heuristics(" not in text
    assert text.endswith('@triton.jit(do_not_specialize=["T"])\ndef kern(x, T, BK: tl.constexpr):\n'
                         "    y = helper(exp(x))\n    return min(y, T)\n")
    with pytest.raises(LookupError, match="RUNTIME"):
        fla_releases.standalone_module(SYNTHETIC, "bad", {"op": OP}, "a test")   # a computed global is not copied
