"""What one kernel launch costs on this GPU machine, for benchmarks/projection's launch floor.

    python3 benchmarks/launch_overhead.py [--json FILE]

- eager: a tiny in-place kernel launched back to back from Python N times, one sync at the end:
  microseconds a launch (the host's launch path: Python, torch's dispatcher, the driver);
- graph: the same N kernels captured in one CUDA graph and replayed: microseconds a kernel node
  (what a decode step under CUDA graphs pays per kernel on the GPU side).
Best of 5 timings each, after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

N = 2000


def measure(n: int = N, tries: int = 5) -> dict:
    """Per-launch microseconds, eager and graph-replayed, with the card's name."""
    import torch

    x = torch.zeros(1, device="cuda")

    def burst():
        for _ in range(n):
            x.add_(1.0)

    def best(fn) -> float:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(tries):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return min(times) * 1e6 / n

    eager = best(burst)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        burst()   # warm-up on the capture stream
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        burst()
    replayed = best(graph.replay)
    return {"card": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"), "launches": n,
            "eager_us_per_launch": eager, "graph_us_per_kernel": replayed, "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    got = measure()
    print(json.dumps(got, indent=1))
    if a.json:
        a.json.write_text(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
