"""One decision per vLLM process: what every installer of ours reads, made once.

`register()` builds one `ProcessContext` and hands it to the guards, the Turbo hook, the GDN
dispatch and the attention backend; each reads `ctx.decision` (policy/decision.py) and none
decides again, so they cannot disagree. The settings come from every source vLLM accepts, read
before the decision is made: CAOVAN_* variables; the engine settings vLLM holds where it called
our plugin (`LLM(additional_config=...)`, an EngineCore's or worker's VllmConfig:
plugin/vllm_source.py); else `vllm serve`'s command line with its `--config FILE.yaml` expanded as
vLLM expands it. The facts are the facts file when one is named (its GPUs stand for this
machine's: how a test or a plan for other hardware takes the SM75 decisions), with this process's
installed vLLM, Triton and torch versions, which no file can know better; else a probe.
Everything is read lazily, once.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ..config import Settings, load_settings
from ..errors import CaovanError
from ..launch import given_kv_cache_dtype, model_lookup, read_args, unread_model
from ..policy.decision import Decision, decide
from ..policy.vllm_args import VllmArgs, serve_args
from ..runtime.facts import Facts
from ..runtime.model import ModelShape, model_shape, read_model_arg
from ..runtime.probe import dist_version, load_facts, vllm_version
from .vllm_source import VllmSource, vllm_source


class ProcessContext:
    """Settings, facts and the one decision of this process, each read on first use and kept;
    bad settings raise CaovanError from `settings` (each installer reports them its own way)."""

    def __init__(self, env: Mapping[str, str], argv: Sequence[str] = (), source: VllmSource | None = None) -> None:
        self.env = env
        self._argv = list(argv)
        self.source = source      # vLLM's own engine settings, where this process has them
        self._args: VllmArgs | None = None
        self._settings: Settings | None = None
        self._facts: Facts | None = None
        self._decision: Decision | None = None

    @classmethod
    def of_this_process(cls) -> ProcessContext:
        """The context of the running process: its environment, vLLM's command line and the engine
        settings of the vLLM code that loaded our plugin (call it from `register()`)."""
        return cls(os.environ, sys.argv, vllm_source())

    @property
    def args(self) -> VllmArgs:
        """vLLM's command line as read, `--config` expanded (raises SettingError for a malformed
        --additional-config or config file)."""
        if self._args is None:
            argv = serve_args(self._argv) if self._argv else []
            self._args = read_args(argv)
        return self._args

    @property
    def additional_config(self) -> Mapping[str, Any]:
        """vLLM's additional-config in this process: the engine's own where it is held, else the command line's."""
        return self.source.additional_config if self.source is not None else self.args.additional_config

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.env, self.additional_config)
        return self._settings

    @property
    def facts(self) -> Facts:
        if self._facts is None:
            facts = load_facts(self.settings.facts, self.env)
            if facts.source != "probe":
                versions = dataclasses.replace(facts.versions, vllm=vllm_version(), triton=dist_version("triton"),
                                               torch=dist_version("torch"))
                facts = dataclasses.replace(facts, versions=versions)
            self._facts = facts
        return self._facts

    def _model(self) -> tuple[ModelShape | None, str | None]:
        """The served model's shape, and why it is unknown (None: known). From the config vLLM loaded
        where this process holds one (an engine core, a worker), else read as vLLM finds the model."""
        model = self.source.model if self.source is not None else self.args.model
        if not self.settings.active:
            return None, None
        if self.source is not None and self.source.hf_config is not None:
            return model_shape(self.source.hf_config), None
        if not model:
            return None, None
        lookup = model_lookup(self.args) if self.source is None else (None, None)
        try:
            facts = read_model_arg(model, self.env, *lookup)
        except CaovanError:   # the launcher names a bad model file; here it is only unknown
            return None, f"the config.json of {model} could not be read"
        return model_shape(facts.config), unread_model(model, facts)

    @property
    def decision(self) -> Decision:
        """The one decision of this process (policy.decision.decide), made on first use."""
        if self._decision is None:
            kv = self.source.kv_cache_dtype if self.source is not None else given_kv_cache_dtype(self.args)
            shape, unknown = self._model()
            self._decision = decide(self.settings, self.facts, shape, kv, model_unknown=unknown)
        return self._decision
