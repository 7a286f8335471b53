"""Fill the vLLM arguments the user did not give, from a launch profile and the release table.

`fill_launch` is pure: the process's one decision (its facts, profile setting, Turbo decision
and our upstream-bug fixes), the model directory's facts, the user's vLLM arguments and the
profile table in; the arguments to add (each with its reason), the
memory arithmetic and the decisions as lines, and warnings out. A value the user gave is
never replaced: it is used for the arithmetic and reported as kept. Rules that hold for
every profile live here, not in the data:
- fp8 KV only where an attention backend serves it on SM75: vLLM's own up to 0.23, ours
  (`--attention-backend CUSTOM`, plugin/attention) from 0.24 where the Turbo hook gives our
  kernel tensor cores; FlashInfer attention only where the release still runs it below SM80;
- speculative decoding (MTP) only when the checkpoint has MTP weights; its drafter named our attention
  backend where fp8 KV rests on it (vLLM never gives the drafter the target's), and the profile's
  fp8 KV beside MTP only where our engine check proved that pair (else fp16 KV, MTP kept);
- with MTP on a hybrid GDN model, PIECEWISE CUDA graphs (FULL graphs garbled output in the field)
  unless our engine check proved FULL_AND_PIECEWISE exact for the release, attention backend and
  KV dtype (data/engine_proofs.json), with capture sizes for max-num-seqs x (1 + draft tokens);
- `--disable-custom-all-reduce` with tensor parallel > 1;
- `--mamba-cache-mode align` with prefix caching on a hybrid model, where it has an effect.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..runtime.model import ModelFacts, ModelShape, model_shape
from . import vllm_versions as vv
from .fill_attention import KV_BYTES, fill_attention_backend, fill_kv_cache_dtype
from .fill_base import Filler, LaunchFill
from .fill_decode import choose_speculative, fill_cuda_graphs, fill_speculative, prefix_hazard_line
from .memory_plan import MemoryInputs, MemoryPlan, plan_memory
from .decision import Decision
from .upstream_bugs import UpstreamBug, bugs_for, wrong_output_with_prefix_cache
from .profiles import Profile, ProfileTable, Setup, matches, missed_rule, select, setup_of
from .vllm_args import AUTO_LEN, LaunchNumbers, VllmArgs, check_launch_args



def mamba_align_effective(version: str | None) -> bool:
    """Whether `--mamba-cache-mode align` exists and matters for prefix caching in this release."""
    return bool(vv.has("mamba-align-for-prefix-cache", version)) and not vv.has(
        "arg-deprecated:--mamba-cache-mode", version)


# vLLM's default largest CUDA-graph capture (max_cudagraph_capture_size): larger batches run eagerly,
# and it keeps what we generate small whatever --max-num-seqs says.
def tp_divides(shape: ModelShape | None, tp: int) -> bool:
    """Whether the model's heads split evenly over `tp` GPUs (KV heads may be replicated)."""
    if shape is None or tp == 1:
        return True
    kv = shape.num_kv_heads or 1
    heads_ok = (shape.num_attention_heads or 0) % tp == 0 and (kv % tp == 0 or tp % kv == 0)
    linear_ok = all(h is None or h % tp == 0 for h in (shape.linear_num_key_heads, shape.linear_num_value_heads))
    return heads_ok and linear_ok


def conservative_tp(gpus: int, shape: ModelShape | None) -> int:
    """The largest power of two up to the GPU count that the model's heads divide."""
    tp = 1
    while tp * 2 <= gpus and tp_divides(shape, tp * 2):
        tp *= 2
    return tp


def _model_line(shape: ModelShape, model: ModelFacts, family: str | None) -> str:
    """What was read from the model directory, in one line."""
    quant = f"{shape.quant_method} {shape.quant_bits or '?'}-bit" if shape.quant_method else "not quantised"
    size = f"{model.size_bytes / 1e9:.1f} GB" if model.size_bytes else "size unknown"
    mtp = ("no weight index" if model.mtp_weights is None
           else f"{model.mtp_weights} MTP weights" if model.mtp_weights else "no MTP weights")
    return (f"model: {shape.architecture} ({family or 'no profile family'}), {shape.num_layers} layers "
            f"({shape.full_attention_layers} full attention, {shape.linear_attention_layers} linear attention), "
            f"{shape.num_attention_heads} query / {shape.num_kv_heads} KV heads of {shape.head_dim}, "
            f"{shape.mtp_layers} MTP layer(s) declared, {mtp}, {quant}, checkpoint {size}")


def fill_launch(decision: Decision, model: ModelFacts | None, args: VllmArgs, table: ProfileTable,
                numbers: LaunchNumbers | None = None) -> LaunchFill:
    """Decide the vLLM arguments to add for this machine and model (see the module doc).

    `numbers` are the user's numeric arguments as the launch checked them (check_launch_args);
    without them they are read here, and a value that does not pass counts as not given.
    `decision` is the process's one decision: its settings' profile, its facts, its Turbo decision
    and the upstream-bug fixes our plugin installs in this launch's vLLM (Decision.fixes)."""
    facts, profile_setting, turbo, fixes = decision.facts, decision.settings.profile, decision.turbo, decision.fixes
    if profile_setting == "none":
        return LaunchFill(None)  # the user's arguments only, nothing to explain
    if not facts.sm75_count:
        return LaunchFill(None, lines=("no SM75 GPU in the facts: no launch profile applies",))
    shape = model_shape(model.config) if model and model.config else None
    setup = setup_of(table, facts, shape)
    f = Filler(args, numbers or check_launch_args(args, 0).numbers)
    version = facts.versions.vllm
    profile = _choose_profile(f, table, setup, profile_setting)
    launch = profile.launch
    if shape is None or model is None:
        # its source's promises (memory left free, MTP, ...) need the model's shape: say only what is filled
        f.lines[-1] = (f"profile: {profile.name} ({profile.source.kind}): only what needs no model shape is "
                       "filled here (--dtype, the all-reduce rule); the rest of the profile waits for a "
                       "readable config.json")
        _fill_without_shape(f, launch, profile.name)
        return LaunchFill(profile.name, tuple(f.args), tuple(f.lines), tuple(f.warnings), None, setup)
    f.lines.append(_model_line(shape, model, setup.family))
    planned = setup.gpu_memory_mib is not None and model.size_bytes is not None
    tp = _fill_tensor_parallel(f, launch, facts.sm75_count, shape, planned)
    _fill_dtype(f, launch)
    _check_user_dtype(f)
    hazard = wrong_output_with_prefix_cache(version, shape.is_hybrid, fixes)
    spec = choose_speculative(f, profile, shape, model, table.families.get(setup.family or ""), version, hazard)
    kv = fill_kv_cache_dtype(f, launch, version, turbo, spec)
    fill_attention_backend(f, launch, version, kv)
    draft = fill_speculative(f, spec, kv, version)
    util = _fill_gpu_memory_utilization(f, launch, profile.name, planned)
    inputs = None if setup.gpu_memory_mib is None else MemoryInputs(
        gpu_memory_mib=setup.gpu_memory_mib, tensor_parallel=tp, gpu_memory_utilization=util,
        weights_bytes=model.size_bytes, headroom_mib=launch.get("headroom_mib", 2048),
        kv_cache_bytes=KV_BYTES.get(kv, 2), speculative_tokens=draft, mtp_layers=shape.mtp_layers if draft else 0,
        pipeline_parallel=f.numbers.pipeline_parallel_size or 1)
    memory, seqs = _fill_memory(f, launch, shape, inputs)
    _fill_batched_tokens(f, launch, profile.name)
    prefix_on = _fill_prefix_caching(f, launch, shape, version, hazard if draft else None)
    _say_fixed(f, shape, draft, prefix_on, version, fixes)
    _warn_upstream_bugs(f, shape, draft, prefix_on, version, fixes)
    fill_cuda_graphs(f, launch, shape, draft, seqs, version)
    _fill_all_reduce(f, launch, tp, profile.name)
    _fill_extra_args(f, launch, profile.name)
    return LaunchFill(profile.name, tuple(f.args), tuple(f.lines), tuple(f.warnings), memory, setup, tuple(f.failures))


def _choose_profile(f: Filler, table: ProfileTable, setup: Setup, setting: str) -> Profile:
    """The profile named by `setting` (auto: the one matching `setup`, else conservative), announced."""
    if setting == "auto":
        profile = select(table, setup)
        if profile is None:
            why = "; ".join(setup.why_unknown) or "no profile for this setup"
            f.warnings.append(f"no launch profile for {setup.describe()} ({why}): conservative defaults "
                              "that start, not the fast ones")
            f.warnings += [_near_miss(p, rule) for p in table.profiles if (rule := missed_rule(p, setup))]
            profile = table.conservative
    else:
        profile = table.by_name(setting)
        if not matches(profile, setup):
            f.warnings.append(f"profile {profile.name} is for {profile.match.describe() if profile.match else '?'}; "
                              f"this is {setup.describe()}: its values may not fit")
    f.lines.append(f"profile: {profile.name} ({profile.source.kind}): {profile.source.detail}"
                   + (f" [{profile.source.where}]" if profile.source.where else ""))
    return profile


def _near_miss(profile: Profile, rule: str) -> str:
    """Why a profile that almost matched was not taken, what it would give, and how to force it."""
    exp = profile.expected
    gain = (f": about {exp.decode_tok_s:g} tok/s decode in its field report, against about "
            f"{exp.decode_tok_s_without_mtp:g} without MTP as the conservative defaults run"
            if exp is not None and exp.decode_tok_s and exp.decode_tok_s_without_mtp else "")
    risk = (" (high risk, not necessarily unable to start: a 27B checkpoint loads through host RAM and has been "
            "OOM-killed on small hosts; add swap)" if "host memory" in rule else "")
    launch = profile.launch
    runs = [f"MTP with {launch['speculative_tokens']} draft tokens" if launch.get("speculative_tokens") else "",
            f"{launch['kv_cache_dtype']} KV" if launch.get("kv_cache_dtype") else "",
            f"context up to {launch['max_model_len_cap']:,}" if launch.get("max_model_len_cap") else "",
            "prefix caching" if launch.get("prefix_caching") else ""]
    return (f"profile {profile.name} not taken: {rule}{risk}. It runs {', '.join(r for r in runs if r)}{gain}; "
            f"force it with --profile {profile.name}")


def _fill_without_shape(f: Filler, launch: dict[str, Any], profile: str) -> None:
    """Without the model's shape only the hardware rules apply: heads, memory, MTP are unknown."""
    f.warnings.append("the model's config.json could not be read (pass a local model directory): "
                      "only --dtype and the all-reduce rule are filled")
    _fill_dtype(f, launch)
    _fill_all_reduce(f, launch, f.numbers.tensor_parallel_size or 1, profile)


def _memory_use(planned: bool) -> str:
    """What a kept value is used for: the note never claims a plan that is not made."""
    return "the memory plan uses it" if planned else "no memory plan: GPU memory or checkpoint size unknown"


def _fill_tensor_parallel(f: Filler, launch: dict[str, Any], gpus: int, shape: ModelShape, planned: bool) -> int:
    """Tensor parallel: the user's, else the profile's, else the largest that divides the heads."""
    tp = f.numbers.tensor_parallel_size
    if tp is not None:
        f.kept("--tensor-parallel-size", _memory_use(planned))
        return tp
    tp = launch.get("tensor_parallel_size") or conservative_tp(gpus, shape)
    if tp > gpus or not tp_divides(shape, tp):
        fallback = conservative_tp(gpus, shape)
        f.warnings.append(f"tensor parallel {tp} does not fit {gpus} GPU(s) or the model's heads: using {fallback}")
        tp = fallback
    heads = f"{shape.num_attention_heads} query / {shape.num_kv_heads} KV heads"
    f.fill("--tensor-parallel-size", str(tp), f"{gpus} SM75 GPU(s); {heads} split over {tp}")
    return tp


def _fill_dtype(f: Filler, launch: dict[str, Any]) -> None:
    """The profile's model dtype (fp16: Turing has no bf16)."""
    if launch.get("dtype"):
        f.fill("--dtype", launch["dtype"], "Turing has no bf16: fp16 weights and activations")


def _check_user_dtype(f: Filler) -> None:
    """Warn about a user dtype that SM75 cannot run."""
    if f.user_value("--dtype") in ("bfloat16",):
        f.warnings.append("--dtype bfloat16 on SM75: Turing has no bf16, vLLM will refuse it; use half")


def _fill_gpu_memory_utilization(f: Filler, launch: dict[str, Any], profile: str, planned: bool) -> float:
    """The share of each GPU vLLM takes: the user's, else the profile's. Returns it."""
    util = f.numbers.gpu_memory_utilization
    if util is not None:
        f.kept("--gpu-memory-utilization", _memory_use(planned))
        return util
    util = launch.get("gpu_memory_utilization", 0.9)
    f.fill("--gpu-memory-utilization", f"{util:g}", f"profile {profile}: the share of each GPU vLLM takes")
    return util


def _fill_memory(f: Filler, launch: dict[str, Any], shape: ModelShape,
                 inputs: MemoryInputs | None) -> tuple[MemoryPlan | None, int]:
    """max-model-len and max-num-seqs that fit, from the effective values decided before.

    `inputs` is None when the GPU memory is unknown (no plan). Returns the plan and the
    effective max-num-seqs.
    """
    seqs_user = f.numbers.max_num_seqs
    len_user = f.numbers.max_model_len
    if len_user == AUTO_LEN:  # vLLM fits it at start: the plan shows what fits, nothing is filled
        len_user = None
    memory = None
    if inputs is not None:
        caps = [c for c in (launch.get("max_model_len_cap"), shape.max_position_embeddings) if c]
        memory = plan_memory(shape, replace(
            inputs, max_num_seqs=seqs_user or launch.get("max_num_seqs", 1), seqs_given=seqs_user is not None,
            max_model_len=len_user, max_model_len_cap=min(caps) if caps else None))
        f.lines += memory.lines
        f.warnings += memory.warnings
        for flag in ("--max-model-len", "--max-num-seqs"):
            if f.given(flag):
                f.kept(flag, _kept_memory_note(flag, f.numbers, memory))
        if memory.fits:
            if f.numbers.max_model_len is None:
                f.fill("--max-model-len", str(memory.max_model_len),
                       "the longest context that fits max-num-seqs sequences at once (memory lines)")
            if seqs_user is None:
                f.fill("--max-num-seqs", str(memory.max_num_seqs), "sequences that fit at that context (memory lines)")
    seqs = seqs_user or (memory.max_num_seqs if memory and memory.max_num_seqs else launch.get("max_num_seqs", 1))
    return memory, seqs


def _kept_memory_note(flag: str, numbers: LaunchNumbers, memory: MemoryPlan) -> str:
    """Why a kept max-model-len / max-num-seqs matters, as true as the plan made."""
    if flag == "--max-model-len" and numbers.max_model_len == AUTO_LEN:
        return "vLLM fits the length to the memory at start; the memory lines show what fits"
    return _memory_use(memory.fits is not None)


def _fill_batched_tokens(f: Filler, launch: dict[str, Any], profile: str) -> None:
    """The profile's prefill chunk."""
    batched = launch.get("max_num_batched_tokens")
    if batched:
        f.fill("--max-num-batched-tokens", str(batched), f"profile {profile}: the prefill chunk")


def _fill_prefix_caching(f: Filler, launch: dict[str, Any], shape: ModelShape, version: str | None,
                         hazard: UpstreamBug | None = None) -> bool:
    """Prefix caching, and the mamba cache mode it needs on hybrid models; whether it is on. With
    MTP filled or given and `hazard` (that pair gives wrong output here), prefix caching is not
    filled but switched off, unless the user asked for it (then the plan warns)."""
    prefix_user = f.user_value("--enable-prefix-caching")
    if hazard is not None and prefix_user is None:
        f.fill("--no-enable-prefix-caching", None,
               f"{prefix_hazard_line(hazard, version)}: MTP is kept for decode speed; pass --enable-prefix-caching "
               "to have prefix caching instead (the profile then leaves MTP out)")
        return False
    if launch.get("prefix_caching"):
        f.fill("--enable-prefix-caching", None, "reuse the cache of shared prompt prefixes (chat history, tools)")
    prefix_on = prefix_user is True or isinstance(prefix_user, str) or (
        prefix_user is None and bool(launch.get("prefix_caching")))
    if shape.is_hybrid and prefix_on and mamba_align_effective(version):
        f.fill("--mamba-cache-mode", "align", f"prefix caching on a hybrid GDN model needs align mode in vLLM {version}")
    return prefix_on


def _say_fixed(f: Filler, shape: ModelShape, draft: int, prefix_on: bool, version: str | None,
               fixes: tuple[str, ...]) -> None:
    """A line for each upstream bug of this launch that our proven fix removes."""
    pp = (f.numbers.pipeline_parallel_size or 1) > 1
    for bug in bugs_for(version, speculative=bool(draft), prefix_caching=prefix_on, hybrid_gdn=shape.is_hybrid,
                        pipeline_parallel=pp):
        if bug.id in fixes and bug.fixed_by_us(version) and bug.fix is not None:
            f.lines.append(f"fixed: upstream bug {bug.id} on vLLM {version} by our plugin ({bug.fix.what}; proven by "
                           f"the engine check on {', '.join(bug.fix.proven)})")


def _warn_upstream_bugs(f: Filler, shape: ModelShape, draft: int, prefix_on: bool, version: str | None,
                        fixes: tuple[str, ...] = ()) -> None:
    """The upstream bugs this launch meets (data/upstream_bugs.json) and our proven fixes do not
    remove: each is a warning with its sources and a check."""
    pp = (f.numbers.pipeline_parallel_size or 1) > 1
    for bug in bugs_for(version, fixes, speculative=bool(draft), prefix_caching=prefix_on, hybrid_gdn=shape.is_hybrid,
                        pipeline_parallel=pp):
        (f.failures if bug.fatal else f.warnings).append(bug.warning(version))


def _fill_all_reduce(f: Filler, launch: dict[str, Any], tp: int, profile: str) -> None:
    """`--disable-custom-all-reduce` with tensor parallel > 1, unless the profile keeps it."""
    if tp > 1 and not launch.get("custom_all_reduce", False):
        f.fill("--disable-custom-all-reduce", None, f"TP {tp} over PCIe: vLLM's custom all-reduce slows decode "
               f"(profile {profile}: the cost in its source)")


def _fill_extra_args(f: Filler, launch: dict[str, Any], profile: str) -> None:
    """The profile's flags without a rule of their own."""
    for flag, value in launch.get("extra_args", {}).items():
        f.fill(flag, None if value is None else str(value), f"profile {profile}")
