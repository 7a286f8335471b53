"""Crafted facts for hardware we do not have: the 2 x 2080 Ti 22G reference machine and its variations."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

_TI = {"name": "NVIDIA GeForce RTX 2080 Ti", "compute_capability": "7.5", "memory_total_mib": 22528}
_BASE: dict[str, Any] = {
    "gpus": [dict(_TI, index=0), dict(_TI, index=1)],
    "host": {"memory_total_mib": 65536, "memory_available_mib": 60000, "swap_total_mib": 8192, "cpu_count": 12},
    "versions": {"python": "3.11.7", "torch": "2.11.0", "torch_cuda": "13.0", "torch_sm75": True,
                 "triton": "3.6.0", "vllm": "0.21.0", "flashinfer": "0.6.8.post1",
                 "nvcc": "13.0", "ptxas": "13.0", "driver": "580.95.05"},
    "toolchain": {"nvcc_path": "/usr/local/cuda/bin/nvcc", "ptxas_path": "/usr/local/cuda/bin/ptxas"},
}


def facts_dict(**changes: Any) -> dict[str, Any]:
    """The 2 x 2080 Ti 22G / 64 GiB reference machine, with top-level sections replaced or merged.

    `gpus=[...]` replaces the list; `host={...}` / `versions={...}` merge into that section.
    """
    data = copy.deepcopy(_BASE)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    return data


T4 = {"name": "Tesla T4", "compute_capability": "7.5", "memory_total_mib": 15360}
RTX3090 = {"name": "NVIDIA GeForce RTX 3090", "compute_capability": "8.6", "memory_total_mib": 24576}
TI22 = _TI

# The reference launch from the field (issue 3), as a user types it after caovan-vllm-serve.
REFERENCE = [
    "/data/qwen/Qwen3.6-27B-AWQ-INT4", "--host", "0.0.0.0", "--port", "8000",
    "--served-model-name", "Qwen3.6-27B-AWQ-INT4", "--tensor-parallel-size", "2", "--dtype", "half",
    "--max-model-len", "262144", "--max-num-seqs", "2", "--max-num-batched-tokens", "8192",
    "--kv-cache-dtype", "fp8", "--disable-custom-all-reduce", "--enable-prefix-caching",
    "--mamba-cache-mode", "align",
    "--additional-config", '{"caovan":true,"caovan_mode":"auto","caovan_require_turbo3":true}',
    "--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]
