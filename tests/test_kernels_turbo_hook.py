"""The runtime hook inside Triton's own compile (triton.compile for sm_75, no GPU needed):
allowlisted kernels build turbo, others exactly as Triton would, failures fall back with the
reason logged once, and the rewrite is part of the cache key."""

from __future__ import annotations

import logging
import re

import pytest

from helpers.turbo_isolation import in_clean_child

pytestmark = [in_clean_child, pytest.mark.triton_compile]

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from caovan_vllm_sm75_turbo3.kernels.turbo import pipeline  # noqa: E402
from caovan_vllm_sm75_turbo3.kernels.turbo.compile import jit_function  # noqa: E402
from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import (  # noqa: E402
    Allowlist, load_allowlist, parse_allowlist, source_digest)
from caovan_vllm_sm75_turbo3.kernels.turbo.hook import AllowlistSelector, current_hook, installed  # noqa: E402
from caovan_vllm_sm75_turbo3.kernels.turbo.pipeline import TURBO_TAG  # noqa: E402

from helpers.turbo_kernels import DOT_SIG, tile_dot_kernel  # noqa: E402

TILE = {"BM": 64, "BN": 64, "BK": 32}


@pytest.fixture(autouse=True)
def _no_interpreter(monkeypatch):
    """Triton cannot compile while TRITON_INTERPRET=1 (another test module may set it)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.fixture(autouse=True)
def fresh_triton_cache(tmp_path, monkeypatch):
    """Each test compiles for real: a cache hit would skip the stages the hook changes."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))


def _compile(num_warps: int = 4, tile: dict | None = None):
    src = ASTSource(jit_function(tile_dot_kernel), DOT_SIG, tile or TILE)
    return triton.compile(src, target=GPUTarget("cuda", 75, 32), options={"num_warps": num_warps})


RUNNING = ".".join(triton.__version__.split(".")[:2])   # the lane's Triton: 3.6 here, 3.7/3.8 in --tritons


def _allow(configs=({"BM": 64, "num_warps": 4},), digest: str | None = None, versions=(RUNNING,)) -> Allowlist:
    return parse_allowlist({"kernels": [{
        "name": "tile_dot_kernel", "modules": ["helpers.turbo_kernels"],
        "source_sha256": [digest or source_digest(jit_function(tile_dot_kernel).src)],
        "triton_versions": list(versions), "configs": list(configs), "check": {}}]})


def test_kernel_not_on_the_allowlist_compiles_exactly_as_plain_triton() -> None:
    plain = _compile()
    with installed(AllowlistSelector(load_allowlist(), triton.__version__)) as hook:
        hooked = _compile()
    assert current_hook() is None
    assert hooked.asm["ptx"] == plain.asm["ptx"] and hooked.asm["cubin"] == plain.asm["cubin"]
    assert hooked.hash == plain.hash                     # same cache key: shares Triton's cache entry
    assert not hasattr(hooked.metadata, "caovan_turbo") and not hook.built and not hook.fell_back


def test_allowlisted_kernel_builds_turbo_with_its_own_cache_key(caplog) -> None:
    plain = _compile()
    with caplog.at_level(logging.INFO, logger="caovan_vllm_sm75_turbo3"):
        with installed(AllowlistSelector(_allow(), triton.__version__)) as hook:
            turbo = _compile()
    assert turbo.metadata.caovan_turbo == TURBO_TAG and turbo.metadata.num_stages == 1
    assert "mma.sync.aligned.m16n8k8" in turbo.asm["ptx"] and "m16n8k16" not in turbo.asm["ptx"]
    assert "mma.sync" not in plain.asm["ptx"]
    assert turbo.hash != plain.hash                      # rewritten and plain never share an entry
    assert re.search(r"^\.target sm_75", turbo.asm["ptx"], re.MULTILINE)
    assert turbo.asm["cubin"][:4] == b"\x7fELF"
    assert hook.built == {"tile_dot_kernel"}
    assert any("tile_dot_kernel built for sm_75 tensor cores" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("why, allow, warps", [
    ("config not verified", lambda: _allow(), 8),
    ("other Triton version", lambda: _allow(versions=("3.5",)), 4),
    ("source changed", lambda: _allow(digest="0" * 16), 4),
])
def test_strict_selection_builds_plain_when_anything_differs(why, allow, warps) -> None:
    plain = _compile(num_warps=warps)
    with installed(AllowlistSelector(allow(), triton.__version__, strict=True)):
        hooked = _compile(num_warps=warps)
    assert hooked.asm["ptx"] == plain.asm["ptx"] and hooked.hash == plain.hash, why


def test_on_mode_ignores_version_and_digest_but_not_the_config() -> None:
    sel = AllowlistSelector(_allow(digest="0" * 16, versions=("9.9",)), triton.__version__, strict=False)
    with installed(sel):
        assert hasattr(_compile(num_warps=4).metadata, "caovan_turbo")
        assert not hasattr(_compile(num_warps=8).metadata, "caovan_turbo")


def test_broken_rewrite_falls_back_to_the_plain_build_and_says_why_once(monkeypatch, caplog) -> None:
    plain_64 = _compile(tile={"BM": 64, "BN": 64, "BK": 32})
    plain_32 = _compile(tile={"BM": 64, "BN": 64, "BK": 16})

    def broken(ptx: str):   # leaves the sm_80 mma in place but claims sm_75: ptxas must refuse it
        return pipeline.RewriteResult(ptx=ptx.replace(".target sm_80", ".target sm_75"), mma_split=0, cvt_split=0)

    monkeypatch.setattr(pipeline, "rewrite_ptx", broken)
    with caplog.at_level(logging.INFO, logger="caovan_vllm_sm75_turbo3"):
        with installed(AllowlistSelector(_allow(), triton.__version__)) as hook:
            got_64 = _compile(tile={"BM": 64, "BN": 64, "BK": 32})
            got_32 = _compile(tile={"BM": 64, "BN": 64, "BK": 16})
    assert got_64.asm["ptx"] == plain_64.asm["ptx"] and got_64.asm["cubin"] == plain_64.asm["cubin"]
    assert got_32.asm["ptx"] == plain_32.asm["ptx"]
    assert not hasattr(got_64.metadata, "caovan_turbo")
    assert "ptxas" in hook.fell_back["tile_dot_kernel"] and not hook.built
    warnings = [r.getMessage() for r in caplog.records if "builds plain" in r.getMessage()]
    assert len(warnings) == 1 and "tile_dot_kernel" in warnings[0] and "ptxas" in warnings[0]


def test_installing_twice_and_uninstalling_restores_triton() -> None:
    import triton.compiler.compiler as tcc
    from triton import knobs

    key_fn, before = tcc.get_cache_key, knobs.runtime.add_stages_inspection_hook
    sel = AllowlistSelector(_allow(), triton.__version__)
    with installed(sel):
        with installed(sel):
            assert current_hook() is not None
        assert current_hook() is not None               # the outer install came back
    assert tcc.get_cache_key is key_fn and knobs.runtime.add_stages_inspection_hook is before
