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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import safe_json
from ..config import parse_additional_config
from ..errors import SettingError

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


def read_vllm_args(argv: Sequence[str]) -> VllmArgs:
    """Read `argv` (the arguments after `vllm serve`). Raises SettingError for a malformed
    `--additional-config` (invalid JSON, not an object, a dotted key without a value)."""
    args = tuple(argv)
    flags: dict[str, str | bool] = {}
    plain_config: str | None = None
    dotted: dict[str, Any] = {}
    notes: list[str] = []
    model = args[0] if args and not args[0].startswith("-") else None
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
            keys = name[len(ADDITIONAL_CONFIG) + 1:].split(".")
            if value is True or not all(keys):
                raise SettingError(f"{token} needs a value, e.g. {ADDITIONAL_CONFIG}.caovan_mode auto.")
            if len(keys) > safe_json.MAX_DEPTH:
                raise SettingError(f"{ADDITIONAL_CONFIG}.KEY takes at most {safe_json.MAX_DEPTH} dotted "
                                   f"levels, not {len(keys)}.")
            _set_nested(dotted, keys, _json_value(str(value)))
            continue
        if name == ADDITIONAL_CONFIG:
            if value is True:
                raise SettingError(f"{ADDITIONAL_CONFIG} needs a JSON object, e.g. "
                                   f"{ADDITIONAL_CONFIG} '{{\"caovan\":true}}'.")
            plain_config = str(value)
        if name == "--model" and model is None and isinstance(value, str):
            model = value
        if name.startswith("--no-") and value is True:
            flags[canonical("--" + name[5:])] = False
        flags[name] = value
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
    if "--config" in flags:
        notes.append("--config FILE: arguments inside that YAML file are not read by the launcher; "
                     "the guards treat them as not given")
    return VllmArgs(argv=args, model=model, flags=flags, additional_config=config, notes=tuple(notes))


def serve_args(argv: Sequence[str]) -> list[str]:
    """The `vllm serve` arguments of a process's command line (`sys.argv`); [] for anything else.

    `vllm serve ARGS` and vLLM's `api_server.py ARGS` entry point both count.
    """
    if len(argv) > 1 and argv[1] == "serve":
        return list(argv[2:])
    if argv and os.path.basename(argv[0]) == "api_server.py":
        return list(argv[1:])
    return []
