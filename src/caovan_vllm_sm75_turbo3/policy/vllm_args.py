"""Read the user's `vllm serve` arguments without vLLM: which flags were given, their values,
and the `--additional-config` JSON. Pure; the argv itself is never rewritten.

We spell flags the way vLLM 0.21's `FlexibleArgumentParser` does: `--max_model_len` is
`--max-model-len` (underscores before the first `.` become dashes), `--flag=value` and
`--flag value` are the same, `--no-flag` is the negative of `--flag`, and
`--additional-config.key value` sets one key of the JSON (vLLM merges those into one
object that replaces a plain `--additional-config`, because it is appended last).
Without vLLM's tables we cannot know which flags take no value, so a bare flag followed by
a word records that word as its value; only the flags whose values we read matter, and
those always take one.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import safe_json
from ..config import parse_additional_config
from ..errors import SettingError

MODEL_FLAG = "--model"

ADDITIONAL_CONFIG = "--additional-config"

# vLLM 0.21's short aliases (a test checks them against vLLM's real parser).
SHORT_ALIASES: dict[str, str] = {
    "-asc": "--api-server-count", "-q": "--quantization", "-pp": "--pipeline-parallel-size",
    "-n": "--nnodes", "-r": "--node-rank", "-tp": "--tensor-parallel-size",
    "-dcp": "--decode-context-parallel-size", "-pcp": "--prefill-context-parallel-size",
    "-dp": "--data-parallel-size", "-dpn": "--data-parallel-rank", "-dpr": "--data-parallel-start-rank",
    "-dpl": "--data-parallel-size-local", "-dpa": "--data-parallel-address",
    "-dpp": "--data-parallel-rpc-port", "-dpb": "--data-parallel-backend",
    "-dph": "--data-parallel-hybrid-lb", "-dpe": "--data-parallel-external-lb",
    "-ep": "--enable-expert-parallel", "-sc": "--speculative-config", "-cc": "--compilation-config",
    "-ac": "--attention-config",
}
_NUMBER = re.compile(r"^-\d")


@dataclass(frozen=True)
class VllmArgs:
    """The user's vLLM arguments as given, and what we read from them."""

    argv: tuple[str, ...]
    model: str | None
    # canonical long flag -> its last value: a string, or True for a bare flag, False for --no-flag
    flags: dict[str, str | bool] = field(default_factory=dict)
    additional_config: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def given(self, flag: str) -> bool:
        """Whether the user gave `flag` (long spelling, e.g. `--max-model-len`) in any form."""
        return canonical(flag) in self.flags

    def value(self, flag: str) -> str | bool | None:
        """The value the user gave for `flag`, or None when not given."""
        return self.flags.get(canonical(flag))


def canonical(name: str) -> str:
    """The long spelling vLLM's parser resolves `name` to (without any `=value`)."""
    if name in SHORT_ALIASES:
        return SHORT_ALIASES[name]
    if not name.startswith("--"):
        return name
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def _json_value(text: str) -> Any:
    """A dotted `--json-arg.key value` value as vLLM reads it: JSON when it parses, else the string.
    Strict JSON (no NaN, at most 64 levels), so nothing later recurses without bound."""
    try:
        return safe_json.loads(text)
    except safe_json.BadJson:
        return text


def _set_nested(target: dict[str, Any], keys: list[str], value: Any) -> None:
    for k in keys[:-1]:
        nxt = target.get(k)
        if not isinstance(nxt, dict):
            nxt = target[k] = {}
        target = nxt
    target[keys[-1]] = value


def _set_dotted(dotted: dict[str, Any], token: str, name: str, value: str | bool) -> None:
    """One `--additional-config.KEY value` into `dotted` (SettingError for a missing value or key)."""
    keys = name[len(ADDITIONAL_CONFIG) + 1:].split(".")
    if value is True or not all(keys):
        raise SettingError(f"{token} needs a value, e.g. {ADDITIONAL_CONFIG}.caovan_mode auto.")
    if len(keys) > safe_json.MAX_DEPTH:
        raise SettingError(f"{ADDITIONAL_CONFIG}.KEY takes at most {safe_json.MAX_DEPTH} dotted "
                           f"levels, not {len(keys)}.")
    _set_nested(dotted, keys, _json_value(str(value)))


def read_vllm_args(argv: Sequence[str], expanded: Sequence[str] | None = None) -> VllmArgs:
    """Read `argv` (the arguments after `vllm serve`). Raises SettingError for a malformed
    `--additional-config` (invalid JSON, not an object, a dotted key without a value).

    `expanded` is `argv` with a `--config FILE` replaced by the file's arguments (runtime/config_file.py,
    read by the caller: this module does no I/O); what is read comes from it, `argv` stays as given."""
    args = tuple(expanded if expanded is not None else argv)
    flags: dict[str, str | bool] = {}
    plain_config: str | None = None
    dotted: dict[str, Any] = {}
    notes: list[str] = []
    model = args[0] if args and not args[0].startswith("-") else None
    model_flag: str | None = None   # the last --model: argparse keeps the last; the positional wins over it
    i = 1 if model is not None else 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("-") or _NUMBER.match(token) or token == "-":
            continue  # a stray word (a value of a bare flag before it, or a positional)
        name, eq, inline = token.partition("=")
        name = canonical(name)
        if eq:
            value: str | bool = inline
        elif i < len(args) and (not args[i].startswith("-") or _NUMBER.match(args[i])):
            value = args[i]
            i += 1
        else:
            value = True
        if name.startswith(ADDITIONAL_CONFIG + "."):
            _set_dotted(dotted, token, name, value)
            continue
        if name == ADDITIONAL_CONFIG:
            if value is True:
                raise SettingError(f"{ADDITIONAL_CONFIG} needs a JSON object, e.g. "
                                   f"{ADDITIONAL_CONFIG} '{{\"caovan\":true}}'.")
            plain_config = str(value)
        if name == "--model" and isinstance(value, str):
            model_flag = value
        if name.startswith("--no-") and value is True:
            flags[canonical("--" + name[5:])] = False
        flags[name] = value
    model = model if model is not None else model_flag
    if plain_config is not None:
        config = parse_additional_config(plain_config)  # validated even when dotted keys replace it
    else:
        config = {}
    if dotted:
        if plain_config is not None:
            notes.append(f"{ADDITIONAL_CONFIG}.KEY arguments replace the plain {ADDITIONAL_CONFIG} "
                         "JSON (vLLM appends them last); we read what vLLM will read")
        config = dotted
        flags[ADDITIONAL_CONFIG] = json.dumps(dotted)
    if expanded is not None and tuple(expanded) != tuple(argv):
        notes.append(f"--config FILE: its {len(args) - len(argv) + 2} argument word(s) read as vLLM reads them "
                     "(the command line wins over the file)")
    return VllmArgs(argv=tuple(argv), model=model, flags=flags, additional_config=config, notes=tuple(notes))


def serve_args(argv: Sequence[str]) -> list[str]:
    """The `vllm serve` arguments of a process's command line (`sys.argv`); [] for anything else.

    `vllm serve ARGS` and vLLM's `api_server.py ARGS` entry point both count.
    """
    if len(argv) > 1 and argv[1] == "serve":
        return list(argv[2:])
    if argv and os.path.basename(argv[0]) == "api_server.py":
        return list(argv[1:])
    return []


# --- the launch check: the user's numbers, read as vLLM 0.21's parser reads them -----------------

AUTO_LEN = -1  # `--max-model-len auto` / `-1`: vLLM fits the length to the memory at start
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_int(text: str) -> int:
    """A whole number as vLLM's `--max-num-batched-tokens` takes it: `8192`, `32k` (32,000),
    `25.6k` (25,600), `32K` (32,768; no decimals with the binary suffixes). Raises ValueError."""
    text = text.strip()
    m = _HUMAN.fullmatch(text)
    if m is None:
        return int(text)
    number, suffix = m.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    return int(number) * _BINARY[suffix]  # a decimal before K/M/G/T is a ValueError, as in vLLM


def human_int_or_auto(text: str) -> int:
    """`--max-model-len` as vLLM reads it: `human_int`, or `auto`/`-1` (AUTO_LEN)."""
    return AUTO_LEN if text.strip().lower() in ("auto", "-1") else human_int(text)


@dataclass(frozen=True)
class LaunchNumbers:
    """The user's numeric vLLM arguments, checked (None: not given)."""

    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    nnodes: int | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None          # AUTO_LEN for auto
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None


@dataclass(frozen=True)
class ArgRule:
    """How vLLM 0.21 parses one flag, and the range that is not nonsense."""

    flag: str
    parse: Callable[[str], int | float]
    ok: Callable[[float], bool]
    accepted: str


_WHOLE = "a whole number >= 1"
_TOKENS = "a whole number >= 1 (32k = 32,000, 32K = 32,768)"
# flag -> parser and accepted range; the field of LaunchNumbers is the flag's name. vLLM itself
# takes 0 and negative numbers for several of these and fails later (or divides by them).
ARG_RULES: tuple[ArgRule, ...] = (
    ArgRule("--tensor-parallel-size", int, lambda v: v >= 1, _WHOLE),
    ArgRule("--pipeline-parallel-size", int, lambda v: v >= 1, _WHOLE),
    ArgRule("--nnodes", int, lambda v: v >= 1, _WHOLE),
    ArgRule("--gpu-memory-utilization", float, lambda v: 0 < v <= 1, "a number > 0 and <= 1, e.g. 0.9"),
    ArgRule("--max-model-len", human_int_or_auto, lambda v: v >= 1 or v == AUTO_LEN, _TOKENS + " or auto"),
    ArgRule("--max-num-seqs", int, lambda v: v >= 1, _WHOLE),
    ArgRule("--max-num-batched-tokens", human_int, lambda v: v >= 1, _TOKENS),
)


@dataclass(frozen=True)
class CheckedArgs:
    """The launch check's result: the numbers that passed, and one line per refusal."""

    numbers: LaunchNumbers
    errors: tuple[str, ...] = ()

    def refusal(self) -> str | None:
        """All refusals on one line, or None when every argument is accepted."""
        return "; ".join(self.errors) or None


def _check_number(rule: ArgRule, raw: str | bool) -> tuple[int | float | None, str | None]:
    """(value, None) when `raw` is accepted, else (None, the refusal naming the flag)."""
    if not isinstance(raw, str):
        return None, f"{rule.flag} needs a value: {rule.accepted}"
    try:
        value = rule.parse(raw)
    except (ValueError, OverflowError):
        value = None
    if value is None or not rule.ok(value):
        return None, f"{rule.flag} {safe_json.short(raw)} is not accepted: {rule.accepted}"
    return value, None


def _model_error(args: VllmArgs) -> str | None:
    """Why the model argument is missing or empty (a `--config` YAML's `model:` counts: it was read)."""
    what = "a local model directory or a Hugging Face model name"
    if args.flags.get(MODEL_FLAG) is True:   # `--model` last, or before another flag: vLLM's parser refuses it
        return f"{MODEL_FLAG} needs a value: {what}"
    if args.model:
        return None
    if args.given(MODEL_FLAG):
        return f"{MODEL_FLAG} needs a value: {what}"
    if args.model == "":
        return f"the model (first argument) is empty: {what}"
    return ("no model given: caovan-vllm-serve MODEL [vLLM serve arguments], MODEL a local model "
            "directory or a Hugging Face model name (first, or as --model)")


def check_launch_args(args: VllmArgs, visible_gpus: int) -> CheckedArgs:
    """Check the user's model and numeric vLLM arguments against ARG_RULES and the GPU count
    (`visible_gpus`: the facts' visible GPUs; 0 leaves the count to the runtime checks).

    Accepts what vLLM 0.21's parser accepts and refuses, besides what it refuses, what is
    nonsense (0 or negative sizes, a share of GPU memory outside (0, 1]). Pure."""
    errors = [e for e in (_model_error(args),) if e]
    values: dict[str, int | float] = {}
    for rule in ARG_RULES:
        if args.given(rule.flag):
            value, error = _check_number(rule, args.value(rule.flag))  # type: ignore[arg-type]
            if error:
                errors.append(error)
            else:
                values[rule.flag[2:].replace("-", "_")] = value  # type: ignore[assignment]
    numbers = LaunchNumbers(**values)  # type: ignore[arg-type]
    tp, pp = numbers.tensor_parallel_size or 1, numbers.pipeline_parallel_size or 1
    ray = args.value("--distributed-executor-backend") == "ray"   # the Ray cluster's GPUs count, not this node's
    if visible_gpus and (numbers.nnodes or 1) == 1 and not ray and tp * pp > visible_gpus:
        sizes = [("--tensor-parallel-size", tp)] + ([("--pipeline-parallel-size", pp)] if pp > 1 else [])
        sizes.sort(key=lambda size: not args.given(size[0]))   # the line starts with a flag the user gave
        given = " x ".join(f"{flag} {n}" for flag, n in sizes)
        errors.append(f"{given} needs {tp * pp} GPUs, {visible_gpus} are visible: at most {visible_gpus} "
                      "on one node (CUDA_VISIBLE_DEVICES and the facts decide which are visible), or several "
                      "nodes with --nnodes or --distributed-executor-backend ray")
    seqs, batched = numbers.max_num_seqs, numbers.max_num_batched_tokens
    if seqs is not None and batched is not None and batched < seqs:
        errors.append(f"--max-num-batched-tokens {batched} is below --max-num-seqs {seqs}: vLLM refuses that; "
                      "give at least as many batched tokens as sequences")
    return CheckedArgs(numbers, tuple(errors))
