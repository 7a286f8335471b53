"""benchmarks/engine/compare.py: how plugin-on and plugin-off engine runs are judged (pure Python)."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "engine"))
import compare  # noqa: E402


def _run(rng: random.Random, tokens: list[int], margin: float = 1.0, noise: float = 0.0,
         second: list[int] | None = None) -> dict:
    """A completion whose step k chose tokens[k] with logprob lp and had second[k] `margin` below."""
    steps = []
    for k, tok in enumerate(tokens):
        lp = -rng.uniform(0.1, 3.0)
        other = second[k] if second else tok + 1
        steps.append({"chosen": tok, "chosen_logprob": lp + noise, "top": [[tok, lp + noise], [other, lp - margin]]})
    return {"tokens": tokens, "steps": steps, "num_cached_tokens": 0}


def _pair_with_divergence(rng: random.Random, n: int, at: int, margin: float, drift: float):
    """Two runs equal up to `at`, with chosen-token logprobs `drift` apart, parting at `at` where each
    run's pick is the other's second choice by `margin`."""
    base = [rng.randrange(100, 1000) for _ in range(n)]
    a_tokens = list(base)
    b_tokens = base[:at] + [base[at] + 7] + [rng.randrange(100, 1000) for _ in range(n - at - 1)]
    a = _run(random.Random(1), a_tokens, margin=1.0)
    b = _run(random.Random(1), b_tokens, margin=1.0, noise=drift)
    a["steps"][at]["top"][1] = [b_tokens[at], a["steps"][at]["chosen_logprob"] - margin]
    b["steps"][at]["top"][1] = [a_tokens[at], b["steps"][at]["chosen_logprob"] - margin]
    return a, b


def test_equal_runs_are_equal_with_zero_tolerance():
    rng = random.Random()
    toks = [rng.randrange(1000) for _ in range(rng.randrange(5, 40))]
    a = {"completions": [_run(random.Random(3), toks)]}
    r = compare.compare_runs(a, json.loads(json.dumps(a)))
    assert r["all_explained"] and r["drift_max"] == 0.0 and r["prompts"][0]["equal"]


@pytest.mark.parametrize("margin_scale,explained", [(0.5, True), (3.0, False)])
def test_a_divergence_is_explained_only_by_a_margin_within_twice_the_drift(margin_scale, explained):
    rng = random.Random()
    drift = rng.uniform(1e-3, 1e-2)
    n, at = 30, rng.randrange(5, 25)
    a, b = _pair_with_divergence(rng, n, at, margin=margin_scale * 2 * drift, drift=drift)
    r = compare.compare_runs({"completions": [a]}, {"completions": [b]})
    v = r["prompts"][0]
    assert v["first_divergence"] == at and not v["equal"]
    assert math.isclose(r["drift_max"], drift, rel_tol=1e-9)
    assert v["explained"] is explained and r["all_explained"] is explained


def test_a_divergence_to_a_token_outside_the_top_two_is_never_explained():
    rng = random.Random()
    a, b = _pair_with_divergence(rng, 20, 10, margin=1e-9, drift=0.5)
    b["steps"][10]["top"][1] = [123456, -50.0]   # a's token is not among b's two best
    v = compare.compare_runs({"completions": [a]}, {"completions": [b]})["prompts"][0]
    assert v["margin_b"] is None and not v["explained"]


def test_a_nan_logprob_fails_the_comparison():
    rng = random.Random()
    toks = [rng.randrange(1000) for _ in range(10)]
    a, b = _run(random.Random(2), toks), _run(random.Random(2), toks)
    b["steps"][rng.randrange(10)]["chosen_logprob"] = float("nan")
    r = compare.compare_runs({"completions": [a]}, {"completions": [b]})
    assert not r["all_explained"] and "NaN" in r["problem"]


def test_runs_of_different_lengths_are_not_equal():
    toks = [5, 6, 7, 8]
    r = compare.compare_runs({"completions": [_run(random.Random(1), toks)]},
                             {"completions": [_run(random.Random(1), toks[:3])]})
    assert not r["prompts"][0]["equal"]


def _write(outdir: Path, name: str, gdn_ops: int, ours: int, calls: list[int], completions: list[dict],
           tok_s: float | None = None) -> None:
    run = {"census": {"gdn_ops": gdn_ops, "ours": ours}, "gdn_calls_after_greedy": calls,
           "completions": completions}
    if tok_s is not None:
        run["speed"] = {"prefill_8192": {"tok_s": tok_s}}
    (outdir / f"native-{name}.json").write_text(json.dumps(run))


def _completions(rng: random.Random, cached: int) -> list[dict]:
    out = [_run(random.Random(i), [rng.randrange(1000) for _ in range(8)]) for i in range(4)]
    out[2]["num_cached_tokens"] = cached
    return out


def test_summary_of_a_good_call_has_no_problem_and_quotes_the_speed_ratio(tmp_path):
    rng = random.Random()
    comps = _completions(rng, cached=2048)
    on_s, off_s = rng.uniform(1e3, 1e5), rng.uniform(1e3, 1e5)
    _write(tmp_path, "on", 6, 6, [3] * 6, comps, on_s)
    _write(tmp_path, "off", 6, 0, [], comps, off_s)
    _write(tmp_path, "on-ngram", 6, 6, [3] * 6, comps)
    s = compare.summarize(tmp_path, "native")
    assert s["problems"] == []
    assert math.isclose(s["speed"]["prefill_8192"]["ratio"], on_s / off_s)
    assert s["gdn_on"]["all_served"] and s["prefix_cached_tokens"] == {"on": 2048, "off": 2048}


@pytest.mark.parametrize("fault,words", [
    ("layer_not_ours", "not every GDN layer ran our prefill"),
    ("layer_never_called", "not every GDN layer ran our prefill"),
    ("ours_when_off", "our prefill ran with the plugin off"),
    ("no_cache_hit", "prefix cache"),
    ("off_missing", "wrote no result"),
])
def test_summary_names_each_fault(tmp_path, fault, words):
    rng = random.Random()
    comps = _completions(rng, cached=0 if fault == "no_cache_hit" else 1024)
    ours = 5 if fault == "layer_not_ours" else 6
    calls = [3, 3, 0, 3, 3, 3] if fault == "layer_never_called" else [3] * ours
    _write(tmp_path, "on", 6, ours, calls, comps)
    if fault != "off_missing":
        _write(tmp_path, "off", 6, 6 if fault == "ours_when_off" else 0, [], comps)
    s = compare.summarize(tmp_path, "native")
    assert any(words in p for p in s["problems"]), s["problems"]
    assert compare.main([str(tmp_path), "--shim", "native"]) == 1


def _spec_pair(rng: random.Random, hit: int, block: int = 1600) -> tuple[dict, dict]:
    """A run without speculation and an MTP run with the same greedy tokens, 5 prompts; the MTP run's
    last prompt served `hit` cached tokens, its replayed drafts met acceptance 0 and 3."""
    base = {"completions": [_run(random.Random(i), [rng.randrange(1000) for _ in range(8)]) for i in range(5)],
            "kv_capacity": {"block_size": block - 32}}
    spec = json.loads(json.dumps(base))
    spec["kv_capacity"] = {"block_size": block}
    spec["completions"][4]["num_cached_tokens"] = hit
    spec["replay_completions"] = json.loads(json.dumps(base["completions"]))
    spec["replay_greedy_seen"] = {"hook": {"not_as_planned": 0, "accepted_histogram": [5, 0, 0, 3]}, "vllm": {}}
    return spec, base


def test_an_exact_mtp_run_has_no_problem_and_one_without_a_hit_names_the_block_it_needed():
    rng = random.Random()
    spec, base = _spec_pair(rng, hit=1600)
    assert compare.judge_speculative(spec, base)["problems"] == []
    block = rng.choice([784, 800, 1568, 1600])
    spec, base = _spec_pair(rng, hit=0, block=block)
    problems = compare.judge_speculative(spec, base)["problems"]
    assert len(problems) == 1 and "no repeated prefix was served" in problems[0]
    assert f"blocks of {block} tokens" in problems[0] and f"shorter than {2 * block} tokens" in problems[0]
    del spec["kv_capacity"]   # a run from before kv_capacity was recorded: the plain line
    assert compare.judge_speculative(spec, base)["problems"] == [
        "with MTP no repeated prefix was served from the prefix cache"]


def test_replayed_steps_off_plan_beyond_the_parted_prompts_and_fixed_acceptance_are_problems():
    rng = random.Random()
    spec, base = _spec_pair(rng, hit=800)
    spec["replay_greedy_seen"]["hook"]["not_as_planned"] = 1   # no prompt parted: one step too many
    assert any("1 replayed steps not accepted as planned" in p for p in compare.judge_speculative(spec, base)["problems"])
    spec, base = _spec_pair(rng, hit=800)
    spec["replay_greedy_seen"]["hook"]["accepted_histogram"] = [0, 0, 0, 9]
    assert any("did not meet changing acceptance" in p for p in compare.judge_speculative(spec, base)["problems"])


def test_a_run_stopped_before_its_end_is_a_problem_whatever_it_saved(tmp_path):
    rng = random.Random()
    spec, base = _spec_pair(rng, hit=1600)
    stages = rng.sample(["greedy", "speed", "speculative", "long_context_131072"], k=rng.randint(1, 3))
    base.update(finished=False, stages=stages)
    (tmp_path / "sm75-on-custom-fp8.json").write_text(json.dumps(base))
    (tmp_path / "sm75-on-custom-fp8-mtp.json").write_text(json.dumps(dict(spec, finished=True, stages=["end"])))
    problems = compare.spec_summary(tmp_path, "sm75")["problems"]
    assert problems == [f"run on-custom-fp8 stopped before its end (stages saved: {', '.join(stages)}; see its log)"]
    comps = _completions(rng, cached=1024)
    _write(tmp_path, "on", 6, 6, [3] * 6, comps)
    _write(tmp_path, "off", 6, 0, [], comps)
    off = json.loads((tmp_path / "native-off.json").read_text())
    (tmp_path / "native-off.json").write_text(json.dumps(dict(off, finished=False, stages=["greedy"])))
    assert compare.summarize(tmp_path, "native")["problems"] == [
        "run off stopped before its end (stages saved: greedy; see its log)"]


def _graph_run(mode: str, decode: float, sweep: list[float]) -> dict:
    return {"cudagraph_mode": mode, "finished": True, "speed": {"decode_1024": {"tok_s": decode}},
            "acceptance_sweep": [{"accept": k, "decode": {"tok_s": v}} for k, v in enumerate(sweep)]}


@pytest.mark.parametrize("twin_tag", ["", "-pw"])
def test_full_runs_are_set_against_their_piecewise_twin_never_a_copy_of_themselves(tmp_path, twin_tag):
    """`X-full` against `X` or `X-pw`, whichever ran PIECEWISE: a -pw file that is a FULL run's copy
    (the replay reference of a PIECEWISE MTP run in the same call) is never its twin."""
    rng = random.Random()
    pw = [rng.uniform(50, 300) for _ in range(4)]
    full = [v * rng.uniform(1.0, 1.6) for v in pw]
    dec_pw, dec_full = rng.uniform(50, 300), rng.uniform(50, 300)
    runs = {"on-custom-fp8-full": _graph_run("FULL_AND_PIECEWISE", rng.uniform(200, 400), []),
            "on-custom-fp8-pw": _graph_run("FULL_AND_PIECEWISE", rng.uniform(200, 400), []),   # the copy
            "on-custom-full": _graph_run("CUDAGraphMode.FULL_AND_PIECEWISE", dec_full, full),
            f"on-custom{twin_tag}": _graph_run("CUDAGraphMode.PIECEWISE", dec_pw, pw)}
    for name, run in runs.items():
        (tmp_path / f"sm75-{name}.json").write_text(json.dumps(run))
    ratios = compare.spec_summary(tmp_path, "sm75")["full_over_piecewise"]
    assert sorted(ratios) == ["on-custom"]   # the FULL copy is no twin of on-custom-fp8-full
    got = ratios["on-custom"]
    assert math.isclose(got["decode_1024"]["ratio"], dec_full / dec_pw)
    assert [math.isclose(got[f"accept_{k}"]["ratio"], full[k] / pw[k]) for k in range(4)] == [True] * 4
