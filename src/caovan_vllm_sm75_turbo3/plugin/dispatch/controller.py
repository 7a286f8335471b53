"""The process's GDN dispatch: detect the interface, register the replacement, decide, say so.

Three moments, each cheap until the next is needed:
1. `install()` (from `register()`, every vLLM process): settings from the environment, and
   which known GDN module files the installed vLLM has (no vLLM import). None: "not supported",
   one line, vLLM's own path.
2. `Dispatch.attach()` (right after vLLM imports that module, i.e. when a model is built): the
   policy gate (SM75, release, mode, disable switch), the source and attribute checks of the
   interface, then `ChunkGatedDeltaRule.register_oot` with our subclass, once.
3. `Dispatch.take_over()` (the first op vLLM builds): settings again with vLLM's
   additional-config, the precompile and self-check, and the final one-line state.
A failure at 2 or 3 leaves vLLM's own kernel in charge and says why; with require-turbo3 it
raises `Turbo3Refused` instead, which stops vLLM from starting.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ...config import Settings, load_settings
from ...errors import CaovanError, Turbo3Refused
from ...kernels.gdn_capability import dispatch_target
from ...policy.accel import gdn_state
from ...policy.turbo import GDN_KERNELS
from ...runtime.facts import Facts
from ..context import ProcessContext
from . import legacy_gdn_v020, modular_qwen_gdn_v022, replacement
from .after_import import call_after_import
from .interface import GdnInterface, check_sources, module_file
from .precompile import PrecompileError, model_shapes, precompile, static_check
from .state import DISABLED, LOG_PREFIX, UPSTREAM, UPSTREAM_KERNEL, DispatchState, failure_line

logger = logging.getLogger("caovan_vllm_sm75_turbo3")

FAMILIES: tuple[GdnInterface, ...] = (legacy_gdn_v020.INTERFACE, modular_qwen_gdn_v022.INTERFACE)
KERNEL = "caovan-gdn-chunk"  # kernels/gdn: chunked two-kernel Triton prefill

# The one dispatch of this process (None until register() installed it).
_DISPATCH: Dispatch | None = None


def vllm_root() -> Path | None:
    """site-packages (the folder holding `vllm/`) of the importable vLLM, without importing it."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def installed_source(path: str) -> str | None:
    """The text of `path` (e.g. `vllm/model_executor/custom_op.py`) in the installed vLLM."""
    root = vllm_root()
    file = root / path if root else None
    return file.read_text(encoding="utf-8") if file and file.is_file() else None


def present_families() -> list[GdnInterface]:
    """The families whose GDN module file the installed vLLM has."""
    root = vllm_root()
    return [f for f in FAMILIES if root and (root / module_file(f.module)).is_file()]


def attribute_problems(iface: GdnInterface, module: ModuleType) -> list[str]:
    """What the imported module's objects lack that the source check cannot see."""
    from vllm.model_executor.custom_op import CustomOp

    op = getattr(module, iface.op_class, None)
    if not (isinstance(op, type) and issubclass(op, CustomOp)):
        return [f"{iface.module}.{iface.op_class} is not a CustomOp subclass"]
    problems = []
    if getattr(op, "name", None) != iface.op_name:
        problems.append(f"{iface.op_class}.name is {getattr(op, 'name', None)!r}, not {iface.op_name!r}")
    if not callable(getattr(op, "register_oot", None)):
        problems.append(f"{iface.op_class} has no register_oot")
    return problems


def _current_hook() -> Any:
    from ...kernels.turbo.hook import current_hook

    return current_hook()


def turbo_problem(hook: Any, kernels: tuple[str, ...] = GDN_KERNELS) -> str | None:
    """Why our GDN prefill would not get tensor cores in this process (None: it does).

    The plan's one rule, confirmed where it runs: without the Turbo hook, or when a build of one of
    our kernels fell back to plain code, the kernel runs on CUDA cores and vLLM's own stays in charge.
    """
    if hook is None:
        return ("the Turbo hook is not installed in this process (see its turbo= line): "
                "our GDN prefill would run on CUDA cores")
    fell = [f"{k}: {hook.fell_back[k]}" for k in kernels if k in hook.fell_back]
    if fell:
        return "our GDN kernels built without tensor cores (" + "; ".join(fell) + ")"
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


@dataclass
class Dispatch:
    """This process's dispatch: settings, the attached interface, the decision and its state."""

    settings: Settings
    env: Mapping[str, str] = field(repr=False)
    ctx: ProcessContext | None = field(default=None, repr=False)   # the process's one context
    state: DispatchState | None = None
    interface: GdnInterface | None = None
    facts: Facts | None = None
    kernel: Callable[..., Any] | None = None
    decided: bool = False

    def say(self, state: DispatchState) -> DispatchState:
        """Record and log the one state line."""
        self.state = state
        logger.info("%s %s", LOG_PREFIX, state.line())
        return state

    def refuse_if_required(self, settings: Settings, reason: str) -> None:
        if settings.require_turbo3:
            raise Turbo3Refused(
                f"require-turbo3 ({settings.source('require_turbo3')}) is on, but our GDN prefill cannot "
                f"serve this process: {reason}. Unset CAOVAN_REQUIRE_TURBO3 / drop caovan_require_turbo3 "
                "to start on vLLM's own kernel.")

    def unsupported(self, interface: str, reason: str) -> None:
        """An unknown or changed vLLM layout: vLLM's own path, one line (refuse if required)."""
        self.say(DispatchState(UPSTREAM, interface, UPSTREAM_KERNEL, f"not supported: {reason}"))
        self.refuse_if_required(self.settings, reason)

    def fail(self, settings: Settings, reason: str, kernel: str = UPSTREAM_KERNEL) -> None:
        """Give up our path for this process after it was chosen (precompile, kernel import)."""
        name = self.interface.name if self.interface else "none"
        logger.warning(failure_line(name, reason))
        self.say(DispatchState(UPSTREAM, name, kernel, f"dispatch failed: {reason}"))
        self.refuse_if_required(settings, reason)

    # -- 2. vLLM imported a GDN module -------------------------------------------------------
    def attach(self, iface: GdnInterface, module: ModuleType) -> None:
        """Check the interface and register our replacement op class (once per process)."""
        if self.interface is not None:
            return
        try:
            self.facts = (self.ctx or ProcessContext(self.env)).facts
            gate = gdn_state(self.facts, self.settings)
            if gate.line == DISABLED:
                self.say(DispatchState(DISABLED, iface.name, UPSTREAM_KERNEL, "; ".join(gate.reasons)))
                return
            if not gate.active:
                self.say(DispatchState(UPSTREAM, iface.name, UPSTREAM_KERNEL, "; ".join(gate.reasons)))
                return
            problems = list(check_sources(iface, installed_source).problems)
            problems += attribute_problems(iface, module) if not problems else []
            if problems:
                self.unsupported(iface.name, f"vLLM's {module_file(iface.module)} does not match "
                                             f"{iface.name}: " + "; ".join(problems))
                return
            op_cls = getattr(module, iface.op_class)
            taken = replacement.register(op_cls, replacement.build(op_cls, iface.name, self))
            if taken:
                self.unsupported(iface.name, taken)
                return
            self.interface = iface
        except Turbo3Refused:
            raise
        except Exception as err:  # never take vLLM down unless require-turbo3 asks for it
            self.unsupported(iface.name, f"checking the interface raised {_first_line(err)}")

    # -- 3. vLLM builds a ChunkGatedDeltaRule -------------------------------------------------
    def take_over(self, op: Any) -> Callable[..., Any] | None:
        """Our kernel for this op instance, or None for vLLM's own (the first call decides)."""
        if not self.decided:
            self.decided = True
            try:
                self.kernel = self._decide(op)
            except Turbo3Refused:
                raise
            except Exception as err:  # model construction must go on, on vLLM's own kernel
                self.kernel = None
                self.fail(self.settings, f"deciding raised {_first_line(err)}", replacement.upstream_kernel(op))
        return self.kernel

    def _decide(self, op: Any) -> Callable[..., Any] | None:
        from vllm.config import get_current_vllm_config

        assert self.interface is not None  # only our registered class calls take_over
        name = self.interface.name
        vllm_config = get_current_vllm_config()
        try:
            settings = load_settings(self.env, dict(vllm_config.additional_config or {}))
        except CaovanError as err:
            self.fail(self.settings, str(err), replacement.upstream_kernel(op))
            return None
        gate = gdn_state(self.facts, settings) if self.facts else None
        if gate is not None and not gate.active:
            status = DISABLED if gate.line == DISABLED else UPSTREAM
            self.say(DispatchState(status, name, replacement.upstream_kernel(op), "; ".join(gate.reasons)))
            return None
        if op._caovan_upstream != op.forward_native:
            self.say(DispatchState(UPSTREAM, name, replacement.upstream_kernel(op),
                                   "vLLM chose its own non-Triton GDN prefill for this GPU"))
            return None
        try:
            import torch

            from ...kernels.gdn import chunk_gated_delta_rule, gated_delta_rule_reference
            from ...kernels.gdn.configs import CHUNK
            from ...kernels.gdn.inputs import check_inputs

            if torch.cuda.is_available():
                device = torch.device("cuda", torch.cuda.current_device())
                cc = torch.cuda.get_device_capability(device)
                if not dispatch_target(cc):  # the kernel runs up to sm_89, but we take over on SM75 only
                    self.say(DispatchState(UPSTREAM, name, replacement.upstream_kernel(op),
                                           f"this process's GPU is sm_{cc[0]}{cc[1]}, not sm_75"))
                    return None
                hook = _current_hook()
                problem = turbo_problem(hook)
                if problem:
                    self.fail(settings, problem, replacement.upstream_kernel(op))
                    return None
            else:
                device = torch.device("cpu")  # Triton's interpreter (TRITON_INTERPRET=1), for tests
                hook = None                   # no tensor cores to check there
        except Exception as err:
            self.fail(settings, f"our GDN kernel cannot be loaded: {_first_line(err)}",
                      replacement.upstream_kernel(op))
            return None
        sm75 = f"{self.facts.sm75_count} SM75 GPU(s)" if self.facts else "SM75"
        if vllm_config.model_config is None:  # an op built outside model construction (verify)
            why = f"{sm75}; no model in vLLM's config, nothing to precompile"
        else:
            try:
                shapes = model_shapes(vllm_config)
                static_check(shapes, check_inputs)  # also when precompile is off
                if settings.flashqla_precompile:
                    report = precompile(chunk_gated_delta_rule, gated_delta_rule_reference, shapes,
                                        CHUNK, device)
            except PrecompileError as err:
                self.fail(settings, str(err), replacement.upstream_kernel(op))
                return None
            problem = turbo_problem(hook) if device.type == "cuda" else None
            if problem:  # the precompile's builds fell back to plain FMA code
                self.fail(settings, problem, replacement.upstream_kernel(op))
                return None
            if settings.flashqla_precompile:
                why = (f"{sm75}; precompiled {report.launches} launches for {shapes.describe()} in "
                       f"{report.seconds:.1f} s; self-check rel. error {report.max_rel_err:.1e}")
            else:
                why = (f"{sm75}; precompile off ({settings.source('flashqla_precompile')}): "
                       "the first prefill compiles")
        self.say(DispatchState(name, name, KERNEL, why))
        return chunk_gated_delta_rule


def install(env: Mapping[str, str] | None = None, ctx: ProcessContext | None = None) -> Dispatch | None:
    """Set up this process's GDN dispatch once; cheap (no vLLM import). Returns it, or None when
    the plugin is off. Raises Turbo3Refused only when require-turbo3 forbids vLLM's own path.
    `ctx` is the process's one context (register() passes it); without it one is read from `env`."""
    global _DISPATCH
    if _DISPATCH is not None:
        return _DISPATCH
    env = os.environ if env is None else env
    ctx = ctx or ProcessContext(env)
    try:
        settings = ctx.settings
    except CaovanError as err:
        logger.warning("%s not dispatched: %s", LOG_PREFIX, err)
        return None
    if not settings.active:
        return None
    dispatch = _DISPATCH = Dispatch(settings, env, ctx)
    present = present_families()
    if len(present) != 1:
        looked = ", ".join(module_file(f.module) for f in FAMILIES)
        found = "none" if not present else "more than one"
        dispatch.unsupported("none", f"this vLLM has {found} of the GDN modules we know ({looked})")
        return dispatch
    family = present[0]
    call_after_import(family.module, functools.partial(dispatch.attach, family))
    return dispatch


def current_state() -> DispatchState | None:
    """The last state line of this process's dispatch, if any."""
    return _DISPATCH.state if _DISPATCH else None
