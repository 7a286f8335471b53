"""The speculative drafter's attention backend: whether a launch's drafter can serve its KV cache
dtype on SM75, judged once for the launcher (with its profile's fill) and a vLLM process (its own
arguments). vLLM never gives the drafter `--attention-backend` (policy/vllm_versions.py:
drafter-picks-own-attention-backend); the rule of which backend it needs is
policy/attention.drafter_backend_needed. Pure."""

from __future__ import annotations

import json
from typing import Any, Sequence

from .. import safe_json
from .attention import drafter_backend_needed
from .fill_base import FilledArg, effective_value
from .vllm_args import VllmArgs

SPECULATIVE = "--speculative-config"
DRAFTER_WHY = ("vLLM never gives the drafter --attention-backend, and its own pick on SM75 (TRITON_ATTN) "
               "refuses fp8 KV from 0.24")
# Methods that load no draft model with attention layers of its own (n-gram lookups, heads on the target).
NO_DRAFT_ATTENTION = frozenset({"ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator"})


def user_speculative_config(args: VllmArgs) -> dict[str, Any] | None:
    """The user's own speculative config: their JSON, or their `--speculative-config.KEY` values;
    None where not given or not a readable object."""
    raw = args.value(SPECULATIVE)
    if isinstance(raw, str):
        try:
            cfg = safe_json.loads(raw)  # bounded nesting: a hostile value cannot recurse
        except safe_json.BadJson:
            return None
        return cfg if isinstance(cfg, dict) else None
    dotted = {k[len(SPECULATIVE) + 1:]: v for k, v in args.flags.items() if k.startswith(SPECULATIVE + ".")}
    return dotted or None


def named_backend(cfg: dict[str, Any] | None) -> str | None:
    """The drafter's attention backend a speculative config names, upper-cased (None: none, or auto)."""
    value = (cfg or {}).get("attention_backend")
    return value.upper() if isinstance(value, str) and value.lower() != "auto" else None


def drafter_failure(version: str | None, args: VllmArgs, filled: Sequence[FilledArg] = ()) -> str | None:
    """Why this launch's drafter cannot start (None: it can, or there is none): its KV cache dtype
    needs a backend it is not named. The user's values win over the filled ones, as in the launch."""
    cfg = user_speculative_config(args)
    if cfg is None and not args.given(SPECULATIVE):
        cfg = next((json.loads(a.value) for a in filled if a.flag == SPECULATIVE and a.value), None)
    if not isinstance(cfg, dict) or str(cfg.get("method", "")).lower() in NO_DRAFT_ATTENTION:
        return None
    kv = effective_value(args, filled, "--kv-cache-dtype") or "auto"
    need = drafter_backend_needed(version, kv)
    named = named_backend(cfg)
    if need is None or named == need:
        return None
    names = f"names attention_backend {named}" if named else "names no attention_backend"
    return (f"speculative decoding with {kv} KV on vLLM {version}: the --speculative-config {names}, so its "
            f"drafter cannot start ({DRAFTER_WHY}): add \"attention_backend\":\"{need}\" to it, or use "
            "--kv-cache-dtype auto")
