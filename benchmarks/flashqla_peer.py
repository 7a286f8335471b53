"""The flashqla-legacy row of gdn_prefill.py: weicj/FlashQLA-SM70-SM75's "legacy GDN bridge",
the GDN prefill the product we rebuild serves on Turing, built and called from its own checkout.

Its entry point is `flash_qla/ops/gated_delta_rule/legacy/sm_legacy.py`'s
`chunk_gated_delta_rule_fwd_legacy(q, k, v, g, beta, scale, initial_state)` over a hand-written CUDA
kernel (`csrc/gdn_forward.cu`): token-serial, on CUDA cores, float32 only, [B, T, H, D] tensors, no
cu_seqlens. Its states are [B, HV, V, K], our layout, in the kernel (it reads and writes state
element ((b*HV + hv)*D + col)*D + row, col the value index that v and the output use, row the key
index), though its docstring's reference and its own test read them as [K, V] (S^T k): our first
device run (2026-12-07) transposed them as the docstring says, and the final state came back
1.41 off float64, sqrt(2), what a transposed matrix gives. Nothing of it is copied here:
- `build SRC OUT` (where it runs: nvcc, ninja and the torch and Python it will run with; no GPU
  needed) builds that .cu through torch's extension loader as the peer's own loader does, with TORCH_CUDA_ARCH_LIST=7.5+PTX, so the binary holds
  sm_75 code and compute_75 PTX: on another card the driver JIT-compiles the same PTX a Turing
  user's build holds.
- `load(SRC, EXT)` imports sm_legacy.py by path (the package's `__init__` imports TileLang, which a
  Turing box lacks) and hands it the built module, so every call goes through its own input checks.

At its best: inputs are converted to float32 before the timed call (a bridge
inside vLLM would convert fp16 q/k/v each call; that is left out of its time). Packed sequences
have no varlen entry, so a case of several sequences runs both ways it can: one call per sequence,
and one padded batch (padding with g = 0 and beta = 0 leaves the state unchanged, so the final
states are exact); the row keeps the faster and reports both.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable

ROW = "flashqla-legacy"
LEGACY = Path("flash_qla/ops/gated_delta_rule/legacy")
EXT_NAME = "flash_qla_legacy_gdn"   # the name its loader gives the extension


def build(src: Path, out: Path) -> Path:
    """Build the peer's kernel with torch's extension loader for sm_75 + compute_75 PTX; the .so path."""
    os.environ["TORCH_CUDA_ARCH_LIST"] = "7.5+PTX"
    from torch.utils.cpp_extension import load

    out.mkdir(parents=True, exist_ok=True)
    load(name=EXT_NAME, sources=[str(src / LEGACY / "csrc" / "gdn_forward.cu")], extra_cuda_cflags=["-O3"],
         extra_cflags=["-O3"], build_directory=str(out), verbose=False)
    return out / f"{EXT_NAME}.so"


def load(src: Path, ext: Path) -> Any:
    """The peer's sm_legacy module, its extension the one built by `build`."""
    import torch  # noqa: F401  (the extension links against torch's libraries)

    loader = importlib.machinery.ExtensionFileLoader(EXT_NAME, str(ext))
    spec = importlib.util.spec_from_file_location(EXT_NAME, str(ext), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    spec = importlib.util.spec_from_file_location("flashqla_sm_legacy", src / LEGACY / "sm_legacy.py")
    legacy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(legacy)
    legacy._EXT = module   # its loader's cache: the built module instead of a build at first call
    return legacy


def padded(lens: list[int], x: Any) -> Any:
    """[1, T, ...] packed along T -> [N, max(lens), ...], zeros after each sequence."""
    import torch

    out = x.new_zeros((len(lens), max(lens), *x.shape[2:]))
    start = 0
    for i, n in enumerate(lens):
        out[i, :n] = x[0, start:start + n]
        start += n
    return out


class FlashQlaLegacy:
    """Calls of the peer on one case; its states are in our layout (states [N, HV, V, K])."""

    def __init__(self, src: Path, ext: Path):
        self.legacy = load(src, ext)
        self.picked: dict[str, Any] = {}

    def case(self, q, k, v, g, beta, h0, lens: list[int], time_ms: Callable[[Callable], float]) -> Callable:
        """The fastest way to run this case (per sequence or one padded batch), timed by `time_ms`."""
        import torch

        fwd, scale = self.legacy.chunk_gated_delta_rule_fwd_legacy, q.shape[-1] ** -0.5
        f32 = [t.float().contiguous() for t in (q, k, v, g, beta)]
        h0k = h0.float().contiguous()   # [N, HV, V, K] in its kernel as in ours
        starts = [0]
        for n in lens:
            starts.append(starts[-1] + n)

        def per_sequence():
            outs = [fwd(*(t[:, s:e].contiguous() for t in f32), scale, h0k[i:i + 1].contiguous())
                    for i, (s, e) in enumerate(zip(starts, starts[1:]))]
            return outs

        batch = [padded(lens, t).contiguous() for t in f32]

        def padded_batch():
            return fwd(*batch, scale, h0k)

        ways = {"per_sequence": per_sequence}
        if len(lens) > 1:
            ways["padded_batch"] = padded_batch
        times = {name: time_ms(fn) for name, fn in ways.items()}
        best = min(times, key=times.get)
        self.picked = {"way": best, "ms_by_way": times}
        run = ways[best]

        def call():
            got = run()
            if best == "padded_batch":
                o = torch.cat([got[0][i, :n] for i, n in enumerate(lens)])[None]
                state = got[1]
            else:
                o = torch.cat([x[0] for x in got], dim=1)
                state = torch.cat([x[1] for x in got])
            return o, state
        return call


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "build":
        print("usage: flashqla_peer.py build PEER_CHECKOUT OUT_DIR", file=sys.stderr)
        return 2
    print(build(Path(argv[1]), Path(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
