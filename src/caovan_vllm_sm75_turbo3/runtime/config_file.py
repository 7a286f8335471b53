"""vLLM's `--config FILE.yaml`: its keys turned into arguments the way vLLM's own parser does.

vLLM's FlexibleArgumentParser (0.21 to 0.34, vllm/utils/argparse_utils.py `_pull_args_from_config`,
`load_config_file`) reads the YAML file and inserts `--key value` arguments right after the model
positional (or first, without one), so arguments given on the command line win over the file's:
a true boolean is a bare `--key`, a false one is dropped, a list is `--key item ...`, a mapping
is `--key '<JSON>'` (so `additional-config:` as a YAML mapping reaches vLLM as the JSON string),
anything else `--key str(value)`. We do the same, so the launcher, the banner and every vLLM
process read the settings a YAML file gives.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import SettingError
from ..textsafe import shown

CONFIG_FLAG = "--config"
MAX_CONFIG_BYTES = 1 << 20   # a YAML file of vLLM arguments is a few hundred bytes


def _load_yaml(path: str) -> dict[str, Any]:
    """The file's top-level mapping; SettingError naming the file for anything else."""
    if path.rsplit(".", 1)[-1] not in ("yaml", "yml"):
        raise SettingError(f"{CONFIG_FLAG} {shown(path, 120)}: vLLM takes a .yaml or .yml file only.")
    try:
        import yaml
    except ImportError:   # vLLM requires PyYAML, so only a launcher without vLLM gets here
        raise SettingError(f"{CONFIG_FLAG} {shown(path, 120)}: PyYAML is not installed, so the file cannot be "
                           "read (pip install pyyaml; vLLM itself needs it)") from None
    try:
        with Path(path).expanduser().open(encoding="utf-8") as f:
            text = f.read(MAX_CONFIG_BYTES + 1)
    except (OSError, UnicodeDecodeError) as err:
        raise SettingError(f"{CONFIG_FLAG} {shown(path, 120)}: cannot read it "
                           f"({getattr(err, 'strerror', None) or err}).") from None
    if len(text) > MAX_CONFIG_BYTES:
        raise SettingError(f"{CONFIG_FLAG} {shown(path, 120)}: over {MAX_CONFIG_BYTES} bytes; not a file of "
                           "vLLM arguments.")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SettingError(f"{CONFIG_FLAG} {shown(path, 120)}: not valid YAML ({shown(str(err), 200)}).") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingError(f"{CONFIG_FLAG} {shown(path, 120)}: must be a mapping of argument names to values, "
                           "such as 'tensor-parallel-size: 2'.")
    return data


def config_args(path: str) -> list[str]:
    """The arguments vLLM makes of the YAML file at `path`, in the file's order."""
    out: list[str] = []
    for key, value in _load_yaml(path).items():
        flag = "--" + str(key)
        if isinstance(value, bool):
            out += [flag] if value else []
        elif isinstance(value, list):
            out += [flag, *(str(v) for v in value)] if value else []
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out


def expand_config_file(argv: Sequence[str]) -> list[str]:
    """`vllm serve` arguments (after `serve`) with `--config FILE` replaced by the file's arguments,
    placed where vLLM places them (after the model positional). Raises SettingError for a file
    vLLM would refuse too (missing, not YAML, not a mapping, more than one --config)."""
    args = list(argv)
    given = [i for i, a in enumerate(args) if a == CONFIG_FLAG]   # vLLM expands this spelling only
    if not given:
        return args
    if len(given) > 1:
        raise SettingError(f"{CONFIG_FLAG} is given {len(given)} times; vLLM takes one file.")
    i = given[0]
    if i + 1 >= len(args):
        raise SettingError(f"{CONFIG_FLAG} needs a file: {CONFIG_FLAG} FILE.yaml.")
    path, rest = args[i + 1], args[:i] + args[i + 2:]
    head = 1 if rest and not rest[0].startswith("-") else 0   # the model positional stays first
    return rest[:head] + config_args(path) + rest[head:]
