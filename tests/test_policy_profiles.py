"""The profile table and its validator: loading, no contradictory profiles, every profile's
arguments accepted by every vLLM release it claims (the release tables, and vLLM 0.21's own
parser live), and the validator catching what a release does not know."""

from __future__ import annotations

import copy
import importlib.util
import json
from importlib import resources

import pytest
from helpers.facts import EXAMPLES, ROOT, facts_dict

from caovan_vllm_sm75_turbo3.policy import vllm_versions as vv
from caovan_vllm_sm75_turbo3.policy.decision import decide_for_model
from caovan_vllm_sm75_turbo3.policy.fill_base import FilledArg
from caovan_vllm_sm75_turbo3.policy.launch_fill import fill_launch
from caovan_vllm_sm75_turbo3.policy.profile_validate import (
    check_args,
    example_facts,
    load_flag_table,
    validate_table,
    without_mtp,
)
from caovan_vllm_sm75_turbo3.policy.profiles import (
    ProfileTableError,
    gpu_class,
    load_table,
    overlapping,
    parse_table,
    select,
    setup_of,
)
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args
from caovan_vllm_sm75_turbo3.runtime.facts import Facts
from caovan_vllm_sm75_turbo3.runtime.model import model_shape, read_model

QWEN = read_model(str(EXAMPLES / "models" / "qwen3.6-27b-awq"))
MODELS = {"qwen3.5-hybrid": [QWEN]}
FLAGS = load_flag_table()


def raw_table() -> dict:
    return json.loads(resources.files("caovan_vllm_sm75_turbo3").joinpath("data/profiles.json").read_text())


def test_our_table_is_valid_for_every_claimed_release():
    table = load_table()
    assert overlapping(table) == []
    assert validate_table(table, FLAGS, MODELS) == []
    claimed = {mm for p in table.profiles for mm in p.match.releases()}
    assert claimed == {f"0.{m}" for m in range(21, 35)}  # 0.21 to 0.34, each with a flag table
    assert all(p.source.detail and p.source.kind for p in table.profiles)


def test_flag_table_covers_the_supported_releases():
    assert sorted(FLAGS["releases"], key=lambda mm: int(mm.split(".")[1])) == [f"0.{m}" for m in range(21, 35)]
    for mm, rel in FLAGS["releases"].items():
        assert "--max-model-len" in rel["flags"] and "mtp" in rel["speculative_methods"], mm
        assert "PIECEWISE" in rel["cudagraph_modes"] and "TRITON_ATTN" in rel["attention_backends"], mm


def test_mamba_deprecation_row_agrees_with_the_released_sources():
    for mm, rel in FLAGS["releases"].items():
        deprecated = "--mamba-cache-mode" in rel["deprecated"]
        assert deprecated == bool(vv.has("arg-deprecated:--mamba-cache-mode", mm + ".0")), mm


def test_contradictory_profiles_cannot_both_match():
    data = raw_table()
    twin = copy.deepcopy(data["profiles"][0])
    twin["name"] = "twin-with-other-numbers"
    twin["match"]["host_memory_gib"] = {"min": 32}
    twin["match"]["vllm"] = {"min": "0.21", "max": "0.22"}
    twin["launch"]["max_num_seqs"] = 8
    data["profiles"].append(twin)
    table = parse_table(data, "crafted")
    pairs = overlapping(table)
    assert ("2x2080ti-22g-qwen3.5-hybrid-v0.21", "twin-with-other-numbers") in pairs
    assert ("2x2080ti-22g-qwen3.5-hybrid-v0.22+", "twin-with-other-numbers") in pairs
    problems = validate_table(table, FLAGS, MODELS)
    assert any("contradictory" in str(p) and "twin-with-other-numbers" in str(p) for p in problems)
    setup = setup_of(table, Facts.from_dict(facts_dict()), model_shape(QWEN.config))
    with pytest.raises(ProfileTableError, match="must not overlap"):
        select(table, setup)
    # Neighbouring ranges do not overlap: 0.21 and 0.22 each pick their own.
    ours = load_table()
    for vllm, name in (("0.21.0", "2x2080ti-22g-qwen3.5-hybrid-v0.21"), ("0.22.0", "2x2080ti-22g-qwen3.5-hybrid-v0.22+")):
        s = setup_of(ours, Facts.from_dict(facts_dict(versions={"vllm": vllm})), model_shape(QWEN.config))
        assert select(ours, s).name == name


def test_validator_catches_a_flag_the_release_does_not_know():
    data = raw_table()
    data["profiles"][1]["launch"]["extra_args"] = {"--turbo-boost": "1"}
    problems = validate_table(parse_table(data, "crafted"), FLAGS, MODELS)
    bad = [p for p in problems if "--turbo-boost" in p.message]
    assert bad and {p.profile for p in bad} == {"2x2080ti-22g-qwen3.5-hybrid-v0.22+"}
    assert {p.release for p in bad} == {f"0.{m}" for m in range(22, 35)}


def test_validator_catches_a_flag_that_left_or_a_release_without_a_table():
    data = raw_table()
    # --max-num-partial-prefills exists up to 0.26 (removed in 0.27): a profile claiming 0.21-0.34 breaks there.
    data["profiles"][2]["launch"]["extra_args"] = {"--max-num-partial-prefills": "2"}
    data["profiles"][3]["match"]["vllm"]["max"] = "0.35"
    problems = validate_table(parse_table(data, "crafted"), FLAGS, MODELS)
    gone = {p.release for p in problems if "--max-num-partial-prefills" in p.message}
    assert gone == {f"0.{m}" for m in range(27, 35)}
    assert any(p.release == "0.35" and "no argument table" in p.message for p in problems)


@pytest.mark.parametrize("arg,release,needle", [
    (FilledArg("--kv-cache-dtype", "fp9", ""), "0.21", "not one of"),
    (FilledArg("--attention-backend", "WARP_ATTN", ""), "0.21", "not a backend"),
    (FilledArg("--attention-backend", "FLASHINFER", ""), "0.24", "refused below SM80"),
    (FilledArg("--kv-cache-dtype", "fp8", ""), "0.26", "no SM75 backend"),
    (FilledArg("--mamba-cache-mode", "align", ""), "0.33", "deprecated"),
    (FilledArg("--mamba-cache-mode", "all", ""), "0.32", "not one of"),
    (FilledArg("--compilation-config", '{"cudagraph_mode":"PIECEWISE","capture":[1]}', ""), "0.21", "'capture'"),
    (FilledArg("--compilation-config", '{"cudagraph_mode":"HALF"}', ""), "0.21", "HALF"),
    (FilledArg("--speculative-config", '{"method":"medusa2","num_speculative_tokens":3}', ""), "0.21", "medusa2"),
    (FilledArg("--speculative-config", "{not json", ""), "0.21", "not JSON"),
])
def test_check_args_catches(arg, release, needle):
    problems = check_args([arg], FLAGS["releases"][release], release + ".0")
    assert any(needle in p for p in problems), problems


def test_check_args_passes_the_field_arguments_and_negatives():
    rel = FLAGS["releases"]["0.21"]
    ok = [FilledArg("--kv-cache-dtype", "fp8", ""), FilledArg("--no-enable-prefix-caching", None, ""),
          FilledArg("--compilation-config", '{"cudagraph_mode":"PIECEWISE","cudagraph_capture_sizes":[4,8]}', ""),
          FilledArg("--speculative-config", '{"method":"mtp","num_speculative_tokens":3}', "")]
    assert check_args(ok, rel, "0.21.0") == []


def test_table_loading_rejects_bad_data():
    for mutate, needle in (
        (lambda d: d["profiles"][0]["launch"].update(max_batch=3), "unknown launch field"),
        (lambda d: d["profiles"][0]["launch"].update(max_num_seqs="2"), "must be int"),
        (lambda d: d["profiles"][0]["match"].update(gpu_class="12G"), "gpu_class"),
        (lambda d: d["profiles"][0]["match"].update(family="llama"), "family"),
        (lambda d: d["profiles"][0].pop("source"), "where the numbers came from"),
        (lambda d: d["profiles"][1].update(name=d["profiles"][0]["name"]), "taken"),
        (lambda d: d["profiles"][0]["match"]["vllm"].update(min="0.30"), "above max"),
    ):
        data = raw_table()
        mutate(data)
        with pytest.raises(ProfileTableError, match=needle):
            parse_table(data, "crafted")


def test_gpu_classes():
    table = load_table()
    assert [gpu_class(table, m) for m in (11264, 15360, 16384, 22528, 24576, 8192, 49152, None)] == \
        ["11G", "16G", "16G", "22G", "24G", None, None, None]


# --- vLLM 0.21's own parser, live -------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm_parser():
    pytest.importorskip("vllm")
    import vllm.platforms as P
    from vllm.platforms.cpu import CpuPlatform
    P._current_platform = CpuPlatform()  # the parser needs a platform; the machine has no GPU
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    return make_arg_parser(FlexibleArgumentParser())


def _argv(fill) -> list[str]:
    out = [QWEN.path]
    for a in fill.args:
        out += [a.flag] if a.value is None else [a.flag, a.value]
    return out


@pytest.mark.vllm
def test_every_021_profile_is_accepted_by_vllm_021(vllm_parser):
    import vllm
    assert vllm.__version__.startswith("0.21")
    table = load_table()
    seen = 0
    for profile in [p for p in table.profiles if "0.21" in p.match.releases()]:
        for model in (QWEN, without_mtp(QWEN)):
            facts = example_facts(table, profile, vllm.__version__)
            fill = fill_launch(decide_for_model(facts, model_shape(model.config)), model,
                               read_vllm_args([model.path]), table)
            assert fill.profile == profile.name
            ns = vllm_parser.parse_args(_argv(fill))
            got = {a.flag: a.value for a in fill.args}
            assert ns.kv_cache_dtype == got["--kv-cache-dtype"] and ns.dtype == "half"
            if "--speculative-config" in got:
                assert ns.speculative_config["method"] == "mtp"
                assert ns.compilation_config.cudagraph_capture_sizes == \
                    json.loads(got["--compilation-config"])["cudagraph_capture_sizes"]
            seen += 1
    assert seen == 8  # four profiles claim 0.21, each with and without MTP weights


@pytest.mark.vllm
def test_conservative_defaults_are_accepted_by_vllm_021(vllm_parser):
    facts = Facts.from_dict(facts_dict(gpus=[{"index": i, "compute_capability": "7.5", "memory_total_mib": 8192}
                                             for i in range(2)]))
    fill = fill_launch(decide_for_model(facts, model_shape(QWEN.config)), QWEN, read_vllm_args([QWEN.path]),
                       load_table())
    assert fill.profile == "conservative"
    ns = vllm_parser.parse_args(_argv(fill))
    assert ns.tensor_parallel_size == 2 and ns.disable_custom_all_reduce is True


@pytest.mark.vllm
def test_vllm_021_rejects_what_the_validator_rejects(vllm_parser):
    bad = FilledArg("--turbo-boost", "1", "")
    assert check_args([bad], FLAGS["releases"]["0.21"], "0.21.0")
    with pytest.raises(SystemExit) as exc:
        vllm_parser.parse_args([QWEN.path, "--turbo-boost", "1"])
    assert exc.value.code == 2


# --- the flag table's extractor -----------------------------------------------------------------

def _extractor():
    spec = importlib.util.spec_from_file_location("extract_vllm_flags", ROOT / "tools" / "extract_vllm_flags.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.vllm
def test_extractor_reproduces_the_021_table_and_matches_the_live_parser(vllm_parser):
    import pathlib

    import vllm
    tool = _extractor()
    entry = tool.extract(tool.Sources(pathlib.Path(vllm.__file__).parent))
    committed = {k: v for k, v in FLAGS["releases"]["0.21"].items() if k != "source"}
    assert entry == committed
    live = {s for a in vllm_parser._actions for s in a.option_strings if not s.startswith("--no-")}
    assert set(entry["flags"]) == live
    for action in vllm_parser._actions:  # every choice list we read is one vLLM enforces
        for flag in action.option_strings:
            if flag in entry["choices"]:
                assert set(entry["choices"][flag]) <= {str(c) for c in action.choices or ()}, flag


def test_only_the_field_report_profile_carries_measured_numbers():
    table = load_table()
    with_numbers = {p.name: p.expected for p in table.profiles if p.expected is not None}
    assert set(with_numbers) == {"2x2080ti-22g-qwen3.5-hybrid-v0.21"}
    exp = with_numbers["2x2080ti-22g-qwen3.5-hybrid-v0.21"]
    assert (exp.decode_tok_s, exp.decode_tok_s_without_mtp, exp.prefill_tok_s) == (100, 45, (1750, 1840))
    assert (exp.prompt_tokens, exp.output_tokens, exp.concurrency) == (4096, 128, 1) and "field report" in exp.source
    assert all(p.source.kind == "field-report" for p in table.profiles if p.expected)


@pytest.mark.parametrize("change,message", [
    ({"decode_tok_s": 0}, "above 0"),
    ({"decode_tok_s": float("nan")}, "above 0"),
    ({"decode_tok_s": True}, "must be float"),
    ({"prefill_tok_s": [1840, 1750]}, "is above high"),
    ({"prefill_tok_s": [1750]}, r"\[low, high\]"),
    ({"concurrency": 0}, ">= 1"),
    ({"source": " "}, "who measured it"),
    ({"tok_s": 1}, "unknown keys"),
])
def test_a_bad_expected_block_is_refused(change, message):
    data = raw_table()
    data["profiles"][0]["expected"].update(change)
    with pytest.raises(ProfileTableError, match=message):
        parse_table(data, "crafted")


def test_a_derived_profile_cannot_claim_measured_numbers():
    data = raw_table()
    data["profiles"][2]["expected"] = copy.deepcopy(data["profiles"][0]["expected"])
    with pytest.raises(ProfileTableError, match="only a field-report profile"):
        parse_table(data, "crafted")


def test_the_documented_minimums_are_the_profiles_own_and_pass_our_checks():
    """docs/profiles.md's table names each bundled profile with its GPUs, host memory and vLLM range
    as the data holds them; and our host-memory check passes a host at that minimum (one threshold:
    policy/checks.py HOST_MEMORY_FAIL_GIB)."""
    import re
    from pathlib import Path

    from caovan_vllm_sm75_turbo3.policy.checks import HOST_MEMORY_FAIL_GIB

    page = (Path(__file__).resolve().parents[1] / "docs" / "profiles.md").read_text()
    rows = dict(re.findall(r"^\| `([\w.+-]+)` \| (\d+ × \w+, ≥ \d+ GiB, [^|]+?) \|", page, re.M))
    table = load_table()
    assert set(rows) == {p.name for p in table.profiles}
    for p in table.profiles:
        m = p.match
        lo, hi = m.vllm_min, m.vllm_max
        span = lo if lo == hi else f"{lo}-{hi}"
        assert rows[p.name].startswith(f"{m.gpu_count} × {m.gpu_class}, ≥ {m.host_min_gib:g} GiB, "), p.name
        assert rows[p.name].endswith(span), (p.name, rows[p.name], span)
        assert m.host_min_gib >= HOST_MEMORY_FAIL_GIB, p.name
