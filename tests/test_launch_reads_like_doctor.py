"""The doctor and the launcher read the same things the same way: the checkpoint's size, a minimal
facts file's unknowns, torch's sm_75 support, and CUDA_VISIBLE_DEVICES over a facts file's GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from caovan_vllm_sm75_turbo3.config import load_settings
from caovan_vllm_sm75_turbo3.launch import plan_for_launcher
from caovan_vllm_sm75_turbo3.policy.checks import check_checkpoint, check_host_memory, check_torch
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args
from caovan_vllm_sm75_turbo3.runtime.facts import Facts
from caovan_vllm_sm75_turbo3.runtime.model import read_model
from caovan_vllm_sm75_turbo3.runtime.probe import load_facts

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "examples" / "models" / "qwen3.6-27b-awq")
MINIMAL = {"gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 2080 Ti", "compute_capability": "7.5",
                     "memory_total_mib": 22528}],
           "host": {"memory_total_mib": 65536}, "versions": {"torch": "2.11.0", "torch_cuda": "13.0"}}


def test_checkpoint_size_is_the_launchers():
    model = read_model(MODEL)   # config and index only: no weight files
    facts = Facts.load(ROOT / "examples" / "2x2080ti-22g.json")
    check = check_checkpoint(facts, model)
    assert model.size_bytes and f"checkpoint {model.size_bytes / 2**30:.1f} GiB" in check.detail
    assert "0.0 GiB" not in check.detail and "index" in check.detail


def test_a_minimal_facts_file_says_what_it_does_not_know(tmp_path):
    p = tmp_path / "f.json"
    p.write_text(json.dumps(MINIMAL))
    facts = Facts.load(p)
    assert check_host_memory(facts).detail == "64 GiB total, available unknown"
    assert facts.versions.torch_sm75 is True   # derived from torch's CUDA, as the probe does
    assert check_torch(facts).status.value == "PASS"
    assert "free memory unknown" in check_checkpoint(facts, read_model(MODEL)).detail


def test_cuda_visible_devices_applies_to_a_facts_files_gpus():
    path = str(ROOT / "examples" / "4xt4-16g.json")
    facts = load_facts(path, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert [g.index for g in facts.gpus] == [0, 1] and "CUDA_VISIBLE_DEVICES='0,1'" in facts.notes[-1]
    assert len(load_facts(path, {}).gpus) == 4
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "CAOVAN_FACTS": path}
    prepared = plan_for_launcher(env, read_vllm_args([MODEL]), write=False)
    assert prepared.plan.status["sm75"] == "2/2"
    assert ("--tensor-parallel-size", "2") in [(f.flag, f.value) for f in prepared.plan.filled_args]
    assert any(n.startswith("facts: CUDA_VISIBLE_DEVICES='2,3'") for n in prepared.plan.notes)
    assert load_settings(env).facts == path


def test_doctor_and_dry_run_agree_through_the_commands(tmp_path):
    p = tmp_path / "f.json"
    p.write_text(json.dumps(MINIMAL))
    doctor = subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.doctor", "--facts", str(p),
                             "--model", MODEL, "--json"], capture_output=True, text=True, timeout=60)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["host-memory"]["detail"] == "64 GiB total, available unknown"
    assert checks["torch"]["status"] == "PASS" and "0.0 GiB" not in checks["checkpoint"]["detail"]
