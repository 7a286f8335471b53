"""GDN prefill: ours (sm_75 builds through the driver JIT, and Triton-native) against fla-core.

Two steps, because the sm_75 binaries are built where the rewrite and ptxas live (no GPU needed)
and timed on the lent GPU:

    python benchmarks/gdn_prefill.py build --out .bench/gdn_ptx      # CPU: sm_75 PTX, turbo and plain
                                                  # (and vLLM 0.21's FLA chain, turbo, in <out>/vllm_fla)
    python benchmarks/gdn_prefill.py run --ptx .bench/gdn_ptx [--json FILE]   # GPU

`build` needs Triton but not torch, so it also runs in a venv holding another Triton release
(`bash scripts/test.sh --tritons` makes .venv-triton37 and .venv-triton38); `run` loads the PTX
through the driver, whatever Triton is installed where it runs, and meta.json records the Triton
that built it:

    .venv-triton37/bin/python benchmarks/gdn_prefill.py build --out .bench/gdn_ptx_triton37

`run` times, per shape (Qwen3.6-27B at TP 2: H=8 key heads, HV=24 value heads, K=V=128, fp16,
packed through cu_seqlens with initial and final state, as vLLM calls it):
  ours-sm75-turbo  our two kernels as sm_75 PTX with tensor-core mma (the Turbo rewrite), JIT-ed
                   by the driver for this card and launched through CuPy, in the segments and
                   streams the product's plan gives (chunk.plan_launch, chunk.run_segments)
  ours-sm75-plain  the same kernels as stock Triton builds them for sm_75 (FMA, no tensor cores)
  ours-native      the same kernels compiled by Triton for this card (only with --rows; refused
                   on sm_90+, where Triton 3.6's wgmma build of the state kernel is wrong)
  fla-chunk        fla-core's chunk_gated_delta_rule (native, autotuned, V-first state)
  fla-recurrent    fla-core's fused_recurrent_gated_delta_rule (token-serial)
  vllm-fla-sm75-turbo  the peer a Turing user really has: vLLM 0.21's own FLA chunk_gated_delta_rule
                   forward chain (benchmarks/vllm_fla_sm75.py: chunk-local cumsum of g, then kkt,
                   solve_tril's 64x64 merge (ieee, fp16 out), w/u, fwd_h, o), each kernel the 0.21.0
                   text as turbo sm_75 PTX (our hook's build, fp32 dots on split-fp16 tensor cores),
                   JIT-ed and launched through CuPy like ours. Every config the allowlist verifies is
                   built; per case each kernel's fastest is picked by timing it alone on that case's
                   own intermediates (as Triton's autotuner would on the card) and the row records the
                   picks ("configs", "kernel_ms", "tune_ms"). The cumsum is 3 torch launches inside the
                   timed call where vLLM runs one small Triton kernel (a few microseconds more). States
                   are [N, HV, V, K] in vLLM's fwd_h as in our reference: no transpose. Built only with
                   the Triton vLLM 0.21 pins (3.6); elsewhere `build` skips it.
and checks each output and final state against the float64 token-serial reference at full size.
Every row reports x_vs_fla_chunk and x_vs_vllm_fla_sm75 (that row's ms / this row's ms: > 1, faster).
`--rows ...,ours-sm75-turbo-each-state` adds a row per candidate state config (configs.STATE), forced.

`--turing-proxy` (or `--sms N --shared-per-sm BYTES`) runs every row inside a CUDA green context
of 68 SMs (an RTX 2080 Ti's count), made current before any module loads, with its stream as
torch's; our CuPy launches ask for enough dynamic shared memory that as many of our programs share
an SM as would share a Turing SM of 64 KiB (state early loads: 1, late loads: 2 (registers),
prep: 2), and the plan is made for 68 SMs of 64 KiB. The JSON's "proxy" records what was in
effect: distinct SMs reached through CuPy (current and high-priority stream) and Triton (green
contexts hand out SMs in groups: on an H200, asking for 68 gives 72), and our builds' programs
per SM at real and proxy shared memory (the driver's occupancy query). It shows SM count, our
programs' co-residency and waves. It cannot show Turing's tensor-core rate, clocks, 616 GB/s
memory or 5.5 MB L2 (it keeps the H200's), and fla-core is not what runs on Turing: there vLLM's
FLA copy runs through Turbo, while the proxy runs fla-core's native Hopper build, whose Triton
launches get the 72 SMs but not the shared-memory cap (nothing here caps another launcher's
shared memory; the carveout attribute is only a hint), so fla keeps Hopper's co-residency.
vllm-fla-sm75-turbo is that Turing path's code (same sm_75 PTX, same tensor-core mma.sync shapes,
same configs to pick from) under the same proxy as ours: loaded in the green context, each launch
asking for the shared memory that caps its programs per SM at a Turing SM's (64 KiB shared, and
for these small-shared kernels also 32 warps and 16 blocks; registers are 64 K on both). So
ours against it compares like with like in SMs, co-residency and instruction mix; it still runs at
the H200's clocks, memory and L2 and its ptxas (driver JIT for sm_90), and its picks are the
H200's fastest, which need not be a 2080 Ti's.
FLOP/s count the chunked algorithm's matrix products (the same count for every row); bytes/s
count compulsory traffic (q, k, v, g, beta in; o out; state in and out). Ceilings are measured
in the same run: a device-to-device copy and a cuBLAS fp16 matmul.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import flashqla_peer  # this folder: the flashqla-legacy row (torch only when it runs)
import vllm_fla_sm75  # this folder: the vllm-fla-sm75-turbo row (Triton only at import: none)

H, HV, D = 8, 24, 128
CASES: dict[str, list[int]] = {
    "T=512": [512],
    "T=4096": [4096],
    "T=8192": [8192],                 # the chunk vLLM sends at --max-num-batched-tokens 8192
    "pack-8192": [5000, 3192],        # two prompts' chunks in one 8192-token step
    "T=32768": [32768],
    "packed-8": [3000, 1, 64, 777, 2048, 129, 1500, 500],
}


def _needed_specs():
    from caovan_vllm_sm75_turbo3.kernels.gdn.configs import STATE
    from caovan_vllm_sm75_turbo3.kernels.gdn.specs import prep_spec, state_spec

    return [prep_spec(D, D, l2norm=False, chunk_indices=True)] + [state_spec(D, D, c) for c in STATE[(D, D)]]


def build(out: Path) -> None:
    """Write turbo and plain sm_75 PTX of the configs the cases use, with a meta.json."""
    import triton

    from caovan_vllm_sm75_turbo3.kernels.turbo.compile import compile_for_sm75

    out.mkdir(parents=True, exist_ok=True)
    meta = {}
    for spec in _needed_specs():
        for turbo in (True, False):
            info = compile_for_sm75(spec.fn, spec.signature, spec.constexprs, num_warps=spec.num_warps, attrs=spec.attrs,
                                    turbo=turbo, num_stages=1)
            n_params = len({p for p in info.ptx.split() if p.startswith(info.entry + "_param_")})
            if info.global_scratch_bytes or n_params != len(spec.args) + 2:
                raise SystemExit(f"{spec.name}: unexpected parameters ({n_params}) or global scratch")
            key = f"{spec.name}-{info.build}"
            (out / f"{key}.ptx").write_text(info.ptx)
            meta[key] = {"entry": info.entry, "shared": info.shared_bytes, "num_warps": info.num_warps,
                         "args": spec.args, **info.summary_numbers(), "triton": triton.__version__}
            print(key, info.summary_numbers(), flush=True)
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    try:
        vllm_fla_sm75.build(out / "vllm_fla")
    except vllm_fla_sm75.NotVerified as err:  # another Triton than vLLM 0.21's: that row has no PTX
        print(f"{VLLM_FLA}: not built: {err}", flush=True)


def _chunk_indices(lens: list[int]):
    import torch

    pairs = [(n, c) for n, length in enumerate(lens) for c in range(-(-length // 64))]
    return torch.tensor(pairs, dtype=torch.int32)


def _flops(lens: list[int]) -> float:
    bt = 64
    per_chunk = 2 * bt * bt * (4 * D + 2 * D) + 6 * bt * D * D
    return float(sum(-(-n // bt) for n in lens) * HV * per_chunk)


def _bytes(lens: list[int]) -> float:
    T, N = sum(lens), len(lens)
    return float(T * (2 * H * D * 2 + HV * D * 2 + 2 * HV * 4 + HV * D * 2) + 2 * N * HV * D * D * 4)


def _rates(lens: list[int], ms: float) -> dict[str, float]:
    """A row's time with the FLOP/s and bytes/s it stands for."""
    return {"ms": ms, "TFLOPs": _flops(lens) / ms / 1e9, "GBps": _bytes(lens) / ms / 1e6}


def _time(fn, budget_s: float = 0.4) -> float:
    """Median milliseconds of fn() by CUDA events, after warm-up; repetitions fit the budget."""
    import torch

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    reps = max(5, min(50, int(budget_s / max(time.perf_counter() - t0, 1e-6))))
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


class _Sm75:
    """Launches our kernels' sm_75 PTX (turbo or plain) through CuPy and the driver JIT."""

    def __init__(self, ptx_dir: Path, build: str, budget, proxy: dict | None):
        import cupy as cp

        self.meta = json.loads((ptx_dir / "meta.json").read_text())
        self.build = build
        self.budget = budget  # the card's SmBudget, or the proxy's
        self.fns = {}
        for spec in _needed_specs():
            m = dict(self.meta[f"{spec.name}-{build}"])
            # Loaded here, so in the green context when the proxy is on (a module belongs to the
            # context current at its load).
            fn = cp.RawModule(path=str(ptx_dir / f"{spec.name}-{build}.ptx")).get_function(m["entry"])
            if proxy is not None:  # ask for as much of the SM as the build would take of a Turing SM
                m["launch_shared"] = _proxy_shared(m["shared"], proxy)
            m.setdefault("launch_shared", m["shared"])
            if m["launch_shared"] > 48 * 1024:  # above 48 KiB a launch needs the opt-in, as Triton's launcher does
                fn.max_dynamic_shared_size_bytes = m["launch_shared"]
            self.fns[spec.name] = (fn, m)

    def segments(self, q, cu, ci, state_cfg=None) -> int:
        """How many segments the product's plan makes of this call on this GPU (or the proxy)."""
        return len(self._plan(q, cu, ci, None, state_cfg).segments)

    def _plan(self, q, cu, ci, segment_chunks, state_cfg):
        from caovan_vllm_sm75_turbo3.kernels.gdn import chunk

        plan = chunk.plan_launch(batch=1, tokens=q.shape[1], value_heads=HV, head_k=D, head_v=D,
                                 sequences=cu.numel() - 1, cu_seqlens=cu, chunk_indices=ci,
                                 segment_chunks=segment_chunks or chunk.SEGMENT_CHUNKS, budget=self.budget)
        # Every candidate has the same value slices, so a forced one keeps the plan's grid and segments.
        return plan if state_cfg is None else dataclasses.replace(plan, state=state_cfg)

    def __call__(self, q, k, v, g, beta, h0, cu, ci, *, parts: str = "both", bufs=None, segment_chunks=None,
                 state_cfg=None):
        """Run prep and/or state on buffers `bufs` (made when None); returns (o, final_state, bufs).

        Segments and streams as the product launches them (chunk.run_segments); `segment_chunks`
        overrides the pinned segment length, `state_cfg` the plan's state config."""
        import cupy as cp
        import numpy as np
        import torch

        from caovan_vllm_sm75_turbo3.kernels.gdn.chunk import run_segments
        from caovan_vllm_sm75_turbo3.kernels.gdn.specs import state_spec

        T, N = q.shape[1], cu.numel() - 1
        plan = self._plan(q, cu, ci, segment_chunks, state_cfg)
        if bufs is None:
            bufs = [torch.empty(1, T, HV, D, dtype=torch.float16, device=q.device) for _ in range(5)]
            bufs.append(torch.empty(N, HV, D, D, dtype=torch.float32, device=q.device))
        o, w, qd, kd, u, ht = bufs
        ptr = lambda t: np.uint64(t.data_ptr())  # noqa: E731
        zero = (np.uint64(0), np.uint64(0))  # Triton 3.6's global and profile scratch pointers
        streams = {}  # CuPy handles of the torch streams in use, made once per call

        def stream():
            handle = torch.cuda.current_stream().cuda_stream
            if handle not in streams:
                streams[handle] = cp.cuda.ExternalStream(handle)
            return streams[handle]

        def prep(seg):
            fn, m = self.fns["gdn_prep_k128_v128_ci"]
            fn(plan.prep_grid(seg, HV), (m["num_warps"] * 32,),
               (ptr(q), ptr(k), ptr(v), ptr(g), ptr(beta), ptr(w), ptr(u), ptr(qd), ptr(kd), ptr(o), ptr(cu),
                ptr(ci), np.int32(T), np.int32(N), np.int32(seg[0]), np.float32(D ** -0.5)) + zero,
               shared_mem=m["launch_shared"], stream=stream())

        def state(seg):
            fn, m = self.fns[state_spec(D, D, plan.state).name]
            fn(plan.state_grid, (m["num_warps"] * 32,),
               (ptr(w), ptr(u), ptr(qd), ptr(kd), ptr(g), ptr(o), ptr(h0), ptr(ht), ptr(ht), ptr(cu), np.int32(T),
                np.int32(seg[0]), np.int32(seg[1]), np.int32(plan.n_chunks)) + zero, shared_mem=m["launch_shared"],
               stream=stream())

        if parts == "prep":
            for seg in plan.segments:
                prep(seg)
        elif parts == "state":
            for seg in plan.segments:
                state(seg)
        else:
            run_segments(plan, q.device, prep, state)
        return o, ht, bufs


def _ceilings() -> dict[str, float]:
    import torch

    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    ms = _time(lambda: x.clone())
    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    ms_mm = _time(lambda: a @ a)
    return {"copy_GBps": 2 * 2**30 / ms / 1e6, "fp16_matmul_TFLOPs": 2 * 8192**3 / ms_mm / 1e9}


EACH_STATE_CONFIG = "ours-sm75-turbo-each-state"  # a row per candidate state config, forced
VLLM_FLA = vllm_fla_sm75.ROW  # vLLM 0.21's FLA chain as turbo sm_75 PTX: what a Turing user runs without us
WRONG_ABOVE = 1e-2   # relative error against float64: fp16 rows give about 5e-4, float32 ones less
FLASHQLA = flashqla_peer.ROW  # the seed's GDN bridge (weicj/FlashQLA-SM70-SM75), built from its checkout
ROWS = ("ours-sm75-turbo", "ours-sm75-plain", "ours-native", "fla-chunk", "fla-recurrent", VLLM_FLA, FLASHQLA,
        EACH_STATE_CONFIG)
# ours-native only on request: chunk_gated_delta_rule refuses sm_90+ (Triton 3.6's wgmma build of
# the state kernel gives wrong results there, benchmarks/RESULTS.md), so the row reports that refusal.
DEFAULT_ROWS = tuple(r for r in ROWS if r not in ("ours-native", EACH_STATE_CONFIG, FLASHQLA))
TURING_PROXY = (68, 65536)  # an RTX 2080 Ti: 68 SMs, 64 KiB of shared memory per SM

# Reads %smid in every block after spinning a while, so that many blocks reach every SM the
# launch may use. Plain PTX: no compiler needed where it runs.
_SMID_PTX = """.version 7.0
.target sm_75
.address_size 64
.visible .entry smid(.param .u64 out, .param .u64 spin)
{
 .reg .u32 %r<4>; .reg .u64 %rd<8>; .reg .pred %p<2>;
 ld.param.u64 %rd1, [out]; ld.param.u64 %rd2, [spin]; cvta.to.global.u64 %rd1, %rd1;
 mov.u32 %r1, %smid; mov.u64 %rd3, %clock64;
WAIT:
 mov.u64 %rd4, %clock64; sub.s64 %rd5, %rd4, %rd3; setp.lt.s64 %p1, %rd5, %rd2; @%p1 bra WAIT;
 mov.u32 %r2, %ctaid.x; mul.wide.u32 %rd6, %r2, 4; add.s64 %rd7, %rd1, %rd6; st.global.u32 [%rd7], %r1;
 ret;
}
"""


def _proxy_shared(shared: int, proxy: dict) -> int:
    """Dynamic shared memory to ask for on this card so that as many programs of a build share an
    SM as would share a Turing-shaped one (which holds shared_per_sm // shared of them)."""
    per_sm = max(1, proxy["shared_per_sm"] // max(shared, 1))
    return min(proxy["card_shared_per_sm"] // per_sm - proxy["reserved_shared_per_block"],
               proxy["card_shared_per_block_optin"])


def _enter_proxy(sms: int, shared_per_sm: int) -> tuple[object, dict]:
    """Make a green context of `sms` SMs current, with its stream as torch's current stream.

    Returns the context (keep it alive) and the facts of the proxy."""
    import cupy as cp
    import torch
    from torch.cuda.green_contexts import GreenContext

    torch.cuda.init()
    props = torch.cuda.get_device_properties(0)
    try:
        reserved = cp.cuda.runtime.deviceGetAttribute(111, 0)  # cudaDevAttrReservedSharedMemoryPerBlock
    except Exception:
        reserved = 1024
    ctx = GreenContext.create(sms, 0)
    ctx.set_context()
    try:
        s = ctx.Stream()
        if not isinstance(s, torch.cuda.Stream):
            s = torch.cuda.Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)
        torch.cuda.set_stream(s)
        how = "the green context's stream"
    except Exception as err:
        how = f"the green context's default stream (Stream(): {err!r:.120})"
    proxy = {"sms_asked": sms, "shared_per_sm": shared_per_sm, "card_sms": props.multi_processor_count,
             "card_shared_per_sm": props.shared_memory_per_multiprocessor,
             "card_shared_per_block_optin": props.shared_memory_per_block_optin,
             "reserved_shared_per_block": reserved, "stream": how}
    return ctx, proxy


def _check_proxy(ours) -> dict:
    """What the proxy really gives: distinct SMs reached by launches through CuPy on the current
    stream and on a new high-priority stream (as run_segments makes), and through Triton (fla's
    path); per build of ours, programs per SM with its real and its proxy shared memory."""
    import tempfile

    import cupy as cp
    import numpy as np
    import torch

    facts: dict = {}
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(_SMID_PTX)
        f.flush()
        fn = cp.RawModule(path=f.name).get_function("smid")
    for label, stream in (("cupy_current_stream", torch.cuda.current_stream()),
                          ("cupy_priority_stream", torch.cuda.Stream(priority=-1))):
        buf = torch.full((16384,), -1, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        fn((16384,), (64,), (np.uint64(buf.data_ptr()), np.int64(20000)), stream=cp.cuda.ExternalStream(stream.cuda_stream))
        torch.cuda.synchronize()
        facts[f"sms_{label}"] = len(set(buf.tolist()) - {-1})
    try:
        facts["sms_triton"] = _triton_sms()
    except Exception as err:
        facts["sms_triton"] = f"not measured: {err!r:.200}"
    return facts | _programs_per_sm(ours.fns if ours is not None else {})


def _programs_per_sm(fns: dict) -> dict:
    """Per loaded build (name -> (CuPy function, facts)): programs per SM at its real and proxy shared memory."""
    import cupy as cp

    facts = {}
    for name, (kfn, m) in fns.items():
        try:
            ptr = kfn.kernel.ptr  # the RawKernel's CUfunction
            occ = [cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(ptr, m["num_warps"] * 32, b)
                   for b in (m["shared"], m["launch_shared"])]
        except Exception as err:
            occ = f"not measured: {err!r:.120}"
        facts[f"programs_per_sm {name}"] = {"shared": m["shared"], "launch_shared": m["launch_shared"],
                                            "card_at_real_vs_proxy_shared": occ}
    return facts


def _triton_sms() -> int:
    """Distinct SMs that a Triton launch of many tiny programs reaches on the current stream."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def smid_kernel(out):
        pid = tl.program_id(0)
        s = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)
        tl.store(out + pid, s)

    buf = torch.full((1 << 18,), -1, dtype=torch.int32, device="cuda")
    smid_kernel[(buf.numel(),)](buf)
    torch.cuda.synchronize()
    return len(set(buf.tolist()) - {-1})


REPEATED_ROWS = ("ours-sm75-turbo", "fla-chunk", VLLM_FLA, FLASHQLA)  # ours and the peers, interleaved


def run_fresh(argv: list[str], cases: tuple[str, ...], json_out: Path | None) -> None:
    """Run each case in its own Python process and merge the reports.

    fla-core's autotune keys omit the sequence length, so in one process the first case timed picks
    fla's configs for every later one; a fresh process per case tunes each baseline at its own shape.
    """
    import subprocess
    import tempfile

    report: dict = {"fresh_process_per_case": True, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            part = Path(tmp) / "case.json"
            subprocess.run([sys.executable, __file__, "run", *argv, "--cases", case, "--json", str(part)], check=True)
            got = json.loads(part.read_text())
            report = {**got, **report, "cases": {**report["cases"], **got["cases"]}}
            if json_out:
                json_out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


def run(ptx_dir: Path, json_out: Path | None, rows_wanted: tuple[str, ...] = ROWS, repeats: int = 1,
        cases: tuple[str, ...] = tuple(CASES), proxy_shape: tuple[int, int] | None = None,
        flashqla: tuple[Path, Path] | None = None) -> None:
    """Time and check every wanted row of every case; with `proxy_shape` (SMs, shared bytes per
    SM) inside the Turing-shaped proxy."""
    import torch

    from caovan_vllm_sm75_turbo3.kernels.gdn.chunk import sm_budget
    from caovan_vllm_sm75_turbo3.kernels.gdn.configs import SmBudget

    report: dict = {"card": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"), "cases": {}}
    proxy = keep = None
    budget = sm_budget(torch.device("cuda"))
    if proxy_shape is not None:  # before anything loads a module or makes a stream: all of it in the green context
        keep, proxy = _enter_proxy(*proxy_shape)
        budget = SmBudget(proxy_shape[0], proxy_shape[1], budget.regs_per_sm)
    report["ceilings"] = _ceilings()
    print(report["card"], report["ceilings"], flush=True)
    impls = {}
    for build in ("turbo", "plain"):
        try:
            impls[f"ours-sm75-{build}"] = _Sm75(ptx_dir, build, budget, proxy)
        except Exception as err:  # report and carry on with the other rows
            print(f"ours-sm75-{build}: cannot load: {err!r}", flush=True)
    if VLLM_FLA in rows_wanted:  # loaded here, so in the green context when the proxy is on
        try:
            impls[VLLM_FLA] = vllm_fla_sm75.VllmFlaSm75(ptx_dir / "vllm_fla", proxy)
        except Exception as err:
            print(f"{VLLM_FLA}: cannot load: {err!r}", flush=True)
    if FLASHQLA in rows_wanted:
        try:
            if flashqla is None:
                raise ValueError("--flashqla SRC EXT not given")
            impls[FLASHQLA] = flashqla_peer.FlashQlaLegacy(*flashqla)
        except Exception as err:
            print(f"{FLASHQLA}: cannot load: {err!r}", flush=True)
    if proxy is not None:
        proxy |= _check_proxy(impls.get("ours-sm75-turbo"))
        if VLLM_FLA in impls:
            proxy |= _programs_per_sm({f"{VLLM_FLA} {kernel} {c}": built for kernel, per in impls[VLLM_FLA].fns.items()
                                       for c, built in per.items()})
        report["proxy"] = proxy
        print("proxy", json.dumps(proxy), flush=True)
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_rec
        from fla.ops.utils.index import prepare_chunk_indices as fla_ci
        fla = (fla_chunk, fla_rec, fla_ci)
    except Exception as err:
        print(f"fla: cannot import: {err!r}", flush=True)
        fla = None
    for case, lens in CASES.items():
        if case in cases:
            report["cases"][case] = {"lens": lens, "rows": _run_case(case, lens, impls, fla, rows_wanted, repeats)}
            if json_out:
                json_out.write_text(json.dumps(report, indent=1))
    del keep
    print(json.dumps(report, indent=1))


def _calls(q, k, v, g, beta, h0, cu, ci, impls: dict, fla) -> dict:
    """Each row's call on one case's inputs: ours (the plan's state config and every candidate), fla's."""
    from caovan_vllm_sm75_turbo3.kernels.gdn import chunk_gated_delta_rule
    from caovan_vllm_sm75_turbo3.kernels.gdn.configs import STATE

    calls = {}
    for name, impl in impls.items():
        if name not in (VLLM_FLA, FLASHQLA):
            calls[name] = lambda impl=impl: impl(q, k, v, g, beta, h0, cu, ci)[:2]
    if FLASHQLA in impls:  # its faster way for this case (per sequence or padded), picked by timing both
        lens = cu.diff().tolist()
        try:
            calls[FLASHQLA] = impls[FLASHQLA].case(q, k, v, g, beta, h0, lens, lambda fn: _time(fn, 0.2))
        except Exception as err:

            def refused(err: Exception = err):
                raise RuntimeError(f"flashqla-legacy: {err!r}")

            calls[FLASHQLA] = refused
    if VLLM_FLA in impls:  # tuned on this case's inputs first, as Triton's autotuner would on the card
        try:
            calls[VLLM_FLA] = impls[VLLM_FLA].case(q, k, v, g, beta, h0, cu, ci, lambda fn: _time(fn, 0.1))
        except Exception as err:  # the row reports it; the others still run

            def failed(err: Exception = err):
                raise RuntimeError(f"tuning failed: {err!r}")

            calls[VLLM_FLA] = failed
    if "ours-sm75-turbo" in impls:
        for cfg in STATE[(D, D)]:
            calls[_config_row(cfg)] = lambda cfg=cfg: impls["ours-sm75-turbo"](q, k, v, g, beta, h0, cu, ci,
                                                                                 state_cfg=cfg)[:2]
    calls["ours-native"] = lambda: chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                          cu_seqlens=cu, chunk_indices=ci)
    if fla is not None:
        fla_chunk, fla_rec, fla_ci = fla
        cu64, cu_cpu = cu.long(), cu.long().cpu()
        fci = fla_ci(cu64, 64)
        calls["fla-chunk"] = lambda: fla_chunk(q, k, v, g, beta, scale=D ** -0.5, initial_state=h0,
                                               output_final_state=True, state_v_first=True, cu_seqlens=cu64,
                                               cu_seqlens_cpu=cu_cpu, chunk_indices=fci)
        calls["fla-recurrent"] = lambda: fla_rec(q, k, v, g=g, beta=beta, scale=D ** -0.5, initial_state=h0,
                                                 output_final_state=True, state_v_first=True, cu_seqlens=cu64)
    return calls


def _config_row(cfg) -> str:
    """The row name of our turbo build forced to one state config."""
    return f"ours-sm75-turbo[bv{cfg.block_v}w{cfg.num_warps}{'' if cfg.early_loads else '-late'}]"


def _run_case(case: str, lens: list[int], impls: dict, fla, rows_wanted: tuple[str, ...], repeats: int) -> dict:
    """One case: every wanted row checked against float64 and timed; where our time goes."""
    import torch
    import torch.nn.functional as F

    from caovan_vllm_sm75_turbo3.kernels.gdn import gated_delta_rule_reference
    from caovan_vllm_sm75_turbo3.kernels.numerics import rel_error

    dev = torch.device("cuda")
    torch.manual_seed(0)
    T, N = sum(lens), len(lens)
    q = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).half()
    k = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).half()
    v = torch.randn(1, T, HV, D, device=dev).half()
    g = F.logsigmoid(torch.randn(1, T, HV, device=dev) + 3.0)
    beta = torch.rand(1, T, HV, device=dev)
    h0 = torch.randn(N, HV, D, D, device=dev) * 0.1
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    ci = _chunk_indices(lens).to(dev)
    ro, rs = gated_delta_rule_reference(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    calls = _calls(q, k, v, g, beta, h0, cu, ci, impls, fla)
    rows = {}
    for name, call in calls.items():
        if name not in rows_wanted and not ("[" in name and EACH_STATE_CONFIG in rows_wanted):
            continue
        try:
            o, st = call()
            torch.cuda.synchronize()
            nan = bool(torch.isnan(o).any() or torch.isnan(st).any())
            err_o, err_s = rel_error(o, ro), rel_error(st, rs)  # inf when NaN/inf is in the output
            rows[name] = {"rel_err_o": err_o, "rel_err_state": err_s, "nan": nan}
            if nan or max(err_o, err_s) > WRONG_ABOVE:   # a wrong row is reported as wrong, not timed
                rows[name]["wrong"] = f"relative error above {WRONG_ABOVE:g} of float64: not timed"
            else:
                rows[name] |= _rates(lens, _time(call))
        except Exception as err:
            rows[name] = {"error": repr(err)[:300]}
        print(case, name, rows[name], flush=True)
    # Repeats interleave ours and fla-chunk, so a drift of the card's speed hits both alike;
    # each row then reports the median of its repeats and keeps them all.
    timed = [name for name in REPEATED_ROWS if repeats > 1 and "ms" in rows.get(name, {})]
    runs = {name: [rows[name]["ms"]] for name in timed}
    for _ in range(repeats - 1):
        for name in timed:
            runs[name].append(_time(calls[name]))
    for name in timed:
        rows[name] |= {"ms_runs": runs[name], **_rates(lens, statistics.median(runs[name]))}
    _split_ours(case, rows, impls, (q, k, v, g, beta, h0, cu, ci))
    if "ms" in rows.get(VLLM_FLA, {}):
        rows[VLLM_FLA] |= calls[VLLM_FLA].facts()
    if "ms" in rows.get(FLASHQLA, {}):
        rows[FLASHQLA] |= impls[FLASHQLA].picked
    fq_ms = rows.get(FLASHQLA, {}).get("ms")
    fla_ms = rows.get("fla-chunk", {}).get("ms")
    vllm_ms = rows.get(VLLM_FLA, {}).get("ms")
    for r in rows.values():
        if fla_ms and "ms" in r:
            r["x_vs_fla_chunk"] = fla_ms / r["ms"]  # > 1: faster than fla-core's chunk kernel
        if vllm_ms and "ms" in r:
            r["x_vs_vllm_fla_sm75"] = vllm_ms / r["ms"]  # > 1: faster than vLLM's FLA chain on Turbo
        if fq_ms and "ms" in r:
            r["x_vs_flashqla_legacy"] = fq_ms / r["ms"]  # > 1: faster than the seed's GDN bridge
    return rows


def _split_ours(case: str, rows: dict, impls: dict, args: tuple) -> None:
    """Where the time goes, for our plan's row and each forced state config: the parallel prep and
    the serial state pass timed alone, the segments, the state config."""
    from caovan_vllm_sm75_turbo3.kernels.gdn.configs import STATE

    t = impls.get("ours-sm75-turbo")
    named = {"ours-sm75-turbo": None} | {_config_row(c): c for c in STATE[(D, D)]}
    for name, cfg in named.items():
        if t is None or "ms" not in rows.get(name, {}):
            continue
        bufs = t(*args, state_cfg=cfg)[2]
        rows[name]["prep_ms"] = _time(lambda: t(*args, parts="prep", bufs=bufs, state_cfg=cfg))
        rows[name]["state_ms"] = _time(lambda: t(*args, parts="state", bufs=bufs, state_cfg=cfg))
        plan = t._plan(args[0], args[6], args[7], None, cfg)
        rows[name] |= {"segments": len(plan.segments), "state_config": dataclasses.asdict(plan.state)}
        print(case, name, "parts", rows[name], flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write sm_75 PTX (turbo and plain) for the benchmark's configs; no GPU")
    b.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run", help="time and check every row on this machine's GPU")
    r.add_argument("--ptx", type=Path, required=True)
    r.add_argument("--json", type=Path)
    r.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                   help=f"comma-separated rows to run, of {', '.join(ROWS)} (default: all but ours-native)")
    r.add_argument("--repeats", type=int, default=1,
                   help="time ours-sm75-turbo, fla-chunk and vllm-fla-sm75-turbo this many times, interleaved, and report the median")
    r.add_argument("--cases", default=",".join(CASES), help=f"comma-separated cases, of {', '.join(CASES)}")
    r.add_argument("--turing-proxy", action="store_true",
                   help=f"run every row in a CUDA green context of {TURING_PROXY[0]} SMs, our builds asking for "
                        f"shared memory as on {TURING_PROXY[1] // 1024} KiB per SM (an RTX 2080 Ti's shape)")
    r.add_argument("--sms", type=int, help="the proxy's SM count (implies the proxy)")
    r.add_argument("--shared-per-sm", type=int, help="the proxy's shared bytes per SM (implies the proxy)")
    r.add_argument("--flashqla", nargs=2, type=Path, metavar=("SRC", "EXT"),
                   help=f"the {FLASHQLA} row: the peer's checkout and its extension built by "
                        "`flashqla_peer.py build SRC OUT`")
    r.add_argument("--fresh", action="store_true",
                   help="each case in a fresh process, so fla-core autotunes at the shape it is timed at")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.out)
        return 0
    rows = tuple(x.strip() for x in a.rows.split(",") if x.strip())
    unknown = [x for x in rows if x not in ROWS]
    if unknown or not rows:
        ap.error(f"--rows: unknown row(s) {', '.join(unknown) or '(none given)'}; accepted: {', '.join(ROWS)}")
    if a.repeats < 1:
        ap.error(f"--repeats: must be 1 or more, got {a.repeats}")
    cases = tuple(x.strip() for x in a.cases.split(",") if x.strip())
    if not cases or any(c not in CASES for c in cases):
        ap.error(f"--cases: accepted: {', '.join(CASES)}")
    proxy = None
    if a.turing_proxy or a.sms or a.shared_per_sm:
        proxy = (a.sms or TURING_PROXY[0], a.shared_per_sm or TURING_PROXY[1])
    if a.fresh:
        extra = ["--sms", str(proxy[0]), "--shared-per-sm", str(proxy[1])] if proxy else []
        run_fresh(["--ptx", str(a.ptx), "--rows", ",".join(rows), "--repeats", str(a.repeats), *extra], cases, a.json)
    else:
        run(a.ptx, a.json, rows, a.repeats, cases, proxy, tuple(a.flashqla) if a.flashqla else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
