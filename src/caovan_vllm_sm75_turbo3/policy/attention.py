"""Where fp8 KV is served on SM75, and whether our attention backend can serve it: the one home of
the attention rule (launch profiles, turbo3= and the notes read it). Pure."""

from __future__ import annotations

from . import vllm_versions as vv
from .turbo import ATTENTION_KERNELS, TurboDecision

OUR_BACKEND = "CUSTOM"  # the --attention-backend name our backend registers as (plugin/attention)


def vllm_fp8_kv_on_sm75(version: str | None) -> bool:
    """Whether one of this vLLM release's own attention backends serves fp8 KV on SM75."""
    return bool(vv.has("triton-attn-fp8-kv-on-sm75", version) or vv.has("flashinfer-on-sm75", version))


def our_backend_problem(version: str | None, turbo: TurboDecision) -> str | None:
    """Why our attention backend cannot serve fp8 KV with this release and Turbo decision (None: it can)."""
    if vv.attention_family(version) is None or vv.support_status(version) == "too-new":
        return f"vLLM {version} has no attention interface family of ours"
    if not turbo.serves(ATTENTION_KERNELS):
        return turbo.not_served_reason("our attention kernel") + ", so fp8 KV through our backend is not planned"
    return None


def fp8_kv_on_sm75(version: str | None, turbo: TurboDecision | None = None) -> bool:
    """Whether fp8 KV is served on SM75: by vLLM's own backends, or by ours given the Turbo decision."""
    return vllm_fp8_kv_on_sm75(version) or (turbo is not None and our_backend_problem(version, turbo) is None)
