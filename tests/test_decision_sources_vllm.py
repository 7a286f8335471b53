"""`LLM(additional_config=...)` with the real vLLM 0.21: vLLM loads our plugin from EngineArgs.__post_init__,
and the banner, the Turbo hook in Triton and the GDN gate follow the settings given there, exactly as
they follow the same settings given as CAOVAN_* variables (issue 39)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers.facts import EXAMPLES

pytestmark = pytest.mark.vllm

CHILD = textwrap.dedent("""
    import json, logging, os, sys
    records = []
    class Keep(logging.Handler):
        def emit(self, record): records.append(record.getMessage())
    log = logging.getLogger("caovan_vllm_sm75_turbo3")
    log.addHandler(Keep()); log.setLevel(logging.INFO)
    import vllm.platforms as P
    from vllm.platforms.cpu import CpuPlatform
    P._current_platform = CpuPlatform()
    from vllm.engine.arg_utils import EngineArgs
    EngineArgs(model=sys.argv[1], additional_config=json.loads(sys.argv[2]))   # what LLM(...) builds
    from caovan_vllm_sm75_turbo3.kernels.turbo.hook import current_hook
    banner = next(r for r in records if r.startswith("Caovan vLLM SM75 Turbo3 external plugin"))
    status = dict(line.split("=", 1) for line in banner.splitlines()[1:] if "=" in line and " " not in line)
    print("OUT " + json.dumps({"status": status, "hook": current_hook() is not None}))
""")


def run(tmp_path, additional_config: dict, **env: str) -> dict:
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}))
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CAOVAN_", "_CAOVAN", "VLLM_", "TRITON_"))}
    full.update(HOME=str(tmp_path / "home"), CAOVAN_FACTS=str(EXAMPLES / "2x2080ti-22g.json"),
                CAOVAN_CACHE_DIR=str(tmp_path / "cache"), **env)
    r = subprocess.run([sys.executable, "-c", CHILD, str(model), json.dumps(additional_config)], capture_output=True,
                       text=True, timeout=300, env=full, cwd=tmp_path)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("OUT ")), None)
    assert r.returncode == 0 and line, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(line[4:])


@pytest.mark.parametrize("config,env", [
    ({"caovan_turbo": "off"}, {"CAOVAN_TURBO": "off"}),
    ({"caovan_mode": "guards"}, {"CAOVAN_MODE": "guards"}),
    ({"caovan_gdn_legacy_disable": True}, {"CAOVAN_GDN_LEGACY_DISABLE": "1"}),
])
def test_llm_additional_config_is_decided_like_the_variables(tmp_path, config, env):
    given = run(tmp_path, config)
    by_env = run(tmp_path, {}, **env)
    default = run(tmp_path, {})
    assert given == by_env != default
    keys = ("turbo", "gdn_legacy", "turbo3", "mode")
    assert {k: given["status"][k] for k in keys} == {k: by_env["status"][k] for k in keys}
    # The hook in Triton follows the same decision the banner printed.
    assert given["hook"] == (given["status"]["turbo"] in ("auto", "on"))
    assert default["hook"] and default["status"]["turbo"] == "auto"
