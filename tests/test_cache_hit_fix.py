"""plugin/cache_hit_fix.py: MTP with prefix caching on hybrid GDN models (vLLM 0.21-0.25). The Mamba/GDN
finder searches no further than the attention groups' hit inside the coordinator's hit loop; the
fix installs only where the release data names it and the source is the shape it was read from."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from helpers.facts import facts_dict

from caovan_vllm_sm75_turbo3.config import load_settings
from caovan_vllm_sm75_turbo3.plugin import cache_hit_fix
from caovan_vllm_sm75_turbo3.policy.decision import decide
from caovan_vllm_sm75_turbo3.policy.upstream_bugs import load_bugs
from caovan_vllm_sm75_turbo3.runtime.facts import Facts


def test_the_search_limit_drops_the_eagle_margin_only_in_the_hit_loop():
    rng = random.Random(random.randrange(10**6))
    for _ in range(500):
        bs = rng.choice([16, 528, 784, 800, 1056])
        limit = rng.randrange(0, 40) * bs + rng.randrange(bs)
        got = cache_hit_fix.mamba_search_limit(limit, bs, True, True)
        assert got == max(0, limit - bs)
        assert cache_hit_fix.mamba_search_limit(limit, bs, False, True) == limit   # no margin was given
        assert cache_hit_fix.mamba_search_limit(limit, bs, True, False) == limit   # 0.24's per-group lookup


@pytest.mark.parametrize("vllm,installs", [("0.21.0", True), ("0.24.0", True), ("0.25.1", True), ("0.26.0", False),
                                           ("0.34.0", False), (None, False)])
def test_the_decision_names_the_fix_on_the_releases_the_data_gives(vllm, installs):
    facts = Facts.from_dict(facts_dict(versions={"vllm": vllm}))
    assert (cache_hit_fix.FIX_ID in decide(load_settings({}), facts).fixes) is installs
    assert cache_hit_fix.FIX_ID not in decide(load_settings({"CAOVAN_ENABLE": "0"}), facts).fixes
    bug = next(b for b in load_bugs() if b.id == cache_hit_fix.FIX_ID)
    assert bug.wrong_output and bug.fix is not None and "0.26" in bug.fix.upstream


CHECK = r"""
import json, logging, sys
from dataclasses import fields
from vllm.v1.core import kv_cache_coordinator as coord, single_type_kv_cache_manager as stm
from vllm.v1.kv_cache_interface import MambaSpec
from caovan_vllm_sm75_turbo3.plugin import cache_hit_fix as fix

flag = next(f for f in fix.EAGLE_FLAGS if f in __import__("inspect").signature(stm.MambaManager.find_longest_cache_hit).parameters)
spec = object.__new__(MambaSpec)
object.__setattr__(spec, "block_size", 4)
class Pool:
    null_block = None
    def get_cached_block(self, h, ids):
        return [h]   # every block is cached: the finder takes the last it may reach
def hit(max_length, eagle, in_loop):
    token = fix._IN_HIT_LOOP.set(in_loop)
    try:
        blocks = stm.MambaManager.find_longest_cache_hit(block_hashes=list(range(64)), max_length=max_length,
            kv_cache_group_ids=[0], block_pool=Pool(), kv_cache_spec=spec, alignment_tokens=4, **{flag: eagle})
    finally:
        fix._IN_HIT_LOOP.reset(token)
    return len(blocks[0]) * 4
before = [hit(40, True, True), hit(40, False, True)]
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
problem = fix._shape_problem(coord.HybridKVCacheCoordinator, stm.MambaManager)
fix._patch(coord)
after = [hit(40, True, True), hit(40, False, True), hit(40, True, False)]
print(json.dumps({"flag": flag, "problem": problem, "before": before, "after": after}))
"""


@pytest.mark.vllm
def test_on_the_real_vllm_the_mamba_finder_stops_within_the_attention_hit():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["problem"] is None
    assert out["before"] == [40, 40]              # vLLM's own: the margin block is searched too
    assert out["after"] == [36, 40, 40]           # ours: one block less, only with the margin given
    assert f"fix {cache_hit_fix.FIX_ID}: on" in proc.stdout


def test_a_source_that_already_has_upstreams_rule_or_another_shape_stays_off():
    class Coordinator:
        def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
            spec = block_size = _max_length = None
            if (drop_eagle_block := True) and not isinstance(spec, MambaSpec):   # noqa: F821  0.26's line
                return _max_length, block_size

    class Mamba:
        @classmethod
        def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
                                   drop_eagle_block, alignment_tokens):
            return ()

    assert "no margin itself" in cache_hit_fix._shape_problem(Coordinator, Mamba)

    class Other:
        @classmethod
        def find_longest_cache_hit(cls, block_hashes, length):
            return ()

    assert "arguments" in cache_hit_fix._shape_problem(type("C", (), {
        "find_longest_cache_hit": lambda self, b, m: (m, "block_size", "_max_length")}), Other)
    assert "not found" in cache_hit_fix._shape_problem(None, Mamba)


def test_the_launcher_fills_mtp_with_prefix_caching_only_where_the_fix_is_proven(tmp_path):
    """vLLM 0.24: proven by the engine check (upstream_bugs.json plugin_fix.proven), so the plan fills
    both and says why; 0.21: the fix installs but is not proven there, so the pair is not filled."""
    from helpers.facts import EXAMPLES

    from caovan_vllm_sm75_turbo3.launch import plan_for_launcher
    from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args
    from caovan_vllm_sm75_turbo3.policy.vllm_versions import release_pins

    bug = next(b for b in load_bugs() if b.id == cache_hit_fix.FIX_ID)
    assert bug.fix.proven == ("0.24",) and "benchmarks/results/" in bug.fix.proof
    out = {}
    for vllm in ("0.21.0", "0.24.0"):
        facts = tmp_path / f"{vllm}.json"
        facts.write_text(json.dumps(facts_dict(versions={"vllm": vllm, "triton": release_pins(vllm).triton_version})))
        plan = plan_for_launcher({"CAOVAN_FACTS": str(facts)}, read_vllm_args([str(EXAMPLES / "models" / "qwen3.6-27b-awq")]),
                           write=False).plan
        out[vllm] = ({a.flag for a in plan.filled_args}, plan.notes, plan.warnings)
    flags, notes, warnings = out["0.24.0"]
    assert {"--speculative-config", "--enable-prefix-caching"} <= flags and "--no-enable-prefix-caching" not in flags
    assert any(n.startswith("fixed: upstream bug mtp-prefix-cache-wrong-output on vLLM 0.24.0") for n in notes)
    assert not any("mtp-prefix-cache-wrong-output" in w for w in warnings)
    flags, _, warnings = out["0.21.0"]
    assert "--no-enable-prefix-caching" in flags and "--enable-prefix-caching" not in flags
