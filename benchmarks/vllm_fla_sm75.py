"""vLLM 0.21's FLA GDN prefill chain as a Turing user runs it: sm_75 Turbo PTX through CuPy.

On a Turing card vLLM's GDN prefill is its own FLA copy (vllm/model_executor/layers/fla/ops),
compiled by Triton for sm_75 and, with our Turbo hook, on tensor cores. This module builds that
chain's five kernels from the 0.21.0 texts (tests/data/fla_variants/*_0_21_0.py, loaded with
tools/fla_releases.py; Triton only) as turbo sm_75 PTX, every config the allowlist verifies for
that text on this Triton, and runs them through the driver JIT the way benchmarks/gdn_prefill.py
runs ours (RawModule, Triton's two trailing scratch pointers, torch's current stream):

    g_cumsum = chunk-local cumsum of g     torch ops (vLLM runs one small Triton kernel; here
                                           3 torch launches: gather, cumsum, gather back)
    A        = chunk_scaled_dot_kkt_fwd_kernel          fp32, fp32 dots on split-fp16 tensor cores
    Ai       = merge_16x16_to_64x64_inverse_kernel      (I + A)^-1, fp16 out, DOT_PRECISION ieee
    w, u     = recompute_w_u_fwd_kernel
    h, v_new, ht = chunk_gated_delta_rule_fwd_kernel_h_blockdim64   initial state h0, final state
    o        = chunk_fwd_kernel_o                       scale K ** -0.5

States h0 and ht are [N, HV, V, K] (V-first), as vLLM's fwd_h and our reference take them: no
transpose. Each call allocates its outputs as vLLM's wrappers do (Ai zero-filled).
`VllmFlaSm75.case` tunes per case as Triton's autotuner would on the card: each kernel's configs
timed alone on that case's own intermediate inputs, the fastest kept (`ChainCase.facts`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ROW = "vllm-fla-sm75-turbo"
RELEASE = "0.21.0"
H, HV, D, BT = 8, 24, 128, 64   # Qwen3.6-27B at TP 2, FLA_CHUNK_SIZE

KKT, MERGE, W_U = "chunk_scaled_dot_kkt_fwd_kernel", "merge_16x16_to_64x64_inverse_kernel", "recompute_w_u_fwd_kernel"
FWD_H, FWD_O = "chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "chunk_fwd_kernel_o"
CHAIN = (KKT, MERGE, W_U, FWD_H, FWD_O)
FILES = {KKT: "kkt", MERGE: "merge", W_U: "w_u", FWD_H: "h", FWD_O: "o"}
# What each launch passes, in the kernel's order of non-constexpr parameters: (parameter, the chain's
# tensor or number). vLLM's wrappers pass the same; `build` refuses a PTX whose parameters differ.
LAUNCH: dict[str, tuple[tuple[str, str], ...]] = {
    KKT: (("k", "k"), ("beta", "beta"), ("g", "gc"), ("A", "A"), ("cu_seqlens", "cu"), ("chunk_indices", "ci"),
          ("T", "T")),
    MERGE: (("A", "A"), ("Ai", "Ai"), ("cu_seqlens", "cu"), ("chunk_indices", "ci"), ("T", "T")),
    W_U: (("k", "k"), ("v", "v"), ("beta", "beta"), ("w", "w"), ("u", "u"), ("A", "Ai"), ("g", "gc"),
          ("cu_seqlens", "cu"), ("chunk_indices", "ci"), ("T", "T")),
    FWD_H: (("k", "k"), ("v", "u"), ("w", "w"), ("v_new", "v_new"), ("g", "gc"), ("h", "h"), ("h0", "h0"),
            ("ht", "ht"), ("cu_seqlens", "cu"), ("chunk_offsets", "offsets"), ("T", "T")),
    FWD_O: (("q", "q"), ("k", "k"), ("v", "v_new"), ("h", "h"), ("g", "gc"), ("o", "o"), ("cu_seqlens", "cu"),
            ("chunk_indices", "ci"), ("scale", "scale"), ("T", "T")),
}


def grid(kernel: str, cfg: dict[str, Any], n_chunks: int, n_seqs: int) -> tuple[int, int, int]:
    """The launch grid vLLM's wrapper gives `kernel` (batch 1, packed through cu_seqlens)."""
    if kernel in (KKT, MERGE, W_U):
        return (n_chunks, HV, 1)
    if kernel == FWD_H:
        return (D // int(cfg["BV"]), n_seqs * HV, 1)
    return (D // int(cfg["BV"]), n_chunks, HV)


def tag(cfg: dict[str, Any]) -> str:
    """A config as a short name, e.g. BK64_BV32_num_warps4."""
    return "_".join(f"{k}{v}" for k, v in cfg.items())


class NotVerified(Exception):
    """The allowlist verifies the 0.21.0 text of a kernel on another Triton than this one."""


@dataclass(frozen=True)
class Build:
    """One config of one kernel to compile: what check_builds yields for the 0.21.0 text."""

    kernel: str
    digest: str
    fn: Any
    config: dict[str, Any]
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int
    attrs: dict
    fp32_dots: str


def variant_builds(kernel: str) -> Iterator[Build]:
    """Every config the allowlist verifies for the 0.21.0 text of `kernel` on the installed Triton."""
    import triton

    sys.path.insert(0, str(ROOT / "tools"))
    import fla_releases

    from caovan_vllm_sm75_turbo3.cli.turbo_sources import ResolvedKernel, check_builds
    from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import load_allowlist
    from caovan_vllm_sm75_turbo3.kernels.turbo.compile import divisibility_attrs

    v = next(x for x in fla_releases.load()["variants"] if x["file"] == f"{FILES[kernel]}_{RELEASE.replace('.', '_')}.py")
    fn = fla_releases.load_variant(v)
    spec = fla_releases.check_spec(v, fn)
    entry = next(e for e in load_allowlist().kernels if e.name == kernel)
    resolved = ResolvedKernel(entry, fn, fn.__module__, v["digest"])
    if not resolved.source_verified:
        raise NotVerified(f"{kernel}: the allowlist verifies no config of the {RELEASE} text on Triton "
                         f"{triton.__version__} (build with the Triton vLLM {RELEASE} pins)")
    for cfg, sig, cx, warps, divisible in check_builds(resolved):
        yield Build(kernel, v["digest"], fn, cfg, sig, cx, warps, divisibility_attrs(fn, divisible),
                    spec["fp32_dots"])


def compile_build(b: Build) -> Any:
    """Turbo sm_75 PTX of one build; SystemExit when its parameters are not what LAUNCH passes (+ 2 scratch)."""
    from caovan_vllm_sm75_turbo3.kernels.turbo.compile import compile_for_sm75

    passed = [p for p, _ in LAUNCH[b.kernel]]
    wanted = [p for p, kind in b.signature.items() if kind != "constexpr"]
    info = compile_for_sm75(b.fn, b.signature, b.constexprs, num_warps=b.num_warps, turbo=True, attrs=b.attrs,
                            fp32_dots=b.fp32_dots)
    if passed != wanted or ptx_params(info.ptx, info.entry) != len(passed) + 2 or info.global_scratch_bytes:
        raise SystemExit(f"{b.kernel} {b.config}: PTX parameters {ptx_params(info.ptx, info.entry)} / signature "
                         f"{wanted} / global scratch {info.global_scratch_bytes}: not what the chain passes {passed}")
    return info


def ptx_params(ptx: str, entry: str) -> int:
    """How many parameters the PTX entry declares."""
    return len({p.strip(",()") for p in ptx.split() if p.startswith(entry + "_param_")})


def build(out: Path) -> None:
    """Write every verified config of the five kernels as turbo sm_75 PTX into `out`, with a meta.json."""
    import triton

    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"triton": triton.__version__, "release": RELEASE, "kernels": {}}
    for kernel in CHAIN:
        builds = []
        for b in variant_builds(kernel):
            info = compile_build(b)
            fname = f"{kernel}.{tag(b.config)}.turbo.ptx"
            (out / fname).write_text(info.ptx)
            builds.append({"config": b.config, "file": fname, "entry": info.entry, "shared": info.shared_bytes,
                           "num_warps": b.num_warps, **info.summary_numbers()})
            print(f"vllm_fla {fname}: {info.summary_numbers()}", flush=True)
        if not builds:
            raise SystemExit(f"{kernel}: the allowlist lists no config of the {RELEASE} text")
        types = [b.signature[p] for p, _ in LAUNCH[kernel]]
        meta["kernels"][kernel] = {"digest": b.digest, "fp32_dots": b.fp32_dots, "types": types, "builds": builds}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


def proxy_launch_shared(shared: int, num_warps: int, proxy: dict) -> int:
    """Dynamic shared memory to ask for so that as many programs share an SM of this card as would
    share a Turing one: its 64 KiB of shared memory, 32 warps and 16 blocks per SM (registers:
    64 K on both). For our kernels (gdn_prefill._proxy_shared) shared memory is the binding limit."""
    per_sm = min(proxy["shared_per_sm"] // shared if shared else 16, 32 // num_warps, 16)
    ask = proxy["card_shared_per_sm"] // max(per_sm, 1) - proxy["reserved_shared_per_block"]
    return max(shared, min(ask, proxy["card_shared_per_block_optin"]))


class VllmFlaSm75:
    """The built PTX loaded through CuPy (in the green context when the proxy is on: load it there)."""

    def __init__(self, ptx_dir: Path, proxy: dict | None):
        import cupy as cp

        self.meta = json.loads((ptx_dir / "meta.json").read_text())
        self.fns: dict[str, dict[str, tuple[Any, dict]]] = {}   # kernel -> config tag -> (function, launch facts)
        for kernel in CHAIN:
            got = self.fns[kernel] = {}
            for b in self.meta["kernels"][kernel]["builds"]:
                fn = cp.RawModule(path=str(ptx_dir / b["file"])).get_function(b["entry"])
                m = dict(b)
                m["launch_shared"] = b["shared"] if proxy is None else proxy_launch_shared(b["shared"], b["num_warps"],
                                                                                           proxy)
                if m["launch_shared"] > 48 * 1024:   # above 48 KiB a launch needs the opt-in, as Triton's does
                    fn.max_dynamic_shared_size_bytes = m["launch_shared"]
                got[tag(b["config"])] = (fn, m)

    def case(self, q, k, v, g, beta, h0, cu, ci, timer: Callable[[Callable[[], Any]], float]) -> ChainCase:
        """The chain on one case's inputs, tuned (each kernel's configs timed by `timer` on this case)."""
        c = ChainCase(self, q, k, v, g, beta, h0, cu, ci)
        c.tune(timer)
        return c


class ChainCase:
    """One case's chain: fixed inputs and index tensors, the picked config of each kernel."""

    def __init__(self, chain: VllmFlaSm75, q, k, v, g, beta, h0, cu, ci):
        import torch

        self.chain = chain
        bounds = [int(x) for x in cu.tolist()]
        lens = [b - a for a, b in zip(bounds, bounds[1:])]
        per_seq = [-(-n // BT) for n in lens]
        dev = q.device
        self.n_chunks, self.n_seqs = sum(per_seq), len(lens)
        offsets = torch.tensor([0] + per_seq, dtype=torch.int32).cumsum(0).to(torch.int32)
        # token of each chunk row (rows past a short chunk's end read token 0: a cumsum's tail that is
        # never gathered back), and where each token's row sits in [chunks * BT]
        starts = torch.tensor([bounds[s] + c * BT for s, n in enumerate(per_seq) for c in range(n)])
        ends = torch.tensor([bounds[s + 1] for s, n in enumerate(per_seq) for _ in range(n)])
        rows = starts[:, None] + torch.arange(BT)[None, :]
        valid = rows < ends[:, None]
        self.rows = torch.where(valid, rows, 0).flatten().to(dev)
        self.back = valid.flatten().nonzero().squeeze(1).to(dev)
        self.t = {"q": q, "k": k, "v": v, "beta": beta, "h0": h0, "g": g, "cu": cu, "ci": ci.contiguous(),
                  "offsets": offsets.to(dev), "T": q.shape[1], "scale": D ** -0.5}
        self.picks = {kernel: next(iter(chain.fns[kernel])) for kernel in CHAIN}
        self.tune_ms: dict[str, dict[str, float]] = {}
        self.streams: dict[int, Any] = {}

    def _launch(self, kernel: str, cfg_tag: str, t: dict) -> None:
        import cupy as cp
        import numpy as np
        import torch

        fn, m = self.chain.fns[kernel][cfg_tag]
        args = []
        for (_, key), kind in zip(LAUNCH[kernel], self.chain.meta["kernels"][kernel]["types"], strict=True):
            x = t[key]
            if kind.startswith("*"):
                args.append(np.uint64(x.data_ptr()))
            else:
                args.append(np.float32(x) if kind.startswith("fp") else np.int32(x))
        handle = torch.cuda.current_stream().cuda_stream
        if handle not in self.streams:
            self.streams[handle] = cp.cuda.ExternalStream(handle)
        fn(grid(kernel, m["config"], self.n_chunks, self.n_seqs), (m["num_warps"] * 32,),
           tuple(args) + (np.uint64(0), np.uint64(0)),   # Triton 3.6's global and profile scratch pointers
           shared_mem=m["launch_shared"], stream=self.streams[handle])

    def run(self) -> dict[str, Any]:
        """The chain with the picked configs; every tensor it made, by the names LAUNCH uses."""
        import torch

        t = dict(self.t)
        T, dev, g = t["T"], t["q"].device, t["g"]
        gc = g[0].index_select(0, self.rows).view(self.n_chunks, BT, HV).cumsum(1)
        t["gc"] = gc.view(-1, HV).index_select(0, self.back).unsqueeze(0)
        t["A"] = torch.empty(1, T, HV, BT, dtype=torch.float32, device=dev)
        self._launch(KKT, self.picks[KKT], t)
        t["Ai"] = torch.zeros(1, T, HV, BT, dtype=torch.float16, device=dev)
        self._launch(MERGE, self.picks[MERGE], t)
        t["w"], t["u"] = torch.empty_like(t["v"]), torch.empty_like(t["v"])   # K == V here
        self._launch(W_U, self.picks[W_U], t)
        t["h"] = torch.empty(1, self.n_chunks, HV, D, D, dtype=torch.float16, device=dev)
        t["v_new"] = torch.empty_like(t["u"])
        t["ht"] = torch.empty(self.n_seqs, HV, D, D, dtype=torch.float32, device=dev)
        self._launch(FWD_H, self.picks[FWD_H], t)
        t["o"] = torch.empty_like(t["v"])
        self._launch(FWD_O, self.picks[FWD_O], t)
        return t

    def __call__(self):
        """(o, final state), as the other rows return them."""
        t = self.run()
        return t["o"], t["ht"]

    def tune(self, timer: Callable[[Callable[[], Any]], float]) -> None:
        """Pick each kernel's fastest config, timed alone on this case's intermediates (each kernel
        rewrites only its own outputs, so repeated launches see the same inputs)."""
        t = self.run()
        for kernel in CHAIN:
            self.tune_ms[kernel] = {c: timer(lambda c=c: self._launch(kernel, c, t)) for c in self.chain.fns[kernel]}
            self.picks[kernel] = min(self.tune_ms[kernel], key=self.tune_ms[kernel].get)

    def facts(self) -> dict[str, Any]:
        """The picks, each kernel's time at each config, and the picks' shared memory as launched."""
        fns = self.chain.fns
        return {"configs": {k: fns[k][c][1]["config"] for k, c in self.picks.items()},
                "kernel_ms": {k: self.tune_ms[k][c] for k, c in self.picks.items()},
                "launch_shared": {k: fns[k][c][1]["launch_shared"] for k, c in self.picks.items()},
                "tune_ms": self.tune_ms, "triton_built": self.chain.meta["triton"]}
