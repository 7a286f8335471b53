"""Our `ChunkGatedDeltaRule`: vLLM's op class with our kernel behind `_forward_method`.

vLLM's `CustomOp.__new__` builds the class registered with `ChunkGatedDeltaRule.register_oot`
whenever a GDN layer asks for `ChunkGatedDeltaRule()`. Ours subclasses the release's own class,
so its `__init__` still resolves vLLM's backend (and sets `gdn_prefill_backend`, which 0.22+
layers read). Only where vLLM chose `forward_native` (FLA's Triton kernels; always on SM75) and
the process's dispatch agrees, `_forward_method` becomes our kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

MARK = "_caovan_interface"  # class attribute that identifies our replacement in vLLM's registry


class Controller(Protocol):
    """What the replacement asks the process's dispatch."""

    def take_over(self, op: Any) -> Callable[..., Any] | None:
        """Our kernel when this op instance should use it, else None."""


def build(upstream: type, interface: str, controller: Controller) -> type:
    """A subclass of vLLM's `upstream` op class whose instances ask `controller` at construction."""

    class CaovanChunkGatedDeltaRule(upstream):  # type: ignore[misc, valid-type]
        __doc__ = f"vLLM's ChunkGatedDeltaRule with Caovan's SM75 GDN prefill ({interface})."

        def __init__(self) -> None:
            super().__init__()
            self._caovan_upstream = self._forward_method
            self._caovan_kernel = controller.take_over(self)
            if self._caovan_kernel is not None:
                self._forward_method = self.forward_caovan

        def forward_caovan(self, q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Any = None,
                           output_final_state: bool = False, cu_seqlens: Any = None,
                           chunk_indices: Any = None, chunk_offsets: Any = None,
                           use_qk_l2norm_in_kernel: bool = True, core_attn_out: Any = None,
                           **platform_kwargs: Any) -> Any:
            """Our kernel with vLLM's op signature; a call carrying another platform's metadata
            (e.g. `aiter_prefill_metadata`, 0.32+) goes to vLLM's own method."""
            if any(value is not None for value in platform_kwargs.values()):
                return self._caovan_upstream(
                    q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                    output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                    chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, core_attn_out=core_attn_out,
                    **platform_kwargs)
            return self._caovan_kernel(
                q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, core_attn_out=core_attn_out)

    setattr(CaovanChunkGatedDeltaRule, MARK, interface)
    return CaovanChunkGatedDeltaRule


def register(upstream: type, replacement: type) -> str | None:
    """Register `replacement` for `upstream` once; None on success or when ours is there already,
    else why not (another plugin replaced the op first)."""
    from vllm.model_executor.custom_op import op_registry_oot

    existing = op_registry_oot.get(upstream.__name__)
    if existing is not None:
        if getattr(existing, MARK, None) is not None:
            return None
        return (f"{upstream.__name__} is already replaced by {existing.__module__}."
                f"{existing.__qualname__} (another plugin)")
    upstream.register_oot(replacement)
    return None


def upstream_kernel(op: Any) -> str:
    """A name for the kernel vLLM chose for this op instance: `vllm-triton` (0.22+ names its
    backend), `vllm-fla-triton` (0.21's forward_native) or `vllm-<method>`."""
    backend = getattr(op, "gdn_prefill_backend", None)
    if backend:
        return f"vllm-{backend}"
    method = getattr(getattr(op, "_caovan_upstream", None), "__name__", "forward")
    return "vllm-fla-triton" if method == "forward_native" else f"vllm-{method}"
