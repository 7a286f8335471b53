"""One exception tree: every exception class of the package derives from errors.CaovanException."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from caovan_vllm_sm75_turbo3 import errors

# Control-flow signals that must pass through `except Exception` (so they derive from
# BaseException only): a SIGTERM during the FlashInfer probe build, a failed write to stdout.
BASE_EXCEPTION_SIGNALS = {
    "caovan_vllm_sm75_turbo3.runtime.flashinfer_probe._Terminated",
    "caovan_vllm_sm75_turbo3.cli.common._OutputFailed",
}
HEAVY = ("torch", "triton", "vllm", "cupy")

# Imports every module of the package with torch/triton/vllm made unimportable (those modules are
# skipped, and named), then lists every exception class defined in the package.
WALK = textwrap.dedent("""
    import importlib, importlib.abc, inspect, json, pkgutil, sys

    HEAVY = {heavy!r}

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HEAVY:
                raise ImportError(f"blocked heavy import: {{name}}")
            return None

    sys.meta_path.insert(0, Block())
    import caovan_vllm_sm75_turbo3 as pkg
    from caovan_vllm_sm75_turbo3.errors import CaovanException

    skipped, classes = {{}}, {{}}
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        try:
            module = importlib.import_module(info.name)
        except ImportError as err:
            skipped[info.name] = str(err)
            continue
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == info.name and issubclass(obj, BaseException):
                name = f"{{obj.__module__}}.{{obj.__qualname__}}"
                classes[name] = {{"rooted": issubclass(obj, CaovanException),
                                  "exception": issubclass(obj, Exception)}}
    print(json.dumps({{"skipped": skipped, "classes": classes}}))
""").format(heavy=HEAVY)


@pytest.fixture(scope="module")
def walked() -> dict:
    r = subprocess.run([sys.executable, "-c", WALK], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_every_exception_class_of_the_package_derives_from_the_root(walked):
    classes = walked["classes"]
    assert len(classes) >= 20, classes  # the walk found the package's classes at all
    stray = sorted(n for n, c in classes.items() if not c["rooted"] and n not in BASE_EXCEPTION_SIGNALS)
    assert stray == [], f"derive these from caovan_vllm_sm75_turbo3.errors.CaovanException: {stray}"
    for name in BASE_EXCEPTION_SIGNALS:
        assert name in classes and not classes[name]["exception"], name


def test_only_modules_that_need_torch_triton_or_vllm_are_skipped(walked):
    for module, why in walked["skipped"].items():
        assert "blocked heavy import" in why, (module, why)
    assert "caovan_vllm_sm75_turbo3.kernels.turbo.rewrite" not in walked["skipped"]


def test_user_errors_and_internal_kinds_are_separate_branches():
    from caovan_vllm_sm75_turbo3.kernels.turbo.pipeline import TurboBuildError
    from caovan_vllm_sm75_turbo3.kernels.turbo.resources import PtxasError
    from caovan_vllm_sm75_turbo3.kernels.turbo.rewrite import TurboRewriteError
    from caovan_vllm_sm75_turbo3.server_api.transport import Rejected, StepError
    from caovan_vllm_sm75_turbo3.server_api.readiness import NotReady

    assert issubclass(errors.CaovanError, errors.CaovanException)
    for internal in (TurboBuildError, PtxasError, TurboRewriteError, StepError, Rejected):
        # run_cli and the dispatch catch CaovanError as the user's problem: internal kinds must not match
        assert issubclass(internal, errors.CaovanException) and not issubclass(internal, errors.CaovanError)
    assert all(issubclass(c, errors.TurboError) for c in (TurboBuildError, PtxasError, TurboRewriteError))
    err = NotReady("GET /v1/models returned 401 Unauthorized", 2)
    assert isinstance(err, errors.CaovanError) and err.exit_code == 2 and str(err).startswith("GET ")
    assert NotReady("not ready").exit_code == 3


@pytest.mark.torch
def test_gdn_input_error_stays_a_value_error():
    pytest.importorskip("torch")
    from caovan_vllm_sm75_turbo3.kernels.gdn import GDNInputError

    assert issubclass(GDNInputError, errors.CaovanError) and issubclass(GDNInputError, ValueError)
