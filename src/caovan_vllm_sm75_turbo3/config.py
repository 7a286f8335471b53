"""The one settings object.

Precedence, lowest first: defaults < `CAOVAN_*` environment variables < vLLM
`--additional-config` keys < CLI flags. Every setting is declared once, as a field of
`Settings`, with its type, default and one-line doc; the README's variables table is
generated from these declarations (`python -m caovan_vllm_sm75_turbo3.config`) and a
test keeps the two in step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from . import safe_json
from .errors import SettingError

ENV_PREFIX = "CAOVAN_"
CONFIG_PREFIX = "caovan_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_BOOL_HELP = "use 1/0, true/false, yes/no or on/off"
_MAX_INT = 10**9


def _setting(default: Any, doc: str, *, kind: str | None = None, choices: tuple[str, ...] = (),
             config_key: str | None = None, cli_flag: str | None = None,
             minimum: int | None = None, accepts: str = "") -> Any:
    """Declare one setting as a dataclass field; the metadata drives parsing and docs. `accepts`
    words a string setting's values (default: a non-empty string)."""
    kind = kind or {bool: "bool", int: "int", str: "choice" if choices else "str"}[type(default)]
    meta = {"doc": doc, "kind": kind, "choices": choices, "config_key": config_key,
            "cli_flag": cli_flag, "minimum": minimum, "accepts": accepts}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Source:
    """Where a setting's value came from: `default`, `env` (the variable), `additional-config`
    (the key) or `flag` (our CLI flag). Its text is what plan lines and errors print."""

    kind: str     # default, env, additional-config or flag
    name: str = ""

    def __str__(self) -> str:
        return self.kind if self.kind == "default" else f"{self.kind} {self.name}"


DEFAULT_SOURCE = Source("default")


@dataclass(frozen=True)
class Settings:
    """Validated settings. `sources[name]` says where each value came from."""

    enable: bool = _setting(
        True, "Apply the plugin at all; 0 makes the installed wheel do nothing.", config_key="caovan")
    mode: str = _setting(
        "auto", "auto: our accelerated paths where the checks pass, guards always; "
        "guards: guards and cache isolation only, vLLM's own kernels; off: nothing.",
        choices=("auto", "guards", "off"))
    require_turbo3: bool = _setting(
        False, "Refuse to start, with the reason, when no hot path of the model gets tensor cores.")
    gdn_legacy_disable: bool = _setting(
        False, "Keep vLLM's upstream GDN prefill instead of ours (gdn_legacy=disabled-by-user).")
    flashqla_precompile: bool = _setting(
        True, "Compile our GDN kernels for the model's shapes before vLLM's profile run (SM75 only).")
    turbo: str = _setting(
        "auto", "Tensor-core rewrite for allowlisted Triton kernels on SM75: auto (verified Triton "
        "versions only), on, off.", choices=("auto", "on", "off"))
    flashinfer_sampler: str = _setting(
        "guard", "guard: VLLM_USE_FLASHINFER_SAMPLER=0 on SM75; probe: test-build FlashInfer's "
        "sampler first and keep it only if the build works; keep: leave vLLM's default.",
        choices=("guard", "probe", "keep"))
    probe_timeout_s: int = _setting(
        300, "Time limit in seconds for the FlashInfer sampler test build (probe mode).", minimum=10)
    timeout_guard: bool = _setting(
        True, "Raise vLLM's cold-start timeouts (execute, iteration, RPC) where the release has them.")
    execute_timeout_s: int = _setting(
        1800, "Seconds for the cold-start timeouts set by the timeout guard; never below vLLM's 300 s.",
        minimum=300)
    arch_guard: bool = _setting(
        True, "Build JIT extensions for sm_75 only (TORCH_CUDA_ARCH_LIST, FLASHINFER_CUDA_ARCH_LIST).")
    cache_isolation: bool = _setting(
        True, "Give each environment (plugin, Python, torch, triton, vLLM, FlashInfer, GPU arch) "
        "its own JIT cache directories.")
    cache_dir: str = _setting(
        "", "Root of the isolated JIT caches (empty: ${XDG_CACHE_HOME:-$HOME/.cache}/caovan-sm75-turbo3).",
        kind="path", cli_flag="--cache-dir")
    facts: str = _setting(
        "", "Use this facts JSON file instead of probing the machine (plan for hardware you lack).",
        kind="path", cli_flag="--facts")
    profile: str = _setting(
        "auto", "Launch profile: a profile name, auto (match the hardware and model) or none.",
        cli_flag="--profile", accepts="auto, none or a profile name")

    sources: Mapping[str, Source] = field(default_factory=dict, compare=False, repr=False)
    warnings: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def active(self) -> bool:
        """True when the plugin should do anything at all."""
        return self.enable and self.mode != "off"

    def origin(self, name: str) -> Source:
        """Where `name` came from."""
        return self.sources.get(name, DEFAULT_SOURCE)

    def source(self, name: str) -> str:
        """Where `name` came from, as text: default, env CAOVAN_X, additional-config key, or a CLI flag."""
        return str(self.origin(name))

    def where(self, name: str) -> str:
        """How an error names the place `name` was given, as the parser's errors do."""
        got = self.origin(name)
        if got.kind == "additional-config":
            return f"--additional-config key {got.name!r}"
        return got.name if got.kind in ("env", "flag") else ENV_PREFIX + name.upper()


@dataclass(frozen=True)
class SettingSpec:
    """How one setting is spelled and checked, read off the `Settings` field metadata."""

    name: str
    kind: str
    default: Any
    doc: str
    choices: tuple[str, ...]
    env_var: str
    config_key: str
    cli_flag: str | None
    minimum: int | None
    accepts: str = ""

    def accepted(self) -> str:
        """Human words for the accepted values."""
        if self.kind == "bool":
            return _BOOL_HELP
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "int":
            return f"a whole number >= {self.minimum}" if self.minimum is not None else "a whole number"
        if self.kind == "path":
            return "an absolute path, or empty" if self.name == "cache_dir" else "a file path, or empty"
        return self.accepts or "a non-empty string"


def specs() -> tuple[SettingSpec, ...]:
    """All settings, in declaration order."""
    out = []
    for f in fields(Settings):
        if f.name in ("sources", "warnings"):
            continue
        m = f.metadata
        out.append(SettingSpec(
            name=f.name, kind=m["kind"], default=f.default, doc=m["doc"], choices=m["choices"],
            env_var=ENV_PREFIX + f.name.upper(), config_key=m["config_key"] or CONFIG_PREFIX + f.name,
            cli_flag=m["cli_flag"], minimum=m["minimum"], accepts=m["accepts"]))
    return tuple(out)


def _parse(spec: SettingSpec, raw: Any, where: str) -> Any:
    """Turn one raw value (env string, JSON value or CLI value) into the setting's type."""
    def bad() -> SettingError:
        return SettingError(f"{where}={safe_json.short(raw)} is not accepted: {spec.accepted()}.")

    if spec.kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, int) and raw in (0, 1):
            return bool(raw)
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise bad()
    if spec.kind == "int":
        if isinstance(raw, bool):
            raise bad()
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise bad() from None
        if spec.minimum is not None and value < spec.minimum:
            raise bad()
        if value > _MAX_INT:  # a timeout of 10**4000 s would overflow the clocks that use it
            raise SettingError(f"{where}={safe_json.short(raw)} is not accepted: {spec.accepted()}, "
                               f"at most {_MAX_INT}.")
        return value
    if spec.kind == "choice" and isinstance(raw, bool) and {"on", "off"} <= set(spec.choices):
        raw = "on" if raw else "off"   # YAML 1.1 reads a bare `off` as false (a --config file's `caovan_turbo: off`)
    if not isinstance(raw, str):
        raise bad()
    text = raw.strip()
    if spec.kind == "choice":
        if text.lower() not in spec.choices:
            raise bad()
        return text.lower()
    if spec.kind == "path":
        if raw and not text:   # blanks are a mistake, as for every other setting; empty means the default
            raise bad()
        path = os.path.expanduser(text) if text else ""
        if spec.name == "cache_dir" and path:
            if path.startswith("~"):
                raise SettingError(f"{where}={safe_json.short(raw)} is not accepted: {path.split('/')[0]} "
                                   "cannot be expanded (no such user); use an absolute path.")
            if not os.path.isabs(path):   # each vLLM process may start in another directory
                raise bad()
        return path
    if not text:
        raise bad()
    return text


def parse_additional_config(text: str | None) -> dict[str, Any]:
    """Parse vLLM's `--additional-config` JSON; the caller passes the original string on intact.

    Strict JSON: NaN/Infinity and nesting deeper than 64 levels are refused (SettingError)."""
    if text is None or not text.strip():
        return {}
    try:
        value = safe_json.loads(text)
    except safe_json.BadJson as err:
        raise SettingError(
            f"--additional-config {err}: {safe_json.short(text)}. "
            "Example: '{\"caovan\":true,\"caovan_mode\":\"auto\"}'.") from None
    if not isinstance(value, dict):
        raise SettingError(
            f"--additional-config must be a JSON object such as '{{\"caovan\":true}}', not {safe_json.short(text)}.")
    return value


def _checked_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """An already-parsed additional-config (vLLM's dotted form) under the same limits as the JSON."""
    try:
        safe_json.check_depth(dict(config))
    except safe_json.BadJson as err:
        raise SettingError(f"--additional-config {err}.") from None
    return dict(config)


def load_settings(env: Mapping[str, str] | None = None,
                  additional_config: str | Mapping[str, Any] | None = None,
                  cli: Mapping[str, Any] | None = None) -> Settings:
    """Resolve settings from defaults, `env`, vLLM's additional-config and CLI values.

    `cli` maps setting names to values from our own flags; `None` values mean "not given".
    Raises `SettingError` with one line naming the variable, key or flag and what is accepted.
    """
    env = os.environ if env is None else env
    config = (parse_additional_config(additional_config)
              if additional_config is None or isinstance(additional_config, str)
              else _checked_config(additional_config))
    all_specs = specs()
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    warnings: list[str] = []

    known_env = {s.env_var for s in all_specs}
    for var in sorted(env):
        if var.startswith(ENV_PREFIX) and var not in known_env:
            warnings.append(f"{var} is not a Caovan setting and is ignored (see caovan-sm75-doctor --settings).")

    known_keys = {s.config_key for s in all_specs}
    unknown = sorted(k for k in config if (k == "caovan" or k.startswith(CONFIG_PREFIX)) and k not in known_keys)
    if unknown:
        raise SettingError(
            f"--additional-config has unknown Caovan key {safe_json.short(unknown[0])}; known keys: "
            + ", ".join(sorted(known_keys)) + ".")

    for spec in all_specs:
        if spec.env_var in env:
            values[spec.name] = _parse(spec, env[spec.env_var], spec.env_var)
            sources[spec.name] = Source("env", spec.env_var)
        if spec.config_key in config:
            values[spec.name] = _parse(spec, config[spec.config_key],
                                       f"--additional-config key {spec.config_key!r}")
            sources[spec.name] = Source("additional-config", spec.config_key)
        if cli and cli.get(spec.name) is not None:
            values[spec.name] = _parse(spec, cli[spec.name], spec.cli_flag or spec.name)
            sources[spec.name] = Source("flag", spec.cli_flag or spec.name)
    return replace(Settings(**values), sources=sources, warnings=tuple(warnings))


def settings_table_markdown() -> str:
    """The README's variables table, generated from the declarations."""
    rows = ["| variable | additional-config key | flag | default | accepted | what it does |",
            "|---|---|---|---|---|---|"]
    for s in specs():
        default = ({True: "1", False: "0"}[s.default] if s.kind == "bool" else s.default) or "(empty)"
        rows.append(f"| `{s.env_var}` | `{s.config_key}` | {f'`{s.cli_flag}`' if s.cli_flag else ''} | "
                    f"`{default}` | {s.accepted()} | {s.doc} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    """`python -m caovan_vllm_sm75_turbo3.config [--markdown]`: the settings table (README's)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m caovan_vllm_sm75_turbo3.config",
                                     description="Print the table of every CAOVAN_* setting (the README's), as "
                                                 "Markdown: variable, additional-config key, flag, default, what "
                                                 "is accepted, what it does.")
    parser.parse_args(argv)
    print(settings_table_markdown())
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
