"""Run a function right after Python executes one named module, without importing it ourselves.

`register()` runs in every vLLM process, including the API server, which never builds a model.
Importing vLLM's GDN layer module there would cost seconds and pull Triton into a process
that does not need it, so the replacement is registered when vLLM itself imports the module
(model construction), before any layer is built.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType


class AfterImport(importlib.abc.MetaPathFinder):
    """A one-shot finder: finds `module` with the other finders and calls `then(module)` after
    its code ran. It leaves `sys.meta_path` when it fires; `then` may raise to fail the import."""

    def __init__(self, module: str, then: Callable[[ModuleType], None]) -> None:
        self.module = module
        self.then = then

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.module:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module
        then = self.then

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            then(module)

        loader.exec_module = exec_module  # this loader instance serves this one module only
        return spec


def call_after_import(module: str, then: Callable[[ModuleType], None]) -> None:
    """Call `then(module)` now if `module` is imported already, else right after its import."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        then(loaded)
        return
    if not any(isinstance(f, AfterImport) and f.module == module for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport(module, then))
