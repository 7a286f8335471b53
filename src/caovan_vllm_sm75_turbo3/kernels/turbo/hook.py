"""Installing turbo into Triton: the compile-stages hook and its part in the cache key.

Triton calls `knobs.runtime.add_stages_inspection_hook(backend, stages, options, language,
capability)` from `CUDABackend.add_stages`, after `compile()` has computed the cache key from the
source, backend, options and environment. So `install` also wraps
`triton.compiler.compiler.get_cache_key`: for a kernel the selector picks, the key gets
`TURBO_TAG` appended and the backend object is marked; the stages hook then builds only marked
kernels turbo. The key and the build therefore decide from one answer, and a kernel that is not
picked keeps Triton's own key and stages, byte for byte.

Triton 3.7 and 3.8 also call the hook with no arguments for a key part that `compile()` appends
to every kernel's key; ours is empty (the tag is already in the picked kernels' keys), so the
rule above holds there too. What each release does is in `protocol.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ...logformat import HOOK_PREFIX
from .allowlist import Allowlist, source_digest
from .pipeline import TURBO_TAG, TurboBuild, apply_turbo

logger = logging.getLogger("caovan_vllm_sm75_turbo3.turbo")

_MARK = "_caovan_turbo"   # attribute on the per-compile backend object: build this one turbo
_FP32 = "_caovan_turbo_fp32_dots"   # and how its fp32 dots are built (pipeline.FP32_DOT_MODES)

# Picks kernels for turbo: (src, backend, options) -> True to build it turbo. A selector may also
# have `fp32_dots_for(src) -> str`, the picked kernel's fp32-dot mode ("" when it has none).
Selector = Callable[[Any, Any, Any], bool]


def kernel_identity(src: Any) -> tuple[str, str, dict[str, Any]] | None:
    """(name, module, constexprs by name) of a Triton ASTSource; None for IR sources."""
    fn = getattr(src, "fn", None)
    names = getattr(fn, "arg_names", None)
    if fn is None or names is None:
        return None
    constants = {names[k[0]]: v for k, v in getattr(src, "constants", {}).items()
                 if isinstance(k, tuple) and len(k) == 1 and k[0] < len(names)}
    return fn.__name__, getattr(fn, "module", ""), constants


@dataclass
class AllowlistSelector:
    """Pick allowlisted kernels compiled for sm_75 in a verified config.

    `strict` (CAOVAN_TURBO=auto) also needs the running Triton version and the kernel's source
    digest to be a verified pair (for an entry with `sources`: one variant's, in that variant's
    constexprs and configs); `CAOVAN_TURBO=on` drops those conditions and keeps the entry's configs.
    """

    allowlist: Allowlist
    triton_version: str
    strict: bool = True

    def __call__(self, src: Any, backend: Any, options: Any) -> bool:
        if getattr(getattr(backend, "target", None), "arch", None) != 75 or options.arch != "sm75":
            return False
        ident = kernel_identity(src)
        if ident is None:
            return False
        name, module, constants = ident
        entry = self.allowlist.find(name, module)
        if entry is None or not entry.config_matches(constants, options.num_warps):
            return False
        if self.strict:
            digest = source_digest(src.fn.src) if entry.source_sha256 else ""   # our own kernels: no digest
            return entry.verified(digest, self.triton_version, constants, options.num_warps)
        return True

    def fp32_dots_for(self, src: Any) -> str:
        """The `fp32_dots` field of the entry that `src` matches ("" when none)."""
        ident = kernel_identity(src)
        entry = self.allowlist.find(ident[0], ident[1]) if ident else None
        return entry.fp32_dots if entry else ""


@dataclass
class TurboHook:
    """The object set as Triton's stages hook; logs each kernel's first turbo build and its
    fallback reason once (`built`, `fell_back`: kernel name -> what happened)."""

    selector: Selector
    previous: Any = None                       # a hook that was installed before ours, chained
    raise_on_fallback: bool = False            # offline checks: a failed turbo build is an error
    fell_back: dict[str, str] = field(default_factory=dict)
    built: set[str] = field(default_factory=set)

    def __call__(self, *args: Any) -> Any:
        if not args:                           # Triton 3.7+: the key-part call (protocol.py)
            return self._key_part()
        backend, stages, options, language, capability = args
        if getattr(backend, _MARK, None):
            name = getattr(backend, _MARK)
            apply_turbo(backend, stages, options,
                        on_fallback=None if self.raise_on_fallback else lambda why: self._fallback(name, why),
                        on_built=lambda build: self._built(name, build), fp32_dots=getattr(backend, _FP32, ""))
        if self.previous is not None:
            self.previous(*args)

    def _key_part(self) -> tuple[str, str]:
        """(part of every kernel's disk key, part of the JIT's in-memory key). The disk part is empty:
        `get_cache_key` already tags the kernels we pick, and every other kernel keeps Triton's own
        key. A hook installed before ours keeps its parts."""
        if self.previous is None:
            return "", TURBO_TAG
        key, digest = self.previous()
        return key, f"{TURBO_TAG}-{digest}"

    def _built(self, name: str, build: TurboBuild) -> None:
        if name not in self.built:
            self.built.add(name)
            logger.info(HOOK_PREFIX + " %s built for sm_75 tensor cores (%d mma.sync, %s registers, "
                        "%d bytes shared)", name, build.metadata.get("caovan_turbo_mma", 0),
                        build.ptxas.registers, build.metadata.get("shared") or 0)

    def _fallback(self, name: str, reason: str) -> None:
        if name not in self.fell_back:
            self.fell_back[name] = reason
            logger.warning(HOOK_PREFIX + " %s builds plain (no tensor cores): %s", name, reason)


def current_hook() -> TurboHook | None:
    """Our hook if it is installed in this process's Triton."""
    from triton import knobs

    hook = knobs.runtime.add_stages_inspection_hook
    return hook if isinstance(hook, TurboHook) else None


def _keyed(original: Callable, selector: Selector) -> Callable:
    def get_cache_key(*args: Any, **kwargs: Any) -> str:
        key = original(*args, **kwargs)
        try:   # Triton 3.6 to 3.8: (src, backend, backend_options, env_vars)
            src, backend, options = args[:3]
            picked = selector(src, backend, options)
        except Exception as err:   # a broken selector or another protocol must not break compiling
            logger.warning(HOOK_PREFIX + " kernel selection failed, building plain: %s", err)
            picked = False
        if not picked:
            return key
        mode = selector.fp32_dots_for(src) if hasattr(selector, "fp32_dots_for") else ""
        setattr(backend, _MARK, src.name)
        setattr(backend, _FP32, mode)
        return f"{key}-{TURBO_TAG}" + (f"-fp32-{mode}" if mode else "")   # the mode changes the binary
    get_cache_key.caovan_original = original  # type: ignore[attr-defined]
    return get_cache_key


def install(selector: Selector, *, raise_on_fallback: bool = False) -> TurboHook:
    """Install turbo into this process's Triton (replacing an earlier turbo install)."""
    import triton.compiler.compiler as tcc
    from triton import knobs

    uninstall()
    hook = TurboHook(selector=selector, previous=knobs.runtime.add_stages_inspection_hook,
                     raise_on_fallback=raise_on_fallback)
    knobs.runtime.add_stages_inspection_hook = hook
    tcc.get_cache_key = _keyed(tcc.get_cache_key, selector)
    return hook


def uninstall() -> None:
    """Remove turbo from Triton, restoring the hook and cache key it found."""
    import triton.compiler.compiler as tcc
    from triton import knobs

    hook = current_hook()
    if hook is not None:
        knobs.runtime.add_stages_inspection_hook = hook.previous
    original = getattr(tcc.get_cache_key, "caovan_original", None)
    if original is not None:
        tcc.get_cache_key = original


@contextmanager
def installed(selector: Selector, *, raise_on_fallback: bool = False) -> Iterator[TurboHook]:
    """Turbo installed for the duration of the block (offline compiles, tests); an install that
    was there before comes back afterwards."""
    before = current_hook()
    hook = install(selector, raise_on_fallback=raise_on_fallback)
    try:
        yield hook
    finally:
        uninstall()
        if before is not None:
            install(before.selector, raise_on_fallback=before.raise_on_fallback)
