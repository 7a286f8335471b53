"""Tiny random-weight models made in code, for real vLLM servers on the CPU (the serve lane).

Nothing is downloaded: the tokenizer is a byte-level BPE trained here with `tokenizers` on a few
lines of text, the config is written by hand, and vLLM starts them with `--load-format dummy`
(random weights). The model's vocabulary is exactly the tokenizer's, so every token the random
model samples decodes to something.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 1024
# A chat template of the Qwen kind: vLLM's chat endpoint needs one.
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Turing cards serve hybrid models with linear attention and full attention layers.",
    "Please answer in one short sentence: what is the capital city of France?",
    "Numbers such as 0 1 2 3 4 5 6 7 8 9 10 100 1000 appear in prompts and replies.",
    "A warmup ladder sends short and long prompts, then several at once, to compile every kernel.",
]


def _tokenizer_json(reserved: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(reserved)])
    return tok.to_str()


def write_qwen3(directory: Path, *, layers: int = 2, kv_heads: int = 1, max_positions: int = 4096,
                reserved: int = 0) -> Path:
    """A dense Qwen3 of `layers` layers (hidden 128, head dim 64: the smallest the CPU attention
    takes) with a trained byte-level tokenizer; returns the folder.

    `reserved` special tokens (`<|reserved_N|>`) are added to the vocabulary: a random model then
    often generates tokens that decode to no text, as real models do with special tokens under
    ignore_eos. `kv_heads` and `max_positions` size the KV cache of one request."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = json.loads(_tokenizer_json(reserved))
    vocab = len(tokenizer["model"]["vocab"]) + sum(1 for t in tokenizer["added_tokens"]
                                                   if t["content"] not in tokenizer["model"]["vocab"])
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    eos = tokenizer["model"]["vocab"].get("<|im_end|>", 2)
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_positions,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
        "chat_template": CHAT_TEMPLATE}))
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": vocab, "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": layers, "num_attention_heads": max(2, kv_heads), "num_key_value_heads": kv_heads, "head_dim": 64,
        "max_position_embeddings": max_positions, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "bos_token_id": None, "eos_token_id": eos, "attention_bias": False}))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return directory


def write_qwen3_next(directory: Path, *, max_positions: int = 4096) -> Path:
    """A hybrid GDN model (Qwen3-Next: 3 Gated DeltaNet layers, 1 full attention, a small MoE) that
    vLLM's CPU build serves in bfloat16 with a float32 SSM state cache (`--mamba-ssm-cache-dtype
    float32`). Qwen3.5/3.6 (`qwen3_5`) cannot even be inspected there: its module imports torchvision."""
    write_qwen3(directory, max_positions=max_positions)
    config = json.loads((directory / "config.json").read_text())
    config.update({
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "num_hidden_layers": 4,
        "full_attention_interval": 4, "attn_output_gate": True, "partial_rotary_factor": 0.25,
        "rope_theta": 10000000.0, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 64,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_value_head_dim": 64,
        "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64, "norm_topk_prob": True, "mlp_only_layers": []})
    (directory / "config.json").write_text(json.dumps(config))
    return directory
