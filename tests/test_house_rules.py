"""The shape of the house (issue 39): no module over 450 lines in src/, no function over 60 lines
outside kernels/, no import circle between our modules (function-level imports count: a lazy import
still ties two modules together), and each table this refactor gave one home stays in that home."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers.facts import ROOT

PACKAGE = ROOT / "src" / "caovan_vllm_sm75_turbo3"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that `name` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            candidates = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found |= {c for c in candidates if c in known and c != name}
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the modules in order, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_is_over_450_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these by job: {long}"


def test_no_function_outside_kernels_is_over_60_lines():
    long = []
    for path in PACKAGE.rglob("*.py"):
        if "kernels" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_no_import_circle():
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    # A package's __init__ importing its own submodules is how packages export; not a circle.
    graph = {n: {m for m in deps if not (n.startswith(m + ".") and modules[m].name == "__init__.py")}
             for n, deps in graph.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_checks_can_fail():
    # The circle finder finds a planted circle, and the import reader sees a function-level import.
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    known = set(_modules())
    assert "caovan_vllm_sm75_turbo3.kernels.turbo.compile" in _imports(
        "caovan_vllm_sm75_turbo3.cli.verify", PACKAGE / "cli" / "verify.py", known)


def _literal_hits(pattern: str, allowed: set[str]) -> list[str]:
    rx = re.compile(pattern)
    return [f"{p.relative_to(PACKAGE)}:{i}" for p in PACKAGE.rglob("*.py")
            if str(p.relative_to(PACKAGE)) not in allowed
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if rx.search(line.split("#", 1)[0])]


def test_each_name_has_one_home():
    # The Triton releases the hook supports: kernels/turbo/protocol.py's rows, nowhere else as a list.
    assert not _literal_hits(r'\(\s*"3\.6",\s*"3\.7"', {"kernels/turbo/protocol.py"})
    # Our backend's name: policy/attention.py OUR_BACKEND (words in docstrings aside).
    assert not _literal_hits(r'return "CUSTOM"|= "CUSTOM"', {"policy/attention.py"})
    # The fp8 --kv-cache-dtype names and their torch dtypes.
    assert not _literal_hits(r'"fp8_e5m2":\s*torch\.', {"kernels/attention/inputs.py"})
    assert not _literal_hits(r'\{"fp8":\s*"fp8_e4m3"', {"kernels/attention/configs.py"})
    # Our log lines: built in logformat.py, never spelt by a writer or a reader.
    assert not _literal_hits(r'"Caovan SM75 Turbo3[ :]|"\[Caovan\] warmup=|"Caovan turbo:|"Caovan vLLM SM75 Turbo3 ext',
                             {"logformat.py"})
    # Version strings are taken apart in versions.py only.
    assert not _literal_hits(r'version\w*\.split\("\."\)|\.split\("\+", 1\)', {"versions.py"})
