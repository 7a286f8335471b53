"""runtime/model_source.py: a model argument found where vLLM would find it, offline. Hub ids in the
Hugging Face cache (HF_HOME, HF_HUB_CACHE, --download-dir, --revision), ModelScope's cache where
VLLM_USE_MODELSCOPE is set, GGUF files, local folders; and what the launcher says of each."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.facts import EXAMPLES

from caovan_vllm_sm75_turbo3.runtime.model import read_model_arg
from caovan_vllm_sm75_turbo3.runtime.model_source import find_model, hf_cache_dir

QWEN = EXAMPLES / "models" / "qwen3.6-27b-awq"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hf_snapshot(cache: Path, repo: str, commit: str = COMMIT, ref: str = "main", model: Path = QWEN) -> Path:
    """A Hugging Face cache entry as huggingface_hub writes it (refs/<ref> -> snapshots/<commit>/)."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / commit
    shutil.copytree(model, snap)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    return snap


@pytest.mark.parametrize("var", ["HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"])
def test_a_hub_id_is_found_in_the_cache_each_variable_names(tmp_path, var):
    base = tmp_path / "c"
    cache = {"HF_HUB_CACHE": base, "HF_HOME": base / "hub", "XDG_CACHE_HOME": base / "huggingface" / "hub",
             "HOME": base / ".cache" / "huggingface" / "hub"}[var]
    snap = hf_snapshot(cache, "Qwen/Qwen3.6-27B-AWQ")
    env = {var: str(base), "HOME": str(tmp_path / "elsewhere")} if var != "HOME" else {"HOME": str(base)}
    assert hf_cache_dir(env) == cache
    src = find_model("Qwen/Qwen3.6-27B-AWQ", env)
    assert src.folder == snap and "Hugging Face cache" in src.how
    facts = read_model_arg("Qwen/Qwen3.6-27B-AWQ", env)
    assert facts.config is not None and facts.mtp_weights and facts.found == src.how


def test_revision_and_download_dir_are_honoured(tmp_path):
    other = "f" * 40
    hf_snapshot(tmp_path / "dl", "Org/Model", commit=other, ref="v2")
    env = {"HF_HUB_CACHE": str(tmp_path / "nothing-here")}
    assert find_model("Org/Model", env).folder is None
    assert find_model("Org/Model", env, download_dir=str(tmp_path / "dl")).folder is None   # no refs/main
    assert find_model("Org/Model", env, "v2", str(tmp_path / "dl")).folder.name == other
    assert find_model("Org/Model", env, other, str(tmp_path / "dl")).folder.name == other   # a commit itself


def test_not_in_the_cache_says_where_it_looked_and_that_vllm_downloads_it(tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path)}
    src = find_model("meta-llama/Meta-Llama-3-8B-Instruct", env)
    assert src.folder is None and str(tmp_path) in src.how and "vLLM downloads it" in src.how
    offline = find_model("meta-llama/Meta-Llama-3-8B-Instruct", {**env, "HF_HUB_OFFLINE": "1"})
    assert "HF_HUB_OFFLINE" in offline.how


def test_modelscope_cache_where_vllm_uses_modelscope(tmp_path):
    env = {"VLLM_USE_MODELSCOPE": "True", "MODELSCOPE_CACHE": str(tmp_path)}
    assert find_model("qwen/Qwen3.6-27B-AWQ", env).folder is None
    shutil.copytree(QWEN, tmp_path / "models" / "qwen" / "Qwen3.6-27B-AWQ")
    src = find_model("qwen/Qwen3.6-27B-AWQ", env)
    assert src.folder == tmp_path / "models" / "qwen" / "Qwen3.6-27B-AWQ" and "ModelScope" in src.how
    hf_snapshot(tmp_path / "hf", "qwen/Qwen3.6-27B-AWQ")   # the HF cache is not where vLLM looks then
    assert "ModelScope" in find_model("qwen/Qwen3.6-27B-AWQ", {**env, "HF_HUB_CACHE": str(tmp_path / "hf")}).how


def test_a_gguf_file_and_a_local_folder(tmp_path):
    gguf = tmp_path / "model-Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00")
    src = find_model(str(gguf), {})
    assert src.gguf and src.folder is None and "GGUF" in src.how
    assert find_model(str(QWEN), {}).folder == QWEN


@pytest.mark.vllm
def test_the_cache_lookup_is_huggingface_hubs(tmp_path):
    """Our lookup of the cache layout against huggingface_hub's own, in a process whose environment
    names the cache (huggingface_hub reads it at import)."""
    hf_snapshot(tmp_path / "hub", "Org/Model")
    hf_snapshot(tmp_path / "hub", "Org/Model", commit="e" * 40, ref="dev")
    code = ("import json, sys; from huggingface_hub import try_to_load_from_cache as t; "
            "print(json.dumps([t('Org/Model', 'config.json'), t('Org/Model', 'config.json', revision='dev'), "
            "t('Org/Missing', 'config.json')]))")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    theirs = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                       timeout=120, check=True).stdout)
    ours = [find_model("Org/Model", env).folder, find_model("Org/Model", env, "dev").folder,
            find_model("Org/Missing", env).folder]
    assert [str(Path(t).parent) if isinstance(t, str) else None for t in theirs] == [
        str(p) if p else None for p in ours]


def test_the_launcher_plans_a_cached_hub_id_with_its_profile_and_mtp(tmp_path):
    from caovan_vllm_sm75_turbo3.launch import plan_for_launcher
    from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args

    hf_snapshot(tmp_path / "hub", "Qwen/Qwen3.6-27B-AWQ")
    env = {"CAOVAN_FACTS": str(EXAMPLES / "2x2080ti-22g.json"), "HF_HUB_CACHE": str(tmp_path / "hub")}
    plan = plan_for_launcher(env, read_vllm_args(["Qwen/Qwen3.6-27B-AWQ"]), write=False).plan
    flags = {a.flag for a in plan.filled_args}
    assert "--speculative-config" in flags and "--tensor-parallel-size" in flags
    assert plan.status["gdn_legacy"] != "at-model-load"
    missing = plan_for_launcher({**env, "HF_HUB_CACHE": str(tmp_path / "none")}, read_vllm_args(["Qwen/Qwen3.6-27B-AWQ"]),
                          write=False).plan
    assert missing.status["gdn_legacy"] == "at-model-load" and missing.status["turbo3"] == "at-model-load"
    assert "--speculative-config" not in {a.flag for a in missing.filled_args}


def test_require_turbo3_with_a_model_not_here_does_not_promise_a_path(tmp_path):
    """The issue's Llama: a model we never read says nothing of GDN prefill or of tensor cores."""
    from caovan_vllm_sm75_turbo3.launch import plan_for_launcher
    from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args

    env = {"CAOVAN_FACTS": str(EXAMPLES / "2x2080ti-22g.json"), "CAOVAN_REQUIRE_TURBO3": "1",
           "HF_HUB_CACHE": str(tmp_path)}
    plan = plan_for_launcher(env, read_vllm_args(["meta-llama/Meta-Llama-3-8B-Instruct"]), write=False).plan
    assert plan.status["gdn_legacy"] == "at-model-load" and plan.status["turbo3"] == "at-model-load"
    assert plan.refusal is None
    assert not any("GDN prefill: ours" in n for n in plan.notes)
    assert any("decided when vLLM loads the model" in n for n in plan.notes)


def test_notes_say_only_what_was_filled_for_a_model_not_read_here(tmp_path):
    from caovan_vllm_sm75_turbo3.launch import plan_for_launcher
    from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args

    env = {"CAOVAN_FACTS": str(EXAMPLES / "2x2080ti-22g.json"), "HF_HUB_CACHE": str(tmp_path)}
    plan = plan_for_launcher(env, read_vllm_args(["meta-llama/Meta-Llama-3-8B-Instruct"]), write=False).plan
    profile = next(n for n in plan.notes if n.startswith("profile: "))
    assert "15 %" not in profile and "only what needs no model shape is filled" in profile
    assert {a.flag for a in plan.filled_args} <= {"--dtype", "--disable-custom-all-reduce"}
