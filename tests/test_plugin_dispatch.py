"""GDN dispatch pieces on their own: the source check against the installed vLLM 0.21 (and
mutations of it), the committed compatibility table, precompile planning and self-check with
our real kernel in Triton's interpreter, the after-import hook, and the line formats."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from caovan_vllm_sm75_turbo3.config import load_settings
from caovan_vllm_sm75_turbo3.plugin.dispatch import after_import
from caovan_vllm_sm75_turbo3.plugin.dispatch.controller import FAMILIES
from caovan_vllm_sm75_turbo3.plugin.installed_vllm import installed_source
from caovan_vllm_sm75_turbo3.plugin.dispatch.interface import check_sources, module_file
from caovan_vllm_sm75_turbo3.plugin.dispatch.legacy_gdn_v020 import INTERFACE as LEGACY
from caovan_vllm_sm75_turbo3.plugin.dispatch.modular_qwen_gdn_v022 import INTERFACE as MODULAR
from caovan_vllm_sm75_turbo3.plugin.dispatch.precompile import (
    SELF_CHECK_RTOL, Batch, ModelShapes, PrecompileError, model_shapes, plan_batches)
from caovan_vllm_sm75_turbo3.plugin.dispatch.state import (
    DISABLED, UPSTREAM, DispatchState, failure_line)
from caovan_vllm_sm75_turbo3.policy import vllm_versions as vv
from caovan_vllm_sm75_turbo3.policy.decision import decide
from caovan_vllm_sm75_turbo3.runtime.facts import Facts

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "vllm-compat.md"
GDN_021 = module_file(LEGACY.module)


def mutated(changes: dict[str, tuple[str, str, int]]):
    """A reader of the installed vLLM where `path -> (old, new, count)` text replacements apply."""
    def read(path: str) -> str | None:
        text = installed_source(path)
        if text is not None and path in changes:
            old, new, count = changes[path]
            assert old in text, (path, old)
            text = text.replace(old, new, count)
        return text
    return read


# ---- the source check, live on the installed vLLM 0.21.0 --------------------------------------
@pytest.mark.vllm
def test_installed_vllm_021_is_the_legacy_family_and_only_that():
    legacy = check_sources(LEGACY, installed_source)
    assert legacy.ok, legacy.problems
    assert legacy.fla_package == "vllm.model_executor.layers.fla.ops" and legacy.extra_kwargs == ()
    modular = check_sources(MODULAR, installed_source)
    assert not modular.present and not modular.ok


@pytest.mark.vllm
@pytest.mark.parametrize("path,old,new,count,problem", [
    (GDN_021, '@CustomOp.register("chunk_gated_delta_rule")\n', "", 1,
     "ChunkGatedDeltaRule is not registered as CustomOp 'chunk_gated_delta_rule'"),
    (GDN_021, "class ChunkGatedDeltaRule(CustomOp):\n    def __init__(self) -> None:",
     "class ChunkGatedDeltaRule(CustomOp):\n    def __init__(self, backend) -> None:", 1,
     "ChunkGatedDeltaRule.__init__ requires ['backend']"),
    (GDN_021, "self.forward_cuda if use_flashinfer else self.forward_native",
     "self.forward_cuda if use_flashinfer else self.forward_cuda", 1,
     "never selects self.forward_native"),
    (GDN_021, "core_attn_out: torch.Tensor | None = None,\n    ):\n        return fla_chunk_gated_delta_rule(",
     "out: torch.Tensor | None = None,\n    ):\n        return fla_chunk_gated_delta_rule(", 1,
     "ChunkGatedDeltaRule.forward_native lacks parameters ['core_attn_out']"),
    (GDN_021, "self.chunk_gated_delta_rule = ChunkGatedDeltaRule()",
     "self.chunk_gated_delta_rule = ChunkGatedDeltaRule(prefix)", 1,
     "GatedDeltaNetAttention.__init__ does not build self.chunk_gated_delta_rule = ChunkGatedDeltaRule()"),
    (GDN_021, ") = self.chunk_gated_delta_rule(\n", ") = self.chunk_gated_delta_rule(\n                new_flag=1,\n",
     1, "GatedDeltaNetAttention passes unknown keywords ['new_flag'] to self.chunk_gated_delta_rule"),
    (GDN_021, ") = self.chunk_gated_delta_rule(\n", ") = self.chunk_gated_delta_rule(\n                query_non_spec,\n",
     1, "calls self.chunk_gated_delta_rule with positional arguments"),
    (GDN_021, "from vllm.model_executor.layers.fla.ops import (\n    chunk_gated_delta_rule as",
     "from vllm.third_party.fla import (\n    chunk_gated_delta_rule as", 1,
     "does not import chunk_gated_delta_rule from vllm.model_executor.layers.fla.ops"),
    ("vllm/model_executor/layers/fla/ops/chunk.py", "    scale: float = None,", "    softmax_scale: float = None,", 1,
     "vllm.model_executor.layers.fla.ops.chunk_gated_delta_rule lacks parameters ['scale']"),
    ("vllm/model_executor/custom_op.py", "    def register_oot(cls, _decorated_op_cls",
     "    def register_outside(cls, _decorated_op_cls", 1, "CustomOp has no register_oot"),
    ("vllm/model_executor/custom_op.py", "op_registry_oot: dict", "op_registry_ext: dict", 1,
     "has no module-level op_registry_oot"),
    ("vllm/model_executor/models/qwen3_5.py", "import GatedDeltaNetAttention", "import GatedDeltaNetAttention2", 1,
     "qwen3_5.py does not import GatedDeltaNetAttention from vllm.model_executor.layers.mamba.gdn_linear_attn"),
])
def test_each_relied_on_detail_is_checked(path, old, new, count, problem):
    result = check_sources(LEGACY, mutated({path: (old, new, count)}))
    assert not result.ok
    assert any(problem in p for p in result.problems), result.problems


@pytest.mark.vllm
def test_a_modular_layout_is_recognised_from_what_the_module_defines():
    """0.21's module served at the 0.22+ path with the 0.22+ layer name is the modular family."""
    layer = installed_source(GDN_021).replace("class GatedDeltaNetAttention(", "class QwenGatedDeltaNetAttention(")
    model = installed_source(module_file(LEGACY.model_module)).replace(
        "from vllm.model_executor.layers.mamba.gdn_linear_attn import GatedDeltaNetAttention",
        "from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention")

    def read(path: str) -> str | None:
        if path == GDN_021:
            return None
        if path == module_file(MODULAR.module):
            return layer
        if path == module_file(MODULAR.model_module):
            return model
        return installed_source(path)
    assert check_sources(MODULAR, read).ok, check_sources(MODULAR, read).problems
    assert not check_sources(LEGACY, read).present


# ---- the committed table and the release table agree --------------------------------------------
def _doc_rows() -> list[list[str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        if re.match(r"^\| `\d", line):
            rows.append([c.strip().strip("`") for c in line.strip("|").split("|")])
    return rows


def test_compat_table_covers_021_to_034_and_matches_the_release_table():
    rows = _doc_rows()
    versions = [r[0] for r in rows]
    assert versions[0] == "0.21.0" and versions[-1].startswith("0.34.")
    assert {vv.minor(v) for v in versions} == {f"0.{m}" for m in range(21, 35)}
    for version, interface, _module, fla, _extra, result in rows:
        assert result == "supported", (version, result)
        assert interface == vv.gdn_family(version), version
        third_party = vv.has("fla-ops-in-third-party", version)
        assert fla == ("vllm.third_party.flash_linear_attention.ops" if third_party
                       else "vllm.model_executor.layers.fla.ops"), version
    assert {f.name for f in FAMILIES} == {r[1] for r in rows}


@pytest.mark.vllm
def test_live_conformance_of_the_installed_vllm_matches_its_committed_row(tmp_path):
    tool = [sys.executable, str(ROOT / "tools" / "vllm_conformance.py"), "--installed"]
    r = subprocess.run(tool, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("| `0.21.0` | legacy-gdn-linear-attn-v020 |")
    # a committed row that no longer says what the installed vLLM has fails the check
    doc = tmp_path / "compat.md"
    doc.write_text(DOC.read_text().replace("| `0.21.0` | legacy-gdn-linear-attn-v020 |",
                                           "| `0.21.0` | modular-qwen-gdn-v022 |"))
    r = subprocess.run(tool + ["--out", str(doc)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 1 and "does not match its committed row" in r.stderr


# ---- precompile ---------------------------------------------------------------------------------
def _shapes(**kw) -> ModelShapes:
    base = dict(key_heads=8, value_heads=24, head_k=128, head_v=128, tp_size=2,
                max_num_batched_tokens=8192, max_num_seqs=2, dtype="float16")
    return ModelShapes(**{**base, **kw})


def test_plan_reaches_both_prep_variants_and_ends_with_the_check():
    two = plan_batches(_shapes())
    assert two == [Batch((8192,), True), Batch((1, 64, 67), False, check=True)]
    assert plan_batches(_shapes(max_num_seqs=8)) == two  # one pinned config whatever the batch
    whole_context = plan_batches(_shapes(max_num_batched_tokens=262144, max_num_seqs=8))
    assert sum(whole_context[0].lengths) == 16384  # capped (MAX_LAUNCH_TOKENS)
    small = plan_batches(_shapes(max_num_batched_tokens=100))
    assert small == [Batch((100,), True), Batch((1, 64), False, check=True)]  # the check never exceeds one step


def test_model_shapes_from_vllm_config_split_heads_over_tp():
    hf = SimpleNamespace(linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
                         linear_value_head_dim=128)

    def cfg(hf, tp=2):
        return SimpleNamespace(model_config=SimpleNamespace(hf_text_config=hf, dtype="torch.float16"),
                               parallel_config=SimpleNamespace(tensor_parallel_size=tp),
                               scheduler_config=SimpleNamespace(max_num_batched_tokens=8192, max_num_seqs=2))
    assert model_shapes(cfg(hf)) == _shapes()
    with pytest.raises(PrecompileError, match="do not split over tensor-parallel size 3"):
        model_shapes(cfg(hf, tp=3))
    with pytest.raises(PrecompileError, match="the model config has no linear_value_head_dim"):
        model_shapes(cfg(SimpleNamespace(linear_num_key_heads=16, linear_num_value_heads=48,
                                         linear_key_head_dim=128)))


# Our kernels run in Triton's interpreter, in a child process started with TRITON_INTERPRET=1 (the
# variable must be set before triton decorates the kernels; a child keeps it out of this process).
PRECOMPILE_CASES = textwrap.dedent("""
    import json, torch
    from caovan_vllm_sm75_turbo3.kernels.gdn import chunk_gated_delta_rule, gated_delta_rule_reference
    from caovan_vllm_sm75_turbo3.kernels.gdn.configs import CHUNK
    from caovan_vllm_sm75_turbo3.plugin.dispatch.precompile import ModelShapes, PrecompileError, precompile
    shapes = ModelShapes(key_heads=1, value_heads=2, head_k=64, head_v=64, tp_size=1,
                         max_num_batched_tokens=140, max_num_seqs=2, dtype="float16")

    def run(kernel):
        return precompile(kernel, gated_delta_rule_reference, shapes, CHUNK, torch.device("cpu"))

    def off_by_five_percent(**kw):
        o, s = chunk_gated_delta_rule(**kw)
        o.mul_(1.05)
        return o, s

    def skips_last_token(core_attn_out, **kw):
        o, s = chunk_gated_delta_rule(**kw)  # into its own buffer: the poisoned one stays NaN
        core_attn_out[:-1].copy_(o[0, :-1])
        return core_attn_out.unsqueeze(0), s

    out = {}
    # vLLM builds the model (and so runs precompile) under its own default device and dtype;
    # nothing of ours may depend on them ("meta" tensors would fail every numeric check).
    torch.set_default_dtype(torch.float16)
    with torch.device("meta"):
        report = run(chunk_gated_delta_rule)
    torch.set_default_dtype(torch.float32)
    out["good"] = [report.launches, report.max_rel_err]
    for name, kernel in (("wrong", off_by_five_percent), ("unwritten", skips_last_token)):
        try:
            run(kernel)
            out[name] = None
        except PrecompileError as err:
            out[name] = str(err)
    print("OUT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def precompile_cases():
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", PRECOMPILE_CASES], capture_output=True, text=True, timeout=600,
                       env=env)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("OUT ")), None)
    assert r.returncode == 0 and line, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(line[4:])


@pytest.mark.torch
def test_precompile_runs_our_kernel_and_checks_it_against_float64(precompile_cases):
    launches, err = precompile_cases["good"]
    assert launches == 2
    assert 0 < err <= SELF_CHECK_RTOL  # exactly 0 would mean nothing was compared


@pytest.mark.torch
def test_precompile_rejects_a_kernel_that_computes_wrong_numbers(precompile_cases):
    assert precompile_cases["wrong"].startswith(
        "precompile self-check against the float64 reference failed for 3 sequence(s), 132 tokens")


@pytest.mark.torch
def test_precompile_rejects_a_kernel_that_leaves_output_unwritten(precompile_cases):
    assert precompile_cases["unwritten"] is not None
    assert "left NaN/inf in the output" in precompile_cases["unwritten"]


# ---- after-import hook ---------------------------------------------------------------------------
def test_after_import_runs_once_after_the_module_code_and_leaves_no_finder(tmp_path, monkeypatch):
    (tmp_path / "caovan_probe_pkg").mkdir()
    (tmp_path / "caovan_probe_pkg" / "__init__.py").write_text("")
    (tmp_path / "caovan_probe_pkg" / "layer.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    name = "caovan_probe_pkg.layer"
    after_import.call_after_import(name, lambda m: seen.append(m.VALUE))
    after_import.call_after_import(name, lambda m: seen.append("duplicate"))  # one hook per module
    assert seen == [] and name not in sys.modules
    import caovan_probe_pkg.layer  # noqa: F401
    assert seen == [42]
    assert not any(isinstance(f, after_import.AfterImport) for f in sys.meta_path)
    after_import.call_after_import(name, lambda m: seen.append(m.VALUE + 1))  # already imported: now
    assert seen == [42, 43]
    monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "caovan_probe_pkg")


# ---- lines -------------------------------------------------------------------------------------
def test_lines_are_the_documented_ones():
    assert failure_line("legacy-gdn-linear-attn-v020", "precompile: boom") == (
        "Caovan SM75 Turbo3 dispatch failed on interface legacy-gdn-linear-attn-v020: precompile: boom")
    st = DispatchState(LEGACY.name, LEGACY.name, "caovan-gdn-chunk", "2 SM75 GPU(s)")
    assert st.active and st.line() == ("gdn_legacy=legacy-gdn-linear-attn-v020 interface=legacy-gdn-linear-attn-v020 "
                                       "kernel=caovan-gdn-chunk why=2 SM75 GPU(s)")
    assert not DispatchState(UPSTREAM, LEGACY.name, "vllm-upstream", "x").active
    assert not DispatchState(DISABLED, LEGACY.name, "vllm-upstream", "x").active


def test_the_launchers_prediction_uses_the_dispatch_words():
    facts = Facts.load(ROOT / "examples" / "2x2080ti-22g.json")
    assert decide(load_settings({}), facts).gdn.line == LEGACY.name  # what the worker logs when active
    assert decide(load_settings({"CAOVAN_GDN_LEGACY_DISABLE": "1"}), facts).gdn.line == DISABLED
    assert decide(load_settings({"CAOVAN_MODE": "guards"}), facts).gdn.line == UPSTREAM


def test_an_unexpected_error_while_deciding_falls_back_instead_of_breaking_model_construction(caplog):
    from caovan_vllm_sm75_turbo3.plugin.dispatch.controller import Dispatch

    from caovan_vllm_sm75_turbo3.plugin.context import ProcessContext

    env = {"CAOVAN_FACTS": str(ROOT / "examples" / "2x2080ti-22g.json")}
    d = Dispatch(ProcessContext(env), interface=LEGACY)
    with caplog.at_level("INFO", logger="caovan_vllm_sm75_turbo3"):
        assert d.take_over(SimpleNamespace()) is None  # not an op vLLM would build: something raises
        assert d.take_over(SimpleNamespace()) is None  # decided once; no second attempt
    failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Caovan SM75 Turbo3 dispatch failed")]
    assert len(failed) == 1 and failed[0].startswith(
        "Caovan SM75 Turbo3 dispatch failed on interface legacy-gdn-linear-attn-v020: deciding raised ")
    assert d.state is not None and d.state.status == UPSTREAM


def test_the_kernel_runs_on_sm75_to_sm89_but_the_dispatch_takes_over_on_sm75_only():
    from caovan_vllm_sm75_turbo3.kernels.gdn_capability import dispatch_target, kernel_runs_on
    from caovan_vllm_sm75_turbo3.runtime.facts import GpuFact

    for cc, runs, ours in (((7, 0), False, False), ((7, 5), True, True), ((8, 0), True, False),
                           ((8, 6), True, False), ((8, 9), True, False), ((9, 0), False, False),
                           ((12, 0), False, False)):
        assert (kernel_runs_on(cc), dispatch_target(cc)) == (runs, ours), cc
        assert GpuFact(index=0, compute_capability=f"{cc[0]}.{cc[1]}").is_sm75 is ours, cc
        assert not dispatch_target(cc) or kernel_runs_on(cc)  # we never dispatch where it cannot run
