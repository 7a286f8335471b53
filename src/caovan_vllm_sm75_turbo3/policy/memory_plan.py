"""The memory arithmetic behind a launch: which max-model-len and max-num-seqs fit one GPU.

Per GPU, vLLM may use `total x gpu-memory-utilization`. From that go the weights (checkpoint
size / tensor parallel size) and a headroom for activations, CUDA graphs and the sampler; the
rest holds the KV cache of the full-attention layers (per token) and the Gated DeltaNet state
of the linear-attention layers (per sequence, independent of its length). We size
`max-num-seqs` sequences of `max-model-len` tokens to fit at once: stricter than vLLM's own
start check (one sequence of max-model-len), so a full batch of long requests never preempts.
vLLM's profile run at start measures the real numbers; this plan explains the choice.
Pure arithmetic, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.model import ModelShape

MIB = 2**20
CONTEXT_STEP = 1024      # a filled max-model-len is a multiple of this (or the cap itself)
MIN_USEFUL_CONTEXT = 8192  # below this, fewer concurrent sequences are the better trade


@dataclass(frozen=True)
class MemoryInputs:
    """What the arithmetic needs besides the model's shape. Values the user gave are fixed."""

    gpu_memory_mib: int             # the smallest GPU the model is split over
    tensor_parallel: int
    gpu_memory_utilization: float
    weights_bytes: int | None       # the whole checkpoint (on disk, or the index's total_size)
    headroom_mib: int
    kv_cache_bytes: int             # per element: 1 for fp8, 2 for fp16
    state_conv_bytes: int = 2       # the GDN convolution state is kept in the model dtype (fp16)
    speculative_tokens: int = 0     # MTP draft tokens (0: no speculative decoding)
    mtp_layers: int = 0             # MTP layers that hold a KV cache while drafting
    max_num_seqs: int = 1           # the target (or the user's value when `seqs_given`)
    seqs_given: bool = False
    max_model_len: int | None = None  # the user's value, kept as given
    max_model_len_cap: int | None = None  # upper bound for a filled value (model limit, profile cap)
    pipeline_parallel: int = 1      # stages: each GPU holds its stage's layers (the largest stage is planned)


@dataclass(frozen=True)
class MemoryPlan:
    """The result: values that fit (None where nothing can be said) and the arithmetic as lines."""

    fits: bool | None
    max_model_len: int | None
    max_num_seqs: int | None
    kv_bytes_per_token: int
    state_bytes_per_seq: int
    free_mib: float | None
    lines: tuple[str, ...]
    warnings: tuple[str, ...] = ()


def kv_heads_per_gpu(shape: ModelShape, tp: int) -> int:
    """KV heads one GPU holds: split over TP, replicated when there are fewer heads than GPUs."""
    return max(1, (shape.num_kv_heads or 0) // tp)


def stage_layers(layers: int, pp: int) -> int:
    """Layers of the largest pipeline stage (vLLM splits them evenly, the remainder to some stages)."""
    return -(-layers // max(pp, 1))


def kv_bytes_per_token(shape: ModelShape, tp: int, elem_bytes: int, mtp_layers: int = 0, pp: int = 1) -> int:
    """KV cache bytes per token on one GPU: full-attention layers of its stage (plus MTP layers
    while drafting, on the last stage) x K and V x KV heads per GPU x head dim x element size.
    Linear-attention layers hold no per-token cache."""
    layers = stage_layers(shape.full_attention_layers, pp) + mtp_layers
    return layers * 2 * kv_heads_per_gpu(shape, tp) * (shape.head_dim or 0) * elem_bytes


def gdn_state_bytes_per_seq(shape: ModelShape, tp: int, conv_bytes: int = 2, slots: int = 1, pp: int = 1) -> int:
    """Gated DeltaNet state per sequence on one GPU, for `slots` copies (speculative decoding
    keeps one per draft position): per linear-attention layer, the recurrent state
    (value heads / TP x key dim x value dim, in mamba_ssm_dtype, fp32 by default) and the
    short-convolution state (conv channels / TP x (kernel - 1), in the model dtype)."""
    if not shape.is_hybrid:
        return 0
    v_heads = (shape.linear_num_value_heads or 0) // tp
    recurrent = v_heads * (shape.linear_key_head_dim or 0) * (shape.linear_value_head_dim or 0) * shape.ssm_state_bytes
    conv = ((shape.linear_conv_dim or 0) // tp) * max(0, (shape.linear_conv_kernel_dim or 1) - 1) * conv_bytes
    return stage_layers(shape.linear_attention_layers, pp) * (recurrent + conv) * slots


def _mib(n: float) -> str:
    return f"{n / MIB:,.0f} MiB"


def _round_context(tokens: int) -> int:
    return tokens - tokens % CONTEXT_STEP if tokens >= CONTEXT_STEP else tokens - tokens % 16


@dataclass(frozen=True)
class _Sizes:
    """Per GPU: the KV cache per token, the GDN state per sequence and the state's slots."""

    kv: int
    state: int
    slots: int


def _sizes(shape: ModelShape, m: MemoryInputs) -> _Sizes:
    """KV bytes per token and GDN state bytes per sequence on one GPU for these inputs."""
    slots = 1 + m.speculative_tokens
    pp = m.pipeline_parallel
    kv = kv_bytes_per_token(shape, m.tensor_parallel, m.kv_cache_bytes, m.mtp_layers if m.speculative_tokens else 0, pp)
    return _Sizes(kv, gdn_state_bytes_per_seq(shape, m.tensor_parallel, m.state_conv_bytes, slots, pp), slots)


def _free_lines(m: MemoryInputs, budget: float, weights_bytes: int) -> tuple[float, float, list[str]]:
    """The weights per GPU, what is left for KV cache and state, and the lines that show it."""
    tp, pp = m.tensor_parallel, m.pipeline_parallel
    weights = weights_bytes / (tp * pp)
    free = budget - weights - m.headroom_mib * MIB
    split = f"TP {tp}" + (f" x PP {pp} (the first and last stage also hold the embedding and LM head)" if pp > 1 else "")
    return weights, free, [
        f"memory: weights {weights_bytes:,} B / {split} = {_mib(weights)} per GPU",
        f"memory: headroom {m.headroom_mib:,} MiB per GPU (activations, CUDA graphs, sampler)",
        f"memory: free for KV cache and state = {_mib(budget)} - {_mib(weights)} - "
        f"{m.headroom_mib:,} MiB = {_mib(free)} per GPU"]


def _size_lines(shape: ModelShape, m: MemoryInputs, z: _Sizes) -> list[str]:
    """The KV-per-token line and, on hybrid models, the GDN-state-per-sequence line."""
    tp = m.tensor_parallel
    mtp_kv = m.mtp_layers if m.speculative_tokens else 0
    pp = m.pipeline_parallel
    stage = f" of the largest of {pp} stages" if pp > 1 else ""
    layers_txt = f"{stage_layers(shape.full_attention_layers, pp)} full-attention layers{stage}" + (
        f" + {mtp_kv} MTP layer{'s' if mtp_kv > 1 else ''}" if mtp_kv else "")
    lines = [f"memory: KV per token per GPU = {layers_txt} x 2 (K, V) x "
             f"{kv_heads_per_gpu(shape, tp)} KV heads x {shape.head_dim} head dim x "
             f"{m.kv_cache_bytes} B = {z.kv:,} B"]
    if z.state:
        v_heads = (shape.linear_num_value_heads or 0) // tp
        conv_ch = (shape.linear_conv_dim or 0) // tp
        lines.append(
            f"memory: GDN state per sequence per GPU = {stage_layers(shape.linear_attention_layers, pp)} "
            f"linear-attention layers{stage} x "
            f"({v_heads} value heads x {shape.linear_key_head_dim} x {shape.linear_value_head_dim} x "
            f"{shape.ssm_state_bytes} B + conv {conv_ch} x {max(0, (shape.linear_conv_kernel_dim or 1) - 1)} x "
            f"{m.state_conv_bytes} B) x {z.slots} slot{'s' if z.slots > 1 else ''}"
            + (f" (1 + {m.speculative_tokens} speculative)" if m.speculative_tokens else "")
            + f" = {_mib(z.state)}")
    return lines


def _need(z: _Sizes, tokens: int, seqs: int) -> float:
    """Bytes per GPU for `seqs` sequences of `tokens` tokens."""
    return seqs * (tokens * z.kv + z.state)


def _fit_given_length(m: MemoryInputs, z: _Sizes, free: float) -> tuple[int, int] | str:
    """(length, sequences) for the user's max-model-len, or the warning when one sequence does not fit."""
    length = m.max_model_len or 0
    one = _need(z, length, 1)
    if one > free:
        return (f"--max-model-len {length} needs {_mib(one)} per GPU for one sequence, "
                f"{_mib(free)} are free: vLLM will refuse to start; lower it or raise gpu-memory-utilization")
    fit_seqs = int(free // one)
    return length, (m.max_num_seqs if m.seqs_given else max(1, min(m.max_num_seqs, fit_seqs)))


def _fit_longest(m: MemoryInputs, z: _Sizes, free: float) -> tuple[int, int]:
    """(length, sequences): the longest context for the target sequences, trading sequences
    (when not given) for a context of at least MIN_USEFUL_CONTEXT; length 0 when none fits."""
    seqs = max(1, m.max_num_seqs)
    cap = m.max_model_len_cap

    def longest(s: int) -> int:
        per_seq = free / s - z.state
        return _round_context(int(per_seq // z.kv)) if z.kv and per_seq > 0 else 0

    length = longest(seqs)
    while not m.seqs_given and seqs > 1 and length < min(MIN_USEFUL_CONTEXT, cap or MIN_USEFUL_CONTEXT):
        seqs -= 1  # rather fewer sequences than a context too short to use
        length = longest(seqs)
    if length > 0 and cap is not None and length >= cap:
        length = cap
    return length, seqs


def plan_memory(shape: ModelShape, m: MemoryInputs) -> MemoryPlan:
    """Choose max-model-len and max-num-seqs that fit (the user's values are kept and checked)."""
    z = _sizes(shape, m)
    budget = m.gpu_memory_mib * MIB * m.gpu_memory_utilization
    lines = [f"memory: per GPU {m.gpu_memory_mib:,} MiB x gpu-memory-utilization "
             f"{m.gpu_memory_utilization:g} = {_mib(budget)} for vLLM"]

    def plan(fits: bool | None, length: int | None, seqs: int | None, free: float | None, *warnings: str) -> MemoryPlan:
        return MemoryPlan(fits, length, seqs, z.kv, z.state, free, tuple(lines), tuple(warnings))

    if m.weights_bytes is None:
        return plan(None, m.max_model_len, None, None, "checkpoint size unknown (not a local model directory): "
                    "max-model-len and max-num-seqs are left to vLLM")
    weights, free, free_lines = _free_lines(m, budget, m.weights_bytes)
    lines += free_lines + _size_lines(shape, m, z)
    if free <= 0:
        return plan(False, m.max_model_len, None, free / MIB,
                    f"the weights ({_mib(weights)} per GPU) and the headroom do not fit "
                    f"{_mib(budget)}: use a smaller (quantised) checkpoint or more GPUs (tensor parallel)")
    if m.max_model_len is not None:
        fitted = _fit_given_length(m, z, free)
        if isinstance(fitted, str):
            return plan(False, m.max_model_len, m.max_num_seqs if m.seqs_given else None, free / MIB, fitted)
        length, seqs = fitted
    else:
        length, seqs = _fit_longest(m, z, free)
        if length <= 0:
            return plan(False, None, seqs, free / MIB, f"{seqs} sequence state(s) alone ({_mib(seqs * z.state)}) "
                        f"do not fit {_mib(free)}: lower max-num-seqs or use more GPUs")
    total = _need(z, length, seqs)
    verdict = "fits" if total <= free else "does not fit at once (vLLM queues or preempts the rest)"
    lines.append(f"memory: {seqs} sequence{'s' if seqs > 1 else ''} x ({length:,} tokens x {z.kv:,} B"
                 + (f" + {_mib(z.state)}" if z.state else "") + f") = {_mib(total)} of {_mib(free)}: {verdict}")
    if m.max_model_len is None and m.max_model_len_cap is not None and length == m.max_model_len_cap:
        lines.append(f"memory: max-model-len {length:,} is the upper bound (the model's or the profile's limit)")
    return plan(total <= free, length, seqs, free / MIB)
