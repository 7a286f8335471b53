"""What a cold start compiles for vLLM 0.21's GDN prefill on Turing, plugin off against on, on this CPU.

Without the plugin, Triton's autotuner builds every config of each FLA GDN forward kernel's
autotune list the first time the kernel runs (the list as a 2080 Ti evaluates it: 64 KiB of shared
memory, so FLA's smaller tiles; every num_stages is its own build), each through ptxas for sm_75.
With the plugin on, our GDN prefill replaces that chain and builds its pinned configs instead,
through the Turbo hook. This script makes both sets of builds here, one after another as the
autotuner does, and times each: the whole `triton.compile` and the ptxas calls inside it.
No GPU: `triton.compile(..., target=GPUTarget("cuda", 75, 32))`.

    .venv-triton36/bin/python benchmarks/gdn_cold_start_sm75.py --out benchmarks/results/X.json
    ... --kernel chunk_fwd_kernel_o --limit 3      # a quick look: 3 configs of one kernel

The FLA kernels come from the committed standalone copies (tests/data/fla_variants, digest-checked
against 0.21.0), their autotune lists from the 0.21.0 wheel's own text (downloaded once, as
benchmarks/engine/pack.py does). Kernels outside the five (cumsum, l2norm) are not counted.
Needs Triton 3.6 (vLLM 0.21.0's pin) and this project installed (`bash scripts/test.sh --tritons`
makes such venvs for other Tritons; `pip install triton==3.6.0 -e .` for this one).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "benchmarks" / "engine")]
import fla_releases  # noqa: E402

RELEASE = "0.21.0"
TURING_SHARED = 65536   # what a 2080 Ti's block may use; a bigger build fails at launch there
OURS = ("_prep_kernel", "_state_kernel")
MODEL_SHAPE = "_k128_v128"   # Qwen3.5/3.6's GDN head dims (K = V = 128): the pinned builds a start of theirs needs


@contextmanager
def ptxas_clock() -> Iterator[list[float]]:
    """Seconds of each ptxas run started through subprocess.run while the block runs."""
    runs: list[float] = []
    real = subprocess.run

    def timed_run(cmd: Any, *a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return real(cmd, *a, **kw)
        finally:
            if isinstance(cmd, (list, tuple)) and cmd and str(cmd[0]).endswith("ptxas"):
                runs.append(time.perf_counter() - t0)

    subprocess.run = timed_run
    try:
        yield runs
    finally:
        subprocess.run = real


def timed_build(build: Callable[[], Any]) -> dict[str, Any]:
    """Run one build; its seconds, the ptxas seconds inside it and its shared memory. The last ptxas
    run is the resource readout `compile_for_sm75` adds (no user process makes it): not counted."""
    with ptxas_clock() as runs:
        t0 = time.perf_counter()
        try:
            info, error = build(), None
        except Exception as err:   # a config that does not build still cost its time
            info, error = None, f"{type(err).__name__}: {str(err)[:200]}"
        total = time.perf_counter() - t0
    readout = runs[-1] if info is not None and runs else 0.0
    row = {"seconds": total - readout, "ptxas_seconds": sum(runs) - readout, "ptxas_runs": len(runs) - (info is not None)}
    if info is not None:
        row.update(shared_bytes=info.shared_bytes, registers=info.registers, mma_count=info.mma_count,
                   fits_turing=info.shared_bytes <= TURING_SHARED)
    else:
        row["error"] = error
    return row


def fla_texts(wheel: Path) -> dict[str, str]:
    """Each FLA GDN forward kernel's ops file text, as the wheel ships it."""
    package = fla_releases.PACKAGES[0]
    with zipfile.ZipFile(wheel) as zf:
        return {k: zf.read(f"{package}/{stem}.py").decode() for k, stem in fla_releases.KERNELS.items()}


def stock_builds(wheel: Path, only: list[str], limit: int) -> Iterator[dict[str, Any]]:
    """Every autotune build of the five FLA kernels, plain for sm_75, as stock vLLM 0.21 makes them."""
    from caovan_vllm_sm75_turbo3.kernels.turbo.compile import compile_for_sm75, divisibility_attrs

    data = fla_releases.load()
    for kernel, text in fla_texts(wheel).items():
        if only and kernel not in only:
            continue
        variant = next(v for v in data["variants"] if v["kernel"] == kernel and RELEASE in v["releases"])
        fn = fla_releases.load_variant(variant)
        spec = fla_releases.check_spec(variant, fn)
        pointers = [n for n, t in spec["signature"].items() if t.startswith("*")]
        configs = fla_releases.turing_configs(text, kernel, stages=True)
        for cfg in configs[:limit or None]:
            tiles = {k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages")}

            def build(cfg: dict[str, Any] = cfg, tiles: dict[str, Any] = tiles) -> Any:
                return compile_for_sm75(fn, spec["signature"], {**spec["constexprs"], **tiles},
                                        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], turbo=False,
                                        attrs=divisibility_attrs(fn, pointers))

            row = {"kernel": kernel, "configs_in_list": len(configs), "config": cfg, **timed_build(build)}
            print(f"  stock {kernel:<48} {json.dumps(cfg):<52} {row['seconds']:7.2f} s "
                  f"(ptxas {row['ptxas_seconds']:6.2f} s) shared {row.get('shared_bytes', '-')}", flush=True)
            yield row


def plugin_builds() -> Iterator[dict[str, Any]]:
    """Every pinned build of our GDN prefill, turbo for sm_75, as the plugin makes them at start."""
    from caovan_vllm_sm75_turbo3.cli.turbo_sources import check_builds, resolve
    from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import load_allowlist
    from caovan_vllm_sm75_turbo3.kernels.turbo.compile import compile_for_sm75, divisibility_attrs

    for entry in load_allowlist().kernels:
        if entry.name not in OURS:
            continue
        kernel = resolve(entry)
        for cfg, sig, cx, warps, divisible in check_builds(kernel):
            def build(sig: dict = sig, cx: dict = cx, warps: int = warps, divisible: list = divisible,
                      cfg: dict = cfg) -> Any:
                return compile_for_sm75(kernel.fn, sig, cx, num_warps=warps, turbo=True,
                                        attrs=divisibility_attrs(kernel.fn, divisible),
                                        maxnreg=cfg.get("maxnreg"), fp32_dots=entry.fp32_dots)

            row = {"kernel": entry.name, "config": cfg, "model_shape": MODEL_SHAPE in cfg.get("spec", ""),
                   **timed_build(build)}
            print(f"  ours  {entry.name:<48} {cfg.get('spec', ''):<52} {row['seconds']:7.2f} s "
                  f"(ptxas {row['ptxas_seconds']:6.2f} s) shared {row.get('shared_bytes', '-')}", flush=True)
            yield row


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Builds, seconds, ptxas seconds and builds over Turing's shared memory, per kernel and in all."""
    def sums(rs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"builds": len(rs), "seconds": sum(r["seconds"] for r in rs),
                "ptxas_seconds": sum(r["ptxas_seconds"] for r in rs),
                "over_turing_shared": sum(not r.get("fits_turing", True) for r in rs),
                "failed": sum("error" in r for r in rs)}
    kernels = sorted({r["kernel"] for r in rows})
    return {"all": sums(rows), **{k: sums([r for r in rows if r["kernel"] == k]) for k in kernels}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", type=Path, default=None,
                        help=f"vLLM {RELEASE}'s wheel (default: downloaded once into ~/.cache/caovan-carry)")
    parser.add_argument("--kernel", action="append", default=[], help="only this FLA kernel (repeatable)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many configs per FLA kernel (0: all)")
    parser.add_argument("--out", type=Path, default=None, help="write the rows and totals here as JSON")
    parser.add_argument("--cache", type=Path, default=None,
                        help="Triton's cache folder (default: a new empty one, so every build is a cold one)")
    args = parser.parse_args(argv)
    # Before Triton is imported: a warm cache would answer the builds without compiling them.
    os.environ["TRITON_CACHE_DIR"] = str(args.cache or Path(tempfile.mkdtemp(prefix="gdn-cold-start-")))
    import triton

    if args.wheel is None:
        from pack import vllm_wheel

        cache = Path.home() / ".cache" / "caovan-carry"
        cache.mkdir(parents=True, exist_ok=True)
        args.wheel = vllm_wheel(cache, RELEASE)
    print(f"gdn_cold_start_sm75: vLLM {RELEASE} FLA (plugin off) against our GDN prefill (plugin on), "
          f"Triton {triton.__version__}, sm_75, one build at a time", flush=True)
    ours = list(plugin_builds())
    stock = list(stock_builds(args.wheel, args.kernel, args.limit))
    result = {"release": RELEASE, "triton": triton.__version__, "machine": platform.processor() or platform.machine(),
              "cpus": len(os.sched_getaffinity(0)), "triton_cache": os.environ["TRITON_CACHE_DIR"], "limit": args.limit, "kernels": args.kernel,
              "plugin_off": {"totals": totals(stock), "rows": stock},
              "plugin_on": {"totals": totals(ours), "model_shape_totals": totals([r for r in ours if r["model_shape"]]),
                            "rows": ours}}
    off, on = result["plugin_off"]["totals"]["all"], result["plugin_on"]["model_shape_totals"]["all"]
    print(f"plugin off: {off['builds']} builds, {off['seconds']:.1f} s ({off['ptxas_seconds']:.1f} s in ptxas), "
          f"{off['over_turing_shared']} over 64 KiB shared")
    print(f"plugin on:  {on['builds']} builds at Qwen3.5/3.6's K = V = 128, {on['seconds']:.1f} s "
          f"({on['ptxas_seconds']:.1f} s in ptxas); every pinned shape: {result['plugin_on']['totals']['all']['builds']} "
          f"builds, {result['plugin_on']['totals']['all']['seconds']:.1f} s")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
