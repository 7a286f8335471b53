"""Pure parts of our attention backend (plugin/attention), in any venv: the release table, the
source check of the installed vLLM against its committed row, install() on releases without a
family, and the fp8 cache write bit for bit against torch (Triton's interpreter, in a child)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from helpers.facts import EXAMPLES, ROOT

from caovan_vllm_sm75_turbo3.policy import vllm_versions as vv


@pytest.mark.parametrize("version,family", [("0.21.0", None), ("0.23.0", None), ("0.24.0", "triton-attn-v024"),
                                            ("0.34.0", "triton-attn-v024")])
def test_release_table_names_the_family(version, family):
    assert vv.attention_family(version) == family
    assert vv.has("vllm-fp8-cache-write-on-sm75", version) == (family is None)
    assert vv.has("custom-attention-backend-registry", version)


@pytest.mark.vllm
def test_installed_vllm_matches_its_committed_row():
    tool = [sys.executable, str(ROOT / "tools" / "vllm_attention_conformance.py"), "--installed"]
    done = subprocess.run(tool, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_install_arranges_nothing_where_vllm_serves_fp8_itself(monkeypatch):
    from caovan_vllm_sm75_turbo3.plugin import context
    from caovan_vllm_sm75_turbo3.plugin.attention import controller

    env = {"CAOVAN_FACTS": str(EXAMPLES / "2x2080ti-22g.json")}
    for version in ("0.21.0", "0.35.0"):
        monkeypatch.setattr(context, "vllm_version", lambda v=version: v)
        assert controller.install(ctx=context.ProcessContext(env)) is None


_CHILD = textwrap.dedent("""
    import torch
    from caovan_vllm_sm75_turbo3.kernels.attention.cache_write import write_fp8
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
    for dt, top in ((torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)):
        x = every[torch.isfinite(every) & (every.float().abs() <= top)]
        n = x.numel() // 256
        src = x[: n * 256].reshape(n, 2, 128)
        cache = torch.full((n + 2, 1, 2, 128), float("nan")).to(dt)
        slots = torch.randperm(n + 2)[:n]
        slots[0] = -1  # a padding token: nothing written
        write_fp8(src, cache, slots, torch.ones(1))
        got, ref = cache[slots[1:], 0].view(torch.uint8), src[1:].float().to(dt).view(torch.uint8)
        assert torch.equal(got, ref), (dt, (got != ref).sum())
        untouched = sorted(set(range(n + 2)) - set(slots[1:].tolist()))
        assert len(untouched) == 3 and torch.isnan(cache[untouched].float()).all()
        sat = torch.tensor([[[1e6, -1e6, float("nan"), 3.0] + [0.0] * 124]], dtype=torch.float32)
        one = torch.zeros(1, 1, 1, 128).to(dt)
        write_fp8(sat, one, torch.tensor([0]), torch.tensor([2.0]))
        v = one[0, 0, 0, :4].float()
        assert v[0] == top and v[1] == -top and torch.isnan(v[2]) and v[3] == 1.5, v
    print("ok")
""")


@pytest.mark.torch
def test_fp8_cache_write_is_bit_exact_and_saturates():
    env = {"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
