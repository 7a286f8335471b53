"""What a vLLM attention interface family is, and the source check that says whether a release has it.

A family is data (`AttentionInterface`): where vLLM's backend registry and its Triton attention
backend live, and the names our subclass relies on. Our backend subclasses vLLM's TRITON_ATTN
classes and re-binds two global names of their methods (`unified_attention` in `forward`, the
cache write in `do_kv_cache_update`), so `check_sources` reads the release's source with `ast`
(never importing it) for exactly what that needs. The same check runs on the installed vLLM in
each process and on every release's wheel in `tools/vllm_attention_conformance.py`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from ...kernels.attention.configs import FP8_CACHE_DTYPES
from ...policy.attention import OUR_BACKEND
from ..dispatch.interface import module_file

# The leading parameters vLLM passes and our kernel takes (kernels/attention).
LEADING = ("q", "k", "v", "out", "cu_seqlens_q", "max_seqlen_q", "seqused_k", "max_seqlen_k", "softmax_scale",
           "causal", "window_size", "block_table", "softcap", "q_descale", "k_descale", "v_descale")
# vLLM's extras that our adapter accepts (it refuses non-default values of the feature ones).
EXTRAS = ("alibi_slopes", "use_alibi_sqrt", "seq_threshold_3D", "num_par_softmax_segments", "softmax_segm_output",
          "softmax_segm_max", "softmax_segm_expsum", "sinks", "output_scale", "mm_prefix_range", "rswa_prefix_lens",
          "rswa_window", "kv_quant_mode", "k_scale_cache", "v_scale_cache", "chunk_lookback", "use_td",
          "mm_prefix_clamp_sliding_window", "qq_bias")
FP8_NAMES = tuple(FP8_CACHE_DTYPES)
# The self attributes TritonAttentionImpl.__init__ derives from its kv_cache_dtype argument; our
# __init__ passes "auto" (vLLM refuses fp8 below SM89 there) and sets these itself.
KV_DTYPE_ATTRS = ("kv_cache_dtype", "_kv_quant_mode")
CACHE_WRITE_ARGS = 8  # key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale


@dataclass(frozen=True)
class AttentionInterface:
    """One vLLM attention interface family, named as it appears in the log."""

    name: str
    since: str                     # first release (major.minor) of the family
    until: str | None              # last one we read (None: open)
    registry_module: str           # AttentionBackendEnum (with CUSTOM) and register_backend
    backend_module: str            # vLLM's TRITON_ATTN backend, impl and metadata builder
    cache_write_module: str        # where its cache write lives
    backend_class: str = "TritonAttentionBackend"
    impl_class: str = "TritonAttentionImpl"
    builder_class: str = "TritonAttentionMetadataBuilder"
    kernel_name: str = "unified_attention"
    cache_write_name: str = "triton_reshape_and_cache_flash"

    def source_files(self) -> tuple[str, ...]:
        """Every source file the check reads, relative to site-packages."""
        return (module_file(self.registry_module), module_file(self.backend_module),
                module_file(self.cache_write_module))


@dataclass(frozen=True)
class AttentionConformance:
    """The result of checking one family against one vLLM source tree, with what it found."""

    interface: str
    present: bool
    problems: tuple[str, ...] = ()
    cudagraph_support: str | None = None   # the metadata builder's AttentionCGSupport member
    kv_layout: str | None = None           # how forward splits the cache: "unbind(1)" / "transpose(1, 2)"
    vllm_fp8_on_sm75: bool | None = None   # False: vLLM's impl and cache write refuse fp8 below SM89

    @property
    def ok(self) -> bool:
        return self.present and not self.problems


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _calls(fn: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name]


def _imports(tree: ast.Module, name: str) -> str | None:
    """The module `name` is imported from at module level, if any."""
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and any(a.name == name and a.asname is None for a in n.names):
            return n.module
    return None


def _mentions_89(tree: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "has_device_capability"
               and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value == 89 for n in ast.walk(tree))


def _check_registry(tree: ast.Module, problems: list[str]) -> None:
    enum = _classes(tree).get("AttentionBackendEnum")
    if enum is None or not any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == OUR_BACKEND
                                                                  for t in n.targets) for n in enum.body):
        problems.append(f"AttentionBackendEnum has no {OUR_BACKEND} member")
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "register_backend"), None)
    if fn is None or [a.arg for a in fn.args.args[:2]] != ["backend", "class_path"]:
        problems.append("register_backend(backend, class_path) is missing")


def _check_backend(cls: ast.ClassDef | None, iface: AttentionInterface, problems: list[str]) -> None:
    if cls is None:
        problems.append(f"no class {iface.backend_class}")
        return
    for m in ("get_impl_cls", "get_builder_cls", "get_name", "supports_compute_capability"):
        if m not in _methods(cls):
            problems.append(f"{iface.backend_class} has no {m}")
    dtypes = next((n.value for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                   and n.target.id == "supported_kv_cache_dtypes"), None)
    listed = {e.value for e in getattr(dtypes, "elts", ()) if isinstance(e, ast.Constant)}
    if not set(FP8_NAMES) <= listed:
        problems.append(f"{iface.backend_class}.supported_kv_cache_dtypes lacks {sorted(set(FP8_NAMES) - listed)}")


def _cudagraph_support(cls: ast.ClassDef | None) -> str | None:
    for n in cls.body if cls else ():
        if (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "_cudagraph_support"
                and isinstance(n.value, ast.Attribute)):
            return n.value.attr
    return None


def _check_init(init: ast.FunctionDef | None, iface: AttentionInterface, problems: list[str]) -> None:
    if init is None:
        problems.append(f"{iface.impl_class} has no __init__")
        return
    params = [a.arg for a in init.args.args]
    if params[7:8] != ["kv_cache_dtype"]:
        problems.append(f"{iface.impl_class}.__init__'s 7th parameter is not kv_cache_dtype: {params[1:9]}")
    derived = set()
    for n in ast.walk(init):
        if isinstance(n, ast.Assign) and any(isinstance(x, ast.Name) and x.id == "kv_cache_dtype"
                                             for x in ast.walk(n.value)):
            derived |= {t.attr for t in n.targets if isinstance(t, ast.Attribute)}
    if derived != set(KV_DTYPE_ATTRS):
        problems.append(f"{iface.impl_class}.__init__ derives {sorted(derived)} from kv_cache_dtype, "
                        f"not {list(KV_DTYPE_ATTRS)}")


def _check_forward(fn: ast.FunctionDef | None, iface: AttentionInterface, problems: list[str]) -> None:
    calls = _calls(fn, iface.kernel_name) if fn else []
    if len(calls) != 1:
        problems.append(f"{iface.impl_class}.forward calls {iface.kernel_name} {len(calls)} times, not once")
        return
    names = [k.arg for k in calls[0].keywords]
    if calls[0].args or None in names:
        problems.append(f"{iface.impl_class}.forward passes positional arguments to {iface.kernel_name}")
    missing = [p for p in LEADING if p not in names]
    unknown = [p for p in names if p not in LEADING + EXTRAS]
    if missing or unknown:
        problems.append(f"{iface.kernel_name} call: missing {missing}, unknown {unknown}")


def _check_cache_write(fn: ast.FunctionDef | None, iface: AttentionInterface, problems: list[str]) -> None:
    calls = _calls(fn, iface.cache_write_name) if fn else []
    if len(calls) != 1 or len(calls[0].args) != CACHE_WRITE_ARGS or calls[0].keywords:
        problems.append(f"{iface.impl_class}.do_kv_cache_update does not call {iface.cache_write_name} once "
                        f"with {CACHE_WRITE_ARGS} positional arguments")


def _kv_layout(fn: ast.FunctionDef | None) -> str | None:
    text = ast.unparse(fn) if fn else ""
    return next((form for form in ("unbind(1)", "transpose(1, 2)") if form in text), None)


def check_sources(iface: AttentionInterface, read: Callable[[str], str | None]) -> AttentionConformance:
    """Check one family against a vLLM source tree; `read(path)` returns a file's text or None."""
    texts = {p: read(p) for p in iface.source_files()}
    missing = [p for p, t in texts.items() if t is None]
    if missing:
        return AttentionConformance(iface.name, False, tuple(f"no {p}" for p in missing))
    try:
        registry, backend, cache = (ast.parse(texts[p], filename=p) for p in iface.source_files())
    except SyntaxError as err:
        return AttentionConformance(iface.name, True, (f"a vLLM source file does not parse: {err}",))
    problems: list[str] = []
    _check_registry(registry, problems)
    classes = _classes(backend)
    _check_backend(classes.get(iface.backend_class), iface, problems)
    impl = _methods(classes[iface.impl_class]) if iface.impl_class in classes else {}
    if not impl:
        problems.append(f"no class {iface.impl_class}")
    _check_init(impl.get("__init__"), iface, problems)
    _check_forward(impl.get("forward"), iface, problems)
    _check_cache_write(impl.get("do_kv_cache_update"), iface, problems)
    for name, module in ((iface.kernel_name, None), (iface.cache_write_name, iface.cache_write_module)):
        source = _imports(backend, name)
        if source is None or (module is not None and source != module):
            problems.append(f"{module_file(iface.backend_module)} does not import {name}"
                            + (f" from {module}" if module else ""))
    if not any(isinstance(n, ast.Attribute) and n.attr == "fp8_dtype" for n in ast.walk(classes.get(iface.impl_class,
                                                                                                   backend))):
        problems.append(f"{iface.impl_class} does not view fp8 caches through self.fp8_dtype")
    gated = _mentions_89(impl["__init__"]) if "__init__" in impl else False
    return AttentionConformance(
        iface.name, True, tuple(problems), _cudagraph_support(classes.get(iface.builder_class)),
        _kv_layout(impl.get("forward")), not (gated or _mentions_89(cache)))
