"""The allowlisted kernels as installed here, and their offline sm_75 check, for the CLIs.

Kernels are resolved from the modules the allowlist names (vLLM's FLA ops in the user's own
vLLM), never from copies. On a machine without a GPU vLLM replaces Triton by a placeholder
unless CUDA_VISIBLE_DEVICES is empty, so the import is done with it empty, and only then.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from typing import Any

from ..errors import CaovanError
from ..kernels.turbo.allowlist import KernelEntry, SourceVariant, source_digest

_PLACEHOLDER_SWITCH = "CUDA_VISIBLE_DEVICES"


@contextmanager
def _triton_importable_without_gpu() -> Iterator[None]:
    """Let vllm.triton_utils keep the real Triton when no GPU driver is active (offline checks)."""
    if "vllm.triton_utils" in sys.modules:
        yield
        return
    if _has_active_driver():
        with redirect_stdout(sys.stderr):
            yield
        return
    before = os.environ.get(_PLACEHOLDER_SWITCH)
    os.environ[_PLACEHOLDER_SWITCH] = ""   # vLLM then treats 0 drivers as a distributed-init state
    try:
        with redirect_stdout(sys.stderr):   # vLLM's log handler binds to stdout on import: keep --json clean
            yield
    finally:
        if before is None:
            os.environ.pop(_PLACEHOLDER_SWITCH, None)
        else:
            os.environ[_PLACEHOLDER_SWITCH] = before


def _has_active_driver() -> bool:
    try:
        from triton.backends import backends
        return any(b.driver and b.driver.is_active() for b in backends.values())
    except Exception:
        return False


@dataclass
class ResolvedKernel:
    """An allowlist entry and the JITFunction it names in this environment."""

    entry: KernelEntry
    fn: Any
    module: str
    digest: str
    triton_version: str = ""   # the Triton it is checked with; "" = the installed one

    def _triton(self) -> str:
        if self.triton_version:
            return self.triton_version
        import triton
        return triton.__version__

    @property
    def variant(self) -> SourceVariant | None:
        """The entry's source variant of this digest: the one verified on this Triton, else any (its
        constexprs still describe this text); None when the entry lists no variant of it."""
        if not self.entry.sources:
            return None
        return self.entry.variant_for(self.digest, self._triton()) or next(
            (v for v in self.entry.sources if v.digest == self.digest), None)

    @property
    def source_verified(self) -> bool:
        if self.entry.sources:
            return self.entry.variant_for(self.digest, self._triton()) is not None
        return not self.entry.source_sha256 or self.digest in self.entry.source_sha256

    def unverified_reason(self) -> str:
        """Why auto mode builds this source plain (for a check row); call only when not `source_verified`."""
        variant = self.variant
        if variant is None:
            return (f"source digest {self.digest} is not the verified {', '.join(self.entry.source_sha256)} "
                    "(auto mode builds it plain)")
        return (f"source digest {self.digest} was verified with Triton {', '.join(variant.triton_versions)}, "
                f"not {self._triton()} (auto mode builds it plain)")


def resolve(entry: KernelEntry) -> ResolvedKernel:
    """Import the entry's kernel; CaovanError naming the modules when none of them has it."""
    from ..kernels.turbo.compile import jit_function

    errors = []
    for module in entry.modules:
        try:
            with _triton_importable_without_gpu():
                mod = importlib.import_module(module)
            fn = jit_function(getattr(mod, entry.name))
        except (ImportError, AttributeError, TypeError) as err:
            errors.append(f"{module}: {type(err).__name__}: {err}")
            continue
        return ResolvedKernel(entry, fn, module, source_digest(fn.src))
    raise CaovanError(f"allowlisted kernel {entry.name} is not importable here ({'; '.join(errors)}); "
                      "is vLLM installed in this Python environment?")


@dataclass
class CheckRow:
    """One kernel, config and build of the offline check."""

    kernel: str
    build: str
    config: dict[str, Any]
    shared_bytes: int | None = None
    registers: int | None = None
    spill_bytes: int | None = None
    mma_count: int | None = None
    fma_count: int | None = None
    ok: bool = False
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


Build = tuple[dict[str, Any], dict[str, str], dict[str, Any], int, list[str]]


def check_builds(kernel: ResolvedKernel, *, plain: bool = False) -> Iterator[Build]:
    """(config, signature, constexprs, num_warps, divisible parameters) of each build the check compiles.

    The entry's `check` either gives one `signature` and base `constexprs` (each verified config
    adds its own), or names a `specs` provider ("module:function") returning objects with `fn`,
    `name`, `signature`, `constexprs` and `num_warps`, as our own kernels pin them. With `plain`,
    in the same order, what the product runs where that build comes out plain: a spec's
    `plain_fallback` where it has one (the launcher's fallback), else the same build.
    """
    check = kernel.entry.check
    if "specs" in check:
        for spec in _pinned_specs(kernel, listed=True):
            yield _spec_build((getattr(spec, "plain_fallback", None) if plain else None) or spec)
        return
    # the installed text's variant adds its constexprs (parameters the base signature may lack) and
    # its own configs; an unlisted digest compiles as the entry says
    variant = kernel.variant
    extra = dict(variant.constexprs) if variant is not None else {}
    base = {**check["constexprs"], **extra}
    sig = dict(check["signature"])
    if any(k not in sig for k in extra):   # Triton wants the parameters in the kernel's order
        sig = {name: sig.get(name, "constexpr") for name in kernel.fn.arg_names}
    for cfg in kernel.entry.configs_for(variant):
        cx = dict(base)
        cx.update({k: v for k, v in cfg.items() if k != "num_warps"})
        yield dict(cfg), dict(sig), cx, int(cfg["num_warps"]), [n for n, t in sig.items() if t.startswith("*")]


def _spec_build(spec: Any) -> Build:
    """A pinned spec's build, with the launcher's stages and register cap (so the plain build is
    the product's fallback)."""
    cfg = {"spec": spec.name, "num_warps": spec.num_warps, "num_stages": spec.num_stages}
    if spec.maxnreg:
        cfg["maxnreg"] = spec.maxnreg
    return cfg, dict(spec.signature), dict(spec.constexprs), int(spec.num_warps), _divisible(spec)


def _divisible(spec: Any) -> list[str]:
    """The parameters a pinned spec marks 16-divisible (pointers, and for some kernels layout strides),
    so the check compiles what the product's launch specialises."""
    if spec.divisible is not None:
        return list(spec.divisible)
    return [n for n, t in spec.signature.items() if t.startswith("*")]


def _pinned_specs(kernel: ResolvedKernel, *, listed: bool) -> list[Any]:
    """The entry's pinned specs whose config the allowlist lists (or, listed=False, does not)."""
    module, func = kernel.entry.check["specs"].split(":")
    with _triton_importable_without_gpu():
        specs = getattr(importlib.import_module(module), func)()
    return [s for s in specs if getattr(s.fn, "__name__", None) == kernel.entry.name
            and kernel.entry.config_matches(s.constexprs, s.num_warps) == listed]


def unlisted_specs(kernel: ResolvedKernel) -> list[str]:
    """Names of pinned specs of this kernel that the allowlist leaves out (they build plain)."""
    return [s.name for s in _pinned_specs(kernel, listed=False)] if "specs" in kernel.entry.check else []


def check_kernel(kernel: ResolvedKernel) -> list[CheckRow]:
    """Compile each verified config plain and turbo for sm_75 and judge the turbo build."""
    from ..kernels.turbo.compile import TurboBuildError, compile_for_sm75, divisibility_attrs
    from ..policy.turbo import SM75_SHARED_LIMIT, judge_turbo_build

    rows = []
    pairs = zip(check_builds(kernel), check_builds(kernel, plain=True))
    for (cfg, sig, cx, warps, divisible), (pcfg, psig, pcx, pwarps, pdivisible) in pairs:
        attrs = divisibility_attrs(kernel.fn, divisible)
        plain = compile_for_sm75(kernel.fn, psig, pcx, num_warps=pwarps, turbo=False,
                                 attrs=divisibility_attrs(kernel.fn, pdivisible),
                                 num_stages=pcfg.get("num_stages", 2), maxnreg=pcfg.get("maxnreg"))
        rows.append(CheckRow(kernel.entry.name, "plain", pcfg, **plain.summary_numbers(),
                             ok=plain.shared_bytes <= SM75_SHARED_LIMIT,
                             problems=[] if plain.shared_bytes <= SM75_SHARED_LIMIT else
                             [f"shared memory {plain.shared_bytes} > {SM75_SHARED_LIMIT}"]))
        row = CheckRow(kernel.entry.name, "turbo", cfg)
        try:
            turbo = compile_for_sm75(kernel.fn, sig, cx, num_warps=warps, turbo=True, attrs=attrs,
                                     maxnreg=cfg.get("maxnreg"), fp32_dots=kernel.entry.fp32_dots)
        except TurboBuildError as err:
            row.problems = [f"turbo build failed: {err}"]
        else:
            for k, v in turbo.summary_numbers().items():
                setattr(row, k, v)
            row.problems = judge_turbo_build(turbo.shared_bytes, turbo.spill_bytes, turbo.mma_count,
                                             turbo.fma_count, plain.fma_count)
        if not kernel.source_verified:
            row.problems.append(kernel.unverified_reason())
        row.ok = not row.problems
        rows.append(row)
    return rows
