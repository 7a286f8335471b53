"""Each known message, judged from a realistic log excerpt (tests/data/logs, written from the message
texts and logger formats in vLLM 0.21's, Triton 3.6's and FlashInfer 0.6's sources)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from caovan_vllm_sm75_turbo3.logtriage.reader import read_lines
from caovan_vllm_sm75_turbo3.logtriage.signature import Rule
from caovan_vllm_sm75_turbo3.logtriage.signatures import SIGNATURES
from caovan_vllm_sm75_turbo3.logtriage.triage import Triage, triage_lines, triage_path

LOGS = Path(__file__).resolve().parent / "data" / "logs"
RUNTIME_FAIL = ("Caovan vLLM SM75 Turbo3 external plugin v0.1.0\nruntime=FAIL\nsm75=0/0\n"
                "flashinfer_sampler=disabled-sm75-guard\n")


def run(name: str) -> Triage:
    return triage_path(str(LOGS / name))


def run_text(text: str) -> Triage:
    return triage_lines(read_lines(io.BytesIO(text.encode())))


def by_id(t: Triage) -> dict[str, str]:
    """The known messages found (the judge's own verdict on a start no excerpt finishes left out)."""
    return {f.id: f.status for f in t.findings if f.id != "start-undecided"}


def known(t: Triage) -> list:
    return [f for f in t.findings if f.id != "start-undecided"]


SERVED = "INFO:     Application startup complete.\n"


def line_of(name: str, needle: str) -> int:
    """The 1-based number of the first line of the excerpt that contains `needle`."""
    for i, line in enumerate((LOGS / name).read_text().splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in {name}")


# (excerpt, id of the first real failure, the text on that line, words the fix must contain)
FATAL_CASES = [
    ("shm_wait_then_execute_timeout.log", "execute-timeout", "RPC call to execute_model timed out",
     ["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1800", "caovan-sm75-warmup"]),
    ("mixed_wait_harmless_then_gdn_invalid_handle.log", "gdn-legacy-failure", "RuntimeError: CUDA error: invalid resource handle",
     ["CAOVAN_GDN_LEGACY_DISABLE=1"]),
    ("flashinfer_sampler_jit_curand.log", "flashinfer-sampler-jit", "RuntimeError: Ninja build failed",
     ["VLLM_USE_FLASHINFER_SAMPLER=0", "CAOVAN_FLASHINFER_SAMPLER=guard"]),
    ("attention_jit_nvcc_missing.log", "jit-build-failed", "Could not find nvcc", ["caovan-sm75-doctor", "CUDA_HOME"]),
    ("bf16_on_turing.log", "bf16-unsupported", "Bfloat16 is only supported", ["--dtype half"]),
    ("triton_shared_memory_gdn.log", "triton-shared-memory", "Hardware limit: 65536", ["64 KiB"]),
    ("fp8_kv_vllm026.log", "fp8-kv-unsupported", "No valid attention backend found", ["vllm==0.21.0", "--kv-cache-dtype"]),
    ("fp8e4nv_triton.log", "fp8-kv-unsupported", "fp8e4nv not supported", ["--kv-cache-dtype"]),
    # a real log: vLLM 0.24.0 in our engine check (benchmarks/results/engine_h100_2026-12-07_vllm0.24_fp8_mtp_tritonattn)
    ("fp8_kv_mtp_drafter_vllm024.log", "fp8-kv-mtp-drafter", "FP8 KV cache is not supported by the Triton attention",
     ['"attention_backend":"CUSTOM"', "--kv-cache-dtype auto"]),
    ("cuda_oom_profile.log", "cuda-oom", "CUDA out of memory. Tried to allocate 2.25 GiB", ["--max-num-batched-tokens"]),
    ("cuda_oom_graph_capture.log", "cuda-oom", "CUDA out of memory. Tried to allocate 512.00 MiB",
     ["--gpu-memory-utilization", "cudagraph_capture_sizes", "--enforce-eager"]),
    ("kv_cache_too_small.log", "kv-cache-too-small", "KV cache is needed", ["--max-model-len to at most 36608"]),
    ("host_oom_killed_during_load.log", "host-oom-kill", "'EngineCore': -9", ["swap"]),
    # vLLM 0.34's format: the process prefix is part of the logger format, tracebacks come unprefixed
    ("vllm034_worker_killed.log", "host-oom-kill", "died unexpectedly (exit code: -9)", ["swap"]),
]


@pytest.mark.parametrize("name,first,needle,fix_words", FATAL_CASES, ids=[c[0] for c in FATAL_CASES])
def test_first_real_failure_cause_and_fix(name, first, needle, fix_words):
    t = run(name)
    assert t.verdict == "fatal" and t.exit_code == 2
    ff = t.first_failure
    assert ff is not None and ff.id == first
    assert ff.line == line_of(name, needle), (ff.line, ff.text)
    assert needle in ff.text
    for word in fix_words:
        assert word in ff.fix, (word, ff.fix)
    # the fatal cause is listed before anything that is a consequence of it
    fatal = [f for f in t.findings if f.status == "fatal"]
    assert fatal[0].id == first


def test_execute_timeout_names_the_method_and_the_wait_before_it_is_fatal():
    t = run("shm_wait_then_execute_timeout.log")
    f = {x.id: x for x in t.findings}
    assert f["execute-timeout"].details["method"] == "execute_model"
    wait = f["shm-broadcast-wait"]
    assert wait.status == "fatal" and wait.count == 4 and wait.details["seconds"] == "60"
    assert "followed by a failure" in wait.note
    assert by_id(t)["engine-dead"] == "fatal" and by_id(t)["http-5xx"] == "fatal"
    assert t.http_error == 2 and t.http_ok == 1   # 500 on the request, 503 on /health afterwards


@pytest.mark.parametrize("name,decided_by", [
    ("shm_wait_then_ready.log", "init engine"),                     # start-up finished after the waits
    ("shm_wait_first_request_200.log", '"POST /v1/chat/completions HTTP/1.1" 200'),   # first request JIT
])
def test_shared_memory_wait_is_harmless_when_the_server_answers_afterwards(name, decided_by):
    t = run(name)
    wait = next(f for f in t.findings if f.id == "shm-broadcast-wait")
    assert wait.status == "harmless" and decided_by in wait.note
    assert t.verdict == "harmless-only" and t.exit_code == 0 and t.first_failure is None


def test_shared_memory_wait_at_the_end_of_the_log_is_not_decided():
    t = run("shm_wait_log_ends.log")
    wait = next(f for f in t.findings if f.id == "shm-broadcast-wait")
    assert wait.status == "warning" and "not decided" in wait.note
    assert t.exit_code == 1 and t.first_failure is None


def test_mixed_log_harmless_messages_before_the_fatal_one():
    t = run("mixed_wait_harmless_then_gdn_invalid_handle.log")
    status = by_id(t)
    assert status["shm-broadcast-wait"] == "harmless"          # resolved by start-up, before the failure
    assert status["custom-allreduce-disabled"] == "harmless"
    assert status["gdn-legacy-failure"] == "fatal"
    assert t.first_failure.id == "gdn-legacy-failure"
    order = [f.status for f in t.findings]
    assert order == sorted(order, key=["fatal", "warning", "harmless"].index)
    # the banner's active GDN path names legacy-gdn-linear-attn-v020 without being a failure
    gdn = next(f for f in t.findings if f.id == "gdn-legacy-failure")
    assert gdn.first_line == line_of(t.source.split("/")[-1], "RuntimeError: CUDA error")


def test_our_dispatch_failure_is_a_fallback_warning_with_the_interface():
    t = run("caovan_dispatch_failed_fallback.log")
    f = next(x for x in t.findings if x.id == "caovan-dispatch-failed")
    assert f.status == "warning" and f.count == 2
    assert f.details["interface"] == "modular-qwen-gdn-v022"
    assert f.details["reason"].startswith("CUDA error: invalid resource handle")
    assert "CAOVAN_GDN_LEGACY_DISABLE=1" in f.fix
    assert "gdn-legacy-failure" not in by_id(t)   # the same words on our fallback lines are not fatal
    assert t.exit_code == 1 and t.vllm_version == "0.23.1"
    # the banner's env/arg lines stay in the banner; our per-process lines are summarised, not judged
    c = t.caovan
    assert c.status["turbo3"] == "active" and "env.VLLM_USE_FLASHINFER_SAMPLER" not in c.status
    assert c.processes == 2
    assert list(c.states.values()) == [1, 2]
    assert next(iter(c.states)).startswith("gdn_legacy=modular-qwen-gdn-v022 interface=modular-qwen-gdn-v022")
    assert set(by_id(t)) == {"caovan-dispatch-failed"}


def test_require_turbo3_refusal_in_the_banner_is_the_first_failure():
    t = run("caovan_require_turbo3_refused.log")
    assert t.first_failure.id == "caovan-refused" and t.first_failure.line == 8
    f = next(x for x in t.findings if x.id == "caovan-refused")
    assert f.details["reason"].startswith("require-turbo3 is on")
    assert t.caovan.status["gdn_legacy"] == "upstream"
    assert t.caovan.checks == ["vllm=WARN: vLLM 0.35.0 is newer than the newest release we read (0.34) "
                               "-> pip install vllm==0.21.0"]


def test_clean_log_says_so():
    t = run("clean_plain_vllm.log")
    assert t.findings == [] and t.verdict == "clean" and t.exit_code == 0
    assert t.ready_line == line_of("clean_plain_vllm.log", "Application startup complete")
    assert t.http_ok == 2 and t.vllm_version == "0.21.0"


def test_coloured_tp2_log_with_only_harmless_messages_and_our_banner():
    t = run("harmless_tp2_colour.log")
    assert by_id(t) == {"custom-allreduce-disabled": "harmless", "flashinfer-sampler-fallback": "harmless"}
    assert t.exit_code == 0 and t.ready_line is not None and t.http_ok == 3
    c = t.caovan
    assert c.version == "0.1.0" and c.line == 1
    assert c.status == {"runtime": "PASS", "sm75": "2/2", "flashinfer_sampler": "disabled-sm75-guard",
                        "post_start_warmup": "disabled-default", "gdn_legacy": "legacy-gdn-linear-attn-v020"}
    assert "2 of 2" in c.meanings()["sm75"]


def test_details_make_the_advice_specific():
    smem = next(f for f in run("triton_shared_memory_gdn.log").findings if f.id == "triton-shared-memory")
    assert smem.details["kernel"] == "chunk_gated_delta_rule_fwd_kernel_h_blockdim64"
    assert "81,920" in smem.cause and "65,536" in smem.cause
    bf16 = next(f for f in run("bf16_on_turing.log").findings if f.id == "bf16-unsupported")
    assert bf16.details == {"gpu": "NVIDIA GeForce RTX 2080 Ti", "capability": "7.5"}
    fp8 = run("fp8_kv_vllm026.log")
    assert fp8.vllm_version == "0.26.0" and "vLLM 0.26.0" in fp8.first_failure.cause
    fp8_old = run("fp8e4nv_triton.log")          # 0.21 still has an fp8 KV backend: no release blame
    assert "This log is from vLLM" not in fp8_old.first_failure.cause
    phases = {name: next(f for f in run(name).findings if f.id == "cuda-oom").phase
              for name in ("cuda_oom_profile.log", "cuda_oom_graph_capture.log")}
    assert phases == {"cuda_oom_profile.log": "profile", "cuda_oom_graph_capture.log": "graph-capture"}
    kv = run("kv_cache_too_small.log").first_failure   # vLLM 0.21's wording: "models's max seq len"
    assert "262144 tokens needs 8.00 GiB of KV cache" in kv.cause and "VLLM_CPU_KVCACHE_SPACE" in kv.fix
    host = next(f for f in run("host_oom_killed_during_load.log").findings if f.id == "host-oom-kill")
    assert host.phase == "load" and "while loading the weights" in host.cause


def test_banner_logged_as_one_multi_line_vllm_record():
    # NewLineFormatter repeats the header after each "\r\n"; _add_prefix adds the process name
    head = "(APIServer pid=7) INFO 12-02 18:00:00 [register.py:103] "
    record = "\r\n".join(head + x for x in ("Caovan vLLM SM75 Turbo3 external plugin v0.2.0", "runtime=PASS",
                                             "sm75=1/2", "gdn_legacy=disabled-by-user")) + "\r\n"
    t = run_text(record + head + "Using max model len 4096\r\n")
    assert t.caovan.version == "0.2.0" and t.caovan.line == 1
    assert t.caovan.status == {"runtime": "PASS", "sm75": "1/2", "gdn_legacy": "disabled-by-user"}
    assert "CAOVAN_GDN_LEGACY_DISABLE=1" in t.caovan.meanings()["gdn_legacy"]
    assert known(t) == [] and t.verdict == "undecided"   # a banner alone never shows a server serving


def test_vllm_034_log():
    t = run("vllm034_worker_killed.log")
    assert t.vllm_version == "0.34.0"
    assert by_id(t)["flashinfer-sampler-fallback"] == "harmless"     # "...; falling back."
    host = next(f for f in t.findings if f.id == "host-oom-kill")
    assert host.phase == "load" and host.count == 2 and host.process == "EngineCore"
    sampler_forced = run_text("RuntimeError: FlashInfer top-p/top-k sampling unavailable: unsupported compute "
                              "capability 7.5. Unset VLLM_USE_FLASHINFER_SAMPLER=1.\n")
    assert by_id(sampler_forced) == {"flashinfer-sampler-refused": "fatal"}


def test_our_runtime_fail_is_about_the_plugin_never_the_engines_failure():
    t = run_text(RUNTIME_FAIL + SERVED)   # sm75=0/0: nothing of ours applied
    assert t.first_failure is None and t.exit_code == 0 and by_id(t) == {"caovan-runtime-fail": "harmless"}
    assert t.caovan.status["sm75"] == "0/0" and "no Turing GPU" in t.caovan.meanings()["sm75"]
    on_turing = run_text(RUNTIME_FAIL.replace("sm75=0/0", "sm75=2/2") + SERVED)
    assert by_id(on_turing) == {"caovan-runtime-fail": "warning"} and on_turing.exit_code == 1
    stopped = run_text(RUNTIME_FAIL.replace("sm75=0/0", "sm75=2/2") + "caovan-vllm-serve: error: runtime=FAIL: "
                       "driver: driver 535.1 is older than CUDA 13.0 needs (580+)\n")
    assert stopped.exit_code == 2 and stopped.first_failure.id == "caovan-launch-stopped"


@pytest.mark.parametrize("alarm,stops", [
    ("AssertionError", False),
    ("(EngineCore pid=9) CRITICAL 12-05 02:00:00 [core.py:1] something the engine could not survive", False),
    ("ERROR 12-05 02:00:00 [gpu_worker.py:1] something went wrong", False),
    ('(Worker_TP0 pid=9) ERROR 12-05 02:00:00 [gpu_worker.py:1]   File "/v/x.py", line 3, in load_model', False),
    ("Fatal Python error: Segmentation fault", True),
    # Python's own traceback of an uncaught exception: its process ends
    ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nZeroDivisionError: division by zero", True),
    # a process's exit handler logs its traceback, then the process ends (frames only: the excerpt cut both ends)
    ('(Worker_TP1 pid=9) ERROR 12-05 02:00:00 [multiproc_executor.py:971]   File "/v/x.py", line 3, in f', True),
    ("(EngineCore pid=9) ERROR 12-05 02:00:00 [core.py:1] Traceback (most recent call last):", True),
    ("AssertionError\nCRITICAL 12-05 02:00:00 [core_client.py:156] Got fatal signal from worker processes, shutting "
     "down. See stack trace above for root cause issue.", True),
    ("ERROR 12-05 02:00:00 [x.py:1] boom\nINFO:     Shutting down", True),
])
def test_a_start_that_never_got_ready_and_shows_an_error_is_never_clean(alarm, stops):
    """The start rule: an error before the server was ready is FATAL where the log shows the engine
    or server stopping, else UNDECIDED; never OK. After 'Application startup complete' it is not."""
    log = "INFO 12-05 02:00:00 [api_server.py:1] vLLM API server version 0.27.0\n" + alarm + "\n"
    t = run_text(log)
    if stops:
        assert t.exit_code == 2 and t.verdict == "fatal" and t.first_failure.id == "unexplained-failure"
        assert "No known cause" in t.first_failure.cause
    else:
        assert t.exit_code == 1 and t.verdict == "undecided" and t.first_failure is None
        f = next(f for f in t.findings if f.id == "start-undecided")
        assert "ends before it shows whether the engine stopped" in f.cause and f.first_line == 2
    ready = run_text(log.replace(alarm, "INFO:     Application startup complete.\n" + alarm))
    assert ready.first_failure is None or ready.first_failure.id != "unexplained-failure"
    assert "start-undecided" not in by_id(ready)


@pytest.mark.parametrize("phase_line,words", [
    ("INFO 12-05 02:00:00 [gpu_model_runner.py:1] Starting to load model /m...", "while loading the weights"),
    ("INFO 12-05 02:00:00 [gpu_worker.py:1] Available KV cache memory: 10.0 GiB", "while sizing the KV cache"),
    ("INFO 12-05 02:00:00 [gpu_model_runner.py:1] Capturing CUDA graphs (mixed prefill-decode)", "during CUDA-graph"),
])
def test_a_log_that_ends_mid_start_without_an_error_is_undecided(phase_line, words):
    t = run_text("INFO 12-05 02:00:00 [api_server.py:1] vLLM API server version 0.27.0\n" + phase_line + "\n")
    assert t.verdict == "undecided" and t.exit_code == 1
    assert words in next(f for f in t.findings if f.id == "start-undecided").cause
    done = run_text("INFO 12-05 02:00:00 [api_server.py:1] vLLM API server version 0.27.0\n" + phase_line
                    + "\nINFO:     Application startup complete.\n")
    assert done.verdict == "clean" and done.exit_code == 0


def test_only_consequences_name_no_cause_and_say_it_is_not_in_the_log():
    text = ("2025-10-24T17:12:08.36 +08:00 CST (APIServer pid=1) ERROR 10-24 17:12:08 [async_llm.py:480] "
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
            "for the root cause.\n"
            "2025-10-24T17:12:08.37 +08:00 CST (APIServer pid=1) INFO:     127.0.0.1:1 - \"POST /v1/chat/completions "
            "HTTP/1.1\" 500 Internal Server Error\n")
    t = run_text(text)
    assert t.verdict == "fatal" and t.first_failure.id == "cause-not-in-log" and t.first_failure.line == 1
    assert "consequence" in t.first_failure.cause and "EngineDeadError" in t.first_failure.text
    assert not t.first_failure.text.startswith("+08:00")


def test_port_in_use_after_startup_complete_is_fatal():
    text = ("INFO:     Application startup complete.\n"
            "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use\n"
            "INFO:     Waiting for application shutdown.\nINFO:     Application shutdown complete.\n")
    t = run_text(text)
    assert t.verdict == "fatal" and t.first_failure.id == "address-in-use" and t.first_failure.line == 2
    assert t.findings[0].details.get("port") == "8000"


def test_a_consequence_is_never_the_first_failure_when_an_exception_stands_before_it():
    log = ("INFO:     Application startup complete.\n"
           "(EngineCore pid=9) Traceback (most recent call last):\n"
           "(EngineCore pid=9)   File \"x.py\", line 1, in step\n"
           "(EngineCore pid=9) RuntimeError: Unsupported CPU attention configuration: head_dim=16\n"
           "(EngineCore pid=9) ERROR 12-05 02:00:01 [core.py:1] EngineCore encountered a fatal error.\n"
           "(APIServer pid=7) ERROR 12-05 02:00:01 [async_llm.py:1] EngineDeadError: EngineCore encountered an issue.\n"
           '(APIServer pid=7) INFO:     127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error\n')
    t = run_text(log)
    assert t.exit_code == 2 and t.first_failure.id == "crash-after-serving" and "head_dim=16" in t.first_failure.text
    crash = next(f for f in t.findings if f.id == "crash-after-serving")
    assert "EngineDeadError" in crash.note and "consequences" in crash.note


V = "(Worker_TP0 pid=5231) ERROR 12-02 18:15:40 [multiproc_executor.py:962] "
TB = V + "Traceback (most recent call last):\n"

# Single messages in the forms other releases and tools print them: (log text, expected id, status).
VARIANTS = [
    # vLLM <= 0.10 logged the wait at DEBUG as "in %s second."
    ("DEBUG 06-01 10:00:00 [shm_broadcast.py:501] No available shared memory broadcast block found in 60 second.\n",
     "shm-broadcast-wait", "warning"),
    (V + "RuntimeError: GDN prefill kernel warmup failed: CUDA error: invalid resource handle\n",
     "gdn-legacy-failure", "fatal"),
    (TB + V + '  File "/opt/venv/lib/python3.11/site-packages/flashqla_legacy/chunk.py", line 141, in forward\n'
     + V + "RuntimeError: CUDA error: an illegal memory access was encountered\n", "gdn-legacy-failure", "fatal"),
    ("ERROR 12-02 18:00:00 [gdn.py:10] legacy-gdn-linear-attn-v020 failed to initialise: bad shapes\n",
     "gdn-legacy-failure", "fatal"),
    (V + "/usr/bin/sh: 1: nvcc: not found\n" + V + "building flashinfer/sampling.cu\n",
     "flashinfer-sampler-jit", "fatal"),
    (V + "RuntimeError: FlashInfer does not support compute capability 7.5, unset VLLM_USE_FLASHINFER_SAMPLER=1.\n",
     "flashinfer-sampler-refused", "fatal"),
    ("ValueError: Qwen3ForCausalLM does not support bfloat16 on this device\n", "bf16-unsupported", "fatal"),
    ("Killed\n", "host-oom-kill", "fatal"),
    ("./serve.sh: line 12:  4410 Killed                  vllm serve /models/q --tensor-parallel-size 2\n",
     "host-oom-kill", "fatal"),
    ("vllm-1 exited with code 137\n", "host-oom-kill", "fatal"),
    ("[12345.678] Out of memory: Killed process 4410 (python3) total-vm:61234567kB\n", "host-oom-kill", "fatal"),
    ("(EngineCore_DP0 pid=1) ERROR 12-02 18:15:40 [multiproc_executor.py:284] Worker proc VllmWorker-1 died "
     "unexpectedly, shutting down executor.\n", "worker-died", "fatal"),
    ("(APIServer pid=1) INFO:     127.0.0.1:1 - \"POST /v1/completions HTTP/1.1\" 500 Internal Server Error\n",
     "http-5xx", "fatal"),
    ("WARNING 12-02 18:00:00 [utils.py:1732] Not enough SMs to use max_autotune_gemm mode\n",
     "inductor-few-sms", "harmless"),
    ("[Caovan] warmup=FAILED step=prefill-4096 reason=HTTP 500 from /v1/completions\n",
     "caovan-warmup-failed", "fatal"),
    (V + "caovan_vllm_sm75_turbo3.plugin.dispatch.controller.DispatchError: require-turbo3 (env CAOVAN_REQUIRE_TURBO3) "
     "is on, but our GDN prefill cannot serve this process: precompile failed. Unset CAOVAN_REQUIRE_TURBO3\n",
     "caovan-refused", "fatal"),
    ("WARNING 12-02 18:00:00 [register.py:101] Caovan SM75 Turbo3: guards not applied in this process (pid 7): "
     "boom\n", "caovan-plugin-inactive", "warning"),
    ("WARNING 12-02 18:00:00 [register.py:30] Caovan SM75 Turbo3: plugin inactive in this process: "
     "CAOVAN_MODE='fast' is not accepted\n", "caovan-plugin-inactive", "warning"),
    ("(APIServer pid=1) WARNING 12-02 18:00:00 [topk_topp_sampler.py:61] FlashInfer top-p/top-k sampling not "
     "supported on compute capability 7.5; falling back to PyTorch-native sampler.\n",
     "flashinfer-sampler-fallback", "harmless"),
    # huggingface_hub's GatedRepoError as vLLM's API server prints it (issue 29: verdict was OK, exit 0)
    ("(APIServer pid=1) huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-x)\n"
     "(APIServer pid=1) Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.1-8B/resolve/"
     "main/config.json.\n(APIServer pid=1) Access to model meta-llama/Llama-3.1-8B is restricted. You must have "
     "access to it and be authenticated to access it. Please log in.\n", "gated-repo", "fatal"),
    ("(EngineCore_DP0 pid=5) ValueError: Free memory on device cuda:0 (3.12/21.48 GiB) on startup is less than "
     "desired GPU memory utilization (0.9, 19.33 GiB). Decrease GPU memory utilization or reduce GPU memory used "
     "by other processes.\n", "gpu-memory-busy", "fatal"),
    ("(APIServer pid=1) ValueError: Invalid repository ID or local directory specified: '/data/qwen/missing'.\n",
     "model-not-found", "fatal"),
    ("caovan-vllm-serve: error: runtime=FAIL: torch: torch 2.11.0 has no CUDA build\n", "caovan-launch-stopped",
     "fatal"),
    ("AssertionError\nCRITICAL 02-11 20:39:41 core_client.py:156] Got fatal signal from worker processes, shutting "
     "down.\n", "unexplained-failure", "fatal"),
    ("AssertionError\n", "start-undecided", "warning"),
    # frames name the cause when the exception line is cut off (or says nothing: a bare AssertionError)
    ("ERROR 02-11 20:39:41 core.py:208]   File \"/v/vllm/v1/attention/backends/flash_attn.py\", line 155, in "
     "__init__\nERROR 02-11 20:39:41 core.py:208]     assert is_fa_version_supported(self.fa_version)\n"
     "ERROR 02-11 20:39:41 core.py:208] AssertionError\n", "fa2-unsupported", "fatal"),
    ('ERROR 03-19 11:54:51 [engine.py:158] AssertionError(\'Only FlashAttention backend is supported for now.\')\n',
     "needs-flash-attention", "fatal"),
    (V + '  File "/v/vllm/v1/worker/gpu_model_runner.py", line 9, in _dummy_sampler_run\n'
     + V + '  File "/v/flashinfer/sampling.py", line 9, in top_k_top_p_sampling_from_probs\n',
     "flashinfer-sampler-failed", "fatal"),
    ("(EngineCore pid=1) ValueError: The quantization method awq is not supported for the current GPU. Minimum "
     "capability: 75. Current capability: 70.\n", "quant-capability", "fatal"),
    ("(EngineCore pid=1) RuntimeError: ('Quantization scheme is not supported for ', 'the current GPU. Min "
     "capability: 80. ', 'Current capability: 75.')\n", "quant-capability", "fatal"),
    (V + '  File "/v/vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py", line 9, '
     "in _check_scheme_supported\n", "quant-capability", "fatal"),
    (V + "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1, unhandled system error "
     "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n", "nccl-init-failed", "fatal"),
    (V + '  File "/v/vllm/platforms/cuda.py", line 9, in check_if_supports_dtype\n', "bf16-unsupported", "fatal"),
    (V + "RuntimeError: CUDA error: no kernel image is available for execution on the device\n",
     "no-kernel-image", "fatal"),
    ("ImportError: /opt/venv/lib/python3.12/site-packages/vllm/_C.abi3.so: undefined symbol: "
     "_ZN3c104cuda9SetDeviceEa\n", "abi-mismatch", "fatal"),
    ("(APIServer pid=1) RuntimeError: Failed to infer device type\n", "no-gpu-visible", "fatal"),
    ("RuntimeError: No CUDA GPUs are available\n", "no-gpu-visible", "fatal"),
    ("The model's max seq len (29000) is larger than the maximum number of tokens that can be stored in KV cache "
     "(23648). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
     "engine.\n", "kv-cache-too-small", "fatal"),
]


@pytest.mark.parametrize("text,sid,status", VARIANTS, ids=[v[1] + str(i) for i, v in enumerate(VARIANTS)])
def test_message_variants(text, sid, status):
    t = run_text(text)
    assert {f.id: f.status for f in t.findings}.get(sid) == status, [(f.id, f.status) for f in t.findings]


@pytest.mark.parametrize("text", [
    "gdn_legacy=legacy-gdn-linear-attn-v020\n",                                   # our banner value
    "INFO 12-02 18:00:00 [dispatch.py:40] GDN prefill: flashqla_legacy kernel on legacy-gdn-linear-attn-v020\n",
    "INFO 12-02 18:00:00 [loggers.py:259] Engine 000: Running: 1 reqs, 137 tokens, -9 offset\n",
    "INFO:     127.0.0.1:1 - \"GET /health HTTP/1.1\" 200 OK\n",
    "INFO 12-02 18:00:00 [topk_topp_sampler.py:45] Using FlashInfer for top-p & top-k sampling.\n",
])
def test_normal_lines_that_share_words_with_failures_are_not_findings(text):
    assert known(run_text(text)) == [] and run_text(SERVED + text).findings == []


def test_an_unknown_exception_is_the_first_failure_when_the_engine_dies():
    text = (TB + V + '  File "/opt/x.py", line 3, in forward\n' + V + "ZeroDivisionError: division by zero\n"
            + "(APIServer pid=1) ERROR 12-02 18:15:41 [async_llm.py:704] AsyncLLM output_handler failed.\n")
    t = run_text(text)
    assert t.first_failure.id == "unexplained-failure" and t.first_failure.line == 3
    assert "ZeroDivisionError" in t.first_failure.text


def test_a_traceback_interleaved_with_another_process_keeps_its_exception_line():
    text = (TB + "(Worker_TP1 pid=5232) INFO 12-02 18:15:40 [x.py:1] unrelated\n"
            + V + '  File "/opt/flashqla_legacy/chunk.py", line 141, in forward\n'
            + V + "RuntimeError: boom\n" + "ERROR 12-02 18:15:41 [core.py:1142] EngineCore encountered a fatal error.\n")
    t = run_text(text)
    assert by_id(t)["gdn-legacy-failure"] == "fatal"      # the frame is inside TP0's traceback
    # reported at the exception line the frame leads to, with the frame kept as a detail
    assert t.first_failure.id == "gdn-legacy-failure" and t.first_failure.line == 4
    assert t.first_failure.text == "RuntimeError: boom"
    gdn = next(f for f in t.findings if f.id == "gdn-legacy-failure")
    assert "flashqla_legacy/chunk.py" in gdn.details["frame"]


def test_every_signature_is_found_in_some_excerpt():
    seen = {f.id for p in LOGS.glob("*.log") for f in triage_path(str(p)).findings}
    seen |= {f.id for text, _, _ in VARIANTS for f in run_text(text).findings}
    seen |= {f.id for f in run_text(RUNTIME_FAIL).findings}
    seen |= {t.first_failure.id for text, _, _ in VARIANTS if (t := run_text(text)).first_failure}   # cause-not-in-log
    assert {s.id for s in SIGNATURES} - seen == set()
    assert {s.rule for s in SIGNATURES} == set(Rule)


def test_docs_table_is_generated_from_the_signatures():
    from caovan_vllm_sm75_turbo3.logtriage.signatures import markdown_table

    page = (Path(__file__).resolve().parents[1] / "docs" / "logtriage.md").read_text()
    start, end = "<!-- logtriage-table:start -->\n", "\n<!-- logtriage-table:end -->"
    assert page[page.index(start) + len(start):page.index(end)] == markdown_table()


def test_each_vllm_wording_covers_every_supported_release_once():
    # The wordings were read in each release's wheel (0.21.0 to 0.34.0); the lanes with a vLLM check
    # the installed one (tests/test_logtriage_wordings.py). No gap, no overlap per message text.
    from caovan_vllm_sm75_turbo3.logtriage.signatures import SIGNATURES
    from caovan_vllm_sm75_turbo3.policy import vllm_versions as vv
    lo, hi = vv.minor_key(vv.SUPPORTED_MIN), vv.minor_key(vv.SUPPORTED_MAX_MINOR)
    supported = [(lo[0], m) for m in range(lo[1], hi[1] + 1)]
    for sig in SIGNATURES:
        by_text: dict[str, list[tuple[int, int]]] = {}
        for w in sig.wordings:
            a, _, b = w.releases.partition("-")
            by_text.setdefault(w.text, []).extend(
                (vv.minor_key(a)[0], m) for m in range(vv.minor_key(a)[1], vv.minor_key(b or a)[1] + 1))
        for text, minors in by_text.items():
            assert sorted(minors) == supported, (sig.id, text)


def test_triton_fp8_refusal_without_a_drafter_nearby_is_the_plain_fp8_finding():
    """The drafter's signature holds only with the drafter's frames around the line; else the model's own
    layers refused fp8 KV, and the fix names our backend."""
    line = ("(EngineCore pid=7) ValueError: FP8 KV cache is not supported by the Triton attention backend on "
            "NVIDIA GeForce RTX 2080 Ti (compute capability 7.5); native FP8 (fp8e4nv) requires SM89+.\n")
    t = run_text(RUNTIME_FAIL.replace("FAIL", "OK") + "INFO vllm=0.24.0\n" + line)
    ff = t.first_failure
    assert ff is not None and ff.id == "fp8-kv-unsupported"
    assert "--attention-backend CUSTOM" in ff.fix
    drafter = run_text("INFO [gpu_model_runner.py:5184] Loading drafter model...\n" + line)
    assert drafter.first_failure is not None and drafter.first_failure.id == "fp8-kv-mtp-drafter"
