"""Host checks (issue 18): fake sysfs trees and facts -> findings; facts files with the host
fields round-trip; hostile values in them are one line, exit 2; unknown values are no warning."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.facts import EXAMPLES, TI22, facts_dict
from helpers.hostile import FAST, VALUES, assert_clean, run_main
from hypothesis import given
from hypothesis import strategies as st

from caovan_vllm_sm75_turbo3.cli import doctor
from caovan_vllm_sm75_turbo3.config import load_settings
from caovan_vllm_sm75_turbo3.errors import FactsError
from caovan_vllm_sm75_turbo3.policy import host_checks as H
from caovan_vllm_sm75_turbo3.policy.banner import banner_lines
from caovan_vllm_sm75_turbo3.policy.checks import Status, run_checks
from helpers.plans import plan_from
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args
from caovan_vllm_sm75_turbo3.runtime import host
from caovan_vllm_sm75_turbo3.runtime.facts import Facts
from caovan_vllm_sm75_turbo3.runtime.probe import probe_host

# A healthy 2 x 2080 Ti host: every host field known and fine.
GOOD_GPU = {"pcie_gen": 1, "pcie_gen_max": 3, "pcie_width": 16, "pcie_width_max": 16, "power_limit_w": 250,
            "power_limit_default_w": 250, "persistence_mode": True, "nvlink_active_links": 0,
            "throttle_reasons": ["gpu_idle"]}
GOOD_HOST = {"cpu_governor": "performance", "cpu_governors": ["performance"]}
HOST_NAMES = ["host-cpu-governor", "gpu-pcie-link", "gpu-power-limit", "gpu-persistence", "gpu-throttle", "gpu-p2p"]


def good(gpu0: dict | None = None, gpu1: dict | None = None, **host_fields) -> dict:
    g0 = {**TI22, "index": 0, **GOOD_GPU, "p2p_read": {"1": "chipset_not_supported"}, **(gpu0 or {})}
    g1 = {**TI22, "index": 1, **GOOD_GPU, "p2p_read": {"0": "chipset_not_supported"}, **(gpu1 or {})}
    return facts_dict(gpus=[g0, g1], host={**GOOD_HOST, **host_fields})


def by_name(data: dict) -> dict:
    return {r.name: r for r in H.host_checks(Facts.from_dict(data))}


def fake_root(tmp_path: Path, governors: list[str | None], model: str | None = "Intel(R) Xeon(R) CPU E5-2680 v4") -> Path:
    """/proc/cpuinfo and /sys/devices/system/cpu/cpuN/cpufreq/scaling_governor; None: a CPU without cpufreq."""
    (tmp_path / "proc").mkdir()
    info = "".join(f"processor\t: {i}\n" + (f"model name\t: {model}\n" if model else "") + "\n"
                   for i in range(len(governors)))
    (tmp_path / "proc/cpuinfo").write_text(info)
    cpu = tmp_path / "sys/devices/system/cpu"
    for i, gov in enumerate(governors):
        (cpu / f"cpu{i}").mkdir(parents=True)
        if gov is not None:
            (cpu / f"cpu{i}/cpufreq").mkdir()
            (cpu / f"cpu{i}/cpufreq/scaling_governor").write_text(gov + "\n")
    (cpu / "cpufreq").mkdir(parents=True, exist_ok=True)  # sysfs has these beside the cpuN directories
    (cpu / "cpuidle").mkdir(exist_ok=True)
    return tmp_path


# --- sysfs and /proc --------------------------------------------------------------------------

@pytest.mark.parametrize("governors,one,distinct", [
    (["performance"] * 4, "performance", ["performance"]),
    (["powersave", "performance", "powersave", None], "mixed", ["performance", "powersave"]),
    (["ondemand"] * 2 + [None], "ondemand", ["ondemand"]),
    ([None, None], None, None),                   # a VM without cpufreq: unknown
    (["perf ormance", "\x00\xff"], None, None),   # garbage in sysfs is no governor
])
def test_governors_from_a_fake_sysfs(tmp_path, governors, one, distinct):
    root = fake_root(tmp_path, governors)
    assert host.governor_summary(host.cpu_governors(root)) == (one, distinct)
    h = probe_host([], root)
    assert (h.cpu_governor, h.cpu_governors) == (one, distinct)
    assert h.cpu_model == "Intel(R) Xeon(R) CPU E5-2680 v4"


def test_cpu_numbers_sort_and_missing_trees_are_unknown(tmp_path):
    root = fake_root(tmp_path, ["performance"] * 12)
    assert len(host.cpu_governors(root)) == 12
    assert host.cpu_governors(tmp_path / "nowhere") == [] and host.cpu_model(tmp_path / "nowhere") is None


def test_cpuinfo_without_model_name_is_unknown(tmp_path):
    assert host.cpu_model(fake_root(tmp_path, ["performance"], model=None)) is None


# --- facts -> findings ------------------------------------------------------------------------

def test_unknown_is_no_row_and_no_warning():
    assert H.host_checks(Facts.from_dict(facts_dict())) == []
    assert json.loads((EXAMPLES / "2x2080ti-22g.json").read_text())["gpus"]  # the reference: no host fields
    assert H.host_checks(Facts.load(EXAMPLES / "2x2080ti-22g.json")) == []


def test_a_healthy_host_passes_every_host_check():
    rows = by_name(good())
    assert list(rows) == HOST_NAMES
    assert all(r.status is Status.PASS and r.remedy == "" for r in rows.values()), rows
    assert "x16 gen 1/3" in rows["gpu-pcie-link"].detail  # a low current gen at idle is shown, not judged
    assert "0-1 chipset_not_supported" in rows["gpu-p2p"].detail


@pytest.mark.parametrize("change,name,fix,seen", [
    ({"host": {"cpu_governor": "powersave", "cpu_governors": ["powersave"]}}, "host-cpu-governor",
     "sudo cpupower frequency-set -g performance", "governor powersave"),
    ({"host": {"cpu_governor": "mixed", "cpu_governors": ["ondemand", "performance"]}}, "host-cpu-governor",
     "sudo cpupower frequency-set -g performance", "ondemand/performance"),
    ({"gpu1": {"pcie_width": 4, "pcie_width_max": 4}}, "gpu-pcie-link", "move the card to a slot wired x16",
     "GPU 1 x4 gen 1/3"),
    ({"gpu0": {"pcie_width": 8, "pcie_width_max": 16}}, "gpu-pcie-link", "reseat the card", "GPU 0 x8 of x16"),
    ({"gpu0": {"power_limit_w": 180}}, "gpu-power-limit", "sudo nvidia-smi -i 0 -pl 250", "GPU 0 180 W of default 250 W"),
    ({"gpu0": {"persistence_mode": False}}, "gpu-persistence", "sudo nvidia-smi -pm 1", "off on GPU 0"),
    ({"gpu1": {"throttle_reasons": ["sw_power_cap", "hw_thermal_slowdown"]}}, "gpu-throttle",
     "nvidia-smi -q -d PERFORMANCE", "GPU 1 sw_power_cap+hw_thermal_slowdown"),
    ({"gpu0": {"p2p_read": {"1": "ioh_topology_not_supported"}}}, "gpu-p2p", "under one CPU socket",
     "0-1 ioh_topology_not_supported"),
])
def test_each_finding_is_a_warn_with_its_fix_and_the_field_measurement(change, name, fix, seen):
    data = good(change.get("gpu0"), change.get("gpu1"), **change.get("host", {}))
    rows = by_name(data)
    r = rows[name]
    assert r.status is Status.WARN and fix in r.remedy and seen in r.detail, r
    assert "; field: " in r.detail
    assert [x.name for x in rows.values() if x.status is Status.WARN] == [name]  # nothing else fires


def test_the_governor_finding_carries_the_field_numbers():
    r = by_name(good(cpu_governor="powersave", cpu_governors=["powersave"]))["host-cpu-governor"]
    assert "30-40 to 60-70 tok/s" in r.detail


def test_a_narrow_slot_is_a_finding_only_with_several_gpus():
    one = facts_dict(gpus=[{**TI22, "index": 0, **GOOD_GPU, "pcie_width": 4, "pcie_width_max": 4}])
    assert by_name(one)["gpu-pcie-link"].status is Status.PASS
    assert "gpu-p2p" not in by_name(one)


def test_power_limit_fix_names_each_card_by_its_nvidia_smi_index():
    both = by_name(good({"power_limit_w": 200}, {"power_limit_w": 200}))["gpu-power-limit"]
    assert both.remedy == "sudo nvidia-smi -pl 250"
    moved = by_name(good({"power_limit_w": 200, "nvml_index": 3}))["gpu-power-limit"]
    assert moved.remedy == "sudo nvidia-smi -i 3 -pl 250"
    above = by_name(good({"power_limit_w": 300}))["gpu-power-limit"]  # raised on purpose: the user's choice
    assert above.status is Status.PASS


def test_partly_known_values_judge_only_what_is_known():
    rows = by_name(good({"pcie_width": None, "pcie_width_max": None, "power_limit_default_w": None,
                         "persistence_mode": None, "throttle_reasons": None, "p2p_read": None},
                        {"persistence_mode": None, "throttle_reasons": None, "p2p_read": None,
                         "nvlink_active_links": None}, cpu_governor=None, cpu_governors=None))
    assert list(rows) == ["gpu-pcie-link", "gpu-power-limit", "gpu-p2p"]
    assert "GPU 0" not in rows["gpu-pcie-link"].detail and "GPU 0" not in rows["gpu-power-limit"].detail
    assert rows["gpu-p2p"].detail == "NVLink active links GPU 0 0"


def test_unknown_names_in_a_facts_file_are_no_finding():
    rows = by_name(good({"throttle_reasons": ["future_reason"], "p2p_read": {"1": "future_status", "7": "disabled_by_regkey"}}))
    assert rows["gpu-throttle"].status is Status.PASS and rows["gpu-p2p"].status is Status.PASS  # GPU 7 is not here


def test_the_finding_table_is_complete_and_cites_its_sources():
    table = H.findings()
    for key in ("host-cpu-governor", "gpu-pcie-narrow", "gpu-pcie-degraded", "gpu-power-limit",
                "gpu-persistence", "gpu-throttle", "gpu-p2p"):
        assert {"fix", "measured", "source"} <= set(table[key]) and all(table[key][k] for k in ("fix", "measured", "source"))
    assert set(table["gpu-throttle"]["warn_reasons"]) <= set(host.THROTTLE_REASONS)
    assert set(table["gpu-p2p"]["warn_statuses"]) <= set(host.P2P_STATUSES.values())
    # a number in a measurement is a measured one: only the field report's
    for key, entry in table.items():
        if isinstance(entry, dict) and re.search(r"\d+ tok/s", entry["measured"]):
            assert key == "host-cpu-governor"


# --- the doctor, the banner, facts files ------------------------------------------------------

def test_host_findings_reach_the_doctor_and_its_exit_code(write_facts):
    r = run_main(doctor.PROG, doctor.main, ["--facts", str(write_facts(good(cpu_governors=["powersave"]))), "--json"])
    report = json.loads(r.out)
    assert r.code == 1 and report["runtime"] == "WARN"
    row = next(c for c in report["checks"] if c["name"] == "host-cpu-governor")
    assert row["status"] == "WARN" and row["remedy"] == "sudo cpupower frequency-set -g performance"
    gpu = report["facts"]["gpus"][0]
    assert gpu["pcie_width_max"] == 16 and gpu["power_limit_w"] == 250.0 and gpu["p2p_read"] == {"1": "chipset_not_supported"}
    assert report["facts"]["host"]["cpu_governors"] == ["powersave"]
    healthy = run_main(doctor.PROG, doctor.main, ["--facts", str(write_facts(good(), "ok.json"))])
    assert healthy.code == 0 and "gpu-pcie-link" in healthy.out


def test_the_banner_shows_host_findings_with_their_fix():
    f = Facts.from_dict(good({"pcie_width": 4, "pcie_width_max": 16}, cpu_governors=["ondemand"]), source="test")
    plan = plan_from(f, load_settings({}), {}, read_vllm_args(["/models/qwen", "--tensor-parallel-size", "2"]))
    lines = banner_lines(plan)
    assert "runtime=WARN" in lines and plan.stop_reason() is None  # findings never stop a launch
    gov = next(x for x in lines if x.startswith("check host-cpu-governor=WARN: "))
    assert gov.endswith(" -> sudo cpupower frequency-set -g performance")
    assert any(x.startswith("check gpu-pcie-link=WARN: PCIe GPU 0 x4 of x16") and " -> reseat the card" in x for x in lines)
    assert not any(x.startswith("check gpu-power-limit") for x in lines)  # PASS rows stay out of the banner


def test_facts_with_host_fields_round_trip(tmp_path):
    data = good({"nvml_index": 2, "throttle_reasons": []}, cpu_model="AMD EPYC 7302")
    f = Facts.from_dict(data)
    assert Facts.from_dict(f.to_dict()).to_dict() == f.to_dict()
    p = tmp_path / "f.json"
    p.write_text(f.to_json())
    back = Facts.load(p)
    assert back.gpus[0].throttle_reasons == [] and back.gpus[0].extra == {"nvml_index": 2}
    assert back.gpus[1].p2p_read == {"0": "chipset_not_supported"} and back.host.cpu_governor == "performance"
    assert [r.to_dict() for r in run_checks(back)] == [r.to_dict() for r in run_checks(f)]


# --- hostile values in the host fields --------------------------------------------------------

@pytest.mark.parametrize("where,value,needle", [
    ("gpu", {"pcie_width": -4}, "'gpus[0].pcie_width' must be a whole number from 1 to 64"),
    ("gpu", {"pcie_gen_max": 2**63}, "'gpus[0].pcie_gen_max' must be a whole number from 1 to 32"),
    ("gpu", {"nvlink_active_links": "2"}, "'gpus[0].nvlink_active_links' must be a whole number"),
    ("gpu", {"power_limit_w": -250}, "'gpus[0].power_limit_w' must be a number from 1 to 5000 or null, not -250"),
    ("gpu", {"power_limit_default_w": 1e300}, "'gpus[0].power_limit_default_w' must be a number from 1 to 5000"),
    ("gpu", {"power_limit_w": True}, "'gpus[0].power_limit_w' must be a number"),
    ("gpu", {"persistence_mode": 1}, "'gpus[0].persistence_mode' must be true, false or null"),
    ("gpu", {"throttle_reasons": "hw_slowdown"}, "'gpus[0].throttle_reasons' must be a list of strings"),
    ("gpu", {"throttle_reasons": ["ok", "two\nlines"]}, "'gpus[0].throttle_reasons' must hold names"),
    ("gpu", {"p2p_read": ["ok"]}, "'gpus[0].p2p_read' must map GPU indices"),
    ("gpu", {"p2p_read": {"-1": "ok"}}, "'gpus[0].p2p_read' must map GPU indices"),
    ("gpu", {"p2p_read": {"1": 0}}, "'gpus[0].p2p_read' must map GPU indices"),
    ("gpu", {"p2p_read": {"1": "[bold]x[/]"}}, "'gpus[0].p2p_read' must hold names"),
    ("host", {"cpu_governor": "x" * 41}, "'host.cpu_governor' must hold names"),
    ("host", {"cpu_governors": ["performance\n"]}, "'host.cpu_governors' must hold names"),
    ("host", {"cpu_governors": {"a": "b"}}, "'host.cpu_governors' must be a list of strings"),
])
def test_each_bad_host_value_is_one_line_exit_2(write_facts, where, value, needle):
    data = good(value) if where == "gpu" else good(**value)
    with pytest.raises(FactsError) as err:
        Facts.from_dict(data, source="f.json")
    assert needle in str(err.value) and "\n" not in str(err.value)
    r = run_main(doctor.PROG, doctor.main, ["--facts", str(write_facts(data))])
    assert_clean(r, (2,))
    assert r.err.startswith("caovan-sm75-doctor: error: facts from ") and needle in r.err


_HOST_KEYS = [("gpus", k) for k in ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "power_limit_w",
                                    "power_limit_default_w", "persistence_mode", "nvlink_active_links",
                                    "throttle_reasons", "p2p_read")] + [("host", k) for k in ("cpu_governor", "cpu_governors")]


@FAST
@given(where=st.sampled_from(_HOST_KEYS), value=VALUES, as_json=st.booleans())
def test_any_value_at_a_host_key_is_a_report_or_one_error_line(tmp_path_factory, where, value, as_json):
    data = good()
    section, key = where
    (data[section][0] if section == "gpus" else data[section])[key] = value
    p = tmp_path_factory.mktemp("f") / "facts.json"
    p.write_text(json.dumps(data))
    r = run_main(doctor.PROG, doctor.main, ["--facts", str(p), *(["--json"] if as_json else [])])
    assert_clean(r)
    if r.err:
        assert r.code == 2 and r.err.startswith(("caovan-sm75-doctor: error: facts from ",
                                                 "caovan-sm75-doctor: error: facts file "))  # NaN, Infinity
    elif as_json:
        json.loads(r.out)
