"""benchmarks/engine/kernel_profile.py: the per-kernel tables the projection reads (pure Python)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "engine"))
import kernel_profile  # noqa: E402


def _events(rng: random.Random, names: list[str], n: int) -> list[tuple[str, float]]:
    return [(rng.choice(names), rng.uniform(1.0, 50.0)) for _ in range(n)]


def test_table_sums_calls_and_time_per_name() -> None:
    rng = random.Random(11)
    events = _events(rng, ["gemm", "gdn_state", "rms_norm", "x" * 400], 300)
    t = kernel_profile.table(events)
    assert sum(r["calls"] for r in t.values()) == len(events)
    assert abs(sum(r["us"] for r in t.values()) - sum(us for _, us in events)) < 1e-6
    assert all(len(name) <= kernel_profile.NAME_CHARS for name in t)


def test_difference_is_what_the_longer_run_added() -> None:
    rng = random.Random(12)
    names = ["gemm", "attn", "sample", "norm"]
    base = _events(rng, names, 100)
    extra = _events(rng, names[:2], 40)
    d = kernel_profile.difference(kernel_profile.table(base + extra), kernel_profile.table(base))
    want = kernel_profile.table(extra)
    assert set(d) == set(want)
    for name, row in want.items():
        assert d[name]["calls"] == row["calls"]
        assert abs(d[name]["us"] - row["us"]) < 1e-6


def test_row_orders_by_time_and_totals() -> None:
    t = {"a": {"calls": 2, "us": 3.0}, "b": {"calls": 1, "us": 9.0}}
    r = kernel_profile.row(t, 256, 0.5)
    assert [k["name"] for k in r["kernels"]] == ["b", "a"]
    assert r["gpu_us"] == 12.0 and r["launches"] == 3 and r["tokens"] == 256
