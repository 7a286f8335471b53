"""register()'s Turbo step: installs the hook only on an SM75 process with a verified Triton."""

from __future__ import annotations

import logging
import os

import pytest

pytestmark = pytest.mark.triton

pytest.importorskip("triton")

from caovan_vllm_sm75_turbo3.kernels.turbo.hook import AllowlistSelector, current_hook, uninstall  # noqa: E402
from caovan_vllm_sm75_turbo3.plugin.turbo import install_turbo  # noqa: E402
from caovan_vllm_sm75_turbo3.runtime.facts import GpuFact  # noqa: E402

TI = GpuFact(index=0, name="NVIDIA GeForce RTX 2080 Ti", compute_capability="7.5")
A100 = GpuFact(index=0, name="NVIDIA A100", compute_capability="8.0")


@pytest.fixture
def machine(monkeypatch):
    def set_(gpus, triton="3.6.0", **env):
        for k in [k for k in os.environ if k.startswith("CAOVAN_")]:
            monkeypatch.delenv(k)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr("caovan_vllm_sm75_turbo3.runtime.probe.probe_gpus", lambda env, notes: (gpus, "580", True))
        monkeypatch.setattr("caovan_vllm_sm75_turbo3.runtime.probe.dist_version", lambda *names: triton)
    yield set_
    uninstall()


def test_sm75_with_verified_triton_installs_the_strict_allowlist_hook(machine) -> None:
    machine([TI])
    assert install_turbo() == "auto"
    hook = current_hook()
    assert isinstance(hook.selector, AllowlistSelector) and hook.selector.strict
    assert {e.name for e in hook.selector.allowlist.kernels} >= {"chunk_fwd_kernel_o"}


@pytest.mark.parametrize("gpus, triton, env, line", [
    ([A100], "3.6.0", {}, "off-not-sm75"),
    ([], "3.6.0", {}, "off-not-sm75"),
    ([TI], "3.6.0", {"CAOVAN_TURBO": "off"}, "off-by-user"),
    ([TI], "3.9.0", {}, "off-unverified-triton-3.9.0"),
])
def test_no_hook_where_it_does_not_apply(machine, gpus, triton, env, line) -> None:
    machine(gpus, triton, **env)
    assert install_turbo() == line and current_hook() is None


def test_forced_on_with_an_unverified_triton_warns_and_installs_non_strict(machine, caplog) -> None:
    machine([TI], "3.9.0", CAOVAN_TURBO="on")
    with caplog.at_level(logging.WARNING, logger="caovan_vllm_sm75_turbo3"):
        assert install_turbo() == "on-unverified-triton-3.9.0"
    assert current_hook() is not None and not current_hook().selector.strict
    assert any("turbo=on-unverified-triton-3.9.0" in r.getMessage() for r in caplog.records)


def test_a_bad_setting_is_logged_and_nothing_is_installed(machine, caplog) -> None:
    machine([TI], CAOVAN_TURBO="maybe")
    with caplog.at_level(logging.WARNING, logger="caovan_vllm_sm75_turbo3"):
        assert install_turbo() == "off-error"
    assert current_hook() is None and any("CAOVAN_TURBO" in r.getMessage() for r in caplog.records)


def test_additional_config_turns_it_off_like_the_variable(machine, monkeypatch) -> None:
    machine([TI])
    monkeypatch.setattr("sys.argv", ["/venv/bin/vllm", "serve", "/models/q", "--additional-config",
                                     '{"caovan_turbo": "off"}'])
    assert install_turbo() == "off-by-user" and current_hook() is None
