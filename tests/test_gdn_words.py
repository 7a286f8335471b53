"""The `gdn_legacy=` vocabulary is declared once (logformat) and every place that writes or reads it
uses that declaration: the policy's states, the dispatch state, the log triage's meanings and the
README's glossary."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

from helpers.facts import facts_dict

from caovan_vllm_sm75_turbo3 import logformat
from caovan_vllm_sm75_turbo3.config import Settings
from caovan_vllm_sm75_turbo3.logtriage.results import STATUS_MEANINGS
from caovan_vllm_sm75_turbo3.plugin.dispatch import state
from caovan_vllm_sm75_turbo3.policy import vllm_versions as vv
from caovan_vllm_sm75_turbo3.policy.decision import decide
from caovan_vllm_sm75_turbo3.runtime.facts import Facts

ROOT = Path(__file__).resolve().parents[1]


def test_every_gdn_legacy_value_the_policy_gives_is_a_word_or_a_family() -> None:
    families = {str(r.family("gdn")) for r in (vv.release(f"0.{m}.0") for m in range(21, 35))}
    seen = set()
    for version, sm75, disable, mode in itertools.product(("0.21.0", "0.24.0", "0.40.0"), (0, 2), (False, True),
                                                          ("auto", "guards")):
        gpus = [{"index": i, "compute_capability": "7.5" if sm75 else "8.6", "memory_total_mib": 22528}
                for i in range(2)]
        facts = Facts.from_dict(facts_dict(gpus=gpus, versions={"vllm": version}))
        d = decide(replace(Settings(), gdn_legacy_disable=disable, mode=mode), facts, None, model_unknown="not here")
        seen.add(d.gdn.line)
        assert d.gdn.line in logformat.GDN_WORDS or d.gdn.line in families, d.gdn.line
    assert {logformat.GDN_DISABLED, logformat.AT_MODEL_LOAD} <= seen


def test_the_dispatch_state_and_the_triage_use_the_same_words() -> None:
    assert (state.DISABLED, state.UPSTREAM) == (logformat.GDN_DISABLED, logformat.GDN_UPSTREAM)
    assert {v for k, v in STATUS_MEANINGS if k == "gdn_legacy"} >= {logformat.GDN_DISABLED, logformat.GDN_UPSTREAM}


def test_the_readme_glossary_names_every_word() -> None:
    readme = (ROOT / "README.md").read_text()
    glossary = readme[readme.index("**gdn_legacy**"):readme.index("**GDN**")]
    for word in logformat.GDN_WORDS:
        assert f"`{word}`" in glossary, word
