"""GDN prefill: ours (sm_75 builds through the driver JIT, and Triton-native) against fla-core.

Two steps, because the sm_75 binaries are built where the rewrite and ptxas live (no GPU needed)
and timed on the lent GPU:

    python benchmarks/gdn_prefill.py build --out .bench/gdn_ptx      # CPU: sm_75 PTX, turbo and plain
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
and checks each output and final state against the float64 token-serial reference at full size.
FLOP/s count the chunked algorithm's matrix products (the same count for every row); bytes/s
count compulsory traffic (q, k, v, g, beta in; o out; state in and out). Ceilings are measured
in the same run: a device-to-device copy and a cuBLAS fp16 matmul.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

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
    from caovan_vllm_sm75_turbo3.kernels.gdn.specs import prep_spec, state_spec

    return [prep_spec(D, D, l2norm=False, chunk_indices=True), state_spec(D, D)]


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

    def __init__(self, ptx_dir: Path, build: str):
        import cupy as cp

        self.meta = json.loads((ptx_dir / "meta.json").read_text())
        self.build = build
        self.fns = {}
        for spec in _needed_specs():
            m = self.meta[f"{spec.name}-{build}"]
            fn = cp.RawModule(path=str(ptx_dir / f"{spec.name}-{build}.ptx")).get_function(m["entry"])
            if m["shared"] > 48 * 1024:  # above 48 KiB a launch needs the opt-in, as Triton's launcher does
                fn.max_dynamic_shared_size_bytes = m["shared"]
            self.fns[spec.name] = (fn, m)

    def segments(self, q, cu, ci) -> int:
        """How many segments the product's plan makes of this call on this GPU."""
        return len(self._plan(q, cu, ci, None).segments)

    def _plan(self, q, cu, ci, segment_chunks):
        import torch

        from caovan_vllm_sm75_turbo3.kernels.gdn.chunk import SEGMENT_CHUNKS, plan_launch

        return plan_launch(batch=1, tokens=q.shape[1], value_heads=HV, head_k=D, head_v=D, sequences=cu.numel() - 1,
                           cu_seqlens=cu, chunk_indices=ci, segment_chunks=segment_chunks or SEGMENT_CHUNKS,
                           sm_count=torch.cuda.get_device_properties(q.device).multi_processor_count)

    def __call__(self, q, k, v, g, beta, h0, cu, ci, *, parts: str = "both", bufs=None, segment_chunks=None):
        """Run prep and/or state on buffers `bufs` (made when None); returns (o, final_state, bufs).

        Segments and streams as the product launches them (chunk.run_segments); `segment_chunks`
        overrides the pinned segment length."""
        import cupy as cp
        import numpy as np
        import torch

        from caovan_vllm_sm75_turbo3.kernels.gdn.chunk import run_segments
        from caovan_vllm_sm75_turbo3.kernels.gdn.specs import state_spec

        T, N = q.shape[1], cu.numel() - 1
        plan = self._plan(q, cu, ci, segment_chunks)
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
               shared_mem=m["shared"], stream=stream())

        def state(seg):
            fn, m = self.fns[state_spec(D, D).name]
            fn(plan.state_grid, (m["num_warps"] * 32,),
               (ptr(w), ptr(u), ptr(qd), ptr(kd), ptr(g), ptr(o), ptr(h0), ptr(ht), ptr(ht), ptr(cu), np.int32(T),
                np.int32(seg[0]), np.int32(seg[1]), np.int32(plan.n_chunks)) + zero, shared_mem=m["shared"],
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


ROWS = ("ours-sm75-turbo", "ours-sm75-plain", "ours-native", "fla-chunk", "fla-recurrent")
# ours-native only on request: chunk_gated_delta_rule refuses sm_90+ (Triton 3.6's wgmma build of
# the state kernel gives wrong results there, benchmarks/RESULTS.md), so the row reports that refusal.
DEFAULT_ROWS = tuple(r for r in ROWS if r != "ours-native")


REPEATED_ROWS = ("ours-sm75-turbo", "fla-chunk")  # the pair the targets compare


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
        cases: tuple[str, ...] = tuple(CASES)) -> None:
    import torch
    import torch.nn.functional as F

    from caovan_vllm_sm75_turbo3.kernels.gdn import chunk_gated_delta_rule, gated_delta_rule_reference
    from caovan_vllm_sm75_turbo3.kernels.numerics import rel_error

    dev = torch.device("cuda")
    report: dict = {"card": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"), "cases": {}}
    report["ceilings"] = _ceilings()
    print(report["card"], report["ceilings"], flush=True)
    impls = {}
    for build in ("turbo", "plain"):
        try:
            impls[f"ours-sm75-{build}"] = _Sm75(ptx_dir, build)
        except Exception as err:  # report and carry on with the other rows
            print(f"ours-sm75-{build}: cannot load: {err!r}", flush=True)
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_rec
        from fla.ops.utils.index import prepare_chunk_indices as fla_ci
    except Exception as err:
        print(f"fla: cannot import: {err!r}", flush=True)
        fla_chunk = fla_rec = None

    for case, lens in CASES.items():
        if case not in cases:
            continue
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
        calls = {}
        for name, impl in impls.items():
            calls[name] = lambda impl=impl: impl(q, k, v, g, beta, h0, cu, ci)[:2]
        calls["ours-native"] = lambda: chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                              cu_seqlens=cu, chunk_indices=ci)
        if fla_chunk is not None:
            cu64, cu_cpu = cu.long(), cu.long().cpu()
            fci = fla_ci(cu64, 64)
            calls["fla-chunk"] = lambda: fla_chunk(q, k, v, g, beta, scale=D ** -0.5, initial_state=h0,
                                                   output_final_state=True, state_v_first=True, cu_seqlens=cu64,
                                                   cu_seqlens_cpu=cu_cpu, chunk_indices=fci)
            calls["fla-recurrent"] = lambda: fla_rec(q, k, v, g=g, beta=beta, scale=D ** -0.5, initial_state=h0,
                                                     output_final_state=True, state_v_first=True, cu_seqlens=cu64)
        rows = {}
        for name, call in calls.items():
            if name not in rows_wanted:
                continue
            try:
                o, st = call()
                torch.cuda.synchronize()
                nan = bool(torch.isnan(o).any() or torch.isnan(st).any())
                err_o, err_s = rel_error(o, ro), rel_error(st, rs)  # inf when NaN/inf is in the output
                rows[name] = {"rel_err_o": err_o, "rel_err_state": err_s, "nan": nan, **_rates(lens, _time(call))}
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
        if "ms" in rows.get("ours-sm75-turbo", {}):  # where the time goes: parallel prep vs serial state pass
            t = impls["ours-sm75-turbo"]
            bufs = t(q, k, v, g, beta, h0, cu, ci)[2]
            rows["ours-sm75-turbo"]["prep_ms"] = _time(lambda: t(q, k, v, g, beta, h0, cu, ci, parts="prep", bufs=bufs))
            rows["ours-sm75-turbo"]["state_ms"] = _time(lambda: t(q, k, v, g, beta, h0, cu, ci, parts="state", bufs=bufs))
            rows["ours-sm75-turbo"]["segments"] = t.segments(q, cu, ci)
            print(case, "ours-sm75-turbo parts", rows["ours-sm75-turbo"], flush=True)
        fla_ms = rows.get("fla-chunk", {}).get("ms")
        for r in rows.values():
            if fla_ms and "ms" in r:
                r["x_vs_fla_chunk"] = fla_ms / r["ms"]  # > 1: faster than fla-core's chunk kernel
        report["cases"][case] = {"lens": lens, "rows": rows}
        if json_out:
            json_out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


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
                   help="time ours-sm75-turbo and fla-chunk this many times, interleaved, and report the median")
    r.add_argument("--cases", default=",".join(CASES), help=f"comma-separated cases, of {', '.join(CASES)}")
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
    if a.fresh:
        run_fresh(["--ptx", str(a.ptx), "--rows", ",".join(rows), "--repeats", str(a.repeats)], cases, a.json)
    else:
        run(a.ptx, a.json, rows, a.repeats, cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
