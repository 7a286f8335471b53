"""The launch profile's KV cache format and attention backend: fp8 KV only where a backend serves it on SM75."""

from __future__ import annotations

from typing import Any

from ..kernels.attention.configs import FP8_CACHE_DTYPES
from . import vllm_versions as vv
from .attention import (OUR_BACKEND, backend_serves_fp8_kv, drafter_backend_needed, fp8_kv_backends,
                        fp8_kv_on_sm75, our_backend_problem, vllm_fp8_kv_on_sm75)
from .engine_proofs import MTP_FP8_KV, gap_for, proof_for
from .drafter import DRAFTER_WHY, named_backend, user_speculative_config
from .fill_decode import SpecChoice
from .fill_base import Filler
from .turbo import TurboDecision

KV_BYTES = dict.fromkeys(FP8_CACHE_DTYPES, 1)  # anything else: the fp16 model dtype, 2 bytes


def fill_kv_cache_dtype(f: Filler, launch: dict[str, Any], version: str | None, turbo: TurboDecision,
                        spec: SpecChoice | None = None) -> str:
    """KV cache dtype: fp8 only where a backend serves it on SM75 (vLLM's, or ours from 0.24), and with
    MTP (`spec`) only where its drafter can be given a backend for it and our engine check proved
    that pair (data/engine_proofs.json). Returns the effective one."""
    kv_pref = launch.get("kv_cache_dtype")
    backend = f.user_value("--attention-backend")
    refused = isinstance(backend, str) and not backend_serves_fp8_kv(version, backend, turbo)
    if kv_pref:
        served = kv_pref in KV_BYTES and fp8_kv_on_sm75(version, turbo)
        without = _fp8_without_mtp(f, kv_pref, version, spec) if served else None
        if served and refused:
            f.fill("--kv-cache-dtype", "auto", f"the profile asks {kv_pref}, but your --attention-backend {backend} "
                   f"(kept as given) does not serve fp8 KV on SM75 with vLLM {version}: fp16 KV; "
                   f"{_fp8_backends(version, turbo)} serves it")
        elif without:
            f.fill("--kv-cache-dtype", "auto", without)
        elif kv_pref in KV_BYTES and not served:
            f.fill("--kv-cache-dtype", "auto", f"the profile asks {kv_pref}, but vLLM {version} has no attention "
                   "backend for fp8 KV on SM75 (FlashInfer is refused below SM80 and Triton attention rejects "
                   f"fp8 below SM89 from 0.24) and ours cannot serve it: {our_backend_problem(version, turbo)}: "
                   "fp16 KV")
        elif kv_pref in KV_BYTES and not vllm_fp8_kv_on_sm75(version):
            f.fill("--kv-cache-dtype", kv_pref, f"fp8 KV halves the cache; vLLM {version} refuses it on SM75, our "
                   f"attention backend ({OUR_BACKEND}, Turbo tensor cores) serves it")
        else:
            why = ("fp8 KV halves the cache; vLLM " + str(version) + " serves it on SM75"
                   if kv_pref in KV_BYTES else "the model dtype")
            f.fill("--kv-cache-dtype", kv_pref, why)
    kv_given = f.user_value("--kv-cache-dtype")
    if isinstance(kv_given, str) and kv_given in KV_BYTES and not fp8_kv_on_sm75(version, turbo):
        f.warnings.append(f"--kv-cache-dtype {kv_given} kept as given, but vLLM {version} has no backend that "
                          "serves fp8 KV on SM75: the start will fail")
    elif isinstance(kv_given, str) and kv_given in KV_BYTES and refused:
        f.warnings.append(f"--kv-cache-dtype {kv_given} and --attention-backend {backend} kept as given, but that "
                          f"backend does not serve fp8 KV on SM75 with vLLM {version}: the start will fail; "
                          f"{_fp8_backends(version, turbo)} serves it")
    return f.effective("--kv-cache-dtype") or "auto"


def _fp8_backends(version: str | None, turbo: TurboDecision) -> str:
    """The --attention-backend values that serve fp8 KV on SM75 with this release, for a fix line."""
    return " or ".join(f"--attention-backend {b}" for b in fp8_kv_backends(version, turbo))


def _fp8_without_mtp(f: Filler, kv: str, version: str | None, spec: SpecChoice | None) -> str | None:
    """Why the profile's fp8 KV is not filled beside this launch's MTP (None: it may be)."""
    need = drafter_backend_needed(version, kv) if spec is not None and spec.draft else None
    if need is None or f.given("--kv-cache-dtype"):
        return None
    if spec is not None and spec.user_given and named_backend(user_speculative_config(f.user)) != need:
        return (f"the profile asks {kv} KV, but your --speculative-config names no attention_backend {need}: "
                f"{DRAFTER_WHY}, so its drafter would not start: fp16 KV; add \"attention_backend\":\"{need}\" "
                "to it to have fp8 KV")
    if proof_for(MTP_FP8_KV, version, need, kv) is None:
        return (f"the profile asks {kv} KV, but with MTP the drafter needs our backend for it ({DRAFTER_WHY}), "
                f"and our engine check has not proved MTP with fp8 KV on vLLM {version}"
                f"{gap_for(MTP_FP8_KV, version, need, kv)}: fp16 KV, MTP kept for decode; pass "
                f"--kv-cache-dtype {kv} to have fp8 (the drafter then gets our backend)")
    return None


def fill_attention_backend(f: Filler, launch: dict[str, Any], version: str | None, kv: str) -> None:
    """The profile's attention backend: ours where fp8 KV rests on it, Triton where this release
    refuses FlashInfer on SM75. `kv` is the effective KV cache dtype."""
    backend = launch.get("attention_backend")
    if not backend:
        return
    if kv in KV_BYTES and not vllm_fp8_kv_on_sm75(version):
        f.fill("--attention-backend", OUR_BACKEND, f"fp8 KV on SM75 with vLLM {version}: our attention backend, "
               "registered as CUSTOM (vLLM's TRITON_ATTN with our kernel and fp8 cache write)")
    elif backend == "FLASHINFER" and not vv.has("flashinfer-on-sm75", version):
        f.fill("--attention-backend", "TRITON_ATTN", f"the profile asks FLASHINFER, refused below SM80 in "
               f"vLLM {version}: Triton attention, the backend left on SM75")
    else:
        f.fill("--attention-backend", backend, "FlashInfer runs on SM75 up to vLLM 0.23 (FLASH_ATTN needs SM80); "
               "named so a broken FlashInfer fails at start instead of switching silently"
               if backend == "FLASHINFER" else "the profile's attention backend")
