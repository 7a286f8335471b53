"""Per-kernel GPU time of the engine rows, from torch's profiler: what benchmarks/projection reads.

With `engine_check.py --profile`, after the timed rows, each engine row runs once more under
`torch.profiler` (CUDA activity only: kernels, copies and sets, inside CUDA graph replays too):
- `prefill_N`: a fresh N-token prompt, one token out (every chunk of --chunk);
- `decode_1024`, `decode_at_N`: the kernels of DECODE_TOKENS decode steps, as the difference of
  two runs on the same cached prompt (DECODE_TOKENS + 1 tokens out, less 1 token out);
- `late_chunk_N`: the last --chunk tokens of an N-token prompt whose head is cached.
A row holds every kernel name with its calls and GPU microseconds, their sums, the tokens the row
stands for and the profiled call's wall time (the profiler adds a little to it; the timed rows
are the speed numbers).

Pure Python but for `profiled` (the unit tests run the table logic on the CPU).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

NAME_CHARS = 240   # template-heavy kernel names are cut here; the head names the kernel


def table(events: Iterable[tuple[str, float]]) -> dict[str, dict[str, float]]:
    """(kernel name, GPU microseconds) events -> {name: {"calls", "us"}}."""
    out: dict[str, dict[str, float]] = {}
    for name, us in events:
        row = out.setdefault(name[:NAME_CHARS], {"calls": 0, "us": 0.0})
        row["calls"] += 1
        row["us"] += us
    return out


def difference(more: dict[str, dict[str, float]], less: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The kernels `more` ran beyond `less` (calls and time; names whose calls do not grow drop out)."""
    out = {}
    for name, row in more.items():
        base = less.get(name, {"calls": 0, "us": 0.0})
        calls = row["calls"] - base["calls"]
        if calls > 0:
            out[name] = {"calls": calls, "us": max(row["us"] - base["us"], 0.0)}
    return out


def row(kernels: dict[str, dict[str, float]], tokens: int, wall_s: float) -> dict[str, Any]:
    """One profiled row: kernels sorted by time, their sums, the tokens and the wall time."""
    ordered = sorted(({"name": n, **r} for n, r in kernels.items()), key=lambda r: -r["us"])
    return {"tokens": tokens, "wall_s": wall_s, "gpu_us": sum(r["us"] for r in ordered),
            "launches": sum(r["calls"] for r in ordered), "kernels": ordered}


def profiled(run: Callable[[], Any]) -> tuple[dict[str, dict[str, float]], float]:
    """run() under torch's profiler: its GPU events as a table, and its wall seconds. Without a GPU
    (vLLM's CPU build, the serve lane) the table holds the CPU ops' own time instead."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        run()
        sync()
        wall = time.perf_counter() - t0
    if gpu:
        events = [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]
    else:
        events = [(e.name, e.self_cpu_time_total) for e in prof.events() if e.device_type == DeviceType.CPU]
    return table(events), wall
