#!/usr/bin/env python3
"""Extract `vllm serve`'s argument table from released vLLM sources, without importing vLLM.

Reads each vLLM wheel (a zip) or an installed `vllm` package directory with `ast` and writes
`src/caovan_vllm_sm75_turbo3/data/vllm_flags.json`: per release (major.minor) the option
strings `vllm serve` accepts, the choices of the enumerated ones, the attention backend names,
and the keys and enumerated values of the JSON configs our launch profiles fill
(`--compilation-config`, `--speculative-config`). The profile validator reads that file, so
CI never downloads vLLM.

    pip download --no-deps vllm==0.22.1 -d /tmp/vllm-wheels     # pip reuses files already there
    python tools/extract_vllm_flags.py /tmp/vllm-wheels/*.whl .venv/lib/python3.*/site-packages/vllm

Where the flags come from (the serve parser is `make_arg_parser` in
`vllm/entrypoints/openai/cli_args.py`):
- every `add_argument(...)` call in `engine/arg_utils.py` and `entrypoints/openai/cli_args.py`
  (string literals that start with "-"), with the choices of `**kwargs["field"]` resolved
  from that config dataclass field's `Literal[...]` annotation;
- the fields of the `*FrontendArgs` dataclasses in `cli_args.py` (their flags are generated
  as `--field-name`), plus any `["flags"]` short forms assigned there.
vLLM turns bool fields into `BooleanOptionalAction`s, so `--no-X` is accepted where `--X` is a
bool; the table lists only positive forms and the validator maps `--no-X` to `--X`.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

SCHEMA = 1
ENGINE_ARGS = "vllm/engine/arg_utils.py"
SERVE_CLI = "vllm/entrypoints/cli/serve.py"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src/caovan_vllm_sm75_turbo3/data/vllm_flags.json"


class Sources:
    """The `vllm/**.py` texts of one release, from a wheel or an installed package directory."""

    def __init__(self, location: Path) -> None:
        self.location = location
        self._texts: dict[str, str] = {}
        if location.is_dir():  # .../site-packages/vllm
            root = location.parent
            for f in location.rglob("*.py"):
                self._texts[f.relative_to(root).as_posix()] = ""
            self._read = lambda p: (root / p).read_text(encoding="utf-8")
        else:
            zf = zipfile.ZipFile(location)
            for name in zf.namelist():
                if name.startswith("vllm/") and name.endswith(".py"):
                    self._texts[name] = ""
            self._read = lambda p: zf.read(p).decode("utf-8")
        self._trees: dict[str, ast.Module] = {}

    def version(self) -> str:
        """The release version, from vllm/_version.py or the wheel's file name."""
        m = re.match(r"vllm-(\d+\.\d+\.\d+[^-]*)-", self.location.name)
        if m:
            return m.group(1)
        text = self.text("vllm/_version.py") or ""
        m = re.search(r"""__version__\s*=\s*version\s*=\s*['"]([^'"]+)""", text) or \
            re.search(r"""__version__\s*=\s*['"]([^'"]+)""", text)
        if not m:
            raise SystemExit(f"{self.location}: cannot tell the vLLM version")
        return m.group(1)

    def paths(self) -> list[str]:
        return sorted(self._texts)

    def text(self, path: str) -> str | None:
        if path not in self._texts:
            return None
        if not self._texts[path]:
            self._texts[path] = self._read(path)
        return self._texts[path]

    def tree(self, path: str) -> ast.Module | None:
        if path not in self._trees:
            text = self.text(path)
            if text is None:
                return None
            self._trees[path] = ast.parse(text)
        return self._trees[path]


def _str_list(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [s for e in node.elts for s in _str_list(e)]
    return []


class Resolver:
    """Finds classes and `Name = Literal[...]` aliases across the release's config modules."""

    def __init__(self, src: Sources) -> None:
        self.src = src
        self.classes: dict[str, ast.ClassDef] = {}
        self.aliases: dict[str, ast.AST] = {}
        scan = [p for p in src.paths() if p.startswith("vllm/config/")] + [ENGINE_ARGS, serve_args_path(src)]
        scan += [p for p in src.paths() if p.endswith("attention/backends/registry.py")]
        for path in scan:
            tree = src.tree(path)
            if tree is None:
                continue
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self.classes.setdefault(node.name, node)
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                        and isinstance(node.targets[0], ast.Name):
                    self.aliases.setdefault(node.targets[0].id, node.value)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                        and node.value is not None:  # `X: TypeAlias = Literal[...]`
                    self.aliases.setdefault(node.target.id, node.value)

    def literal(self, node: ast.AST | None, depth: int = 0, loose: bool = False) -> list[str] | None:
        """The values of a Literal annotation (through aliases and nesting): argparse's choices,
        or None when the annotation admits any string. `loose` keeps the Literal values of a
        `Literal | str` union too (what vLLM's config validators know, past argparse)."""
        if node is None or depth > 12:
            return None
        if isinstance(node, ast.Constant):
            if node.value is None:
                return []
            return [str(node.value)] if isinstance(node.value, (str, int)) else None
        if isinstance(node, ast.Name):
            if node.id == "None":
                return []
            target = self.aliases.get(node.id)
            return self.literal(target, depth + 1, loose) if target is not None else None
        # Like vLLM's get_kwargs: a union with any Literal part gets that part's values as choices.
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            parts: list[ast.AST] = []
            stack: list[ast.AST] = [node]
            while stack:  # flatten a | b | c
                n = stack.pop()
                if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr):
                    stack += [n.right, n.left]
                else:
                    parts.append(n)
            return self._union(parts, depth, loose)
        if isinstance(node, ast.Subscript):
            head = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if head == "Literal":
                out: list[str] = []
                for item in items:
                    out += self.literal(item, depth + 1, loose) or []
                return out
            if head in ("Optional", "Union"):
                return self._union(items, depth, loose)
        return None

    def _union(self, parts: list[ast.AST], depth: int, loose: bool) -> list[str] | None:
        if not loose and any(isinstance(p, ast.Name) and p.id == "str" for p in parts):
            return None  # argparse accepts any string
        found = [self.literal(p, depth + 1, loose) for p in parts]
        values = [v for vals in found if vals for v in vals]
        return values or None

    def fields(self, cls_name: str, depth: int = 0) -> dict[str, ast.AST]:
        """Annotated fields of a dataclass, base classes first (ClassVar and private skipped)."""
        cls = self.classes.get(cls_name)
        if cls is None or depth > 8:
            return {}
        out: dict[str, ast.AST] = {}
        for base in cls.bases:
            if isinstance(base, ast.Name):
                out.update(self.fields(base.id, depth + 1))
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                name = node.target.id
                if name.startswith("_") or "ClassVar" in ast.unparse(node.annotation):
                    continue
                out[name] = node.annotation
        return out

    def enum_members(self, cls_name: str) -> list[str]:
        cls = self.classes.get(cls_name)
        if cls is None:
            return []
        names = []
        for node in cls.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper():
                names.append(node.targets[0].id)
        return names


def _flat_keywords(keywords: list[ast.keyword]) -> list[ast.keyword]:
    """`add_argument(..., **{**kw["f"], "help": MSG})` -> the keywords it amounts to."""
    out: list[ast.keyword] = []
    for kw in keywords:
        if kw.arg is None and isinstance(kw.value, ast.Dict):
            for k, v in zip(kw.value.keys, kw.value.values):
                out.append(ast.keyword(arg=None if k is None else _str_list(k)[0], value=v))
        else:
            out.append(kw)
    return out


def _says_deprecated(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return "DEPRECAT" in node.id.upper()
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "deprecated" in n.value.lower()
               for n in ast.walk(node))


def _kwargs_sources(tree: ast.Module) -> dict[str, str]:
    """`model_kwargs = get_kwargs(ModelConfig)` -> {"model_kwargs": "ModelConfig"}."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "get_kwargs" \
                and node.value.args and isinstance(node.value.args[0], ast.Name):
            out[node.targets[0].id] = node.value.args[0].id
    return out


def serve_args_path(src: Sources) -> str:
    """The module that defines `make_arg_parser` for `vllm serve` (it moved in 0.29 and 0.34):
    read from cli/serve.py's `from X import make_arg_parser`."""
    tree = src.tree(SERVE_CLI)
    if tree is not None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module \
                    and any(a.name == "make_arg_parser" for a in node.names):
                path = node.module.replace(".", "/") + ".py"
                if src.text(path) is not None:
                    return path
    raise SystemExit(f"{src.location}: cannot find the module of vllm serve's make_arg_parser")


def extract(src: Sources) -> dict[str, Any]:
    """The argument table of one release."""
    res = Resolver(src)
    flags: set[str] = {"-h", "--help"}  # argparse's own
    choices: dict[str, list[str]] = {}
    values: dict[str, list[str]] = {}  # Literal values behind `Literal | str` fields
    deprecated: set[str] = set()
    cli_path = serve_args_path(src)
    for path in (ENGINE_ARGS, cli_path):
        tree = src.tree(path)
        if tree is None:
            raise SystemExit(f"{src.location}: {path} is missing; the serve parser moved, update this tool")
        kw_classes = _kwargs_sources(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                continue
            names = [s for a in node.args for s in _str_list(a) if s.startswith("-")]
            flags.update(names)
            for kw in _flat_keywords(node.keywords):
                if kw.arg == "help" and _says_deprecated(kw.value):
                    deprecated.update(n for n in names if n.startswith("--"))
                if kw.arg is None and isinstance(kw.value, ast.Subscript) \
                        and isinstance(kw.value.value, ast.Name) and kw.value.value.id in kw_classes:
                    field_name = _str_list(kw.value.slice)
                    cls = kw_classes[kw.value.value.id]
                    ann = res.fields(cls).get(field_name[0]) if field_name else None
                    for table, loose_ in ((choices, False), (values, True)):
                        vals = res.literal(ann, loose=loose_)
                        if vals:
                            for n in names:
                                if n.startswith("--"):
                                    table[n] = sorted(set(vals))
                elif kw.arg == "choices":
                    vals = _str_list(kw.value)
                    if vals:
                        for n in names:
                            if n.startswith("--"):
                                choices[n] = sorted(set(vals))
    cli_tree = src.tree(cli_path)
    assert cli_tree is not None
    for node in cli_tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("FrontendArgs"):
            for name, ann in res.fields(node.name).items():
                flag = "--" + name.replace("_", "-")
                flags.add(flag)
                for table, loose_ in ((choices, False), (values, True)):
                    vals = res.literal(ann, loose=loose_)
                    if vals:
                        table[flag] = sorted(set(vals))
    for node in ast.walk(cli_tree):  # frontend_kwargs["x"]["flags"] = ["-x"]
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript) \
                and _str_list(node.targets[0].slice) == ["flags"]:
            flags.update(s for s in _str_list(node.value) if s.startswith("-"))
    flags = {f for f in flags if not f.startswith("--no-")}
    compilation = res.fields("CompilationConfig")
    speculative = res.fields("SpeculativeConfig")
    return {
        "version": src.version(),
        "serve_args_module": cli_path,
        "flags": sorted(flags),
        "choices": dict(sorted(choices.items())),
        "known_values": {k: v for k, v in sorted(values.items()) if choices.get(k) != v},
        "deprecated": sorted(deprecated),
        "attention_backends": res.enum_members("AttentionBackendEnum"),
        "compilation_config_keys": sorted(compilation),
        "cudagraph_modes": res.enum_members("CUDAGraphMode"),
        "speculative_config_keys": sorted(speculative),
        "speculative_methods": sorted(set(res.literal(speculative.get("method"), loose=True) or [])),
    }


def minor_of(version: str) -> str:
    major, minor = version.split(".")[:2]
    return f"{major}.{minor}"


def _release_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sources", nargs="+", type=Path, help="vLLM wheels or installed vllm package directories")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"table to update (default {DEFAULT_OUT})")
    args = p.parse_args(argv)
    table: dict[str, Any] = {"schema": SCHEMA, "releases": {}}
    if args.out.exists():
        table = json.loads(args.out.read_text(encoding="utf-8"))
    for location in args.sources:
        entry = extract(Sources(location))
        entry["source"] = location.name if location.is_file() else f"installed vllm {entry['version']}"
        mm = minor_of(entry["version"])
        old = table["releases"].get(mm)
        if old and _release_key(old["version"]) > _release_key(entry["version"]):
            continue  # keep the newest patch release of each minor
        table["releases"][mm] = entry
        print(f"{mm}: {entry['version']}: {len(entry['flags'])} flags, {len(entry['choices'])} with choices",
              file=sys.stderr)
    table["releases"] = dict(sorted(table["releases"].items(), key=lambda kv: tuple(map(int, kv[0].split(".")))))
    table["generated_by"] = "tools/extract_vllm_flags.py"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
