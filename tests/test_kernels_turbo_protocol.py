"""The installed Triton still calls the Turbo hook the way kernels/turbo/protocol.py records for its
release (read from source, no compile), and the hook answers the key-part call of Triton 3.7+.
`bash scripts/test.sh --tritons` runs this against every Triton a supported vLLM release pins."""

from __future__ import annotations

import inspect
import os
import subprocess

import pytest

from caovan_vllm_sm75_turbo3.kernels.turbo.hook import TurboHook
from caovan_vllm_sm75_turbo3.kernels.turbo.pipeline import TURBO_TAG
from caovan_vllm_sm75_turbo3.kernels.turbo.protocol import PROTOCOLS, protocol_for

KEY_PART_CALL = "knobs.runtime.add_stages_inspection_hook()"


def test_protocol_rows_are_found_by_any_patch_release() -> None:
    assert protocol_for("3.7.1") is PROTOCOLS["3.7"] and protocol_for("3.8.0+git1234") is PROTOCOLS["3.8"]
    assert protocol_for("3.9.0") is None and protocol_for("3.10.1") is None


def test_key_part_is_empty_so_unpicked_kernels_keep_tritons_key() -> None:
    hook = TurboHook(selector=lambda *a: False)
    assert hook() == ("", TURBO_TAG)
    chained = TurboHook(selector=lambda *a: False, previous=lambda *a: ("other", "h1") if not a else None)
    assert chained() == ("other", f"{TURBO_TAG}-h1")


@pytest.fixture(scope="module")
def triton_src():
    """The installed Triton's modules the hook relies on, and its protocol row."""
    triton = pytest.importorskip("triton")
    import triton.compiler.compiler as tcc
    from triton.backends.nvidia import compiler as nv
    from triton.runtime import jit

    row = protocol_for(triton.__version__)
    assert row is not None, f"Triton {triton.__version__}: nobody read its hook protocol (kernels/turbo/protocol.py)"
    return row, tcc, nv, jit


@pytest.mark.triton
def test_stages_hook_is_called_with_backend_stages_options_language_capability(triton_src) -> None:
    _, _, nv, _ = triton_src
    src = inspect.getsource(nv.CUDABackend.add_stages)
    assert "knobs.runtime.add_stages_inspection_hook(self, stages, options, language, capability)" in src
    for stage in ("ttir", "ttgir", "llir", "ptx", "cubin"):
        assert f'stages["{stage}"]' in src


@pytest.mark.triton
def test_compile_keys_through_the_module_attribute_we_wrap(triton_src) -> None:
    row, tcc, _, jit = triton_src
    src = inspect.getsource(tcc.compile)
    assert tcc.compile.__globals__ is vars(tcc)       # a wrapped tcc.get_cache_key is the one it calls
    key_at = src.index("key = get_cache_key(src, backend, options, env_vars=env_vars)")
    assert (KEY_PART_CALL in src) == row.key_part_call
    if row.key_part_call:
        assert src.index(KEY_PART_CALL) > key_at and "key += inspect_stages_key" in src
    assert (KEY_PART_CALL in inspect.getsource(jit.JITFunction.run)) == row.key_part_call


@pytest.mark.triton
def test_planning_entry_points_and_options_are_as_recorded(triton_src) -> None:
    row, _, nv, _ = triton_src
    params = {name: list(inspect.signature(getattr(nv.CUDABackend, name)).parameters)
              for name in ("make_ttgir", "make_llir", "make_ptx")}
    assert params == {"make_ttgir": ["mod", "metadata", "opt", "capability"],
                      "make_llir": ["self", "src", "metadata", "options", "capability"],
                      "make_ptx": ["self", "src", "metadata", "opt", "capability"]}
    assert {"arch", "num_stages", "enable_fp_fusion", "ptx_options"} <= set(nv.CUDAOptions.__dataclass_fields__)
    assert "knobs.runtime.override_arch" in inspect.getsource(nv.CUDABackend.parse_options)
    cubin = inspect.getsource(nv.CUDABackend.make_cubin)
    assert all(flag in cubin for flag in row.ptxas_extra)
    assert ("regAllocOptLevel" in cubin) == bool(row.ptxas_extra)


@pytest.mark.triton
def test_bundled_ptxas_is_the_recorded_release(triton_src) -> None:
    row, _, nv, _ = triton_src
    ptxas = os.path.join(os.path.dirname(nv.__file__), "bin", "ptxas")
    out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=60).stdout
    assert f"release {row.bundled_ptxas}," in out
