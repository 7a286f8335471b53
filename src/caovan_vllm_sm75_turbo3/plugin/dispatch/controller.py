"""The process's GDN dispatch: detect the interface, register the replacement, decide, say so.

Three moments, each cheap until the next is needed; all read the process's one decision
(plugin/context.py), none decides again:
1. `install()` (from `register()`, every vLLM process): which known GDN module files the
   installed vLLM has (no vLLM import). None: "not supported", one line, vLLM's own path.
2. `Dispatch.attach()` (right after vLLM imports that module, i.e. when a model is built): the
   decision's GDN gate (SM75, release, mode, disable switch, tensor cores), the source and
   attribute checks of the interface, then `ChunkGatedDeltaRule.register_oot` with our subclass, once.
3. `Dispatch.take_over()` (the first op vLLM builds): this process's GPU and Turbo hook, the
   precompile and self-check, and the final one-line state.
A failure at 2 or 3 leaves vLLM's own kernel in charge and says why; with require-turbo3 it
raises `Turbo3Refused` instead, which stops vLLM from starting.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ...config import CONFIG_PREFIX, Settings
from ...errors import CaovanError, Turbo3Refused
from ...kernels.gdn_capability import dispatch_target
from ...logformat import GDN_PREFIX, NOT_DISPATCHED, gdn_line
from ...policy.turbo import GDN_KERNELS
from ..context import ProcessContext
from ..installed_vllm import installed_source, vllm_root
from . import legacy_gdn_v020, modular_qwen_gdn_v022, replacement
from .after_import import call_after_import
from .interface import GdnInterface, check_sources, module_file
from .precompile import PrecompileError, model_shapes, precompile, static_check
from .state import DISABLED, UPSTREAM, UPSTREAM_KERNEL, DispatchState, failure_line

logger = logging.getLogger("caovan_vllm_sm75_turbo3")

FAMILIES: tuple[GdnInterface, ...] = (legacy_gdn_v020.INTERFACE, modular_qwen_gdn_v022.INTERFACE)
KERNEL = "caovan-gdn-chunk"  # kernels/gdn: chunked two-kernel Triton prefill

# The one dispatch of this process (None until register() installed it).
_DISPATCH: Dispatch | None = None


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


def _caovan_keys(config: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in dict(config or {}).items() if k == "caovan" or k.startswith(CONFIG_PREFIX)}


@dataclass
class Dispatch:
    """This process's dispatch: its one context (the decision), the attached interface and its state."""

    ctx: ProcessContext
    state: DispatchState | None = None
    interface: GdnInterface | None = None
    kernel: Callable[..., Any] | None = None
    decided: bool = False

    @property
    def settings(self) -> Settings:
        return self.ctx.decision.settings

    def say(self, state: DispatchState) -> DispatchState:
        """Record and log the one state line."""
        self.state = state
        logger.info(gdn_line(state.line()))
        return state

    def refuse_if_required(self, reason: str) -> None:
        settings = self.settings
        if settings.require_turbo3:
            raise Turbo3Refused(
                f"require-turbo3 ({settings.source('require_turbo3')}) is on, but our GDN prefill cannot "
                f"serve this process: {reason}. Unset CAOVAN_REQUIRE_TURBO3 / drop caovan_require_turbo3 "
                "to start on vLLM's own kernel.")

    def unsupported(self, interface: str, reason: str) -> None:
        """An unknown or changed vLLM layout: vLLM's own path, one line (refuse if required)."""
        self.say(DispatchState(UPSTREAM, interface, UPSTREAM_KERNEL, f"not supported: {reason}"))
        self.refuse_if_required(reason)

    def fail(self, reason: str, kernel: str = UPSTREAM_KERNEL) -> None:
        """Give up our path for this process after it was chosen (precompile, kernel import)."""
        name = self.interface.name if self.interface else "none"
        logger.warning(failure_line(name, reason))
        self.say(DispatchState(UPSTREAM, name, kernel, f"dispatch failed: {reason}"))
        self.refuse_if_required(reason)

    # -- 2. vLLM imported a GDN module -------------------------------------------------------
    def attach(self, iface: GdnInterface, module: ModuleType) -> None:
        """Check the interface and register our replacement op class (once per process)."""
        if self.interface is not None:
            return
        try:
            gate = self.ctx.decision.gdn
            if not gate.active:
                status = DISABLED if gate.line == DISABLED else UPSTREAM
                self.say(DispatchState(status, iface.name, UPSTREAM_KERNEL, "; ".join(gate.reasons)))
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
                self.fail(f"deciding raised {_first_line(err)}", replacement.upstream_kernel(op))
        return self.kernel

    def _decide(self, op: Any) -> Callable[..., Any] | None:
        from vllm.config import get_current_vllm_config

        assert self.interface is not None  # only our registered class calls take_over
        name, upstream = self.interface.name, replacement.upstream_kernel(op)
        vllm_config = get_current_vllm_config()
        self._check_settings_source(vllm_config)
        gate = self.ctx.decision.gdn
        if not gate.active:
            status = DISABLED if gate.line == DISABLED else UPSTREAM
            self.say(DispatchState(status, name, upstream, "; ".join(gate.reasons)))
            return None
        if op._caovan_upstream != op.forward_native:
            self.say(DispatchState(UPSTREAM, name, upstream, "vLLM chose its own non-Triton GDN prefill for this GPU"))
            return None
        target = self._target(name, upstream)
        why = self._prepare(vllm_config, upstream, *target) if target is not None else None
        if why is None:
            return None
        from ...kernels.gdn import chunk_gated_delta_rule

        self.say(DispatchState(name, name, KERNEL, why))
        return chunk_gated_delta_rule

    def _check_settings_source(self, vllm_config: Any) -> None:
        """Say so, loudly, if vLLM's config holds Caovan settings the decision was not made from
        (a source plugin/context.py does not read yet): the decision stands, one per process."""
        held = _caovan_keys(getattr(vllm_config, "additional_config", None))
        read = _caovan_keys(self.ctx.additional_config)
        if held != read:
            logger.warning("%s vLLM's additional_config holds Caovan settings %s, but this process decided from %s "
                           "(the decision stands: the banner, the hook and this dispatch agree on it)",
                           GDN_PREFIX, held, read)

    def _target(self, name: str, upstream: str) -> tuple[Any, Any] | None:
        """(device, Turbo hook) our kernel runs with here, or None after saying why it does not."""
        try:
            import torch

            if not torch.cuda.is_available():
                return torch.device("cpu"), None   # Triton's interpreter (TRITON_INTERPRET=1), for tests
            device = torch.device("cuda", torch.cuda.current_device())
            cc = torch.cuda.get_device_capability(device)
            if not dispatch_target(cc):  # the kernel runs up to sm_89, but we take over on SM75 only
                self.say(DispatchState(UPSTREAM, name, upstream, f"this process's GPU is sm_{cc[0]}{cc[1]}, not sm_75"))
                return None
            hook = _current_hook()
        except Exception as err:
            self.fail(f"our GDN kernel cannot be loaded: {_first_line(err)}", upstream)
            return None
        problem = turbo_problem(hook)
        if problem:
            self.fail(problem, upstream)
            return None
        return device, hook

    def _prepare(self, vllm_config: Any, upstream: str, device: Any, hook: Any) -> str | None:
        """Precompile and self-check for the model's shapes; the state line's `why`, or None after failing."""
        from ...kernels.gdn import chunk_gated_delta_rule, gated_delta_rule_reference
        from ...kernels.gdn.configs import CHUNK
        from ...kernels.gdn.inputs import check_inputs

        settings, facts = self.settings, self.ctx.decision.facts
        sm75 = f"{facts.sm75_count} SM75 GPU(s)"
        if vllm_config.model_config is None:  # an op built outside model construction (verify)
            return f"{sm75}; no model in vLLM's config, nothing to precompile"
        try:
            shapes = model_shapes(vllm_config)
            static_check(shapes, check_inputs)  # also when precompile is off
            report = (precompile(chunk_gated_delta_rule, gated_delta_rule_reference, shapes, CHUNK, device)
                      if settings.flashqla_precompile else None)
        except PrecompileError as err:
            self.fail(str(err), upstream)
            return None
        problem = turbo_problem(hook) if device.type == "cuda" else None
        if problem:  # the precompile's builds fell back to plain FMA code
            self.fail(problem, upstream)
            return None
        if report is None:
            return f"{sm75}; precompile off ({settings.source('flashqla_precompile')}): the first prefill compiles"
        return (f"{sm75}; precompiled {report.launches} launches for {shapes.describe()} in "
                f"{report.seconds:.1f} s; self-check rel. error {report.max_rel_err:.1e}")


def install(env: Mapping[str, str] | None = None, ctx: ProcessContext | None = None) -> Dispatch | None:
    """Set up this process's GDN dispatch once; cheap (no vLLM import). Returns it, or None when
    the plugin is off. Raises Turbo3Refused only when require-turbo3 forbids vLLM's own path.
    `ctx` is the process's one context (register() passes it); without it one is read from `env`."""
    global _DISPATCH
    if _DISPATCH is not None:
        return _DISPATCH
    ctx = ctx or ProcessContext(os.environ if env is None else env)
    try:
        decision = ctx.decision
    except CaovanError as err:
        logger.warning("%s: %s", NOT_DISPATCHED, err)
        return None
    if not decision.active:
        return None
    dispatch = _DISPATCH = Dispatch(ctx)
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
