"""Filling vLLM arguments from launch profiles: the field launch, release rules, user values kept,
MTP only with MTP weights, conservative defaults for unknown hardware."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from helpers.facts import EXAMPLES, facts_dict

from caovan_vllm_sm75_turbo3.config import Settings
from caovan_vllm_sm75_turbo3.errors import SettingError
from caovan_vllm_sm75_turbo3.policy.decision import decide_for_model
from caovan_vllm_sm75_turbo3.policy.fill_decode import capture_sizes
from caovan_vllm_sm75_turbo3.policy.launch_fill import conservative_tp, fill_launch
from caovan_vllm_sm75_turbo3.policy.profiles import load_table
from caovan_vllm_sm75_turbo3.policy.vllm_versions import release_pins
from caovan_vllm_sm75_turbo3.policy.turbo import TurboDecision
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args
from caovan_vllm_sm75_turbo3.runtime.facts import Facts
from caovan_vllm_sm75_turbo3.runtime.model import model_shape, read_model

QWEN = EXAMPLES / "models" / "qwen3.6-27b-awq"
ROOT_DIR = EXAMPLES.parent
TABLE = load_table()
# The field launch line (docs/design.md / issue 3), the flags a profile can fill.
FIELD = {"--tensor-parallel-size": "2", "--dtype": "half", "--max-model-len": "262144", "--max-num-seqs": "2",
         "--max-num-batched-tokens": "8192", "--kv-cache-dtype": "fp8", "--disable-custom-all-reduce": None}
MTP3 = '{"method":"mtp","num_speculative_tokens":3}'


def decision_for(facts: Facts, model=None, profile: str = "auto", **changes):
    """The one decision a launch would make for these facts and model (`changes` replace its fields)."""
    model = model or read_model(str(QWEN))
    d = decide_for_model(facts, model_shape(model.config) if model.config else None,
                         dataclasses.replace(Settings(), profile=profile))
    return dataclasses.replace(d, **changes)


def fill(facts: Facts, *user: str, model=None, profile: str = "auto"):
    model = model or read_model(str(QWEN))
    return fill_launch(decision_for(facts, model, profile), model, read_vllm_args([model.path, *user]), TABLE)


def filled(result) -> dict[str, str | None]:
    return {a.flag: a.value for a in result.args}


def facts_for(vllm: str = "0.21.0", **changes) -> Facts:
    return Facts.from_dict(facts_dict(versions={"vllm": vllm}, **changes))


def pinned_facts(vllm: str) -> Facts:
    """2 x 2080 Ti with vLLM `vllm` and the Triton its wheel pins (data/vllm_release_pins.json)."""
    pins = release_pins(vllm)
    assert pins is not None and pins.triton_version
    return Facts.from_dict(facts_dict(versions={"vllm": vllm, "triton": pins.triton_version}))


def no_mtp_model(tmp_path):
    """The example checkpoint without its MTP weights (the config still declares the layer)."""
    model_dir = tmp_path / "no-mtp"
    shutil.copytree(QWEN, model_dir)
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith("mtp.")}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    return read_model(str(model_dir))


def test_field_launch_on_2x22g_vllm021():
    r = fill(Facts.load(EXAMPLES / "2x2080ti-22g.json"))
    got = filled(r)
    # MTP with prefix caching gives wrong output on 0.21 (upstream bug, no proven fix): MTP is filled
    # and prefix caching switched off, with the reason and how to have prefix caching instead
    assert r.profile == "2x2080ti-22g-qwen3.5-hybrid-v0.21"
    assert r.warnings == ()
    for flag, value in FIELD.items():
        assert flag in got and got[flag] == value, flag
    assert "--no-enable-prefix-caching" in got and "--enable-prefix-caching" not in got
    why = next(a.reason for a in r.args if a.flag == "--no-enable-prefix-caching")
    assert "mtp-prefix-cache-wrong-output" in why and "pass --enable-prefix-caching" in why
    assert "--mamba-cache-mode" not in got
    assert json.loads(got["--speculative-config"]) == {"method": "mtp", "num_speculative_tokens": 3}
    assert json.loads(got["--compilation-config"]) == {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [4, 8]}
    assert got["--attention-backend"] == "FLASHINFER" and got["--gpu-memory-utilization"] == "0.9"
    assert all(a.reason for a in r.args)
    assert any(line.startswith("memory: KV per token per GPU") for line in r.lines)
    assert any("field-report" in line for line in r.lines)
    model_line = next(line for line in r.lines if line.startswith("model: "))
    assert "16 full attention, 48 linear attention" in model_line and "15 MTP weights" in model_line
    assert "awq 4-bit" in model_line and "19.5 GB" in model_line


@pytest.mark.parametrize("vllm,kv,backend,mamba", [
    ("0.23.0", "fp8", "FLASHINFER", "align"),
    ("0.24.0", "fp8", "CUSTOM", "align"),       # our attention backend, Triton 3.6: the hook's tensor cores
    ("0.26.0", "fp8", "CUSTOM", "align"),
    ("0.32.0", "fp8", "CUSTOM", "align"),       # Triton 3.7: the hook and our kernels verified there too
    ("0.33.0", "fp8", "CUSTOM", None),          # Triton 3.8; --mamba-cache-mode deprecated, no effect
    ("0.34.0", "fp8", "CUSTOM", None),
])
def test_release_rules(vllm, kv, backend, mamba, tmp_path):
    """Without MTP (a checkpoint without its weights) the profile's fp8 KV rests on the release's
    backend or ours; with MTP from 0.24 it is fp16 on TRITON_ATTN until MTP with fp8 KV is proven."""
    got = filled(fill(pinned_facts(vllm), "--enable-prefix-caching", model=no_mtp_model(tmp_path)))
    assert got["--kv-cache-dtype"] == kv and got["--attention-backend"] == backend
    assert got.get("--mamba-cache-mode") == mamba
    with_mtp = filled(fill(pinned_facts(vllm), "--speculative-config", MTP3))
    ours = backend == "CUSTOM"
    assert with_mtp["--kv-cache-dtype"] == ("auto" if ours else kv)
    assert with_mtp["--attention-backend"] == ("TRITON_ATTN" if ours else backend)
    # fp16 KV takes twice the bytes: the context that fits is shorter than 0.21's 262144
    for plan in (got, with_mtp):
        assert (int(plan["--max-model-len"]) == 262144) == (plan["--kv-cache-dtype"] == "fp8")


def test_user_values_are_kept_and_drive_the_arithmetic():
    r = fill(facts_for(), "--max-model-len", "65536", "--kv-cache-dtype=auto", "-tp", "2",
             "--compilation-config.cudagraph_mode", "PIECEWISE", "--no-enable-prefix-caching",
             "--gpu-memory-utilization", "0.85")
    got = filled(r)
    for flag in ("--max-model-len", "--kv-cache-dtype", "--tensor-parallel-size", "--compilation-config",
                 "--enable-prefix-caching", "--gpu-memory-utilization"):
        assert flag not in got, flag
        assert any(line.startswith(f"kept: {flag} ") for line in r.lines), flag
    assert "--mamba-cache-mode" not in got  # prefix caching is off by the user's choice
    assert any("2 KV heads x 256 head dim x 2 B" in line for line in r.lines)  # the user's fp16 KV
    assert any("gpu-memory-utilization 0.85 =" in line for line in r.lines)
    assert got["--max-num-seqs"].isdigit()


def test_enforce_eager_gets_no_compilation_config():
    r = fill(facts_for(), "--enforce-eager")
    assert "--compilation-config" not in filled(r) and "--speculative-config" in filled(r)
    assert any("--enforce-eager given" in line for line in r.lines)


def test_user_bf16_and_fp8_on_new_release_warn_but_stay():
    r = fill(pinned_facts("0.26.0"), "--dtype", "bfloat16", "--kv-cache-dtype", "fp8", "--enforce-eager")
    assert any("bfloat16" in w for w in r.warnings) and not any("fp8" in w for w in r.warnings)
    assert filled(r)["--attention-backend"] == "CUSTOM"  # ours serves the user's fp8 on 0.26
    r = fill(Facts.from_dict(facts_dict(versions={"vllm": "0.26.0", "triton": "3.9.0"})), "--dtype", "bfloat16",
             "--kv-cache-dtype", "fp8")
    assert "--dtype" not in filled(r) and "--kv-cache-dtype" not in filled(r)
    assert any("bfloat16" in w for w in r.warnings) and any("fp8" in w and "0.26" in w for w in r.warnings)


def test_no_mtp_weights_no_speculative_config(tmp_path):
    model = no_mtp_model(tmp_path)
    assert model.mtp_weights == 0 and model_shape(model.config).mtp_layers == 1
    r = fill(facts_for(), model=model)
    got = filled(r)
    assert "--speculative-config" not in got and "--compilation-config" not in got
    assert any("declares 1 MTP layer" in line and "no MTP weights" in line for line in r.lines)
    # and the KV cache has no MTP layer to hold
    assert any("= 16 full-attention layers x 2" in line for line in r.lines)


def test_no_index_and_no_weights_means_no_mtp(tmp_path):
    shutil.copy(QWEN / "config.json", tmp_path / "config.json")
    model = read_model(str(tmp_path))
    assert model.mtp_weights is None and not model.has_mtp_weights
    assert "--speculative-config" not in filled(fill(facts_for(), model=model))


def test_mtp_weights_read_from_safetensors_headers(tmp_path):
    shutil.copy(QWEN / "config.json", tmp_path / "config.json")
    header = json.dumps({"mtp.fc.weight": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]},
                         "lm_head.weight": {"dtype": "F16", "shape": [1], "data_offsets": [2, 4]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    model = read_model(str(tmp_path))
    assert (model.weight_names, model.mtp_weights) == (2, 1)


def test_unknown_hardware_gets_conservative_defaults_and_a_warning():
    gpu = {"name": "NVIDIA GeForce RTX 2080", "compute_capability": "7.5", "memory_total_mib": 8192}
    facts = facts_for(gpus=[dict(gpu, index=i) for i in range(3)])
    r = fill(facts)
    got = filled(r)
    assert r.profile == "conservative"
    assert any("no launch profile" in w and "8192 MiB" in w for w in r.warnings)
    assert got["--tensor-parallel-size"] == "2"  # largest power of two <= 3 that divides the heads
    assert got["--dtype"] == "half" and got["--kv-cache-dtype"] == "auto" and got["--gpu-memory-utilization"] == "0.85"
    assert "--speculative-config" not in got and "--attention-backend" not in got
    assert "--disable-custom-all-reduce" in got


def test_host_memory_and_vllm_range_are_keys():
    low_ram = fill(facts_for(host={"memory_total_mib": 32768}))
    assert low_ram.profile == "conservative" and low_ram.warnings
    assert fill(facts_for("0.22.1")).profile == "2x2080ti-22g-qwen3.5-hybrid-v0.22+"
    assert fill(facts_for("0.35.0")).profile == "conservative"


def test_profile_none_and_names():
    assert fill(facts_for(), profile="none").args == ()
    named = fill(Facts.load(EXAMPLES / "4xt4-16g.json"), profile="2x2080ti-22g-qwen3.5-hybrid-v0.21")
    assert named.profile == "2x2080ti-22g-qwen3.5-hybrid-v0.21"
    assert any("is for 2 x 22G" in w for w in named.warnings)
    with pytest.raises(SettingError, match="not a launch profile"):
        fill(facts_for(), profile="fastest")


def test_no_sm75_gpu_fills_nothing():
    r = fill(facts_for(gpus=[{"index": 0, "name": "RTX 3090", "compute_capability": "8.6",
                              "memory_total_mib": 24576}]))
    assert r.args == () and r.profile is None


def test_example_t4_and_11g():
    t4 = fill(Facts.load(EXAMPLES / "4xt4-16g.json"))
    got = filled(t4)
    assert t4.profile == "4xt4-16g-qwen3.5-hybrid" and got["--tensor-parallel-size"] == "4"
    assert json.loads(got["--compilation-config"])["cudagraph_capture_sizes"] == \
        capture_sizes(int(got["--max-num-seqs"]), 3)
    small = fill(Facts.load(EXAMPLES / "1x2080ti-11g.json"))
    assert small.profile == "1x2080ti-11g-qwen3.5-hybrid"
    assert "--max-model-len" not in filled(small)  # the 27B checkpoint does not fit 11 GiB
    assert any("do not fit" in w for w in small.warnings)


def test_capture_sizes_and_tp_rules():
    assert capture_sizes(2, 3) == [4, 8] and capture_sizes(3, 1) == [2, 4, 6]
    shape = model_shape(read_model(str(QWEN)).config)
    assert conservative_tp(4, shape) == 4 and conservative_tp(3, shape) == 2 and conservative_tp(1, shape) == 1
    odd = model_shape({"num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 3,
                       "hidden_size": 384})
    assert conservative_tp(4, odd) == 1  # 6 query / 3 KV heads do not split over 2


def test_reasons_name_the_profile_and_its_source_holds_the_field_numbers():
    r = fill(Facts.load(EXAMPLES / "2x2080ti-22g.json"))
    reasons = {a.flag: a.reason for a in r.args}
    for flag in ("--speculative-config", "--disable-custom-all-reduce"):
        assert f"profile {r.profile}" in reasons[flag], flag
        assert "tok/s" not in reasons[flag] and "%" not in reasons[flag] and "2 x 2080" not in reasons[flag], flag
    for profile in TABLE.profiles:
        assert "about 100 tok/s" in profile.source.detail and "45" in profile.source.detail, profile.name
        assert "2 and 4" in profile.source.detail and "2-3 %" in profile.source.detail, profile.name
    assert "2-3 %" in TABLE.conservative.source.detail


@pytest.mark.parametrize("vllm", ["0.24.0", "0.26.0"])
def test_fp8_kv_through_our_backend_keeps_the_021_context(vllm):
    """Issue 20: with our attention backend, 0.24+ plans the same fp8 context as 0.21 (fp8 asked for:
    beside MTP the profile fills it only where proven)."""
    ref = filled(fill(Facts.load(EXAMPLES / "2x2080ti-22g.json")))
    r = fill(pinned_facts(vllm), "--kv-cache-dtype", "fp8")
    got = filled(r)
    assert "--kv-cache-dtype" not in got and got["--attention-backend"] == "CUSTOM"
    assert got["--max-model-len"] == ref["--max-model-len"] == "262144"
    assert "our attention backend" in next(a.reason for a in r.args if a.flag == "--attention-backend")


def test_unverified_turbo_falls_back_to_fp16_kv_with_the_reason(tmp_path):
    """0.33 with Triton 3.9, where the Turbo hook is not verified: fp16 KV on TRITON_ATTN, saying why;
    the rule follows the Turbo decision, not a list of releases."""
    r = fill(Facts.from_dict(facts_dict(versions={"vllm": "0.33.0", "triton": "3.9.0"})))
    got = filled(r)
    assert got["--kv-cache-dtype"] == "auto" and got["--attention-backend"] == "TRITON_ATTN"
    assert int(got["--max-model-len"]) < 262144
    why = next(a.reason for a in r.args if a.flag == "--kv-cache-dtype")
    assert "turbo=off-unverified-triton-3.9.0" in why and "tensor cores" in why
    # A decision for a Triton our attention kernel was verified with (hypothetical on 0.33)
    verified = TurboDecision(True, True, "auto", "Triton 3.6 verified", triton="3.6.0")
    plain = no_mtp_model(tmp_path)
    got = filled(fill_launch(decision_for(pinned_facts("0.33.0"), plain, turbo=verified), plain,
                             read_vllm_args([plain.path]), TABLE))
    assert got["--kv-cache-dtype"] == "fp8" and got["--attention-backend"] == "CUSTOM"
    assert got["--max-model-len"] == "262144"


def test_a_verified_hook_is_not_enough_for_a_kernel_not_checked_on_that_triton(monkeypatch):
    """With our attention kernel listed for Triton 3.6 only, 0.33 (Triton 3.8, where the hook is verified) plans
    fp16 KV and says which kernel was not checked there."""
    from dataclasses import replace

    from caovan_vllm_sm75_turbo3.kernels.turbo import allowlist as al
    from caovan_vllm_sm75_turbo3.policy import turbo as policy_turbo

    real = al.load_allowlist()
    only_36 = replace(real, kernels=tuple(replace(k, triton_versions=("3.6",)) if k.name == "_attn_kernel" else k
                                          for k in real.kernels))
    monkeypatch.setattr(policy_turbo, "load_allowlist", lambda: only_36)
    r = fill(pinned_facts("0.33.0"))
    got = filled(r)
    assert got["--kv-cache-dtype"] == "auto" and got["--attention-backend"] == "TRITON_ATTN"
    why = next(a.reason for a in r.args if a.flag == "--kv-cache-dtype")
    assert "our attention kernel was not verified with Triton 3.8.0" in why


def test_a_fallback_names_the_rule_it_missed_and_how_to_force_the_fast_profile(tmp_path):
    import json as _json
    from pathlib import Path as _Path

    from caovan_vllm_sm75_turbo3.launch import plan_for_launcher
    from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args

    root = _Path(__file__).resolve().parents[1]
    data = _json.loads((root / "examples" / "2x2080ti-22g.json").read_text())
    data["host"].update(memory_total_mib=32768, memory_available_mib=30000)
    facts = tmp_path / "f.json"
    facts.write_text(_json.dumps(data))
    model = str(root / "examples" / "models" / "qwen3.6-27b-awq")
    plan = plan_for_launcher({"CAOVAN_FACTS": str(facts)}, read_vllm_args([model]), write=False).plan
    miss = [w for w in plan.warnings if w.startswith("profile 2x2080ti-22g-qwen3.5-hybrid-v0.21 not taken")]
    assert len(miss) == 1, plan.warnings
    assert "host memory >= 56 GiB; this host has 32 GiB" in miss[0] and "high risk" in miss[0]
    assert "about 100 tok/s" in miss[0] and "about 45" in miss[0]
    assert miss[0].endswith("force it with --profile 2x2080ti-22g-qwen3.5-hybrid-v0.21")
    assert not any("1x2080ti" in w for w in plan.warnings)   # another GPU setup is no near miss
    forced = plan_for_launcher({"CAOVAN_FACTS": str(facts), "CAOVAN_PROFILE": "2x2080ti-22g-qwen3.5-hybrid-v0.21"},
                         read_vllm_args([model]), write=False).plan
    assert ("--kv-cache-dtype", "fp8") in [(a.flag, a.value) for a in forced.filled_args]


def test_mtp_with_prefix_caching_on_a_hybrid_model_names_the_upstream_bugs_per_release(tmp_path):
    import json as _json
    from pathlib import Path as _Path

    from caovan_vllm_sm75_turbo3.launch import plan_for_launcher
    from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args

    root = _Path(__file__).resolve().parents[1]
    model = str(root / "examples" / "models" / "qwen3.6-27b-awq")

    def bugs(vllm: str, triton: str, *argv: str) -> list[str]:
        data = _json.loads((root / "examples" / "2x2080ti-22g.json").read_text())
        data["versions"].update(vllm=vllm, triton=triton)
        facts = tmp_path / f"f{vllm}.json"
        facts.write_text(_json.dumps(data))
        plan = plan_for_launcher({"CAOVAN_FACTS": str(facts)}, read_vllm_args([model, *argv]), write=False).plan
        lines = [w for w in plan.warnings if w.startswith("upstream bug ")]
        assert all("In the source: " in w and "Sources: vLLM #" in w for w in lines)
        return [w.split(" ")[2] for w in lines]

    both = ("--enable-prefix-caching", "--speculative-config", MTP3)
    assert bugs("0.21.0", "3.6.0", *both) == ["mtp-prefix-cache-wrong-output"]
    assert bugs("0.27.0", "3.7.1", *both) == ["mtp-prefix-cache-wrong-output", "mtp-prefix-cache-lost-hits"]
    assert bugs("0.34.0", "3.8.0", *both) == ["mtp-prefix-cache-lost-hits"]
    # by default the plan never fills the pair it warns gives wrong output (lost hits only cost speed)
    assert bugs("0.21.0", "3.6.0") == [] and bugs("0.27.0", "3.7.1") == []
    assert bugs("0.34.0", "3.8.0") == ["mtp-prefix-cache-lost-hits"]
    # without speculative decoding neither applies
    assert bugs("0.27.0", "3.7.1", "--enable-prefix-caching", "--speculative-config", "null") == []


@pytest.mark.parametrize("vllm", sorted(json.loads(
    (EXAMPLES.parent / "src/caovan_vllm_sm75_turbo3/data/vllm_release_pins.json").read_text())["releases"]))
@pytest.mark.parametrize("user", [(), ("--enable-prefix-caching",), ("--speculative-config", MTP3),
                                  ("--no-enable-prefix-caching",)])
def test_no_default_is_one_we_warn_gives_wrong_output(vllm, user):
    """Whatever single choice the user makes, what the profile fills beside it never meets a
    wrong-output bug; the user's own flags are kept."""
    from caovan_vllm_sm75_turbo3.policy.upstream_bugs import load_bugs

    wrong = {b.id for b in load_bugs() if b.wrong_output}
    r = fill(pinned_facts(vllm), *user)
    assert not [w for w in r.warnings if w.startswith("upstream bug ") and w.split(" ")[2] in wrong], r.warnings
    got = filled(r)
    if "--enable-prefix-caching" in user:
        assert "--no-enable-prefix-caching" not in got
    if "--speculative-config" in user:
        assert "--speculative-config" not in got and any(ln.startswith("kept: --speculative-config") for ln in r.lines)


def test_prefix_caching_asked_for_leaves_mtp_out_and_says_why():
    r = fill(pinned_facts("0.21.0"), "--enable-prefix-caching")
    got = filled(r)
    assert "--speculative-config" not in got and got.get("--mamba-cache-mode") == "align"
    line = next(ln for ln in r.lines if ln.startswith("speculative: none: you asked for prefix caching"))
    assert "mtp-prefix-cache-wrong-output" in line and "0.21.0" in line
    # both asked for: both kept, and the warning stays
    r = fill(pinned_facts("0.21.0"), "--enable-prefix-caching", "--speculative-config", MTP3)
    assert [w.split(" ")[2] for w in r.warnings if w.startswith("upstream bug ")] == ["mtp-prefix-cache-wrong-output"]


def test_a_proven_fix_lets_the_profile_fill_both_and_says_so(monkeypatch):
    from caovan_vllm_sm75_turbo3.policy import upstream_bugs as ub

    real = ub.load_bugs()
    fixed = tuple(b if b.fix is None else __import__("dataclasses").replace(
        b, fix=__import__("dataclasses").replace(b.fix, proven=("0.24",))) for b in real)
    monkeypatch.setattr(ub, "load_bugs", lambda: fixed)
    facts = pinned_facts("0.24.0")
    model = read_model(str(QWEN))
    with_fix = fill_launch(decision_for(facts, model, fixes=("mtp-prefix-cache-wrong-output",)), model,
                           read_vllm_args([model.path]), TABLE)
    got = filled(with_fix)
    assert "--enable-prefix-caching" in got and "--speculative-config" in got and with_fix.warnings == ()
    assert any(ln.startswith("fixed: upstream bug mtp-prefix-cache-wrong-output on vLLM 0.24.0") for ln in with_fix.lines)
    # the plugin not installing its fix (fixes empty), or a release it was not proven on: no pair
    without = filled(fill_launch(decision_for(facts, model, fixes=()), model, read_vllm_args([model.path]), TABLE))
    assert "--no-enable-prefix-caching" in without
    other = filled(fill_launch(decision_for(pinned_facts("0.23.0"), model, fixes=("mtp-prefix-cache-wrong-output",)),
                               model, read_vllm_args([model.path]), TABLE))
    assert "--no-enable-prefix-caching" in other


def test_full_graphs_with_mtp_only_where_the_engine_check_proved_them():
    """data/engine_proofs.json: vLLM 0.24, our attention backend with fp16 (auto) and fp8 KV, and
    TRITON_ATTN with fp16. Elsewhere PIECEWISE, with the reason; a user's FULL request is warned about
    only where no proof holds."""
    from caovan_vllm_sm75_turbo3.policy.engine_proofs import MTP_FULL_GRAPHS, load_proofs, proof_for

    proofs = [p for p in load_proofs() if p.id == MTP_FULL_GRAPHS]
    assert all((ROOT_DIR / p.results).is_dir() for p in proofs)   # the raw results they rest on are committed
    proof, fp8 = (next(p for p in proofs if p.attention_backend == "CUSTOM" and p.kv_cache_dtype == kv)
                  for kv in ("auto", "fp8"))
    assert proof_for(MTP_FULL_GRAPHS, "0.24.0", "CUSTOM", None) == proof
    assert proof_for(MTP_FULL_GRAPHS, "0.24.0", "CUSTOM", "fp8") == fp8
    assert proof_for(MTP_FULL_GRAPHS, "0.24.0", "CUSTOM", "fp8_e5m2") is None
    assert proof_for(MTP_FULL_GRAPHS, "0.21.0", "CUSTOM", None) is None
    assert proof_for(MTP_FULL_GRAPHS, "0.24.1", "custom", "auto") == proof

    def mode(vllm: str, *user: str) -> tuple[str, str]:
        r = fill(pinned_facts(vllm), *user)
        arg = next(a for a in r.args if a.flag == "--compilation-config")
        return json.loads(arg.value)["cudagraph_mode"], arg.reason

    got, why = mode("0.24.0", "--kv-cache-dtype", "auto", "--attention-backend", "CUSTOM")
    assert got == "FULL_AND_PIECEWISE" and "proved exact" in why and proof.results in why
    got, why = mode("0.24.0")   # the profile's fp8 KV beside MTP, on our backend: proved too
    assert got == "FULL_AND_PIECEWISE" and fp8.results in why
    got, why = mode("0.24.0", "--attention-backend", "TRITON_ATTN")   # fp16 KV on TRITON_ATTN: proved
    triton = next(p for p in proofs if p.attention_backend == "TRITON_ATTN")
    assert got == "FULL_AND_PIECEWISE" and triton.results in why
    got, why = mode("0.24.0", "--kv-cache-dtype", "fp8_e5m2")   # e5m2 KV asked for: not proved
    assert got == "PIECEWISE" and "has not proved" in why and "KV fp8_e5m2" in why
    assert mode("0.21.0")[0] == "PIECEWISE"
    warned = fill(pinned_facts("0.21.0"), "--compilation-config", '{"cudagraph_mode":"FULL_AND_PIECEWISE"}')
    assert any("FULL CUDA graphs with MTP" in w for w in warned.warnings)
    quiet = fill(pinned_facts("0.24.0"), "--kv-cache-dtype", "auto", "--attention-backend", "CUSTOM",
                 "--compilation-config", '{"cudagraph_mode":"FULL_AND_PIECEWISE"}')
    assert not any("FULL CUDA graphs with MTP" in w for w in quiet.warnings)


RELEASES = sorted(json.loads(
    (EXAMPLES.parent / "src/caovan_vllm_sm75_turbo3/data/vllm_release_pins.json").read_text())["releases"])


def spec_of(r) -> dict | None:
    arg = next((a for a in r.args if a.flag == "--speculative-config"), None)
    return None if arg is None else json.loads(arg.value)


def test_mtp_drafter_gets_a_backend_for_fp8_kv_or_the_profile_keeps_fp16():
    """vLLM 0.24.0 in our engine check: MTP with fp8 KV stopped at start with the drafter on TRITON_ATTN
    (it never takes --attention-backend), and was proved exact, a prefix-cache hit among the prompts,
    with the drafter on ours (data/engine_proofs.json). Each way a user can arrive there."""
    facts = pinned_facts("0.24.0")
    default = fill(facts)
    assert filled(default)["--kv-cache-dtype"] == "fp8" and filled(default)["--attention-backend"] == "CUSTOM"
    why = next(a.reason for a in default.args if a.flag == "--speculative-config")
    assert spec_of(default)["attention_backend"] == "CUSTOM" and "not yet proven" not in why
    assert default.failures == () and judged(facts, default) is None
    # where the proof does not reach (e5m2 KV asked for): the drafter on our backend, said to be unproven
    asked = fill(facts, "--kv-cache-dtype", "fp8_e5m2")
    assert spec_of(asked)["attention_backend"] == "CUSTOM" and filled(asked)["--attention-backend"] == "CUSTOM"
    why = next(a.reason for a in asked.args if a.flag == "--speculative-config")
    assert "not yet proven" in why and judged(facts, asked, "--kv-cache-dtype", "fp8_e5m2") is None
    # a backend the user named that refuses fp8 on SM75: fp16 KV, their backend kept, MTP's drafter unnamed
    triton = fill(facts, "--attention-backend", "TRITON_ATTN")
    kv = next(a for a in triton.args if a.flag == "--kv-cache-dtype")
    assert kv.value == "auto" and "TRITON_ATTN (kept as given)" in kv.reason and "--attention-backend CUSTOM" in kv.reason
    assert "--attention-backend" not in filled(triton) and "attention_backend" not in spec_of(triton)
    both = ("--attention-backend", "triton_attn", "--kv-cache-dtype", "fp8")   # both given: kept, and warned
    assert [w for w in fill(facts, *both).warnings if "the start will fail" in w and "triton_attn" in w]
    assert not [w for w in fill(pinned_facts("0.23.0"), *both).warnings if "the start will fail" in w]
    # the user's own MTP config without a drafter backend: fp16 KV, and how to have fp8
    own = fill(facts, "--speculative-config", MTP3)
    kv = next(a for a in own.args if a.flag == "--kv-cache-dtype")
    assert kv.value == "auto" and '"attention_backend":"CUSTOM"' in kv.reason
    # both given: kept, and vLLM is expected to fail, with the fix
    user = ("--speculative-config", MTP3, "--kv-cache-dtype", "fp8")
    both = fill(facts, *user)
    assert "--speculative-config" not in filled(both) and "--kv-cache-dtype" not in filled(both)
    assert '"attention_backend":"CUSTOM"' in judged(facts, both, *user)
    named = ("--speculative-config", '{"method":"mtp","num_speculative_tokens":3,"attention_backend":"custom"}',
             "--kv-cache-dtype", "fp8")
    assert judged(facts, fill(facts, *named), *named) is None
    dotted = ("--speculative-config.attention_backend", "CUSTOM", "--speculative-config.method", "mtp",
              "--speculative-config.num_speculative_tokens", "3", "--kv-cache-dtype", "fp8")
    assert judged(facts, fill(facts, *dotted), *dotted) is None
    ngram = ("--speculative-config", '{"method":"ngram","num_speculative_tokens":3}', "--kv-cache-dtype", "fp8")
    assert judged(facts, fill(facts, *ngram), *ngram) is None   # no draft model, no drafter attention
    # up to 0.23 vLLM's own backends serve fp8 on SM75, the drafter's pick among them: nothing named
    old = fill(pinned_facts("0.23.0"))
    assert filled(old)["--kv-cache-dtype"] == "fp8" and "attention_backend" not in spec_of(old)


def judged(facts: Facts, r, *user: str) -> str | None:
    """The plan's judgement of the launch's drafter (policy/drafter.py): the user's and the filled arguments."""
    from caovan_vllm_sm75_turbo3.policy.drafter import drafter_failure

    return drafter_failure(facts.versions.vllm, read_vllm_args([str(QWEN), *user]), r.args)


def test_the_plan_judges_the_drafter_without_a_profile_too():
    """`--profile none` and a vLLM process (no fill): the user's own pair is judged all the same."""
    from helpers.plans import plan_from

    facts = pinned_facts("0.26.0")
    args = read_vllm_args([str(QWEN), "--speculative-config", MTP3, "--kv-cache-dtype", "fp8"])
    plan = plan_from(facts, Settings(), {}, args)
    assert len(plan.failures) == 1 and "vLLM 0.26.0" in plan.failures[0] and "drafter cannot start" in plan.failures[0]
    ok = read_vllm_args([str(QWEN), "--speculative-config", MTP3, "--kv-cache-dtype", "auto"])
    assert plan_from(facts, Settings(), {}, ok).failures == ()
    assert plan_from(pinned_facts("0.23.0"), Settings(), {}, args).failures == ()


def test_a_proof_of_mtp_with_fp8_kv_lets_the_profile_fill_both(monkeypatch):
    from caovan_vllm_sm75_turbo3.policy import engine_proofs as ep

    proof = ep.Proof(ep.MTP_FP8_KV, "0.24", "CUSTOM", "fp8", "test", "test card", "2026-12-07", "nowhere")
    monkeypatch.setattr(ep, "load_proofs", lambda: (proof,))
    r = fill(pinned_facts("0.24.0"))
    got = filled(r)
    assert got["--kv-cache-dtype"] == "fp8" and got["--attention-backend"] == "CUSTOM"
    assert spec_of(r)["attention_backend"] == "CUSTOM"
    assert "not yet proven" not in next(a.reason for a in r.args if a.flag == "--speculative-config")
    assert filled(fill(pinned_facts("0.26.0")))["--kv-cache-dtype"] == "auto"   # proven on 0.24 only


def test_a_record_with_something_missing_never_fills_and_is_quoted_where_it_matches(monkeypatch):
    import random

    from caovan_vllm_sm75_turbo3.policy import engine_proofs as ep

    missing = f"no cache hit was shown ({random.randrange(10**6)})"
    partial = ep.Proof(ep.MTP_FP8_KV, "0.24", "CUSTOM", "fp8", "ran", "test card", "2026-12-07", "results/where", missing)
    monkeypatch.setattr(ep, "load_proofs", lambda: (partial,))
    assert ep.proof_for(ep.MTP_FP8_KV, "0.24.0", "CUSTOM", "fp8") is None
    assert missing in ep.gap_for(ep.MTP_FP8_KV, "0.24.0", "custom", "fp8") and "(where)" in ep.gap_for(
        ep.MTP_FP8_KV, "0.24.0", "CUSTOM", "fp8")
    for other in (("0.25.0", "CUSTOM", "fp8"), ("0.24.0", "TRITON_ATTN", "fp8"), ("0.24.0", "CUSTOM", "auto")):
        assert ep.gap_for(ep.MTP_FP8_KV, *other) == ""
    r = fill(pinned_facts("0.24.0"))
    assert filled(r)["--kv-cache-dtype"] == "auto"
    assert missing in next(a.reason for a in r.args if a.flag == "--kv-cache-dtype")
    asked = fill(pinned_facts("0.24.0"), "--kv-cache-dtype", "fp8")
    assert missing in next(a.reason for a in asked.args if a.flag == "--speculative-config")


@pytest.mark.parametrize("vllm", RELEASES)
@pytest.mark.parametrize("user", [(), ("--kv-cache-dtype", "fp8"), ("--kv-cache-dtype", "fp8_e5m2"),
                                  ("--speculative-config", MTP3), ("--kv-cache-dtype", "auto"),
                                  ("--speculative-config", MTP3, "--kv-cache-dtype", "fp8"),
                                  ("--attention-backend", "TRITON_ATTN")])
def test_no_launch_we_exec_silently_starts_a_drafter_that_refuses_its_kv(vllm, user):
    """The property: with MTP and fp8 KV on a release whose own backends refuse fp8 on SM75, the
    drafter is named a backend that serves it, or the plan says vLLM is expected to fail."""
    from caovan_vllm_sm75_turbo3.policy.attention import backend_serves_fp8_kv, drafter_backend_needed, vllm_fp8_kv_on_sm75
    from caovan_vllm_sm75_turbo3.policy.engine_proofs import MTP_FP8_KV, proof_for

    r = fill(pinned_facts(vllm), *user)
    args = dict(zip(user[::2], user[1::2])) | filled(r)
    kv = args.get("--kv-cache-dtype", "auto")
    spec = json.loads(args["--speculative-config"]) if "--speculative-config" in args else None
    need = drafter_backend_needed(vllm, kv)
    assert (need is not None) == (kv.startswith("fp8") and not vllm_fp8_kv_on_sm75(vllm))
    if spec and need:
        named = spec.get("attention_backend", "").upper() == need
        assert (judged(pinned_facts(vllm), r, *user) is None) == named, args
    if "--speculative-config" not in user and "--kv-cache-dtype" not in user:
        # what we fill alone is never that pair unproven, nor fp8 KV on a backend that refuses it
        assert not (spec and need) or proof_for(MTP_FP8_KV, vllm, need, kv) is not None, args
        backend = args.get("--attention-backend")
        assert not (kv.startswith("fp8") and backend) or backend_serves_fp8_kv(vllm, backend, decision_for(pinned_facts(vllm)).turbo), args
