"""The model directory at the boundary (issue 17): what a file holds never spins, hangs or traces
back. A file we cannot read is unknown (a note, as a missing one); a value no model can have in a
file we could read is exit 2 naming the file and the key."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from helpers.hostile import FAST, VALUES, assert_clean, deep, run_main

from caovan_vllm_sm75_turbo3.cli import doctor, serve
from caovan_vllm_sm75_turbo3.errors import ModelError
from caovan_vllm_sm75_turbo3.runtime.model import INDEX_FILE, model_shape, read_model

from helpers.facts import EXAMPLES

FACTS = str(EXAMPLES / "2x2080ti-22g.json")
QWEN_CONFIG = json.loads((EXAMPLES / "models" / "qwen3.6-27b-awq" / "config.json").read_text())
_CONFIG_KEYS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
                "max_position_embeddings", "full_attention_interval", "layer_types", "text_config", "vocab_size",
                "quantization_config", "architectures", "mtp_num_hidden_layers"]


def _safetensors(header: bytes, length: int | None = None) -> bytes:
    return (len(header) if length is None else length).to_bytes(8, "little") + header + b"\0" * 8


@FAST
@given(key=st.sampled_from(_CONFIG_KEYS), value=VALUES, in_text=st.booleans(), serve_it=st.booleans())
def test_any_config_value_is_a_report_or_one_error_line(tmp_path_factory, key, value, in_text, serve_it):
    d = tmp_path_factory.mktemp("m")
    cfg = json.loads(json.dumps(QWEN_CONFIG))
    (cfg["text_config"] if in_text and isinstance(cfg.get("text_config"), dict) else cfg)[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    r = (run_main(serve.PROG, serve.main, [str(d), "--dry-run", "--facts", FACTS]) if serve_it
         else run_main(doctor.PROG, doctor.main, ["--facts", FACTS, "--model", str(d), "--json"]))
    assert_clean(r)
    if r.err and r.code == 2:
        assert "config.json: key '" in r.err


@FAST
@given(which=st.sampled_from(["config.json", INDEX_FILE, "model.safetensors"]),
       raw=st.binary(max_size=120) | st.integers(1, 3000).map(lambda n: deep(n).encode())
       | VALUES.map(lambda v: json.dumps({"metadata": {"total_size": v}, "weight_map": v}).encode()))
def test_any_bytes_in_a_model_file_are_a_report_or_one_error_line(tmp_path_factory, which, raw):
    d = tmp_path_factory.mktemp("m")
    (d / which).write_bytes(_safetensors(raw) if which == "model.safetensors" else raw)
    r = run_main(doctor.PROG, doctor.main, ["--facts", FACTS, "--model", str(d), "--json"])
    assert_clean(r)
    if r.code == 2 and r.err:
        assert f"{which}: key '" in r.err


@pytest.mark.parametrize("name,text,needle", [
    ("config.json", '{"num_hidden_layers": 1000000000000, "num_attention_heads": 8}',
     "config.json: key 'num_hidden_layers' must be a whole number from 0 to 10000, not 1000000000000"),
    ("config.json", '{"num_hidden_layers": 4, "num_attention_heads": 8, "max_position_embeddings": 0}',
     "config.json: key 'max_position_embeddings' must be a whole number from 1 to"),
    ("config.json", '{"text_config": {"max_position_embeddings": -Infinity}}',
     "config.json: key 'text_config.max_position_embeddings' must be a whole number from 1 to 2147483648, not -inf"),
    (INDEX_FILE, '{"metadata": {"total_size": Infinity}, "weight_map": {}}',
     f"{INDEX_FILE}: key 'metadata.total_size' must be a whole number from 0 to 1152921504606846976, not inf"),
    (INDEX_FILE, '{"metadata": {"total_size": -5}, "weight_map": {}}', "not -5"),
])
def test_absurd_values_are_bad_input_naming_file_and_key(tmp_path, name, text, needle):
    (tmp_path / name).write_text(text)
    with pytest.raises(ModelError) as err:
        read_model(str(tmp_path))
    assert needle in str(err.value) and str(tmp_path) in str(err.value) and err.value.exit_code == 2


def test_huge_layer_types_do_not_spin(tmp_path):
    cfg = {"num_hidden_layers": 10_000, "num_attention_heads": 8, "full_attention_interval": 4,
           "layer_types": ["linear_attention"] * 300_000}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    start = time.monotonic()
    shape = model_shape(read_model(str(tmp_path)).config)
    assert shape is not None and shape.full_attention_layers == 2500 and time.monotonic() - start < 5


@pytest.mark.parametrize("content,note", [
    (b"\xff{}", "config.json unreadable: it is not UTF-8 text (byte 0xff at offset 0); skipped"),
    (deep(5000).encode(), "config.json unreadable: it is nested more than 64 levels deep; skipped"),
    (b'{"num_hidden_layers": 4, "rope_scaling": {"factor": NaN}}', None),  # NaN where we do not read: fine
])
def test_unreadable_config_is_unknown_with_a_note(tmp_path, content, note):
    (tmp_path / "config.json").write_bytes(content)
    m = read_model(str(tmp_path))
    assert (m.config is None and note in m.notes) if note else (m.config["num_hidden_layers"] == 4)


@pytest.mark.parametrize("header,length,needle", [
    (b'{"a": 1}', 10**12, "declares a 1000000000000-byte header"),
    (b'{"a": 1}', 2**62, "byte header in a"),
    (b"\xff\xfe" + b" " * 6, None, "is not UTF-8"),
    (deep(3000).encode(), None, "nested more than 64 levels"),
])
def test_bad_safetensors_header_is_noted(tmp_path, header, length, needle):
    (tmp_path / "model.safetensors").write_bytes(_safetensors(header, length))
    m = read_model(str(tmp_path))
    assert m.weight_names is None and any("model.safetensors: safetensors header unreadable" in n and needle in n
                                          for n in m.notes), m.notes


def test_fifos_are_reported_and_skipped_without_blocking(tmp_path):
    for name in ("config.json", INDEX_FILE, "model.safetensors", "model-00001.safetensors"):
        os.mkfifo(tmp_path / name)
    got: list = []
    t = threading.Thread(target=lambda: got.append(read_model(str(tmp_path))), daemon=True)
    t.start()
    t.join(5)
    assert got, "reading the model directory blocked on a FIFO"
    notes = got[0].notes
    assert "config.json unreadable: it is a FIFO, not a regular file; skipped" in notes
    assert f"{INDEX_FILE} unreadable: it is a FIFO, not a regular file; skipped" in notes
    assert got[0].checkpoint_bytes == 0


def test_root_as_model_path_does_not_walk_the_disk():
    start = time.monotonic()
    m = read_model("/")
    assert time.monotonic() - start < 2 and m.is_dir and m.checkpoint_bytes == 0


def test_doctor_exit_2_one_line_for_an_absurd_config(tmp_path):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 0}')
    r = run_main(doctor.PROG, doctor.main, ["--facts", FACTS, "--model", str(tmp_path)])
    assert r.code == 2 and r.out == "" and r.err == (
        f"caovan-sm75-doctor: error: {tmp_path}/config.json: key 'max_position_embeddings' must be a whole "
        "number from 1 to 2147483648, not 0\n")
