"""`caovan-vllm-serve`: dry-run and JSON plans, errors, and a real exec into a stand-in `vllm`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from helpers.facts import facts_dict

from caovan_vllm_sm75_turbo3 import __version__
from caovan_vllm_sm75_turbo3.caches.layout import read_manifest
from caovan_vllm_sm75_turbo3.cli.serve import split_argv
from caovan_vllm_sm75_turbo3.config import load_settings
from caovan_vllm_sm75_turbo3.policy.decision import decide
from caovan_vllm_sm75_turbo3.runtime.facts import Facts

ROOT = Path(__file__).resolve().parents[1]
FACTS = ROOT / "examples" / "2x2080ti-22g.json"
MODEL = "/data/qwen/Qwen3.6-27B-AWQ-INT4"
REF_CONFIG = '{"caovan":true,"caovan_mode":"auto","caovan_require_turbo3":true}'
REFERENCE = [
    MODEL, "--host", "0.0.0.0", "--port", "8000", "--served-model-name", "Qwen3.6-27B-AWQ-INT4",
    "--tensor-parallel-size", "2", "--dtype", "half", "--max-model-len", "262144", "--max-num-seqs", "2",
    "--max-num-batched-tokens", "8192", "--kv-cache-dtype", "fp8", "--disable-custom-all-reduce",
    "--enable-prefix-caching", "--mamba-cache-mode", "align", "--additional-config", REF_CONFIG,
    "--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]
NO_REQUIRE = [a if a != REF_CONFIG else '{"caovan":true,"caovan_mode":"auto","other_key":[1]}' for a in REFERENCE]


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CAOVAN_", "VLLM_", "TRITON_", "TORCH", "FLASHINFER_", "CUDA_CACHE", "XDG_", "_CAOVAN"))}
    env.update(HOME=str(home), **extra)
    return env


def serve(args: list[str], env: dict[str, str], python: str = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "caovan_vllm_sm75_turbo3.cli.serve", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_split_argv_takes_our_flags_anywhere_and_leaves_the_rest():
    ours, theirs = split_argv([MODEL, "--port", "8000", "--dry-run", "--facts=F", "--max_model_len", "4",
                               "--cache_dir", "D", "--profile", "p", "--json", "--additional-config", "{}"])
    assert ours == ["--dry-run", "--facts=F", "--cache-dir", "D", "--profile", "p", "--json"]
    assert theirs == [MODEL, "--port", "8000", "--max_model_len", "4", "--additional-config", "{}"]


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    r = serve([*REFERENCE, "--dry-run", "--facts", str(FACTS)], clean_env(home))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # the model path is not on this machine: what hangs on the model is decided when vLLM loads it
    assert lines[:6] == [f"Caovan vLLM SM75 Turbo3 external plugin v{__version__}", "runtime=PASS", "sm75=2/2",
                         "flashinfer_sampler=disabled-sm75-guard", "post_start_warmup=disabled-default",
                         "gdn_legacy=at-model-load"]
    assert "turbo3=at-model-load" in lines
    assert any("decided when vLLM loads the model" in ln and "require-turbo3 refuses there" in ln for ln in lines)
    assert "vllm=0.21.0" in lines
    key_line = next(ln for ln in lines if ln.startswith("cache_key="))
    assert key_line.startswith(f"cache_key={home}/.cache/caovan-sm75-turbo3/envs/p{__version__}-py3.11.7-")
    assert any(ln.startswith("env.VLLM_USE_FLASHINFER_SAMPLER=0 set: ") for ln in lines)
    assert not any(ln.startswith("refused: ") for ln in lines)   # the vLLM process refuses, with the real config
    assert not any(ln.startswith("launch: would stop: require-turbo3") for ln in lines)
    assert f"argv: vllm serve {MODEL} --host 0.0.0.0" in r.stdout and f"'{REF_CONFIG}'" in r.stdout
    assert tree(home) == []  # nothing written, not even the cache root


def test_json_plan_is_complete_and_honours_our_flags_anywhere(tmp_path):
    home, cache = tmp_path / "home", tmp_path / "mycache"
    home.mkdir()
    args = [MODEL, "--json", "--port", "8000", f"--facts={FACTS}", "--cache-dir", str(cache), "--profile", "none"]
    r = serve(args, clean_env(home, VLLM_RPC_TIMEOUT="4242"))
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["dry_run"] is True and plan["argv"] == ["vllm", "serve", MODEL, "--port", "8000"]
    env = {e["var"]: e for e in plan["env"]}
    assert env["VLLM_RPC_TIMEOUT"]["action"] == "kept" and env["VLLM_RPC_TIMEOUT"]["value"] == "4242"
    assert env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"]["action"] == "set"
    assert env["TRITON_CACHE_DIR"]["value"].startswith(f"{cache}/envs/")
    assert plan["cache"]["root"] == str(cache) and plan["refusal"] is None
    assert not any("profile=" in n for n in plan["notes"])  # --profile none: no profile note
    assert not cache.exists() and tree(home) == []


def test_dry_run_imports_neither_torch_nor_vllm(tmp_path):
    code = textwrap.dedent(f"""
        import sys, io, contextlib
        from caovan_vllm_sm75_turbo3.cli.serve import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main({[*REFERENCE, "--dry-run", "--facts", str(FACTS)]!r}) == 0
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "vllm", "triton", "flashinfer"))
        print("HEAVY", heavy)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env(tmp_path), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout


@pytest.mark.parametrize("args,env,words", [
    ([MODEL, "--additional-config", '{"caovan": tru}', "--dry-run"], {}, ["--additional-config is not valid JSON"]),
    ([MODEL, "--additional-config", '{"caovan_nope": 1}', "--dry-run"], {}, ["unknown Caovan key 'caovan_nope'"]),
    ([MODEL, "--dry-run"], {"CAOVAN_REQUIRE_TURBO3": "maybe"}, ["CAOVAN_REQUIRE_TURBO3='maybe' is not accepted"]),
    ([MODEL, "--dry-run", "--profile="], {}, ["--profile='' is not accepted"]),
    ([MODEL, "--dry-run", "--facts", "/nonexistent/facts.json"], {}, ["cannot read facts file"]),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, env, words):
    r = serve(args, clean_env(tmp_path, **env))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("caovan-vllm-serve: error: ") and "Traceback" not in r.stderr
    for w in words:
        assert w in r.stderr


def test_help_names_vllm_serve(tmp_path):
    r = serve(["--help"], clean_env(tmp_path))
    assert r.returncode == 0 and "vllm serve --help" in " ".join(r.stdout.split())
    assert "--dry-run" in r.stdout and "--cache-dir" in r.stdout


@pytest.fixture
def venv_with_fake_vllm(tmp_path):
    """A venv sharing the test venv's packages whose `vllm` records what it was started with."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    real = Path(sys.prefix)
    (venv / "pyvenv.cfg").write_text((real / "pyvenv.cfg").read_text())
    purelib = Path(sysconfig.get_paths()["purelib"])
    target = venv / purelib.relative_to(real)
    target.parent.mkdir(parents=True)
    target.symlink_to(purelib)
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    fake = venv / "bin" / "vllm"
    fake.write_text(textwrap.dedent(f"""\
        #!{venv / 'bin' / 'python'}
        import json, os, sys
        from pathlib import Path
        from caovan_vllm_sm75_turbo3.caches.layout import users
        root = Path(os.environ["TRITON_CACHE_DIR"]).parent if "TRITON_CACHE_DIR" in os.environ else None
        out = {{"argv": sys.argv[1:], "pid": os.getpid(), "env": dict(os.environ),
               "users": users(root) if root else None}}
        Path(os.environ["FAKE_VLLM_OUT"]).write_text(json.dumps(out))
        sys.exit(int(os.environ.get("FAKE_VLLM_RC", "0")))
    """))
    fake.chmod(0o755)
    return venv


def launch(venv: Path, args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, int]:
    p = subprocess.Popen([str(venv / "bin" / "python"), "-m", "caovan_vllm_sm75_turbo3.cli.serve", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), p.pid


def test_real_launch_execs_vllm_with_the_plan(tmp_path, venv_with_fake_vllm):
    home, record = tmp_path / "home", tmp_path / "fake.json"
    home.mkdir()
    env = clean_env(home, FAKE_VLLM_OUT=str(record), FAKE_VLLM_RC="7", TORCH_CUDA_ARCH_LIST="7.5+PTX",
                    CAOVAN_FACTS=str(FACTS), CAOVAN_PROFILE="none")
    r, pid = launch(venv_with_fake_vllm, NO_REQUIRE, env)
    assert r.returncode == 7, r.stderr  # vLLM's exit code is ours: the launcher became vLLM
    assert r.stdout.splitlines()[0] == f"Caovan vLLM SM75 Turbo3 external plugin v{__version__}"
    got = json.loads(record.read_text())
    assert got["pid"] == pid  # exec, not a child process
    assert got["argv"] == ["serve", *NO_REQUIRE]  # the user's arguments, intact
    e = got["env"]
    assert e["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and e["VLLM_RPC_TIMEOUT"] == "1800000"
    assert e["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "1800" and e["FLASHINFER_CUDA_ARCH_LIST"] == "7.5"
    assert e["TORCH_CUDA_ARCH_LIST"] == "7.5+PTX"  # the user's value is kept
    assert "env.TORCH_CUDA_ARCH_LIST=7.5+PTX kept" in r.stdout
    assert e["_CAOVAN_APPLIED"] == f"caovan-vllm-serve (pid {pid})"
    keydir = Path(e["TRITON_CACHE_DIR"]).parent
    assert keydir.parent == home / ".cache" / "caovan-sm75-turbo3" / "envs"
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE",
                "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH"):
        assert Path(e[var]).parent == keydir and Path(e[var]).is_dir()
    assert got["users"] == [pid]  # the in-use lock survived exec
    manifest = read_manifest(keydir)
    assert manifest and manifest["key"] == keydir.name


def test_real_launch_stops_before_anything_when_refused_or_failed(tmp_path, venv_with_fake_vllm):
    home, record = tmp_path / "home", tmp_path / "fake.json"
    home.mkdir()
    # The reference launch with the documented GDN switch serves (its model is not on this machine: turbo3=
    # is decided when vLLM loads it); vLLM's own GDN kernels get tensor cores there.
    r, _ = launch(venv_with_fake_vllm, REFERENCE, clean_env(home, FAKE_VLLM_OUT=str(record), CAOVAN_FACTS=str(FACTS),
                                                            CAOVAN_GDN_LEGACY_DISABLE="1"))
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and "gdn_legacy=disabled-by-user" in lines and "turbo3=at-model-load" in lines, r.stderr
    assert record.exists()
    record.unlink()
    for p in sorted(home.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    # Without the Turbo hook nothing of ours gets tensor cores: require-turbo3 refuses, before vLLM starts.
    r, _ = launch(venv_with_fake_vllm, REFERENCE, clean_env(home, FAKE_VLLM_OUT=str(record), CAOVAN_FACTS=str(FACTS),
                                                            CAOVAN_GDN_LEGACY_DISABLE="1", CAOVAN_TURBO="off"))
    assert r.returncode == 2 and "refused: require-turbo3" in r.stdout and "CAOVAN_GDN_LEGACY_DISABLE=1" in r.stderr
    assert "caovan-vllm-serve: error: require-turbo3 (additional-config caovan_require_turbo3) is on" in r.stderr
    assert not record.exists() and tree(home) == []
    facts = tmp_path / "olddriver.json"   # two 2080 Ti, but a driver older than torch's CUDA needs
    facts.write_text(json.dumps(facts_dict(versions={"driver": "470.57.02"})))
    r, _ = launch(venv_with_fake_vllm, NO_REQUIRE, clean_env(home, FAKE_VLLM_OUT=str(record), CAOVAN_FACTS=str(facts)))
    assert r.returncode == 2 and "runtime=FAIL" in r.stdout.splitlines()
    assert "error: runtime=FAIL: driver: driver 470.57.02 is older than CUDA" in r.stderr
    assert not record.exists() and tree(home) == []


@pytest.mark.parametrize("how", ["facts without a GPU", "this machine"])
def test_without_an_sm75_gpu_vllm_starts_untouched(tmp_path, venv_with_fake_vllm, how):
    if how == "this machine" and Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    home, record = tmp_path / "home", tmp_path / "fake.json"
    home.mkdir()
    extra = {}
    if how == "facts without a GPU":
        facts = tmp_path / "nogpu.json"
        facts.write_text(json.dumps(facts_dict(gpus=[])))
        extra["CAOVAN_FACTS"] = str(facts)
    r, pid = launch(venv_with_fake_vllm, NO_REQUIRE, clean_env(home, FAKE_VLLM_OUT=str(record), **extra))
    assert r.returncode == 0, r.stderr   # the fake vLLM's exit: the launcher became vLLM
    lines = r.stdout.splitlines()
    assert "runtime=FAIL" in lines and "sm75=0/0" in lines   # our checks judge the machine for us, not for vLLM
    got = json.loads(record.read_text())
    assert got["pid"] == pid and got["argv"] == ["serve", *NO_REQUIRE]
    assert not any(k.startswith(("VLLM_", "TRITON_", "TORCH_CUDA")) for k in got["env"])
    assert got["env"]["_CAOVAN_APPLIED"].endswith("nothing applied: no SM75 GPU visible")
    assert tree(home) == []
    dry = serve(["--dry-run", *NO_REQUIRE], clean_env(home, **extra), python=str(venv_with_fake_vllm / "bin" / "python"))
    assert dry.returncode == 0 and dry.stdout.splitlines()[-2] == (
        "launch: would exec vLLM untouched (no SM75 GPU visible: nothing of ours applies)")


def test_plugin_off_execs_vllm_untouched(tmp_path, venv_with_fake_vllm):
    home, record = tmp_path / "home", tmp_path / "fake.json"
    home.mkdir()
    args = [MODEL, "--port", "8000"]
    r, pid = launch(venv_with_fake_vllm, args, clean_env(home, FAKE_VLLM_OUT=str(record), CAOVAN_ENABLE="0"))
    assert r.returncode == 0, r.stderr
    assert "mode=off" in r.stdout.splitlines()
    got = json.loads(record.read_text())
    assert got["pid"] == pid and got["argv"] == ["serve", *args]
    assert not any(k.startswith(("VLLM_", "_CAOVAN", "TRITON_")) for k in got["env"])
    assert tree(home) == []


def test_version_prints_and_starts_nothing(tmp_path):
    r = serve(["--version"], clean_env(tmp_path))
    assert r.returncode == 0 and r.stdout.strip() == f"caovan-vllm-serve {__version__}" and not r.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_last_line_agrees_with_the_findings_above_it(tmp_path, monkeypatch):
    from caovan_vllm_sm75_turbo3.cli import serve as serve_cli
    from caovan_vllm_sm75_turbo3.launch import plan_for_launcher
    from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args

    model = str(ROOT / "examples" / "models" / "qwen3.6-27b-awq")
    env = clean_env(tmp_path, CAOVAN_FACTS=str(ROOT / "examples" / "1x2080ti-11g.json"))
    prepared = plan_for_launcher(env, read_vllm_args([model]), write=False)
    # 1 x 11G: the weights alone do not fit; the verdict says vLLM is expected to fail
    assert prepared.plan.failures and "do not fit" in prepared.plan.failures[0]
    text = serve_cli.plan_text(prepared.plan, "/usr/bin/vllm", serve_cli.stop_reason(prepared, "/usr/bin/vllm"))
    assert text[-2].startswith("launch: would exec vLLM, which is expected to fail: the weights")
    # no `vllm` command: a launch would stop, and the verdict says so
    stop = serve_cli.stop_reason(prepared, None)
    assert stop and "`vllm` command was not found" in stop
    assert serve_cli.plan_text(prepared.plan, None, stop)[-2].startswith("launch: would stop: ")
    # and the same through the command, from a venv whose vLLM is missing (the fast lane's has none)
    r = serve(["--dry-run", model], env)
    if "vllm_program: not found" in r.stdout:
        assert r.stdout.splitlines()[-2].startswith("launch: would stop: ")
