"""Log input at the boundary (issue 17): `caovan-sm75-doctor --log` with a closed standard input,
a FIFO nothing writes to, a broken gzip or bytes that are not UTF-8 ends fast with a report or one
line (exit 2); a huge log is read in bounded memory; text read from files (log lines, GPU names)
is printed literally by every report, rich markup characters included."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from helpers.hostile import FAST, assert_clean, run_main

from caovan_vllm_sm75_turbo3.cli import doctor
from caovan_vllm_sm75_turbo3.logtriage import reader

from helpers.facts import ROOT, facts_dict

BIN = Path(sys.executable).parent
ERR = "caovan-sm75-doctor: error: "
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "


def _log(*args: str):
    return run_main(doctor.PROG, doctor.main, ["--log", *args])


def test_a_closed_standard_input_is_one_line_exit_2():
    r = subprocess.run([str(BIN / "caovan-sm75-doctor"), "--log", "-"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT, preexec_fn=lambda: os.close(0))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ERR + "--log -: standard input is closed; pipe a log into it (... | caovan-sm75-doctor " \
                             "--log -) or give the log's path\n"


def test_a_fifo_nothing_writes_to_is_refused_after_the_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "FIFO_WAIT_S", 0.3)
    fifo = tmp_path / "log"
    os.mkfifo(fifo)
    r = _log(str(fifo))
    assert_clean(r, codes=(2,))
    assert r.err == f"{ERR}--log {str(fifo)!r}: a FIFO that nothing wrote to within 0.3 s; start the writer " \
                    "first, or pipe the log into --log -\n"


def test_a_fifo_is_read_as_a_stream_once_its_writer_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "FIFO_WAIT_S", 10.0)
    fifo = tmp_path / "log"
    os.mkfifo(fifo)

    def write() -> None:
        time.sleep(0.2)
        with open(fifo, "w") as w:
            w.write(OOM + "\n")
            w.flush()
            time.sleep(0.2)
            w.write("INFO:     Application startup complete.\n")
    writer = threading.Thread(target=write)
    writer.start()
    r = _log(str(fifo), "--json")
    writer.join(timeout=10)
    assert_clean(r)
    out = json.loads(r.out)
    assert out["lines"] == 2 and out["findings"]


def test_a_pipe_path_like_process_substitution_is_read(tmp_path):
    rfd, wfd = os.pipe()
    os.write(wfd, b"INFO:     Application startup complete.\n")
    os.close(wfd)
    try:
        r = _log(f"/dev/fd/{rfd}")
    finally:
        os.close(rfd)
    assert_clean(r, codes=(0,))
    assert "the server started (line 1" in r.out


def test_a_gzip_cut_in_the_middle_is_one_line_exit_2(tmp_path):
    data = gzip.compress(os.urandom(300_000).hex().encode())  # not compressible: cut after the sniffed head
    p = tmp_path / "log.gz"
    p.write_bytes(data[: len(data) // 2])
    r = _log(str(p))
    assert_clean(r, codes=(2,))
    assert r.err.startswith(f"{ERR}--log {str(p)!r}: cannot read it (Compressed file ended")


def test_bytes_that_are_not_utf8_are_replaced_not_fatal(tmp_path):
    p = tmp_path / "log"
    p.write_bytes(OOM.encode() + b"\xff\xfe caf\xe9\nINFO ok \x80\n")
    r = _log(str(p), "--json")
    assert_clean(r)
    assert "\ufffd" in json.loads(r.out)["findings"][0]["text"]


def test_a_huge_log_is_read_in_bounded_memory():
    # 10 MiB: a line of 8 MiB without a newline (a dumped tensor), then 2 MiB of short lines.
    class Stream:
        """Made on the fly, a chunk at a time, so that only the reader's memory is measured."""

        def __init__(self) -> None:
            self.parts = [(b"x", 8 << 20), (b"INFO a line of a log\n", 2 << 20)]

        def read(self, size: int = -1) -> bytes:
            if not self.parts:
                return b""
            unit, left = self.parts[0]
            n = min(size, left) // len(unit) or 1
            self.parts[0] = (unit, left - n * len(unit))
            if self.parts[0][1] <= 0:
                self.parts.pop(0)
            return unit * n
    stream = Stream()
    tracemalloc.start()
    try:
        n = sum(1 for _ in reader.read_lines(stream))  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n > 99_000  # (2 MiB / 21 bytes; the first short line continues the long one)
    assert peak < 2 << 20, peak  # the chunk and one capped line, not the log


_LITERAL = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), min_size=1, max_size=30) | st.sampled_from(
    ["[bold]x[/]", "[/]", "[/nope]", "\\[b]", "x\\", "[red]:smile:[/red]", "[link=file:///etc]y[/link]"])


def _squeeze(text: str) -> str:
    """The text without whitespace and table borders: a wrapped cell is still a substring."""
    return "".join(ch for ch in text if not ch.isspace() and ch not in "│┃┏┓┗┛┡┩└┘├┤─━┼╇╈┳┻╋┬┴")


@FAST
@given(tail=_LITERAL)
def test_log_text_is_printed_literally(tail):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d, "log")
        p.write_text(OOM + tail + "\n")
        text, as_json = _log(str(p)), _log(str(p), "--json")
    assert_clean(text)
    assert _squeeze(tail) in _squeeze(text.out)
    assert json.loads(as_json.out, parse_constant=_no_constant)["findings"][0]["text"].endswith(tail)


def _no_constant(name: str) -> None:
    raise AssertionError(f"not strict JSON: {name}")


@FAST
@given(name=_LITERAL)
def test_gpu_names_from_a_facts_file_are_printed_literally(name):
    data = facts_dict()
    for gpu in data["gpus"]:
        gpu["name"] = name
    with tempfile.TemporaryDirectory() as d:
        p = Path(d, "facts.json")
        p.write_text(json.dumps(data))
        r = run_main(doctor.PROG, doctor.main, ["--facts", str(p)])
        as_json = run_main(doctor.PROG, doctor.main, ["--facts", str(p), "--json"])
    assert_clean(r)
    assert _squeeze(f"0:{name} (7.5)") in _squeeze(r.out), r.out
    assert json.loads(as_json.out, parse_constant=_no_constant)["facts"]["gpus"][0]["name"] == name


def test_the_text_report_turns_no_emoji_code_into_an_emoji(tmp_path):
    data = facts_dict()
    data["gpus"][0]["name"] = ":smile: [bold]GPU[/bold]"
    p = tmp_path / "facts.json"
    p.write_text(json.dumps(data))
    r = run_main(doctor.PROG, doctor.main, ["--facts", str(p)])
    assert ":smile: [bold]GPU[/bold]" in r.out and "\U0001f604" not in r.out


@pytest.mark.parametrize("stdin", [b"", b"\x00" * 100])
def test_empty_or_binary_standard_input_is_a_report_or_one_line(monkeypatch, stdin):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    r = _log("-")
    assert_clean(r)
