"""Check every vLLM release from 0.21.0 on against our GDN interface families, from source.

For each release: find its wheel in the wheel folder (shared with the profiles tool) or
`pip download --no-deps` it there, copy the few source files the check reads into a small cache,
delete the wheel again if this tool downloaded it, then run `plugin.dispatch.interface`'s
`check_sources` (Python `ast`, nothing is imported) for each family. The table goes to
docs/vllm-compat.md. `--installed` checks the vLLM in this environment instead and fails when it
no longer matches its committed row (CI runs that).

    .venv/bin/python tools/vllm_conformance.py                 # all releases, rewrite the doc
    .venv/bin/python tools/vllm_conformance.py --installed     # live check of this venv's vLLM
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.version import Version

from caovan_vllm_sm75_turbo3.plugin.dispatch.controller import FAMILIES
from caovan_vllm_sm75_turbo3.plugin.installed_vllm import installed_source
from caovan_vllm_sm75_turbo3.plugin.dispatch.interface import Conformance, check_sources, module_file
from caovan_vllm_sm75_turbo3.runtime.probe import dist_version

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "vllm-compat.md"
WHEELS = Path("/tmp/vllm-wheels")
FIRST, LAST_MINOR = Version("0.21.0"), (0, 34)
ROW = re.compile(r"^\| `(?P<version>[^`]+)` \| (?P<interface>[^|]+) \|")


@dataclass(frozen=True)
class Row:
    """One release's result: the family that matches (None: not supported) and every check."""

    version: str
    interface: str | None
    results: tuple[Conformance, ...]

    def cells(self) -> list[str]:
        ok = next((r for r in self.results if r.ok), None)
        present = [r for r in self.results if r.present]
        module = module_file(next(f.module for f in FAMILIES if f.name == ok.interface)) if ok else "-"
        fla = f"`{ok.fla_package}`" if ok and ok.fla_package else "-"
        extras = ", ".join(f"`{x}`" for x in ok.extra_kwargs) if ok and ok.extra_kwargs else "-"
        if ok:
            result = "supported"
        elif present:
            result = "NOT supported: " + "; ".join(p for r in present for p in r.problems)
        else:
            result = "NOT supported: no known GDN module"
        return [f"`{self.version}`", self.interface or "none", f"`{module}`" if ok else "-", fla, extras, result]


def releases() -> list[str]:
    """vLLM releases from 0.21.0 through 0.34.x on the package index (`pip index versions`)."""
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "vllm"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("Available versions:"))
    found = [Version(v.strip()) for v in line.split(":", 1)[1].split(",")]
    keep = [v for v in found if not v.is_prerelease and FIRST <= v and (v.major, v.minor) <= LAST_MINOR]
    return [str(v) for v in sorted(keep)]


def needed_files() -> set[str]:
    return {p for f in FAMILIES for p in f.source_files()}


def _wheel(version: str, wheels: Path) -> Path | None:
    # 0.23.0 was re-uploaded with a build tag ("vllm-0.23.0-2-cp38-...")
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    return found[0] if found else None


def cached_sources(version: str, wheels: Path, cache: Path, files: set[str] | None = None) -> Path:
    """The folder holding this release's `files` (default: the GDN check's), extracted once."""
    folder = cache / version
    if (folder / ".complete").is_file():
        return folder
    wheel = _wheel(version, wheels)
    ours = wheel is None
    if ours:
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", f"vllm=={version}",
                        "-d", str(wheels)], check=True, timeout=1800)
        wheel = _wheel(version, wheels)
        if wheel is None:
            raise RuntimeError(f"pip download of vllm=={version} left no wheel in {wheels}")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for path in needed_files() if files is None else files:
            if path in names:
                target = folder / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(path))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".complete").write_text(wheel.name + "\n")
    if ours:
        wheel.unlink()  # about 300 MB each; the few source files are all we keep
    return folder


def check_tree(version: str, read) -> Row:
    results = tuple(check_sources(f, read) for f in FAMILIES)
    ok = [r.interface for r in results if r.ok]
    return Row(version, ok[0] if len(ok) == 1 else None, results)


def folder_reader(folder: Path):
    def read(path: str) -> str | None:
        p = folder / path
        return p.read_text(encoding="utf-8") if p.is_file() else None
    return read


def render(rows: list[Row], command: str) -> str:
    head = ["vLLM", "interface", "GDN module", "FLA ops", "extra op keywords", "result"]
    lines = [
        "# vLLM compatibility of the GDN dispatch",
        "",
        "Generated by `tools/vllm_conformance.py` (do not edit by hand). For every vLLM release it",
        "reads the GDN layer module, the `CustomOp` base, FLA's `chunk_gated_delta_rule` and the",
        "Qwen3.5 model file from the release's wheel with Python's `ast` and checks what our",
        "replacement relies on: `ChunkGatedDeltaRule` registered as CustomOp `chunk_gated_delta_rule`,",
        "an `__init__` without required arguments that selects `forward_native`, `forward_native`",
        "and FLA's kernel taking vLLM's keyword arguments, the layer building",
        "`self.chunk_gated_delta_rule = ChunkGatedDeltaRule()` and calling it with keywords only,",
        "`CustomOp.register_oot` / `op_registry_oot`, and the model importing that layer.",
        "A release marked NOT supported runs on vLLM's own GDN prefill with one log line.",
        "",
        f"Last run: {datetime.date.today().isoformat()}, `{command}`.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    lines += ["", "Interface families: " + ", ".join(f"`{f.name}` (`{module_file(f.module)}`, "
                                                   f"layer `{f.layer_class}`)" for f in FAMILIES) + ".", ""]
    return "\n".join(lines)


def committed_row(version: str, doc: Path = DOC) -> str | None:
    """The doc's row for `version`, as text, or None."""
    for line in doc.read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m and m.group("version") == version:
            return line
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", type=Path, default=WHEELS, help="wheel folder (default %(default)s)")
    ap.add_argument("--cache", type=Path, default=WHEELS / "gdn-src", help="extracted sources (default %(default)s)")
    ap.add_argument("--out", type=Path, default=DOC, help="markdown table to write (default %(default)s)")
    ap.add_argument("--versions", nargs="*", help="only these releases (default: 0.21.0 to 0.34.x from the index)")
    ap.add_argument("--installed", action="store_true",
                    help="check this environment's vLLM and compare with its row in --out; exit 1 on a mismatch")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)

    if args.installed:
        version = dist_version("vllm")
        if version is None:
            print("vllm_conformance: no vLLM installed in this environment", file=sys.stderr)
            return 2
        row = check_tree(version, installed_source)
        text = "| " + " | ".join(row.cells()) + " |"
        if args.json:
            print(json.dumps({"version": version, "interface": row.interface,
                              "results": [asdict(r) for r in row.results]}, indent=2))
        else:
            print(text)
        committed = committed_row(version, args.out)
        if row.interface is None or committed != text:
            print(f"vllm_conformance: vLLM {version} does not match its committed row in {args.out}:\n"
                  f"  committed: {committed}\n  installed: {text}", file=sys.stderr)
            return 1
        return 0

    versions = args.versions or releases()
    rows = []
    for version in versions:
        folder = cached_sources(version, args.wheels, args.cache)
        rows.append(check_tree(version, folder_reader(folder)))
        print("| " + " | ".join(rows[-1].cells()) + " |", flush=True)
    command = "python tools/vllm_conformance.py" + (" --versions " + " ".join(args.versions) if args.versions else "")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(rows, command), encoding="utf-8")
    if args.json:
        print(json.dumps([{"version": r.version, "interface": r.interface,
                           "results": [asdict(c) for c in r.results]} for r in rows], indent=2))
    return 0 if all(r.interface for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
