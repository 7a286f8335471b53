"""benchmarks/engine/replay.py: replayed drafts whose acceptance is known before each step, and the
hook that counts what an engine accepted. A simulated engine stands in for vLLM's verify step: it
accepts drafts while they equal its own greedy tokens, then adds the token it would have sampled."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "engine"))
import replay  # noqa: E402

VOCAB = 5000


def _engine(truth: list[int], hook: replay.ReplayHook, prompt: list[int], request: str = "r0",
            drafter: list[int] | None = None, chunks: int = 1) -> tuple[list[int], list[list[int] | None]]:
    """Greedy decoding of `truth` with speculation: each step verifies the drafts made after the
    last one (the hook's, else `drafter`'s), like vLLM's rejection sampler under greedy. `chunks`
    prefill steps come first (the earlier ones discarded). Returns the tokens and each step's drafts."""
    n = hook.plan.draft_tokens
    out: list[int] = []
    made: list[list[int] | None] = []
    for _ in range(chunks - 1):   # partial prefills: their sampled token is not kept
        chosen = hook.after_sampling([replay.Row(request, prompt, [random.randrange(VOCAB)], True)])
        assert chosen == [None]
    drafts: list[int] = []
    own = truth + [random.randrange(VOCAB) for _ in range(n + 1)]   # what it samples past max_tokens
    while len(out) < len(truth):
        sampled = []
        for d in drafts:
            if d == own[len(out) + len(sampled)]:
                sampled.append(d)
            else:
                break
        sampled.append(own[len(out) + len(sampled)])
        sampled += [-1] * (len(drafts) + 1 - len(sampled))
        out += [t for t in sampled if t >= 0]
        chosen = hook.after_sampling([replay.Row(request, prompt, sampled, False)])[0]
        made.append(chosen)
        drafts = chosen if chosen is not None else (drafter or [0] * n)
    return out[:len(truth)], made


def _plan(rng: random.Random, n: int = 3, accept: int | None = None) -> tuple[replay.ReplayPlan, list[int], list[int]]:
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(5, 40))]
    truth = [rng.randrange(VOCAB) for _ in range(rng.randrange(40, 90))]
    plan = replay.ReplayPlan(n, VOCAB, seed=rng.randrange(1000), accept=accept)
    plan.add(prompt, truth)
    return plan, prompt, truth


@pytest.mark.parametrize("seed", range(6))
def test_an_exact_engine_accepts_every_replayed_step_as_planned_and_acceptance_changes(seed):
    rng = random.Random(seed * 7919 + random.randrange(10**6))
    plan, prompt, truth = _plan(rng, n=rng.choice([1, 2, 3, 4]))
    hook = replay.ReplayHook(plan)
    tokens, _ = _engine(truth, hook, prompt, chunks=rng.randrange(1, 4))
    assert tokens == truth
    s = hook.summary()
    assert s["verified_steps"] > 0 and s["not_as_planned"] == 0
    assert s["replayed_steps"] == s["verified_steps"]
    assert sum(1 for n in s["accepted_histogram"] if n) >= 2   # acceptance varies from step to step
    assert s["tokens_per_step"] == pytest.approx((s["verified_steps"] + s["accepted_tokens"]) / s["verified_steps"])


@pytest.mark.parametrize("accept", range(4))
def test_a_fixed_acceptance_gives_that_many_tokens_a_step(accept):
    plan, prompt, truth = _plan(random.Random(random.randrange(10**6)), n=3, accept=accept)
    hook = replay.ReplayHook(plan)
    tokens, made = _engine(truth, hook, prompt)
    assert tokens == truth
    s = hook.summary()
    full = s["accepted_histogram"][accept]
    # every verified step accepts `accept`, but near the reference's end fewer drafts are right
    assert full >= s["verified_steps"] - 2 and s["not_as_planned"] == 0
    assert all(len(d) == 3 for d in made if d is not None)


def test_wrong_guesses_are_never_the_true_token():
    rng = random.Random(random.randrange(10**6))
    for _ in range(2000):
        plan = replay.ReplayPlan(3, rng.randrange(2, 300), seed=rng.randrange(100))
        t = rng.randrange(plan.vocab)
        w = plan.wrong(t, rng.randrange(100), rng.randrange(100))
        assert w != t and 0 <= w < plan.vocab


def test_an_engine_that_leaves_the_reference_gets_wrong_drafts_and_is_counted():
    rng = random.Random(random.randrange(10**6))
    plan, prompt, truth = _plan(rng, n=3, accept=3)   # every step plans all its drafts right
    at = len(truth) // 2
    bad = truth[:at] + [(truth[at] + 1) % VOCAB] + truth[at + 1:]   # the engine's own greedy differs once
    hook = replay.ReplayHook(plan)
    tokens, made = _engine(bad, hook, prompt)
    assert tokens == bad
    s = hook.summary()
    # the step that met the divergence accepted fewer than planned, unless it fell on the token the
    # engine samples after the drafts (no draft there to reject)
    assert s["not_as_planned"] <= 1
    # once off its reference, every draft is wrong: the steps after accept nothing
    later = [st for st in hook.steps if st.position > at + 1 and st.accepted is not None]
    assert later and all(st.accepted == 0 and st.planned == 0 for st in later)


def test_prompts_without_a_reference_keep_the_drafters_drafts_and_are_still_counted():
    rng = random.Random(random.randrange(10**6))
    plan, prompt, truth = _plan(rng, n=2)
    other = [t + 1 for t in prompt]
    hook = replay.ReplayHook(plan)
    _, made = _engine(truth, hook, other, drafter=truth[:2])
    assert all(d is None for d in made)
    s = hook.summary()
    assert s["replayed_steps"] == 0 and s["verified_steps"] > 0


def test_a_pass_through_hook_counts_the_real_drafters_acceptance():
    rng = random.Random(random.randrange(10**6))
    plan, prompt, truth = _plan(rng, n=3)
    plan.replay = False
    hook = replay.ReplayHook(plan)
    _, made = _engine(truth, hook, prompt, drafter=[-5, -5, -5])   # never right
    assert all(d is None for d in made)
    s = hook.summary()
    assert s["accepted_tokens"] == 0 and s["tokens_per_step"] == 1.0 and s["acceptance"] == 0.0
    hook.reset()
    assert hook.summary()["verified_steps"] == 0


def test_two_sequences_at_once_are_tracked_apart():
    rng = random.Random(random.randrange(10**6))
    plan, p1, t1 = _plan(rng, n=3)
    p2 = [x + 1 for x in p1]
    t2 = [rng.randrange(VOCAB) for _ in range(len(t1))]
    plan.add(p2, t2)
    hook = replay.ReplayHook(plan)
    out = {"a": [], "b": []}
    drafts = {"a": [], "b": []}
    truth = {"a": t1, "b": t2}
    prompts = {"a": p1, "b": p2}
    for _ in range(len(t1)):
        rows = []
        for r in ("a", "b"):
            got = []
            own = truth[r] + [0] * 5
            for d in drafts[r]:
                if d == own[len(out[r]) + len(got)]:
                    got.append(d)
                else:
                    break
            got.append(own[len(out[r]) + len(got)])
            out[r] += got
            rows.append(replay.Row(r, prompts[r], got + [-1] * (4 - len(got)), False))
        for r, c in zip(("a", "b"), hook.after_sampling(rows)):
            drafts[r] = c
        if all(len(out[r]) >= len(truth[r]) for r in out):
            break
    assert out["a"][:len(t1)] == t1 and out["b"][:len(t2)] == t2
    assert hook.summary()["not_as_planned"] == 0


@pytest.mark.vllm
def test_install_wraps_vllms_runner_and_replaces_the_drafts_of_known_prompts(monkeypatch):
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    calls = []

    def stub(self, scheduler_output, sampled_token_ids, *rest, **kw):
        calls.append(len(rest))
        return torch.full((2, 3), 7, dtype=torch.int32)

    monkeypatch.setattr(GPUModelRunner, "propose_draft_token_ids", stub)
    plan, prompt, truth = _plan(random.Random(random.randrange(10**6)), n=3, accept=3)
    hook = replay.ReplayHook(plan)
    replay.install(hook)
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=["known", "other"]),
        requests={"known": SimpleNamespace(prompt_token_ids=prompt), "other": SimpleNamespace(prompt_token_ids=[1, 2])},
        discard_request_mask=SimpleNamespace(np=[False, False]))
    sampled = torch.tensor([[truth[0], -1, -1, -1], [9, -1, -1, -1]])
    got = GPUModelRunner.propose_draft_token_ids(runner, None, sampled, None, None, None, None, None, None, None)
    assert calls == [7]   # vLLM's own arguments passed through
    assert got.dtype == torch.int32 and got[0].tolist() == truth[1:4] and got[1].tolist() == [7, 7, 7]


def test_tensor_parallel_workers_get_the_shim_only_when_named(tmp_path):
    """worker_site/sitecustomize.py runs in every process Python starts with it on PYTHONPATH; it
    shims only where engine_check named the shim (a worker of a tensor-parallel run)."""
    import os
    import subprocess

    site = ROOT / "benchmarks" / "engine" / "worker_site"
    stub = tmp_path / "engine_check.py"   # stands in for engine_check: records the call
    probe = ("import sys, os; sys.path.insert(0, os.environ['STUB']); import engine_check; "
             "print(getattr(engine_check, 'CALLED', None))")
    stub.write_text("CALLED = None\ndef shim_this_process(shim, cap):\n    global CALLED\n    CALLED = (shim, cap)\n")
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); " + probe.split("; ", 2)[2]
    env = {**os.environ, "PYTHONPATH": str(site), "STUB": str(tmp_path)}
    env.pop("ENGINE_CHECK_SHIM", None)
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert off.returncode == 0 and off.stdout.strip() == "None", off.stderr
    import engine_check

    env2 = dict(env)
    engine_check.shim_workers(env2, "sm75", "7.5")
    assert env2["PYTHONPATH"].split(os.pathsep)[0] == str(site) and env2["ENGINE_CHECK_SHIM"] == "sm75"
    # sitecustomize puts benchmarks/engine first, so a worker imports the real engine_check: check it
    # would call shim_this_process with the named shim (without torch here, the import itself is checked)
    src = (site / "sitecustomize.py").read_text()
    assert 'engine_check.shim_this_process(os.environ["ENGINE_CHECK_SHIM"]' in src


def test_gdn_served_counts_every_rank():
    import compare

    rank = {"gdn_ops": 6, "ours": 6}
    run = {"census_by_rank": [rank, rank], "gdn_calls_by_rank": [[5] * 6, [5] * 6]}
    assert compare.gdn_served(run)["all_served"] and compare.gdn_served(run)["ranks"] == 2
    run["gdn_calls_by_rank"][1] = [5, 5, 5, 0, 5, 5]   # one layer on rank 1 never ran ours
    assert not compare.gdn_served(run)["all_served"]
    old = {"census": rank, "gdn_calls_after_greedy": [1] * 6}   # a single-rank run from before
    assert compare.gdn_served(old)["all_served"] and compare.gdn_served(old)["ranks"] == 1
