"""`caovan-sm75-bench` end to end against the stand-in vLLM: the text report, the comparison with the
matched profile, the host findings as causes, failures, --plot; and its small parts (counters,
default plans, the server's --max-num-seqs)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from helpers.facts import EXAMPLES

from caovan_vllm_sm75_turbo3.bench import runner
from caovan_vllm_sm75_turbo3.bench.measure import default_concurrency, default_prompt_tokens
from caovan_vllm_sm75_turbo3.bench.metrics import ACCEPTED, DRAFT, acceptance, parse_counters
from caovan_vllm_sm75_turbo3.bench.report import BenchReport
from caovan_vllm_sm75_turbo3.bench.server_args import flag_value, learn_max_num_seqs
from caovan_vllm_sm75_turbo3.cli.bench import PROG, main
from caovan_vllm_sm75_turbo3.cli.common import run_cli
from caovan_vllm_sm75_turbo3.errors import SettingError

from helpers.fake_vllm_server import MODEL, fake  # noqa: F401  (fake is a pytest fixture)

QUICK = dict(pace_tok_s=40.0, prefill_tok_s=1000.0, tokens_per_chunk=3, spec_tokens=3)  # below the field numbers
TINY = ["--prompt-tokens", "48", "--output-tokens", "7", "--concurrency", "1", "--repeats", "1"]


def bench(capsys, url: str, *args: str, facts: str = "2x2080ti-22g.json") -> tuple[int, str, str]:
    code = run_cli(PROG, main, ["--api-base", url, "--model", MODEL, *TINY, "--facts", str(EXAMPLES / facts), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_report_names_the_profile_the_gap_and_the_host_causes(fake, capsys, tmp_path):
    facts = json.loads((EXAMPLES / "2x2080ti-22g.json").read_text())
    facts["host"]["cpu_governor"] = "powersave"
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(facts))
    srv = fake(**QUICK)
    code, out, err = bench(capsys, srv.url, "--facts", str(path))
    assert code == 0, err
    assert "decode tok/s" in out and "MTP acceptance: 66.7%" in out
    assert "profile: 2x2080ti-22g-qwen3.5-hybrid-v0.21 matches this hardware" in out
    assert "against about 100 tok/s in the field" in out and "GAP: slower than the field report" in out
    assert "WARN host-cpu-governor" in out and "cpupower frequency-set -g performance" in out
    assert "[bench] prompt 48 tokens, 1 at once, repeat 1/1" in err


def test_json_has_the_contract_fields_and_is_strict(fake, capsys):
    srv = fake(**QUICK)
    code, out, _ = bench(capsys, srv.url, "--json")
    assert code == 0
    report = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert {"runs", "mtp_acceptance", "expected", "causes"} <= set(report)
    run = report["runs"][0]
    assert {"concurrency", "prompt_tokens", "output_tokens", "ttft_s", "prefill_tok_s", "decode_tok_s",
            "aggregate_tok_s", "spread"} <= set(run)
    assert report["expected"]["profile"] == "2x2080ti-22g-qwen3.5-hybrid-v0.21" and report["expected"]["gap"]
    assert report["causes"] == []  # loopback, facts without host findings
    assert report["settings"]["api_key"] == "none" and report["settings"]["token_lengths"] == "exact"


def test_a_derived_profile_has_no_expected_numbers(fake, capsys):
    srv = fake(**QUICK)
    code, out, _ = bench(capsys, srv.url, "--json", facts="1x2080ti-11g.json")
    report = json.loads(out)
    assert code == 0 and report["expected"] is None
    assert report["profile"]["name"] == "1x2080ti-11g-qwen3.5-hybrid"
    assert any("is derived, not measured" in n for n in report["notes"])


def test_a_remote_server_without_facts_is_not_explained_from_this_machine():
    report = BenchReport(server={"model": MODEL}, settings={}, runs=[], mtp=None, profile={}, expected=None,
                         causes=None)
    opts = runner.BenchOptions("http://10.0.0.5:8000", MODEL, None, None, 8, None, 1, 1.0, 1.0)
    runner._explain(report, opts, None, False)
    assert report.expected is None and report.causes is None and report.profile["name"] is None
    assert any("--facts FILE" in n for n in report.notes)


def test_a_failed_request_is_one_line_exit_1(fake, capsys):
    srv = fake(**QUICK, faults={"p48-c1-r0": "500"})
    code, out, err = bench(capsys, srv.url)
    assert code == 1 and out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"{PROG}: error: prompt 48 tokens, 1 at once, repeat 1: HTTP 500")


def test_a_prompt_over_max_model_len_is_bad_input(fake, capsys):
    srv = fake(**QUICK, max_model_len=1024)
    code, _, err = bench(capsys, srv.url, "--prompt-tokens", "2000")
    assert code == 2 and "over the server's max_model_len 1024" in err


def test_wrong_api_key_is_exit_2_without_the_key(fake, capsys):
    srv = fake(**QUICK, api_key="right-key-123")
    code, out, err = bench(capsys, srv.url, "--api-key", "wrong-key-456")
    assert code == 2 and "401" in err and "wrong-key-456" not in out + err and "right-key-123" not in out + err


def test_plot_without_matplotlib_is_one_line_exit_2(fake, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    srv = fake(**QUICK)
    code, _, err = bench(capsys, srv.url, "--plot", "x.png")
    assert code == 2 and err.strip() == (f"{PROG}: error: --plot needs matplotlib, which is not installed: "
                                         "pip install 'caovan-vllm-sm75-turbo3[plot]' (or: pip install matplotlib)")
    assert srv.requests == []  # refused before any request


def test_plot_writes_a_png(fake, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    srv = fake(**QUICK)
    png = tmp_path / "decode.png"
    code, _, err = bench(capsys, srv.url, "--prompt-tokens", "48", "96", "--concurrency", "1", "2", "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


# --- the parts ---------------------------------------------------------------------------------

def test_counters_are_summed_over_engines_by_exact_name():
    page = textwrap.dedent(f"""\
        # TYPE {ACCEPTED} counter
        {ACCEPTED}{{engine="0",model_name="a b}}c"}} 10.0
        {ACCEPTED}{{engine="1",model_name="x"}} 5
        vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} 999
        {DRAFT} 30 1700000000
        {DRAFT}{{engine="1"}} NaN
        """)
    assert parse_counters(page) == {ACCEPTED: 15.0, DRAFT: 30.0}
    assert acceptance({ACCEPTED: 15, DRAFT: 30}, {ACCEPTED: 35, DRAFT: 60}).rate == pytest.approx(2 / 3)
    assert acceptance({ACCEPTED: 15, DRAFT: 30}, {ACCEPTED: 15, DRAFT: 30}) is None  # no drafts in between
    assert acceptance(None, {ACCEPTED: 1, DRAFT: 2}) is None and acceptance({}, {}) is None


def test_default_prompts_are_capped_by_max_model_len():
    assert default_prompt_tokens(None, 256)[0] == (128, 4096, 32768)
    assert default_prompt_tokens(262144, 256) == ((128, 4096, 32768), "")
    lengths, note = default_prompt_tokens(8192, 256)
    assert lengths == (128, 4096, 7936) and "capped at 7936" in note
    with pytest.raises(SettingError):
        default_prompt_tokens(100, 256)
    assert default_concurrency(None, "x")[0] == (1, 2) and "unknown (x)" in default_concurrency(None, "x")[1]
    assert default_concurrency(4, "read")[0] == (1, 4)


def test_max_num_seqs_flag_forms():
    assert flag_value(["vllm", "serve", "m", "--max-num-seqs", "4"]) == 4
    assert flag_value(["vllm", "--max-num-seqs=2", "--max-num-seqs", "8"]) == 8
    assert flag_value(["vllm", "--max-num-seqs"]) is None and flag_value(["--max-num-seqs", "x"]) is None


@contextlib.contextmanager
def _listening(*args: str):
    """A process listening on a free loopback port whose command line holds `args`: (port, pid)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
            "print('up', flush=True); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        yield port, proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_max_num_seqs_is_read_from_the_listening_process():
    with _listening("--max-num-seqs", "3") as (port, pid):
        value, how = learn_max_num_seqs(f"http://127.0.0.1:{port}")
        assert value == 3 and f"process {pid}" in how
    assert learn_max_num_seqs("http://10.0.0.5:8000") == (None, "the server is on another machine")
    start = time.monotonic()
    assert learn_max_num_seqs(f"http://127.0.0.1:{port}")[0] is None
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("argv,want", [
    (["vllm", "serve", "m", "--compilation-config", '{"cudagraph_mode":"PIECEWISE","cudagraph_capture_sizes":[1,2]}'],
     "PIECEWISE"),
    (["vllm", "serve", "m", '--compilation-config={"cudagraph_mode":"full_and_piecewise"}'], "FULL_AND_PIECEWISE"),
    (["vllm", "serve", "m", "-O.cudagraph_mode", "FULL"], "FULL"),
    (["vllm", "serve", "m", "--compilation-config.cudagraph_mode=PIECEWISE"], "PIECEWISE"),
    (["vllm", "serve", "m", "-O.cudagraph_mode", "FULL", "--enforce-eager"], "NONE"),
    (["vllm", "serve", "m", "--compilation-config", "{not json"], None),
    (["vllm", "serve", "m", "--compilation-config", '{"level":3}'], None),
    (["vllm", "serve", "m"], None),
])
def test_the_cuda_graph_mode_asked_on_the_command_line(argv, want):
    from caovan_vllm_sm75_turbo3.bench.server_args import cudagraph_mode
    assert cudagraph_mode(argv) == want


def test_the_bench_reads_the_cuda_graph_mode_of_the_process_on_its_port():
    from caovan_vllm_sm75_turbo3.bench.server_args import learn_cudagraph_mode
    with _listening("--compilation-config", '{"cudagraph_mode":"PIECEWISE"}') as (port, pid):
        mode, how = learn_cudagraph_mode(f"http://127.0.0.1:{port}")
        assert mode == "PIECEWISE" and f"process {pid}" in how and "as asked" in how
    mode, how = learn_cudagraph_mode("http://10.0.0.5:8000")
    assert mode is None and "another machine" in how
