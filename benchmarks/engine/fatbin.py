"""Drop the GPU code a CUDA extension carries for architectures other than one, to carry it small.

vLLM's `_C.abi3.so` holds cubins for sm_75 ... sm_120 in its `.nv_fatbin` section (84 MB, and
the cubins are compressed already, so xz gains little). The CUDA runtime loads, for a device, the
cubin of its architecture or else JIT-compiles a PTX entry; the other cubins are never read. We
zero their payloads in place (headers, sizes and offsets stay as they were), so the file keeps its
layout and compresses to a fraction. Used only to carry vLLM to the lent GPU; never on a user's
machine.

Layout (little-endian; read off the files, as CUDA documents none of it): a fat binary is a
16-byte header (magic 0xBA55ED50, u16 version, u16 header size, u64 size of what follows), then
entries, each a header (u16 kind: 1 PTX, 2 ELF; u16; u32 header size; u64 payload size; ...;
u32 architecture at byte 28) and its payload.
"""

from __future__ import annotations

import struct
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = 0xBA55ED50
PTX, ELF = 1, 2


@dataclass
class PruneReport:
    """What `prune` kept and zeroed, by (kind, arch): counts and payload bytes."""

    kept: Counter = field(default_factory=Counter)
    zeroed: Counter = field(default_factory=Counter)
    zeroed_bytes: int = 0


def fatbin_section(elf: bytes) -> tuple[int, int] | None:
    """(offset, size) of the `.nv_fatbin` section of an ELF image, or None."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        return None
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    str_off, = struct.unpack_from("<Q", elf, shoff + shstrndx * shentsize + 0x18)
    for i in range(shnum):
        base = shoff + i * shentsize
        name_off, = struct.unpack_from("<I", elf, base)
        end = elf.index(b"\0", str_off + name_off)
        if elf[str_off + name_off:end] == b".nv_fatbin":
            off, size = struct.unpack_from("<QQ", elf, base + 0x18)
            return off, size
    return None


def _entries(data: bytearray | bytes, start: int, end: int):
    """(entry offset, header size, payload size, kind, arch) of each entry in one fat binary."""
    pos = start
    while pos < end:
        kind, _, hsize, psize = struct.unpack_from("<HHIQ", data, pos)
        arch, = struct.unpack_from("<I", data, pos + 28)
        if hsize == 0:
            raise ValueError(f"fat binary entry at {pos} has a zero header size")
        yield pos, hsize, psize, kind, arch
        pos += hsize + psize


def prune_fatbins(data: bytearray, keep_arch: int) -> PruneReport:
    """Zero, in `data` (a `.nv_fatbin` section), every ELF entry not for `keep_arch`, and every PTX
    entry of a fat binary that has an ELF for `keep_arch` (the runtime takes the cubin there)."""
    report = PruneReport()
    pos = 0
    while pos + 16 <= len(data):
        magic, _, hsize, size = struct.unpack_from("<IHHQ", data, pos)
        if magic != MAGIC:
            pos += 8   # fat binaries are 8-byte aligned; padding between them
            continue
        start, end = pos + hsize, pos + hsize + size
        entries = list(_entries(data, start, end))
        has_native = any(kind == ELF and arch == keep_arch for _, _, _, kind, arch in entries)
        for off, eh, psize, kind, arch in entries:
            drop = (kind == ELF and arch != keep_arch) or (kind == PTX and has_native)
            if drop:
                data[off + eh:off + eh + psize] = bytes(psize)
                report.zeroed[(kind, arch)] += 1
                report.zeroed_bytes += psize
            else:
                report.kept[(kind, arch)] += 1
        pos = end
    return report


def prune_file(path: Path, keep_arch: int) -> PruneReport | None:
    """Prune the shared library at `path` in place; None when it has no `.nv_fatbin` section."""
    elf = bytearray(path.read_bytes())
    where = fatbin_section(bytes(elf))
    if where is None:
        return None
    off, size = where
    section = elf[off:off + size]
    report = prune_fatbins(section, keep_arch)
    elf[off:off + size] = section
    path.write_bytes(bytes(elf))
    return report


def strip_symbols(path: Path) -> None:
    """`strip --strip-unneeded` where binutils is there (debug symbols are never needed to run)."""
    subprocess.run(["strip", "--strip-unneeded", str(path)], check=False, capture_output=True)
