"""Numeric proof and timing of the Turbo kernels on a GPU, from sm_75 PTX built here.

    # on the CPU machine (Triton 3.6 + vLLM 0.21 in .venv): build every PTX the run needs
    CUDA_VISIBLE_DEVICES= .venv/bin/python benchmarks/turbo_numeric.py prepare
    # vLLM's FLA copies of later releases (tests/data/fla_variants), with each Triton they pin
    .venv/bin/python benchmarks/turbo_numeric.py prepare --variants
    .venv-triton37/bin/python benchmarks/turbo_numeric.py prepare --variants   # likewise 38
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
`prepare --variants` builds, with the Triton of the venv it runs in, every source variant of the five
kernels that a supported vLLM release ships with that Triton (tools/fla_releases.py's standalone
copies, their extra constexprs at vLLM's GDN values), turbo and plain, at every config that passed
the compile check there, into turbo_artifacts/variants-<triton>/; `run` checks each config on the
7-sequence pack, the timed config (or the first) also on 4 x 2,048 tokens and the stress case, untimed.
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
    from caovan_vllm_sm75_turbo3.kernels.turbo.compile import divisibility_attrs

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
            builds += _sm75_builds(ART, entry.name, kernel.fn, cfg, sig, cx, warps, attrs, entry.fp32_dots)
            if cfg != TIMED[entry.name]:
                continue
            ck = triton.compile(ASTSource(kernel.fn, sig, cx, attrs), target=GPUTarget("cuda", NATIVE_ARCH, 32),
                                options={"num_warps": warps, "num_stages": NATIVE_STAGES})
            fname = f"{entry.name}.{_tag(cfg)}.native.ptx"
            (ART / fname).write_text(ck.asm["ptx"])
            builds.append({"config": cfg, "build": "native", "file": fname, "entry": ck.metadata.name,
                           "shared": ck.metadata.shared, "num_warps": warps,
                           "global_scratch": ck.metadata.global_scratch_size or 0})
        meta["kernels"][entry.name] = {"numeric": entry.numeric, "signature": sig, "builds": builds}
    (ART / "meta.json").write_text(json.dumps(meta, indent=1))


def _sm75_builds(folder: Path, name: str, fn, cfg: dict, sig: dict, cx: dict, warps: int, attrs,
                 fp32_dots: str) -> list[dict]:
    """Write the turbo and plain sm_75 PTX of one config into `folder`; their meta rows."""
    from caovan_vllm_sm75_turbo3.kernels.turbo.compile import compile_for_sm75

    rows = []
    for build in ("turbo", "plain"):
        info = compile_for_sm75(fn, sig, cx, num_warps=warps, turbo=build == "turbo", attrs=attrs, fp32_dots=fp32_dots)
        n_params = len({p for p in info.ptx.split() if p.startswith(info.entry + "_param_")})
        if n_params != sum(kind != "constexpr" for kind in sig.values()) + 2:   # + global and profile scratch
            raise SystemExit(f"{name} {cfg}: {n_params} PTX parameters, not the signature's plus two")
        fname = str((folder / f"{name}.{_tag(cfg)}.{build}.ptx").relative_to(ART))
        (ART / fname).write_text(info.ptx)
        rows.append({"config": cfg, "build": build, "file": fname, "entry": info.entry, "shared": info.shared_bytes,
                     "num_warps": warps, "global_scratch": info.global_scratch_bytes})
        print(f"{fname}: shared {info.shared_bytes}, mma {info.ptx.count('mma.sync')}", flush=True)
    return rows


def prepare_variants() -> None:
    """Build each FLA source variant that a supported vLLM release ships with this Triton (module docstring)."""
    import triton

    sys.path.insert(0, str(HERE.parent / "tools"))
    import fla_releases

    from caovan_vllm_sm75_turbo3.cli.turbo_sources import ResolvedKernel, check_builds
    from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import KernelEntry, load_allowlist
    from caovan_vllm_sm75_turbo3.kernels.turbo.compile import divisibility_attrs

    numeric = {e.name: e.numeric for e in load_allowlist().kernels}
    folder = ART / f"variants-{triton.__version__}"
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"triton": triton.__version__, "kernels": {}}
    for v in fla_releases.shipped_here(fla_releases.load(), triton.__version__):
        passed = [r["config"] for r in v["checks"].get(triton.__version__, []) if r["build"] == "turbo" and r["ok"]]
        if not passed:
            raise SystemExit(f"{v['file']}: no passing turbo config recorded for Triton {triton.__version__} "
                             "(tools/fla_releases.py check --record)")
        timed = {k: x for k, x in TIMED[v["kernel"]].items() if k in passed[0]}
        fn = fla_releases.load_variant(v)
        spec = fla_releases.check_spec(v, fn)
        entry = KernelEntry(name=v["kernel"], modules=(fn.__module__,), source_sha256=(v["digest"],),
                            triton_versions=(triton.__version__,), configs=tuple(passed), check=spec,
                            numeric=numeric[v["kernel"]], fp32_dots=spec["fp32_dots"])
        builds = []
        for cfg, sig, cx, warps, divisible in check_builds(ResolvedKernel(entry, fn, fn.__module__, v["digest"])):
            builds += _sm75_builds(folder, f"{v['kernel']}.{v['digest']}", fn, cfg, sig, cx, warps,
                                   divisibility_attrs(fn, divisible), spec["fp32_dots"])
        meta["kernels"][f"{v['kernel']}@{v['digest']}"] = {
            "kernel": v["kernel"], "digest": v["digest"], "releases": f"{v['first']}-{v['last']}",
            "wide": timed if timed in passed else passed[0],
            "numeric": entry.numeric, "signature": sig, "builds": builds}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


def run() -> int:
    import cupy as cp
    import numpy as np
    import torch

    from caovan_vllm_sm75_turbo3.kernels.turbo import cases as C

    metas = [json.loads(p.read_text()) for p in [ART / "meta.json", *sorted(ART.glob("variants-*/meta.json"))]]
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
    ragged = C.Packing((1, 63, 64, 65, 500, 1000, 2357))
    for meta, name, km in ((m, n, k) for m in metas for n, k in m["kernels"].items()):
        sig, variant = km["signature"], "digest" in km   # a later release's copy: numbers only, untimed
        timed_cfg = None if variant else meta["timed"][name]
        configs = []
        for b in km["builds"]:
            if b["config"] not in configs:
                configs.append(b["config"])
        if variant:   # every config on the ragged pack, one also on 4 x 2,048
            todo = [(C.CASES[km["numeric"]], ragged, cfg) for cfg in configs]
            todo.append((C.CASES[km["numeric"]], C.Packing((2048,) * 4), km["wide"]))
        else:
            todo = [(C.CASES[km["numeric"]], packing, cfg) for packing in C.packings("full") for cfg in configs
                    if cfg == timed_cfg or packing.seqlens == ragged.seqlens]
        if km["numeric"] in C.STRESS:   # one shape, no timing
            todo.append((C.STRESS[km["numeric"]], ragged, timed_cfg or km["wide"]))
        for make, packing, cfg in todo:
            case = make(packing, dev, gen, cfg)
            row = _measure(case, cfg, [b for b in km["builds"] if b["config"] == cfg],
                           lambda b: launcher(b, case, sig), timed=cfg == timed_cfg and make in C.CASES.values())
            row.update({"kernel": km.get("kernel", name), "case": make.__name__, "seqs": len(packing.seqlens),
                        "triton": meta["triton"]})
            if variant:
                row.update({"digest": km["digest"], "releases": km["releases"]})
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
        if "digest" in r:
            print(f"variant {r['kernel']} {r['digest']} ({r['releases']}) Triton {r['triton']} {_tag(r['config'])} "
                  f"{r['case']} {r['tokens']} tokens: turbo err {r['turbo_err']:.2e}, plain err {r['plain_err']:.2e} "
                  f"{'PASS' if r['ok'] else 'FAIL'}")
    for r in rows:
        if r["case"] in ("solve_tril_stress",):
            print(f"stress {r['kernel']} (Triton {r['triton']} {r.get('digest', '')}): turbo err {r['turbo_err']:.2e}, plain err {r['plain_err']:.2e}, "
                  f"max |A| {r['max_abs_A']:.3g}, max |Ai| (turbo) {r['turbo_max_abs_out']:.3g}")
    worst = max((r["turbo_err"] / r["plain_err"] for r in rows if r.get("plain_err")), default=float("nan"))
    print(f"all configs: worst turbo/plain error ratio {worst:.2f} (limit 2, or the fp32-dot floor), NaN never")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=("prepare", "run"))
    p.add_argument("--variants", action="store_true",
                   help="prepare: the later releases' FLA copies that ship with this venv's Triton")
    a = p.parse_args()
    if a.step == "prepare":
        prepare_variants() if a.variants else prepare()
        return 0
    return run()


if __name__ == "__main__":
    raise SystemExit(main())
