"""vLLM's FLA GDN forward kernels in every supported release: digests, variants, standalone copies, sm_75 checks.

`extract` reads the FLA ops files of each release in data/vllm_release_pins.json from its wheel
(through vllm_conformance.cached_sources), finds the five GDN forward kernels, digests each one as
the turbo hook does (`source_digest` of Triton's `JITFunction.src`), groups releases into variants,
diffs each variant against 0.21.0 and writes one standalone module per variant (the kernel as vLLM
ships it, its helpers and constants, no autotune/heuristics, importing only triton) to
tests/data/fla_variants/, plus the data file there and the table in docs/fla-releases.md.
`check` compiles the variants that ship with this environment's Triton for sm_75, plain and
through the turbo hook, with the code behind `caovan-sm75-kernels check`; `--record` stores the
rows in the data file (and the table) for this Triton.

    .venv/bin/python tools/fla_releases.py extract --wheels /tmp/vw/whl
    .venv-triton37/bin/python tools/fla_releases.py check --record      # likewise .venv (3.6), .venv-triton38
"""

from __future__ import annotations

import argparse
import ast
import builtins
import difflib
import importlib.util
import inspect
import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "src" / "caovan_vllm_sm75_turbo3" / "data" / "vllm_release_pins.json"
VARIANTS = ROOT / "tests" / "data" / "fla_variants"
DATA = VARIANTS / "fla_release_kernels.json"
DOC = ROOT / "docs" / "fla-releases.md"
BEGIN, END = "<!-- fla-releases:start -->", "<!-- fla-releases:end -->"
PACKAGES = ("vllm/model_executor/layers/fla/ops", "vllm/third_party/flash_linear_attention/ops")
# kernel -> the ops file that defines it, in the order of vLLM's chunk_gated_delta_rule_fwd
KERNELS = {
    "chunk_scaled_dot_kkt_fwd_kernel": "chunk_scaled_dot_kkt",
    "merge_16x16_to_64x64_inverse_kernel": "solve_tril",
    "recompute_w_u_fwd_kernel": "wy_fast",
    "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": "chunk_delta_h",
    "chunk_fwd_kernel_o": "chunk_o",
}
SHORT = {"chunk_scaled_dot_kkt_fwd_kernel": "kkt", "merge_16x16_to_64x64_inverse_kernel": "merge",
         "recompute_w_u_fwd_kernel": "w_u", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": "h",
         "chunk_fwd_kernel_o": "o"}
HELPER_FILES = ("op", "utils")
# What op.py binds these helpers to on NVIDIA with FLA's defaults (FLA_USE_FAST_OPS unset, Triton >= 3.4);
# the tool checks that each release's op.py still has the assignment before copying it.
OP_ALIASES = {"exp": "tl.exp", "exp2": "tl.exp2", "log": "tl.log", "log2": "tl.log2",
              "make_tensor_descriptor": "triton.language.make_tensor_descriptor"}
# The constexprs vLLM's GDN path passes that 0.21.0 did not have (chunk_delta_h's use_exp2 defaults
# to False and chunk.py does not pass it; _CAST_DOT_TO_K_DTYPE is True only on ROCm gfx1x).
NEW_CONSTEXPRS = {"USE_EXP2": False, "CAST_DOT_TO_K_DTYPE": False}
# Module-level facts the autotune lists read, as a 2080 Ti (64 KiB shared, CUDA) gives them.
TURING = {"check_shared_mem": lambda *a, **k: False, "is_nvidia_hopper": False, "is_amd": False,
          "torch": SimpleNamespace(version=SimpleNamespace(hip=None))}
# How the check compiles the two kernels the allowlist does not list (the other three use their
# allowlist entry's check): vLLM's dtypes at Qwen3.5/3.6 TP2 shapes (A is fp32 between the two); their
# fp32 dots are built as split-fp16 products (the allowlist's fp32_dots "f16x3").
CHECK = {
    "chunk_scaled_dot_kkt_fwd_kernel": {
        "signature": {"k": "*fp16", "beta": "*fp32", "g": "*fp32", "A": "*fp32", "cu_seqlens": "*i32",
                      "chunk_indices": "*i32", "T": "i32"},
        "constexprs": {"H": 24, "Hg": 8, "K": 128, "BT": 64, "IS_VARLEN": True, "USE_G": True}, "fp32_dots": "f16x3"},
    "merge_16x16_to_64x64_inverse_kernel": {
        "signature": {"A": "*fp32", "Ai": "*fp16", "cu_seqlens": "*i32", "chunk_indices": "*i32", "T": "i32"},
        "constexprs": {"H": 24, "BT": 64, "USE_TMA": False, "IS_VARLEN": True, "DOT_PRECISION": "ieee"},
        "fp32_dots": "f16x3"},
}
# One line per variant, written after reading its diff against 0.21.0 (keyed by digest): the tool
# refuses a new variant without one, so nobody records a change unread.
CHANGES = {
    "81109394c5d276c5": "adds constexpr USE_EXP2 (exp2 instead of exp for the gates; vLLM's GDN path passes "
                        "False, only KDA passes True); nothing else changed",
    "d262a5eb6442edc5": "0.22's USE_EXP2, and every block pointer replaced by masked pointer arithmetic with "
                        "int64 time offsets; same [V, K] state layout, same math",
    "1ff451a4f2663cc0": "as 0.32, and the per-sequence base offsets (h, v, k, w, v_new, h0, ht) cast to int64 "
                        "before multiplying (no int32 overflow on long batches); same layout and math",
    "cca3c013c27b5a67": "block pointers replaced by masked pointer arithmetic; chunk and batch-head program "
                        "ids and the chunk index int64; same layouts and math",
    "db1f29621a3be97d": "block pointers replaced by masked pointer arithmetic; program ids and the chunk "
                        "index int64; same layouts and math",
    "f89c5a6d56aafcf4": "adds constexpr CAST_DOT_TO_K_DTYPE (ROCm RDNA only: casts k*beta to k's dtype "
                        "before the dot; False on CUDA, so the fp32 x fp32 dot stays); nothing else changed",
    "1ed93a32fab5431a": "0.26's CAST_DOT_TO_K_DTYPE, and block pointers replaced by masked pointer "
                        "arithmetic with int64 program ids; same layout and math",
    "50dcd305d075f580": "non-TMA path: block pointers replaced by masked pointer arithmetic with int64 row "
                        "offsets; same layout and math (fp32 dots, DOT_PRECISION unchanged)",
    "de4deff09408fafd": "as 0.32, and int64 base offsets and row indices in the 16x16 forward-substitution "
                        "loads; same layout and math",
}


@dataclass(frozen=True)
class Found:
    """One kernel as one release ships it."""

    kernel: str
    module: str          # e.g. vllm.third_party.flash_linear_attention.ops.chunk_o
    src: str             # Triton's JITFunction.src (from `def` on, dedented)
    digest: str
    standalone: str      # the module text tests/data/fla_variants/ holds for this variant
    configs: list[dict[str, Any]]


def triton_src(lines: list[str], node: ast.FunctionDef) -> tuple[str, int]:
    """JITFunction.src of a decorated function, as Triton computes it from inspect.getsourcelines,
    and the 0-based index of the line one past its block."""
    first = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
    block = inspect.getblock(lines[first:])
    src = textwrap.dedent("".join(block))
    return src[re.search(r"^def\s+\w+\s*\(", src, re.MULTILINE).start():], first + len(block)


def digest_of_file(path: Path, kernel: str) -> str:
    """The hook's digest of `kernel` as defined in this file (nothing imported)."""
    from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import source_digest

    text = path.read_text(encoding="utf-8")
    return source_digest(triton_src(text.splitlines(True), _function(ast.parse(text), kernel))[0])


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(found) != 1:
        raise LookupError(f"{name}: {len(found)} top-level definitions")
    return found[0]


def _is_jit(dec: ast.expr) -> bool:
    return ast.unparse(dec.func if isinstance(dec, ast.Call) else dec) == "triton.jit"


def _globals_used(node: ast.FunctionDef) -> list[str]:
    """Names the function reads that it neither takes nor assigns, nor Python provides."""
    inside = [n for part in [*node.body, node.args] for n in ast.walk(part)]   # not the decorators
    local = {a.arg for a in node.args.args} | {n.id for n in inside
                                               if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    used = {n.id for n in inside if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted(used - local - set(dir(builtins)) - {"tl", "triton"})


def _op_alias(name: str, op_text: str) -> str:
    value = OP_ALIASES.get(name)
    assigns = {ast.unparse(n.value) for n in ast.walk(ast.parse(op_text))
               if isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == [name]}
    if value is None or value not in assigns:
        raise LookupError(f"op.py binds {name} to {sorted(assigns)}, not the known {value}: extend OP_ALIASES")
    return f"{name} = {value}\n"


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def _helpers(text: str, node: ast.FunctionDef, ops: dict[str, str], seen: set[str]) -> list[str]:
    """The statements the standalone module needs for the globals `node` reads (recursively for
    @triton.jit helpers in the same file): op.py aliases, jit helpers, literal constants."""
    tree, lines, out = ast.parse(text), text.splitlines(True), []
    imported = {a.asname or a.name: n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1
                for a in n.names}
    for name in _globals_used(node):
        if name in seen:
            continue
        seen.add(name)
        if imported.get(name) == "op":
            out.append(_op_alias(name, ops["op"]))
            continue
        fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if fn is not None and len(fn.decorator_list) == 1 and _is_jit(fn.decorator_list[0]):
            out += _helpers(text, fn, ops, seen)
            start = fn.decorator_list[0].lineno - 1
            out.append("\n\n" + "".join(inspect.getblock(lines[start:])))
            continue
        assign = next((n for n in tree.body if isinstance(n, ast.Assign)
                       and [ast.unparse(t) for t in n.targets] == [name]), None)
        if assign is not None and _is_literal(assign.value):   # a computed one may depend on the machine
            out.append(ast.get_source_segment(text, assign) + "\n")
            continue
        raise LookupError(f"{node.name} reads global {name}, which the extractor cannot copy")
    return out


def standalone_module(text: str, kernel: str, ops: dict[str, str], origin: str) -> str:
    """The kernel's own text from its @triton.jit line on, after the helpers and constants it reads."""
    node = _function(ast.parse(text), kernel)
    jit = [d for d in node.decorator_list if _is_jit(d)]
    if len(jit) != 1 or not _is_jit(node.decorator_list[-1]):
        raise LookupError(f"{kernel}: expected @triton.jit as its innermost decorator")
    lines = text.splitlines(True)
    _, end = triton_src(lines, node)
    body = "".join(lines[jit[0].lineno - 1:end])
    head = [f"# {kernel} as {origin} ships it:\n",
            "# vLLM's copy of flash-linear-attention (MIT, Copyright (c) 2023-2025 Songlin Yang, Yu Zhang;\n",
            "# vLLM's changes Apache-2.0). Generated by\n",
            "# tools/fla_releases.py: its @triton.autotune/@triton.heuristics decorators dropped, the helpers\n",
            "# and constants it reads copied above it. Do not edit: the tests check its digest.\n",
            "import triton\nimport triton.language as tl\n"]
    helpers = _helpers(text, node, ops, set())
    return "".join(head) + ("\n" + "".join(helpers) if helpers else "") + "\n\n" + body


def turing_configs(text: str, kernel: str, stages: bool = False) -> list[dict[str, Any]]:
    """The kernel's autotune list as a 2080 Ti evaluates it, reduced to distinct (tile constexprs,
    num_warps): the turbo build always uses one stage, so num_stages does not make another build.
    With `stages`, each config keeps its num_stages: every build stock Triton's autotuner makes."""
    tree = ast.parse(text)
    node = _function(tree, kernel)
    tune = next(d for d in node.decorator_list if isinstance(d, ast.Call)
                and ast.unparse(d.func) == "triton.autotune")
    configs = next(k.value for k in tune.keywords if k.arg == "configs")
    space: dict[str, Any] = dict(TURING)
    space["triton"] = SimpleNamespace(Config=lambda kw, num_warps=4, num_stages=2: {
        **kw, "num_warps": num_warps, **({"num_stages": num_stages} if stages else {})})
    for n in tree.body:   # module constants the list may read (BKV_LIST, NUM_WARPS, ...), Turing's values
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            try:
                space[n.targets[0].id] = eval(compile(ast.Expression(n.value), "<fla>", "eval"), space)
            except Exception:
                continue   # not something an autotune list reads (the list's own eval says so if it is)
    out: list[dict[str, Any]] = []
    for cfg in eval(compile(ast.Expression(configs), "<fla>", "eval"), space):
        if cfg not in out:
            out.append(cfg)
    return out


def release_pins() -> dict[str, str]:
    """Supported release -> the Triton pin its torch carries (data/vllm_release_pins.json)."""
    return {v: r["triton"] for v, r in json.loads(PINS.read_text(encoding="utf-8"))["releases"].items()}


def pin_matches(pin: str, version: str) -> bool:
    """'3.7.1' or '~=3.8.0' (a release's pin) against an installed Triton version."""
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(pin if pin[0] in "<>=!~" else f"=={pin}")
    return spec.contains(version.split("+", 1)[0], prereleases=True)


def read_release(version: str, wheels: Path, cache: Path) -> dict[str, Found]:
    """The five kernels as this release's wheel ships them."""
    from vllm_conformance import cached_sources

    files = {f"{p}/{stem}.py" for p in PACKAGES for stem in [*KERNELS.values(), *HELPER_FILES]}
    folder = cached_sources(version, wheels, cache, files)
    package = next((p for p in PACKAGES if (folder / p / "chunk_o.py").is_file()), None)
    if package is None:
        raise LookupError(f"vLLM {version}: no FLA ops package ({' or '.join(PACKAGES)}) in its wheel")
    ops = {stem: (folder / package / f"{stem}.py").read_text(encoding="utf-8") for stem in HELPER_FILES}
    out = {}
    for kernel, stem in KERNELS.items():
        text = (folder / package / f"{stem}.py").read_text(encoding="utf-8")
        src, _ = triton_src(text.splitlines(True), _function(ast.parse(text), kernel))
        from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import source_digest

        out[kernel] = Found(kernel, f"{package.replace('/', '.')}.{stem}", src, source_digest(src),
                            standalone_module(text, kernel, ops, f"vLLM {version} ({package}/{stem}.py)"),
                            turing_configs(text, kernel))
    return out


def _constexprs(src: str) -> list[str]:
    node = _function(ast.parse(src), re.match(r"def\s+(\w+)", src).group(1))
    return [a.arg for a in node.args.args if a.annotation is not None and ast.unparse(a.annotation) == "tl.constexpr"]


def change_summary(base: str, src: str, digest: str) -> str:
    """One line: the constexprs added or removed against 0.21.0, lines changed, and the read summary."""
    if src == base:
        return "the 0.21.0 text"
    if digest not in CHANGES:
        raise LookupError(f"new variant {digest}: read its diff against 0.21.0 and add a line to CHANGES")
    old, new = _constexprs(base), _constexprs(src)
    added = [c for c in new if c not in old]
    removed = [c for c in old if c not in new]
    changed = sum(1 for ln in difflib.unified_diff(base.splitlines(), src.splitlines(), lineterm="", n=0)
                  if ln[:1] in "+-" and not ln.startswith(("+++", "---")))
    parts = [f"+constexpr {c}" for c in added] + [f"-constexpr {c}" for c in removed]
    return "; ".join([*parts, f"{changed} lines changed vs 0.21.0", CHANGES[digest]])


def build_data(found: dict[str, dict[str, Found]], pins: dict[str, str], old: dict[str, Any]) -> dict[str, Any]:
    """The data file: per release its pin, modules and digests; per variant its releases, file, constexprs,
    Turing configs, change line and (kept from `old` for the same digest) recorded checks."""
    kept = {v["digest"]: v.get("checks", {}) for v in old.get("variants", [])}
    releases, variants = {}, []
    for version, kernels in found.items():
        releases[version] = {"triton": pins[version], "modules": {k: f.module for k, f in kernels.items()},
                             "digests": {k: f.digest for k, f in kernels.items()}}
    first_release = next(iter(found))
    for kernel in KERNELS:
        base = found[first_release][kernel].src
        seen: dict[str, dict[str, Any]] = {}
        for version, kernels in found.items():
            f = kernels[kernel]
            v = seen.get(f.digest)
            if v is None:
                v = seen[f.digest] = {
                    "kernel": kernel, "digest": f.digest, "first": version, "last": version, "releases": [],
                    "tritons": [], "file": f"{SHORT[kernel]}_{version.replace('.', '_')}.py",
                    "constexprs": {c: NEW_CONSTEXPRS[c] for c in _constexprs(f.src) if c not in _constexprs(base)},
                    "configs": f.configs, "change": change_summary(base, f.src, f.digest),
                    "checks": kept.get(f.digest, {})}
                variants.append(v)
            v["last"] = version
            v["releases"].append(version)
            if pins[version] not in v["tritons"]:
                v["tritons"].append(pins[version])
    return {"about": "vLLM's FLA GDN forward kernels per supported release (digest = the turbo hook's "
                     "source_digest of Triton's JITFunction.src), their variants and sm_75 compile checks; "
                     "generated by tools/fla_releases.py, do not edit.",
            "releases": releases, "variants": variants, "checked_with": old.get("checked_with", {})}


def write_extracted(found: dict[str, dict[str, Found]], data: dict[str, Any]) -> None:
    """The standalone modules, the data file and the doc table."""
    VARIANTS.mkdir(parents=True, exist_ok=True)
    for v in data["variants"]:
        (VARIANTS / v["file"]).write_text(found[v["first"]][v["kernel"]].standalone, encoding="utf-8")
    save(data)


def save(data: dict[str, Any]) -> None:
    """Write the data file and refresh docs/fla-releases.md's table from it."""
    DATA.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    doc = DOC.read_text(encoding="utf-8")
    head, rest = doc.split(BEGIN + "\n", 1)
    DOC.write_text(head + BEGIN + "\n" + render(data) + "\n" + END + rest.split(END, 1)[1], encoding="utf-8")


def load() -> dict[str, Any]:
    """The committed data file."""
    return json.loads(DATA.read_text(encoding="utf-8"))


def _verdict(v: dict[str, Any], pin: str) -> str:
    rows = next((r for t, r in v.get("checks", {}).items() if pin_matches(pin, t)), None)
    if rows is None:
        return "not checked"
    turbo = [r for r in rows if r["build"] == "turbo"]
    return f"{sum(r['ok'] for r in turbo)}/{len(turbo)} pass"


def render(data: dict[str, Any]) -> str:
    """docs/fla-releases.md's generated part: per release, and per variant."""
    by_digest = {(v["kernel"], v["digest"]): v for v in data["variants"]}
    head = ["vLLM", "Triton", "FLA ops", *(f"`{SHORT[k]}`" for k in KERNELS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for version, rel in data["releases"].items():
        cells = [version, rel["triton"], "`" + next(iter(rel["modules"].values())).rsplit(".", 1)[0] + "`"]
        for kernel in KERNELS:
            v = by_digest[(kernel, rel["digests"][kernel])]
            cells.append(f"`{v['digest'][:8]}` ({v['first']}): {_verdict(v, rel['triton'])}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| kernel | releases | Triton pins | digest | standalone copy | what changed against 0.21.0 |",
              "|---|---|---|---|---|---|"]
    for v in data["variants"]:
        span = v["first"] if v["first"] == v["last"] else f"{v['first']}-{v['last']}"
        lines.append(f"| `{v['kernel']}` | {span} | {', '.join(v['tritons'])} | `{v['digest']}` | "
                     f"`{v['file']}` | {v['change']} |")
    return "\n".join(lines)


def load_variant(v: dict[str, Any]) -> Any:
    """The variant's kernel (a JITFunction) imported from its standalone copy; ValueError when its
    `src` is not the text the release runs (digest mismatch)."""
    from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import source_digest

    name = "caovan_fla_variant_" + v["file"].removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, VARIANTS / v["file"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # Triton resolves the kernel's globals through its module
    spec.loader.exec_module(module)
    fn = getattr(module, v["kernel"])
    if source_digest(fn.src) != v["digest"]:
        raise ValueError(f"{v['file']}: {v['kernel']} digests {source_digest(fn.src)}, the release's is {v['digest']}")
    return fn


def check_spec(v: dict[str, Any], fn: Any) -> dict[str, Any]:
    """Signature, constexprs and fp32_dots for the check: the allowlist entry's (or CHECK's), plus the variant's new
    constexprs at the values vLLM's GDN path passes; parameters in the kernel's order."""
    from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import load_allowlist

    entry = next((e for e in load_allowlist().kernels if e.name == v["kernel"] and "signature" in e.check), None)
    base = {**entry.check, "fp32_dots": entry.fp32_dots} if entry is not None else CHECK[v["kernel"]]
    sig = {p.name: base["signature"].get(p.name, "constexpr") for p in fn.params}
    loose = [p.name for p in fn.params if not p.is_constexpr and p.name not in base["signature"]]
    if loose:
        raise LookupError(f"{v['kernel']}: no check type for {', '.join(loose)}")
    return {"signature": sig, "constexprs": {**base["constexprs"], **v["constexprs"]},
            "fp32_dots": base.get("fp32_dots", "")}


def check_variant(v: dict[str, Any], configs: list[dict[str, Any]] | None = None) -> list[Any]:
    """Compile the variant's configs (default: its Turing autotune list) plain and turbo for sm_75 with
    `caovan-sm75-kernels check`'s code; its CheckRows."""
    import triton
    from caovan_vllm_sm75_turbo3.cli.turbo_sources import ResolvedKernel, check_kernel
    from caovan_vllm_sm75_turbo3.kernels.turbo.allowlist import KernelEntry

    fn = load_variant(v)
    spec = check_spec(v, fn)
    entry = KernelEntry(name=v["kernel"], modules=(fn.__module__,), source_sha256=(v["digest"],),
                        triton_versions=(triton.__version__,), configs=tuple(configs or v["configs"]),
                        check=spec, numeric="", fp32_dots=spec["fp32_dots"])
    return check_kernel(ResolvedKernel(entry, fn, fn.__module__, v["digest"]))


def shipped_here(data: dict[str, Any], version: str) -> list[dict[str, Any]]:
    """The variants some supported release ships with a Triton pin this version satisfies."""
    return [v for v in data["variants"] if any(pin_matches(p, version) for p in v["tritons"])]


def row_dict(r: Any) -> dict[str, Any]:
    """A CheckRow as the data file records it."""
    return {k: getattr(r, k) for k in ("config", "build", "shared_bytes", "registers", "spill_bytes", "mma_count",
                                       "fma_count", "ok", "problems")}


def run_check(kernels: list[str] | None, record: bool, code: str) -> int:
    """`check`: print one line per build; with `record`, store the rows under this Triton's version and
    `code` (which commit of this project compiled them) in `checked_with`."""
    import triton

    data = load()
    todo = [v for v in shipped_here(data, triton.__version__) if not kernels or v["kernel"] in kernels]
    bad = 0
    for v in todo:
        rows = [row_dict(r) for r in check_variant(v)]
        for r in rows:
            cfg = " ".join(f"{k}={x}" for k, x in r["config"].items())
            print(f"{SHORT[v['kernel']]:<6} {v['first']:<7} {cfg:<28} {r['build']:<6} {r['shared_bytes']!s:>6} "
                  f"{r['spill_bytes']!s:>6} {r['mma_count']!s:>5} {r['fma_count']!s:>6}  "
                  f"{'PASS' if r['ok'] else 'FAIL: ' + '; '.join(r['problems'])}", flush=True)
        bad += sum(not r["ok"] for r in rows)
        if record:
            v["checks"][triton.__version__] = rows
    if record:
        data.setdefault("checked_with", {})[triton.__version__] = code
        save(data)
    print(f"Triton {triton.__version__}: {len(todo)} variants, {bad} failing builds")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="read every supported release's wheel; write the variants, data and table")
    ex.add_argument("--wheels", type=Path, required=True, help="folder holding the vllm-*.whl files")
    ex.add_argument("--cache", type=Path, default=Path("/tmp/vllm-wheels/fla-src"),
                    help="extracted sources (default %(default)s)")
    ck = sub.add_parser("check", help="compile the variants shipped with this Triton for sm_75, plain and turbo")
    ck.add_argument("--kernel", action="append", choices=list(KERNELS), help="only this kernel (repeatable)")
    ck.add_argument("--record", action="store_true", help="store the rows in the data file and the table")
    ck.add_argument("--code", default="working tree",
                    help="which commit of this project the check imports (recorded with --record)")
    args = ap.parse_args(argv)
    if args.command == "check":
        return run_check(args.kernel, args.record, args.code)
    pins = release_pins()
    found = {version: read_release(version, args.wheels, args.cache) for version in pins}
    old = load() if DATA.is_file() else {}
    write_extracted(found, build_data(found, pins, old))
    for v in load()["variants"]:
        print(f"{v['kernel']:<48} {v['first']:>7}-{v['last']:<7} {v['digest']}  {v['change']}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))   # vllm_conformance, when run from elsewhere
    sys.exit(main())
