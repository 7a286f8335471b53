"""benchmarks/engine/fatbin.py: zeroing the GPU code of other architectures in a CUDA library."""

from __future__ import annotations

import os
import random
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "engine"))
import fatbin  # noqa: E402

ENTRY_HEADER = 64


def _entry(kind: int, arch: int, payload: bytes) -> bytes:
    head = bytearray(ENTRY_HEADER)
    struct.pack_into("<HHIQ", head, 0, kind, 0x101, ENTRY_HEADER, len(payload))
    struct.pack_into("<I", head, 28, arch)
    return bytes(head) + payload


def _fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    body = b"".join(_entry(*e) for e in entries)
    return struct.pack("<IHHQ", fatbin.MAGIC, 1, 16, len(body)) + body


def _elf(section: bytes) -> bytes:
    """A minimal ELF64 file: header, the `.nv_fatbin` data, a string table, three section headers."""
    names = b"\0.nv_fatbin\0.shstrtab\0"
    data_off = 64
    str_off = data_off + len(section)
    sh_off = str_off + len(names)
    sh_off += (-sh_off) % 8
    head = bytearray(64)
    head[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", head, 0x28, sh_off)
    struct.pack_into("<HHH", head, 0x3A, 64, 3, 2)

    def sh(name: int, off: int, size: int) -> bytes:
        s = bytearray(64)
        struct.pack_into("<I", s, 0, name)
        struct.pack_into("<QQ", s, 0x18, off, size)
        return bytes(s)

    body = bytes(head) + section + names
    body += bytes(sh_off - len(body))
    return body + sh(0, 0, 0) + sh(1, data_off, len(section)) + sh(11, str_off, len(names))


def _payload(rng: random.Random) -> bytes:
    return bytes(rng.randrange(1, 256) for _ in range(rng.randrange(8, 200)))   # no zero byte: zeroing shows


def test_prune_keeps_the_devices_cubins_and_zeroes_the_rest(tmp_path):
    rng = random.Random()
    keep = rng.choice([80, 90, 100])
    others = [a for a in (75, 80, 86, 89, 90, 100, 120) if a != keep]
    with_native = [(2, keep, _payload(rng)), (1, 80, _payload(rng))] + [(2, a, _payload(rng)) for a in rng.sample(others, 3)]
    ptx_only = [(1, 75, _payload(rng)), (2, rng.choice(others), _payload(rng))]
    section = _fatbin(with_native) + bytes(8) + _fatbin(ptx_only)   # padding between fat binaries
    path = tmp_path / "lib.so"
    path.write_bytes(_elf(section))
    before = path.stat().st_size
    report = fatbin.prune_file(path, keep)
    data = path.read_bytes()
    assert len(data) == before
    kept = [with_native[0][2], ptx_only[0][2]]
    zeroed = [p for _, _, p in with_native[1:]] + [ptx_only[1][2]]
    assert all(p in data for p in kept)
    assert not any(p in data for p in zeroed)
    assert report.kept == {(2, keep): 1, (1, 75): 1}
    assert sum(report.zeroed.values()) == 5 and report.zeroed_bytes == sum(len(p) for p in zeroed)


def test_a_file_without_gpu_code_is_left_alone(tmp_path):
    path = tmp_path / "plain.so"
    blob = _elf(os.urandom(100)).replace(b".nv_fatbin", b".rodata_xx")
    path.write_bytes(blob)
    assert fatbin.prune_file(path, 90) is None
    assert path.read_bytes() == blob
