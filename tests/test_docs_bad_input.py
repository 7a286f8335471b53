"""docs/bad-input.md is tested, not hand-kept: each row's input is made here (by its id), the real
command runs on it, and its exit code and line must be the row's. A row without a maker, or a
maker without a row, fails."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.hostile import run_main

from caovan_vllm_sm75_turbo3.caches.key import env_key, key_from_components
from caovan_vllm_sm75_turbo3.cli import cache, doctor, serve, warmup
from caovan_vllm_sm75_turbo3.runtime.facts import Facts
from caovan_vllm_sm75_turbo3.logtriage import reader

from helpers.facts import EXAMPLES, ROOT, facts_dict

DOC = ROOT / "docs" / "bad-input.md"
FACTS = str(EXAMPLES / "2x2080ti-22g.json")
MODEL = str(EXAMPLES / "models" / "qwen3.6-27b-awq")
MAINS = {doctor.PROG: doctor.main, serve.PROG: serve.main, warmup.PROG: warmup.main, cache.PROG: cache.main}
DEEP = "[" * 5000 + "]" * 5000


@dataclass
class Row:
    id: str
    prog: str
    code: int
    shape: str

    def pattern(self) -> re.Pattern[str]:
        """The line's regex: `…` is any text; an `error:` line carries the command's name."""
        text = f"{self.prog}: {self.shape}" if self.shape.startswith("error: ") else self.shape
        return re.compile(".*".join(re.escape(part) for part in text.split("…")))


def rows() -> list[Row]:
    text = DOC.read_text(encoding="utf-8")
    table = text.split("<!-- bad-input:start -->")[1].split("<!-- bad-input:end -->")[0]
    out = []
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        ident, command, _, code, shape = cells
        out.append(Row(ident.strip("`"), command.strip("`").split()[0], int(code),
                       shape.strip("`").replace("\\|", "|")))
    return out


@dataclass
class Case:
    """How to run one row: our argv and environment, in process unless `process` (a console
    script with a closed stdin or a full stdout)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    process: str | None = None


def _file(tmp: Path, name: str, data: str | bytes) -> str:
    p = tmp / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(p)


def _facts(tmp: Path, **changes: object) -> str:
    return _file(tmp, "facts.json", json.dumps(facts_dict(**changes)))


def _fifo(tmp: Path, name: str) -> str:
    os.mkfifo(tmp / name)
    return str(tmp / name)


def _model_zero_len(tmp: Path) -> str:
    config = json.loads((Path(MODEL) / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = 0
    (tmp / "m").mkdir()
    _file(tmp / "m", "config.json", json.dumps(config))
    return str(tmp / "m")


def _model_fifo(tmp: Path) -> str:
    (tmp / "m").mkdir()
    _fifo(tmp / "m", "config.json")
    return str(tmp / "m")


def _wrong_type(tmp: Path) -> str:
    data = facts_dict()
    data["gpus"][0]["memory_total_mib"] = "22528"
    return _file(tmp, "facts.json", json.dumps(data))


def _gzip_cut(tmp: Path) -> str:
    import gzip
    data = gzip.compress(os.urandom(300_000).hex().encode())
    return _file(tmp, "log.gz", data[: len(data) // 2])


def _outside_link(tmp: Path) -> list[str]:
    """~/.nv/ComputeCache (HOME is `tmp`) links to a directory outside the home cache folders."""
    (tmp / "elsewhere" / "k").mkdir(parents=True)
    _file(tmp / "elsewhere" / "k", "f", "x")
    (tmp / ".nv").mkdir()
    (tmp / ".nv" / "ComputeCache").symlink_to(tmp / "elsewhere")
    return ["clean", "--all", "--yes", "--force", "--facts", FACTS]


def _key_manifest_fifo(tmp: Path) -> list[str]:
    """A stale key under the default root (XDG_CACHE_HOME is `tmp/cache`) whose manifest.json is a FIFO."""
    current = env_key(Facts.load(Path(FACTS)))
    stale = key_from_components(dict(current.components, torch="0"))
    key = tmp / "cache" / "caovan-sm75-turbo3" / "envs" / stale.name
    key.mkdir(parents=True)
    _fifo(key, "manifest.json")
    return ["list", "--json", "--facts", FACTS]


def _dry(*args: str) -> list[str]:
    return [*args, "--dry-run", "--facts", FACTS]


MAKERS: dict[str, Callable[[Path], Case]] = {
    "facts-not-utf8": lambda t: Case(["--facts", _file(t, "f.json", b"\xff\xfe{")]),
    "facts-too-deep": lambda t: Case(["--facts", _file(t, "f.json", DEEP)]),
    "facts-nan": lambda t: Case(["--facts", _file(t, "f.json", json.dumps(facts_dict()).replace(
        '"memory_total_mib": 22528', '"memory_total_mib": NaN', 1))]),
    "facts-wrong-type": lambda t: Case(["--facts", _wrong_type(t)]),
    "facts-fifo": lambda t: Case(["--facts", _fifo(t, "f.json")]),
    "setting-bad-value": lambda t: Case(["--facts", FACTS], {"CAOVAN_REQUIRE_TURBO3": "maybe"}),
    "additional-config-not-json": lambda t: Case(_dry(MODEL, "--additional-config", "{bad")),
    "additional-config-too-deep": lambda t: Case(_dry(MODEL, "--additional-config", DEEP)),
    "additional-config-bad-key": lambda t: Case(_dry(MODEL, "--additional-config", '{"caovan_mode":"fast"}')),
    "config-file-not-mapping": lambda t: Case(_dry(MODEL, "--config", _file(t, "c.yaml", "- 1\n- 2\n"))),
    "config-file-bad-key": lambda t: Case(_dry(MODEL, "--config", _file(t, "c.yaml",
                                                                      "additional-config:\n  caovan_turbo: fast\n"))),
    "model-absurd-value": lambda t: Case(["--facts", FACTS, "--model", _model_zero_len(t)]),
    "model-config-fifo": lambda t: Case(["--facts", FACTS, "--model", _model_fifo(t)]),
    "launch-no-model": lambda t: Case(_dry()),
    "launch-model-without-value": lambda t: Case(["--dry-run", "--facts", FACTS, "--model"]),
    "launch-model-trailing": lambda t: Case([MODEL, "--dry-run", "--facts", FACTS, "--model"]),
    "launch-dry-run-with-value": lambda t: Case([MODEL, "--facts", FACTS, "--dry-run=true"]),
    "launch-model-path-too-long": lambda t: Case(_dry(str(t / ("a" * 300)))),
    "setting-timeout-below-vllm": lambda t: Case(["--facts", FACTS], {"CAOVAN_EXECUTE_TIMEOUT_S": "60"}),
    "setting-cache-dir-relative": lambda t: Case(["--facts", FACTS], {"CAOVAN_CACHE_DIR": "rel/dir"}),
    "setting-facts-blank": lambda t: Case([], {"CAOVAN_FACTS": " "}),
    "doctor-unknown-flag": lambda t: Case(["--no-such-flag"]),
    "launch-tp-zero": lambda t: Case(_dry(MODEL, "--tensor-parallel-size", "0")),
    "launch-tp-over-gpus": lambda t: Case(_dry(MODEL, "-tp", "4")),
    "launch-gpu-memory-share": lambda t: Case(_dry(MODEL, "--gpu-memory-utilization", "1.5")),
    "launch-max-model-len-word": lambda t: Case([MODEL, "--max-model-len", "abc", "--facts", FACTS]),
    "launch-max-num-seqs-zero": lambda t: Case([MODEL, "--max-num-seqs", "0", "--json", "--facts", FACTS]),
    "launch-batched-below-seqs": lambda t: Case(_dry(MODEL, "--max-num-batched-tokens", "4", "--max-num-seqs", "8")),
    "launch-runtime-fail-dry-run": lambda t: Case([MODEL, "--dry-run", "--facts",
                                                   _facts(t, versions={"driver": "470.57.02"})]),
    "launch-runtime-fail": lambda t: Case([MODEL, "--facts", _facts(t, versions={"driver": "470.57.02"})]),
    "cache-root-slash": lambda t: Case(_dry(MODEL), {"CAOVAN_CACHE_DIR": "/"}),
    "cache-root-home": lambda t: Case(_dry(MODEL, "--cache-dir", str(t))),
    "cache-root-unknown-user": lambda t: Case(_dry(MODEL), {"CAOVAN_CACHE_DIR": "~no-such-user-caovan/x"}),
    "cache-clean-root-refused": lambda t: Case(["clean", "--yes", "--facts", FACTS], {"CAOVAN_CACHE_DIR": str(t)}),
    "cache-clean-outside-home": lambda t: Case(_outside_link(t)),
    "cache-manifest-fifo": lambda t: Case(_key_manifest_fifo(t)),
    "warmup-bad-port": lambda t: Case(["--api-base", "http://127.0.0.1:99999"]),
    "warmup-bad-scheme": lambda t: Case(["--api-base", "ftp://x"]),
    "warmup-non-ascii-key": lambda t: Case(["--api-key", "k\u00e9y", "--api-base", "http://127.0.0.1:1"]),
    "warmup-infinite-wait": lambda t: Case(["--wait", "inf"]),
    "warmup-zero-seqs": lambda t: Case(["--max-num-seqs", "0"]),
    "warmup-not-ready": lambda t: Case(["--api-base", "http://127.0.0.1:1", "--wait", "1", "--poll-interval", "0.2"]),
    "log-missing": lambda t: Case(["--log", str(t / "missing.log")]),
    "log-directory": lambda t: Case(["--log", str(t)]),
    "log-binary": lambda t: Case(["--log", _file(t, "bin.log", bytes(range(256)) * 20)]),
    "log-gzip-cut": lambda t: Case(["--log", _gzip_cut(t)]),
    "log-fifo-no-writer": lambda t: Case(["--log", _fifo(t, "log")]),
    "log-closed-stdin": lambda t: Case(["--log", "-"], process="closed-stdin"),
    "output-full-disk": lambda t: Case(["--facts", FACTS], process="full-stdout"),
}


def _run_process(prog: str, case: Case, tmp: Path) -> tuple[int, list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAOVAN_")}
    env.update(HOME=str(tmp), XDG_CACHE_HOME=str(tmp / "cache"), **case.env)
    exe = str(Path(sys.executable).parent / prog)
    if case.process == "closed-stdin":
        r = subprocess.run([exe, *case.argv], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT,
                           preexec_fn=lambda: os.close(0))
    else:
        with open("/dev/full", "w") as full:
            r = subprocess.run([exe, *case.argv], stdout=full, stderr=subprocess.PIPE, text=True, env=env,
                               timeout=60, cwd=ROOT)
        r.stdout = ""
    return r.returncode, (r.stdout + r.stderr).splitlines()


def _exit_code(main: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
    """`main`, with argparse's SystemExit (a refused flag) as its return code, as the console script ends."""
    def run(argv: list[str]) -> int:
        try:
            return main(argv)
        except SystemExit as stop:
            return int(stop.code or 0)
    return run


ROWS = rows()


def test_every_row_has_a_maker_and_every_maker_a_row():
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(MAKERS)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_the_documented_line_and_exit_code(row, tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "FIFO_WAIT_S", 0.2)
    case = MAKERS[row.id](tmp_path)
    if case.process:
        code, lines = _run_process(row.prog, case, tmp_path)
        err = lines
    else:
        env = {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"), "VLLM_API_KEY": "",
               "OPENAI_API_KEY": "", **case.env}
        r = run_main(row.prog, _exit_code(MAINS[row.prog]), case.argv, env)
        code, err, lines = r.code, r.err.splitlines(), r.out.splitlines()
        if row.shape.startswith("error: "):
            assert len(err) == 1, r.err  # one line
        assert "Traceback" not in r.out + r.err
    assert code == row.code, (err, lines[-3:])
    pattern = row.pattern()
    shown = err if row.shape.startswith("error: ") else lines
    assert any(pattern.fullmatch(line) for line in shown), (row.shape, shown[-3:])


def test_the_readme_promises_what_the_table_shows():
    """The README's exit-code table says bad input is 2 (and warmup's not-ready 3): the rows run it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    promised = {}
    for line in readme.split("## Exit codes")[1].split("##")[0].splitlines()[4:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5:
            promised[cells[0].strip("`")] = cells[1:]
    shown = {(r.prog, r.code) for r in ROWS}
    for command in ("caovan-vllm-serve", "caovan-sm75-doctor", "caovan-sm75-warmup"):
        assert "bad input" in promised[command][2]
        assert (command, 2) in shown
    assert "not ready" in promised["caovan-sm75-warmup"][3] and ("caovan-sm75-warmup", 3) in shown
    assert "done" in promised["caovan-vllm-serve"][0] and ("caovan-vllm-serve", 0) in shown
