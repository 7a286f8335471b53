"""One bench from start to report: find the server and its model, plan the runs, measure them between
two readings of the spec-decode counters, then compare with the matched profile and list the host
findings that explain a gap (on the serving machine only)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import SettingError
from ..policy.profiles import load_table
from ..runtime.facts import Facts
from ..runtime.probe import load_facts
from ..server_api.address import is_loopback
from ..server_api.client import ServerClient
from ..server_api.transport import Deadline, StepError
from ..server_api.readiness import wait_until_ready
from .expected import compare, match_profile, no_expected_reason
from .measure import Bench, BenchConfig, BenchFailed, default_concurrency, default_prompt_tokens
from .metrics import acceptance, read_counters, server_figures
from .prefix_probe import OUTPUT_TOKENS as PROBE_OUTPUT, PrefixProbe, run_prefix_probe
from .report import BenchReport, summarize
from .server_args import learn_cudagraph_mode, learn_max_num_seqs

_MODELS_TIMEOUT_S = 10.0
PROBE_PROMPT_TOKENS = 4096   # the prefix probe's default prompt, capped by the server's max_model_len
_POLL_S = 0.5


@dataclass(frozen=True)
class BenchOptions:
    """The command's settings; None prompt lengths / concurrency: the defaults for this server."""

    api_base: str
    model: str
    api_key: str | None
    prompt_tokens: tuple[int, ...] | None
    output_tokens: int
    concurrency: tuple[int, ...] | None
    repeats: int
    wait_s: float
    request_timeout_s: float
    facts: str = ""


def run_bench(opts: BenchOptions, say: Callable[[str], None]) -> BenchReport:
    """Measure, compare and explain. Raises NotReady (server not up), SettingError (bad input for this
    server) or BenchFailed (a request failed)."""
    notes: list[str] = []
    concurrency = opts.concurrency
    if concurrency is None:
        concurrency, note = default_concurrency(*learn_max_num_seqs(opts.api_base))
        notes.append(note)
    with ServerClient(opts.api_base, opts.api_key, max_connections=max(concurrency)) as client:
        ready = wait_until_ready(client, opts.model, opts.wait_s, _POLL_S,
                                 lambda what, waited: say(f"waiting {waited:.0f} s for {what}"))
        lengths = opts.prompt_tokens
        if lengths is None:
            lengths, note = default_prompt_tokens(ready.max_model_len, opts.output_tokens)
            notes += [note] if note else []
        _check_fits(lengths, opts.output_tokens, ready.max_model_len)
        config = BenchConfig(ready.model, lengths, opts.output_tokens, concurrency, opts.repeats,
                             opts.request_timeout_s)
        bench = Bench(client, config, say)
        try:
            bench.warm()
        except StepError as err:
            raise BenchFailed(client.redact(f"the untimed first request failed: {err}")) from None
        before = read_counters(client)
        runs = bench.run_all()
        after = read_counters(client)
        root = _model_root(client, ready.model)
    rows = [summarize(r) for r in runs]
    mtp = acceptance(before, after)
    notes += _token_notes(bench, rows)
    graphs, graphs_how = learn_cudagraph_mode(opts.api_base)
    report = BenchReport(
        server={"api_base": client.api_base, "model": ready.model, "max_model_len": ready.max_model_len,
                "cudagraph_mode": graphs, "cudagraph_mode_how": graphs_how},
        settings={"prompt_tokens": list(lengths), "output_tokens": opts.output_tokens,
                  "concurrency": list(concurrency), "repeats": opts.repeats,
                  "token_lengths": bench.fitter.token_lengths},
        runs=rows, mtp=mtp, profile={}, expected=None, causes=None, notes=notes,
        server_metrics=server_figures(before, after))
    _explain(report, opts, root, mtp is not None)
    return report


def run_probe(opts: BenchOptions, say: Callable[[str], None]) -> tuple[dict, PrefixProbe]:
    """The prefix probe alone (--prefix-probe): (the server's description, the probe). Raises as run_bench."""
    with ServerClient(opts.api_base, opts.api_key, max_connections=1) as client:
        ready = wait_until_ready(client, opts.model, opts.wait_s, _POLL_S,
                                 lambda what, waited: say(f"waiting {waited:.0f} s for {what}"))
        length = opts.prompt_tokens[0] if opts.prompt_tokens else PROBE_PROMPT_TOKENS
        if not opts.prompt_tokens and ready.max_model_len is not None:
            length = max(8, min(length, ready.max_model_len - PROBE_OUTPUT - 64))  # room for the chat template
        _check_fits((length,), PROBE_OUTPUT, ready.max_model_len)
        probe = run_prefix_probe(client, ready.model, length, opts.request_timeout_s, say)
    server = {"api_base": client.api_base, "model": ready.model, "max_model_len": ready.max_model_len}
    return server, probe


def _check_fits(lengths: tuple[int, ...], output_tokens: int, max_model_len: int | None) -> None:
    if max_model_len is not None and max(lengths) + output_tokens > max_model_len:
        raise SettingError(f"--prompt-tokens {max(lengths)} + --output-tokens {output_tokens} is over the server's "
                           f"max_model_len {max_model_len}")


def _model_root(client: ServerClient, model: str) -> str | None:
    """The model's path as the server loaded it (`root` in GET /v1/models), or None."""
    try:
        cards = client.get("/v1/models", Deadline.after(_MODELS_TIMEOUT_S)).json()["data"]
        root = next(c.get("root") for c in cards if isinstance(c, dict) and c.get("id") == model)
    except (StepError, ValueError, KeyError, TypeError, StopIteration):
        return None
    return root if isinstance(root, str) else None


def _token_notes(bench: Bench, rows: list[dict]) -> list[str]:
    notes = []
    if bench.fitter.tokenize_available is False:
        notes.append("the server has no /tokenize: prompt lengths are estimates, not exact")
    if bench.counted_by_tokenize:
        notes.append("the stream carried no usage: generated tokens were counted with /tokenize")
    if any("uncounted" in r["tokens_from"] for r in rows):
        notes.append("some streams could not be counted (no usage, no /tokenize): their decode speed is unknown "
                     "(chunks are not tokens)")
    return notes


def _facts_for(opts: BenchOptions) -> Facts | None:
    """The serving machine's facts: --facts, else a probe of this machine when the server is local."""
    if opts.facts or is_loopback(opts.api_base):
        return load_facts(opts.facts)
    return None


def _explain(report: BenchReport, opts: BenchOptions, root: str | None, mtp_seen: bool) -> None:
    """Fill the profile, the comparison and the causes of `report`."""
    facts = _facts_for(opts)
    if facts is None:
        why = "the server is on another machine: pass --facts FILE (its caovan-sm75-doctor --json) to compare"
        report.profile = {"name": None, "why": why}
        report.notes.append(f"expected: {why}")
        report.notes.append("causes: not checked, the host checks read the serving machine")
        return
    match = match_profile(load_table(), facts, root if is_loopback(opts.api_base) else None, report.server["model"])
    report.profile = match.to_dict()
    exp = match.profile.expected if match.profile else None
    if match.profile is None or exp is None:
        report.notes.append(f"expected: {no_expected_reason(match)}")
    else:
        report.expected = compare(match.profile, exp, report.runs, mtp_seen)
    from ..policy.host_checks import host_checks  # lazily: the doctor's host checks are only needed here

    report.causes = [c.to_dict() for c in host_checks(facts) if c.status == "WARN"]
