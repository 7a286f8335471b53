"""The in-engine check of benchmarks/engine (issue: the whole model inside vLLM on a lent GPU), run
here on vLLM's CPU build: the script's requests, logprobs, GDN census, prefix-cache reading and the
comparison, against a real engine. What the CPU cannot show: our kernels (vLLM's own CPU kernels
serve the GDN layers; the plugin says "nothing of ours applies"), CUDA graphs, the sm_75 shim and
any speed. Those need the lent GPU (benchmarks/engine/run_device.sh)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.real_vllm import lane_env
from helpers.tiny_model import write_qwen3_next

pytestmark = pytest.mark.serve

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "benchmarks" / "engine"
sys.path.insert(0, str(ENGINE))
import compare  # noqa: E402
import engine_check  # noqa: E402

RUN_LIMIT_S = 420


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("engine")
    model = write_qwen3_next(root / "hybrid", max_positions=engine_check.CPU_MODEL_LEN)
    out = root / "out"
    out.mkdir()
    modes = {"off": (["--device", "cpu"], {"VLLM_PLUGINS": "no-plugin-of-that-name"}),
             "on": (["--device", "cpu"], {}),
             # vLLM 0.27's CPU build copies GDN states with a Triton kernel when speculation meets
             # prefix caching on a hybrid model; without Triton there, that pair cannot run.
             "on-ngram": (["--device", "cpu", "--ngram", "--no-prefix-caching"], {}),
             "on-long": (["--device", "cpu", "--long-context", "3584", "2560", "--chunk", "1024", "--profile"], {}),
             "on-profile-only": (["--device", "cpu", "--speed", "--profile-only", "--prefill-speed", "1024",
                                  "--long-context", "2560", "--chunk", "1024"], {})}
    logs = {}
    for name, (args, extra) in modes.items():
        env = lane_env(root / f"home-{name}", CAOVAN_FACTS=str(ENGINE / "facts-sm75-proxy.json"), **extra)
        log = root / f"{name}.log"
        with log.open("w") as f:
            proc = subprocess.run([sys.executable, str(ENGINE / "engine_check.py"), "--model", str(model),
                                   "--out", str(out / f"native-{name}.json"), *args],
                                  stdout=f, stderr=subprocess.STDOUT, env=env, timeout=RUN_LIMIT_S,
                                  stdin=subprocess.DEVNULL)
        logs[name] = log.read_text(errors="replace")
        assert proc.returncode == 0, logs[name][-3000:]
    return {"summary": compare.summarize(out, "native"), "out": out, "logs": logs}


def _load(runs: dict, name: str) -> dict:
    import json
    return json.loads((runs["out"] / f"native-{name}.json").read_text())


def test_each_run_answers_every_prompt_with_finite_top_two_logprobs(runs):
    for name in ("off", "on", "on-ngram"):
        run = _load(runs, name)
        assert len(run["completions"]) == 5
        for c in run["completions"]:
            assert len(c["tokens"]) == engine_check.GEN_TOKENS == len(c["steps"])
            for step in c["steps"]:
                assert len(step["top"]) == 2 and step["top"][0][1] >= step["top"][1][1]
                assert all(math.isfinite(lp) for _, lp in step["top"]) and math.isfinite(step["chosen_logprob"])
                assert step["chosen"] == step["top"][0][0]   # greedy takes the best


def test_plugin_on_and_off_are_what_the_runs_say(runs):
    assert _load(runs, "on")["plugin_loaded"] is True
    assert _load(runs, "off")["plugin_loaded"] is False
    assert "Caovan" in runs["logs"]["on"] and "Caovan" not in runs["logs"]["off"]


def test_the_census_finds_every_gdn_layer_and_the_cpu_runs_vllms_own(runs):
    s = runs["summary"]
    assert s["gdn_on"]["gdn_ops"] == s["gdn_off"]["gdn_ops"] == 3   # the tiny Qwen3-Next: 3 GDN + 1 attention
    assert s["gdn_on"]["ours"] == 0 and s["problems"] == ["not every GDN layer ran our prefill in on"]
    assert "gdn_legacy=upstream" in runs["logs"]["on"]


def test_the_repeated_prefix_is_served_from_the_cache_and_outputs_agree(runs):
    s = runs["summary"]
    assert s["prefix_cached_tokens"]["on"] >= engine_check.SHARED_PREFIX // 2
    assert s["prefix_cached_tokens"]["off"] == s["prefix_cached_tokens"]["on"]
    # the whole long prompt again with more: a longer hit than its first SHARED_PREFIX tokens give
    on = _load(runs, "on")["completions"]
    assert on[4]["num_cached_tokens"] > on[2]["num_cached_tokens"]
    # the same vLLM kernels either way: the same tokens and logprobs
    assert s["on_vs_off"]["drift_max"] == 0.0 and all(p["equal"] for p in s["on_vs_off"]["prompts"])
    assert s["ngram_vs_greedy"]["all_explained"], s["ngram_vs_greedy"]


def test_the_long_context_rows_read_the_last_chunk_alone_and_the_kv_capacity(runs):
    rows = _load(runs, "on-long")["long_context"]
    assert [r["tokens"] for r in rows] == [3584, 2560]
    for long in rows:
        # the head (n - 1024 tokens) is cached in every repeat, up to the last whole block the GDN
        # state was kept at
        n = long["tokens"]
        assert len(long["cached_before_last_chunk"]) == engine_check.REPEATS
        assert all(n - 1024 - 1024 < c <= n - 1024 for c in long["cached_before_last_chunk"])
        for key in ("prefill_tok_s", "late_chunk_tok_s", "decode_tok_s"):
            assert 0 < long[key] < float("inf")
        assert long["late_chunk"]["tok_s_min"] <= long["late_chunk_tok_s"] <= long["late_chunk"]["tok_s_max"]
    speed = compare.speed_rows(_load(runs, "on-long"), _load(runs, "on-long"))
    assert {"prefill_whole_3584", "late_chunk_2560", "decode_at_3584"} <= set(speed)
    assert all(row["ratio"] == 1.0 for row in speed.values())
    for name in ("off", "on", "on-long"):
        cap = _load(runs, name)["kv_capacity"]
        assert cap["tokens"] == cap["blocks"] * cap["block_size"] > 0
    assert runs["summary"]["kv_capacity_tokens"]["on"] == runs["summary"]["kv_capacity_tokens"]["off"]


def test_the_profile_rows_hold_each_row_with_its_tables_and_the_weights(runs):
    """--profile on a real vLLM (its CPU build: CPU ops stand in for kernels): every row the
    projection reads, each a table whose sums hold, and the weights by kind."""
    run = _load(runs, "on-long")
    prof = run["profile"]
    assert set(prof) == {"decode_1024", "late_chunk_3584", "decode_at_3584", "late_chunk_2560", "decode_at_2560"}
    for name, row in prof.items():
        assert row["kernels"] and row["launches"] == sum(k["calls"] for k in row["kernels"]) > 0, name
        assert abs(row["gpu_us"] - sum(k["us"] for k in row["kernels"])) < 1e-3 * max(row["gpu_us"], 1)
        assert row["tokens"] == (engine_check.DECODE_TOKENS if name.startswith("decode") else 1024)
        assert 0 < row["wall_s"] < 600
    assert {"matrix", "lm_head", "embedding"} <= set(run["weights"])
    assert all(w["elements"] > 0 and w["bytes"] >= w["elements"] for w in run["weights"].values())


def test_every_run_saved_each_stage_and_finished(runs):
    for name in ("off", "on", "on-ngram", "on-long", "on-profile-only"):
        run = _load(runs, name)
        assert run["finished"] is True and run["stages"][0] == "greedy" and run["stages"][-1] == "end", name
    # each profiled row is saved as it ends, so a run stopped mid-profile keeps the rows it finished
    rows = ("decode_1024", "late_chunk_3584", "decode_at_3584", "late_chunk_2560", "decode_at_2560")
    assert _load(runs, "on-long")["stages"] == ["greedy", "long_context_3584", "long_context_2560",
                                                *(f"profile_{r}" for r in rows), "end"]


def test_profile_only_profiles_each_row_asked_and_times_none_apart(runs):
    """--profile-only (for a start too slow to leave room for timed rows too): the profiled rows of
    --prefill-speed, decode and each --long-context, without the timed speed and long-context rows."""
    run = _load(runs, "on-profile-only")
    assert set(run["profile"]) == {"prefill_1024", "decode_1024", "late_chunk_2560", "decode_at_2560"}
    assert "speed" not in run and "long_context" not in run and "sweep_reference" not in run
    assert run["stages"] == ["greedy", "profile_prefill_1024", "profile_decode_1024", "profile_late_chunk_2560",
                             "profile_decode_at_2560", "end"]
    assert all(row["gpu_us"] > 0 and row["launches"] > 0 for row in run["profile"].values())
