"""What a new user met (issue 46, point 5), each held by a test that failed on the old behaviour."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.facts import EXAMPLES, facts_dict
from helpers.fake_vllm_server import fake  # noqa: F401  (a pytest fixture)

from caovan_vllm_sm75_turbo3.launch import plan_for_launcher
from helpers.plans import plan_here
from caovan_vllm_sm75_turbo3.policy.checks import check_mixed
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args
from caovan_vllm_sm75_turbo3.runtime.facts import Facts
from caovan_vllm_sm75_turbo3.server_api.client import ServerClient
from caovan_vllm_sm75_turbo3.server_api.readiness import NotReady, wait_until_ready

ROOT = Path(__file__).resolve().parents[1]
QWEN = str(EXAMPLES / "models" / "qwen3.6-27b-awq")


def _no_gpu_facts(tmp_path: Path) -> str:
    path = tmp_path / "nogpu.json"
    path.write_text(json.dumps(facts_dict(gpus=[])))
    return str(path)


def test_require_turbo3_does_not_refuse_for_the_gdn_switch_alone_and_the_docs_say_so():
    env = {"CAOVAN_FACTS": str(EXAMPLES / "2x2080ti-22g.json"), "CAOVAN_REQUIRE_TURBO3": "1",
           "CAOVAN_GDN_LEGACY_DISABLE": "1"}
    plan = plan_for_launcher(env, read_vllm_args([QWEN]), write=False).plan
    assert plan.refusal is None and plan.status["gdn_legacy"] == "disabled-by-user"
    section = (ROOT / "docs" / "serve.md").read_text().split("## require-turbo3", 1)[1].split("\n## ", 1)[0]
    refusals = section.split("refused, with every reason, when", 1)[1].split(").", 1)[0]
    assert "CAOVAN_GDN_LEGACY_DISABLE" not in refusals


def test_without_a_gpu_the_launcher_never_says_profiles_fill_only_in_the_launcher(tmp_path):
    env = {"CAOVAN_FACTS": _no_gpu_facts(tmp_path)}
    plan = plan_for_launcher(env, read_vllm_args([QWEN]), write=False).plan
    assert not any("launch profiles fill only in caovan-vllm-serve" in n for n in plan.notes)
    # a plain vLLM process (no profile step) still says where profiles fill
    inside = plan_here(env, read_vllm_args([QWEN]), write=False).plan
    assert any("launch profiles fill only in caovan-vllm-serve" in n for n in inside.notes)


def test_json_says_not_active_where_nothing_of_ours_applies(tmp_path):
    plan = plan_for_launcher({"CAOVAN_FACTS": _no_gpu_facts(tmp_path)}, read_vllm_args([QWEN]), write=False).plan
    d = plan.to_dict()
    assert d["active"] is False and d["enabled"] is True
    assert any("nothing of ours applies" in n for n in d["notes"])
    on = plan_for_launcher({"CAOVAN_FACTS": str(EXAMPLES / "2x2080ti-22g.json")}, read_vllm_args([QWEN]), write=False).plan.to_dict()
    assert on["active"] is True


def test_mixed_gpus_with_no_gpu_names_no_kind():
    r = check_mixed(Facts.from_dict(facts_dict(gpus=[])))
    assert "none" not in r.detail and "no GPU visible" in r.detail


def test_warmup_waits_the_whole_wait_and_says_nothing_was_started(fake):
    srv = fake(listen_after_s=60)
    start = time.monotonic()
    with ServerClient(srv.url) as client, pytest.raises(NotReady) as err:
        wait_until_ready(client, None, wait_s=1.5, poll_s=1.0)
    took = time.monotonic() - start
    assert took >= 1.5, took   # it gave up a poll early before (1.0 s of 1.5)
    assert "Is the server started" in str(err.value) and "still loading" not in str(err.value)


def test_config_module_help_is_help_not_the_table():
    r = subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.config", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m caovan_vllm_sm75_turbo3.config")
    assert "| variable |" not in r.stdout
    table = subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.config"], capture_output=True,
                           text=True, timeout=60)
    assert table.stdout.startswith("| variable |")


def test_verify_without_a_gpu_says_kernels_check_needs_triton():
    src = (ROOT / "src" / "caovan_vllm_sm75_turbo3" / "cli" / "verify.py").read_text()
    line = re.search(r'raise CaovanError\("no NVIDIA GPU is visible.*?\)', src, re.S).group(0)
    assert "caovan-sm75-kernels check" in line and "Triton" in line
