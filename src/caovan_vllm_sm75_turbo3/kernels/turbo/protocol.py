"""What the Turbo hook relies on in each Triton release: one table, read from each release's source.

Common to 3.6.0, 3.7.1 and 3.8.0 (triton/backends/nvidia/compiler.py, triton/compiler/compiler.py):
`CUDABackend.add_stages` fills the stages ttir, ttgir, llir, ptx, cubin and then calls
`knobs.runtime.add_stages_inspection_hook(backend, stages, options, language, capability)`;
`compile()` computes its key with the module attribute `get_cache_key(src, backend, options,
env_vars=...)` of triton.compiler.compiler (which `install` wraps) before it builds the stages;
`make_ttgir(mod, metadata, opt, capability)`, `make_llir(...)` and `make_ptx(...)` take the
capability they plan for; `CUDAOptions` has `arch`, `num_stages`, `enable_fp_fusion` and
`ptx_options`; `TRITON_OVERRIDE_ARCH` (knobs.runtime.override_arch) only sets `options.arch`.

What differs is the `Triton` rows below. `tests/test_kernels_turbo_protocol.py` checks the installed
Triton's source against its row, so a release that changes any of it fails there first.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...versions import minor


@dataclass(frozen=True)
class HookProtocol:
    """How one Triton release (its minor version) calls the stages hook and assembles cubins."""

    triton: str                      # minor version, e.g. "3.7"
    # compile() calls the hook with no arguments right after get_cache_key and appends the first
    # item it returns to every kernel's key; JITFunction.run calls it on every launch and puts
    # the second item into its in-memory kernel key.
    key_part_call: bool
    ptxas_extra: tuple[str, ...]     # flags Triton's own make_cubin always gives ptxas
    bundled_ptxas: str               # CUDA release of the ptxas in the wheel (PTX ISA it emits follows)


PROTOCOLS: dict[str, HookProtocol] = {p.triton: p for p in (
    HookProtocol("3.6", key_part_call=False, ptxas_extra=(), bundled_ptxas="12.8"),
    # 3.7.1: the no-argument key-part call is new; make_cubin adds --regAllocOptLevel=2 ("to work
    # around ptxas 13.x bug"); PTX ISA capped at 9.0 instead of 8.6.
    HookProtocol("3.7", key_part_call=True, ptxas_extra=("--regAllocOptLevel=2",), bundled_ptxas="12.8"),
    # 3.8.0: as 3.7.1; make_llir also turns LLVM's SLP vectorizer off when planning for sm_80.
    HookProtocol("3.8", key_part_call=True, ptxas_extra=("--regAllocOptLevel=2",), bundled_ptxas="12.9"),
)}


def protocol_for(version: str) -> HookProtocol | None:
    """The row for a Triton version ('3.7.1', '3.7.1+git...'), None for a release nobody read."""
    return PROTOCOLS.get(minor(version) or "")


def triton_ptxas_extra() -> tuple[str, ...]:
    """The flags the running Triton gives ptxas for every cubin (none for a release not in the table),
    so turbo builds and the resource readout assemble as Triton itself would."""
    import triton

    row = protocol_for(triton.__version__)
    return row.ptxas_extra if row is not None else ()
