"""Whether to install the Turbo hook (sm_75 tensor cores for allowlisted Triton kernels). Pure.

Also the rule that judges one offline check row (`caovan-sm75-kernels check`), so the check
command, its tests and CI apply the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..config import Settings
from ..kernels.turbo.allowlist import Allowlist, KernelEntry, load_allowlist, triton_version_matches
from ..kernels.turbo.protocol import PROTOCOLS
from ..kernels.turbo.spec import SM75_SHARED_LIMIT
from ..runtime.facts import Facts
from ..versions import minor

# Triton releases whose stages-hook protocol and cache key we read and tested the hook against: the
# rows of kernels/turbo/protocol.py, their one home.
HOOK_TRITON_VERSIONS = tuple(PROTOCOLS)
# Our kernels' Triton functions as the allowlist names them: each claim of tensor cores checks its own.
GDN_KERNELS = ("_prep_kernel", "_state_kernel")
# vLLM's own FLA GDN forward kernels (their texts per release: data/turbo_allowlist.json `sources`).
VLLM_GDN_KERNELS = ("chunk_scaled_dot_kkt_fwd_kernel", "merge_16x16_to_64x64_inverse_kernel",
                    "recompute_w_u_fwd_kernel", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "chunk_fwd_kernel_o")
ATTENTION_KERNELS = ("_attn_kernel",)   # its split merge has no products: it needs no tensor cores
FMA_LEFT_MAX = 0.05   # a turbo build may keep at most this share of the plain build's fp32 FMAs


@dataclass(frozen=True)
class TurboDecision:
    """Install the hook or not; `strict` checks versions and source digests per kernel."""

    install: bool
    strict: bool
    line: str      # the `turbo=` status value
    reason: str
    triton: str | None = None   # the Triton version decided for
    # data/turbo_allowlist.json, read once where the hook is installed (None where it is not)
    allowlist: Allowlist | None = field(default=None, compare=False, repr=False)

    @property
    def tensor_cores(self) -> bool:
        """Whether allowlisted kernels (our GDN prefill among them) get tensor cores: the hook is
        installed on a Triton it was verified with. A forced hook on another Triton may still
        build, but nothing there was checked, so no plan may claim acceleration from it."""
        return self.install and self.line in ("auto", "on")

    def serves(self, kernels: tuple[str, ...]) -> bool:
        """Whether these kernels of ours get tensor cores: the hook gives them (`tensor_cores`) and
        each one's allowlist entry lists this Triton (it was compile- and numerically checked there)."""
        if not self.tensor_cores or not self.triton:
            return False
        entries = self._entries()
        return all(n in entries and triton_version_matches(self.triton, entries[n].triton_versions) for n in kernels)

    def serves_vllm_gdn(self, vllm_version: str | None) -> bool:
        """Whether vLLM's own GDN prefill (its FLA kernels) gets tensor cores through the hook: each of
        the release's kernel texts was verified on this Triton."""
        if not self.tensor_cores or not self.triton or not vllm_version:
            return False
        entries = self._entries()
        return all(n in entries and entries[n].covers_release(vllm_version, self.triton) for n in VLLM_GDN_KERNELS)

    def _entries(self) -> dict[str, KernelEntry]:
        """The allowlist's kernels by name (decide_turbo read it once; a decision built by hand reads it here)."""
        allowlist = self.allowlist if self.allowlist is not None else load_allowlist()
        return {k.name: k for k in allowlist.kernels}

    def not_served_reason(self, what: str) -> str:
        """Why `serves` is False for `what` (e.g. "our GDN prefill"), in one clause."""
        if not self.tensor_cores:
            return (f"turbo={self.line} ({self.reason}): without the Turbo hook's tensor cores {what} would run on "
                    "CUDA cores")
        return f"{what} was not verified with Triton {self.triton} (data/turbo_allowlist.json)"


def decide_turbo(facts: Facts, settings: Settings, triton_version: str | None) -> TurboDecision:
    """Decide from the facts (SM75 GPUs), `settings.turbo` (auto|on|off) and Triton's version; where
    the hook is installed, the decision holds the allowlist it reads (loaded here, once)."""
    decision = _decide(facts, settings, triton_version)
    return replace(decision, triton=triton_version, allowlist=load_allowlist() if decision.install else None)


def _decide(facts: Facts, settings: Settings, triton_version: str | None) -> TurboDecision:
    src = settings.source("turbo")
    if settings.turbo == "off":
        return TurboDecision(False, True, "off-by-user", f"turbo off, set by {src}")
    if not settings.active or settings.mode == "guards":
        return TurboDecision(False, True, "off", f"mode={settings.mode} keeps vLLM's own kernels")
    if facts.sm75_count == 0:
        return TurboDecision(False, True, "off-not-sm75", f"no SM75 GPU (sm75=0/{len(facts.gpus)})")
    if not triton_version:
        return TurboDecision(False, True, "off-no-triton", "Triton is not installed")
    verified = minor(triton_version) in HOOK_TRITON_VERSIONS
    if settings.turbo == "on":
        if verified:
            return TurboDecision(True, False, "on", f"turbo on, set by {src}: every allowlisted kernel "
                                 "in a listed config, any source digest")
        return TurboDecision(True, False, f"on-unverified-triton-{triton_version}",
                             f"turbo on, set by {src}, with Triton {triton_version}, which the hook was not "
                             f"verified with ({', '.join(HOOK_TRITON_VERSIONS)}); ptxas still guards each build")
    if not verified:
        return TurboDecision(False, True, f"off-unverified-triton-{triton_version}",
                             f"Triton {triton_version} is not among the verified "
                             f"{', '.join(HOOK_TRITON_VERSIONS)} (CAOVAN_TURBO=on forces it)")
    return TurboDecision(True, True, "auto", f"Triton {triton_version} verified; allowlisted kernels "
                         "with matching source and config get tensor cores")


def judge_turbo_build(shared_bytes: int, spill_bytes: int | None, mma: int, fma: int,
                      plain_fma: int | None) -> list[str]:
    """What is wrong with one turbo build (empty: it passes)."""
    problems = []
    if shared_bytes > SM75_SHARED_LIMIT:
        problems.append(f"shared memory {shared_bytes} > {SM75_SHARED_LIMIT}")
    if spill_bytes is None or spill_bytes > 0:
        problems.append(f"spills {spill_bytes} bytes")
    if mma == 0:
        problems.append("no mma.sync")
    if plain_fma is not None and fma > FMA_LEFT_MAX * plain_fma:
        problems.append(f"{fma} fp32 FMA left (plain build: {plain_fma})")
    return problems
