"""One decision per vLLM process: what every installer of ours decides from, read once.

`register()` builds one `ProcessContext` (settings from CAOVAN_* and the `--additional-config`
vLLM was started with, the facts, the Turbo decision) and hands it to the guards, the Turbo hook,
the GDN dispatch and the attention backend, so they cannot disagree. The facts are the facts file
when one is named (its GPUs stand for this machine's: how a test or a plan for other hardware
takes the SM75 decisions), with this process's installed vLLM, Triton and torch versions, which no
file can know better; else a probe. Loading is lazy and happens once.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence

from ..config import Settings, load_settings
from ..policy.turbo import TurboDecision, decide_turbo
from ..policy.vllm_args import VllmArgs, read_vllm_args, serve_args
from ..runtime.facts import Facts
from ..runtime.probe import dist_version, load_facts, vllm_version


class ProcessContext:
    """Settings, facts and the Turbo decision of this process, each read on first use and kept;
    bad settings raise CaovanError from `settings` (each installer reports them its own way)."""

    def __init__(self, env: Mapping[str, str], argv: Sequence[str] = ()) -> None:
        self.env = env
        self._argv = list(argv)
        self._args: VllmArgs | None = None
        self._settings: Settings | None = None
        self._facts: Facts | None = None
        self._turbo: TurboDecision | None = None

    @classmethod
    def of_this_process(cls) -> ProcessContext:
        """The context of the running process: its environment and vLLM's command line."""
        return cls(os.environ, sys.argv)

    @property
    def args(self) -> VllmArgs:
        """vLLM's command line as read (raises SettingError for a malformed --additional-config)."""
        if self._args is None:
            self._args = read_vllm_args(serve_args(self._argv) if self._argv else [])
        return self._args

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.env, self.args.additional_config)
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

    @property
    def turbo(self) -> TurboDecision:
        """The Turbo hook's decision for this process (the hook, the GDN gate and the attention agree)."""
        if self._turbo is None:
            self._turbo = decide_turbo(self.facts, self.settings, self.facts.versions.triton)
        return self._turbo
