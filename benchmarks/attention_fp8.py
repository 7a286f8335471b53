"""Paged attention over an fp8 or fp16 KV cache: our sm_75 kernel's numerics at full size and its speed.

Two steps, because the sm_75 binaries are built where the Turbo rewrite and ptxas live (no GPU
needed) and run on the lent GPU:

    python benchmarks/attention_fp8.py build --out .bench/attn_ptx      # CPU: sm_75 turbo PTX
    python benchmarks/attention_fp8.py run --ptx .bench/attn_ptx [--json FILE]   # GPU (CuPy, torch)

`build` needs Triton but not torch, so it also runs in a venv holding another Triton release
(`bash scripts/test.sh --tritons` makes .venv-triton37 and .venv-triton38); `run` loads the PTX
through the driver, whatever Triton is installed where it runs, and meta.json records the Triton
that built it:

    .venv-triton37/bin/python benchmarks/attention_fp8.py build --out .bench/attn_ptx_triton37

`run` uses Qwen3.6-27B's full-attention shape at tensor parallel 2 (12 query heads on 2 KV
heads, head dim 256), vLLM's cache layout (one [blocks, 2, block_size, kv_heads, 256] tensor,
k and v its two views) with a block size that is not a power of two (528) and shuffled block
tables. Per case (decode rows at 4K/32K/128K context, a batch of decodes, speculative verify
rows 1+3, 8192-row prefill chunks with earlier context) and cache format (fp16, fp8 e4m3,
fp8 e5m2, the fp8 ones quantised from the same fp16 values with a per-tensor scale) it reports:
  kernel_err     our kernel (sm_75 turbo PTX, JIT-ed by the driver, launched through CuPy with the
                 grid, splits and arguments the product's launcher plans: kernel.plan_call)
                 against the float64 reference on the dequantised cache
  quant_err_kv   the fp8 cache against the fp16 values it was made from (no kernel involved)
  quant_err_out  the float64 attention on the fp8 cache against the float64 attention on the
                 fp16 source: what fp8 itself costs at the output, separately from the kernel
  ms, GBps       median time by CUDA events; compulsory bytes (q, out, each sequence's keys and
                 values once) per second; caches of small cases rotate over several copies so the
                 L2 does not hold them
and x_vs_fp16, the fp16 row's time over this row's (> 1: faster than the same kernel on fp16).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

QH, KVH, D = 12, 2, 256
BLOCK_SIZE = 528
FORMATS = ("fp16", "fp8_e4m3", "fp8_e5m2")
SPLITS = (1, 2, 4, 8, 16, 32, 64)  # every split count the launcher's plan can give (MAX_SPLITS = 64)
# case -> [(q_len, context)] per sequence; keys per sequence = context + q_len.
CASES: dict[str, list[tuple[int, int]]] = {
    "decode-4K": [(1, 4095)],
    "decode-32K": [(1, 32767)],
    "decode-128K": [(1, 131071)],
    "decode-16x32K": [(1, 32767)] * 16,
    "verify-1+3-32K": [(4, 32764)],
    "verify-1+3-128K": [(4, 131068)],
    "prefill-8192@24K": [(8192, 24576)],
    "prefill-8192@120K": [(8192, 122880)],
}
ROTATE_BYTES = 256 * 2**20  # caches smaller than this are timed over several copies


def _specs():
    from caovan_vllm_sm75_turbo3.kernels.attention.specs import attention_spec, merge_spec

    attn = [attention_spec(D, f, decode=decode, num_splits=s) for f in FORMATS for decode in (True, False)
            for s in SPLITS]
    return attn, [merge_spec(D, s) for s in SPLITS if s > 1]


def build(out: Path, allow_spills: bool = False) -> None:
    """Write the sm_75 PTX of every (format, config, split count) the cases can use, with a meta.json.

    A turbo build that spills on sm_75 stops the build unless `allow_spills`: then it is reported
    and kept (meta.json has its spill bytes), since spills are sm_75's ptxas's and the PTX that
    `run` JITs elsewhere is the same.
    """
    import triton

    from caovan_vllm_sm75_turbo3.kernels.turbo.compile import compile_for_sm75

    out.mkdir(parents=True, exist_ok=True)
    meta = {}
    attn, merges = _specs()
    for spec, turbo in [(s, True) for s in attn] + [(s, False) for s in merges]:
        info = compile_for_sm75(spec.fn, spec.signature, spec.constexprs, num_warps=spec.num_warps, attrs=spec.attrs,
                                turbo=turbo, num_stages=1, maxnreg=spec.maxnreg)
        n_params = len({p for p in info.ptx.split() if p.startswith(info.entry + "_param_")})
        if info.global_scratch_bytes or n_params != len(spec.args) + 2:
            raise SystemExit(f"{spec.name}: unexpected parameters ({n_params}) or global scratch")
        if turbo and info.spill_bytes:
            if not allow_spills:
                raise SystemExit(f"{spec.name}: {info.spill_bytes} spill bytes")
            print(f"{spec.name}: {info.spill_bytes} spill bytes on sm_75 (kept: --allow-spills)", flush=True)
        (out / f"{spec.name}.ptx").write_text(info.ptx)
        meta[spec.name] = {"entry": info.entry, "shared": info.shared_bytes, "num_warps": info.num_warps,
                           "maxnreg": spec.maxnreg, "args": spec.args, "build": info.build, **info.summary_numbers(),
                           "triton": triton.__version__}
        print(spec.name, info.build, info.summary_numbers(), flush=True)
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


def _time(fns: list, budget_s: float = 0.5, per_event: int = 10) -> float:
    """Median milliseconds per call by CUDA events around `per_event` back-to-back calls, cycling
    through `fns` (one per cache copy), so short kernels are not timed as host launch gaps."""
    import torch

    for f in fns:
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(per_event):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    reps = max(10, min(100, int(budget_s / max(time.perf_counter() - t0, 1e-6))))
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(per_event):
            fns[i % len(fns)]()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / per_event)
    return statistics.median(times)


class _Sm75:
    """Our kernels' sm_75 PTX through CuPy and the driver JIT, launched as kernel.plan_call plans."""

    def __init__(self, ptx_dir: Path):
        import cupy as cp

        self.meta = json.loads((ptx_dir / "meta.json").read_text())
        self.fns = {}
        for name, m in self.meta.items():
            fn = cp.RawModule(path=str(ptx_dir / f"{name}.ptx")).get_function(m["entry"])
            if m["shared"] > 48 * 1024:  # above 48 KiB a launch needs the opt-in, as Triton's launcher does
                fn.max_dynamic_shared_size_bytes = m["shared"]
            self.fns[name] = (fn, m)

    @staticmethod
    def _params(args: dict, names: list[str]) -> tuple:
        import numpy as np

        out = []
        for n in names:
            x = args[n]
            out.append(np.uint64(x.data_ptr()) if hasattr(x, "data_ptr") else
                       np.float32(x) if isinstance(x, float) else np.int32(x))
        return tuple(out) + (np.uint64(0), np.uint64(0))  # Triton 3.6's global and profile scratch pointers

    def prepare(self, q, k, v, out, cu, used, table, ks, vs, shapes, max_q, max_k):
        """Plan the call as the product does and return (launch, splits): `launch()` only enqueues kernels."""
        import cupy as cp
        import torch

        from caovan_vllm_sm75_turbo3.kernels.attention.kernel import plan_call

        call = plan_call(q, k, v, out, cu, used, table, ks, vs, shapes, max_q, max_k, D ** -0.5, 0.0)
        stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        fn, m = self.fns[f"attn_d{D}_{shapes.kv_format}_{call.config.kind}_s{call.num_splits}"]
        launches = [(fn, call.grid, (m["num_warps"] * 32,), self._params(call.args, m["args"]), m["shared"])]
        if call.merge_grid is not None:
            fn, m = self.fns[f"attn_merge_d{D}_s{call.num_splits}"]
            launches.append((fn, call.merge_grid, (m["num_warps"] * 32,), self._params(call.merge_args, m["args"]),
                             m["shared"]))

        def launch(_call=call) -> None:  # holds the call, and so its partial buffers, alive
            for fn, grid, block, params, shared in launches:
                fn(grid, block, params, shared_mem=shared, stream=stream)

        return launch, call.num_splits


def _inputs(rows: list[tuple[int, int]], copies: int, dev):
    """q, vLLM-layout fp16 cache [blocks, 2, 528, 2, 256], one shuffled block table per copy, cu, used."""
    import torch

    q_lens = [r[0] for r in rows]
    kv_lens = [r[0] + r[1] for r in rows]
    need = [-(-n // BLOCK_SIZE) for n in kv_lens]
    num_blocks = sum(need) * copies + 1
    perm = torch.randperm(num_blocks, device=dev).int()
    tables, used_blocks = [], 0
    for _ in range(copies):
        t = torch.zeros(len(rows), max(need), dtype=torch.int32, device=dev)
        for n, c in enumerate(need):
            t[n, :c] = perm[used_blocks:used_blocks + c]
            used_blocks += c
        tables.append(t)
    kv16 = torch.randn(num_blocks, 2, BLOCK_SIZE, KVH, D, device=dev).half()
    q = (torch.randn(sum(q_lens), QH, D, device=dev) * 0.5).half()
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    used = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
    return q, kv16, tables, cu, used


def _fp8_cache(kv16, fmt: str):
    """The fp8 cache of kv16 in vLLM's layout with one per-tensor scale each for k and v (amax / fp8 max)."""
    import torch

    from caovan_vllm_sm75_turbo3.kernels.attention import quantize_cache

    dtype = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[fmt]
    kv8 = torch.empty(kv16.shape, dtype=dtype, device=kv16.device)
    scales = []
    for i in range(2):
        scale = float(kv16[:, i].abs().max()) / torch.finfo(dtype).max
        for b0 in range(0, kv16.shape[0], 64):  # in slices: the float64 intermediate stays small
            kv8[b0:b0 + 64, i] = quantize_cache(kv16[b0:b0 + 64, i], scale, fmt)
        scales.append(scale)
    return kv8, scales


def _bytes(rows, fmt: str) -> float:
    elt = 2 if fmt == "fp16" else 1
    T = sum(r[0] for r in rows)
    return float(2 * T * QH * D * 2 + sum(r[0] + r[1] for r in rows) * KVH * D * 2 * elt)


def _run_case(impl: _Sm75, case: str, rows, dev) -> dict:
    import torch

    from caovan_vllm_sm75_turbo3.kernels.attention import kv_quantisation_error, unified_attention_reference
    from caovan_vllm_sm75_turbo3.kernels.attention.inputs import AttentionShapes
    from caovan_vllm_sm75_turbo3.kernels.numerics import rel_error

    torch.manual_seed(0)
    kv_bytes16 = _bytes(rows, "fp16")
    copies = max(1, min(8, math.ceil(ROTATE_BYTES / kv_bytes16)))
    q, kv16, tables, cu, used = _inputs(rows, copies, dev)
    N, max_q, max_k = len(rows), max(r[0] for r in rows), max(r[0] + r[1] for r in rows)
    out_rows, ref16 = {}, None
    for fmt in FORMATS:
        if fmt == "fp16":
            kv, scales, ks = kv16, [1.0, 1.0], (None, None)
        else:
            kv, scales = _fp8_cache(kv16, fmt)
            ks = tuple(torch.tensor(s, device=dev).expand(N, KVH) for s in scales)  # as vLLM expands _k_scale
        k, v = kv.unbind(1)
        shapes = AttentionShapes(q.shape[0], QH, KVH, D, kv.shape[0], BLOCK_SIZE, N, fmt, -1)
        out = torch.full_like(q, float("nan"))
        try:
            launch, splits = impl.prepare(q, k, v, out, cu, used, tables[0], ks[0], ks[1], shapes, max_q, max_k)
            launch()
            torch.cuda.synchronize()
            ref = unified_attention_reference(q, k, v, cu, used, tables[0], D ** -0.5, k_descale=ks[0],
                                              v_descale=ks[1])
            row = {"splits": splits, "kernel_err": rel_error(out, ref), "nan": bool(torch.isnan(out).any())}
            if fmt == "fp16":
                ref16 = ref
            else:
                row["quant_err_kv"] = max(kv_quantisation_error(kv[:, i], kv16[:, i], torch.full((KVH,), scales[i], device=dev))
                                          for i in range(2))
                row["quant_err_out"] = rel_error(ref, ref16) if ref16 is not None else None
            del ref
            fns = [impl.prepare(q, k, v, out, cu, used, t, ks[0], ks[1], shapes, max_q, max_k)[0] for t in tables]
            ms = _time(fns)
            row |= {"ms": ms, "GBps": _bytes(rows, fmt) / ms / 1e6, "copies": copies}
        except Exception as err:  # report and carry on with the other rows
            row = {"error": repr(err)[:400]}
        out_rows[fmt] = row
        print(case, fmt, row, flush=True)
    base = out_rows["fp16"].get("ms")
    for r in out_rows.values():
        if base and "ms" in r:
            r["x_vs_fp16"] = base / r["ms"]
    return out_rows


def run(ptx_dir: Path, json_out: Path | None, cases: list[str]) -> None:
    import torch

    dev = torch.device("cuda")
    impl = _Sm75(ptx_dir)
    report: dict = {"card": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"),
                    "shape": {"q_heads": QH, "kv_heads": KVH, "head_dim": D, "block_size": BLOCK_SIZE}, "cases": {}}
    for case in cases:
        report["cases"][case] = {"rows": CASES[case], "formats": _run_case(impl, case, CASES[case], dev)}
        if json_out:
            json_out.write_text(json.dumps(report, indent=1))
    print(f"{'case':20s} {'format':9s} {'splits':>6s} {'kernel_err':>10s} {'quant_out':>9s} {'ms':>8s} {'GB/s':>7s} "
          f"{'x_fp16':>6s}")
    for case, c in report["cases"].items():
        for fmt, r in c["formats"].items():
            if "error" in r:
                print(f"{case:20s} {fmt:9s} ERROR {r['error'][:80]}")
                continue
            qo = "-" if r.get("quant_err_out") is None else f"{r['quant_err_out']:.2e}"
            print(f"{case:20s} {fmt:9s} {r['splits']:6d} {r['kernel_err']:10.2e} {qo:>9} "
                  f"{r['ms']:8.3f} {r['GBps']:7.0f} {r.get('x_vs_fp16', 0):6.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write the sm_75 turbo PTX of every config the cases use; no GPU")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--allow-spills", action="store_true",
                   help="keep turbo builds that spill on sm_75 (their PTX still serves `run`'s check elsewhere)")
    r = sub.add_parser("run", help="check and time every case on this machine's GPU")
    r.add_argument("--ptx", type=Path, required=True)
    r.add_argument("--json", type=Path)
    r.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.out, a.allow_spills)
        return 0
    cases = [x.strip() for x in a.cases.split(",") if x.strip()]
    unknown = [x for x in cases if x not in CASES]
    if unknown or not cases:
        ap.error(f"--cases: unknown case(s) {', '.join(unknown) or '(none given)'}; accepted: {', '.join(CASES)}")
    run(a.ptx, a.json, cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
