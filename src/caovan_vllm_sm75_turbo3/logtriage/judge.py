"""The judge: the evidence of one log (evidence.py) and its known messages -> the verdict. Pure.

Its rules, in the order they apply (RULES is what `doctor --log --rules` prints and the docs
quote); the known messages (known_*.py) are judged first, by their own rule each:
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..logformat import GDN_DISABLED
from ..policy import vllm_versions as vv
from .evidence import APPLIED, KIND_WORDS, Evidence, Sign
from .results import Failure, Finding
from .signature import Role
from .signatures import BY_ID
from .words import MAX_TEXT, PHASE_WORDS


@dataclass(frozen=True)
class VerdictRule:
    """One rule of the judge: what evidence it reads, and what it decides."""
    id: str
    evidence: str
    decides: str


RULES: tuple[VerdictRule, ...] = (
    VerdictRule("jit-build-failed",
                "a JIT build that failed: nvcc or ninja command lines in ERROR lines, `ninja: build stopped`, "
                "`Error building extension`, no CUDA compiler, an nvcc older than the arch list",
                "FATAL, with the cause the lines show (a path with a stray ':', no CUDA_HOME, an old nvcc) and its fix"),
    VerdictRule("no-serving",
                "no ready line ('Application startup complete') and no 2xx answer",
                "never OK: FATAL where the log shows an error and the engine or server stopping, else UNDECIDED, "
                "naming what the log ends on"),
    VerdictRule("crash-after-serving",
                "after serving and before a requested shutdown: an engine-core or worker error traceback (whole, "
                "cut, or frames only), a CUDA error, an NCCL watchdog failure, an engine process that died, "
                "EngineDeadError",
                "FATAL; the first sign is the cause (unless a known cause after serving is), the later ones are "
                "named as its consequences; with only consequences, the cause is not in the log"),
)
__doc__ += "".join(f"\n{i}. {r.id}: {r.evidence} -> {r.decides}." for i, r in enumerate(RULES, 1))

_ORDER = ("fatal", "warning", "harmless")


def rules_markdown() -> str:
    """RULES as the table docs/logtriage.md holds (a test keeps the two equal)."""
    rows = ["| rule | evidence | decides |", "| --- | --- | --- |"]
    rows += [f"| `{r.id}` | {r.evidence} | {r.decides} |" for r in RULES]
    return "\n".join(rows)


def judge(ev: Evidence, findings: dict[str, Finding]) -> tuple[list[Finding], Failure | None]:
    """The findings of a log judged by RULES, ordered (fatal first), and its first real failure.
    `findings` is not changed: the judged ones are copies."""
    found = {k: Finding(**{**vars(f), "details": dict(f.details)}) for k, f in findings.items()}
    _decide_waits(ev, found)
    _judge_own_banner(ev, found)
    _jit_build_failed(ev, found)
    _no_serving(ev, found)
    _crash_after_serving(ev, found)
    _explain_details(ev, found)
    _no_advice_for_what_is_applied(ev, found)
    roles = [r.value for r in Role]
    ordered = sorted(found.values(), key=lambda f: (_ORDER.index(f.status), roles.index(f.role), f.first_line))
    return ordered, _first_failure(ev, ordered)


def _add(found: dict[str, Finding], sig_id: str, line: int, text: str, process: str | None, cause: str,
         fix: str, note: str, status: str = "fatal", role: str | None = None) -> None:
    sig = BY_ID[sig_id]
    found[sig_id] = Finding(sig_id, sig.title, status, role or sig.role.value, line, line, 1, text[:MAX_TEXT],
                            process, cause, fix, note=note)


def _decide_waits(ev: Evidence, found: dict[str, Finding]) -> None:
    wait = found.get("shm-broadcast-wait")
    if wait is None:
        return
    if "fatal" in ev.waits.outcome:
        wait.status, wait.note = "fatal", f"followed by a failure ({ev.waits.outcome['fatal']})"
    elif ev.waits.open:
        wait.status = "warning"
        wait.note = ("not decided: the log ends while a process was still waiting; "
                     "if the server answers /health with 200 later, it was harmless")
    else:
        wait.status = "harmless"
        wait.note = f"the server answered afterwards ({ev.waits.outcome.get('harmless', '')})"


def _judge_own_banner(ev: Evidence, found: dict[str, Finding]) -> None:
    """runtime=FAIL is about our plugin, not the engine: harmless where no SM75 GPU was visible."""
    f = found.get("caovan-runtime-fail")
    if f is not None and ev.caovan.status.get("sm75", "").startswith("0/"):
        f.status = "harmless"
        f.note = "no SM75 GPU was visible to the plugin: nothing of ours applied, vLLM ran untouched"


def _jit_build_failed(ev: Evidence, found: dict[str, Finding]) -> None:
    """Rule 1: a failed JIT build is fatal, with the cause its lines show."""
    build = ev.build
    if not build.failed or build.line is None:
        return
    cause, fix = build.diagnosis()
    known = found.get("flashinfer-sampler-jit") or found.get("jit-build-failed")
    if known is not None:
        if (build.command and build.command.startswith(":")) or build.no_cuda_home or build.old_nvcc:
            known.cause = cause if known.id == "jit-build-failed" else f"{cause} {known.cause}"
            known.fix = fix if known.id == "jit-build-failed" else f"{fix} {known.fix}"
        known.status = "fatal"
        return
    ln = build.line
    _add(found, "jit-build-failed", ln.number, ln.text, ln.process, cause, fix,
         "the build's own lines" + (f": the compiler command `{build.command}`" if build.command else ""))


def _no_serving(ev: Evidence, found: dict[str, Finding]) -> None:
    """Rule 2: a log that never shows the server serving is never OK."""
    if ev.serving.since is not None:
        return
    fatal = [f for f in found.values() if f.status == "fatal"]
    if any(f.role == Role.CAUSE.value for f in fatal):
        return
    start = ev.start
    alarm = ev.first_alarm or ((start.first_error, ev.phase or "") if start.first_error else None)
    if alarm is None:
        if not fatal:
            ends = ("the log is empty" if not ev.lines else
                    f"the log ends {PHASE_WORDS[ev.phase] if ev.phase in PHASE_WORDS and ev.phase != 'serving' else f'at line {ev.lines}'}")
            _undecided(found, ev.lines, "", f"{ends}, before it shows the server ready (no 'Application startup "
                       "complete', no 2xx answer): the start may still be going on, or it stopped without saying so")
        return
    ln, phase = alarm
    if ev.first_alarm is None and fatal:
        return   # the errors are a known consequence's own (EngineDeadError): the cause is not in the log
    stopped = start.stop or (fatal and (fatal[0].first_line, fatal[0].title))
    if not stopped:
        _undecided(found, ln.number, ln.text, f"the log shows an error at line {ln.number} but ends before it "
                   "shows whether the engine stopped or the server became ready")
        return
    sig = BY_ID["unexplained-failure"]
    where = f" It happened {PHASE_WORDS[phase]}." if phase in PHASE_WORDS else ""
    cut = (" The exception itself (the traceback's last line) is not in the log: the excerpt ends inside it."
           if ev.first_unknown is None and ev.cut_in_traceback else "")
    _add(found, sig.id, ln.number, ln.text, ln.process, sig.cause + where + cut,
         sig.fix.replace("the lines around it", f"the lines around line {ln.number}"),
         f"the log never shows the server ready, and shows it stopping (line {stopped[0]}: {stopped[1]})")


def _undecided(found: dict[str, Finding], number: int, text: str, why: str) -> None:
    sig = BY_ID["start-undecided"]
    _add(found, sig.id, number, text, None, f"{why[0].upper()}{why[1:]}. {sig.cause}", sig.fix,
         "the log never shows the server ready", status="warning")


CAUSE_KINDS = ("error-traceback", "cuda-error", "nccl-watchdog")


def _crash_after_serving(ev: Evidence, found: dict[str, Finding]) -> None:
    """Rule 3: a crash after the server served is fatal; its first sign is the cause."""
    since, signs = ev.serving.since, ev.after.signs
    if since is None or not signs:
        return
    later = [f for f in found.values() if f.first_line >= since]
    known = [f for f in later if f.status == "fatal" and f.role == Role.CAUSE.value]
    causes = [s for s in signs if s.kind in CAUSE_KINDS]
    if known:
        first = min(known, key=lambda f: f.first_line)
        if not first.note:
            first.note = _consequences(s for s in signs if s.line > first.first_line)
        return
    if causes:
        s = causes[0]
        line, text = s.line, s.text
        unknown = ev.first_unknown[0] if ev.first_unknown else None
        if s.kind == "error-traceback" and unknown is not None and unknown.number >= s.line and (
                unknown.process == s.process):   # the exception the traceback ends in: what a person looks for
            line, text = unknown.number, unknown.text
        _add(found, "crash-after-serving", line, text, s.process, BY_ID["crash-after-serving"].cause,
             BY_ID["crash-after-serving"].fix,
             f"{KIND_WORDS[s.kind]} after the server served (from line {since})"
             + (f"; {_consequences(x for x in signs if x is not s)}" if len(signs) > 1 else ""))
        return
    if not any(f.status == "fatal" for f in later):   # only consequences, none a known message: say so
        s = signs[0]
        _add(found, "crash-after-serving", s.line, s.text, s.process, BY_ID["crash-after-serving"].cause,
             BY_ID["crash-after-serving"].fix, f"{KIND_WORDS[s.kind]} after the server served (from line {since})",
             role=Role.CONSEQUENCE.value)


def _no_advice_for_what_is_applied(ev: Evidence, found: dict[str, Finding]) -> None:
    """A fix never asks for what the log shows already applied: our banner's gdn_legacy=disabled-by-user
    (CAOVAN_GDN_LEGACY_DISABLE=1), the launch's own --disable-custom-all-reduce (evidence.APPLIED)."""
    gdn_off = ev.caovan.status.get("gdn_legacy") == GDN_DISABLED
    for f in found.values():
        if gdn_off and "CAOVAN_GDN_LEGACY_DISABLE=1" in f.fix:
            f.fix = ("CAOVAN_GDN_LEGACY_DISABLE=1 was already in effect (this log's banner says "
                     "gdn_legacy=disabled-by-user): vLLM's own GDN prefill ran, not ours, so switching ours off "
                     "changes nothing. Report the log with the lines around this one.")
        for key in ev.applied:
            _, advice, instead = APPLIED[key]
            if advice in f.fix:
                f.fix = instead


def _consequences(signs: Iterable[Sign]) -> str:
    named = [f"{KIND_WORDS[s.kind]} (line {s.line})" for s in signs]
    return f"then, as its consequences: {', '.join(named)}" if named else ""


def _explain_details(ev: Evidence, found: dict[str, Finding]) -> None:
    """Put what the log itself says (numbers, names, the vLLM release) into the advice."""
    f = found.get("triton-shared-memory")
    if f and "required" in f.details:
        kernel = f.details.get("kernel", "a Triton kernel")
        f.cause = (f"{kernel} asks for {int(f.details['required']):,} bytes of shared memory per block; "
                   f"this GPU allows {int(f.details.get('limit', 0)):,}. " + f.cause)
    f = found.get("fp8-kv-unsupported")
    if f and ev.vllm_version and vv.has("triton-attn-fp8-kv-on-sm75", ev.vllm_version) is False:
        f.cause = (f"This log is from vLLM {ev.vllm_version}, which has no attention backend for fp8 KV "
                   "below SM89. " + f.cause)
    f = found.get("cuda-oom")
    if f and f.phase in PHASE_WORDS:
        f.cause = f"{f.cause} It happened {PHASE_WORDS[f.phase]}."
        if "estimated_max_len" in f.details:
            f.fix += f" vLLM estimates that --max-model-len {f.details['estimated_max_len']} would fit."
    if f and f.phase == "load" and "total" in f.details and "allocated" in f.details:
        f.cause += (f" {f.details['allocated']} of the GPU's {f.details['total']} held the weights loaded so "
                    "far: the weights alone are larger than this GPU's share.")
    _explain_kv(found.get("kv-cache-too-small"))
    f = found.get("gpu-memory-busy")
    if f and "free" in f.details:
        share = float(f.details["free"]) / max(float(f.details["total"]), 1e-9)
        f.cause = (f"{f.details['free']} of {f.details['total']} GiB was free at start, and "
                   f"--gpu-memory-utilization {f.details['utilization']} asks for more. " + f.cause)
        f.fix = f.fix.replace("below the free share", f"below {share:.2f} (the free share)")
    f = found.get("host-oom-kill")
    if f and f.phase in PHASE_WORDS:
        f.cause = f"{f.cause} It happened {PHASE_WORDS[f.phase]}."
    f = found.get("bf16-unsupported")
    if f and "gpu" in f.details:
        f.cause = f"{f.details['gpu']} has compute capability {f.details.get('capability', '?')}. " + f.cause


def _explain_kv(f: Finding | None) -> None:
    if f and "v0_max_model_len" in f.details:   # V0's wording: the length and what fits, no GiB
        f.details["max_model_len"] = f.details.pop("v0_max_model_len")
        f.details["estimated_max_len"] = f.details.pop("v0_estimated_max_len")
        f.cause = (f"--max-model-len {f.details['max_model_len']} is more than the "
                   f"{f.details['estimated_max_len']} tokens the KV cache holds. " + f.cause)
    if f and "needed" in f.details:
        f.cause = (f"One request of --max-model-len {f.details['max_model_len']} tokens needs "
                   f"{f.details['needed']} GiB of KV cache; {f.details['available']} GiB is left for it. " + f.cause)
    if f and "estimated_max_len" in f.details:
        f.fix = f.fix.replace("Lower --max-model-len,", f"Lower --max-model-len to at most "
                              f"{f.details['estimated_max_len']} (vLLM's estimate for this memory),", 1)


def _first_failure(ev: Evidence, findings: list[Finding]) -> Failure | None:
    fatal = [f for f in findings if f.status == "fatal"]
    if not fatal:
        return None
    causes = [f for f in fatal if f.role == Role.CAUSE.value]
    if causes:
        f = min(causes, key=lambda x: x.first_line)
        return Failure(f.first_line, f.text, f.id, f.cause, f.fix)
    if ev.first_unknown is not None:
        ln, phase = ev.first_unknown
        sig = BY_ID["unexplained-failure"]
        where = f" It happened {PHASE_WORDS[phase]}." if phase in PHASE_WORDS else ""
        return Failure(ln.number, ln.text[:MAX_TEXT], sig.id,
                       "No known cause: this is the first exception in the log, which is usually the root "
                       "cause." + where,
                       f"Read the traceback that ends at line {ln.number}; search the vLLM issues for "
                       "its last line, and report it to us with the log if it is about SM75.")
    f = min(fatal, key=lambda x: (x.role != Role.SYMPTOM.value, x.first_line))
    if f.role == Role.CONSEQUENCE.value:   # never named as the cause: the cause is not in this log
        sig = BY_ID["cause-not-in-log"]
        return Failure(f.first_line, f.text, sig.id, f"Line {f.first_line} ({f.title}) is a consequence of a "
                       f"failure elsewhere, not its cause. {sig.cause}",
                       sig.fix.replace("this line", f"line {f.first_line}"))
    return Failure(f.first_line, f.text, f.id, f.cause, f.fix)
