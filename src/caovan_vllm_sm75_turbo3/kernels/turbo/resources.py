"""Resource readout for sm_75 builds: ptxas -v (registers, spills) and instruction counts.

Uses the ptxas that Triton bundles (or `TRITON_PTXAS_PATH`), the one Triton itself assembles with,
so the numbers are those of the binary a user's process would load.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

from ...errors import TurboError

PTXAS_TIMEOUT_S = 300

_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"(\d+) bytes stack frame")
_MMA = re.compile(r"^\s*(@!?%\w+\s+)?mma\.sync\.", re.MULTILINE)
_FMA = re.compile(r"^\s*(@!?%\w+\s+)?fma\.rn(\.ftz)?\.f32\b", re.MULTILINE)


class PtxasError(TurboError):
    """ptxas refused the PTX; `str(err)` holds the first lines of its log."""


@dataclass(frozen=True)
class PtxasReport:
    """What ptxas -v says about one kernel."""

    registers: int | None
    spill_bytes: int | None   # spill stores + spill loads
    stack_bytes: int | None
    log: str


def ptxas_path() -> str:
    """The ptxas Triton would use: `TRITON_PTXAS_PATH`, else the one bundled with Triton, else PATH."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(75).path


def run_ptxas(ptx: str, *, arch: int = 75, extra: tuple[str, ...] = ()) -> tuple[bytes, PtxasReport]:
    """Assemble `ptx` for `sm_<arch>` with `-v`; returns the cubin and the parsed report.

    Raises `PtxasError` with ptxas's own message when it refuses the PTX.
    """
    with tempfile.TemporaryDirectory(prefix="caovan-ptxas-") as tmp:
        src, out = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [ptxas_path(), "-lineinfo", "-v", *extra, f"--gpu-name=sm_{arch}", src, "-o", out]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PTXAS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PtxasError(f"ptxas for sm_{arch} ran past {PTXAS_TIMEOUT_S} s") from None
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            head = " | ".join(line.strip() for line in log.splitlines() if "error" in line.lower())[:600]
            raise PtxasError(f"ptxas for sm_{arch} refused the PTX (exit {proc.returncode}): {head or log[:600]}")
        with open(out, "rb") as f:
            cubin = f.read()
    return cubin, parse_ptxas_log(log)


def parse_ptxas_log(log: str) -> PtxasReport:
    """Registers, spill bytes (stores + loads) and stack frame from a ptxas -v log."""
    regs, spill, stack = _REGS.search(log), _SPILL.search(log), _STACK.search(log)
    return PtxasReport(
        registers=int(regs.group(1)) if regs else None,
        spill_bytes=int(spill.group(1)) + int(spill.group(2)) if spill else None,
        stack_bytes=int(stack.group(1)) if stack else None,
        log=log)


def mma_count(ptx: str) -> int:
    """Number of `mma.sync` instructions in the PTX."""
    return len(_MMA.findall(ptx))


def fma_count(ptx: str) -> int:
    """Number of fp32 `fma.rn.f32` instructions in the PTX (where Triton's sm_75 dots go)."""
    return len(_FMA.findall(ptx))


def entry_name(ptx: str) -> str:
    """The kernel's entry name in the PTX."""
    m = re.search(r"\.visible\s+\.entry\s+(\w+)\s*\(", ptx)
    if not m:
        raise ValueError("no .visible .entry in the PTX")
    return m.group(1)
