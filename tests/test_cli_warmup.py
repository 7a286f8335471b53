"""`caovan-sm75-warmup` end to end against the local fake vLLM server (127.0.0.1 only), with faults."""

import io
import json
import subprocess
import sys
import time

import pytest

from caovan_vllm_sm75_turbo3.cli.common import run_cli
from caovan_vllm_sm75_turbo3.cli.warmup import PROG, LiveProgress, main
from caovan_vllm_sm75_turbo3.warmup.ladder import LadderConfig, build_ladder, warm_pass
from caovan_vllm_sm75_turbo3.warmup.runner import WarmupOptions, warm_fleet

from helpers.facts import ROOT
from helpers.fake_vllm_server import MODEL, fake, render_chat, tokenize  # noqa: F401  (fake is a pytest fixture)

READY = "[Caovan] warmup=READY"
# A small ladder so the tests are quick: prefill 128, 256, 512 (the budget) and 768 (past it).
FAST = ["--max-num-batched-tokens", "512", "--max-num-seqs", "3", "--decode-tokens", "24",
        "--wait", "5", "--poll-interval", "0.05", "--step-timeout", "5"]
FAST_CFG = LadderConfig(max_num_batched_tokens=512, max_num_seqs=3, decode_tokens=24)


def warm(capsys, *args, env_key=None):
    code = run_cli(PROG, main, [*args, *FAST])
    out, err = capsys.readouterr()
    return code, out, err


def last_line(text):
    return text.strip().splitlines()[-1]


def test_ready_runs_the_whole_ladder_one_step_at_a_time(fake, capsys):
    srv = fake(reply_delay_s=0.05, prompt_tokens_details=True)
    code, out, err = warm(capsys, "--api-base", srv.url, "--model", MODEL)
    assert code == 0 and last_line(out) == READY
    assert out.count(READY) == 1 and "FAILED" not in out

    steps = build_ladder(FAST_CFG)
    cold = [s.name for s in steps]
    expected = []
    for s in steps:
        expected += [s.name] * (2 if s.kind == "prefix-cache" else s.concurrency)
    expected += ["warm/" + s.name for s in warm_pass(steps)]
    gen = srv.labels("/v1/chat/completions") + srv.labels("/v1/completions")
    assert sorted(gen) == sorted(expected)
    # Arrival order follows the ladder (cold steps, then the warm pass).
    order = [lbl for lbl in srv.labels() if lbl in cold or lbl.startswith("warm/")]
    assert [k for i, k in enumerate(order) if i == 0 or order[i - 1] != k] == \
        [s.name for s in steps] + ["warm/" + s.name for s in warm_pass(steps)]

    # Strictly one at a time, except inside a concurrency step, where the requests overlap.
    spans = sorted(srv.spans, key=lambda s: s[1])
    for (rid_a, _, end_a), (rid_b, start_b, _) in zip(spans, spans[1:]):
        step_a, step_b = rid_a.split(":")[1], rid_b.split(":")[1]
        if start_b < end_a:
            assert step_a == step_b and step_a in ("concurrency-2", "concurrency-3", "mixed"), (rid_a, rid_b)
    assert srv.max_in_flight == 3
    ids = [rid for path, rid, _ in srv.requests if path != "/tokenize"]
    assert len(ids) == len(set(ids))  # vLLM takes X-Request-Id as the engine's request id: never reuse one

    # Prefill prompts had exactly the token counts of their names (fitted through /tokenize).
    for path, rid, body in srv.requests:
        label = rid.split(":")[1] if rid else ""
        if path == "/v1/chat/completions" and label.startswith("prefill-"):
            assert len(tokenize(render_chat(body["messages"], None))) == int(label.split("-")[1])
    assert any(path == "/tokenize" for path, _, _ in srv.requests)
    assert "prefill-768" in out and "second request: 512 of 512 prompt tokens from the prefix cache" in err
    assert "step chat-tiny: ok" in err and "step warm/stream: ok" in err  # plain progress lines off a terminal


def test_prompts_never_share_a_cache_block_except_the_prefix_cache_pair(fake, capsys):
    srv = fake()
    code, out, _ = warm(capsys, "--api-base", srv.url)
    assert code == 0
    firsts = {}
    for path, rid, body in srv.requests:
        if path == "/v1/chat/completions":
            head = tuple(tokenize(render_chat(body["messages"], body.get("tools")))[:16])
            firsts.setdefault(head, set()).add(rid.split(":")[1])
    shared = [labels for labels in firsts.values() if len(labels) > 1]
    assert shared == [] or all(labels == {"prefix-cache"} for labels in shared)
    assert [len(v) for v in firsts.values()].count(1) == len(firsts)  # each head belongs to one step


def test_json_report(fake, capsys):
    srv = fake()
    code, out, err = warm(capsys, "--api-base", srv.url + "/v1", "--json")
    assert code == 0 and last_line(err) == READY
    report = json.loads(out)
    assert report["status"] == "READY" and report["line"] == READY and report["exit_code"] == 0
    server = report["servers"][0]
    assert server["model"] == MODEL and server["token_lengths"] == "exact" and server["max_model_len"] == 32768
    assert all(s["status"] == "ok" or (s["status"] == "skipped" and s["note"]) for s in server["steps"])
    assert all(isinstance(s["latency_s"], float) and s["latency_s"] > 0 for s in server["steps"])
    tool = next(s for s in server["steps"] if s["name"] == "tool-call")
    assert tool["status"] == "skipped" and "--enable-auto-tool-choice" in tool["note"]
    pairs = {p["step"]: p for p in server["cold_vs_warm"]}
    assert set(pairs) == {s.name for s in warm_pass(build_ladder(FAST_CFG))}
    assert all(p["cold_s"] > 0 and p["warm_s"] > 0 for p in pairs.values())
    assert report["settings"]["max_num_seqs"] == 3 and report["settings"]["api_key"] == "none"


def test_parsers_on_the_server_are_exercised(fake, capsys):
    srv = fake(tool_parser=True, reasoning_parser=True)
    code, out, _ = warm(capsys, "--api-base", srv.url, "--json")
    assert code == 0
    steps = {s["name"]: s for s in json.loads(out)["servers"][0]["steps"]}
    assert steps["tool-call"]["status"] == "ok" and "tool parser active" in steps["tool-call"]["note"]
    assert steps["reasoning"]["status"] == "ok" and steps["reasoning"]["note"] == "reasoning parser active"


def test_optional_steps_rejected_are_skipped_with_a_note(fake, capsys):
    srv = fake(faults={"reasoning": "reject"})
    code, out, _ = warm(capsys, "--api-base", srv.url, "--json")
    steps = {s["name"]: s for s in json.loads(out)["servers"][0]["steps"]}
    assert code == 0
    assert steps["reasoning"]["status"] == "skipped" and "not supported by this server" in steps["reasoning"]["note"]


def test_without_tokenize_lengths_are_estimated(fake, capsys):
    srv = fake(tokenize=False)
    code, out, _ = warm(capsys, "--api-base", srv.url, "--json")
    server = json.loads(out)["servers"][0]
    assert code == 0 and server["token_lengths"] == "estimated"
    prefill = [s for s in server["steps"] if s["name"].startswith("prefill-")]
    assert prefill and all(s["prompt_tokens_exact"] is False and s["prompt_tokens"] > 0 for s in prefill)


@pytest.mark.parametrize("fault_step,fault,needle", [
    ("prefill-256", "500", "HTTP 500 Internal Server Error: EngineCore encountered an issue"),
    ("stream", "cut", "connection broken mid-reply"),
    ("stream", "cut-clean", "without data: [DONE]"),
    ("stream", "stream-error", "error inside the stream"),
    ("chat-tiny", "malformed", "malformed JSON in the 200 reply"),
    ("decode-24", "empty", "empty completion: the server counted 0 generated tokens (completion_tokens=0"),
    ("concurrency-3", "empty", "empty completion (request 1 of 3)"),
    ("chat-tiny", "reject", "HTTP 400 Bad Request"),  # a required step is never skipped
    ("warm/stream", "500", "HTTP 500"),
])
def test_a_failing_step_is_named_and_stops_the_ladder(fake, capsys, fault_step, fault, needle):
    srv = fake(faults={fault_step: fault})
    code, out, _ = warm(capsys, "--api-base", srv.url)
    line = last_line(out)
    assert code == 1 and READY not in out
    assert line.startswith(f"[Caovan] warmup=FAILED step={fault_step} reason=") and needle in line
    assert "\n" not in line
    labels = srv.labels()
    later = labels[max(i for i, lbl in enumerate(labels) if lbl == fault_step) + 1:]
    assert later == []  # nothing after the failed step was sent


def test_a_hanging_step_times_out_on_its_own_limit(fake, capsys):
    srv = fake(faults={"sampling": "hang"}, hang_s=10)
    start = time.monotonic()
    code, out, _ = warm(capsys, "--api-base", srv.url, "--timeout", "sampling=0.5")
    assert time.monotonic() - start < 8
    assert code == 1
    assert last_line(out) == ("[Caovan] warmup=FAILED step=sampling reason=timeout: no complete reply within 0.5 s")


def test_engine_death_during_a_step_is_named(fake, capsys):
    srv = fake(faults={"prefill-128": "engine-dies"})
    code, out, _ = warm(capsys, "--api-base", srv.url)
    assert code == 1
    assert "step=prefill-128" in last_line(out) and "GET /health now returns 503: the engine died" in last_line(out)


def test_readiness_failures(fake, capsys):
    dead = fake(health_status=503)
    code, out, _ = warm(capsys, "--api-base", dead.url)
    assert code == 3 and last_line(out).startswith("[Caovan] warmup=FAILED step=readiness reason=GET /health returned 503")
    wrong = fake()
    code, out, _ = warm(capsys, "--api-base", wrong.url, "--model", "Qwen3.6-35B")
    assert code == 2 and "step=readiness" in last_line(out) and f"it serves: {MODEL}" in last_line(out)
    assert wrong.labels("/v1/chat/completions") == []


def test_late_server_is_waited_for(fake, capsys):
    srv = fake(listen_after_s=0.5)
    code, out, err = warm(capsys, "--api-base", srv.url)
    assert code == 0 and last_line(out) == READY
    assert "waiting 0 s: the port to accept connections (connection refused" in err


def test_api_key_from_the_environment(fake, capsys, monkeypatch):
    srv = fake(api_key="k-123")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "wrong")
    code, out, _ = warm(capsys, "--api-base", srv.url)
    assert code == 2 and "401" in last_line(out)
    monkeypatch.delenv("VLLM_API_KEY")
    monkeypatch.setenv("OPENAI_API_KEY", "k-123")
    code, out, _ = warm(capsys, "--api-base", srv.url, "--json")
    assert code == 0 and json.loads(out)["settings"]["api_key"] == "env OPENAI_API_KEY"
    assert "k-123" not in out
    monkeypatch.setenv("VLLM_API_KEY", "wrong")
    code, _, _ = warm(capsys, "--api-base", srv.url, "--api-key", "k-123")  # the flag wins
    assert code == 0


def test_fleet_is_warmed_one_server_after_another(fake, capsys):
    a, b = fake(), fake()
    code, out, _ = warm(capsys, "--api-base", a.url, b.url)
    assert code == 0 and last_line(out) == READY
    assert a.labels() and b.labels() and max(e for _, _, e in a.spans) <= min(s for _, s, _ in b.spans)


def test_fleet_stops_at_the_first_failure(fake, capsys):
    a, b, c = fake(), fake(faults={"chat-tiny": "500"}), fake()
    code, out, _ = warm(capsys, "--api-base", a.url, "--api-base", b.url, c.url)
    assert code == 1
    assert last_line(out).startswith("[Caovan] warmup=FAILED step=chat-tiny reason=HTTP 500")
    assert last_line(out).endswith(f"(server {b.url})")
    assert f"not attempted (an earlier server failed): {c.url}" in out
    assert c.requests == []


def test_live_progress_on_a_terminal(fake):
    srv = fake()
    buf = io.StringIO()
    with LiveProgress(buf) as progress:
        report = warm_fleet([srv.url], WarmupOptions(poll_s=0.05, wait_s=5, ladder=FAST_CFG), progress)
    assert report.failed is None and report.status_line() == READY
    assert "chat-tiny: ok" in buf.getvalue() and "warm/stream: ok" in buf.getvalue()


def test_list_steps_and_bad_flags(capsys):
    assert run_cli(PROG, main, ["--list-steps", "--max-num-batched-tokens", "1024", "--max-num-seqs", "4"]) == 0
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.splitlines()]
    assert names == [s.name for s in build_ladder(LadderConfig(max_num_batched_tokens=1024, max_num_seqs=4))]
    assert run_cli(PROG, main, ["--list-steps", "--timeout", "prefil-*=9"]) == 2
    assert "caovan-sm75-warmup: error: --timeout 'prefil-*' matches no step" in capsys.readouterr().err
    assert run_cli(PROG, main, ["--api-base", "localhost:8000"]) == 2
    assert "--api-base 'localhost:8000' is not accepted" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["--max-num-seqs", "0"])
    assert exit_.value.code == 2 and "a whole number >= 1" in capsys.readouterr().err


def test_console_script_and_no_heavy_imports():
    script = ROOT / ".venv" / "bin" / PROG
    if script.exists():
        help_ = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
        assert help_.returncode == 0 and "--api-base" in help_.stdout and "warmup=READY" in help_.stdout
    probe = ("import sys, caovan_vllm_sm75_turbo3.cli.warmup, caovan_vllm_sm75_turbo3.warmup.runner; "
             "print(sorted(m for m in ('torch', 'triton', 'vllm') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "[]"
