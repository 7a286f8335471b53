"""The turbo build of one kernel inside Triton's compile stages, with fallback to the plain build.

Triton runs its stages in order: ttir -> ttgir -> llir -> ptx -> cubin. `apply_turbo` replaces
the ttgir stage with the whole turbo build (sm_80 planning with one pipeline stage, the PTX
rewrite, ptxas for sm_75) done on a copy of the TTIR, and the later stages hand back its results.
When any step fails, the plain stages run on the untouched TTIR instead and the reason goes to
`on_fallback`: a kernel is always either wholly turbo or wholly plain.

An entry with `fp32_dots = "f16x3"` also has its IEEE fp32 dots asked for as tf32 in that copy,
so that sm_80 planning gives them tensor cores; the rewrite then computes each tf32 mma as a
split-fp16 product (rewrite.py), more precise than tf32. The original TTIR keeps IEEE.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import TurboError
from .protocol import triton_ptxas_extra
from .resources import PtxasError, PtxasReport, mma_count, run_ptxas
from .rewrite import REWRITE_VERSION, RewriteResult, TurboRewriteError, rewrite_ptx
from .spec import SM75_SHARED_LIMIT



def _code_digest() -> str:
    """Digest of the code that shapes a turbo binary, so any change to it misses old cache entries."""
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in ("rewrite.py", "pipeline.py", "resources.py", "protocol.py"):
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:12]


# Written into Triton's cache key and into the kernel's metadata for every turbo build.
TURBO_TAG = f"caovan-turbo-sm75-r{REWRITE_VERSION}-{_code_digest()}"
PLAN_CAPABILITY = 80        # Triton's MMAv2 path, which sm_75's m16n8k8 can execute when split
FP32_DOT_MODES = ("", "f16x3")   # "": fp32 dots as Triton plans them; "f16x3": IEEE ones planned as tf32

# A TTIR fp32 x fp32 dot; IEEE precision is the attribute's default, so Triton prints it only
# when it is not IEEE (`inputPrecision = tf32`, ...).
_F32_DOT = re.compile(r"^(\s*%\S+ = tt\.dot [^:\n]*?)( : tensor<[^>\n]*xf32> \* tensor<[^>\n]*xf32>)",
                      re.MULTILINE)


class TurboBuildError(TurboError):
    """The turbo build failed; `str(err)` is the reason (for the once-per-kernel fallback log)."""


@dataclass
class TurboBuild:
    """Every stage's output of one successful turbo build."""

    ttgir: str
    llir: str
    ptx: str
    cubin: bytes
    metadata: dict[str, Any]
    rewrite: RewriteResult
    ptxas: PtxasReport


def ieee_dots_as_tf32(ttir: str) -> tuple[str, int]:
    """The TTIR text with every IEEE fp32 x fp32 `tt.dot` asking for tf32, and how many changed."""
    changed = 0

    def ask_tf32(m: re.Match[str]) -> str:
        nonlocal changed
        head = m.group(1)
        if "inputPrecision" in head:
            return m.group(0)   # tf32, tf32x3, ...: the kernel asked for it itself
        changed += 1
        at = head.find(", maxNumImpreciseAcc")   # the assembly format prints inputPrecision before it
        at = len(head) if at < 0 else at
        return head[:at] + ", inputPrecision = tf32" + head[at:] + m.group(2)

    return _F32_DOT.sub(ask_tf32, ttir), changed


def _copy_module(module: Any, fp32_dots: str = "") -> Any:
    """A fresh MLIR module parsed from `module`'s text (its IEEE fp32 dots asked as tf32 when
    `fp32_dots` is "f16x3"), so the original stays untouched."""
    from triton._C.libtriton import ir

    text = str(module)
    if fp32_dots == "f16x3":
        text, _ = ieee_dots_as_tf32(text)
    with tempfile.TemporaryDirectory(prefix="caovan-turbo-") as tmp:
        path = os.path.join(tmp, "kernel.ttir")
        with open(path, "w") as f:
            f.write(text)
        copy = ir.parse_mlir_module(path, module.context)
    copy.context = module.context
    return copy


def _ptxas_flags(options: Any) -> tuple[str, ...]:
    """Triton's own ptxas flags that change code: fmad, its release's fixed flags, user PTXAS options."""
    flags = [] if options.enable_fp_fusion else ["--fmad=false"]
    flags += triton_ptxas_extra()
    if options.ptx_options:
        flags += options.ptx_options.split(" ")
    return tuple(flags)


def build_turbo(backend: Any, ttir: Any, metadata: dict[str, Any], options: Any,
                fp32_dots: str = "") -> TurboBuild:
    """Build the turbo variant from a TTIR module without modifying `ttir` or `metadata`.

    `fp32_dots` is the allowlist entry's field of that name (`FP32_DOT_MODES`).

    Raises `TurboBuildError` with the reason when planning, the rewrite or ptxas fails, or when
    the result needs more than sm_75's 64 KiB of shared memory.
    """
    opts = dataclasses.replace(options, num_stages=1)   # cp.async (multi-stage loads) is sm_80+
    md = dict(metadata)
    try:
        module = backend.make_ttgir(_copy_module(ttir, fp32_dots), md, opts, PLAN_CAPABILITY)
        ttgir = str(module)
        llir = backend.make_llir(module, md, opts, PLAN_CAPABILITY)
        ptx80 = backend.make_ptx(llir, md, opts, backend.target.arch)
    except Exception as err:   # any Triton failure in planning means: build plain
        raise TurboBuildError(f"Triton could not plan it as sm_80: {type(err).__name__}: {err}") from None
    try:
        rewritten = rewrite_ptx(ptx80)
    except TurboRewriteError as err:
        raise TurboBuildError(str(err)) from None
    if (md.get("shared") or 0) > SM75_SHARED_LIMIT:
        raise TurboBuildError(f"needs {md['shared']} bytes of shared memory, sm_75 has {SM75_SHARED_LIMIT}")
    try:
        cubin, report = run_ptxas(rewritten.ptx, arch=75, extra=_ptxas_flags(options))
    except PtxasError as err:
        raise TurboBuildError(str(err)) from None
    md["num_stages"] = 1
    md["caovan_turbo"] = TURBO_TAG
    md["caovan_turbo_mma"] = mma_count(rewritten.ptx)
    return TurboBuild(ttgir=ttgir, llir=llir, ptx=rewritten.ptx, cubin=cubin, metadata=md,
                      rewrite=rewritten, ptxas=report)


def apply_turbo(backend: Any, stages: dict[str, Callable], options: Any,
                on_fallback: Callable[[str], None] | None = None,
                on_built: Callable[[TurboBuild], None] | None = None, fp32_dots: str = "") -> None:
    """Make `stages` build the turbo variant, or the plain one when the turbo build fails.

    With `on_fallback=None` a failure raises `TurboBuildError` instead (offline checks);
    `on_built` hears of each successful turbo build; `fp32_dots` as in `build_turbo`.
    """
    plain = dict(stages)
    built: list[TurboBuild] = []   # this compile's result; one compile per stages dict

    def ttgir(src: Any, metadata: dict[str, Any]) -> Any:
        try:
            build = build_turbo(backend, src, metadata, options, fp32_dots)
        except TurboBuildError as err:
            if on_fallback is None:
                raise
            on_fallback(str(err))
            return plain["ttgir"](src, metadata)
        built.append(build)
        metadata.update(build.metadata)
        if on_built is not None:
            on_built(build)
        return build.ttgir

    def later(stage: str, pick: Callable[[TurboBuild], Any]) -> Callable:
        return lambda src, metadata: pick(built[0]) if built else plain[stage](src, metadata)

    stages["ttgir"] = ttgir
    stages["llir"] = later("llir", lambda b: b.llir)
    stages["ptx"] = later("ptx", lambda b: b.ptx)
    stages["cubin"] = later("cubin", lambda b: b.cubin)
