"""Compile and self-check our GDN prefill for this model's shapes before vLLM's profile run.

The first `ChunkGatedDeltaRule` built in a process calls `precompile` (model construction comes
before the profile run and CUDA-graph capture). It reads the shapes from vLLM's config, launches
our kernel once for every compiled variant vLLM's calls can reach (packed sequences with and
without vLLM's `chunk_indices`; one launch at max-num-batched-tokens, at most MAX_LAUNCH_TOKENS)
so Triton compiles them now into the isolated cache, then checks one packed batch (1-token,
exact-chunk and ragged sequences, initial state) against the float64 reference. Any exception
or a wrong number is a `PrecompileError`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import CaovanError
from ...kernels.numerics import rel_error

# fp16 q/k/v and output against a float64 oracle; the kernel keeps state and products in fp32.
SELF_CHECK_RTOL = 1e-2
SELF_CHECK_LENGTHS = (1, 64, 67)  # a 1-token sequence, exactly one chunk, and a ragged one
# The kernels are not specialised on the token count (Triton's do_not_specialize), so a longer
# launch compiles nothing new; the cap keeps the temporary buffers near 1 GiB even when
# max-num-batched-tokens is the whole context (chunked prefill off), before weights are loaded.
MAX_LAUNCH_TOKENS = 16384
_CONFIG_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim")


class PrecompileError(CaovanError):
    """Our kernel could not be compiled, launched or trusted for this model's shapes."""


@dataclass(frozen=True)
class ModelShapes:
    """What one process's GDN prefill calls look like (heads are per tensor-parallel rank)."""

    key_heads: int
    value_heads: int
    head_k: int
    head_v: int
    tp_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    dtype: str  # torch dtype name of q/k/v, e.g. "float16"

    def describe(self) -> str:
        return (f"H={self.key_heads} HV={self.value_heads} K={self.head_k} V={self.head_v} "
                f"TP={self.tp_size} max-num-batched-tokens={self.max_num_batched_tokens} "
                f"max-num-seqs={self.max_num_seqs} {self.dtype}")


@dataclass(frozen=True)
class Batch:
    """One precompile launch: packed sequence lengths, whether vLLM's chunk_indices are passed,
    and whether the result is checked against the float64 reference."""

    lengths: tuple[int, ...]
    chunk_indices: bool
    check: bool = False


@dataclass(frozen=True)
class Report:
    """What precompile did."""

    launches: int
    seconds: float
    max_rel_err: float


def model_shapes(vllm_config: Any) -> ModelShapes:
    """The shapes from vLLM's config (model, parallel and scheduler parts); PrecompileError if absent."""
    hf = vllm_config.model_config.hf_text_config
    missing = [n for n in _CONFIG_FIELDS if not isinstance(getattr(hf, n, None), int)]
    if missing:
        raise PrecompileError(f"the model config has no {', '.join(missing)}")
    tp = int(vllm_config.parallel_config.tensor_parallel_size)
    nk, nv = hf.linear_num_key_heads, hf.linear_num_value_heads
    if nk % tp or nv % tp:
        raise PrecompileError(f"{nk} key / {nv} value heads do not split over tensor-parallel size {tp}")
    sched = vllm_config.scheduler_config
    dtype = str(vllm_config.model_config.dtype).removeprefix("torch.")
    return ModelShapes(nk // tp, nv // tp, hf.linear_key_head_dim, hf.linear_value_head_dim, tp,
                       int(sched.max_num_batched_tokens), int(sched.max_num_seqs), dtype)


def static_check(shapes: ModelShapes, check_inputs: Callable[..., Any]) -> None:
    """The kernel's own argument check on shape-only ("meta") tensors of this model's shapes:
    refuses what the kernel would refuse (head dims, dtype, GQA ratio) without compiling anything."""
    import torch

    meta, T, N = torch.device("meta"), 64, 1
    try:
        dtype = getattr(torch, shapes.dtype)
    except AttributeError:
        raise PrecompileError(f"unknown model dtype {shapes.dtype!r}") from None

    def t(*size: int, dt: Any = dtype) -> Any:
        return torch.empty(*size, dtype=dt, device=meta)
    H, HV, K, V = shapes.key_heads, shapes.value_heads, shapes.head_k, shapes.head_v
    try:
        check_inputs(t(1, T, H, K), t(1, T, H, K), t(1, T, HV, V), t(1, T, HV, dt=torch.float32),
                     t(1, T, HV, dt=torch.float32), t(N, HV, V, K, dt=torch.float32),
                     t(N + 1, dt=torch.int32), None, None)
    except Exception as err:
        raise PrecompileError(f"our kernel does not take this model ({shapes.describe()}): {err}") from err


def plan_batches(shapes: ModelShapes) -> list[Batch]:
    """The launches that compile every variant vLLM can reach, the self-check batch last.

    The kernel pins one config per head-dim pair, whatever the batch, so two launches reach every
    variant: with vLLM's `chunk_indices` (the longest prompt one step holds) and without.
    """
    tokens = min(shapes.max_num_batched_tokens, MAX_LAUNCH_TOKENS)
    batches = [Batch((tokens,), chunk_indices=True)]
    check: list[int] = []
    for length in SELF_CHECK_LENGTHS:  # as many of them as one step may hold
        if sum(check) + length <= tokens:
            check.append(length)
    batches.append(Batch(tuple(check) or (tokens,), chunk_indices=False, check=True))
    return batches


def _chunk_indices(lengths: tuple[int, ...], chunk: int) -> list[list[int]]:
    """vLLM's precomputed (sequence, chunk) pairs for packed sequences."""
    return [[n, c] for n, length in enumerate(lengths) for c in range(math.ceil(length / chunk))]


def _inputs(shapes: ModelShapes, lengths: tuple[int, ...], device: Any, gen: Any) -> dict[str, Any]:
    """Random inputs shaped and scaled as vLLM's GDN layer produces them (q, k L2-normalised)."""
    import torch

    T, H, HV, K, V = sum(lengths), shapes.key_heads, shapes.value_heads, shapes.head_k, shapes.head_v
    dtype = getattr(torch, shapes.dtype)

    def randn(*size: int) -> Any:  # explicit device/dtype: vLLM builds models under its own defaults
        return torch.randn(*size, generator=gen, dtype=torch.float32, device="cpu")

    q = torch.nn.functional.normalize(randn(1, T, H, K), dim=-1)
    k = torch.nn.functional.normalize(randn(1, T, H, K), dim=-1)
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    return {
        "q": q.to(device, dtype), "k": k.to(device, dtype), "v": randn(1, T, HV, V).to(device, dtype),
        "g": (-torch.nn.functional.softplus(randn(1, T, HV))).to(device),  # log decay < 0
        "beta": torch.sigmoid(randn(1, T, HV)).to(device),
        "initial_state": (0.1 * randn(len(lengths), HV, V, K)).to(device),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32, device=device),
    }


def precompile(kernel: Callable[..., Any], reference: Callable[..., Any], shapes: ModelShapes,
               chunk_size: int, device: Any,
               seed: int | None = None) -> Report:
    """Launch `kernel` for every planned batch on `device`; check the last against `reference`.

    Raises PrecompileError with the reason (the kernel's own exception text included).
    """
    import torch

    gen = torch.Generator().manual_seed(seed if seed is not None else int(time.time_ns() % 2**31))
    start = time.monotonic()
    worst = 0.0
    batches = plan_batches(shapes)
    for batch in batches:
        x = _inputs(shapes, batch.lengths, device, gen)
        if batch.chunk_indices:
            x["chunk_indices"] = torch.tensor(_chunk_indices(batch.lengths, chunk_size),
                                              dtype=torch.int32, device=device)
        what = f"{len(batch.lengths)} sequence(s), {sum(batch.lengths)} tokens"
        # Poisoned: a kernel that leaves any output element unwritten fails the check.
        out = torch.full((sum(batch.lengths), shapes.value_heads, shapes.head_v), math.nan,
                         dtype=x["v"].dtype, device=device)
        try:
            o, final = kernel(**x, output_final_state=True, use_qk_l2norm_in_kernel=False, core_attn_out=out)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as err:  # the reason goes into the one failure line
            raise PrecompileError(f"precompile launch for {what} ({shapes.describe()}) raised "
                                  f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err
        if not (torch.isfinite(out).all() and torch.isfinite(final).all()):
            raise PrecompileError(f"precompile launch for {what} left NaN/inf in the output or final state")
        if batch.check:
            cpu = {n: t.cpu() for n, t in x.items()}
            with torch.device("cpu"):  # the reference allocates with the default device
                ref_o, ref_s = reference(**cpu, output_final_state=True)
            err_o, err_s = rel_error(o, ref_o), rel_error(final, ref_s)
            worst = max(worst, err_o, err_s)
            if not (err_o <= SELF_CHECK_RTOL and err_s <= SELF_CHECK_RTOL):
                raise PrecompileError(
                    f"precompile self-check against the float64 reference failed for {what}: relative error "
                    f"output {err_o:.2e}, final state {err_s:.2e} (budget {SELF_CHECK_RTOL:.0e})")
    if device.type == "cuda":
        torch.cuda.empty_cache()  # give the buffers back before vLLM measures memory
    return Report(len(batches), time.monotonic() - start, worst)
