"""`caovan-sm75-verify`: the Turbo numeric checks on this machine's own Turing GPU, in under a minute.

Each allowlisted kernel is compiled for sm_75 twice (turbo and plain Triton), launched on fresh
random inputs at Qwen3.6-27B TP2 shapes with NaN-poisoned outputs, and compared with a float64
reference. PASS needs no NaN and a turbo error at most twice the plain build's (an fp32-dot
kernel, exact FMA when plain, also passes under its case's `error_floor`, 1e-5). Then our GDN
prefill runs through the same dispatch path as in vLLM (plugin/dispatch/verify.py), against the
float64 reference and vLLM's own kernel. Exit 0 all PASS, 1 a FAIL, 2 no SM75 GPU here (or bad input).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from .. import __version__
from ..errors import CaovanError
from .common import OneLineParser, print_json, run_cli

PROG = "caovan-sm75-verify"
ERROR_RATIO_MAX = 2.0


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Check the Turbo (tensor-core) builds of the allowlisted Triton kernels against float64 "
                    "references on this machine's SM75 GPU: PASS/FAIL per kernel, in under a minute.",
        epilog="Exit codes: 0 all PASS, 1 a kernel FAILs, 2 no SM75 GPU visible or bad input.")
    p.add_argument("--device", type=int, default=0, metavar="N", help="CUDA device index (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object with a row per kernel and shape")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    return p


def _sm75_device(index: int) -> Any:
    """The torch device for `index`, or CaovanError(exit 2) when it is not a visible SM75 GPU."""
    from ..runtime.probe import probe_gpus

    gpus, _, _ = probe_gpus(os.environ, [])
    if not gpus:
        raise CaovanError("no NVIDIA GPU is visible on this machine; caovan-sm75-verify needs the Turing "
                          "card it checks. Without one, `caovan-sm75-kernels check` compiles our kernels for sm_75 "
                          "offline (it needs Triton, which vLLM installs; `pip install triton` where vLLM is not).")
    if index >= len(gpus) or not gpus[index].is_sm75:
        have = ", ".join(f"{g.index}: {g.name} ({g.compute_capability})" for g in gpus)
        raise CaovanError(f"--device {index} is not a visible SM75 GPU (visible: {have}).")
    import torch

    return torch.device("cuda", index)


def _run_case(kernel: Any, entry: Any, cfg: dict, sig: dict, cx: dict, warps: int, packing: Any, device: Any,
              gen: Any) -> dict[str, Any]:
    from ..kernels.turbo import cases as C
    from ..kernels.turbo.compile import compile_for_sm75, divisibility_attrs

    attrs = divisibility_attrs(kernel.fn, [n for n, t in sig.items() if t.startswith("*")])
    case = C.CASES[entry.numeric](packing, device, gen, cfg)
    refs = case.reference()
    row: dict[str, Any] = {"kernel": entry.name, "config": cfg, "tokens": case.tokens}
    for build in ("turbo", "plain"):
        info = compile_for_sm75(kernel.fn, sig, cx, num_warps=warps, turbo=build == "turbo", attrs=attrs,
                                maxnreg=cfg.get("maxnreg"), fp32_dots=entry.fp32_dots)
        for t in case.outputs.values():
            t.fill_(case.fill)   # NaN, or the zeros a launcher allocates (vLLM's solve_tril)
        info.kernel[case.grid](*[case.args[n] for n in kernel.fn.arg_names])
        import torch

        torch.cuda.synchronize(device)
        errs = C.compare(case, refs)
        row[f"{build}_err"] = max(errs.values())
    te, pe = row["turbo_err"], row["plain_err"]
    row["ok"] = math.isfinite(te) and math.isfinite(pe) and (   # broken: inf
        te <= ERROR_RATIO_MAX * pe or te <= case.error_floor)   # the floor: fp32-dot kernels (cases.py)
    return row


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    device = _sm75_device(args.device)
    import torch

    from ..kernels.turbo import cases as C
    from ..kernels.turbo.allowlist import load_allowlist
    from .turbo_sources import check_builds, resolve

    torch.cuda.set_device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(os.urandom(4), "little"))   # fresh inputs on every run
    start, rows = time.time(), []
    skipped = []
    for entry in load_allowlist().kernels:
        if entry.numeric not in C.CASES:   # our own kernels check themselves (see the allowlist evidence)
            skipped.append(f"{entry.name}: checked by {entry.numeric}")
            continue
        kernel = resolve(entry)
        cfg, sig, cx, warps, _ = next(iter(check_builds(kernel)))  # one verified config per kernel
        for packing in C.packings("quick"):
            rows.append(_run_case(kernel, entry, cfg, sig, cx, warps, packing, device, gen))
    from ..plugin.dispatch.verify import FAIL, verify_prefill

    gdn = verify_prefill(device=device)
    ok = all(r["ok"] for r in rows) and all(g.status != FAIL for g in gdn)
    if args.json:
        print_json({"card": torch.cuda.get_device_name(device), "ok": ok, "rows": rows,
                    "gdn_prefill": [g.to_dict() for g in gdn]}, indent=1)
    else:
        print(f"{torch.cuda.get_device_name(device)}: {len(rows)} checks in {time.time() - start:.0f} s")
        for name in dict.fromkeys(r["kernel"] for r in rows):
            mine = [r for r in rows if r["kernel"] == name]
            worst = max(mine, key=lambda r: (not r["ok"], r["turbo_err"] / r["plain_err"] if r["plain_err"] else 0))
            print(f"{'PASS' if all(r['ok'] for r in mine) else 'FAIL'}  {name}  turbo err {worst['turbo_err']:.2e}, "
                  f"plain err {worst['plain_err']:.2e} (T={worst['tokens']})")
        for line in skipped:
            print(f"-     {line}")
        for g in gdn:
            print(f"{g.status}  {g.name}  {g.detail}")
    return 0 if ok else 1


def entry() -> None:
    """Console-script entry point."""
    raise SystemExit(run_cli(PROG, main))


if __name__ == "__main__":
    entry()
