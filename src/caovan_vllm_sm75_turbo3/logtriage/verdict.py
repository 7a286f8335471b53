"""The end of a log: what its findings add up to. The start rule (a log that never shows the server
ready is never OK), the shared-memory waits decided, the log's own numbers put into the advice, and
the first real failure, never a consequence. A part of the reader (triage._Reader) kept apart."""

from __future__ import annotations

from ..policy import vllm_versions as vv
from .results import Failure, Finding, Triage
from .signature import Role
from .signatures import BY_ID
from .words import MAX_TEXT, PHASE_WORDS, START_PHASES


class EndOfLog:
    """The judging half of the reader: every method reads the state the reading half kept."""

    def finish(self, source: str) -> Triage:
        """The result of the pass: pending and cut-off matches recorded, waits decided, the start rule
        applied, the advice filled in, the findings ordered (fatal first) and the first real failure."""
        for hit in self.frame_hits.values():   # tracebacks the log cut off before their exception line
            self._record(hit.sig, hit)
        for p in list(self.pending):
            self.pending.remove(p)
            self._record(BY_ID[p.sig.otherwise or p.sig.id], p)
        wait = self.findings.get("shm-broadcast-wait")
        if wait is not None:
            if "fatal" in self.wait_outcome:
                wait.status, wait.note = "fatal", f"followed by a failure ({self.wait_outcome['fatal']})"
            elif self.wait_open:
                wait.status = "warning"
                wait.note = ("not decided: the log ends while a process was still waiting; "
                             "if the server answers /health with 200 later, it was harmless")
            else:
                wait.status = "harmless"
                wait.note = f"the server answered afterwards ({self.wait_outcome.get('harmless', '')})"
        self._judge_own_banner()
        self._start_rule()
        self._explain_details()
        roles = [r.value for r in Role]
        findings = sorted(self.findings.values(), key=lambda f: (
            ("fatal", "warning", "harmless").index(f.status), roles.index(f.role), f.first_line))
        return Triage(source, self.lines, self.vllm_version, self.ready_line, self.http_ok, self.http_error,
                      self.caovan, self._first_failure(findings), findings)

    def _judge_own_banner(self) -> None:
        """runtime=FAIL is about our plugin, not the engine: harmless where no SM75 GPU was visible
        (nothing of ours applies), a warning otherwise; a stopped launch has its own line."""
        f = self.findings.get("caovan-runtime-fail")
        if f is not None and self.caovan.status.get("sm75", "").startswith("0/"):
            f.status = "harmless"
            f.note = "no SM75 GPU was visible to the plugin: nothing of ours applied, vLLM ran untouched"

    def _start_rule(self) -> None:
        """One rule before every signature: a log that never shows the server ready is never OK.
        With an error (first_error, first_alarm) nothing known explains, it is FATAL where it shows
        the engine or server stopping (or a fatal consequence), else UNDECIDED; without an error it
        is UNDECIDED where it ends in a start-up phase."""
        if self.ready_line is not None or self.http_ok:
            return
        fatal = [f for f in self.findings.values() if f.status == "fatal"]
        if any(f.role == Role.CAUSE.value for f in fatal):
            return
        alarm = self.first_alarm or ((self.first_error, self.phase or "") if self.first_error else None)
        if alarm is None:
            if self.phase in START_PHASES and not fatal:
                self._undecided(self.lines, "", f"the log ends {PHASE_WORDS[self.phase]}, before the server was "
                                "ready: the start may still be going on")
            return
        ln, phase = alarm
        if self.first_alarm is None and fatal:
            return   # the errors are a known consequence's own (EngineDeadError): the cause is not in the log
        stopped = self.stop or (fatal and (fatal[0].first_line, fatal[0].title))
        if not stopped:
            self._undecided(ln.number, ln.text, f"the log shows an error at line {ln.number} but ends before it "
                            "shows whether the engine stopped or the server became ready")
            return
        sig = BY_ID["unexplained-failure"]
        where = f" It happened {PHASE_WORDS[phase]}." if phase in PHASE_WORDS else ""
        cut = (" The exception itself (the traceback's last line) is not in the log: the excerpt ends inside it."
               if self.first_unknown is None and self.tracebacks else "")
        self.findings[sig.id] = Finding(
            sig.id, sig.title, "fatal", sig.role.value, ln.number, ln.number, 1, ln.text[:MAX_TEXT], ln.process,
            sig.cause + where + cut, sig.fix.replace("the lines around it", f"the lines around line {ln.number}"),
            note=f"the log never shows the server ready, and shows it stopping (line {stopped[0]}: {stopped[1]})")

    def _undecided(self, number: int, text: str, why: str) -> None:
        sig = BY_ID["start-undecided"]
        self.findings[sig.id] = Finding(sig.id, sig.title, "warning", sig.role.value, number, number, 1,
                                        text[:MAX_TEXT], None, f"{why[0].upper()}{why[1:]}. {sig.cause}", sig.fix,
                                        note="the log never shows the server ready")

    def _explain_details(self) -> None:
        """Put what the log itself says (numbers, names, the vLLM release) into the advice."""
        f = self.findings.get("triton-shared-memory")
        if f and "required" in f.details:
            kernel = f.details.get("kernel", "a Triton kernel")
            f.cause = (f"{kernel} asks for {int(f.details['required']):,} bytes of shared memory per block; "
                       f"this GPU allows {int(f.details.get('limit', 0)):,}. " + f.cause)
        f = self.findings.get("fp8-kv-unsupported")
        if f and self.vllm_version and vv.has("triton-attn-fp8-kv-on-sm75", self.vllm_version) is False:
            f.cause = (f"This log is from vLLM {self.vllm_version}, which has no attention backend for fp8 KV "
                       "below SM89. " + f.cause)
        f = self.findings.get("cuda-oom")
        if f and f.phase in PHASE_WORDS:
            f.cause = f"{f.cause} It happened {PHASE_WORDS[f.phase]}."
            if "estimated_max_len" in f.details:
                f.fix += f" vLLM estimates that --max-model-len {f.details['estimated_max_len']} would fit."
        if f and f.phase == "load" and "total" in f.details and "allocated" in f.details:
            f.cause += (f" {f.details['allocated']} of the GPU's {f.details['total']} held the weights loaded so "
                        "far: the weights alone are larger than this GPU's share.")
        f = self.findings.get("kv-cache-too-small")
        if f and "v0_max_model_len" in f.details:   # V0's wording: the length and what fits, no GiB
            f.details["max_model_len"] = f.details.pop("v0_max_model_len")
            f.details["estimated_max_len"] = f.details.pop("v0_estimated_max_len")
            f.cause = (f"--max-model-len {f.details['max_model_len']} is more than the "
                       f"{f.details['estimated_max_len']} tokens the KV cache holds. " + f.cause)
        if f and "needed" in f.details:
            f.cause = (f"One request of --max-model-len {f.details['max_model_len']} tokens needs "
                       f"{f.details['needed']} GiB of KV cache; {f.details['available']} GiB is left for it. "
                       + f.cause)
        if f and "estimated_max_len" in f.details:
            f.fix = f.fix.replace("Lower --max-model-len,", f"Lower --max-model-len to at most "
                                  f"{f.details['estimated_max_len']} (vLLM's estimate for this memory),", 1)
        f = self.findings.get("gpu-memory-busy")
        if f and "free" in f.details:
            share = float(f.details["free"]) / max(float(f.details["total"]), 1e-9)
            f.cause = (f"{f.details['free']} of {f.details['total']} GiB was free at start, and "
                       f"--gpu-memory-utilization {f.details['utilization']} asks for more. " + f.cause)
            f.fix = f.fix.replace("below the free share", f"below {share:.2f} (the free share)")
        f = self.findings.get("host-oom-kill")
        if f and f.phase in PHASE_WORDS:
            f.cause = f"{f.cause} It happened {PHASE_WORDS[f.phase]}."
        f = self.findings.get("bf16-unsupported")
        if f and "gpu" in f.details:
            f.cause = (f"{f.details['gpu']} has compute capability {f.details.get('capability', '?')}. "
                       + f.cause)

    def _first_failure(self, findings: list[Finding]) -> Failure | None:
        fatal = [f for f in findings if f.status == "fatal"]
        if not fatal:
            return None
        causes = [f for f in fatal if f.role == Role.CAUSE.value]
        if causes:
            f = min(causes, key=lambda x: x.first_line)
            return Failure(f.first_line, f.text, f.id, f.cause, f.fix)
        if self.first_unknown is not None:
            ln, phase = self.first_unknown
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
