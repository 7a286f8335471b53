"""Pack a vLLM release and what it needs for the lent GPU machine, which has no network and takes
at most 64 MiB per call (the device tool's README). Run here, from the repository root:

    python3 benchmarks/engine/pack.py                 # vLLM 0.21.0: writes .carry/ (ignored by git)
    python3 benchmarks/engine/pack.py --vllm 0.24.0   # the first release that serves our attention backend
    python3 benchmarks/engine/pack.py --vllm 0.34.0 --measure-only   # sizes only, for another release

What it writes:
- `.carry/site.tar.xz`: a `site-packages` for Python 3.12 holding vLLM (its wheel, less the
  compiled FlashAttention extensions (328 MB, unused with TRITON_ATTN; their Python files stay,
  because `fa_utils` imports the package at its top, and the package's `__init__` is made not to
  raise without them), the vendored DeepGEMM, FlashMLA and SM100 attention, the MoE ops and the
  Rust front end, which an offline dense model never loads, and the cubins of every architecture
  but the lent GPU's: see fatbin.py) and the wheels of `carry_wheels_<release>.txt` (less
  xgrammar's static library).
- `.carry/caovan/`: our own wheel, built from this checkout.
- with `--flashinfer`, `.carry/flashinfer.tar.xz`: the FlashInfer release this vLLM pins (its Python
  files, kernel sources and the CUTLASS headers its JIT names; about 3 MiB), for the engine check's
  FLASHINFER modes. FlashInfer compiles its kernels on the device (nvcc_ptx.sh makes them sm_75
  PTX in sm75 mode); its prebuilt cubins and the cuDNN and CuTe DSL packages stay behind (the
  sm_75 FA2 path imports neither).
On the device, `run_device.sh` unpacks them under /tmp and runs the engine check.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fatbin import prune_file, strip_symbols  # noqa: E402

DEVICE_ARCH = 90   # H100 and H200: the cubins the lent machine loads
DEVICE_TORCH = "2.11.0"   # the lent machine's torch (the device tool's KINDS.md); vLLM's _C is built for one
LIMIT = 64 << 20   # the device tool's per-call limit, working tree included
# Parts of the vLLM wheel the offline engine path on a dense hybrid model never imports (vLLM
# imports `_moe_C` (0.21) and `_moe_C_stable_libtorch` (0.24) under a try; their kernels serve MoE
# models only; `vllm-rs` is 0.24's Rust front end for `vllm serve`). Names absent from a release
# are no matter.
DROP = ("vllm/third_party/deep_gemm/", "vllm/third_party/fmha_sm100/", "vllm/_flashmla_C.abi3.so",
        "vllm/_flashmla_extension_C.abi3.so", "vllm/_moe_C.abi3.so", "vllm/_moe_C_stable_libtorch.abi3.so",
        "vllm/vllm-rs")
# vllm_flash_attn: only its Python files travel (fa_utils imports the package at module top).
FLASH_ATTN = "vllm/vllm_flash_attn/"
FLASH_ATTN_INIT = FLASH_ATTN + "__init__.py"
# The guard in that __init__ that raises when neither compiled extension is there (0.21 to 0.24).
FLASH_ATTN_GUARD = "if not (FA2_AVAILABLE or FA3_AVAILABLE):"
FLASH_ATTN_UNGUARDED = "if False:  # pack.py: the extensions were left out on purpose; TRITON_ATTN serves"
# FlashInfer's JIT builds from the sources in its wheel; of CUTLASS it names only these two header
# folders (-isystem in its build.ninja): the examples, Python DSL, tests and tools stay behind.
CUTLASS = "flashinfer/data/cutlass/"
CUTLASS_KEPT = (CUTLASS + "include/", CUTLASS + "tools/util/include/")
FLASHINFER_ARCHIVE = "flashinfer.tar.xz"
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux1_x86_64",
             "manylinux_2_5_x86_64", "linux_x86_64")


def pip(*args: str) -> None:
    """Run pip quietly; its stderr shows only on failure."""
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"pack: pip {' '.join(args[:2])} failed:\n{proc.stderr[-3000:]}")


def cached_wheel(cache: Path, project: str, version: str) -> Path:
    """The wheel of `project` `version` in `cache`, downloaded once."""
    pattern = f"{project.replace('-', '_')}-{version}-*.whl"   # a wheel's file name spells - as _
    found = sorted(cache.glob(pattern))
    if not found:
        pip("download", "-q", "--no-deps", "-d", str(cache), f"{project}=={version}")
        found = sorted(cache.glob(pattern))
    return found[0]


def vllm_wheel(cache: Path, version: str) -> Path:
    """The vLLM wheel of `version` (abi3, one file for every Python 3.8+), downloaded once."""
    return cached_wheel(cache, "vllm", version)


def pin(wheel: Path, package: str) -> str | None:
    """The `package==X` version the wheel's metadata pins (vLLM's compiled ops need that torch;
    its FlashInfer backend that FlashInfer)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        for line in zf.read(meta).decode().splitlines():
            if line.startswith(f"Requires-Dist: {package}=="):
                return line.split("==", 1)[1].split(";")[0].strip()
    return None


def carried(name: str) -> bool:
    """Whether a file of the vLLM wheel travels."""
    if name.startswith(DROP) or "/__pycache__/" in name:
        return False
    return not name.startswith(FLASH_ATTN) or name.endswith(".py")


def unguard_flash_attn(init: Path) -> None:
    """Make vllm_flash_attn's `__init__` import without its compiled extensions. Exits when the
    guard is not where it was in 0.21-0.24 (a later release: read its __init__ first)."""
    text = init.read_text()
    if text.count(FLASH_ATTN_GUARD) != 1:
        sys.exit(f"pack: {init} has not the one guard `{FLASH_ATTN_GUARD}` this script disables; "
                 f"read that file and update FLASH_ATTN_GUARD")
    init.write_text(text.replace(FLASH_ATTN_GUARD, FLASH_ATTN_UNGUARDED))


def unpack_vllm(wheel: Path, site: Path) -> None:
    """vLLM's files, less DROP and the FlashAttention extensions, with its extensions pruned to
    DEVICE_ARCH and stripped."""
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if carried(name):
                zf.extract(name, site)
    if (site / FLASH_ATTN_INIT).is_file():
        unguard_flash_attn(site / FLASH_ATTN_INIT)
    for so in sorted((site / "vllm").glob("*.so")):
        before = so.stat().st_size
        report = prune_file(so, DEVICE_ARCH)
        strip_symbols(so)
        zeroed = f"{report.zeroed_bytes >> 20} MiB of other architectures zeroed" if report else "no GPU code"
        print(f"  {so.name}: {before >> 20} MiB, {zeroed}")


def install_wheels(pins: Path, site: Path, cache: Path) -> None:
    """The pinned dependency wheels for CPython 3.12 on x86-64, unpacked into `site`."""
    wanted = [ln.strip() for ln in pins.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    pip("install", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
        *platforms, "--target", str(site), "--no-compile", "--cache-dir", str(cache / "pip"), *wanted)
    for static in site.glob("xgrammar/lib/*.a"):
        static.unlink()   # a static library for C++ users of xgrammar; Python loads the .so
    for vocab in site.glob("mistral_common/data/tekken_*.json"):
        vocab.unlink()    # Mistral's tokenizer vocabularies, read only for Mistral models
    shutil.rmtree(site / "bin", ignore_errors=True)


def flashinfer_carried(name: str) -> bool:
    """Whether a file of the FlashInfer wheel travels."""
    if "/__pycache__/" in name:
        return False
    return not name.startswith(CUTLASS) or name.startswith(CUTLASS_KEPT)


def pack_flashinfer(version: str, cache: Path, archive: Path) -> None:
    """FlashInfer `version` (one pure-Python wheel), less what its JIT never reads, as `archive`."""
    wheel = cached_wheel(cache, "flashinfer-python", version)
    stage = archive.parent / "stage-flashinfer"
    shutil.rmtree(stage, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if flashinfer_carried(name):
                zf.extract(name, stage / "flashinfer-site")
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        tar.add(stage / "flashinfer-site", arcname="flashinfer-site")
    shutil.rmtree(stage)
    print(f"pack: {archive} {archive.stat().st_size / 2**20:.1f} MiB (FlashInfer {version})")


def build_ours(dest: Path) -> None:
    """Our wheel from this checkout (no dependencies: the device has them)."""
    shutil.rmtree(dest, ignore_errors=True)
    pip("wheel", "-q", "--no-deps", "-w", str(dest), str(HERE.parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm", default="0.21.0", help="the vLLM release to pack (default 0.21.0)")
    parser.add_argument("--wheels", default=None,
                        help="the pinned wheels it needs beside the device's packages "
                             "(default: carry_wheels_<release>.txt beside this script)")
    parser.add_argument("--measure-only", action="store_true",
                        help="pack vLLM alone, print its size and whether the device's torch fits it")
    parser.add_argument("--out", default=".carry", help="folder to write (default .carry, ignored by git)")
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "caovan-carry"),
                        help="where the vLLM wheel and pip's downloads are kept between runs")
    parser.add_argument("--flashinfer", action="store_true",
                        help="also pack the FlashInfer release this vLLM pins (flashinfer.tar.xz), for "
                             "run_device.sh's FLASHINFER modes")
    args = parser.parse_args(argv)
    out, cache = Path(args.out), Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    stage = out / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    site = stage / "site"
    site.mkdir(parents=True)
    wheels = Path(args.wheels) if args.wheels else HERE / f"carry_wheels_{args.vllm}.txt"
    if not args.measure_only and not wheels.is_file():
        sys.exit(f"pack: no list of wheels for vLLM {args.vllm}: {wheels} (write one, or pass --wheels)")
    wheel = vllm_wheel(cache, args.vllm)
    pinned = pin(wheel, "torch")
    print(f"pack: {wheel.name} (needs torch {pinned}; the lent machine has {DEVICE_TORCH})")
    unpack_vllm(wheel, site)
    if not args.measure_only:
        install_wheels(wheels, site, cache)
    archive = out / ("vllm-only.tar.xz" if args.measure_only else "site.tar.xz")
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        tar.add(site, arcname="site")
    shutil.rmtree(stage)
    if args.measure_only:
        print(f"pack: {archive} {archive.stat().st_size / 2**20:.1f} MiB (vLLM alone)")
        return 0 if pinned == DEVICE_TORCH else 2
    (out / FLASHINFER_ARCHIVE).unlink(missing_ok=True)
    if args.flashinfer:
        version = pin(wheel, "flashinfer-python")
        if version is None:
            sys.exit(f"pack: vLLM {args.vllm} pins no flashinfer-python release to pack")
        pack_flashinfer(version, cache, out / FLASHINFER_ARCHIVE)
    build_ours(out / "caovan")
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"pack: {archive} {archive.stat().st_size / 2**20:.1f} MiB; .carry in all {total / 2**20:.1f} MiB "
          f"of the {LIMIT >> 20} MiB a call may carry (the working tree counts too)")
    if pinned != DEVICE_TORCH:
        print(f"pack: vLLM {args.vllm}'s compiled ops need torch {pinned}, which the lent machine lacks "
              f"and which is far larger than a call may carry")
        return 2
    return 0 if total < LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
