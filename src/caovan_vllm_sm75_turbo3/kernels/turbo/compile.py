"""Offline compiles for Turing (no GPU needed): plain Triton or turbo, with the resource readout.

`compile_for_sm75(fn, signature, constexprs, num_warps=..., turbo=...)` runs `triton.compile` for
`GPUTarget("cuda", 75, 32)`. With `turbo=True` the same hook that a user's process installs
builds it (sm_80 planning, one stage, PTX rewrite, ptxas for sm_75), except that a failed turbo
build raises `TurboBuildError` here instead of falling back.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .hook import installed, kernel_identity
from .pipeline import TurboBuildError
from .protocol import triton_ptxas_extra
from .resources import entry_name, fma_count, mma_count, run_ptxas
from .spec import divisibility_attrs

SM75 = 75

__all__ = ["CompiledInfo", "TurboBuildError", "compile_for_sm75", "divisibility_attrs", "jit_function"]


@dataclass
class CompiledInfo:
    """One kernel built for sm_75 and what it needs."""

    name: str              # the Triton function's name
    build: str             # "plain" or "turbo"
    ptx: str
    cubin: bytes
    shared_bytes: int      # dynamic shared memory per block (Triton's metadata.shared)
    registers: int | None
    spill_bytes: int | None
    mma_count: int
    fma_count: int
    num_warps: int
    entry: str             # PTX entry name (what a driver loader looks up)
    global_scratch_bytes: int = 0
    kernel: Any = None     # Triton's CompiledKernel (launchable on an sm_75 GPU)

    def summary_numbers(self) -> dict[str, Any]:
        """The resource numbers: shared_bytes, registers, spill_bytes, mma_count, fma_count."""
        return {"shared_bytes": self.shared_bytes, "registers": self.registers,
                "spill_bytes": self.spill_bytes, "mma_count": self.mma_count, "fma_count": self.fma_count}

    def summary(self) -> dict[str, Any]:
        """JSON-ready fields, without the binaries."""
        return {"kernel": self.name, "build": self.build, **self.summary_numbers(), "num_warps": self.num_warps}


def jit_function(fn: Any) -> Any:
    """The JITFunction under @triton.autotune / @triton.heuristics wrappers.

    A kernel decorated while TRITON_INTERPRET=1 is an InterpretedFunction; it is rebuilt as a
    JITFunction from the same Python function, so it can still be compiled.
    """
    from triton.runtime.jit import JITFunction

    # Only a process that ran the interpreter has it loaded (it needs numpy, a compile does not).
    interpreter = sys.modules.get("triton.runtime.interpreter")
    seen = 0
    while not isinstance(fn, JITFunction):
        if interpreter is not None and isinstance(fn, interpreter.InterpretedFunction):
            return JITFunction(fn.fn, do_not_specialize=fn.kwargs.get("do_not_specialize"))
        fn = getattr(fn, "fn", None)
        seen += 1
        if fn is None or seen > 8:
            raise TypeError("not a Triton kernel (no JITFunction under its decorators)")
    return fn


def compile_for_sm75(fn: Any, signature: Mapping[str, str], constexprs: Mapping[str, Any], *,
                     num_warps: int, turbo: bool, attrs: Mapping | None = None,
                     num_stages: int = 2, maxnreg: int | None = None, fp32_dots: str = "") -> CompiledInfo:
    """Compile `fn` for sm_75 plain (`turbo=False`) or turbo; registers and spills from ptxas -v.

    `attrs` is Triton's attrs dict ({(arg_index,): [["tt.divisibility", 16]]}); see
    `divisibility_attrs`. `num_stages` applies to the plain build; turbo always uses one stage.
    `maxnreg` is Triton's launch option of that name (`.maxnreg` in the PTX), as a launcher passes it.
    `fp32_dots` is the allowlist entry's field of that name (turbo build only).
    Raises `TurboBuildError` when the turbo build fails.
    """
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    with knobs.runtime.scope():
        knobs.runtime.interpret = False   # Triton cannot compile while TRITON_INTERPRET=1 is in effect
        return _compile(triton, GPUTarget, ASTSource, fn, signature, constexprs, num_warps, turbo, attrs,
                        num_stages, maxnreg, fp32_dots)


def _compile(triton: Any, GPUTarget: Any, ASTSource: Any, fn: Any, signature: Mapping[str, str],
             constexprs: Mapping[str, Any], num_warps: int, turbo: bool, attrs: Mapping | None,
             num_stages: int, maxnreg: int | None, fp32_dots: str) -> CompiledInfo:
    jit = jit_function(fn)
    src = ASTSource(fn=jit, signature=dict(signature), constexprs=dict(constexprs),
                    attrs=dict(attrs or {}))
    options: dict[str, Any] = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    target = GPUTarget("cuda", SM75, 32)
    if turbo:
        ident = kernel_identity(src)

        def only_this(s: Any, backend: Any, opts: Any) -> bool:
            return kernel_identity(s) == ident and backend.target.arch == SM75

        only_this.fp32_dots_for = lambda s: fp32_dots  # type: ignore[attr-defined]
        with installed(only_this, raise_on_fallback=True):
            kernel = triton.compile(src, target=target, options=options)
        if getattr(kernel.metadata, "caovan_turbo", None) is None:
            raise TurboBuildError("the build came back without the turbo mark (hook not applied)")
    else:
        kernel = triton.compile(src, target=target, options=options)
    ptx = kernel.asm["ptx"]
    _, report = run_ptxas(ptx, arch=SM75, extra=triton_ptxas_extra())   # as Triton assembles it
    return CompiledInfo(
        name=jit.__name__, build="turbo" if turbo else "plain", ptx=ptx, cubin=kernel.asm["cubin"],
        shared_bytes=int(kernel.metadata.shared or 0), registers=report.registers,
        spill_bytes=report.spill_bytes, mma_count=mma_count(ptx), fma_count=fma_count(ptx),
        num_warps=int(kernel.metadata.num_warps), entry=entry_name(ptx),
        global_scratch_bytes=int(getattr(kernel.metadata, "global_scratch_size", 0) or 0), kernel=kernel)
