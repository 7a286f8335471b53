"""One decision per process: settings + facts -> what every installer of ours does. Pure.

`decide()` is the only place the Turbo hook, the GDN gate, our attention backend, `turbo3=`,
guards-only mode and our fixes of upstream bugs are decided. `caovan-vllm-serve` (launch.plan_for_launcher) and each vLLM process
(plugin/context.py) call it once and hand the value on: the plan and banner, the Turbo hook,
the GDN dispatch and the attention backend read it and never decide again, so they cannot
disagree. The vLLM version is parsed once here, into `release`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import Settings
from ..runtime.facts import Facts
from ..runtime.model import ModelShape
from . import vllm_versions as vv
from .accel import GdnState, Turbo3, at_model_load, gdn_state, turbo3_state
from .attention import AttentionState, attention_state
from .turbo import TurboDecision, decide_turbo
from .upstream_bugs import plugin_fixes


@dataclass(frozen=True)
class Decision:
    """What this process does, decided once. `shape` is the model's (None: unknown, judged as the
    hybrid models we target); `kv_cache_dtype` the launch's --kv-cache-dtype (None: vLLM's auto)."""

    settings: Settings
    facts: Facts
    release: vv.Release
    turbo: TurboDecision
    gdn: GdnState
    attention: AttentionState
    turbo3: Turbo3
    shape: ModelShape | None = None
    kv_cache_dtype: str | None = None
    fixes: tuple[str, ...] = ()   # upstream bugs our plugin fixes inside this vLLM (data/upstream_bugs.json)
    model_unknown: str | None = None   # why the model's config could not be read here (None: read, or none named)

    @property
    def active(self) -> bool:
        """Whether the plugin does anything at all (enable and mode)."""
        return self.settings.active

    @property
    def kernels(self) -> bool:
        """Whether our kernels may be installed at all: active and not mode=guards."""
        return self.settings.active and self.settings.mode != "guards"

    def with_kv_cache_dtype(self, kv_cache_dtype: str | None) -> Decision:
        """This decision for a launch whose --kv-cache-dtype a profile filled after it was made:
        `turbo3=` follows the cache format; the Turbo, GDN and attention decisions stay as they are."""
        if kv_cache_dtype == self.kv_cache_dtype:
            return self
        if self.turbo3.pending:   # decided where the model is read, whatever the cache format
            return replace(self, kv_cache_dtype=kv_cache_dtype)
        return replace(self, kv_cache_dtype=kv_cache_dtype,
                       turbo3=turbo3_state(self.facts, self.settings, self.gdn, self.attention, self.shape,
                                           kv_cache_dtype))


def decide_for_model(facts: Facts, shape: ModelShape | None, settings: Settings | None = None) -> Decision:
    """The decision for a machine's facts and a model's shape outside a launch (profile checks,
    tests): default settings unless given, the model read, no KV dtype given."""
    return decide(settings or Settings(), facts, shape)


def decide(settings: Settings, facts: Facts, shape: ModelShape | None = None,
           kv_cache_dtype: str | None = None, model_unknown: str | None = None) -> Decision:
    """Decide everything for these settings and facts (see the module docstring)."""
    release = vv.release(facts.versions.vllm)
    turbo = decide_turbo(facts, settings, facts.versions.triton)
    gdn = gdn_state(facts, settings, release, turbo, shape)
    attention = attention_state(facts, settings, release, turbo)
    t3 = turbo3_state(facts, settings, gdn, attention, shape, kv_cache_dtype)
    if shape is None and model_unknown:
        gdn, t3 = at_model_load(gdn, t3, model_unknown)
    fixes = tuple(b.id for b in plugin_fixes(facts.versions.vllm)) if settings.active else ()
    return Decision(settings, facts, release, turbo, gdn, attention, t3, shape, kv_cache_dtype, fixes,
                    model_unknown if shape is None else None)
