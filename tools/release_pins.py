"""Read which torch, Triton and FlashInfer each supported vLLM release ships with, from the wheels' metadata.

For each vLLM release from 0.21 to the newest supported minor (its newest patch on PyPI), read the core
metadata of its x86_64 Linux wheel (PEP 658 `.metadata`: a few KB, no wheel is downloaded): the
`torch==` and `flashinfer-python==` pins. Then read that torch wheel's metadata for its `triton` pin.
The table goes to `src/caovan_vllm_sm75_turbo3/data/vllm_release_pins.json`, which the release table
(policy/vllm_versions.py) reads; a test checks the plan never claims tensor cores on any of them.

    .venv/bin/python tools/release_pins.py            # rewrite the data file
    .venv/bin/python tools/release_pins.py --check    # exit 1 when the committed file differs
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import re
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "caovan_vllm_sm75_turbo3" / "data" / "vllm_release_pins.json"
SIMPLE = "https://pypi.org/simple/{}/"
FIRST, LAST_MINOR = Version("0.21.0"), (0, 34)
WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-.*(manylinux[^-]*x86_64)\.whl$")
TIMEOUT_S = 60


def _get(url: str, accept: str | None = None) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310 (a fixed https host)
        return resp.read(64 * 1024 * 1024)


def linux_wheels(project: str) -> dict[str, list[str]]:
    """version -> URLs of its x86_64 manylinux wheels (cp311 and abi3 first), from the simple index."""
    index = json.loads(_get(SIMPLE.format(project), "application/vnd.pypi.simple.v1+json"))
    out: dict[str, list[str]] = {}
    for f in index["files"]:
        m = WHEEL.match(f["filename"])
        if not m or f.get("yanked"):
            continue
        urls = out.setdefault(m["version"], [])
        preferred = "-cp311-" in f["filename"] or "-abi3-" in f["filename"]
        urls.insert(0, f["url"]) if preferred else urls.append(f["url"])
    return out


class _RemoteFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests (for zipfile)."""

    def __init__(self, url: str) -> None:
        self.url, self.pos = url, 0
        req = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310
            self.size = int(resp.headers["Content-Length"])

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf: Any) -> int:
        end = min(self.pos + len(buf), self.size)
        if end <= self.pos:
            return 0
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310
            data = resp.read(end - self.pos)
        buf[:len(data)] = data
        self.pos += len(data)
        return len(data)


def wheel_metadata(urls: list[str]) -> str:
    """The core metadata of the release: its PEP 658 `.metadata` file, else the METADATA member read
    out of the wheel with range requests (a few hundred KB, not the whole wheel)."""
    for url in urls:
        try:
            return _get(url + ".metadata").decode()
        except urllib.error.HTTPError:
            continue  # an upload without its metadata file: try the next wheel of the release
    with zipfile.ZipFile(io.BufferedReader(_RemoteFile(urls[0]), buffer_size=256 * 1024)) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        return wheel.read(name).decode()


def requirement_pins(metadata: str) -> dict[str, str]:
    """`Requires-Dist: NAME==X` / `NAME~=X` lines (Linux markers or none) -> {name: version spec}."""
    pins: dict[str, str] = {}
    for line in metadata.splitlines():
        m = re.match(r"Requires-Dist: ([A-Za-z0-9_.-]+)\s*(==|~=)\s*([^;\s,]+)(.*)$", line)
        if m and "extra ==" not in m[4] and "Windows" not in m[4] and "Darwin" not in m[4]:
            pins.setdefault(m[1].lower(), m[3] if m[2] == "==" else "~=" + m[3])
    return pins


def newest_patches(versions: list[str]) -> list[str]:
    """The newest final release of each minor from FIRST to LAST_MINOR."""
    best: dict[tuple[int, int], Version] = {}
    for v in map(Version, versions):
        if v.is_prerelease or v.is_devrelease or v < FIRST or v.release[:2] > LAST_MINOR:
            continue
        key = v.release[:2]
        best[key] = max(best.get(key, v), v)
    return [str(best[k]) for k in sorted(best)]


def read_pins() -> dict[str, dict[str, str | None]]:
    """{vllm version: {torch, triton, flashinfer}} for each supported minor's newest patch."""
    vllm_wheels, torch_wheels = linux_wheels("vllm"), linux_wheels("torch")
    rows: dict[str, dict[str, str | None]] = {}
    for version in newest_patches(list(vllm_wheels)):
        pins = requirement_pins(wheel_metadata(vllm_wheels[version]))
        torch = pins.get("torch")
        triton = None
        if torch and torch in torch_wheels:
            triton = requirement_pins(wheel_metadata(torch_wheels[torch])).get("triton")
        rows[version] = {"torch": torch, "triton": triton, "flashinfer": pins.get("flashinfer-python")}
        print(f"vllm {version}: torch {torch}, triton {triton}, flashinfer {rows[version]['flashinfer']}",
              file=sys.stderr)
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    opts = p.parse_args(argv)
    rows = read_pins()
    if opts.check:
        committed = json.loads(DATA.read_text(encoding="utf-8"))["releases"]
        if committed != rows:
            print("data/vllm_release_pins.json is stale: run tools/release_pins.py", file=sys.stderr)
            return 1
        return 0
    data = {"about": "torch, Triton and FlashInfer pinned by each supported vLLM release's Linux x86_64 wheel, "
                     "read from the wheels' core metadata on PyPI (torch's own metadata gives Triton); "
                     "regenerate with tools/release_pins.py.",
            "read": datetime.date.today().isoformat(), "releases": rows}
    DATA.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
