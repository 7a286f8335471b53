"""Known messages of a start: the start rule's own verdicts, failures before the engine exists, memory at
start, time-outs and our own dispatch line. Texts from vLLM 0.21's sources (checked against later releases
where they changed); the file each comes from is named beside it."""

from __future__ import annotations

import re

from ..logformat import dispatch_failed_line
from .signature import WARMUP_FIX, Role, Rule, Signature, Wording

START: tuple[Signature, ...] = (
    # Not spotted by a needle: triage adds it at the first unexplained exception, AssertionError,
    # CRITICAL line or fatal signal of a log that never became ready and names no known cause.
    Signature(
        id="unexplained-failure",
        shown=("an exception, `AssertionError`, `CRITICAL` line or fatal signal (`Segmentation fault`, "
               "`Fatal Python error`, ...) in a log that never became ready, when no known cause is found"),
        title="the server never became ready: an error of no known cause",
        needles=(),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause="No known cause: this is the first error of a start that never became ready, which is usually the root cause.",
        fix=("Read the lines around it; search the vLLM issues for its last line, and report it to us with the "
             "log if it is about SM75.")),
    # Not spotted by a needle: triage adds it where a log never shows the server ready and either
    # shows an error but not whether the engine stopped, or ends in a start-up phase (the start rule).
    Signature(
        id="start-undecided",
        shown=("a log that never shows the server ready: an error without the engine stopping, or an end "
               "while loading, profiling, sizing the KV cache, capturing CUDA graphs or warming up"),
        title="the start is not decided in this log",
        needles=(),
        rule=Rule.WARNING, role=Role.SYMPTOM,
        cause="A start that never became ready is not OK, but this log does not show how it ended.",
        fix=("Send the whole log, from the start to 'Application startup complete' or to the process's end "
             "(`journalctl -u SERVICE --no-pager`, `docker logs CONTAINER 2>&1`); a start that is still "
             "going on: wait for 'Application startup complete' (the first start on SM75 compiles kernels "
             "for minutes).")),
    # Not spotted by a needle: the first real failure where the log shows only consequences
    # (EngineDeadError, HTTP 500): the failure itself is not in it.
    Signature(
        id="cause-not-in-log",
        shown="only consequences (`EngineDeadError`, HTTP 500) and no error before them",
        title="the failure itself is not in this log",
        needles=(),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("The error that stopped the engine happened before this log (or excerpt) begins, or was left "
               "out of it."),
        fix=("Find the first ERROR or Traceback before this line in the whole log (`journalctl -u SERVICE "
             "--no-pager`, `docker logs CONTAINER 2>&1`), and run `caovan-sm75-doctor --log` on the whole "
             "log.")),
    # Not spotted by a needle: the judge adds it (judge.py, rule crash-after-serving) at the first
    # crash sign after the server served, where no known cause was found after serving.
    Signature(
        id="crash-after-serving",
        shown=("after the server served: an engine-core or worker error traceback (whole, cut, or frames only), "
               "a CUDA error (illegal memory access, device-side assert, unspecified launch failure), an NCCL "
               "watchdog failure"),
        title="the engine crashed after the server had served",
        needles=(),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("The server was up and answering, then the engine failed; what follows (EngineDeadError, HTTP "
               "500, a dead worker) is the consequence. A CUDA error after serving means a kernel broke the "
               "GPU context: the process cannot go on."),
        fix=("Read the traceback at this line; restart the server (it does not recover). If a kernel of ours "
             "is in it (GDN prefill, Caovan attention), switch it off (CAOVAN_GDN_LEGACY_DISABLE=1, or leave "
             "out --attention-backend CUSTOM) and report it with the log; CUDA_LAUNCH_BLOCKING=1 names the "
             "kernel that failed.")),
    # -- failures before the engine exists: the API server's own traceback, no EngineCore lines --
    # Python's OSError for bind(); uvicorn and vLLM's API server raise it as it is.
    Signature(
        id="address-in-use",
        title="the port is taken: another server already listens on it",
        # OSError's "Address already in use"; uvicorn's "[Errno 98] error while attempting to bind on
        # address ('0.0.0.0', 8000): address already in use", after its startup line
        needles=("ddress already in use",),
        extract=re.compile(r"\(\s*'?(?P<host>[\w.:\[\]-]*)'?,\s*(?P<port>\d+)\)|port (?P<port_word>\d+)"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("Another process already listens on the address vLLM was asked to serve on (usually a vLLM "
               "still running from an earlier start), so the API server stopped before any engine started."),
        fix=("Stop the other server (`ss -ltnp` names the process on the port) or start this one with "
             "another --port.")),
    # vllm/transformers_utils/config.py (model path checks); huggingface_hub's HFValidationError and
    # RepositoryNotFoundError when a path that does not exist is taken for a repository id.
    Signature(
        id="model-not-found",
        shown=("`Invalid repository ID or local directory specified`, `HFValidationError`, "
               "`RepositoryNotFoundError`, `is not a local folder and is not a valid model identifier`"),
        title="vLLM could not find the model",
        needles=("HFValidationError", "RepositoryNotFoundError", "Repository Not Found",
                 "is not a local folder and is not a valid model identifier"),
        wordings=(Wording("Invalid repository ID or local directory specified:", "0.21-0.34",
                          "vllm/transformers_utils/config.py"),),
        extract=re.compile(r"specified: '(?P<model>[^']*)'|: '(?P<repo>[^']*)'\.? Use `repo_type`"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("The model argument is neither a local folder holding a config.json nor a Hugging Face "
               "repository id that could be reached, so vLLM stopped before any engine started."),
        fix=("Give the absolute path of the model folder (the one holding config.json), or a repository id "
             "that exists; a machine without internet needs the local path (HF_HUB_OFFLINE=1).")),
    # huggingface_hub.errors.GatedRepoError (HTTP 401/403 on a gated repository).
    Signature(
        id="gated-repo",
        shown="`GatedRepoError`, `Cannot access gated repo`, `Access to model ... is restricted`",
        title="the model is gated: no access with this token",
        needles=("GatedRepoError", "Cannot access gated repo", "is restricted. You must have access"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("The model's repository on the Hub is gated: downloading needs a token of an account that "
               "accepted the model's licence, and none (or another one) was sent."),
        fix=("Accept the licence on the model's page, then `huggingface-cli login` or set HF_TOKEN; or "
             "download the model once and serve its local folder.")),
    # argparse, through vLLM's FlexibleArgumentParser: "vllm serve: error: unrecognized arguments: ...".
    Signature(
        id="bad-argument",
        shown="`vllm serve: error: <what>` (argparse)",
        title="vLLM refused its command line",
        needles=(": error: unrecognized arguments", ": error: argument ", ": error: the following arguments"),
        confirm=re.compile(r"\bvllm(?: [\w-]+)?: error: (?P<what>.+)"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause="vLLM's argument parser refused a flag (this release does not know it) or a value.",
        fix=("`vllm serve --help=all` lists this release's flags; `caovan-vllm-serve --dry-run ...` checks "
             "a command line against the installed vLLM's own parser before anything starts.")),
    # vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory (0.21: "model's"/"models's" by release).
    Signature(
        id="kv-cache-too-small",
        shown=("`... KV cache is needed, which is larger than the available KV cache memory`, "
               "`No available memory for the cache blocks`"),
        title="the KV cache cannot hold one request of --max-model-len tokens",
        # Read in every release's wheel (2026-12-05): kv_cache_utils.py up to 0.32, kv_cache_planning.py from 0.33.
        wordings=(Wording("cache is needed, which is larger than the available KV cache", "0.21-0.32",
                          "vllm/v1/core/kv_cache_utils.py"),
                  Wording("cache is needed, which is larger than the available KV cache", "0.33-0.34",
                          "vllm/v1/core/kv_cache_planning.py"),
                  Wording("No available memory for the cache blocks. ", "0.21-0.32",
                          "vllm/v1/core/kv_cache_utils.py"),
                  Wording("No available memory for the cache blocks. ", "0.33-0.34",
                          "vllm/v1/core/kv_cache_planning.py")),
        # vLLM's V0 engine (before 0.11): "The model's max seq len (29000) is larger than the maximum
        # number of tokens that can be stored in KV cache (23648)."
        needles=("is larger than the maximum number of tokens that can be stored in KV cache",),
        extract=re.compile(r"max seq len \((?P<max_model_len>\d+)\), \((?P<needed>[\d.]+) GiB KV cache is needed"
                           r".*?KV cache memory \((?P<available>[\d.]+) GiB\)"
                           r"(?:.*?estimated maximum model length is (?P<estimated_max_len>\d+))?"
                           r"|max seq len \((?P<v0_max_model_len>\d+)\) is larger than the maximum number of tokens "
                           r"that can be stored in KV cache \((?P<v0_estimated_max_len>\d+)\)"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("The memory left for the KV cache after the weights and the profile run is smaller than one "
               "request of --max-model-len tokens needs."),
        fix=("Lower --max-model-len, or give the cache more room: fp8 KV (--kv-cache-dtype fp8), more GPUs "
             "(--tensor-parallel-size), a slightly higher --gpu-memory-utilization; on vLLM's CPU build the "
             "cache size is VLLM_CPU_KVCACHE_SPACE (GiB).")),
    # vllm/v1/worker/utils.py (request_memory): another process holds GPU memory at start.
    Signature(
        id="gpu-memory-busy",
        title="less GPU memory is free at start than --gpu-memory-utilization asks for",
        needles=(),
        wordings=(Wording("is less than desired GPU memory utilization", "0.21-0.34", "vllm/v1/worker/utils.py"),),
        extract=re.compile(r"\((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) on startup is less than desired GPU memory "
                           r"utilization \((?P<utilization>[\d.]+),"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause="Another process holds memory on the GPU, so the share vLLM was told to take is not free.",
        fix=("Stop the other process (nvidia-smi lists it), or lower --gpu-memory-utilization below the free "
             "share.")),
    # vllm/distributed/device_communicators/shm_broadcast.py LONG_WAIT_TIME_LOG_MSG (INFO; older
    # releases said "in %s second." at DEBUG).
    Signature(
        id="shm-broadcast-wait",
        title="a process waited 60 s or more for another (shared-memory broadcast)",
        needles=("No available shared memory broadcast block found",),
        extract=re.compile(r"found\s+in (?P<seconds>\d+) seconds?"),
        rule=Rule.UNTIL_READY, role=Role.SYMPTOM,
        cause=("One process (usually a TP worker) was busy for a long time: on a cold start that is "
               "JIT compilation (Triton, torch.compile, FlashInfer), weight loading or CUDA-graph capture. "
               "It is harmless when the server answers afterwards; when TimeoutError, EngineDeadError or "
               "HTTP 500 follow, the wait outlasted a timeout or a worker hung."),
        fix=WARMUP_FIX),
    # vllm/v1/executor/multiproc_executor.py: TimeoutError(f"RPC call to {method} timed out.")
    Signature(
        id="execute-timeout",
        shown='`RPC call to <method> timed out`',
        title="a worker did not answer within the execute timeout",
        needles=("RPC call to ",),
        confirm=re.compile(r"RPC call to (?P<method>\w+) timed out"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("With tensor parallelism vLLM gives each step VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (300 s "
               "by default). On SM75 the first request of a new shape compiles kernels for longer than "
               "that, so the engine gives up and dies (EngineDeadError, then HTTP 500)."),
        fix=WARMUP_FIX),
    # Our own line, plugin/ GDN dispatch (logformat.dispatch_failed_line).
    Signature(
        id="caovan-dispatch-failed",
        shown=f"`{dispatch_failed_line('<name>', '<reason>')}`",
        title="our GDN kernels were switched off in a process (fell back to vLLM's)",
        needles=("dispatch failed on interface",),
        confirm=re.compile(r"dispatch failed on interface (?P<interface>[\w.:-]+): ?(?P<reason>.*)"),
        rule=Rule.WARNING, role=Role.CAUSE,
        cause=("The plugin could not use its GDN prefill in this process (the reason is on the line) "
               "and fell back to vLLM's kernel: the server runs, without the SM75 speed-up there."),
        fix=("Set CAOVAN_GDN_LEGACY_DISABLE=1 to stay on vLLM's GDN prefill on purpose and skip the "
             "attempt; with CAOVAN_REQUIRE_TURBO3=1 this line stops the start instead. Please report "
             "the reason.")),
)
