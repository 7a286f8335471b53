"""What a vLLM GDN interface family is, and the source check that says whether a release has it.

A family is data (`GdnInterface`): the module that defines the GDN layer, the layer class, the
prefill op class (`ChunkGatedDeltaRule`, CustomOp "chunk_gated_delta_rule") and where vLLM's
own FLA kernel lives. `check_sources` reads the release's Python source with `ast` (never
imports it) and lists everything our replacement relies on that is missing or different. The
same check runs on the installed vLLM at start-up and on every release's wheel in
`tools/vllm_conformance.py`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

# The keyword arguments vLLM's layer passes to the prefill op and our kernel accepts.
OP_PARAMS = ("q", "k", "v", "g", "beta", "initial_state", "output_final_state", "cu_seqlens",
             "chunk_indices", "chunk_offsets", "use_qk_l2norm_in_kernel", "core_attn_out")
# FLA's `chunk_gated_delta_rule` (vLLM's own kernel, the fallback and verify's peer).
KERNEL_PARAMS = ("q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state",
                 "cu_seqlens", "chunk_indices", "chunk_offsets", "use_qk_l2norm_in_kernel",
                 "core_attn_out")
# Extra keywords some releases pass to the op for other platforms (ROCm metadata from 0.32);
# our forward hands a call that sets one of them to vLLM's own method.
PASSTHROUGH_KWARGS = ("aiter_prefill_metadata",)

CUSTOM_OP_MODULE = "vllm.model_executor.custom_op"
ATTRIBUTE = "chunk_gated_delta_rule"  # the layer attribute holding the op instance


def module_file(module: str) -> str:
    """`vllm/a/b.py` for `vllm.a.b`."""
    return module.replace(".", "/") + ".py"


def package_file(package: str, name: str) -> str:
    """`vllm/a/b/name.py` for package `vllm.a.b`."""
    return package.replace(".", "/") + f"/{name}.py"


@dataclass(frozen=True)
class GdnInterface:
    """One vLLM GDN interface family, named as it appears in the log."""

    name: str
    module: str           # defines the layer class and the prefill op class
    layer_class: str
    fla_packages: tuple[str, ...]  # where `chunk_gated_delta_rule` is imported from, any one
    model_module: str = "vllm.model_executor.models.qwen3_5"  # Qwen3.5/3.6 must use layer_class
    op_class: str = "ChunkGatedDeltaRule"
    op_name: str = "chunk_gated_delta_rule"

    def source_files(self) -> tuple[str, ...]:
        """Every source file the check reads, relative to site-packages."""
        files = [module_file(self.module), module_file(self.model_module), module_file(CUSTOM_OP_MODULE)]
        files += [package_file(p, "chunk") for p in self.fla_packages]
        return tuple(files)


@dataclass(frozen=True)
class Conformance:
    """The result of checking one family against one vLLM source tree."""

    interface: str
    present: bool                       # the family's module exists at all
    problems: tuple[str, ...] = ()
    fla_package: str | None = None      # where this release's FLA kernel lives
    extra_kwargs: tuple[str, ...] = ()  # keywords beyond OP_PARAMS the layer passes to the op
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.present and not self.problems


def _parse(read: Callable[[str], str | None], path: str) -> ast.Module | None:
    text = read(path)
    if text is None:
        return None
    return ast.parse(text, filename=path)


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _param_names(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]


def _required_params(fn: ast.FunctionDef) -> list[str]:
    """Positional parameters without a default, `self` excluded, plus keyword-only without one."""
    a = fn.args
    positional = a.posonlyargs + a.args
    required = [p.arg for p in positional[: len(positional) - len(a.defaults)]][1:]
    required += [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    return required


def _is_self_attr(node: ast.AST, attr: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == attr
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def _registers_as(cls: ast.ClassDef, op_name: str) -> bool:
    """`@CustomOp.register("<op_name>")` on the class."""
    for d in cls.decorator_list:
        if (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "register"
                and isinstance(d.func.value, ast.Name) and d.func.value.id == "CustomOp"
                and d.args and isinstance(d.args[0], ast.Constant) and d.args[0].value == op_name):
            return True
    return False


def _check_op(tree: ast.Module, iface: GdnInterface, problems: list[str]) -> None:
    op = _classes(tree).get(iface.op_class)
    where = module_file(iface.module)
    if op is None:
        problems.append(f"{where} has no class {iface.op_class}")
        return
    if not _registers_as(op, iface.op_name):
        problems.append(f"{iface.op_class} is not registered as CustomOp {iface.op_name!r}")
    methods = _methods(op)
    init = methods.get("__init__")
    if init is None:
        problems.append(f"{iface.op_class} has no __init__")
    else:
        if _required_params(init):
            problems.append(f"{iface.op_class}.__init__ requires {_required_params(init)}")
        # `self._forward_method = self.forward_native`, directly or as one arm of an if-expression
        picks_native = any(
            isinstance(n, ast.Assign) and any(_is_self_attr(t, "_forward_method") for t in n.targets)
            and any(_is_self_attr(v, "forward_native") for v in ast.walk(n.value)) for n in ast.walk(init))
        if not picks_native:
            problems.append(f"{iface.op_class}.__init__ never selects self.forward_native "
                            "as self._forward_method")
    native = methods.get("forward_native")
    if native is None:
        problems.append(f"{iface.op_class} has no forward_native")
    else:
        missing = [p for p in OP_PARAMS if p not in _param_names(native)]
        if missing:
            problems.append(f"{iface.op_class}.forward_native lacks parameters {missing}")


def _check_layer(tree: ast.Module, iface: GdnInterface, problems: list[str]) -> tuple[str, ...]:
    """The layer builds the op in __init__ and calls it with keywords; returns extra keywords."""
    layer = _classes(tree).get(iface.layer_class)
    where = module_file(iface.module)
    if layer is None:
        problems.append(f"{where} has no class {iface.layer_class}")
        return ()
    init = _methods(layer).get("__init__")
    builds = init is not None and any(
        isinstance(n, ast.Assign) and any(_is_self_attr(t, ATTRIBUTE) for t in n.targets)
        and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
        and n.value.func.id == iface.op_class and not n.value.args
        for n in ast.walk(init))
    if not builds:
        problems.append(f"{iface.layer_class}.__init__ does not build self.{ATTRIBUTE} = {iface.op_class}()")
    calls = [n for n in ast.walk(layer) if isinstance(n, ast.Call) and _is_self_attr(n.func, ATTRIBUTE)]
    if not calls:
        problems.append(f"{iface.layer_class} never calls self.{ATTRIBUTE}(...)")
    extras: set[str] = set()
    for call in calls:
        if call.args:
            problems.append(f"{iface.layer_class} calls self.{ATTRIBUTE} with positional arguments "
                            f"(line {call.lineno})")
        names = [k.arg for k in call.keywords if k.arg is not None]
        extras.update(n for n in names if n not in OP_PARAMS)
    unknown = sorted(extras - set(PASSTHROUGH_KWARGS))
    if unknown:
        problems.append(f"{iface.layer_class} passes unknown keywords {unknown} to self.{ATTRIBUTE}")
    return tuple(sorted(extras))


def _fla_import(tree: ast.Module, iface: GdnInterface) -> str | None:
    for n in ast.walk(tree):
        if (isinstance(n, ast.ImportFrom) and n.module in iface.fla_packages
                and any(a.name == "chunk_gated_delta_rule" for a in n.names)):
            return n.module
    return None


def _check_kernel(read: Callable[[str], str | None], package: str, problems: list[str]) -> None:
    path = package_file(package, "chunk")
    tree = _parse(read, path)
    if tree is None:
        problems.append(f"{path} is missing")
        return
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "chunk_gated_delta_rule"),
              None)
    if fn is None:
        problems.append(f"{path} defines no chunk_gated_delta_rule")
        return
    missing = [p for p in KERNEL_PARAMS if p not in _param_names(fn)]
    if missing:
        problems.append(f"{package}.chunk_gated_delta_rule lacks parameters {missing}")


def _check_custom_op(read: Callable[[str], str | None], problems: list[str]) -> None:
    path = module_file(CUSTOM_OP_MODULE)
    tree = _parse(read, path)
    if tree is None:
        problems.append(f"{path} is missing")
        return
    has_registry = any(
        isinstance(n, (ast.Assign, ast.AnnAssign))
        and any(isinstance(t, ast.Name) and t.id == "op_registry_oot"
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
        for n in tree.body)
    if not has_registry:
        problems.append(f"{path} has no module-level op_registry_oot")
    custom_op = _classes(tree).get("CustomOp")
    if custom_op is None:
        problems.append(f"{path} has no class CustomOp")
        return
    methods = _methods(custom_op)
    if "register_oot" not in methods:
        problems.append("CustomOp has no register_oot")
    new = methods.get("__new__")
    reads_registry = new is not None and any(
        isinstance(n, ast.Name) and n.id == "op_registry_oot" for n in ast.walk(new))
    if not reads_registry:
        problems.append("CustomOp.__new__ does not look up op_registry_oot")


def _check_model(read: Callable[[str], str | None], iface: GdnInterface, problems: list[str]) -> None:
    path = module_file(iface.model_module)
    tree = _parse(read, path)
    if tree is None:
        problems.append(f"{path} is missing")
        return
    uses = any(isinstance(n, ast.ImportFrom) and n.module == iface.module
               and any(a.name == iface.layer_class for a in n.names) for n in ast.walk(tree))
    if not uses:
        problems.append(f"{path} does not import {iface.layer_class} from {iface.module}")


def check_sources(iface: GdnInterface, read: Callable[[str], str | None]) -> Conformance:
    """Check one family against a vLLM source tree; `read(path)` returns a file's text or None.

    Paths are relative to site-packages, e.g. `vllm/model_executor/custom_op.py`.
    """
    try:
        tree = _parse(read, module_file(iface.module))
    except SyntaxError as err:
        return Conformance(iface.name, True, (f"{module_file(iface.module)} does not parse: {err}",))
    if tree is None:
        return Conformance(iface.name, False, (f"no {module_file(iface.module)}",))
    problems: list[str] = []
    try:
        _check_op(tree, iface, problems)
        extras = _check_layer(tree, iface, problems)
        fla = _fla_import(tree, iface)
        if fla is None:
            problems.append(f"{module_file(iface.module)} does not import chunk_gated_delta_rule from "
                            + " or ".join(iface.fla_packages))
        else:
            _check_kernel(read, fla, problems)
        _check_custom_op(read, problems)
        _check_model(read, iface, problems)
    except SyntaxError as err:
        problems.append(f"a vLLM source file does not parse: {err}")
        extras, fla = (), None
    return Conformance(iface.name, True, tuple(problems), fla, extras)
