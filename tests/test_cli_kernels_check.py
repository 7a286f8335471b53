"""Every allowlisted kernel, taken from the installed vLLM 0.21's FLA ops, compiles for sm_75
through the hook with 0 spills, <= 64 KiB shared memory, mma present and dot FMAs gone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.turbo_isolation import in_clean_child

# [_prep_kernel] builds every pinned GDN prep spec plain and turbo: 121 s with a cold Triton cache on a
# loaded 2-core machine, so an explicit limit well over 3x that.
pytestmark = [in_clean_child, pytest.mark.triton_compile, pytest.mark.vllm, pytest.mark.timeout(900)]

pytest.importorskip("triton")
pytest.importorskip("vllm")

from caovan_vllm_sm75_turbo3.cli.turbo_sources import check_kernel, resolve  # noqa: E402
from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import load_allowlist  # noqa: E402

ENTRIES = load_allowlist().kernels


def test_the_allowlist_names_the_vllm_fla_gdn_kernels() -> None:
    names = {e.name for e in ENTRIES}
    assert {"recompute_w_u_fwd_kernel", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
            "chunk_fwd_kernel_o"} <= names
    for e in ENTRIES:
        for evidence in [v.evidence for v in e.sources] or [e.evidence]:
            assert e.configs and e.triton_versions and evidence.get("compile") and evidence.get("numeric"), e.name


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_allowlisted_kernel_compiles_for_sm75_through_the_hook(entry) -> None:
    kernel = resolve(entry)
    assert kernel.module.startswith("vllm.") or kernel.module.startswith("caovan_vllm_sm75_turbo3.")
    assert kernel.source_verified, f"{entry.name}: installed source {kernel.digest} differs from the verified one"
    rows = check_kernel(kernel)
    # the configs of the installed text's variant (vLLM 0.21's on Triton 3.6 here)
    assert rows and len(rows) == 2 * (len(entry.configs_for(kernel.variant)) if "specs" not in entry.check
                                      else len(rows) // 2)
    for plain, turbo in zip(rows[0::2], rows[1::2]):
        assert (plain.build, turbo.build) == ("plain", "turbo")
        assert plain.ok, (plain.config, plain.problems)   # a fallback may be slow, never fail to launch
        assert turbo.ok, (turbo.config, turbo.problems)
        assert turbo.spill_bytes == 0 and turbo.shared_bytes <= 65536
        assert turbo.mma_count > 0 and plain.mma_count == 0
        assert turbo.fma_count <= 0.05 * plain.fma_count


def test_check_command_json_lists_every_build() -> None:
    r = subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.kernels", "check", "--json",
                        "--kernel", "recompute_w_u_fwd_kernel"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)
    assert {(row["kernel"], row["build"]) for row in rows} == {
        ("recompute_w_u_fwd_kernel", "plain"), ("recompute_w_u_fwd_kernel", "turbo")}
    for row in rows:
        assert {"kernel", "build", "shared_bytes", "spill_bytes", "mma_count", "fma_count", "ok"} <= set(row)


def test_check_command_refuses_an_unknown_kernel_in_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.kernels", "check", "--kernel", "nope"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "caovan-sm75-kernels: error: --kernel nope" in r.stderr
    assert "Traceback" not in r.stderr
