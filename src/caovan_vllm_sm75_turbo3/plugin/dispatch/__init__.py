"""Our GDN prefill inside vLLM: one module per vLLM interface family, detected from the
installed vLLM, registered through `ChunkGatedDeltaRule.register_oot`, precompiled and
self-checked before vLLM's profile run, and reported in one line (`gdn_legacy=...`)."""

from .controller import current_state, install
from .state import DispatchState

__all__ = ["DispatchState", "current_state", "install"]
