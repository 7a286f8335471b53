"""The newcomer's first look: `caovan-vllm-serve --dry-run --facts examples/2x2080ti-22g.json
examples/models/qwen3.6-27b-awq` shows the filled values with their reasons and the arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.facts import EXAMPLES, ROOT

MODEL = str(EXAMPLES / "models" / "qwen3.6-27b-awq")
FACTS = str(EXAMPLES / "2x2080ti-22g.json")


def serve(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAOVAN_", "VLLM_", "XDG_"))}
    env["HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.serve", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)


def test_dry_run_shows_filled_values_with_reasons(tmp_path):
    r = serve(["--dry-run", "--facts", FACTS, MODEL], tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for expect in ("arg --tensor-parallel-size 2 filled: ", "arg --max-model-len 262144 filled: ",
                   "arg --kv-cache-dtype fp8 filled: ", "arg --no-enable-prefix-caching filled: ",
                   "arg --disable-custom-all-reduce filled: "):
        hit = [ln for ln in lines if ln.startswith(expect)]
        assert hit and len(hit[0]) > len(expect) + 10, expect  # a reason follows
    assert any(ln.startswith("note: memory: KV per token per GPU = 16 full-attention layers + 1 MTP layer")
               for ln in lines)
    assert any(ln.startswith("note: profile: 2x2080ti-22g-qwen3.5-hybrid-v0.21 (field-report)") for ln in lines)
    argv = next(ln for ln in lines if ln.startswith("argv: "))
    assert "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'" in argv
    assert not (tmp_path / ".cache").exists()  # a dry run writes nothing


def test_json_plan_keeps_the_users_values(tmp_path):
    r = serve([MODEL, "--max-model-len", "65536", "--json", "--facts", FACTS, "--kv-cache-dtype", "auto"], tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    filled = {f["flag"]: f for f in plan["filled_args"]}
    assert "--max-model-len" not in filled and "--kv-cache-dtype" not in filled
    assert plan["argv"].count("--max-model-len") == 1 and plan["argv"][plan["argv"].index("--max-model-len") + 1] == "65536"
    assert any(n.startswith("kept: --max-model-len 65536 as given") for n in plan["notes"])
    assert all(f["reason"] for f in filled.values()) and filled["--max-num-seqs"]["value"].isdigit()


def test_profile_none_fills_nothing(tmp_path):
    r = serve([MODEL, "--json", "--facts", FACTS, "--profile", "none"], tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["filled_args"] == [] and plan["argv"] == ["vllm", "serve", MODEL]


def test_unknown_profile_name_is_one_clear_error(tmp_path):
    r = serve([MODEL, "--dry-run", "--facts", FACTS, "--profile", "fastest"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "caovan-vllm-serve: error: " in r.stderr and "not a launch profile" in r.stderr


def test_the_users_turbo_setting_decides_fp8_kv_on_releases_that_need_our_backend(tmp_path):
    # vLLM 0.24 serves fp8 KV on SM75 only through our backend, whose kernel needs the Turbo hook
    # (speculation off: beside MTP the profile keeps fp16 KV until that pair is proven).
    facts = json.loads(Path(FACTS).read_text())
    facts["versions"].update(vllm="0.24.0", triton="3.6.0")
    path = tmp_path / "facts-0.24.json"
    path.write_text(json.dumps(facts))

    def kv(env: dict[str, str]) -> tuple[str, str | None]:
        r = subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.serve", MODEL, "--json", "--facts",
                            str(path), "--speculative-config", "null"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env={**{k: v for k, v in os.environ.items() if not k.startswith(("CAOVAN_", "VLLM_"))},
                                "HOME": str(tmp_path), **env})
        assert r.returncode == 0, r.stderr
        filled = {f["flag"]: f["value"] for f in json.loads(r.stdout)["filled_args"]}
        return filled["--kv-cache-dtype"], filled.get("--attention-backend")

    assert kv({}) == ("fp8", "CUSTOM")
    assert kv({"CAOVAN_TURBO": "off"}) == ("auto", "TRITON_ATTN")
