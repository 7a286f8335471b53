"""benchmarks/flashqla_peer.py: the flashqla-legacy row's layout and packing, on the CPU.

The peer itself needs CUDA (its wrapper refuses anything else), so the GPU run is where its numbers
come from; what would only show there otherwise is our side of the call: its states, fp16 inputs
made float32, and packed sequences run one call each or as a padded batch. A stand-in with the
semantics of its kernel (csrc/gdn_forward.cu as read here, not copied: token-serial, q/k/v
[B, T, H, D], the state S held [V, K] as ours, updated as S = a*S + (v - a*S k) beta k^T, o =
scale * S q) takes its place; both ways must give our float64 reference's outputs and final
states, so a wrong transpose, a padding that moves a state, or a mis-sliced sequence fails. The
kernel's [V, K] is not what its docstring's reference says ([K, V]): the stand-in first followed
the docstring, and the device run showed the state 1.41 off.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from caovan_vllm_sm75_turbo3.kernels.gdn import gated_delta_rule_reference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import flashqla_peer  # noqa: E402

pytestmark = pytest.mark.torch


def stand_in(q, k, v, g, beta, scale, initial_state):
    """The peer's kernel: [B, T, H, D] in, states [B, HV, V, K], float32 only."""
    for t in (q, k, v, g, beta, initial_state):
        assert t.dtype == torch.float32 and t.is_contiguous()
    B, T, H, D = q.shape
    HV = v.shape[2]
    S = initial_state.double().clone()
    o = torch.empty(B, T, HV, D, dtype=torch.float64)
    for b in range(B):
        for hv in range(HV):
            hq = hv // (HV // H)
            for t in range(T):
                a, kk = torch.exp(g[b, t, hv].double()), k[b, t, hq].double()
                delta = (v[b, t, hv].double() - a * (S[b, hv] @ kk)) * beta[b, t, hv].double()
                S[b, hv] = a * S[b, hv] + torch.outer(delta, kk)
                o[b, t, hv] = scale * (S[b, hv] @ q[b, t, hq].double())
    return o.float(), S.float()


def peer() -> flashqla_peer.FlashQlaLegacy:
    p = flashqla_peer.FlashQlaLegacy.__new__(flashqla_peer.FlashQlaLegacy)
    p.legacy = types.SimpleNamespace(chunk_gated_delta_rule_fwd_legacy=stand_in)
    p.picked = {}
    return p


@pytest.mark.parametrize("lens", [[9], [5, 1, 7], [3, 8]])
@pytest.mark.parametrize("way", ["per_sequence", "padded_batch"])
def test_both_ways_give_the_reference_in_our_layout(lens: list[int], way: str) -> None:
    gen = torch.Generator().manual_seed(sum(lens) * 7 + len(way))
    T, H, HV, D = sum(lens), 1, 2, 8
    q = F.normalize(torch.randn(1, T, H, D, generator=gen), dim=-1).half()
    k = F.normalize(torch.randn(1, T, H, D, generator=gen), dim=-1).half()
    v = torch.randn(1, T, HV, D, generator=gen).half()
    g = F.logsigmoid(torch.randn(1, T, HV, generator=gen) + 2)
    beta = torch.rand(1, T, HV, generator=gen)
    h0 = torch.randn(len(lens), HV, D, D, generator=gen) * 0.3
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    ro, rs = gated_delta_rule_reference(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    p = peer()
    call = p.case(q, k, v, g, beta, h0, lens, lambda fn: 1.0 if fn.__name__ == way else 2.0)
    assert p.picked["way"] == (way if len(lens) > 1 else "per_sequence")
    o, s = call()
    assert o.shape == ro.shape and s.shape == rs.shape
    assert not torch.isnan(o).any() and not torch.isnan(s).any()
    assert torch.allclose(o.double(), ro.double(), atol=1e-5, rtol=1e-4)
    assert torch.allclose(s.double(), rs.double(), atol=1e-5, rtol=1e-4)


def test_padding_is_zeros_after_each_sequence() -> None:
    x = torch.arange(1, 8, dtype=torch.float32).reshape(1, 7, 1)
    out = flashqla_peer.padded([3, 1, 3], x)
    assert out.shape == (3, 3, 1)
    assert out[:, :, 0].tolist() == [[1, 2, 3], [4, 0, 0], [5, 6, 7]]
