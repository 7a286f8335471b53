"""Facts about a model directory: its config.json, checkpoint size on disk, the weight names
in its safetensors index (for MTP weights), and the shape the memory plan needs. Read-only."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
INDEX_FILE = "model.safetensors.index.json"
_MTP_PREFIXES = ("mtp.", "model.mtp.")
_MAX_HEADER = 64 * 2**20  # a safetensors header larger than this is not one we trust


@dataclass
class ModelFacts:
    """What we could read of a model argument. A hub name (not a directory) has `is_dir` False."""

    path: str
    is_dir: bool = False
    checkpoint_bytes: int | None = None
    config: dict[str, Any] | None = None
    # From model.safetensors.index.json (metadata.total_size) or the safetensors headers:
    index_total_bytes: int | None = None
    weight_names: int | None = None      # how many weight names we could read; None: unreadable
    mtp_weights: int | None = None       # of those, how many belong to the MTP head (mtp.*)
    notes: list[str] = field(default_factory=list)

    @property
    def size_bytes(self) -> int | None:
        """The checkpoint size: the weight files on disk, else the index's total_size
        (a directory with only config and index, like examples/models/)."""
        if self.checkpoint_bytes:
            return self.checkpoint_bytes
        return self.index_total_bytes

    @property
    def has_mtp_weights(self) -> bool:
        """True only when the checkpoint's weight names include the MTP head."""
        return bool(self.mtp_weights)


def read_model(path: str) -> ModelFacts:
    """Read `path`'s config.json and add up its weight files. Never raises."""
    p = Path(path).expanduser()
    facts = ModelFacts(path=str(p), is_dir=p.is_dir())
    if not facts.is_dir:
        facts.notes.append(f"{path} is not a local directory; its size and config are unknown")
        return facts
    total = 0
    try:
        for f in p.rglob("*"):
            if f.suffix in _WEIGHT_SUFFIXES and f.is_file():
                total += f.stat().st_size
        facts.checkpoint_bytes = total
    except OSError as err:
        facts.notes.append(f"cannot size the checkpoint: {err}")
    cfg = p / "config.json"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
        facts.config = data if isinstance(data, dict) else None
    except FileNotFoundError:
        facts.notes.append("no config.json in the model directory")
    except (OSError, json.JSONDecodeError) as err:
        facts.notes.append(f"config.json unreadable: {err}")
    _read_weight_names(p, facts)
    return facts


def _safetensors_names(path: Path) -> list[str] | None:
    """Tensor names from one safetensors file's JSON header (first 8 bytes: its length)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                return None
            (length,) = struct.unpack("<Q", head)
            if not 0 < length <= _MAX_HEADER:
                return None
            header = json.loads(fh.read(length).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return [k for k in header if k != "__metadata__"] if isinstance(header, dict) else None


def _read_weight_names(p: Path, facts: ModelFacts) -> None:
    """Count the weight names (and the MTP ones) from the index, else the safetensors headers."""
    index = p / INDEX_FILE
    names: list[str] | None = None
    if index.is_file():
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
            names = list((data.get("weight_map") or {}).keys())
            total = (data.get("metadata") or {}).get("total_size")
            if isinstance(total, (int, float)) and total > 0:
                facts.index_total_bytes = int(total)
        except (OSError, ValueError, AttributeError) as err:
            facts.notes.append(f"{INDEX_FILE} unreadable: {err}")
            names = None
    else:
        found: list[str] = []
        files = sorted(p.glob("*.safetensors"))
        for f in files:
            got = _safetensors_names(f)
            if got is None:
                facts.notes.append(f"{f.name}: safetensors header unreadable")
                return
            found += got
        names = found if files else None
    if names is None:
        return
    facts.weight_names = len(names)
    facts.mtp_weights = sum(1 for n in names if n.startswith(_MTP_PREFIXES))


@dataclass(frozen=True)
class ModelShape:
    """What the launch profiles and the memory plan read from a model's config.json.

    Hybrid models (Qwen3.5/3.6, Qwen3-Next) have full-attention layers, which hold a KV cache
    per token, and Gated DeltaNet (linear-attention) layers, which hold a fixed state per
    sequence. Counts are for the whole model; the memory plan divides by tensor parallelism.
    """

    architecture: str | None
    model_type: str | None
    num_layers: int
    full_attention_layers: int
    linear_attention_layers: int
    num_attention_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int | None = None
    ssm_state_bytes: int = 4            # mamba_ssm_dtype: float32 unless the config says otherwise
    mtp_layers: int = 0                 # MTP layers the config declares (weights may still be absent)
    quant_method: str | None = None
    quant_bits: int | None = None
    max_position_embeddings: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None

    @property
    def is_hybrid(self) -> bool:
        return self.linear_attention_layers > 0

    @property
    def linear_conv_dim(self) -> int | None:
        """Channels of the GDN short convolution: q and k (key heads x key dim each) plus v."""
        if None in (self.linear_num_key_heads, self.linear_key_head_dim,
                    self.linear_num_value_heads, self.linear_value_head_dim):
            return None
        return (2 * self.linear_num_key_heads * self.linear_key_head_dim  # type: ignore[operator]
                + self.linear_num_value_heads * self.linear_value_head_dim)  # type: ignore[operator]


_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def _int(cfg: dict[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def model_shape(config: dict[str, Any] | None) -> ModelShape | None:
    """Parse a config.json (a multimodal one's `text_config` included). None when the config
    lacks the layer count or the attention heads, i.e. it is not a decoder we understand."""
    if not isinstance(config, dict):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    cfg = {**config, **text}  # the language model's values win
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(cfg, "num_attention_heads", "n_head")
    if not layers or not heads:
        return None
    types = cfg.get("layer_types")
    interval = _int(cfg, "full_attention_interval")
    if isinstance(types, list) and len(types) == layers:
        full = sum(1 for t in types if t in ("full_attention", "attention"))
    elif interval:
        full = sum(1 for i in range(layers) if (i + 1) % interval == 0)
    else:
        full = layers
    hidden = _int(cfg, "hidden_size", "n_embd")
    head_dim = _int(cfg, "head_dim") or (hidden // heads if hidden else None)
    archs = config.get("architectures")
    quant = config.get("quantization_config") or cfg.get("quantization_config")
    quant = quant if isinstance(quant, dict) else {}
    ssm_dtype = str(cfg.get("mamba_ssm_dtype") or "float32")
    return ModelShape(
        architecture=archs[0] if isinstance(archs, list) and archs else None,
        model_type=str(config.get("model_type")) if config.get("model_type") else None,
        num_layers=layers, full_attention_layers=full, linear_attention_layers=layers - full,
        num_attention_heads=heads, num_kv_heads=_int(cfg, "num_key_value_heads") or heads, head_dim=head_dim,
        linear_num_key_heads=_int(cfg, "linear_num_key_heads"),
        linear_num_value_heads=_int(cfg, "linear_num_value_heads"),
        linear_key_head_dim=_int(cfg, "linear_key_head_dim"),
        linear_value_head_dim=_int(cfg, "linear_value_head_dim"),
        linear_conv_kernel_dim=_int(cfg, "linear_conv_kernel_dim"),
        ssm_state_bytes=_DTYPE_BYTES.get(ssm_dtype, 4),
        mtp_layers=_int(cfg, "mtp_num_hidden_layers", "num_nextn_predict_layers") or 0,
        quant_method=str(quant["quant_method"]) if quant.get("quant_method") else None,
        quant_bits=_int(quant, "bits", "w_bit", "num_bits"),
        max_position_embeddings=_int(cfg, "max_position_embeddings"),
        hidden_size=hidden, vocab_size=_int(cfg, "vocab_size"))
