"""vLLM 0.21's own plugin loader finds our entry point; loading twice is harmless."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.vllm


def test_vllm_loader_discovers_and_calls_register_once():
    code = textwrap.dedent("""
        import logging, sys
        records = []
        class Keep(logging.Handler):
            def emit(self, record): records.append(record.getMessage())
        logging.getLogger("caovan_vllm_sm75_turbo3").addHandler(Keep())
        logging.getLogger("caovan_vllm_sm75_turbo3").setLevel(logging.DEBUG)
        from vllm.plugins import load_plugins_by_group
        found = load_plugins_by_group("vllm.general_plugins")
        assert "caovan_sm75_turbo3" in found, found
        for _ in range(3):
            for fn in found.values():
                fn()
        import vllm.plugins
        vllm.plugins.load_general_plugins()
        vllm.plugins.load_general_plugins()
        import caovan_vllm_sm75_turbo3.plugin.register as reg
        assert reg._REGISTERED is True
        print("ENTRY", found["caovan_sm75_turbo3"].__module__, found["caovan_sm75_turbo3"].__name__)
        print("RECORDS", len([r for r in records if "Caovan" in r]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ENTRY caovan_vllm_sm75_turbo3.plugin.register register" in r.stdout
    # However often vLLM calls it, the plugin acts (and logs) once per process.
    assert "RECORDS 1" in r.stdout, r.stdout + r.stderr[-2000:]
