"""benchmarks/vllm_fla_sm75.py: vLLM 0.21's FLA GDN chain as the turbo sm_75 PTX the H200 run launches.

A wiring mistake (an argument missing, swapped or extra) would only show on the GPU, whose time is
scarce; these tests catch it here: the arguments each launch passes against the 0.21.0 kernel texts
(no Triton), and, compiled, against each PTX entry's parameter count.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from helpers.turbo_isolation import in_clean_child

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import vllm_fla_sm75 as chain  # noqa: E402


def _runtime_params(kernel: str) -> list[str]:
    """The kernel's parameters that are not tl.constexpr, read from its 0.21.0 copy's text."""
    text = (ROOT / "tests/data/fla_variants" / f"{chain.FILES[kernel]}_0_21_0.py").read_text(encoding="utf-8")
    fn = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == kernel)
    return [a.arg for a in fn.args.args if not (a.annotation is not None and "constexpr" in ast.unparse(a.annotation))]


def test_each_launch_passes_the_kernels_runtime_parameters_in_order() -> None:
    for kernel in chain.CHAIN:
        params = _runtime_params(kernel)
        if kernel == chain.FWD_H:   # gk is a plain parameter that vLLM passes as None: a constexpr in the build
            params.remove("gk")
        assert [p for p, _ in chain.LAUNCH[kernel]] == params, kernel


def test_each_launch_binds_what_vllm_passes_it() -> None:
    # vLLM 0.21 chunk_gated_delta_rule_fwd: solve_tril's Ai is w/u's A, u is fwd_h's v, v_new is o's v
    bound = {k: dict(chain.LAUNCH[k]) for k in chain.CHAIN}
    assert bound[chain.W_U]["A"] == "Ai" and bound[chain.MERGE]["A"] == "A" == bound[chain.KKT]["A"]
    assert bound[chain.FWD_H]["v"] == "u" and bound[chain.FWD_O]["v"] == "v_new" and bound[chain.W_U]["v"] == "v"
    assert all(bound[k].get("g", "gc") == "gc" for k in chain.CHAIN)   # every kernel reads the chunk-local cumsum


def test_grids_are_vllms() -> None:
    assert chain.grid(chain.KKT, {"BK": 64}, 7, 2) == (7, 24, 1) == chain.grid(chain.MERGE, {}, 7, 2)
    assert chain.grid(chain.FWD_H, {"BV": 32}, 7, 2) == (4, 48, 1)
    assert chain.grid(chain.FWD_O, {"BK": 64, "BV": 64}, 7, 2) == (2, 7, 24)


def test_proxy_shared_caps_co_residency_at_turings() -> None:
    h200 = {"shared_per_sm": 65536, "card_shared_per_sm": 233472, "reserved_shared_per_block": 1024,
            "card_shared_per_block_optin": 232448}
    # 16 KiB: 4 per Turing SM; 8 warps: 4 per Turing SM (32 warps); 0 bytes: Turing's 16 blocks
    assert 233472 // (chain.proxy_launch_shared(16384, 2, h200) + 1024) == 4
    assert 233472 // (chain.proxy_launch_shared(5120, 8, h200) + 1024) == 4
    assert 233472 // (chain.proxy_launch_shared(0, 1, h200) + 1024) == 16
    assert chain.proxy_launch_shared(40000, 4, h200) >= 40000


@in_clean_child
@pytest.mark.triton_compile
def test_one_config_per_kernel_compiles_with_the_parameters_the_chain_passes() -> None:
    for kernel in chain.CHAIN:
        b = next(chain.variant_builds(kernel))
        info = chain.compile_build(b)   # SystemExit when the entry's parameters are not LAUNCH's + 2 scratch
        assert chain.ptx_params(info.ptx, info.entry) == len(chain.LAUNCH[kernel]) + 2
        assert info.mma_count > 0, f"{kernel}: no tensor-core mma in the turbo build"
