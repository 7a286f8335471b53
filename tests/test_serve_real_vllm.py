"""The serve lane: our commands and verdicts against real `vllm serve` runs (vLLM's CPU build).

Run by `bash scripts/test.sh --serve`. Every server listens on 127.0.0.1 only, every wait has a
wall-clock limit, every server is ended by pid (its process group) when its fixture ends.
Tiny random-weight Qwen3 models are made in code (tests/helpers/tiny_model.py). Each run's log is
triaged here, and kept (paths replaced) under $SERVE_LANE_LOGS when that is set: that is how the
logs in tests/data/logs/real_*.log were made.

What a CPU machine cannot show: our kernels (no GPU; vLLM's CPU build runs its own CPU kernels,
Triton off) and a Turing GPU's probe. A facts file makes the plugin take its SM75 decisions, so
the guards' environment is checked in every vLLM process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from caovan_vllm_sm75_turbo3.logtriage.triage import triage_path
from helpers.real_vllm import (BIN, Server, free_port, install_env_probe, lane_env, probe_dumps, sanitize,
                               tree, vllm_serve, without_our_lines)
from helpers.tiny_model import write_qwen3, write_qwen3_next

pytestmark = pytest.mark.serve

ROOT = Path(__file__).resolve().parents[1]
FACTS = ROOT / "examples" / "2x2080ti-22g.json"
MODEL = "tiny"
CONTEXT = "2048"
RUN_LIMIT_S = 180.0   # a start that fails must have ended by then
GUARD_VARS = ["VLLM_USE_FLASHINFER_SAMPLER", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "TORCH_CUDA_ARCH_LIST",
              "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "_CAOVAN_APPLIED"]
ENV_SET = re.compile(r"env\.(?P<var>[A-Z_]+)=(?P<value>\S*) set: ")


@pytest.fixture(scope="module")
def lane(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve")
    logs = Path(os.environ.get("SERVE_LANE_LOGS") or root / "logs")
    logs.mkdir(parents=True, exist_ok=True)
    return {"root": root, "logs": logs,
            # 1,200 of its ~1,650 tokens are special: its replies often decode to no text
            "tiny": write_qwen3(root / "tiny", reserved=1200),
            # one request of 262,144 tokens needs 2 GiB of KV cache
            "fat": write_qwen3(root / "fat", layers=4, kv_heads=8, max_positions=262144),
            "hybrid": write_qwen3_next(root / "hybrid")}


def _served(server: Server, name: str) -> None:
    """Count a server that became ready (the lane prints the total)."""
    record = os.environ.get("SERVE_LANE_RECORD")
    if record:
        with open(record, "a") as f:
            f.write(f"{name} ready in {server.ready_s:.0f} s\n")


def _keep(log: Path, lane: dict[str, Path]) -> None:
    """The log with this machine's paths replaced, as test data would have it."""
    text = log.read_text(errors="replace")
    log.write_text(sanitize(text, {str(lane["root"]): "<tmp>", sys.prefix: "<venv>", str(ROOT): "<checkout>"}))


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def _run(cmd: list[str], timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)


# -- a `vllm serve` with our plugin, taking its SM75 decisions from a facts file ---------------------

@pytest.fixture(scope="module")
def facts_server(lane):
    probe_out = lane["root"] / "probe-out"
    probe = install_env_probe(lane["root"] / "probe", probe_out, GUARD_VARS)
    env = lane_env(lane["root"] / "home-facts", CAOVAN_FACTS=str(FACTS),
                   CAOVAN_CACHE_DIR=str(lane["root"] / "cache-facts"), PYTHONPATH=str(probe))
    srv = vllm_serve(lane["tiny"], free_port(), lane["logs"] / "vllm_serve_facts.log", env,
                     "--served-model-name", MODEL, "--max-model-len", CONTEXT).start()
    try:
        assert srv.wait_ready(MODEL), _tail(srv.log)
        _served(srv, "vllm serve (plugin, facts of 2 x 2080 Ti)")
        yield srv, probe_out
    finally:
        srv.stop()
        _keep(srv.log, lane)


def test_guards_reach_every_vllm_process(facts_server):
    srv, probe_out = facts_server
    banner = {m.group("var"): m.group("value") for m in ENV_SET.finditer(srv.log.read_text())}
    assert banner.get("VLLM_USE_FLASHINFER_SAMPLER") == "0" and "TRITON_CACHE_DIR" in banner
    dumps = probe_dumps(probe_out)
    live = [p for p in tree(srv.proc.pid) if "resource_tracker" not in Path(f"/proc/{p}/cmdline").read_text()]
    assert set(live) <= set(dumps), f"vLLM processes without a probe dump: {set(live) - set(dumps)}"
    assert len(dumps) >= 3   # API server, engine core, worker
    for pid, env in dumps.items():
        for var in GUARD_VARS[:-1]:
            assert env[var] == banner[var], (pid, var)
        assert env["_CAOVAN_APPLIED"] == f"vLLM process pid {srv.proc.pid}"
    workers = re.findall(r"guards from vLLM process pid (\d+) apply in this process \(pid (\d+)\)",
                         srv.log.read_text())
    # Every line that claims guards is from a process that has them (a short-lived helper process
    # may load plugins without vLLM's logging, so it logs nothing).
    claimed = {int(p) for _, p in workers}
    assert len(claimed) >= 2 and claimed <= set(dumps) - {srv.proc.pid}


def test_warmup_is_ready_although_replies_decode_to_no_text(facts_server):
    srv, _ = facts_server
    empty = 0
    for i in range(12):   # the premise: this model's replies often decode to nothing
        r = httpx.post(srv.base + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": f"question {i}: what is {i} + {i}?", "max_tokens": 4, "ignore_eos": True,
            "temperature": 0})
        choice, usage = r.json()["choices"][0], r.json()["usage"]
        assert usage["completion_tokens"] == 4
        empty += choice["text"] == ""
    assert empty, "the model should generate tokens that decode to no text"
    r = _run([str(BIN / "caovan-sm75-warmup"), "--api-base", srv.base, "--model", MODEL, "--wait", "30"])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.rstrip().splitlines()[-1] == "[Caovan] warmup=READY"


def _metric(base: str, name: str) -> float:
    text = httpx.get(base + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_bench_agrees_with_the_servers_metrics_and_plots(facts_server, tmp_path):
    srv, _ = facts_server
    plot = tmp_path / "bench.png"
    r = _run([str(BIN / "caovan-sm75-bench"), "--api-base", srv.base, "--model", MODEL, "--json",
              "--prompt-tokens", "256", "--output-tokens", "64", "--concurrency", "1", "--repeats", "3",
              "--plot", str(plot)])
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    row = report["runs"][0]
    server = report["server_metrics"]
    assert server["requests"] == 3 and server["generation_tokens"] == 3 * 64
    # this server was started without a compilation config: the bench read its process and says so
    assert report["server"]["cudagraph_mode"] is None
    assert "asks for no CUDA-graph mode" in report["server"]["cudagraph_mode_how"], report["server"]
    # Tolerance (docs/bench.md): the same requests seen from both ends; decode tok/s per stream within
    # 35 %, TTFT within 50 % or 250 ms. On this 2-core machine the client sometimes gets a whole reply's
    # chunks at its end, most likely the API server starved while the engine computes (2 of 5 runs: TTFT
    # 175 against 8 ms once, decode 19,131 against 374 tok/s once); then it saw no token timing at all,
    # the counts above still check the run, and the timing comparison is not made.
    coalesced = row["decode_tok_s"] > 3 * server["decode_tok_s"]
    if not coalesced:
        assert abs(row["ttft_s"] - server["ttft_s"]) <= max(0.5 * server["ttft_s"], 0.25), (row, server)
        assert abs(row["decode_tok_s"] - server["decode_tok_s"]) <= 0.35 * server["decode_tok_s"], (row, server)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000
    text = _run([str(BIN / "caovan-sm75-bench"), "--api-base", srv.base, "--model", MODEL, "--prompt-tokens",
                 "128", "--output-tokens", "16", "--concurrency", "1", "--repeats", "1"])
    assert text.returncode == 0 and "server /metrics over the run:" in text.stdout


def test_prefix_probe_reports_the_servers_cache_hits(facts_server):
    srv, _ = facts_server
    hits_before = _metric(srv.base, "vllm:prefix_cache_hits_total")
    r = _run([str(BIN / "caovan-sm75-bench"), "--api-base", srv.base, "--model", MODEL, "--json",
              "--prefix-probe", "--prompt-tokens", "1024"])
    assert r.returncode == 0, r.stderr[-2000:]
    probe = json.loads(r.stdout)["prefix_probe"]
    hits = _metric(srv.base, "vllm:prefix_cache_hits_total") - hits_before
    assert probe["verdict"] == "hit" and probe["hit_tokens"] == hits and hits >= 512
    assert probe["prompt_tokens"] >= 1000 and probe["ttft_ratio"] > 0


def _failed_start(server: Server, lane: dict[str, Path], cause: str, words: str) -> None:
    """Run a start that must fail to its end (bounded), then check `doctor --log` names `cause`
    with and without our lines in the log; keep the log."""
    server.start()
    try:
        code = server.wait_exit(RUN_LIMIT_S)
    finally:
        server.stop()
    assert code not in (0, None), _tail(server.log)
    for t in (triage_path(str(server.log)), without_our_lines(server.log)):
        assert t.exit_code == 2 and t.ready_line is None, t.to_dict()
        assert t.first_failure.id == cause, t.to_dict()
        assert words in t.first_failure.text + t.first_failure.fix
    _keep(server.log, lane)


def test_a_second_server_on_the_same_port_is_named(facts_server, lane):
    srv, _ = facts_server
    log = lane["logs"] / "vllm_serve_port_in_use.log"
    _failed_start(vllm_serve(lane["tiny"], srv.port, log, lane_env(lane["root"] / "home-port")), lane,
                  "address-in-use", "Address already in use")


def test_the_healthy_servers_log_is_not_fatal(facts_server):
    srv, _ = facts_server
    t = triage_path(str(srv.log))
    # Never fatal; a warning only where our own checks warned (vLLM 0.27's CPU build is not one we
    # ran end to end: runtime=WARN, which is true of this process).
    assert t.ready_line and t.http_ok > 10 and t.exit_code < 2 and t.first_failure is None, t.to_dict()
    assert {f.id for f in t.findings if f.status != "harmless"} <= {"caovan-runtime-warn"}, t.to_dict()
    assert t.caovan.status["sm75"] == "2/2" and t.caovan.processes >= 2


# -- caovan-vllm-serve on this machine, which has no Turing GPU -------------------------------------

def test_launcher_execs_vllm_untouched_and_ctrl_c_ends_every_child(lane):
    log = lane["logs"] / "caovan_vllm_serve_no_gpu.log"
    env = lane_env(lane["root"] / "home-launch")
    srv = vllm_serve(lane["tiny"], free_port(), log, env, "--served-model-name", MODEL, "--max-model-len", CONTEXT,
                     launcher="caovan-vllm-serve").start()
    try:
        assert srv.wait_ready(MODEL), _tail(log)
        _served(srv, "caovan-vllm-serve (no Turing GPU: vLLM untouched)")
        assert "vllm" in Path(f"/proc/{srv.proc.pid}/cmdline").read_text()   # the launcher became vLLM
        processes = tree(srv.proc.pid)
        assert len(processes) >= 3
        took, left = srv.interrupt()
        assert not left, f"still running {took:.0f} s after Ctrl-C: {left}"
    finally:
        srv.stop()
    text = log.read_text()
    assert "sm75=0/0" in text and "nothing of ours applies in this process" in text
    assert "guards from" not in text
    t = triage_path(str(log))
    assert t.ready_line and t.exit_code == 0 and t.caovan.inactive_processes >= 2, t.to_dict()
    _keep(log, lane)


# -- a hybrid GDN model (Qwen3-Next) with the plugin: its per-process GDN line is true there ------------

def test_hybrid_gdn_model_serves_and_our_gdn_line_says_vllms_own(lane):
    log = lane["logs"] / "vllm_serve_hybrid_gdn.log"
    srv = vllm_serve(lane["hybrid"], free_port(), log, lane_env(lane["root"] / "home-hybrid"),
                     "--served-model-name", MODEL, "--max-model-len", CONTEXT, "--mamba-ssm-cache-dtype", "float32")
    srv.start()
    try:
        assert srv.wait_ready(MODEL), _tail(log)
        _served(srv, "vllm serve of a hybrid GDN model (Qwen3-Next, float32 SSM cache)")
        r = httpx.post(srv.base + "/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": "a prompt of a few words " * 40, "max_tokens": 8, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
    finally:
        srv.stop()
    text = log.read_text()
    # On the CPU vLLM runs its own GDN kernels; the line each worker logs must say so.
    assert re.search(r"GDN prefill: gdn_legacy=upstream interface=modular-qwen-gdn-v022 kernel=vllm-upstream "
                     r"why=no SM75 GPU", text), _tail(log)
    assert "kernel=caovan-gdn-chunk" not in text
    t = triage_path(str(log))
    assert t.ready_line and t.exit_code == 0, t.to_dict()
    _keep(log, lane)


# -- starts that fail ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name,model,extra,env,cause,words", [
    ("missing_model", "does-not-exist", (), {}, "model-not-found", "does-not-exist"),
    ("bad_flag", "tiny", ("--no-such-flag", "3"), {}, "bad-argument", "--no-such-flag"),
    ("kv_cache_too_small", "fat", (), {"VLLM_CPU_KVCACHE_SPACE": "1"}, "kv-cache-too-small", "at most 131072"),
])
def test_failed_starts_are_named(lane, name, model, extra, env, cause, words):
    log = lane["logs"] / f"vllm_serve_{name}.log"
    model_dir = lane.get(model, lane["root"] / model)
    _failed_start(vllm_serve(model_dir, free_port(), log, lane_env(lane["root"] / f"home-{name}", **env), *extra),
                  lane, cause, words)


# -- one decision per process, whatever source the settings come from (issue 39) ----------------------

def _status(text: str) -> dict[str, str]:
    """The first banner's key=value lines."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if "Caovan vLLM SM75 Turbo3 external plugin v" in ln)
    out = {}
    for ln in lines[start + 1:]:
        m = re.search(r"(?:^|\] )([a-z][a-z0-9_]*)=(\S+)$", ln)
        if not m:
            break
        out[m.group(1)] = m.group(2)
    return out


def test_settings_in_a_config_yaml_reach_the_banner_and_every_process(lane):
    """`vllm serve MODEL --config FILE.yaml` with the plugin's settings in the file's additional-config:
    the banner (first process) and the GDN line of the engine's processes say what the file asked."""
    cfg = lane["root"] / "serve.yaml"
    cfg.write_text(f"served-model-name: {MODEL}\nmax-model-len: {CONTEXT}\nmamba-ssm-cache-dtype: float32\n"
                   "additional-config:\n  caovan_turbo: off\n  caovan_gdn_legacy_disable: true\n")
    log = lane["logs"] / "vllm_serve_config_yaml.log"
    env = lane_env(lane["root"] / "home-yaml", CAOVAN_FACTS=str(FACTS), CAOVAN_CACHE_DIR=str(lane["root"] / "cache-yaml"))
    srv = vllm_serve(lane["hybrid"], free_port(), log, env, "--config", str(cfg)).start()
    try:
        assert srv.wait_ready(MODEL), _tail(log)
        _served(srv, "vllm serve --config FILE.yaml (plugin settings in the file)")
    finally:
        srv.stop()
    text = log.read_text(errors="replace")
    status = _status(text)
    assert (status["turbo"], status["gdn_legacy"], status["turbo3"]) == ("off-by-user", "disabled-by-user", "inactive")
    gdn = re.findall(r"GDN prefill: gdn_legacy=(\S+) .* why=(.*)$", text, re.M)
    assert gdn and all(state == "disabled-by-user" and "additional-config caovan_gdn_legacy_disable" in why
                       for state, why in gdn), gdn
    assert "decided from" not in text   # no process found settings its decision had not read
    _keep(log, lane)


LLM_SCRIPT = """
import sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":   # vLLM spawns its engine core: the script must be importable without running
    llm = LLM(model=sys.argv[1], load_format="dummy", dtype="bfloat16", max_model_len={context},
              mamba_ssm_cache_dtype="float32", additional_config={{"caovan_mode": "guards"}})
    out = llm.generate(["a prompt of a few words"], SamplingParams(max_tokens=2, ignore_eos=True))
    print("GENERATED", len(out[0].outputs[0].token_ids), flush=True)
"""


def test_llm_additional_config_reaches_the_banner_and_the_engine(lane):
    """`LLM(additional_config={"caovan_mode": "guards"})` in a user's script: the script's process (the banner)
    and the engine core (its GDN line) both decide mode=guards, the way CAOVAN_MODE=guards would."""
    script = lane["root"] / "offline.py"
    script.write_text(LLM_SCRIPT.format(context=CONTEXT))
    log = lane["logs"] / "llm_additional_config.log"
    env = lane_env(lane["root"] / "home-llm", CAOVAN_FACTS=str(FACTS), CAOVAN_CACHE_DIR=str(lane["root"] / "cache-llm"))
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, str(script), str(lane["hybrid"])], stdout=out, stderr=subprocess.STDOUT,
                                env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=RUN_LIMIT_S * 2)
        finally:   # the engine core is a child of the script: end the whole group, whatever happened
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    text = log.read_text(errors="replace")
    assert code == 0 and "GENERATED 2" in text, _tail(log)
    status = _status(text)
    assert (status["mode"], status["turbo"], status["gdn_legacy"]) == ("guards", "off", "upstream"), status
    gdn = re.findall(r"GDN prefill: gdn_legacy=(\S+) .* why=(.*)$", text, re.M)
    assert gdn and all(state == "upstream" and "mode=guards (additional-config caovan_mode)" in why
                       for state, why in gdn), gdn
    assert "decided from" not in text
    _keep(log, lane)
