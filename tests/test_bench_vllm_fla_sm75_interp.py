"""benchmarks/vllm_fla_sm75.py's chain wiring on the CPU: the 0.21.0 kernel texts in Triton's interpreter,
launched with the chain's own arguments, grids and buffers, against the float64 reference.

The H200 run launches the same chain as sm_75 PTX through CuPy; this checks, before any GPU time is
spent, that the arguments, the chunk-local cumsum, the buffer layouts (states [N, HV, V, K]) and the
grids compose into the gated delta rule. Budget: 5e-3 relative error (fp16 intermediates).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from caovan_vllm_sm75_turbo3.kernels.gdn import gated_delta_rule_reference  # noqa: E402
from caovan_vllm_sm75_turbo3.kernels.numerics import rel_error  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import vllm_fla_sm75 as chain  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
BUDGET = 5e-3


class InterpretedChain(chain.ChainCase):
    """The chain with Triton's own launcher (interpreted) in place of CuPy's."""

    def _launch(self, kernel: str, cfg_tag: str, t: dict) -> None:
        fn, m = self.chain.fns[kernel][cfg_tag]
        args = {p: t[key] for p, key in chain.LAUNCH[kernel]}
        fn[chain.grid(kernel, m["config"], self.n_chunks, self.n_seqs)](**args, **m["constexprs"],
                                                                          num_warps=m["num_warps"])


def _tensor_range(*bounds):
    """range() as compiled Triton code sees it: i32 scalars (patched tl, so call inside a kernel)."""
    import operator

    import triton.language as tl

    return (tl.full((), i, tl.int32) for i in range(*map(operator.index, bounds)))


def _interpreted(monkeypatch) -> SimpleNamespace:
    """Each kernel's first verified config as an interpreted function, with the helpers it calls."""
    import triton.language as tl
    import triton.language.standard as tl_standard
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    builds = {kernel: next(chain.variant_builds(kernel)) for kernel in chain.CHAIN}   # loaded as JITFunctions
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fns = {}
    for kernel, b in builds.items():
        module = sys.modules[b.fn.__module__]
        for m in (tl_standard, tl, module):
            for name, obj in list(vars(m).items()):
                if isinstance(obj, JITFunction):
                    monkeypatch.setattr(m, name, InterpretedFunction(obj.fn))
        for name, obj in list(vars(module).items()):
            # `exp = tl.exp` binds the compiler's builtin; the interpreter patches tl's attribute only
            if not name.startswith("__") and not isinstance(obj, type(tl)) and getattr(tl, name, None) is obj:
                monkeypatch.setattr(module, name, lambda *a, _name=name, **kw: getattr(tl, _name)(*a, **kw))
        # compiled, a loop index is an i32 tensor (fwd_h calls i_t.to); the interpreter's is a Python int
        monkeypatch.setattr(module, "range", _tensor_range, raising=False)
        fns[kernel] = {chain.tag(b.config): (InterpretedFunction(b.fn.fn), {
            "config": b.config, "num_warps": b.num_warps, "constexprs": b.constexprs})}
    return SimpleNamespace(fns=fns, meta={})


def test_chain_matches_the_gated_delta_rule(monkeypatch) -> None:
    torch.manual_seed(0)
    lens = [70, 60]   # a full chunk and a short one, then a short sequence: both bounds of the packing
    T, N, H, HV, D = sum(lens), len(lens), chain.H, chain.HV, chain.D
    q = F.normalize(torch.randn(1, T, H, D), dim=-1).half()
    k = F.normalize(torch.randn(1, T, H, D), dim=-1).half()
    v = torch.randn(1, T, HV, D).half()
    g = F.logsigmoid(torch.randn(1, T, HV) + 3.0)
    beta = torch.rand(1, T, HV)
    h0 = torch.randn(N, HV, D, D) * 0.1
    cu = torch.tensor([0, 70, 130], dtype=torch.int32)
    ci = torch.tensor([[0, 0], [0, 1], [1, 0]], dtype=torch.int32)
    c = InterpretedChain(_interpreted(monkeypatch), q, k, v, g, beta, h0, cu, ci)
    o, ht = c()
    ro, rs = gated_delta_rule_reference(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    assert rel_error(o, ro) <= BUDGET and rel_error(ht, rs) <= BUDGET, (rel_error(o, ro), rel_error(ht, rs))
