"""Check every vLLM release from 0.21.0 on against our attention interface families, from source.

Like tools/vllm_conformance.py (the GDN table), per release: the wheel from the wheel folder or
`pip download --no-deps` (deleted again), the few source files copied to a cache, then
`plugin.attention.interface.check_sources` (Python `ast`, nothing imported). Writes
docs/attention.md's table between its markers. `--installed` checks this environment's vLLM
against its committed row and exits 1 on a mismatch.

    .venv/bin/python tools/vllm_attention_conformance.py               # all releases, rewrite the table
    .venv-vllm034/bin/python tools/vllm_attention_conformance.py --installed
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_conformance import WHEELS, cached_sources, folder_reader, releases

from caovan_vllm_sm75_turbo3.plugin.attention.controller import FAMILIES, family_for
from caovan_vllm_sm75_turbo3.plugin.attention.interface import AttentionConformance, check_sources
from caovan_vllm_sm75_turbo3.plugin.installed_vllm import installed_source
from caovan_vllm_sm75_turbo3.runtime.probe import dist_version

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "attention.md"
BEGIN, END = "<!-- attention-conformance:begin -->", "<!-- attention-conformance:end -->"
HEAD = ["vLLM", "family (release table)", "registry: CUSTOM + register_backend", "vLLM fp8 KV on SM75 "
        "(impl + cache write)", "KV split in forward", "CUDA graphs (TRITON_ATTN builder)", "result"]


def sources(version: str, wheels: Path, cache: Path) -> Path:
    """The folder holding this release's files the attention check reads (extracted once)."""
    return cached_sources(version, wheels, cache, {p for f in FAMILIES for p in f.source_files()})


def row(version: str, read) -> str:
    """One release's table row."""
    family = family_for(version)
    result: AttentionConformance = check_sources(family or FAMILIES[0], read)
    fp8 = {True: "yes", False: "no (SM89+ asserted)", None: "-"}[result.vllm_fp8_on_sm75]
    if family is None:
        verdict = "not needed: vLLM's own backends serve fp8 KV on SM75" if result.vllm_fp8_on_sm75 else \
            "NOT supported: no family of ours for this release"
    else:
        verdict = "supported" if result.ok else "NOT supported: " + "; ".join(result.problems)
    registry = "yes" if not any("CUSTOM" in p or "register_backend" in p for p in result.problems) else "no"
    cells = [f"`{version}`", family.name if family else "-", registry, fp8, f"`{result.kv_layout}`",
             result.cudagraph_support or "-", verdict]
    return "| " + " | ".join(cells) + " |"


def table(rows: list[str]) -> str:
    return "\n".join([BEGIN, "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD), *rows, END])


def committed_row(version: str, doc: Path = DOC) -> str | None:
    """The doc's row for `version`, or None."""
    return next((ln for ln in doc.read_text(encoding="utf-8").splitlines() if ln.startswith(f"| `{version}` |")),
                None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", type=Path, default=WHEELS)
    ap.add_argument("--cache", type=Path, default=WHEELS / "attention-src")
    ap.add_argument("--out", type=Path, default=DOC)
    ap.add_argument("--versions", nargs="*", help="only these releases (default: 0.21.0 to 0.34.x)")
    ap.add_argument("--installed", action="store_true", help="check this venv's vLLM against its committed row")
    args = ap.parse_args(argv)
    if args.installed:
        version = dist_version("vllm")
        if version is None:
            print("vllm_attention_conformance: no vLLM installed here", file=sys.stderr)
            return 2
        text, committed = row(version, installed_source), committed_row(version, args.out)
        print(text)
        if committed != text:
            print(f"vllm_attention_conformance: vLLM {version} does not match its committed row in {args.out}:\n"
                  f"  committed: {committed}\n  installed: {text}", file=sys.stderr)
            return 1
        return 0
    rows = []
    for version in args.versions or releases():
        rows.append(row(version, folder_reader(sources(version, args.wheels, args.cache))))
        print(rows[-1], flush=True)
    doc = args.out.read_text(encoding="utf-8")
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    args.out.write_text(doc[:start] + table(rows) + doc[end:], encoding="utf-8")
    return 0 if all("NOT supported" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
