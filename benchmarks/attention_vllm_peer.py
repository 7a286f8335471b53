"""vLLM's own Triton attention kernel, built natively on the GPU at hand, timed on attention_fp8.py's cases.

The peer for our sm_75 attention kernel (issue 20): vLLM's `unified_attention` over an fp16 cache,
JIT-ed by the Triton where it runs (sm_90 on the H200), called as vLLM's TRITON_ATTN backend calls
it (split-K scratch of 16 segments, 3D launch below 128 // kv_heads sequences). Two steps, since
the GPU machine has no vLLM:

    python benchmarks/attention_vllm_peer.py prepare --out .bench/vllm_attn        # here (a venv with vLLM)
    python benchmarks/attention_vllm_peer.py run --peer .bench/vllm_attn --json F [--ours OURS.json]

`prepare` copies vLLM's kernel file and its Triton helper module out of an installed vLLM into the
ignored folder (vLLM's code is run beside ours, never copied into the repository) and writes
there a tiny `vllm` package of stand-ins for the few other vLLM names the file imports (CUDA,
no batch invariance). `run` imports the copy, builds attention_fp8.py's inputs (its builder and
timer, imported from it: same seeds, shapes, block tables and cache copies), checks vLLM's output
against the float64 reference (a wrong peer is not timed) and times it twice: eagerly (each call
through vLLM's Python launcher, as attention_fp8.py times ours) and replayed from CUDA graphs (as
vLLM runs decodes; the launcher's host time then drops out). Two cache layouts: `v021`, the very
tensors ours reads (vLLM 0.21's [blocks, 2, block, heads, dim]), and `v034`, the same values in
vLLM 0.34's [blocks, heads, block, 2 * dim] with k and v interleaved per token.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_SITE = REPO / ".venv-vllm034" / "lib" / "python3.11" / "site-packages" / "vllm"
COPIED = ("v1/attention/ops/triton_unified_attention.py", "v1/attention/ops/triton_attention_helpers.py")
# vLLM's TRITON_ATTN backend on a GPU that is not SM120 (triton_attn.py, 0.34): 16 segments, the 3D
# kernel while sequences <= 128 // kv_heads, scratch rows for that many sequences of 1 + 3 tokens.
SEGMENTS, MIN_GRID_2D, SCRATCH_QUERY_LEN = 16, 128, 4
DEFAULT_CASES = ("decode-32K", "decode-128K", "verify-1+3-32K", "prefill-8192@24K")
LAYOUTS = ("v021", "v034")
CUDA13_PTXAS = Path("/usr/local/cuda/bin/ptxas")

# The stand-ins: only what triton_unified_attention.py reads on CUDA.
STUBS: dict[str, str] = {
    "__init__.py": '"""Stand-in vllm package: only what the copied attention kernel imports."""\n',
    "envs.py": "VLLM_BATCH_INVARIANT = False  # vLLM's default\n",
    "logger.py": '''import logging


class _Logger(logging.LoggerAdapter):
    def debug_once(self, msg, *args, **kwargs):
        self.debug(msg, *args)

    def info_once(self, msg, *args, **kwargs):
        self.info(msg, *args)

    def warning_once(self, msg, *args, **kwargs):
        self.warning(msg, *args)


def init_logger(name):
    return _Logger(logging.getLogger(name), {})
''',
    "platforms/__init__.py": '''import torch


class _Cuda:
    """CUDA only: the kernel asks for ROCm (no), the fp8 dtype, and the device's capability family."""

    def is_rocm(self):
        return False

    def is_cuda(self):
        return True

    def fp8_dtype(self):
        return torch.float8_e4m3fn

    def is_device_capability_family(self, capability, device_id=0):
        major, minor = torch.cuda.get_device_capability(device_id)
        return (major * 10 + minor) // 10 == capability // 10


current_platform = _Cuda()
''',
    "triton_utils/__init__.py": "import triton\nimport triton.language as tl\n",
    "v1/__init__.py": "",
    "v1/attention/__init__.py": "",
    "v1/attention/ops/__init__.py": "",
    "v1/kv_cache_interface.py": '''from enum import IntEnum


class KVQuantMode(IntEnum):
    """The modes the kernel file names, with vLLM's values (it passes them as a constexpr)."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
''',
}


def _vllm_version(site: Path) -> str:
    dists = sorted(site.parent.glob("vllm-*.dist-info"))
    return dists[-1].name.removeprefix("vllm-").removesuffix(".dist-info") if dists else "unknown"


def prepare(out: Path, site: Path) -> None:
    """Copy vLLM's kernel file and helper module under `out`/vllm and write the stand-ins beside them."""
    if not (site / COPIED[0]).is_file():
        raise SystemExit(f"no vLLM kernel at {site / COPIED[0]} (give --vllm-site)")
    pkg = out / "vllm"
    if pkg.exists():
        shutil.rmtree(pkg)
    for rel in COPIED:
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(site / rel, pkg / rel)
        print(f"copied  {site / rel} -> {pkg / rel}")
    for rel, text in STUBS.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
        print(f"stubbed vllm/{rel}")
    meta = {"vllm": _vllm_version(site), "site": str(site), "copied": list(COPIED), "stubbed": list(STUBS)}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(f"vLLM {meta['vllm']}: {out}/meta.json")


def _on_path(folder: Path) -> None:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def _import_peer(peer: Path):
    """vLLM's unified_attention from the prepared folder (its stand-in `vllm` ahead of any installed one)."""
    sys.path.insert(0, str(peer.resolve()))
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    import vllm

    if not Path(vllm.__file__).resolve().is_relative_to(peer.resolve()):
        raise SystemExit(f"imported {vllm.__file__}, not the copy under {peer}")
    return unified_attention


def _layout(kv16, layout: str):
    """(k, v) views of the fp16 cache in vLLM 0.21's layout (the tensor itself) or 0.34's (a copy)."""
    if layout == "v021":
        return kv16.unbind(1)
    nb, _, bs, h, d = kv16.shape
    native = kv16.permute(0, 3, 2, 1, 4).reshape(nb, h, bs, 2 * d).contiguous()  # [blocks, heads, block, 2*dim]
    return native.transpose(1, 2).split(d, dim=-1)  # as triton_attn.py 0.34's forward splits it


def _scratch(dev, qh: int, d: int, kvh: int) -> dict:
    import torch

    rows = MIN_GRID_2D // kvh * SCRATCH_QUERY_LEN
    return {"seq_threshold_3D": MIN_GRID_2D // kvh, "num_par_softmax_segments": SEGMENTS,
            "softmax_segm_output": torch.empty(rows, qh, SEGMENTS, d, dtype=torch.float32, device=dev),
            "softmax_segm_max": torch.empty(rows, qh, SEGMENTS, dtype=torch.float32, device=dev),
            "softmax_segm_expsum": torch.empty(rows, qh, SEGMENTS, dtype=torch.float32, device=dev)}


def _graphed(fns: list) -> list:
    """One CUDA graph per call (each already warmed up and compiled), as replay callables."""
    import torch

    graphs = []
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns:
            f()
        torch.cuda.synchronize()
        for f in fns:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                f()
            graphs.append(g)
    torch.cuda.current_stream().wait_stream(stream)
    return [g.replay for g in graphs]


def _run_case(ua, af, case: str, rows, layouts: list[str], dev) -> dict:
    """Check and time vLLM's kernel on one attention_fp8.py case, per cache layout."""
    import math

    import torch

    from caovan_vllm_sm75_turbo3.kernels.attention import unified_attention_reference
    from caovan_vllm_sm75_turbo3.kernels.numerics import rel_error

    torch.manual_seed(0)  # as attention_fp8.py's _run_case: the same q, cache and tables
    copies = max(1, min(8, math.ceil(af.ROTATE_BYTES / af._bytes(rows, "fp16"))))
    q, kv16, tables, cu, used = af._inputs(rows, copies, dev)
    n, max_q, max_k = len(rows), max(r[0] for r in rows), max(r[0] + r[1] for r in rows)
    scratch = _scratch(dev, af.QH, af.D, af.KVH)
    ones = torch.ones(1, device=dev, dtype=torch.float32).expand(n, af.KVH)  # layer._k_scale as vLLM expands it
    ref = unified_attention_reference(q, kv16[:, 0], kv16[:, 1], cu, used, tables[0], af.D ** -0.5)
    result = {}
    for layout in layouts:
        k, v = _layout(kv16, layout)
        out = torch.full_like(q, float("nan"))

        def call(table, _k=k, _v=v, _out=out) -> None:
            ua(q, _k, _v, _out, cu, max_q, used, max_k, af.D ** -0.5, True, (-1, -1), table, 0.0, None, ones, ones,
               **scratch)

        try:
            t0 = time.perf_counter()
            call(tables[0])
            torch.cuda.synchronize()
            row = {"first_call_s": time.perf_counter() - t0, "err": rel_error(out, ref),
                   "nan": bool(torch.isnan(out).any())}
            if row["nan"] or row["err"] > 1e-2:
                row["wrong"] = True  # a wrong peer is not timed
            else:
                fns = [lambda t=t: call(t) for t in tables]
                row |= {"ms_eager": af._time(fns), "ms_graph": af._time(_graphed(fns)), "copies": copies}
                row["GBps_graph"] = af._bytes(rows, "fp16") / row["ms_graph"] / 1e6
        except Exception as err:  # report and carry on with the other rows
            row = {"error": repr(err)[:400]}
        result[layout] = row
        print(case, layout, row, flush=True)
        del k, v, out
    return result


def _table(report: dict, ours: dict | None) -> None:
    print(f"{'case':18s} {'layout':6s} {'vllm_err':>9s} {'eager_ms':>8s} {'graph_ms':>8s} {'GB/s':>6s} "
          f"{'ours16':>7s} {'ours8e4':>7s} {'ours8e5':>7s} {'x16':>5s}")
    for case, c in report["cases"].items():
        fmts = ((ours or {}).get("cases", {}).get(case) or {}).get("formats", {})
        o = [fmts.get(f, {}).get("ms") for f in ("fp16", "fp8_e4m3", "fp8_e5m2")]
        ocol = " ".join(f"{x:7.3f}" if x else f"{'-':>7s}" for x in o)
        for layout, r in c["layouts"].items():
            if "ms_graph" not in r:
                print(f"{case:18s} {layout:6s} {'WRONG' if r.get('wrong') else 'ERROR'} "
                      f"{r.get('err', r.get('error', ''))}")
                continue
            x16 = f"{r['ms_graph'] / o[0]:5.2f}" if o[0] else f"{'-':>5s}"
            print(f"{case:18s} {layout:6s} {r['err']:9.2e} {r['ms_eager']:8.3f} {r['ms_graph']:8.3f} "
                  f"{r['GBps_graph']:6.0f} {ocol} {x16}")
    print("x16: vLLM's graph-replayed time over our fp16 time (> 1: ours is faster); ours are eager CuPy launches")


def run(peer: Path, json_out: Path | None, cases: list[str], layouts: list[str], ours_json: Path | None) -> None:
    """Check and time vLLM's kernel on `cases`, printing a table beside our times if `ours_json` is given."""
    if "TRITON_PTXAS_PATH" not in os.environ and CUDA13_PTXAS.is_file():
        os.environ["TRITON_PTXAS_PATH"] = str(CUDA13_PTXAS)  # Triton 3.6's bundled ptxas 12.8 miscompiles sm_90 wgmma
    _on_path(REPO / "src")
    _on_path(REPO / "benchmarks")
    import attention_fp8 as af
    import torch
    import triton

    ua = _import_peer(peer)
    dev = torch.device("cuda")
    meta = json.loads((peer / "meta.json").read_text())
    report: dict = {"card": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"), "vllm": meta["vllm"],
                    "triton": triton.__version__, "ptxas": os.environ.get("TRITON_PTXAS_PATH", "triton's own"),
                    "shape": {"q_heads": af.QH, "kv_heads": af.KVH, "head_dim": af.D, "block_size": af.BLOCK_SIZE},
                    "cases": {}}
    print({k: v for k, v in report.items() if k != "cases"}, flush=True)
    for case in cases:
        report["cases"][case] = {"rows": af.CASES[case], "layouts": _run_case(ua, af, case, af.CASES[case], layouts,
                                                                               dev)}
        if json_out:
            json_out.write_text(json.dumps(report, indent=1))
    _table(report, json.loads(ours_json.read_text()) if ours_json else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="copy vLLM's kernel out of an installed vLLM and write the stand-ins; no GPU")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--vllm-site", type=Path, default=VLLM_SITE, help="the installed vllm package folder")
    r = sub.add_parser("run", help="check and time vLLM's kernel on this machine's GPU")
    r.add_argument("--peer", type=Path, required=True)
    r.add_argument("--json", type=Path)
    r.add_argument("--ours", type=Path, help="a JSON that attention_fp8.py run wrote, for the side-by-side table")
    r.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated, of attention_fp8.py's cases")
    r.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    a = ap.parse_args(argv)
    if a.cmd == "prepare":
        prepare(a.out, a.vllm_site)
        return 0
    _on_path(REPO / "benchmarks")
    from attention_fp8 import CASES

    cases = [x.strip() for x in a.cases.split(",") if x.strip()]
    layouts = [x.strip() for x in a.layouts.split(",") if x.strip()]
    if not cases or any(x not in CASES for x in cases) or not layouts or any(x not in LAYOUTS for x in layouts):
        ap.error(f"--cases of {', '.join(CASES)}; --layouts of {', '.join(LAYOUTS)}")
    run(a.peer, a.json, cases, layouts, a.ours)
    return 0


if __name__ == "__main__":
    sys.exit(main())
