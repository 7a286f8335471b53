"""`register()` through vLLM 0.21's real plugin loader: the first process plans and sets the
environment its children inherit, later processes log one line, require-turbo3 refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from caovan_vllm_sm75_turbo3 import __version__

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
FACTS = ROOT / "examples" / "2x2080ti-22g.json"
HEADER = f"Caovan vLLM SM75 Turbo3 external plugin v{__version__}"

# Runs vLLM's loader as `vllm serve ARGS` would see it (sys.argv), then starts a child the way
# vLLM starts its workers (inherited environment) that loads the plugins again.
PROCESS = textwrap.dedent("""
    import json, logging, os, subprocess, sys
    records = []
    class Keep(logging.Handler):
        def emit(self, record): records.append(record.getMessage())
    log = logging.getLogger("caovan_vllm_sm75_turbo3")
    log.addHandler(Keep()); log.setLevel(logging.DEBUG)
    sys.argv = ["/venv/bin/vllm", "serve", *json.loads(os.environ.pop("TEST_SERVE_ARGS"))]
    error = None
    import vllm.plugins
    try:
        vllm.plugins.load_general_plugins()
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    vllm.plugins.load_general_plugins()  # vLLM may call it again: nothing more happens
    out = {"records": records, "error": error, "env": dict(os.environ), "pid": os.getpid()}
    if not error and os.environ.get("TEST_CHILD"):
        child = subprocess.run([sys.executable, "-c", os.environ["TEST_CHILD"]], capture_output=True, text=True)
        out["child"] = child.stdout + child.stderr
    print("OUT " + json.dumps(out))
""")
CHILD = textwrap.dedent("""
    import logging, os
    records = []
    class Keep(logging.Handler):
        def emit(self, record): records.append(record.getMessage())
    log = logging.getLogger("caovan_vllm_sm75_turbo3")
    log.addHandler(Keep()); log.setLevel(logging.DEBUG)
    os.environ["CAOVAN_FACTS"] = "/nonexistent.json"  # a child that planned again would warn about it
    import vllm.plugins
    vllm.plugins.load_general_plugins()
    import json
    print("CHILD " + json.dumps(records))
""")


def run_vllm_process(tmp_path: Path, serve_args: list[str], child: bool = False, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("CAOVAN_", "VLLM_", "TRITON_", "TORCH", "FLASHINFER_", "CUDA_CACHE", "_CAOVAN"))}
    full.update({"HOME": str(tmp_path / "home"), "CAOVAN_FACTS": str(FACTS), "TEST_SERVE_ARGS": json.dumps(serve_args),
                 "CAOVAN_CACHE_DIR": str(tmp_path / "cache"), **env})
    if child:
        full["TEST_CHILD"] = CHILD
    r = subprocess.run([sys.executable, "-c", PROCESS], capture_output=True, text=True, env=full, timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("OUT ")), None)
    assert r.returncode == 0 and line, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(line[4:])


def test_first_process_sets_the_variables_and_children_log_one_line(tmp_path):
    out = run_vllm_process(tmp_path, ["/m", "--tensor-parallel-size", "2"], child=True, VLLM_RPC_TIMEOUT="777")
    assert out["error"] is None
    env = out["env"]
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "1800"
    assert env["VLLM_ENGINE_ITERATION_TIMEOUT_S"] == "1800"
    assert env["VLLM_RPC_TIMEOUT"] == "777"  # the user's value is kept
    assert env["TORCH_CUDA_ARCH_LIST"] == "7.5"
    assert env["TRITON_CACHE_DIR"].startswith(str(tmp_path / "cache" / "envs")) and Path(env["TRITON_CACHE_DIR"]).is_dir()
    assert env["_CAOVAN_APPLIED"] == f"vLLM process pid {out['pid']}"
    # one record holds the whole banner (vLLM's formatter prefixes each of its lines)
    banners = [r for r in out["records"] if HEADER in r]
    assert len(banners) == 1
    banner = banners[0].splitlines()
    assert banner[:4] == [f"Caovan vLLM SM75 Turbo3 external plugin v{__version__}", "runtime=PASS", "sm75=2/2",
                          "flashinfer_sampler=disabled-sm75-guard"]
    assert "env.VLLM_RPC_TIMEOUT=777 kept: the user's value wins (we would set 1800000)" in banner
    child = json.loads(next(ln for ln in out["child"].splitlines() if ln.startswith("CHILD "))[6:])
    assert sum(f"guards from vLLM process pid {out['pid']} apply in this process" in r for r in child) == 1
    # the child did not plan again: no banner, no attempt to read its (missing) facts file for guards
    assert not any(r.startswith(HEADER) or "guards not applied" in r for r in child), child


def test_additional_config_on_the_command_line_is_read(tmp_path):
    out = run_vllm_process(tmp_path, ["/m", "--additional-config", '{"caovan_flashinfer_sampler":"keep",'
                                      '"caovan_timeout_guard":false,"other":1}'])
    assert out["error"] is None
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in out["env"] and "VLLM_RPC_TIMEOUT" not in out["env"]
    assert out["env"]["TORCH_CUDA_ARCH_LIST"] == "7.5"


def test_require_turbo3_refuses_inside_vllm_and_sets_nothing(tmp_path):
    # The GDN switch alone now serves (vLLM's own GDN kernels on the hook's tensor cores); without
    # the hook nothing of ours gets tensor cores, and require-turbo3 refuses.
    out = run_vllm_process(tmp_path, ["/m", "--additional-config", '{"caovan_require_turbo3":true}'],
                           CAOVAN_GDN_LEGACY_DISABLE="1", CAOVAN_TURBO="off")
    assert out["error"].startswith("Turbo3Refused: require-turbo3 (additional-config caovan_require_turbo3) is on")
    assert "CAOVAN_GDN_LEGACY_DISABLE=1" in out["error"]
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in out["env"] and "_CAOVAN_APPLIED" not in out["env"]
    assert any("refused: require-turbo3" in r for r in out["records"])
    assert not (tmp_path / "cache").exists()


def test_problems_are_logged_never_raised(tmp_path):
    out = run_vllm_process(tmp_path, ["/m", "--additional-config", "{not json"])
    assert out["error"] is None
    failed = [r for r in out["records"] if "guards not applied in this process" in r]
    assert len(failed) == 1 and "not valid JSON" in failed[0]
    assert not any(HEADER in r for r in out["records"])
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in out["env"]


def test_disabled_by_settings_does_nothing(tmp_path):
    out = run_vllm_process(tmp_path, ["/m"], CAOVAN_ENABLE="0")
    assert out["error"] is None
    assert "Caovan SM75 Turbo3: disabled by settings (enable=False, mode=auto)" in out["records"]
    assert not any(HEADER in r for r in out["records"])
    assert "_CAOVAN_APPLIED" not in out["env"] and "VLLM_USE_FLASHINFER_SAMPLER" not in out["env"]


def test_banner_reaches_vllms_log_output(tmp_path):
    # no handler of our own: the banner goes out through vLLM's configured logging
    code = textwrap.dedent("""
        import sys
        sys.argv = ["vllm", "serve", "/m"]
        import vllm.plugins
        vllm.plugins.load_general_plugins()
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAOVAN_", "VLLM_", "_CAOVAN"))}
    env.update(HOME=str(tmp_path), CAOVAN_FACTS=str(FACTS), CAOVAN_CACHE_DIR=str(tmp_path / "c"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    logged = r.stdout + r.stderr
    assert "Caovan vLLM SM75 Turbo3 external plugin v" in logged
    assert any(ln.endswith("] flashinfer_sampler=disabled-sm75-guard") for ln in logged.splitlines()), logged[-2000:]


def test_a_drafter_that_cannot_serve_the_kv_dtype_is_warned_inside_vllm(tmp_path, monkeypatch, caplog):
    """`vllm serve` with fp8 KV and MTP on vLLM 0.24: its drafter picks TRITON_ATTN and stops. The
    plugin's plan says so, with the fix, as the launcher's would; named, it is quiet. (The process's
    vLLM is this lane's 0.21, so the facts of a 0.24 process are handed in.)"""
    import dataclasses
    import logging

    from caovan_vllm_sm75_turbo3.plugin.context import ProcessContext
    from caovan_vllm_sm75_turbo3.plugin.register import apply_guards
    from caovan_vllm_sm75_turbo3.runtime.facts import Facts

    facts = Facts.load(FACTS)
    facts = dataclasses.replace(facts, versions=dataclasses.replace(facts.versions, vllm="0.24.0", triton="3.6.0"))

    class At024(ProcessContext):
        @property
        def facts(self) -> Facts:
            return facts

    def warnings(spec: str) -> list[str]:
        env = {"HOME": str(tmp_path), "CAOVAN_CACHE_DIR": str(tmp_path / "cache"), "PATH": os.environ.get("PATH", "")}
        monkeypatch.setattr(os, "environ", env)   # what the plan sets stays in this dict
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="caovan_vllm_sm75_turbo3"):
            apply_guards(At024(env, ["/venv/bin/vllm", "serve", "/m", "--kv-cache-dtype", "fp8",
                                     "--speculative-config", spec]))
        return [r.getMessage() for r in caplog.records if "vLLM is expected to fail" in r.getMessage()]

    warned = warnings('{"method":"mtp","num_speculative_tokens":3}')
    assert len(warned) == 1 and "vLLM 0.24.0" in warned[0] and '"attention_backend":"CUSTOM"' in warned[0]
    assert warnings('{"method":"mtp","num_speculative_tokens":3,"attention_backend":"CUSTOM"}') == []
