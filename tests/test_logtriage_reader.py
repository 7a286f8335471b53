"""The streaming log reader: prefixes and colours stripped, bounded memory, binary and unreadable input."""

from __future__ import annotations

import gzip
import io
import os
import random
import subprocess
import sys
import tracemalloc

import pytest

from caovan_vllm_sm75_turbo3.errors import CaovanError
from caovan_vllm_sm75_turbo3.logtriage import reader
from caovan_vllm_sm75_turbo3.logtriage.reader import clean, open_log, read_lines
from caovan_vllm_sm75_turbo3.logtriage.triage import triage_lines, triage_path

MSG = "No available shared memory broadcast block found in 60 seconds."


@pytest.mark.parametrize("raw,process,level,source", [
    # vllm/logger.py _FORMAT with the worker prefix of vllm/utils/system_utils.py _add_prefix
    (f"(EngineCore_DP0 pid=123) INFO 12-02 17:44:10 [shm_broadcast.py:681] {MSG}", "EngineCore_DP0", "INFO",
     "shm_broadcast.py:681"),
    (f"(Worker_TP1 pid=456) WARNING 12-02 17:44:10 [shm_broadcast.py:681] {MSG}", "Worker_TP1", "WARNING",
     "shm_broadcast.py:681"),
    # ColoredFormatter: coloured level, grey time and [file:line], cyan prefix
    (f"\x1b[36m(APIServer pid=7)\x1b[0m \x1b[32mINFO\x1b[0m \x1b[90m12-02 17:44:10\x1b[0m "
     f"\x1b[90m[shm_broadcast.py:681]\x1b[0m {MSG}", "APIServer", "INFO", "shm_broadcast.py:681"),
    # DEBUG level shows a shortened relative path
    (f"DEBUG 12-02 17:44:10 [distributed/.../device_communicators/shm_broadcast.py:681] {MSG}", None, "DEBUG",
     "distributed/.../device_communicators/shm_broadcast.py:681"),
    # docker logs -t, and a Ray worker prefix
    (f"2025-12-02T17:44:10.123456789Z (RayWorkerWrapper pid=99, ip=127.0.0.1) INFO 12-02 17:44:10 "
     f"[shm_broadcast.py:681] {MSG}", "RayWorkerWrapper", "INFO", "shm_broadcast.py:681"),
    # journald
    (f"Dec 02 17:44:10 box vllm[812]: (Worker_TP0 pid=813) INFO 12-02 17:44:10 [shm_broadcast.py:681] {MSG}",
     "Worker_TP0", "INFO", "shm_broadcast.py:681"),
    # vLLM <= 0.10 named workers "VllmWorker TP0"
    (f"(VllmWorker TP0 pid=456) INFO 12-02 17:44:10 [shm_broadcast.py:681] {MSG}", "VllmWorker TP0", "INFO",
     "shm_broadcast.py:681"),
    # uvicorn's own formatter
    ("(APIServer pid=7) INFO:     " + MSG, "APIServer", "INFO", None),
    (MSG, None, None, None),
])
def test_clean_strips_what_vllm_and_log_collectors_add(raw, process, level, source):
    ln = clean(raw, 5)
    assert (ln.text, ln.process, ln.level, ln.source, ln.number) == (MSG, process, level, source, 5)


def test_traceback_indentation_survives_the_header():
    ln = clean('(Worker_TP0 pid=1) ERROR 12-02 17:44:10 [multiproc_executor.py:962]   File "/x.py", line 3, in f')
    assert ln.text == '  File "/x.py", line 3, in f'


def test_lines_are_numbered_like_an_editor_and_carriage_returns_split():
    data = (b"first\r\n"                      # vLLM's multi-line records end lines with \r\n
            b"\n"
            b"(Worker_TP0 pid=1) \rLoading: 0%\rLoading: 100%\n"   # tqdm redraws with \r
            b"last line without newline")
    lines = list(read_lines(io.BytesIO(data)))
    assert [(ln.number, ln.text, ln.process) for ln in lines] == [
        (1, "first", None), (3, "Loading: 0%", "Worker_TP0"), (3, "Loading: 100%", "Worker_TP0"),
        (4, "last line without newline", None)]


def test_over_long_lines_keep_start_and_end_and_the_next_line_is_intact(monkeypatch):
    monkeypatch.setattr(reader, "CHUNK_BYTES", 1000)          # make the line span many chunks
    end = " RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    data = b"x" * 50_000 + end.encode() + b"\n" + MSG.encode() + b"\n"
    lines = list(read_lines(io.BytesIO(data)))
    assert len(lines) == 2 and len(lines[0].text) == reader.MAX_LINE_BYTES + len(" ... ")
    assert lines[0].text.startswith("x" * reader.KEEP_BYTES + " ... x") and lines[0].text.endswith(end)
    assert (lines[1].number, lines[1].text) == (2, MSG)
    # an error at the end of a long prefix is still found (issue 29: it was cut off)
    t = triage_lines(read_lines(io.BytesIO(b"x" * 20_000 + end.encode() + b"\n")))
    assert t.first_failure is not None and t.first_failure.id == "cuda-oom"


def test_invalid_utf8_and_control_bytes_do_not_stop_the_reader():
    data = b"\xff\xfe garbage \x07\x08 " + MSG.encode() + b"\n"
    [ln] = list(read_lines(io.BytesIO(data)))
    assert ln.text.endswith(MSG) and "\x07" not in ln.text


# VmHWM (the peak resident memory of this process image), not ru_maxrss, which Linux carries over
# from the forking parent (here pytest).
PEAK_RSS = r"""
import re, sys
from caovan_vllm_sm75_turbo3.logtriage.triage import triage_path
t = triage_path(sys.argv[1])
hwm = re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)
print(t.lines, t.first_failure.id if t.first_failure else "-", t.first_failure.line if t.first_failure else 0,
      t.http_ok, hwm)
"""


def _triage_in_child(path) -> list[str]:
    r = subprocess.run([sys.executable, "-c", PEAK_RSS, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc for peak memory")
def test_huge_log_streams_in_bounded_memory(tmp_path):
    """About 20 MB of a busy server's log with the fatal line at the very end: the child that reads
    it peaks at (nearly) the same memory as one that reads an empty log."""
    path = tmp_path / "huge.log"
    stats = ("(APIServer pid=4410) INFO 12-02 17:55:05 [loggers.py:259] Engine 000: Avg prompt throughput: "
             "409.6 tokens/s, Avg generation throughput: 97.8 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
             "GPU KV cache usage: 3.1%, Prefix cache hit rate: 42.0%\n")
    ok = '(APIServer pid=4410) INFO:     127.0.0.1:55012 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
    block = (stats + ok) * 1000
    with path.open("w") as f:
        while f.tell() < 20_000_000:
            f.write(block)
        f.write("(EngineCore_DP0 pid=1) ERROR 12-02 17:54:14 [core.py:1142] "
                "TimeoutError: RPC call to execute_model timed out.\n")
    n_lines = path.read_bytes().count(b"\n")
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    lines, first, line, ok_count, rss_kib = _triage_in_child(path)
    base_rss_kib = int(_triage_in_child(empty)[-1])
    assert (int(lines), first, int(line)) == (n_lines, "execute-timeout", n_lines)
    assert int(ok_count) == (n_lines - 1) // 2
    assert int(rss_kib) - base_rss_kib < 8 * 1024, (rss_kib, base_rss_kib)   # the file is 19,000+ KiB


def test_triage_state_stays_small_on_a_log_of_many_distinct_failures():
    """Python-level allocations stay bounded however many messages match (counts, not lists)."""
    line = "(Worker_TP{i} pid={i}) ERROR 12-02 17:00:00 [x.py:1] RuntimeError: CUDA error: invalid resource handle\n"
    data = "".join(line.format(i=i % 50) for i in range(5_000)).encode()
    tracemalloc.start()
    try:
        t = triage_lines(read_lines(io.BytesIO(data)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    [f] = t.findings
    assert f.count == 5_000 and f.first_line == 1 and f.last_line == 5_000
    assert peak < 256 * 1024 < len(data), (peak, len(data))   # a 64 KiB chunk, 80 recent lines, counters


def test_binary_file_is_one_clear_error(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(random.Random(7).randbytes(64 * 1024))
    with pytest.raises(CaovanError, match="not a text log"):
        triage_path(str(path))


def test_binary_garbage_inside_a_text_log_is_skipped(tmp_path):
    path = tmp_path / "crashed.log"
    path.write_bytes(b"INFO 12-02 17:00:00 [x.py:1] starting\n" * 300 + b"\x00" * 5000 + b"\n"
                     + b"ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0.\n")
    t = triage_path(str(path))
    assert t.first_failure.id == "bf16-unsupported" and t.first_failure.line == 302


def test_gzip_log_is_unpacked(tmp_path):
    path = tmp_path / "vllm.log.gz"
    path.write_bytes(gzip.compress(b"(Worker_TP0 pid=1) ERROR 12-02 17:00:00 [x.py:1] RuntimeError: "
                                   b"CUDA error: invalid resource handle\n"))
    t = triage_path(str(path))
    assert t.first_failure.id == "gdn-legacy-failure"


def test_missing_path_and_directory_are_clear_errors(tmp_path):
    with pytest.raises(CaovanError, match="No such file"):
        triage_path(str(tmp_path / "nope.log"))
    with pytest.raises(CaovanError, match="directory"):
        triage_path(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of their mode")
def test_unreadable_file_is_a_clear_error(tmp_path):
    path = tmp_path / "secret.log"
    path.write_text("x\n")
    path.chmod(0)
    with pytest.raises(CaovanError, match="Permission denied"):
        triage_path(str(path))


def test_an_empty_file_is_undecided_never_ok(tmp_path):
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    with open_log(str(path)) as stream:
        assert list(read_lines(stream)) == []
    t = triage_path(str(path))
    assert t.lines == 0 and t.verdict == "undecided" and t.exit_code == 1 and t.ready_line is None
    assert "the log is empty" in t.findings[0].cause.lower()
