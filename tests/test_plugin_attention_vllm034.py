"""Our attention backend against a real vLLM 0.24+ (the newest supported, 0.34, in .venv-vllm034).

Registration through the after-import hook, selection by vLLM's own CUDA platform code on a faked
SM75 capability, and the impl's forward / cache update calling our kernel and cache write with
vLLM's arguments (both replaced by recorders: no GPU, nothing compiled). `bash scripts/test.sh
--vllm034` runs them; elsewhere they skip.
"""

from __future__ import annotations

import importlib.metadata
import json
import math

import pytest
from helpers.facts import facts_dict

from caovan_vllm_sm75_turbo3.errors import Turbo3Refused
from caovan_vllm_sm75_turbo3.versions import minor_key

try:
    _VLLM = importlib.metadata.version("vllm")
except importlib.metadata.PackageNotFoundError:
    _VLLM = None

pytestmark = [pytest.mark.vllm034, pytest.mark.skipif(
    _VLLM is None or minor_key(_VLLM.rsplit(".", 1)[0]) < (0, 24),
    reason=f"needs vLLM 0.24+ (bash scripts/test.sh --vllm034); this one is {_VLLM}")]


@pytest.fixture
def sm75_env(tmp_path):
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(facts_dict(versions={"vllm": _VLLM, "triton": "3.6.0"})))
    return {"CAOVAN_FACTS": str(facts)}


@pytest.fixture
def registered(sm75_env):
    from caovan_vllm_sm75_turbo3.plugin.attention import controller

    iface = controller.install(sm75_env)
    assert iface is not None and iface.name == "triton-attn-v024"
    from vllm.v1.attention.backends.registry import AttentionBackendEnum  # fires the after-import hook

    assert AttentionBackendEnum.CUSTOM.get_path() == controller.CLASS_PATH
    yield AttentionBackendEnum
    AttentionBackendEnum.CUSTOM.clear_override()


def test_registers_as_custom(registered):
    backend = registered.CUSTOM.get_class()
    assert backend.get_name() == "CUSTOM" and backend.get_builder_cls().__name__ == "TritonAttentionMetadataBuilder"
    assert backend.get_builder_cls()._cudagraph_support.name == "ALWAYS"   # vLLM's, inherited


def test_not_sm75_registers_nothing_and_says_why(tmp_path, sm75_env):
    from vllm.v1.attention.backends import registry

    from caovan_vllm_sm75_turbo3.plugin.attention import controller
    from caovan_vllm_sm75_turbo3.plugin.context import ProcessContext

    facts = tmp_path / "h200.json"
    facts.write_text(json.dumps(facts_dict(gpus=[{"index": 0, "name": "H200", "compute_capability": "9.0",
                                                   "memory_total_mib": 143000}])))
    env = {"CAOVAN_FACTS": str(facts)}
    line = controller.attach(controller.FAMILIES[0], ProcessContext(env), registry)
    assert line.startswith("attention_backend=upstream") and "no SM75 GPU" in line
    assert not registry.AttentionBackendEnum.CUSTOM.is_overridden()
    # an SM75 machine whose registry lacks CUSTOM: one line, or Turbo3Refused with require-turbo3
    line = controller.attach(controller.FAMILIES[0], ProcessContext(sm75_env), _no_custom_registry())
    assert line.startswith("attention_backend=upstream") and "has no CUSTOM member" in line
    strict = dict(sm75_env, CAOVAN_REQUIRE_TURBO3="1")
    with pytest.raises(Turbo3Refused, match="require-turbo3 .* our attention backend cannot serve"):
        controller.attach(controller.FAMILIES[0], ProcessContext(strict), _no_custom_registry())


def _no_custom_registry():
    import types

    return types.SimpleNamespace(__name__="fake.registry", AttentionBackendEnum=None, register_backend=None)


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3", "fp8_e5m2", "auto"])
def test_cuda_selector_picks_ours_on_sm75(registered, monkeypatch, kv):
    import sys
    import types

    import torch
    try:
        import vllm._C_stable_libtorch  # noqa: F401  (vLLM's CUDA ops; needs libcuda)
    except ImportError:  # no GPU driver here: cuda.py imports it only to register ops, unused by selection
        monkeypatch.setitem(sys.modules, "vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig

    monkeypatch.setattr(CudaPlatform, "get_device_capability", classmethod(lambda cls, device_id=0:
                                                                           DeviceCapability(7, 5)))
    config = AttentionSelectorConfig(head_size=256, dtype=torch.float16, kv_cache_dtype=kv, block_size=528)
    path = CudaPlatform.get_attn_backend_cls(registered.CUSTOM, config)
    assert path.endswith("CaovanAttentionBackend")
    backend = registered.CUSTOM.get_class()
    # what ours refuses, vLLM's validation reports
    assert backend.validate_configuration(device_capability=DeviceCapability(8, 0), **config._asdict())
    bf16 = config._replace(dtype=torch.bfloat16)
    assert backend.validate_configuration(device_capability=DeviceCapability(7, 5), **bf16._asdict())


def _metadata(torch, num_blocks, block_size, seqs):
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadata

    q_lens = [q for q, _ in seqs]
    cu = torch.tensor([0, *itertools_accumulate(q_lens)], dtype=torch.int32)
    seq_lens = torch.tensor([k for _, k in seqs], dtype=torch.int32)
    width = max(math.ceil(k / block_size) for _, k in seqs)
    table = torch.randperm(num_blocks)[: len(seqs) * width].reshape(len(seqs), width).to(torch.int32)
    empty = torch.empty(0)
    return TritonAttentionMetadata(
        num_actual_tokens=sum(q_lens), max_query_len=max(q_lens), query_start_loc=cu,
        max_seq_len=int(seq_lens.max()), seq_lens=seq_lens, block_table=table,
        slot_mapping=torch.arange(sum(q_lens), dtype=torch.int64), seq_threshold_3D=8,
        num_par_softmax_segments=16, softmax_segm_output=empty, softmax_segm_max=empty,
        softmax_segm_expsum=empty, causal=True)


def itertools_accumulate(values):
    total = 0
    for v in values:
        total += v
        yield total


@pytest.mark.parametrize("kv,dtype", [("fp8", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2"), ("auto", "float16")])
def test_forward_and_cache_update_call_ours(registered, monkeypatch, kv, dtype):
    import torch

    from caovan_vllm_sm75_turbo3.kernels.attention import cache_write
    from caovan_vllm_sm75_turbo3.plugin.attention import backend

    calls: dict[str, list] = {"kernel": [], "write": []}
    monkeypatch.setattr(backend, "_kernel", lambda **kw: calls["kernel"].append(kw) or kw["out"])
    monkeypatch.setattr(cache_write, "write_fp8", lambda *a: calls["write"].append(a))
    heads, kv_heads, dim, nb, bs = 8, 2, 256, 12, 32
    impl = backend.CaovanAttentionImpl(heads, dim, 1 / 16, kv_heads, None, None, kv)
    assert impl.kv_cache_dtype == kv and impl.supports_quant_query_input is False
    layer = torch.nn.Module()
    layer._k_scale, layer._v_scale, layer._q_scale = torch.tensor([0.5]), torch.tensor([0.25]), torch.tensor([1.0])
    cache_dtype = torch.float16 if kv == "auto" else torch.uint8   # vLLM allocates fp8 caches as uint8
    kv_cache = torch.zeros(nb, kv_heads, bs, 2 * dim, dtype=cache_dtype)  # 0.26+: logical (B, H, N, 2*hs)
    meta = _metadata(torch, nb, bs, [(1, 40), (4, 70), (17, 17)])   # decode, verify, fresh prefill
    tokens = meta.num_actual_tokens
    q = torch.randn(tokens + 3, heads, dim, dtype=torch.float16)    # padded like a CUDA-graph batch
    k = torch.randn(tokens + 3, kv_heads, dim, dtype=torch.float16)
    out = torch.full_like(q, float("nan"))
    impl.forward(layer, q, k, k, kv_cache, meta, out)
    (call,) = calls["kernel"]
    assert call["q"].shape[0] == tokens and call["out"].data_ptr() == out.data_ptr()
    assert call["k"].dtype == getattr(torch, dtype) and tuple(call["k"].shape) == (nb, bs, kv_heads, dim)
    assert call["block_table"] is meta.block_table and call["seqused_k"] is meta.seq_lens
    assert call["cu_seqlens_q"] is meta.query_start_loc and call["max_seqlen_k"] == 70
    assert call["k_descale"].shape == (3, kv_heads) and float(call["k_descale"][0, 0]) == 0.5
    assert call["q_descale"] is None and call["causal"] is True and call["window_size"] == (-1, -1)
    if kv != "auto":
        impl.do_kv_cache_update(layer, k[:tokens], k[:tokens], kv_cache, meta.slot_mapping)
        (kw, vw) = calls["write"]
        assert kw[1].dtype == getattr(torch, dtype) and kw[3] is layer._k_scale and vw[3] is layer._v_scale
        assert kw[1].data_ptr() == call["k"].data_ptr()   # the write fills the view the kernel reads


def test_refuses_what_our_kernel_lacks(registered):
    from caovan_vllm_sm75_turbo3.plugin.attention import backend

    with pytest.raises(NotImplementedError, match="rswa_window"):
        backend._ours(rswa_window=128)
