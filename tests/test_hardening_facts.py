"""Facts files at the boundary (issue 17): whatever a facts file holds, caovan-sm75-doctor ends
fast with a report or one `error:` line naming the file and the key, exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from helpers.hostile import FAST, VALUES, assert_clean, deep, run_main

from caovan_vllm_sm75_turbo3.cli import doctor
from caovan_vllm_sm75_turbo3.errors import FactsError
from caovan_vllm_sm75_turbo3.runtime.facts import Facts

from helpers.facts import EXAMPLES, facts_dict

# Every known key of every section, so a generated value lands where the validator must look.
_KEYS = [("gpus", k) for k in ("index", "name", "compute_capability", "memory_total_mib", "uuid")] + [
    ("host", k) for k in ("memory_total_mib", "memory_available_mib", "swap_total_mib", "cpu_model", "cpu_count")] + [
    ("versions", k) for k in ("python", "torch", "torch_sm75", "vllm", "driver")] + [
    ("toolchain", k) for k in ("nvcc_path", "ptxas_path")] + [(None, k) for k in ("notes", "nvml_ok", "gpus", "host")]


def _doctor_on(text: str | bytes, *args: str):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d, "facts.json")
        p.write_bytes(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
        return run_main(doctor.PROG, doctor.main, ["--facts", str(p), *args])


@FAST
@given(where=st.sampled_from(_KEYS), value=VALUES, as_json=st.booleans())
def test_any_value_at_any_key_is_a_report_or_one_error_line(where, value, as_json):
    data = facts_dict()
    section, key = where
    target = data if section is None else (data[section][0] if section == "gpus" else data[section])
    target[key] = value
    r = _doctor_on(json.dumps(data), *(["--json"] if as_json else []))
    assert_clean(r)
    if r.err:
        assert r.code == 2 and r.err.startswith(("caovan-sm75-doctor: error: facts from ", "caovan-sm75-doctor: error: facts file "))
    elif as_json:
        def bare(constant: str) -> None:   # json.loads accepts NaN/Infinity tokens: strict JSON has none
            raise AssertionError(f"bare {constant} in --json output")
        json.loads(r.out, parse_constant=bare)   # a string "NaN" (a GPU named so) is fine


@FAST
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode)
       | st.integers(1, 3000).map(lambda n: deep(n).encode()) | st.integers(1, 3000).map(lambda n: deep(n, "obj").encode()))
def test_any_bytes_are_a_report_or_one_error_line(raw):
    assert_clean(_doctor_on(raw, "--json"))


@pytest.mark.parametrize("content,needle", [
    (b"\xff\xfe{}", "is not UTF-8 text (byte 0xff at offset 0)"),
    (deep(5000).encode(), "is nested more than 64 levels deep"),
    (b'{"host": {"memory_total_mib": NaN}}', "NaN is not a JSON number"),
    (b'{"host": {"memory_total_mib": 1e400}}', "non-finite number"),
    (b'{"gpus": [{"memory_total_mib": "22528"}]}', "'gpus[0].memory_total_mib' must be a whole number from 0 to"),
    (b'{"versions": {"torch": ["2.11"]}}', "'versions.torch' must be a string or null, not ['2.11']"),
    (b'{"notes": {"a": 1}}', "'notes' must be a list of strings"),
    (b'{"host": {"memory_total_mib": -1}}', "'host.memory_total_mib' must be a whole number from 0 to 2147483648 or null, not -1"),
    (b'{"host": {"memory_total_mib": 1e300}}', "not 1e+300"),
    (b'{"host": {"cpu_count": 0}}', "'host.cpu_count' must be a whole number from 1"),
    (b'{"versions": {"torch_sm75": "yes"}}', "'versions.torch_sm75' must be true, false or null"),
])
def test_each_bad_kind_names_the_key(tmp_path, content, needle):
    p = tmp_path / "f.json"
    p.write_bytes(content)
    with pytest.raises(FactsError) as err:
        Facts.load(p)
    assert needle in str(err.value) and str(p) in str(err.value) and "\n" not in str(err.value)


def test_integral_floats_and_missing_keys_still_load(write_facts):
    f = Facts.load(write_facts({"gpus": [{"memory_total_mib": 22528.0}], "host": {}, "rack": [1]}))
    assert f.gpus[0].memory_total_mib == 22528 and f.host.memory_total_mib is None
    assert f.extra == {"rack": [1]}


@pytest.mark.parametrize("make,kind", [
    (lambda p: os.mkfifo(p), "a FIFO"),
    (lambda p: p.mkdir(), "a directory"),
])
def test_fifo_or_directory_is_refused_without_blocking(tmp_path, make, kind):
    p = tmp_path / "facts.json"
    make(p)
    done: list[BaseException] = []

    def load() -> None:
        try:
            Facts.load(p)
        except BaseException as err:  # noqa: BLE001 (handed to the test thread)
            done.append(err)
    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(5)
    assert done, "loading the facts file blocked"
    assert isinstance(done[0], FactsError) and f"is {kind}, not a regular file" in str(done[0])


def test_device_and_huge_file_are_refused(tmp_path):
    with pytest.raises(FactsError, match="is a character device"):
        Facts.load("/dev/zero")
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(17 * 2**20)  # sparse
    with pytest.raises(FactsError, match="larger than 16 MiB"):
        Facts.load(big)


def test_doctor_exit_2_one_line_for_a_bad_facts_file(tmp_path):
    p = tmp_path / "f.json"
    p.write_text('{"gpus": [{"memory_total_mib": "22528"}]}')
    r = run_main(doctor.PROG, doctor.main, ["--facts", str(p)])
    assert r.code == 2 and r.out == "" and len(r.err.splitlines()) == 1
    assert r.err.startswith(f"caovan-sm75-doctor: error: facts from {p} do not have the expected shape: "
                            "'gpus[0].memory_total_mib'")


def test_markup_in_a_gpu_name_is_printed_literally(tmp_path):
    data = json.loads((EXAMPLES / "2x2080ti-22g.json").read_text())
    data["gpus"][0]["name"] = "[bold]Evil[/nope] [/]"
    p = tmp_path / "f.json"
    p.write_text(json.dumps(data))
    r = run_main(doctor.PROG, doctor.main, ["--facts", str(p)])
    assert_clean(r)
    assert "[bold]Evil[/nope] [/]" in r.out


@pytest.mark.parametrize("key", ["notes", "extra"])
def test_a_null_list_or_map_at_the_top_is_unknown_not_a_crash(key):
    # Found by the derandomized CI profile: `"notes": null` made the doctor's report raise a TypeError.
    r = _doctor_on(json.dumps({"gpus": [], key: None}))
    assert_clean(r)
    assert r.code == 2 and "Traceback" not in r.err  # no GPU: FAIL, reported, not crashed
