"""Facts about a model directory: its config.json, checkpoint size on disk, the weight names
in its safetensors index (for MTP weights), and the shape the memory plan needs. Read-only."""

from __future__ import annotations

import errno
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import safe_json
from ..errors import ModelError
from ..textsafe import shown
from .model_source import find_model

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
INDEX_FILE = "model.safetensors.index.json"
_MTP_PREFIXES = ("mtp.", "model.mtp.")
_MAX_HEADER = 64 * 2**20  # a safetensors header larger than this is not one we trust
_HEADERS_BUDGET = 256 * 2**20  # all headers of a directory together (a real one: a few MiB)
_MAX_JSON = 16 * 2**20  # config.json and the index (a real index: a few MiB)
_MAX_ENTRIES = 100_000  # top-level directory entries we look at
_MAX_BYTES = 2**60  # 1 EiB: no checkpoint is larger
_LAYERS = (0, 10_000)  # the shape arithmetic loops over layers: bound it
# The config.json numbers the memory plan reads, and the range a real model's value lies in.
_CONFIG_RANGES: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "full_attention_interval",
                     "mtp_num_hidden_layers", "num_nextn_predict_layers"), _LAYERS),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_key_value_heads", "linear_num_key_heads",
                     "linear_num_value_heads", "head_dim", "hidden_size", "n_embd", "linear_key_head_dim",
                     "linear_value_head_dim", "linear_conv_kernel_dim"), (0, 2**24)),
    "vocab_size": (0, 2**31), "max_position_embeddings": (1, 2**31)}


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
    found: str = "a local folder"        # where the files were found (runtime/model_source.py), in words

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
    """Read `path`'s config.json and add up its weight files.

    What cannot be read (a missing, non-UTF-8, non-JSON or too deeply nested file, a FIFO or a
    device where a file belongs) is unknown and noted. Only the directory's top level is listed,
    so a path like `/` cannot walk the disk. Raises ModelError (exit 2) for a value in a file
    we could read that no model can have (a layer count over 10,000, a negative or infinite
    size), naming the file and the key.
    """
    p = Path(path).expanduser()
    try:
        is_dir = p.is_dir()
    except OSError as err:   # ENAMETOOLONG, ELOOP ...: an operating-system limit, bad input
        raise ModelError(f"the model path {shown(str(p), 120)} cannot be checked: {err.strerror or err}"
                         + (" (a path component is over 255 bytes)" if err.errno == errno.ENAMETOOLONG else "")
                         ) from None
    facts = ModelFacts(path=str(p), is_dir=is_dir)
    if not facts.is_dir:
        facts.notes.append(f"{path} is not a local directory; its size and config are unknown")
        return facts
    shards = _size_weights(p, facts)
    cfg = p / "config.json"
    data = _read_json(cfg, facts)
    if isinstance(data, dict):
        _check_numbers(data, _CONFIG_RANGES, cfg)
        if isinstance(data.get("text_config"), dict):
            _check_numbers(data["text_config"], _CONFIG_RANGES, cfg, "text_config.")
        facts.config = data
    _read_weight_names(p, shards, facts)
    return facts


def read_model_arg(name: str, env: Mapping[str, str], revision: str | None = None,
                   download_dir: str | None = None) -> ModelFacts:
    """read_model for vLLM's model argument as vLLM finds it (a local folder, the Hugging Face or
    ModelScope cache, a GGUF file: runtime/model_source.py), without downloading anything."""
    src = find_model(name, env, revision, download_dir)
    if src.folder is None:
        return ModelFacts(path=name, is_dir=False, notes=[f"{shown(name, 120)}: {src.how}"], found=src.how)
    facts = read_model(str(src.folder))
    facts.found = src.how
    if src.folder != Path(name).expanduser():
        facts.notes.insert(0, f"{shown(name, 120)} found in {src.how}")
    return facts


def _read_json(path: Path, facts: ModelFacts) -> Any:
    """A model file's JSON, or None with a note (missing, unreadable, not a regular file)."""
    try:
        return safe_json.load_file(path, _MAX_JSON, finite=False)
    except FileNotFoundError:
        if path.name == "config.json":
            facts.notes.append("no config.json in the model directory")
    except OSError as err:
        facts.notes.append(f"{path.name} unreadable: {err.strerror or err}")
    except safe_json.BadJson as err:
        facts.notes.append(f"{path.name} unreadable: it {err}; skipped")
    return None


def _check_numbers(data: dict[str, Any], ranges: dict[str, tuple[int, int]], file: Path,
                   prefix: str = "") -> None:
    """ModelError for a number under a key we read that is not a whole number in its range.
    Other types are left alone: the readers treat them as unknown."""
    for key, (lo, hi) in ranges.items():
        v = data.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not (math.isfinite(v) and float(v).is_integer() and lo <= v <= hi):
            raise ModelError(f"{file}: key '{prefix}{key}' must be a whole number from {lo} to {hi}, "
                             f"not {safe_json.short(v)}")


def _size_weights(p: Path, facts: ModelFacts) -> list[Path]:
    """Add up the weight files at the directory's top level; return its safetensors files."""
    total, shards = 0, []
    try:
        with os.scandir(p) as entries:
            for n, entry in enumerate(entries):
                if n >= _MAX_ENTRIES:
                    facts.notes.append(f"more than {_MAX_ENTRIES} entries in {p}: the checkpoint size is unknown")
                    return sorted(shards)
                if not entry.name.endswith(_WEIGHT_SUFFIXES):
                    continue
                if not entry.is_file():   # a FIFO, a device, a directory: never read, never sized
                    kind = safe_json.file_kind(os.stat(entry.path).st_mode) if os.path.exists(entry.path) \
                        else "a broken link"
                    facts.notes.append(f"{entry.name} is not a regular file ({kind}): skipped")
                    continue
                total += entry.stat().st_size
                if entry.name.endswith(".safetensors"):
                    shards.append(Path(entry.path))
        facts.checkpoint_bytes = total
    except OSError as err:
        facts.notes.append(f"cannot size the checkpoint: {err}")
    return sorted(shards)


def _safetensors_names(path: Path, budget: list[int]) -> list[str]:
    """Tensor names from one safetensors file's JSON header (first 8 bytes: its length).
    `budget` is the header bytes left to read for the whole directory. Raises BadJson, OSError."""
    fd, size = safe_json.open_regular(path)
    try:
        head = safe_json.read_fd(fd, 8)
        if len(head) != 8:
            raise safe_json.BadJson("is shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if not 0 < length <= min(_MAX_HEADER, size - 8):
            raise safe_json.BadJson(f"declares a {length}-byte header in a {size}-byte file")
        if length > budget[0]:
            raise safe_json.BadJson(f"headers add up to more than {_HEADERS_BUDGET // 2**20} MiB")
        budget[0] -= length
        raw = safe_json.read_fd(fd, length)
    finally:
        os.close(fd)
    header = safe_json.loads(safe_json.decode(raw), finite=False)
    if not isinstance(header, dict):
        raise safe_json.BadJson("has a header that is not a JSON object")
    return [k for k in header if k != "__metadata__"]


def _read_weight_names(p: Path, shards: list[Path], facts: ModelFacts) -> None:
    """Count the weight names (and the MTP ones) from the index, else the safetensors headers."""
    index = p / INDEX_FILE
    names: list[str] | None = None
    if os.path.lexists(index):
        data = _read_json(index, facts)
        if not isinstance(data, dict):
            return
        weight_map, metadata = data.get("weight_map"), data.get("metadata")
        if isinstance(metadata, dict):
            _check_numbers(metadata, {"total_size": (0, _MAX_BYTES)}, index, "metadata.")
            total = metadata.get("total_size")
            if isinstance(total, (int, float)) and not isinstance(total, bool) and total > 0:
                facts.index_total_bytes = int(total)
        if not isinstance(weight_map, dict):
            facts.notes.append(f"{INDEX_FILE} unreadable: its weight_map is not an object")
            return
        names = list(weight_map)
    else:
        found: list[str] = []
        budget = [_HEADERS_BUDGET]
        for f in shards:
            try:
                found += _safetensors_names(f, budget)
            except (OSError, safe_json.BadJson) as err:
                facts.notes.append(f"{f.name}: safetensors header unreadable ({getattr(err, 'strerror', None) or err})")
                return
        names = found if shards else None
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
