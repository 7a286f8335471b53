"""caovan-sm75-doctor end to end, as a user runs it (a subprocess of the test venv's Python)."""

import json
import os
import subprocess
import sys

import pytest

from helpers.facts import EXAMPLES, RTX3090, T4, TI22, facts_dict

HEADER = "Caovan vLLM SM75 Turbo3 external plugin v"


def doctor(*args, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CAOVAN_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "caovan_vllm_sm75_turbo3.cli.doctor", *args],
                          capture_output=True, text=True, env=full_env, timeout=60)


def test_reference_facts_text_report():
    r = doctor("--facts", str(EXAMPLES / "2x2080ti-22g.json"))
    lines = r.stdout.splitlines()
    assert r.returncode == 0, r.stdout + r.stderr
    assert lines[0].startswith(HEADER) and lines[1] == "runtime=PASS" and lines[2] == "sm75=2/2"
    for name in ("sm75-gpus", "torch", "vllm", "flashinfer", "toolchain", "host-memory"):
        assert name in r.stdout


@pytest.mark.parametrize("data,code,runtime", [
    (facts_dict(), 0, "PASS"),
    (facts_dict(gpus=[dict(T4, index=0)], host={"memory_total_mib": 32768}), 1, "WARN"),
    (facts_dict(gpus=[dict(RTX3090, index=0), dict(TI22, index=1)]), 1, "WARN"),
    (facts_dict(host={"memory_total_mib": 16384}), 2, "FAIL"),
    (facts_dict(gpus=[]), 2, "FAIL"),
])
def test_json_report_and_exit_codes(write_facts, data, code, runtime):
    r = doctor("--facts", str(write_facts(data)), "--json")
    assert r.returncode == code, r.stderr
    report = json.loads(r.stdout)
    assert report["runtime"] == runtime and report["exit_code"] == code
    assert report["sm75"] == f"{sum(g['compute_capability'] == '7.5' for g in data['gpus'])}/{len(data['gpus'])}"
    assert {c["status"] for c in report["checks"]} <= {"PASS", "WARN", "FAIL"}
    assert report["facts"]["gpus"] == json.loads(json.dumps(report["facts"]["gpus"]))


def test_json_facts_can_be_fed_back(tmp_path, write_facts):
    first = json.loads(doctor("--facts", str(write_facts(facts_dict(gpus=[dict(T4, index=0)]))), "--json").stdout)
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(first))
    second = json.loads(doctor("--facts", str(saved), "--json").stdout)
    assert second["checks"] == first["checks"]


def test_this_machine_without_gpu_says_so_and_exits_2():
    r = doctor()
    assert r.returncode == 2
    assert "runtime=FAIL" in r.stdout and "No NVIDIA GPU is visible" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_env_facts_variable_is_used(write_facts):
    r = doctor("--json", env={"CAOVAN_FACTS": str(write_facts(facts_dict()))})
    assert json.loads(r.stdout)["sm75"] == "2/2"


@pytest.mark.parametrize("args,env,needle", [
    (["--facts", "/nonexistent/facts.json"], {}, "cannot read facts file '/nonexistent/facts.json'"),
    ([], {"CAOVAN_REQUIRE_TURBO3": "maybe"}, "CAOVAN_REQUIRE_TURBO3='maybe' is not accepted"),
])
def test_user_errors_are_one_line_exit_2(args, env, needle):
    r = doctor(*args, env=env)
    assert r.returncode == 2
    assert r.stderr.startswith("caovan-sm75-doctor: error: ") and needle in r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_settings_listing_shows_sources(write_facts):
    r = doctor("--facts", str(write_facts(facts_dict())), "--json", "--settings",
               env={"CAOVAN_GDN_LEGACY_DISABLE": "1"})
    rows = {row["variable"]: row for row in json.loads(r.stdout)["settings"]}
    assert rows["CAOVAN_GDN_LEGACY_DISABLE"] == {"variable": "CAOVAN_GDN_LEGACY_DISABLE", "value": True,
                                                 "source": "env CAOVAN_GDN_LEGACY_DISABLE"}
    assert rows["CAOVAN_REQUIRE_TURBO3"]["source"] == "default"


def test_help_documents_exit_codes():
    r = doctor("--help")
    assert r.returncode == 0 and "0 runtime=PASS, 1 runtime=WARN, 2 runtime=FAIL" in " ".join(r.stdout.split())


def test_doctor_imports_neither_torch_nor_vllm(write_facts):
    code = ("import sys; from caovan_vllm_sm75_turbo3.cli import doctor; "
            f"doctor.main(['--json']); "
            "heavy = [m for m in ('torch', 'vllm', 'triton', 'flashinfer') if m in sys.modules]; "
            "sys.stderr.write('HEAVY=' + ','.join(heavy))")
    for facts in (None, write_facts(facts_dict())):
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAOVAN_")}
        if facts:
            env["CAOVAN_FACTS"] = str(facts)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        assert "HEAVY=" in r.stderr and r.stderr.strip().endswith("HEAVY="), r.stderr


def test_ray_without_ray_installed_says_so_and_keeps_the_exit_code(monkeypatch, capsys):
    from caovan_vllm_sm75_turbo3.cli import doctor
    from caovan_vllm_sm75_turbo3.runtime import ray_cluster

    monkeypatch.setattr(ray_cluster.importlib.util, "find_spec", lambda name: None)
    plain = doctor.main(["--facts", str(EXAMPLES / "2x2080ti-22g.json"), "--json"])
    capsys.readouterr()
    code = doctor.main(["--facts", str(EXAMPLES / "2x2080ti-22g.json"), "--json", "--ray"])
    out = json.loads(capsys.readouterr().out)
    assert code == plain and out["ray"]["address"] == "auto" and out["ray"]["nodes"] == []
    assert out["ray"]["error"].startswith("Ray is not installed here")
    assert doctor.ray_lines(ray_cluster.RayCluster("x", error="e")) == ["ray: e"]
