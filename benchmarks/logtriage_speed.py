"""How fast `caovan-sm75-doctor --log` reads a long-running server's log, and whether memory stays flat.

Builds a log of SIZE_MB for each MIX with a fixed seed, then times the real command on it in a fresh
process and reads its peak RSS. The mixes (`--mix all` runs each):

- service: the lines of a real vLLM 0.27 run (tests/data/logs/real_vllm027_healthy_facts.log: access
  lines, start-up lines, our banner) with 30 % of vLLM's long metric lines: a server that ran long.
- access: only access lines, with new ports, paths and statuses (2xx, 4xx).
- startup: only that run's lines that are neither access nor metric lines (start-up messages).
- unique: every line of its own shape (random words and numbers at INFO level): nothing repeats.
- requests: vLLM's `--enable-log-requests` lines: each prompt and its token ids new, 0.5-4 KB.
- warnings: WARNING lines (every one is read in full).
- tracebacks: 40-frame tracebacks logged by a worker that stays up (every line is read in full).
- colour: the service mix with ANSI colours, as `docker logs` of a terminal keeps them.

    python benchmarks/logtriage_speed.py [--size-mb 50] [--repeats 3] [--mix service|...|all] [--json]

Target (issue 29): at least 20 MB/s on the 2-core CI machine for any mix of lines, memory flat.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "logs" / "real_vllm027_healthy_facts.log"
METRIC = ("(APIServer pid=7) INFO 12-05 02:00:00 [loggers.py:259] Engine 000: Avg prompt throughput: 1234.5 tokens/s, "
          "Avg generation throughput: 98.7 tokens/s, Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 12.3%, "
          "Prefix cache hit rate: 45.6%\n")
WORDS = ("model", "request", "tokens", "cache", "block", "worker", "scheduler", "batch", "prefix", "layer",
         "kernel", "stream", "queue", "memory", "engine", "config", "shape", "graph", "chunk", "step")


def _service(rng: random.Random) -> Callable[[], str]:
    lines = SOURCE.read_text().splitlines(keepends=True)
    return lambda: METRIC if rng.random() < 0.3 else rng.choice(lines)


def _access(rng: random.Random) -> Callable[[], str]:
    paths = ("/v1/completions", "/v1/chat/completions", "/health", "/v1/models", "/metrics")
    return lambda: (f"(APIServer pid=7) INFO:     127.0.0.1:{rng.randrange(1024, 65536)} - "
                    f"\"{rng.choice(('GET', 'POST'))} {rng.choice(paths)} HTTP/1.1\" "
                    f"{rng.choice((200, 200, 200, 404, 400))} OK\n")


def _startup(rng: random.Random) -> Callable[[], str]:
    lines = [ln for ln in SOURCE.read_text().splitlines(keepends=True)
             if "HTTP/" not in ln and "throughput" not in ln]
    return lambda: rng.choice(lines)


def _unique(rng: random.Random) -> Callable[[], str]:
    def line() -> str:
        words = " ".join(rng.choice(WORDS) + rng.choice(("", "=", ":", "_", ".")) * rng.randrange(2)
                         for _ in range(rng.randrange(4, 16)))
        return f"(EngineCore_DP0 pid=42) INFO 12-05 02:00:00 [{rng.choice(WORDS)}.py:{rng.randrange(999)}] {words}\n"
    return line


def _requests(rng: random.Random) -> Callable[[], str]:
    def line() -> str:
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(30, 300)))
        ids = ", ".join(str(rng.randrange(152_000)) for _ in range(rng.randrange(40, 400)))
        return (f"(APIServer pid=7) INFO 12-05 02:00:00 [logger.py:49] Received request cmpl-{rng.getrandbits(64):016x}-0: "
                f"prompt: '{prompt}', params: SamplingParams(n=1, temperature=0.7, top_p=0.8, max_tokens="
                f"{rng.randrange(16, 2048)}), prompt_token_ids: [{ids}], lora_request: None.\n")
    return line


def _warnings(rng: random.Random) -> Callable[[], str]:
    return lambda: (f"(EngineCore_DP0 pid=42) WARNING 12-05 02:00:00 [{rng.choice(WORDS)}.py:{rng.randrange(999)}] "
                    f"{rng.choice(WORDS)} {rng.choice(WORDS)} is slow: {rng.random():.3f} s\n")


def _tracebacks(rng: random.Random) -> Callable[[], str]:
    frames = ["(APIServer pid=7) Traceback (most recent call last):\n"]
    frames += [f'(APIServer pid=7)   File "/venv/lib/python3.12/site-packages/vllm/{w}.py", line {n}, in {w}_fn\n'
               f"(APIServer pid=7)     return {w}_fn(*args, **kwargs)\n" for n, w in enumerate(WORDS * 2)]
    frames.append("(APIServer pid=7) ValueError: the request's prompt is too long\n")
    block = "".join(frames)
    return lambda: block


def _colour(rng: random.Random) -> Callable[[], str]:
    plain = _service(rng)
    return lambda: "\x1b[32m" + plain().replace(" INFO ", " INFO\x1b[0m ", 1)


MIXES: dict[str, Callable[[random.Random], Callable[[], str]]] = {
    "service": _service, "access": _access, "startup": _startup, "unique": _unique, "requests": _requests,
    "warnings": _warnings, "tracebacks": _tracebacks, "colour": _colour}


def build(path: Path, size_mb: int, mix: str = "service") -> int:
    """Write the log of one mix; returns its size in bytes."""
    pick = MIXES[mix](random.Random(1))
    size, limit = 0, size_mb * 1_000_000
    with open(path, "w") as f:
        while size < limit:
            line = pick()
            f.write(line)
            size += len(line)
    return size


def run_once(path: Path) -> tuple[float, int]:
    """(seconds, peak RSS in KiB of the child) for one `caovan-sm75-doctor --log`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.doctor", "--log", str(path)],
                       capture_output=True, text=True, timeout=3600)
    took = time.monotonic() - start
    if r.returncode not in (0, 1, 2):   # 2: the log shows a failure (the tracebacks mix)
        raise SystemExit(f"doctor --log failed ({r.returncode}): {r.stderr[-500:]}")
    return took, max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)


def measure(mix: str, size_mb: int, repeats: int) -> dict[str, object]:
    """Build one mix's log in a temporary folder and time the command on it `repeats` times."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / f"{mix}.log"
        size = build(log, size_mb, mix)
        runs = [run_once(log) for _ in range(repeats)]
    best = min(t for t, _ in runs)
    return {"mix": mix, "bytes": size, "seconds": [round(t, 3) for t, _ in runs],
            "mb_per_s_best": round(size / best / 1e6, 2), "peak_rss_kib": max(r for _, r in runs),
            "target_mb_per_s": 20}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mix", choices=[*MIXES, "all"], default="service", help="which lines the log holds")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    results = []
    for mix in (MIXES if args.mix == "all" else [args.mix]):
        r = measure(mix, args.size_mb, args.repeats)
        results.append(r)
        if not args.json:
            print(f"{mix:>10}: {args.size_mb} MB in {min(r['seconds']):.2f} s (best of {args.repeats}): "
                  f"{r['mb_per_s_best']} MB/s, peak RSS {r['peak_rss_kib'] / 1024:.0f} MiB; target 20 MB/s",
                  flush=True)
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
