"""One kernel to build for sm_75 ahead of time, as its launcher specialises it (the fit tests,
`caovan-sm75-kernels check` and the benchmarks' PTX builds all compile from these)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SM75_SHARED_LIMIT = 65536   # bytes of shared memory per block on Turing (opt-in maximum): its one home


@dataclass(frozen=True)
class KernelSpec:
    """`fn` is a Triton JITFunction; `signature` maps every parameter to its Triton type ("constexpr"
    for those in `constexprs`); `divisible` names the parameters Triton's JIT marks 16-divisible
    (None: every pointer, as torch allocations are); `maxnreg` is the launcher's Triton option of
    that name (None: not passed)."""

    name: str
    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int
    divisible: tuple[str, ...] | None = None
    maxnreg: int | None = None
    num_stages: int = 1   # our launchers pass one stage (cp.async, which more stages use, is sm_80-only)
    # What the launcher runs instead when this build comes out plain and cannot launch on Turing
    # (None: this same spec, plain). The check's plain row compiles that one.
    plain_fallback: KernelSpec | None = None

    @property
    def args(self) -> list[str]:
        """Names of the parameters that stay in the compiled kernel's parameter list, in order."""
        return [n for n, t in self.signature.items() if t != "constexpr"]

    @property
    def attrs(self) -> dict:
        """Triton attrs with the divisible parameters marked, as the JIT specialises them."""
        names = self.divisible if self.divisible is not None else [
            n for n, t in self.signature.items() if t.startswith("*")]
        return divisibility_attrs(self.fn, list(names))


def divisibility_attrs(fn: Any, names: list[str] | tuple[str, ...]) -> dict[tuple[int, ...], list]:
    """Triton attrs marking these arguments divisible by 16, as its JIT specialises aligned args."""
    return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}
