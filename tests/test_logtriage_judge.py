"""The judge (logtriage/judge.py) over every log we hold: its rules as properties. A log cut anywhere
before the first sign of a server serving is never OK; any log that served, with a crash excerpt
appended, is FATAL; a failed JIT build is FATAL with the cause its command line shows; the fast path
(triage_stream) agrees with the full one (triage_lines) on every log made here."""

from __future__ import annotations

import io
import random
import re
from pathlib import Path

import pytest

from caovan_vllm_sm75_turbo3.logtriage import judge as judge_mod
from caovan_vllm_sm75_turbo3.logtriage.reader import read_lines
from caovan_vllm_sm75_turbo3.logtriage.triage import triage_lines, triage_stream

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = sorted((ROOT / "tests" / "data" / "logs").glob("*.log"))
SHARED = sorted((ROOT.parent / "shared" / "field_logs").glob("*.log"))
ALL_LOGS = FIXTURES + SHARED
OK_2XX = re.compile(rb'HTTP/[\d.]+" 2\d\d')


def full(data: bytes):
    return triage_lines(read_lines(io.BytesIO(data)))


def fast(data: bytes):
    return triage_stream(io.BytesIO(data))


def first_serving_line(lines: list[bytes]) -> int:
    """The index of the first line that shows a server serving (its ready line, a 2xx answer)."""
    for i, ln in enumerate(lines):
        if b"Application startup complete" in ln or OK_2XX.search(ln):
            return i
    return len(lines)


def test_the_rules_are_data_in_one_place_and_the_docs_name_each():
    ids = [r.id for r in judge_mod.RULES]
    assert ids == ["jit-build-failed", "no-serving", "crash-after-serving"]
    page = (ROOT / "docs" / "logtriage.md").read_text()
    for rule in judge_mod.RULES:
        assert rule.id in judge_mod.__doc__ and f"`{rule.id}`" in page, rule.id


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name)
def test_a_log_cut_anywhere_before_it_shows_serving_is_never_ok(path):
    lines = path.read_bytes().splitlines(keepends=True)
    end = first_serving_line(lines)
    rng = random.Random(f"{path.name}:{random.randrange(10**6)}")
    cuts = sorted({0, 1, end, *(rng.randrange(end + 1) for _ in range(12))})
    for cut in cuts:
        data = b"".join(lines[:cut])
        t = full(data)
        assert t.exit_code != 0 and t.verdict in ("fatal", "undecided", "warning"), (cut, t.verdict)
        assert fast(data).to_dict() == t.to_dict(), cut


# What a crash after serving looks like in the logs people paste (shapes from vLLM 0.21-0.34 and torch).
CRASHES = {
    "engine-core-traceback-cut": (
        "(EngineCore_DP0 pid=812) ERROR 07-31 01:24:58 [core.py:1012] EngineCore encountered a fatal error.\n"
        "(EngineCore_DP0 pid=812) ERROR 07-31 01:24:58 [core.py:1012] Traceback (most recent call last):\n"
        '(EngineCore_DP0 pid=812) ERROR 07-31 01:24:58 [core.py:1012]   File "/v/vllm/v1/engine/core.py", line 1003, in run_engine_core\n'
        '(EngineCore_DP0 pid=812) ERROR 07-31 01:24:58 [core.py:1012]   File "/v/vllm/model_executor/layers/mamba/gdn_linear_attn.py", line 640, in _forward_core\n'),
    "nccl-watchdog": (
        "[rank1]:[E731 01:24:58.516124705 ProcessGroupNCCL.cpp:2119] [PG ID 2 PG GUID 3 Rank 1] Process group "
        "watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n"),
    "cuda-error": (
        "(Worker_TP0 pid=301) ERROR 12-02 18:15:40 [multiproc_executor.py:962] RuntimeError: CUDA error: "
        "device-side assert triggered\n"),
    "frames-only": (
        '(EngineCore_DP0 pid=9)   File "/v/vllm/v1/worker/gpu_model_runner.py", line 3310, in execute_model\n'
        '(EngineCore_DP0 pid=9)   File "/v/torch/nn/modules/module.py", line 1775, in _call_impl\n'),
    "engine-dead": (
        "(APIServer pid=7) ERROR 12-05 02:00:01 [async_llm.py:1] EngineDeadError: EngineCore encountered an issue. "
        "See stack trace (above) for the root cause.\n"),
    "worker-died": "ERROR 12-05 02:00:01 [multiproc_executor.py:150] Worker proc VllmWorker-1 died unexpectedly, shutting down executor.\n",
    "unspecified-launch": ("torch.AcceleratorError: CUDA error: unspecified launch failure\n"),
}


def healthy_logs() -> list[Path]:
    out = []
    for path in ALL_LOGS:
        t = full(path.read_bytes())
        if t.exit_code == 0 and (t.ready_line is not None or t.http_ok):
            out.append(path)
    return out


HEALTHY = healthy_logs()


def test_there_are_healthy_logs_to_append_crashes_to():
    assert len(HEALTHY) >= 4, [p.name for p in HEALTHY]


def with_crash(path: Path, crash: str, at: int | None = None) -> bytes:
    """The log with a crash excerpt put in after it served: right after its first sign of serving,
    or at line `at` after it (what followed goes on after the crash, a shutdown included)."""
    lines = path.read_bytes().splitlines(keepends=True)
    if lines and not lines[-1].endswith(b"\n"):
        lines[-1] += b"\n"
    where = first_serving_line(lines) + 1 if at is None else at
    return b"".join(lines[:where]) + crash.encode() + b"".join(lines[where:])


@pytest.mark.parametrize("crash", sorted(CRASHES))
@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: p.name)
def test_any_healthy_log_with_a_crash_appended_is_fatal(path, crash):
    lines = path.read_bytes().splitlines()
    served = first_serving_line(lines) + 1
    data = with_crash(path, CRASHES[crash], random.randrange(served, served + 1 + min(3, len(lines) - served)))
    t = full(data)
    assert t.verdict == "fatal" and t.exit_code == 2, (crash, [(f.id, f.status) for f in t.findings])
    assert fast(data).to_dict() == t.to_dict()
    if crash in ("engine-dead", "worker-died"):   # consequences only: never named the cause
        assert t.first_failure.id not in ("engine-dead", "worker-died", "crash-after-serving")
    else:
        assert t.first_failure.id == "crash-after-serving"


def test_the_first_crash_sign_is_the_cause_and_the_rest_its_consequences():
    t = full(with_crash(ROOT / "tests/data/logs/real_vllm027_healthy_facts.log",
                        CRASHES["nccl-watchdog"] + CRASHES["engine-dead"] + CRASHES["worker-died"]))
    crash = next(f for f in t.findings if f.id == "crash-after-serving")
    assert "watchdog" in crash.text and t.first_failure.id == "crash-after-serving"
    assert "EngineDeadError" in crash.note and "died" in crash.note and "consequences" in crash.note


def test_a_crash_after_a_requested_shutdown_is_not_a_crash():
    base = (ROOT / "tests/data/logs/real_vllm027_healthy_facts.log").read_bytes()
    t = full(base + b"INFO 12-05 02:00:00 [launcher.py:1] Shutting down FastAPI HTTP server.\n"
             + CRASHES["engine-dead"].encode())
    assert t.verdict != "fatal" and t.exit_code != 2


def test_a_client_request_traceback_on_the_api_server_is_not_an_engine_crash():
    base = (ROOT / "tests/data/logs/real_vllm027_healthy_facts.log").read_bytes()
    t = full(base + b"(APIServer pid=7) ERROR 12-05 02:00:01 [serving_chat.py:1] Traceback (most recent call last):\n"
             b'(APIServer pid=7)   File "/v/vllm/entrypoints/openai/serving_chat.py", line 2, in create\n'
             b"(APIServer pid=7) ValueError: 'messages' must not be empty\n")
    assert not any(f.id == "crash-after-serving" for f in t.findings)


NVCC = ("(EngineCore_DP0 pid=77) ERROR 05-02 10:00:00 [core.py:708] subprocess.CalledProcessError: Command "
        "'['ninja', '-v', '-C', '/root/.cache/flashinfer/0.6.8/75/cached_ops']' returned non-zero exit status 1.\n"
        "(EngineCore_DP0 pid=77) ERROR 05-02 10:00:00 [core.py:708] FAILED: sampling.cuda.o\n"
        "(EngineCore_DP0 pid=77) ERROR 05-02 10:00:00 [core.py:708] {path} --generate-dependencies-with-compile "
        "-gencode=arch=compute_75,code=sm_75 -O3 -c sampling.cu -o sampling.cuda.o\n"
        "(EngineCore_DP0 pid=77) ERROR 05-02 10:00:00 [core.py:708] /bin/sh: 1: {path}: not found\n"
        "(EngineCore_DP0 pid=77) ERROR 05-02 10:00:00 [core.py:708] ninja: build stopped: subcommand failed.\n")


def test_a_jit_build_whose_compiler_path_has_a_stray_colon_is_fatal_and_names_it():
    t = full(NVCC.format(path=":/usr/local/cuda-12.8/bin/nvcc").encode())
    assert t.verdict == "fatal" and t.first_failure is not None
    assert "stray ':'" in t.first_failure.cause and "CUDA_HOME" in t.first_failure.fix
    assert "/usr/local/cuda-12.8" in t.first_failure.fix
    assert fast(NVCC.format(path=":/usr/local/cuda-12.8/bin/nvcc").encode()).to_dict() == t.to_dict()


def test_a_jit_build_without_a_compiler_or_with_an_old_one_names_that():
    none = full(b"(EngineCore_DP0 pid=7) ERROR 05-02 10:00:00 [core.py:708] OSError: CUDA_HOME environment "
                b"variable is not set. Please set it to your CUDA install root.\n"
                b"(EngineCore_DP0 pid=7) ERROR 05-02 10:00:00 [core.py:708] Error building extension 'sampling'\n")
    assert none.verdict == "fatal" and "CUDA_HOME" in none.first_failure.cause
    old = full(b"(EngineCore_DP0 pid=7) ERROR 05-02 10:00:00 [core.py:708] nvcc fatal   : Unsupported gpu "
               b"architecture 'compute_120'\n"
               b"(EngineCore_DP0 pid=7) ERROR 05-02 10:00:00 [core.py:708] ninja: build stopped: subcommand failed.\n")
    assert old.verdict == "fatal" and "compute_120" in old.first_failure.cause
    assert "TORCH_CUDA_ARCH_LIST=7.5" in old.first_failure.fix


@pytest.mark.parametrize("tail", [
    b"(EngineCore pid=13792) INFO 07-31 06:25:37 [gpu_model_runner.py:6322] Encoder cache will be initialized "
    b"with a budget of 16384 tokens, and profiled with 1 image items of the maximum feature size.\n",
    b"(Worker_TP0 pid=128) WARNING 08-16 03:04:54 [kv_cache_utils.py:1208] Add 3 padding layers, may waste at "
    b"most 6.25% KV cache memory\n",
    b"INFO 12-01 10:00:00 [__init__.py:1] Automatically detected platform cuda.\n"
    b"INFO 12-01 10:00:01 [api_server.py:1] vLLM API server version 0.21.0\n"
    b"INFO 12-01 10:00:05 [cuda.py:1] Using TRITON_ATTN backend.\n",
])
def test_the_field_shapes_that_were_called_ok_are_undecided(tail):
    t = full(tail)
    assert t.verdict == "undecided" and t.exit_code == 1
    assert "before it shows the server ready" in t.findings[0].cause


def test_a_healthy_log_cut_before_its_ready_line_is_undecided():
    lines = (ROOT / "tests/data/logs/real_vllm027_healthy_facts.log").read_bytes().splitlines(keepends=True)
    ready = next(i for i, ln in enumerate(lines) if b"Application startup complete" in ln)
    assert full(b"".join(lines[:ready])).verdict == "undecided"
    assert full(b"".join(lines)).exit_code == 0


def test_the_docs_hold_the_rules_table_as_generated():
    page = (ROOT / "docs" / "logtriage.md").read_text()
    start, end = "<!-- judge-rules:start -->\n", "\n<!-- judge-rules:end -->"
    assert page[page.index(start) + len(start):page.index(end)] == judge_mod.rules_markdown()


def test_no_advice_for_what_the_log_shows_already_applied():
    gdn_off = ("INFO 12-05 02:38:03 [register.py:96] Caovan vLLM SM75 Turbo3 external plugin v0.6.0\n"
               "INFO 12-05 02:38:03 [register.py:96] runtime=PASS\n"
               "INFO 12-05 02:38:03 [register.py:96] gdn_legacy=disabled-by-user\n"
               "(EngineCore_DP0 pid=9) ERROR 12-05 02:39:00 [core.py:1] RuntimeError: CUDA error: invalid resource "
               "handle\n"
               "(EngineCore_DP0 pid=9) ERROR 12-05 02:39:00 [core.py:1] EngineCore failed to start.\n")
    t = full(gdn_off.encode())
    gdn = next(f for f in t.findings if f.id == "gdn-legacy-failure")
    assert "already in effect" in gdn.fix and not gdn.fix.startswith("Set CAOVAN_GDN_LEGACY_DISABLE=1")
    plain = full(gdn_off.replace("gdn_legacy=disabled-by-user", "gdn_legacy=legacy-gdn-linear-attn-v020").encode())
    assert next(f for f in plain.findings if f.id == "gdn-legacy-failure").fix.startswith("Set CAOVAN_GDN_LEGACY_DISABLE=1")
    ar = ("(APIServer pid=7) INFO 12-05 02:38:03 [utils.py:1] non-default args: {'model': 'm', "
          "'tensor_parallel_size': 2, 'disable_custom_all_reduce': True}\n"
          "(Worker_TP0 pid=8) WARNING 12-05 02:38:30 [custom_all_reduce.py:1] Custom allreduce is disabled because "
          "your platform lacks GPU P2P capability or P2P test failed.\n"
          "(APIServer pid=7) INFO:     Application startup complete.\n")
    for text, applied in ((ar, True), (ar.replace("True}", "False}"), False)):
        f = next(f for f in full(text.encode()).findings if f.id == "custom-allreduce-disabled")
        assert ("already runs with custom all-reduce off" in f.fix) is applied
        assert ("pass --disable-custom-all-reduce" in f.fix) is not applied
        assert fast(text.encode()).to_dict() == full(text.encode()).to_dict()


def _index() -> list[tuple[str, str]]:
    path = ROOT.parent / "shared" / "field_logs" / "INDEX.tsv"
    if not path.is_file():
        return []
    rows = [ln.split("\t") for ln in path.read_text().splitlines()[1:] if ln.strip()]
    return [(r[0], re.split(r"[\s;(.:-]", r[3], 1)[0]) for r in rows]


@pytest.mark.parametrize("name,expected", _index())
def test_each_shared_field_log_gets_the_verdict_its_index_names(name, expected):
    """../shared/field_logs/INDEX.tsv: the verdict a person reading each public log settled on."""
    t = full((ROOT.parent / "shared" / "field_logs" / name).read_bytes())
    want = {"FATAL": ("fatal",), "UNDECIDED": ("undecided",), "OK": ("clean", "harmless-only")}[expected]
    assert t.verdict in want, (t.verdict, t.first_failure)


def test_the_judge_leaves_its_inputs_as_they_were():
    """judge() is pure: judging the same evidence twice gives the same verdict (V0's KV wording is
    rewritten in a copy, not in the reader's own finding)."""
    from caovan_vllm_sm75_turbo3.logtriage.triage import _Reader

    reader = _Reader()
    for ln in read_lines(io.BytesIO(b"ERROR 12-02 10:00:00 [engine.py:1] ValueError: The model's max seq len (29000) "
                                    b"is larger than the maximum number of tokens that can be stored in KV cache "
                                    b"(23648). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
                                    b"when initializing the engine.\n")):
        reader.feed(ln)
    assert "v0_max_model_len" in reader.findings["kv-cache-too-small"].details   # the wording the judge rewrites
    before = {k: (dict(f.details), f.cause, f.fix) for k, f in reader.findings.items()}
    first = judge_mod.judge(reader.ev, reader.findings)
    again = judge_mod.judge(reader.ev, reader.findings)
    assert [f.to_dict() for f in first[0]] == [f.to_dict() for f in again[0]]
    assert {k: (dict(f.details), f.cause, f.fix) for k, f in reader.findings.items()} == before
