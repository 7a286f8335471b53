"""The memory plan against cases computed by hand (the numbers are written out, not recomputed)."""

from __future__ import annotations

from caovan_vllm_sm75_turbo3.policy.memory_plan import (
    MemoryInputs,
    gdn_state_bytes_per_seq,
    kv_bytes_per_token,
    plan_memory,
)
from caovan_vllm_sm75_turbo3.runtime.model import ModelShape, model_shape, read_model

from helpers.facts import EXAMPLES

QWEN = EXAMPLES / "models" / "qwen3.6-27b-awq"
QWEN_SIZE = 19_547_555_040  # the example index's metadata.total_size


def qwen() -> ModelShape:
    shape = model_shape(read_model(str(QWEN)).config)
    assert shape is not None
    return shape


def llama8b() -> ModelShape:
    # A plain transformer: 32 layers, 32 query / 8 KV heads of 128.
    shape = model_shape({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32,
                         "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
                         "max_position_embeddings": 131072})
    assert shape is not None
    return shape


def test_example_model_shape_is_qwen36_27b():
    s = qwen()
    assert (s.num_layers, s.full_attention_layers, s.linear_attention_layers) == (64, 16, 48)
    assert (s.num_attention_heads, s.num_kv_heads, s.head_dim) == (24, 4, 256)
    assert (s.linear_num_key_heads, s.linear_num_value_heads, s.linear_key_head_dim, s.linear_value_head_dim) == \
        (16, 48, 128, 128)
    assert s.linear_conv_dim == 10240  # 2 x 16 x 128 + 48 x 128, the conv1d width of the real checkpoint
    assert (s.mtp_layers, s.quant_method, s.quant_bits, s.max_position_embeddings) == (1, "awq", 4, 262144)


def test_interval_without_layer_types():
    s = model_shape({"num_hidden_layers": 8, "num_attention_heads": 4, "full_attention_interval": 4,
                     "hidden_size": 256})
    assert s is not None and (s.full_attention_layers, s.linear_attention_layers, s.head_dim) == (2, 6, 64)


def test_kv_and_state_per_gpu_by_hand():
    s = qwen()
    # 16 full layers x 2 (K,V) x (4 KV heads / TP 2) x 256 x 1 B (fp8)
    assert kv_bytes_per_token(s, 2, 1) == 16 * 2 * 2 * 256 == 16_384
    # plus the MTP layer while drafting
    assert kv_bytes_per_token(s, 2, 1, mtp_layers=1) == 17_408
    # TP 8 has fewer KV heads than GPUs: each holds one (replicated)
    assert kv_bytes_per_token(s, 8, 2) == 16 * 2 * 1 * 256 * 2 == 16_384
    # 48 layers x (24 value heads x 128 x 128 x 4 B = 1,572,864 + conv 5120 x 3 x 2 B = 30,720)
    assert gdn_state_bytes_per_seq(s, 2) == 48 * 1_603_584 == 76_972_032
    # with 3 draft tokens: 4 slots
    assert gdn_state_bytes_per_seq(s, 2, slots=4) == 307_888_128
    assert gdn_state_bytes_per_seq(llama8b(), 1) == 0


def test_field_launch_fits_2x22g_fp8():
    # Per GPU: 22528 MiB x 0.9 = 21,260,088,115.2 B; weights 19,547,555,040 / 2 = 9,773,777,520 B;
    # headroom 1536 MiB = 1,610,612,736 B; free = 9,875,697,859.2 B.
    # 2 x (262144 x 17,408 + 307,888,128) = 9,742,581,760 B <= free: the model's full context fits.
    p = plan_memory(qwen(), MemoryInputs(
        gpu_memory_mib=22528, tensor_parallel=2, gpu_memory_utilization=0.9, weights_bytes=QWEN_SIZE,
        headroom_mib=1536, kv_cache_bytes=1, speculative_tokens=3, mtp_layers=1, max_num_seqs=2,
        max_model_len_cap=262144))
    assert p.fits and (p.max_model_len, p.max_num_seqs) == (262144, 2)
    assert round(p.free_mib * 2**20) == 9_875_697_859
    assert any("9,291 MiB of 9,418 MiB: fits" in line for line in p.lines)


def test_fp16_kv_halves_the_context():
    # KV 34,816 B/token; per sequence (9,875,697,859.2 / 2 - 307,888,128) / 34,816 = 132,983.7 tokens,
    # rounded down to a multiple of 1024: 132,096.
    p = plan_memory(qwen(), MemoryInputs(
        gpu_memory_mib=22528, tensor_parallel=2, gpu_memory_utilization=0.9, weights_bytes=QWEN_SIZE,
        headroom_mib=1536, kv_cache_bytes=2, speculative_tokens=3, mtp_layers=1, max_num_seqs=2,
        max_model_len_cap=262144))
    assert p.fits and (p.max_model_len, p.max_num_seqs) == (132096, 2)


def test_fewer_sequences_rather_than_a_useless_context():
    # 1 x 11264 MiB x 0.9 = 10,630,044,057.6 B - 5e9 weights - 1 GiB headroom = 4,556,302,233.6 B free;
    # KV 32 x 2 x 8 x 128 x 2 = 131,072 B/token. 8 seqs: 4,345 tokens each -> 4096 (< 8192), ...
    # 4 seqs: 1,139,075,558.4 / 131,072 = 8,690 -> 8192: the first count with a useful context.
    p = plan_memory(llama8b(), MemoryInputs(
        gpu_memory_mib=11264, tensor_parallel=1, gpu_memory_utilization=0.9, weights_bytes=5_000_000_000,
        headroom_mib=1024, kv_cache_bytes=2, max_num_seqs=8, max_model_len_cap=131072))
    assert (p.max_model_len, p.max_num_seqs) == (8192, 4)
    # The user's max-num-seqs is kept even when the context gets short: 8 x 4096.
    p = plan_memory(llama8b(), MemoryInputs(
        gpu_memory_mib=11264, tensor_parallel=1, gpu_memory_utilization=0.9, weights_bytes=5_000_000_000,
        headroom_mib=1024, kv_cache_bytes=2, max_num_seqs=8, seqs_given=True, max_model_len_cap=131072))
    assert (p.max_model_len, p.max_num_seqs) == (4096, 8)


def test_weights_that_do_not_fit():
    # 19,547,555,040 B on one 11264 MiB card: 18,642 MiB of weights > 10,138 MiB budget.
    p = plan_memory(qwen(), MemoryInputs(
        gpu_memory_mib=11264, tensor_parallel=1, gpu_memory_utilization=0.9, weights_bytes=QWEN_SIZE,
        headroom_mib=1024, kv_cache_bytes=1))
    assert p.fits is False and p.max_model_len is None and p.max_num_seqs is None
    assert any("do not fit" in w and "18,642 MiB" in w for w in p.warnings)


def test_users_context_is_kept_and_checked():
    # One sequence of 1,048,576 tokens x 17,408 B = 18,253,611,008 B + state > 9.2 GiB free: refused.
    p = plan_memory(qwen(), MemoryInputs(
        gpu_memory_mib=22528, tensor_parallel=2, gpu_memory_utilization=0.9, weights_bytes=QWEN_SIZE,
        headroom_mib=1536, kv_cache_bytes=1, speculative_tokens=3, mtp_layers=1, max_model_len=1_048_576))
    assert p.fits is False and p.max_model_len == 1_048_576
    assert any("--max-model-len 1048576" in w and "refuse" in w for w in p.warnings)
    # 65,536 tokens: one sequence needs 65536 x 17,408 + 307,888,128 = 1,448,738,816 B;
    # 9,875,697,859.2 // that = 6 sequences, capped by the target of 4.
    p = plan_memory(qwen(), MemoryInputs(
        gpu_memory_mib=22528, tensor_parallel=2, gpu_memory_utilization=0.9, weights_bytes=QWEN_SIZE,
        headroom_mib=1536, kv_cache_bytes=1, speculative_tokens=3, mtp_layers=1, max_model_len=65536,
        max_num_seqs=4))
    assert p.fits and (p.max_model_len, p.max_num_seqs) == (65536, 4)
    p = plan_memory(qwen(), MemoryInputs(
        gpu_memory_mib=22528, tensor_parallel=2, gpu_memory_utilization=0.9, weights_bytes=QWEN_SIZE,
        headroom_mib=1536, kv_cache_bytes=1, speculative_tokens=3, mtp_layers=1, max_model_len=65536,
        max_num_seqs=16))
    assert p.max_num_seqs == 6


def test_unknown_checkpoint_size_says_so():
    p = plan_memory(qwen(), MemoryInputs(gpu_memory_mib=22528, tensor_parallel=2, gpu_memory_utilization=0.9,
                                         weights_bytes=None, headroom_mib=1536, kv_cache_bytes=1))
    assert p.fits is None and p.max_model_len is None and any("unknown" in w for w in p.warnings)
