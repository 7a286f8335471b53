"""Runtime checks: pure functions of facts, each PASS / WARN / FAIL with a one-line remedy."""

from __future__ import annotations

from collections.abc import Callable

from ..runtime.facts import Facts
from ..versions import major
from ..runtime.model import ModelFacts
from . import vllm_versions as vv
from .check_result import CheckResult, Status, rollup  # noqa: F401  (callers import these from here)
from .host_checks import host_checks

_GIB = 1024


def sm75_line(facts: Facts) -> str:
    """`N/M`: SM75 GPUs over visible GPUs, as in the `sm75=` status line."""
    return f"{facts.sm75_count}/{len(facts.gpus)}"


def check_gpus(f: Facts) -> CheckResult:
    n, m = f.sm75_count, len(f.gpus)
    if m == 0:
        why = "NVML is not reachable (no driver?)" if f.nvml_ok is False else "none is visible"
        return CheckResult("sm75-gpus", Status.FAIL, f"no NVIDIA GPU: {why}",
                           "install the NVIDIA driver, check CUDA_VISIBLE_DEVICES, or pass --facts FILE "
                           "to plan for another machine")
    names = ", ".join(f"{g.index}:{g.name or '?'} ({g.compute_capability or '?'})" for g in f.gpus)
    if n == 0:
        return CheckResult("sm75-gpus", Status.WARN, f"sm75=0/{m}: no Turing GPU ({names})",
                           "this plugin only acts on SM75 GPUs; it will stay inactive here")
    if n < m:
        return CheckResult("sm75-gpus", Status.WARN, f"sm75={n}/{m}: {names}",
                           "set CUDA_VISIBLE_DEVICES to the Turing GPUs only")
    return CheckResult("sm75-gpus", Status.PASS, f"sm75={n}/{m}: {names}")


def check_mixed(f: Facts) -> CheckResult:
    caps = sorted({g.compute_capability or "?" for g in f.gpus})
    mems = sorted({g.memory_total_mib for g in f.gpus if g.memory_total_mib})
    if len(caps) > 1:
        return CheckResult("mixed-gpus", Status.WARN, "mixed architectures: " + ", ".join(caps),
                           "tensor parallel across architectures runs at the slowest card and JIT "
                           "builds target several; use CUDA_VISIBLE_DEVICES to pick one kind")
    if len(mems) > 1 and (mems[-1] - mems[0]) > 1024:
        return CheckResult("mixed-gpus", Status.WARN,
                           "mixed memory sizes: " + ", ".join(f"{x} MiB" for x in mems),
                           "tensor parallel sizes memory by the smallest card")
    if not f.gpus:
        return CheckResult("mixed-gpus", Status.PASS, "no GPU visible: nothing to mix")
    return CheckResult("mixed-gpus", Status.PASS, f"one kind: {caps[0]}")


def check_torch(f: Facts) -> CheckResult:
    v = f.versions
    if not v.torch:
        return CheckResult("torch", Status.FAIL, "torch is not installed",
                           "install vLLM (it brings its torch) into this environment")
    if not v.torch_cuda:
        return CheckResult("torch", Status.FAIL, f"torch {v.torch} has no CUDA build",
                           "install the CUDA build of torch that your vLLM release pins")
    if v.torch_sm75 is False:
        return CheckResult("torch", Status.FAIL, f"torch {v.torch} (CUDA {v.torch_cuda}) lacks sm_75 kernels",
                           "use an official torch CUDA wheel (CUDA 11.8 to 13.x include sm_75)")
    if v.torch_sm75 is None:
        return CheckResult("torch", Status.WARN, f"torch {v.torch} (CUDA {v.torch_cuda}): sm_75 support unknown",
                           "check that torch.cuda.get_arch_list() contains sm_75")
    return CheckResult("torch", Status.PASS, f"torch {v.torch}, CUDA {v.torch_cuda}, sm_75 kernels")


# Oldest Linux driver branch per CUDA minor (CUDA's compatibility table, without forward-compat).
_DRIVER_FOR_CUDA = {"11.8": 520, "12.0": 525, "12.1": 530, "12.2": 535, "12.3": 545, "12.4": 550,
                    "12.5": 555, "12.6": 560, "12.8": 570, "12.9": 575, "13.0": 580}


def check_driver(f: Facts) -> CheckResult:
    v = f.versions
    if not v.driver:
        return CheckResult("driver", Status.WARN if f.gpus else Status.FAIL, "NVIDIA driver version unknown",
                           "install the NVIDIA driver (nvidia-smi must work)")
    need = _DRIVER_FOR_CUDA.get(v.torch_cuda or "")
    have = major(v.driver)
    if have is None:
        return CheckResult("driver", Status.WARN, f"driver {v.driver}: cannot read its branch")
    if need and have < need:
        return CheckResult("driver", Status.FAIL, f"driver {v.driver} is older than CUDA {v.torch_cuda} needs ({need}+)",
                           f"upgrade the driver to {need} or newer, or use a torch built for an older CUDA")
    return CheckResult("driver", Status.PASS, f"driver {v.driver}")


def check_vllm(f: Facts) -> CheckResult:
    v = f.versions.vllm
    status = vv.support_status(v)
    rng = f"{vv.SUPPORTED_MIN} to {vv.SUPPORTED_MAX_MINOR}.x"
    if status == "unknown":
        return CheckResult("vllm", Status.FAIL, "vLLM is not installed" if not v else f"vLLM version {v!r} unreadable",
                           f"pip install vllm=={vv.REFERENCE} (the reference release)")
    if status == "too-old":
        return CheckResult("vllm", Status.FAIL, f"vLLM {v} is older than we support ({rng})",
                           f"upgrade: pip install vllm=={vv.REFERENCE}")
    if status == "too-new":
        return CheckResult("vllm", Status.WARN, f"vLLM {v} is newer than any release we have read ({rng})",
                           "it may work; our guards apply what the newest known release needs")
    if status in ("reference", "tested"):
        return CheckResult("vllm", Status.PASS, f"vLLM {v} ({status})")
    return CheckResult("vllm", Status.WARN, f"vLLM {v}: supported from its source, not run end to end by us",
                       f"vLLM {vv.REFERENCE} is the reference; report problems with this release")


def check_flashinfer(f: Facts) -> CheckResult:
    fi, mm = f.versions.flashinfer, vv.minor(f.versions.vllm)
    pins = vv.release_pins(f.versions.vllm)
    good = pins.flashinfer if pins else None
    if not f.gpus and not fi:   # FlashInfer is CUDA-only: nothing to advise where no NVIDIA GPU is visible
        return CheckResult("flashinfer", Status.PASS, "not needed: no NVIDIA GPU visible")
    if not fi:
        return CheckResult("flashinfer", Status.WARN, "flashinfer is not installed",
                           f"pip install flashinfer-python=={good}" if good else "vLLM falls back to other kernels")
    if good is None:
        return CheckResult("flashinfer", Status.WARN, f"flashinfer {fi}: no known-good pairing for vLLM {f.versions.vllm}",
                           "use the flashinfer version that your vLLM release requires")
    if fi != good:
        return CheckResult("flashinfer", Status.WARN, f"flashinfer {fi}; vLLM {mm} was built with {good}",
                           f"pip install flashinfer-python=={good}")
    return CheckResult("flashinfer", Status.PASS, f"flashinfer {fi} (known good with vLLM {mm})")


def check_toolchain(f: Facts) -> CheckResult:
    v, t = f.versions, f.toolchain
    if not t.ptxas_path:
        return CheckResult("toolchain", Status.WARN, "no ptxas found (PATH, TRITON_PTXAS_PATH, triton's own)",
                           "install triton (it bundles ptxas) or set TRITON_PTXAS_PATH")
    parts = [f"ptxas {v.ptxas or '?'}"]
    if not t.nvcc_path:
        return CheckResult("toolchain", Status.WARN, parts[0] + "; no nvcc",
                           "JIT builds (FlashInfer sampler, torch extensions) need nvcc; the sampler guard keeps them off")
    parts.append(f"nvcc {v.nvcc or '?'}")
    if v.nvcc and v.torch_cuda and major(v.nvcc) != major(v.torch_cuda):
        return CheckResult("toolchain", Status.WARN, ", ".join(parts) + f" vs torch CUDA {v.torch_cuda}",
                           "JIT builds mix CUDA toolchains and often fail: point CUDA_HOME at a "
                           f"CUDA {v.torch_cuda} toolkit or keep the sampler guard on")
    return CheckResult("toolchain", Status.PASS, ", ".join(parts))


# Host memory below which a start fails our check (model load and JIT were OOM-killed there), and
# below which it warns. A launch profile's documented minimum may not be below the first
# (policy/profile_validate.py holds every bundled profile to it).
HOST_MEMORY_FAIL_GIB = 32
HOST_MEMORY_WARN_GIB = 64


def check_host_memory(f: Facts) -> CheckResult:
    total = f.host.memory_total_mib
    if total is None:
        return CheckResult("host-memory", Status.WARN, "host memory unknown")
    avail = f.host.memory_available_mib
    detail = f"{total / _GIB:.0f} GiB total, " + ("available unknown" if avail is None else
                                                   f"{avail / _GIB:.0f} GiB available")
    if total < HOST_MEMORY_FAIL_GIB * _GIB:
        return CheckResult("host-memory", Status.FAIL, detail + f" (< {HOST_MEMORY_FAIL_GIB} GiB)",
                           f"model load and JIT have been OOM-killed below {HOST_MEMORY_FAIL_GIB} GiB: add RAM or swap")
    if total < HOST_MEMORY_WARN_GIB * _GIB:
        return CheckResult("host-memory", Status.WARN, detail + f" (< {HOST_MEMORY_WARN_GIB} GiB)",
                           "keep other programs closed during load; add swap as a cushion")
    return CheckResult("host-memory", Status.PASS, detail)


def check_checkpoint(f: Facts, model: ModelFacts) -> CheckResult:
    size = model.size_bytes   # the weight files, else the index's total: what the launcher reads
    if not model.is_dir:
        return CheckResult("checkpoint", Status.WARN, f"{model.path}: not a local model directory",
                           "pass the model directory to size the checkpoint")
    if size is None:
        return CheckResult("checkpoint", Status.WARN, f"{model.path}: no weight files and no "
                           "model.safetensors.index.json: checkpoint size unknown",
                           "pass the directory that holds the weights")
    gib = size / 2**30
    avail = (f.host.memory_available_mib or 0) / _GIB
    room = ((f.host.memory_total_mib or 0) + (f.host.swap_total_mib or 0)) / _GIB
    source = "" if model.checkpoint_bytes else " (from model.safetensors.index.json: no weight files here)"
    if f.host.memory_total_mib is not None and gib > room:
        return CheckResult("checkpoint", Status.FAIL, f"checkpoint {gib:.1f} GiB{source} > RAM + swap {room:.0f} GiB",
                           "add swap or RAM, or use a smaller quantised checkpoint")
    if f.host.memory_available_mib is not None and gib > avail:
        return CheckResult("checkpoint", Status.WARN, f"checkpoint {gib:.1f} GiB{source} > free memory {avail:.0f} GiB",
                           "close other programs before loading; the load may swap")
    if f.host.memory_available_mib is None:
        return CheckResult("checkpoint", Status.PASS, f"checkpoint {gib:.1f} GiB{source} fits RAM + swap {room:.0f} GiB "
                           "(free memory unknown)")
    return CheckResult("checkpoint", Status.PASS, f"checkpoint {gib:.1f} GiB{source} fits free memory {avail:.0f} GiB")


MACHINE_CHECKS: tuple[Callable[[Facts], CheckResult], ...] = (
    check_gpus, check_mixed, check_driver, check_torch, check_vllm, check_flashinfer,
    check_toolchain, check_host_memory)


def run_checks(facts: Facts, model: ModelFacts | None = None) -> list[CheckResult]:
    """All checks for `facts` (and the model directory when given), in report order; the host
    checks (CPU governor, PCIe, power, throttling, P2P) last, and only for what the facts know."""
    results = [c(facts) for c in MACHINE_CHECKS]
    if model is not None:
        results.append(check_checkpoint(facts, model))
    return results + host_checks(facts)
