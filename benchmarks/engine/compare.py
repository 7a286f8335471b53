"""Judge the engine runs of run_device.sh: plugin on against off, and n-gram speculation against
plain greedy. Pure Python (no vLLM): the unit tests run it on CPU.

    python3 compare.py OUTDIR --shim native|sm75     # prints the summary JSON
    python3 compare.py OUTDIR --shim sm75 --on on-custom --off on   # any two runs: our attention
                                                                    # backend against stock TRITON_ATTN
    python3 compare.py OUTDIR --shim sm75 --spec   # every MTP run against the same engine without it,
                                                   # and FULL_AND_PIECEWISE (TAG -full) against PIECEWISE

Greedy tokens are compared prompt by prompt. Where two runs part, the first differing step is
explained when, in each run, the other run's token is its second choice and the margin between
the two is within the tolerance: twice the largest difference in the chosen token's logprob that
the two runs show at the steps where they agree (what the two numerics differ by, measured in the
same engine). After a divergence the continuations differ and are not compared.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TOLERANCE_FACTOR = 2.0


@dataclass
class PromptVerdict:
    prompt: int
    steps: int
    equal: bool
    first_divergence: int | None = None
    margin_a: float | None = None   # run a's logprob gap between its token and run b's (None: not in its top 2)
    margin_b: float | None = None
    explained: bool = True


def agreeing_drift(a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    """|Δ logprob| of the chosen token at each step where both runs have chosen the same so far."""
    out = []
    for sa, sb in zip(a["steps"], b["steps"]):
        if sa["chosen"] != sb["chosen"]:
            break
        out.append(abs(sa["chosen_logprob"] - sb["chosen_logprob"]))
    return out


def gap(step: dict[str, Any], other: int) -> float | None:
    """Logprob of the step's chosen token less that of `other`, when `other` is in its top 2."""
    top = {tok: lp for tok, lp in step["top"]}
    return step["chosen_logprob"] - top[other] if other in top else None


def judge_prompt(i: int, a: dict[str, Any], b: dict[str, Any], tolerance: float) -> PromptVerdict:
    """Equal tokens, or the first divergence and whether the margins explain it."""
    n = min(len(a["tokens"]), len(b["tokens"]))
    for k in range(n):
        ta, tb = a["tokens"][k], b["tokens"][k]
        if ta != tb:
            ma, mb = gap(a["steps"][k], tb), gap(b["steps"][k], ta)
            ok = ma is not None and mb is not None and ma <= tolerance and mb <= tolerance
            return PromptVerdict(i, n, False, k, ma, mb, ok)
    return PromptVerdict(i, n, len(a["tokens"]) == len(b["tokens"]))


def compare_runs(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Prompt verdicts of run a against run b, with the drift and the tolerance they were judged by."""
    pairs = list(zip(a["completions"], b["completions"]))
    drift = [d for ca, cb in pairs for d in agreeing_drift(ca, cb)]
    for x in drift:
        if x != x:   # NaN: a run produced no number
            return {"drift_max": None, "tolerance": None, "prompts": [], "all_explained": False,
                    "problem": "a logprob is NaN"}
    drift_max = max(drift, default=0.0)
    tolerance = TOLERANCE_FACTOR * drift_max
    verdicts = [judge_prompt(i, ca, cb, tolerance) for i, (ca, cb) in enumerate(pairs)]
    return {"drift_max": drift_max, "tolerance": tolerance, "prompts": [asdict(v) for v in verdicts],
            "all_explained": bool(verdicts) and all(v.explained for v in verdicts)}


def gdn_served(run: dict[str, Any]) -> dict[str, Any]:
    """Whether every GDN op ran our kernel, and how often (prefill steps), on every tensor-parallel
    rank where the run counted them per rank."""
    censuses = run.get("census_by_rank") or [run.get("census", {})]
    calls_by_rank = run.get("gdn_calls_by_rank") or [run.get("gdn_calls_after_greedy", [])]
    ranks = []
    for census, calls in zip(censuses, calls_by_rank):
        ops = census.get("gdn_ops", 0)
        ranks.append({"gdn_ops": ops, "ours": census.get("ours", 0), "calls": calls,
                      "all_served": ops > 0 and census.get("ours") == ops and len(calls) == ops and min(calls) > 0})
    first = ranks[0] if ranks else {"gdn_ops": 0, "ours": 0, "calls": [], "all_served": False}
    return {**first, "ranks": len(ranks), "all_served": bool(ranks) and all(r["all_served"] for r in ranks)}


def _tok_s(run: dict[str, Any]) -> dict[str, tuple[float, float | None]]:
    """Every tok/s figure of a run, by row name, with its spread (None where it was timed once)."""
    rows = {name: (row["tok_s"], row.get("spread")) for name, row in (run.get("speed") or {}).items()}
    long = run.get("long_context") or []
    for row in [long] if isinstance(long, dict) else long:   # one row (before 2026-12-06) or a list
        n = row["tokens"]
        if "prefill_tok_s" in row:
            rows[f"prefill_whole_{n}"] = (row["prefill_tok_s"], None)
        rows[f"late_chunk_{n}"] = (row["late_chunk_tok_s"], (row.get("late_chunk") or {}).get("spread"))
        rows[f"decode_at_{n}"] = (row["decode_tok_s"], (row.get("decode") or {}).get("spread"))
    return rows


def speed_rows(on: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    """tok/s of each speed row, on and off, on/off, and each side's spread over its repeats."""
    mine, peer = _tok_s(on), _tok_s(off)
    return {name: {"on_tok_s": v, "off_tok_s": peer[name][0], "ratio": v / peer[name][0],
                   "on_spread": spread, "off_spread": peer[name][1]}
            for name, (v, spread) in mine.items() if peer.get(name) and peer[name][0]}


def unfinished(name: str, run: dict[str, Any] | None) -> list[str]:
    """A problem for a run that was stopped before its end (engine_check.py saves after each stage;
    results from before that have no "finished" and count as whole)."""
    if run is None or run.get("finished", True):
        return []
    return [f"run {name} stopped before its end (stages saved: {', '.join(run.get('stages') or ['none'])}; see its log)"]


def summarize(outdir: Path, shim: str, on_name: str = "on", off_name: str = "off", tag: str = "") -> dict[str, Any]:
    """The summary of one run_device.sh call: run `on_name` against `off_name` (and n-gram against
    plain greedy); `problems` is empty when everything held. Where the second run has the plugin
    on too (another attention backend), both must have every GDN layer on our prefill."""
    def load(name: str) -> dict[str, Any] | None:
        path = outdir / f"{shim}-{name}{tag}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    on, off, ngram = load(on_name), load(off_name), load("on-ngram")
    problems: list[str] = []
    summary: dict[str, Any] = {"shim": shim, "on": on_name, "off": off_name,
                               "runs": {k: v is not None for k, v in ((on_name, on), (off_name, off), ("on-ngram", ngram))}}
    problems += unfinished(on_name, on) + unfinished(off_name, off)
    if on is None or off is None:
        problems.append(f"run {on_name if on is None else off_name} wrote no result (see its log)")
    else:
        summary["engine_start_s"] = {"on": on.get("engine_start_s"), "off": off.get("engine_start_s")}
        summary["on_vs_off"] = compare_runs(on, off)
        summary["gdn_on"] = gdn_served(on)
        summary["gdn_off"] = gdn_served(off)
        summary["prefix_cached_tokens"] = {"on": on["completions"][2]["num_cached_tokens"],
                                           "off": off["completions"][2]["num_cached_tokens"]}
        summary["speed"] = speed_rows(on, off)
        summary["kv_capacity_tokens"] = {k: (r.get("kv_capacity") or {}).get("tokens") for k, r in (("on", on), ("off", off))}
        if not summary["on_vs_off"]["all_explained"]:
            problems.append(f"{on_name} and {off_name} part at a step the margins do not explain")
        if not summary["gdn_on"]["all_served"]:
            problems.append(f"not every GDN layer ran our prefill in {on_name}")
        if off.get("plugin_loaded", False):
            if not summary["gdn_off"]["all_served"]:
                problems.append(f"not every GDN layer ran our prefill in {off_name}")
        elif summary["gdn_off"]["ours"]:
            problems.append(f"our prefill ran with the plugin off ({off_name})")
        if not summary["prefix_cached_tokens"]["on"]:
            problems.append("the repeated prefix was not served from the prefix cache")
    if ngram is not None and on is not None and on_name == "on":
        plain = dict(on, completions=on["completions"][:len(ngram["completions"])])
        summary["ngram_vs_greedy"] = compare_runs(ngram, plain)
        if not summary["ngram_vs_greedy"]["all_explained"]:
            problems.append("n-gram speculation parts from plain greedy at a step the margins do not explain")
    summary["problems"] = problems
    return summary


def _single(c: dict[str, Any]) -> dict[str, Any]:
    return {"completions": [c]}


def judge_speculative(spec: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """An MTP run against the same engine without speculation: its greedy tokens with the real
    drafter and with replayed drafts, the sweep's tokens at each acceptance, the acceptance each
    phase saw, and whether replayed steps were accepted as planned. `problems` empty when exact."""
    problems: list[str] = []
    hits = [c["num_cached_tokens"] for c in spec["completions"][2:]]
    out: dict[str, Any] = {"greedy": compare_runs(spec, base),
                           "greedy_seen": (spec.get("spec") or {}).get("greedy_seen"),
                           "prefix_cached_tokens": spec["completions"][2]["num_cached_tokens"],
                           "cached_tokens_by_prompt": {"spec": [c["num_cached_tokens"] for c in spec["completions"]],
                                                       "base": [c["num_cached_tokens"] for c in base["completions"]]}}
    if not out["greedy"]["all_explained"]:
        problems.append("MTP greedy parts from plain greedy at a step the margins do not explain")
    if not any(hits):
        block = (spec.get("kv_capacity") or {}).get("block_size")
        problems.append("with MTP no repeated prefix was served from the prefix cache"
                        + (f" (blocks of {block} tokens: MTP's lookup gives one block of every hit back, so a "
                           f"repeat shorter than {2 * block} tokens keeps none)" if block else ""))
    if "replay_completions" in spec:
        out["replay"] = compare_runs({"completions": spec["replay_completions"]}, base)
        seen = spec["replay_greedy_seen"]["hook"]
        out["replay_seen"] = spec["replay_greedy_seen"]
        parted = sum(1 for v in out["replay"]["prompts"] if not v["equal"])
        if not out["replay"]["all_explained"]:
            problems.append("replayed drafts part from plain greedy at a step the margins do not explain")
        if seen["not_as_planned"] > parted:
            problems.append(f"{seen['not_as_planned']} replayed steps not accepted as planned ({parted} prompts parted)")
        if len(set(k for k, n in enumerate(seen["accepted_histogram"]) if n)) < 2:
            problems.append("the replayed greedy steps did not meet changing acceptance")
    sweep = []
    for row in spec.get("acceptance_sweep") or []:
        verdict = compare_runs(_single(row["completion"]), _single(base["sweep_reference"])) \
            if base.get("sweep_reference") else None
        hook = row["seen"]["hook"]
        sweep.append({"accept": row["accept"], "decode_tok_s": row["decode"]["tok_s"], "spread": row["decode"]["spread"],
                      "tokens_per_step": hook["tokens_per_step"], "vllm": row["seen"]["vllm"],
                      "not_as_planned": hook["not_as_planned"],
                      "equal": verdict["prompts"][0]["equal"] if verdict else None,
                      "explained": verdict["all_explained"] if verdict else None})
        if verdict and not verdict["all_explained"]:
            problems.append(f"the sweep at {row['accept']} accepted parts from plain greedy unexplained")
    out["sweep"] = sweep
    out["problems"] = problems
    return out


def graph_ratios(piecewise: dict[str, Any], full: dict[str, Any]) -> dict[str, Any]:
    """FULL_AND_PIECEWISE over PIECEWISE: the decode row and each acceptance level of the sweep."""
    out: dict[str, Any] = {}
    a, b = (piecewise.get("speed") or {}).get("decode_1024"), (full.get("speed") or {}).get("decode_1024")
    if a and b:
        out["decode_1024"] = {"piecewise": a["tok_s"], "full": b["tok_s"], "ratio": b["tok_s"] / a["tok_s"]}
    by_level = {r["accept"]: r for r in piecewise.get("acceptance_sweep") or []}
    for row in full.get("acceptance_sweep") or []:
        if row["accept"] in by_level:
            pw = by_level[row["accept"]]["decode"]["tok_s"]
            out[f"accept_{row['accept']}"] = {"piecewise": pw, "full": row["decode"]["tok_s"],
                                              "ratio": row["decode"]["tok_s"] / pw}
    return out


def piecewise_twin(base: str, runs: dict[str, Any]) -> str | None:
    """The PIECEWISE run beside `<base>-full`: `<base>` or `<base>-pw` (TAG -pw), whichever ran
    PIECEWISE (a -pw file may be a FULL run's copy, there only as a reference for replayed drafts)."""
    for name in (base, base + "-pw"):
        if name in runs and str(runs[name].get("cudagraph_mode", "")).rsplit(".", 1)[-1] == "PIECEWISE":
            return name
    return None


def spec_summary(outdir: Path, shim: str) -> dict[str, Any]:
    """Every `<shim>-<mode>-mtp<tag>.json` of a call judged against `<shim>-<mode><tag>.json`, and
    each run with TAG -full against the same run PIECEWISE, without a tag or with -pw (CUDA graph
    modes)."""
    runs = {p.stem[len(shim) + 1:]: json.loads(p.read_text()) for p in sorted(outdir.glob(f"{shim}-*.json"))}
    judged: dict[str, Any] = {}
    problems: list[str] = []
    for name, run in runs.items():
        problems += unfinished(name, run)
        if "-mtp" not in name:
            continue
        base = name.replace("-mtp", "", 1).replace("-unfixed", "", 1)
        if base not in runs:
            problems.append(f"{name}: no run {base} to judge it against")
            continue
        judged[name] = judge_speculative(run, runs[base])
        problems += [f"{name}: {p}" for p in judged[name]["problems"]]
    ratios: dict[str, Any] = {}
    for name, run in runs.items():
        base = name.removesuffix("-full")
        twin = piecewise_twin(base, runs) if base != name else None
        if twin:
            ratios[base] = graph_ratios(runs[twin], run)
    return {"shim": shim, "runs": sorted(runs), "speculative": judged, "full_over_piecewise": ratios,
            "cudagraph_modes": {n: r.get("cudagraph_mode") for n, r in runs.items()}, "problems": problems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--shim", choices=("native", "sm75"), default="native")
    parser.add_argument("--on", default="on", help="the run judged (default on)")
    parser.add_argument("--off", default="off", help="the run it is judged against (default off)")
    parser.add_argument("--tag", default="", help="the TAG run_device.sh added to the runs' names")
    parser.add_argument("--spec", action="store_true",
                        help="judge every MTP run against its run without speculation, and FULL against PIECEWISE")
    args = parser.parse_args(argv)
    summary = (spec_summary(args.outdir, args.shim) if args.spec
               else summarize(args.outdir, args.shim, args.on, args.off, args.tag))
    print(json.dumps(summary, indent=1))
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
