"""The launch profile's decode settings: speculative decoding (MTP) and CUDA graphs to go with it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..runtime.model import ModelFacts, ModelShape
from .fill_base import COMPILATION, Filler
from .profiles import Family, Profile
from .attention import drafter_backend_needed
from .drafter import DRAFTER_WHY, user_speculative_config
from .engine_proofs import MTP_FP8_KV, MTP_FULL_GRAPHS, gap_for, proof_for
from .upstream_bugs import UpstreamBug, bugs_for

MAX_CAPTURE_TOKENS = 512


def capture_sizes(max_num_seqs: int, draft_tokens: int) -> list[int]:
    """CUDA graph sizes for decode with speculation: each sequence verifies 1 + draft tokens; at
    most MAX_CAPTURE_TOKENS tokens (and at least one size)."""
    step = 1 + draft_tokens
    return [step * s for s in range(1, max(1, min(max_num_seqs, MAX_CAPTURE_TOKENS // step)) + 1)]


def _draft_count(n: object) -> int | None:
    """A draft-token count as given (an int or its text), None when it is not one."""
    if isinstance(n, str) and n.strip().isdigit():
        n = int(n)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _user_speculative(f: Filler) -> int | None:
    """Draft tokens in the user's own --speculative-config (None: not given or unreadable)."""
    cfg = user_speculative_config(f.user)
    return _draft_count(cfg.get("num_speculative_tokens")) if cfg else None


def prefix_hazard_line(bug: UpstreamBug, version: str | None) -> str:
    """Why MTP and prefix caching are not filled together on this release."""
    return (f"MTP with prefix caching gives wrong output on prefix-cache hits on vLLM {version} on hybrid GDN "
            f"models (upstream bug {bug.id}; {bug.in_source.split('. ')[0]})")


@dataclass(frozen=True)
class SpecChoice:
    """Speculative decoding for this launch, chosen before the KV cache dtype (whose fp8 needs a
    drafter backend with MTP): `draft` tokens; `config` and `reason` what fill_speculative adds
    (None: the user's own config, or none)."""

    draft: int
    config: dict[str, Any] | None = None
    reason: str = ""
    user_given: bool = False


def choose_speculative(f: Filler, profile: Profile, shape: ModelShape, model: ModelFacts,
                       family: Family | None, version: str | None = None,
                       prefix_hazard: UpstreamBug | None = None) -> SpecChoice:
    """Speculative decoding: MTP only with MTP weights in the checkpoint, not where this release
    refuses it with pipeline parallel, and not beside prefix caching the user asked for where
    `prefix_hazard` says that pair gives wrong output (data/upstream_bugs.json). Says why; fills nothing."""
    draft = _user_speculative(f)
    if draft is None and f.given("--speculative-config"):
        f.lines.append("kept: --speculative-config as given (draft tokens unreadable, the memory plan assumes none)")
        return SpecChoice(0, user_given=True)
    if draft is not None:
        f.lines.append(f"kept: --speculative-config as given ({draft} draft tokens)")
        return SpecChoice(draft, user_given=True)
    want = profile.launch.get("speculative_tokens", 0)
    if not want:
        return SpecChoice(0)
    method = family.speculative_method if family else None
    pp = f.numbers.pipeline_parallel_size or 1
    refused = [b for b in bugs_for(version, speculative=True, pipeline_parallel=pp > 1, hybrid_gdn=shape.is_hybrid)
               if b.fatal]
    if refused:
        f.lines.append(f"speculative: none: MTP with --pipeline-parallel-size {pp} does not start on vLLM {version} "
                       f"(upstream bug {refused[0].id}); decode runs without it")
        return SpecChoice(0)
    if not model.has_mtp_weights:
        declared = f"the config declares {shape.mtp_layers} MTP layer(s) but " if shape.mtp_layers else ""
        f.lines.append(f"speculative: none: {declared}the checkpoint has no MTP weights (mtp.*)")
        return SpecChoice(0)
    if not method:
        f.lines.append(f"speculative: none: no MTP method known for {shape.architecture}")
        return SpecChoice(0)
    if prefix_hazard is not None and f.user_value("--enable-prefix-caching") is True:
        f.lines.append(f"speculative: none: you asked for prefix caching, and {prefix_hazard_line(prefix_hazard, version)}; "
                       "pass --speculative-config yourself to have both, or leave out --enable-prefix-caching "
                       "to have MTP")
        return SpecChoice(0)
    return SpecChoice(want, {"method": method, "num_speculative_tokens": want},
                      f"the checkpoint has {model.mtp_weights} MTP weights; {want} draft tokens were the fastest "
                      f"count (profile {profile.name}: speeds in its source)")


def fill_speculative(f: Filler, spec: SpecChoice, kv: str, version: str | None) -> int:
    """Fill the chosen speculative config, naming the drafter's attention backend where this KV
    cache dtype needs one (policy/attention.drafter_backend_needed; a launch whose drafter still
    cannot start is judged in the plan, policy/drafter.py). Returns the draft tokens."""
    if spec.config is not None:
        config, reason = dict(spec.config), spec.reason
        need = drafter_backend_needed(version, kv)
        if need:
            config["attention_backend"] = need
            reason += f"; the drafter on our attention backend too, for {kv} KV: {DRAFTER_WHY}"
            if proof_for(MTP_FP8_KV, version, need, kv) is None:
                reason += (" (MTP with fp8 KV is not yet proven by our engine check"
                           f"{gap_for(MTP_FP8_KV, version, need, kv)}: you asked for fp8 KV)")
        f.fill("--speculative-config", config, reason)
    return spec.draft


def fill_cuda_graphs(f: Filler, launch: dict[str, Any], shape: ModelShape, draft: int, seqs: int,
                     version: str | None = None) -> None:
    """CUDA graphs with MTP on hybrid models, sized for `seqs` x (1 + `draft`) tokens: FULL_AND_PIECEWISE
    where our engine check proved it exact for this release, attention backend and KV dtype
    (data/engine_proofs.json), else the profile's PIECEWISE (the field saw FULL garble output)."""
    if not (draft and shape.is_hybrid):
        return
    if f.user_value("--enforce-eager") is True:
        f.lines.append("cuda graphs: none (--enforce-eager given), so no compilation config is filled")
        return
    backend, kv = f.effective("--attention-backend"), f.effective("--kv-cache-dtype")
    proof = proof_for(MTP_FULL_GRAPHS, version, backend, kv)
    if f.given(COMPILATION):
        raw = json.dumps(f.user.flags.get(COMPILATION, "")) + " ".join(
            f"{k} {v}" for k, v in f.user.flags.items() if k.startswith(COMPILATION + "."))
        if "FULL" in raw.upper() and proof is None:
            f.warnings.append("your compilation config asks FULL CUDA graphs with MTP on a hybrid GDN model: "
                              "that garbled output in the field, and our engine check has not proved it for "
                              f"vLLM {version} with attention {backend or 'auto'} and KV {kv or 'auto'}; use "
                              "cudagraph_mode PIECEWISE")
    if proof is not None:
        mode = "FULL_AND_PIECEWISE"
        why = (f"FULL CUDA graphs with MTP proved exact by our engine check for vLLM {proof.release}, attention "
               f"{proof.attention_backend}, KV {proof.kv_cache_dtype} ({proof.date}, {proof.results})")
    else:
        mode = launch.get("cudagraph_mode", "PIECEWISE")
        why = (f"FULL CUDA graphs with MTP garbled hybrid GDN models in the field, and our engine check has not "
               f"proved them for vLLM {version}, attention {backend or 'auto'}, KV {kv or 'auto'}: {mode}")
    f.fill(COMPILATION, {"cudagraph_mode": mode, "cudagraph_capture_sizes": capture_sizes(seqs, draft)},
           f"{why}, graphs for {seqs} sequence(s) x (1 + {draft}) tokens")
