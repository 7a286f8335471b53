"""Numeric proof and timing of the Turbo kernels on a GPU, from sm_75 PTX built here.

    # on the CPU machine (Triton 3.6 + vLLM 0.21 in .venv): build every PTX the run needs
    CUDA_VISIBLE_DEVICES= .venv/bin/python benchmarks/turbo_numeric.py prepare
    # on the lent GPU (torch + CuPy; PTX JIT-compiled by the driver for that card), in one call
    PYTHONPATH=src python3 benchmarks/turbo_numeric.py run

`prepare` compiles each allowlisted kernel (from vLLM 0.21's FLA ops in the venv) for every
verified config three ways: turbo (the hook's sm_75 PTX), plain sm_75 (Triton's FMA build) and
native (plain Triton for the GPU the run uses, sm_90 for the H200), into benchmarks/turbo_artifacts/.
`run` loads each PTX with CuPy's RawModule, launches it on fresh random inputs at Qwen3.6-27B TP2
shapes (8 key heads, 24 value heads, head dim 128, packed sequences, T 64 to 32768) with the
outputs poisoned with NaN, compares with the float64 references of kernels/turbo/cases.py, and
times the three builds with CUDA events. Kernels with a stress case (cases.STRESS) are also checked
on it at 4,050 tokens, and its largest output magnitude is reported. An fp32-dot kernel (exact FMA
when plain) passes with a turbo error at most twice plain's or under its case's `error_floor`.
It prints a table and writes $OUT/turbo_numeric.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ART = HERE / "turbo_artifacts"
sys.path.insert(0, str(HERE.parent / "src"))

NATIVE_ARCH = 90          # the lent H200
NATIVE_STAGES = 2         # the smallest num_stages of vLLM's autotune lists for these kernels
# The config of each kernel that the full shape sweep and the timing use (all configs get the numeric check).
TIMED = {"recompute_w_u_fwd_kernel": {"num_warps": 4},
         "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": {"BV": 32, "num_warps": 4},
         "chunk_fwd_kernel_o": {"BK": 64, "BV": 64, "num_warps": 4},
         "chunk_scaled_dot_kkt_fwd_kernel": {"BK": 64, "num_warps": 4},
         "merge_16x16_to_64x64_inverse_kernel": {"DOT_PRECISION": "ieee", "num_warps": 4}}


def _tag(cfg: dict) -> str:
    return "_".join(f"{k}{v}" for k, v in cfg.items())


def prepare() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from caovan_vllm_sm75_turbo3.cli.turbo_sources import check_builds, resolve
    from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import load_allowlist
    from caovan_vllm_sm75_turbo3.kernels.turbo.compile import compile_for_sm75, divisibility_attrs

    ART.mkdir(exist_ok=True)
    meta = {"triton": triton.__version__, "native_arch": NATIVE_ARCH, "timed": TIMED, "kernels": {}}
    from caovan_vllm_sm75_turbo3.kernels.turbo.cases import CASES

    for entry in load_allowlist().kernels:
        if entry.numeric not in CASES:   # our own GDN kernels: benchmarks/gdn_prefill.py
            continue
        kernel = resolve(entry)
        builds = []
        for cfg, sig, cx, warps, divisible in check_builds(kernel):
            attrs = divisibility_attrs(kernel.fn, divisible)
            for build in ("turbo", "plain", "native"):
                if build == "native":
                    if cfg != TIMED[entry.name]:
                        continue
                    ck = triton.compile(ASTSource(kernel.fn, sig, cx, attrs), target=GPUTarget("cuda", NATIVE_ARCH, 32),
                                        options={"num_warps": warps, "num_stages": NATIVE_STAGES})
                    ptx, shared = ck.asm["ptx"], ck.metadata.shared
                    scratch = ck.metadata.global_scratch_size or 0
                    entry_name = ck.metadata.name
                else:
                    info = compile_for_sm75(kernel.fn, sig, cx, num_warps=warps, turbo=build == "turbo", attrs=attrs,
                                            fp32_dots=entry.fp32_dots)
                    ptx, shared, scratch, entry_name = info.ptx, info.shared_bytes, info.global_scratch_bytes, info.entry
                fname = f"{entry.name}.{_tag(cfg)}.{build}.ptx"
                (ART / fname).write_text(ptx)
                builds.append({"config": cfg, "build": build, "file": fname, "entry": entry_name,
                               "shared": shared, "num_warps": warps, "global_scratch": scratch})
                print(f"{fname}: shared {shared}, mma {ptx.count('mma.sync')}", flush=True)
        meta["kernels"][entry.name] = {"numeric": entry.numeric, "signature": sig, "builds": builds}
    (ART / "meta.json").write_text(json.dumps(meta, indent=1))


def run() -> int:
    import cupy as cp
    import numpy as np
    import torch

    from caovan_vllm_sm75_turbo3.kernels.turbo import cases as C

    meta = json.loads((ART / "meta.json").read_text())
    dev = torch.device("cuda")
    card = torch.cuda.get_device_name(0)
    modules: dict[str, object] = {}

    def function(b: dict):
        if b["file"] not in modules:
            mod = cp.RawModule(path=str(ART / b["file"]))   # the driver JITs the PTX for this card
            fn = mod.get_function(b["entry"])
            if b["shared"] > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = b["shared"]
            modules[b["file"]] = fn
        return modules[b["file"]]

    def launcher(b: dict, case, sig: dict):
        if b["global_scratch"]:
            raise SystemExit(f"{b['file']} needs global scratch memory; this runner passes none")
        fn = function(b)
        vals = []
        for kind, v in C.launch_args(case, sig):
            if kind.startswith("*"):
                vals.append(np.uint64(v.data_ptr()))
            elif kind == "fp32":
                vals.append(np.float32(v))
            else:
                vals.append(np.int32(v))
        vals += [np.uint64(0), np.uint64(0)]   # Triton 3.6: global and profile scratch pointers
        args = tuple(vals)

        def go() -> None:
            fn(case.grid, (b["num_warps"] * 32,), args, shared_mem=b["shared"])
        return go

    rows, failures = [], []
    gen = torch.Generator(device=dev)
    gen.manual_seed(int.from_bytes(os.urandom(4), "little"))   # fresh inputs every run
    t_start = time.time()
    for name, km in meta["kernels"].items():
        sig, timed_cfg = km["signature"], meta["timed"][name]
        configs = []
        for b in km["builds"]:
            if b["config"] not in configs:
                configs.append(b["config"])
        todo = [(C.CASES[km["numeric"]], packing, cfg) for packing in C.packings("full") for cfg in configs
                if cfg == timed_cfg or packing.seqlens == (1, 63, 64, 65, 500, 1000, 2357)]
        if km["numeric"] in C.STRESS:   # one shape, no timing
            todo.append((C.STRESS[km["numeric"]], C.Packing((1, 63, 64, 65, 500, 1000, 2357)), timed_cfg))
        for make, packing, cfg in todo:
            case = make(packing, dev, gen, cfg)
            row = _measure(case, cfg, [b for b in km["builds"] if b["config"] == cfg],
                           lambda b: launcher(b, case, sig), timed=cfg == timed_cfg and make in C.CASES.values())
            row.update({"kernel": name, "case": make.__name__, "seqs": len(packing.seqlens)})
            if not row["ok"]:
                failures.append(row)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del case
            torch.cuda.empty_cache()
    out = os.environ.get("OUT")
    if out:
        Path(out, "turbo_numeric.json").write_text(json.dumps({"card": card, "rows": rows}, indent=1))
    print(f"\ncard: {card}; {len(rows)} checks in {time.time() - t_start:.0f} s; {len(failures)} failing")
    _print_table(rows)
    return 1 if failures else 0


def _measure(case, cfg: dict, builds: list[dict], launcher, timed: bool) -> dict:
    """Run each build of one case on the same inputs: its error against float64, and its time when `timed`."""
    import torch

    from caovan_vllm_sm75_turbo3.kernels.turbo import cases as C

    refs = case.reference()
    row = {"config": cfg, "tokens": case.tokens, **case.extra}
    for b in builds:
        go = launcher(b)
        for t in case.outputs.values():
            t.fill_(case.fill)
        go()
        torch.cuda.synchronize()
        errs = C.compare(case, refs)
        row[f"{b['build']}_err"] = max(errs.values())  # inf if any output is broken
        if b["build"] == "turbo":
            row["turbo_max_abs_out"] = max(float(t.abs().max()) for t in case.outputs.values())
        if timed:
            for _ in range(3):
                go()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            reps = 20
            start.record()
            for _ in range(reps):
                go()
            end.record()
            end.synchronize()
            row[f"{b['build']}_ms"] = start.elapsed_time(end) / reps
    te, pe = row.get("turbo_err", float("nan")), row.get("plain_err", float("nan"))
    row["ok"] = bool(math.isfinite(te) and math.isfinite(pe) and (te <= 2 * pe + 1e-7 or te <= case.error_floor))
    return row


def _print_table(rows: list[dict]) -> None:
    print(f"{'kernel':<48} {'config':<22} {'tokens':>6} {'turbo err':>9} {'plain err':>9} "
          f"{'turbo ms':>9} {'plain ms':>9} {'native ms':>9} {'plain/turbo':>11} ok")
    for r in rows:
        if "turbo_ms" not in r:
            continue
        ratio = r["plain_ms"] / r["turbo_ms"] if r.get("turbo_ms") else float("nan")
        print(f"{r['kernel']:<48} {_tag(r['config']):<22} {r['tokens']:>6} {r['turbo_err']:>9.2e} {r['plain_err']:>9.2e} "
              f"{r['turbo_ms']:>9.3f} {r['plain_ms']:>9.3f} {r.get('native_ms', float('nan')):>9.3f} {ratio:>11.2f} "
              f"{'PASS' if r['ok'] else 'FAIL'}")
    for r in rows:
        if r["case"] in ("solve_tril_stress",):
            print(f"stress {r['kernel']}: turbo err {r['turbo_err']:.2e}, plain err {r['plain_err']:.2e}, "
                  f"max |A| {r['max_abs_A']:.3g}, max |Ai| (turbo) {r['turbo_max_abs_out']:.3g}")
    worst = max((r["turbo_err"] / r["plain_err"] for r in rows if r.get("plain_err")), default=float("nan"))
    print(f"all configs: worst turbo/plain error ratio {worst:.2f} (limit 2, or the fp32-dot floor), NaN never")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=("prepare", "run"))
    a = p.parse_args()
    if a.step == "prepare":
        prepare()
        return 0
    return run()


if __name__ == "__main__":
    raise SystemExit(main())
