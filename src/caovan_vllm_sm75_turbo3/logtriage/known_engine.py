"""Known messages of a running engine: CUDA, FlashInfer, attention backends, quantization, NCCL, memory,
our status lines, and the harmless ones people ask about on Turing boxes. Texts from the sources of vLLM
0.21 (checked against later releases where they changed), Triton 3.6, FlashInfer 0.6 and PyTorch."""

from __future__ import annotations

import re

from ..logformat import NOT_APPLIED, NOT_DISPATCHED, PRODUCT
from .signature import GDN_FIX, SAMPLER_FIX, Role, Rule, Signature

ENGINE: tuple[Signature, ...] = (
    # CUDA runtime error text, raised through torch ("CUDA error: invalid resource handle").
    Signature(
        id="gdn-legacy-failure",
        shown=('`CUDA error: invalid resource handle`, `GDN prefill kernel warmup failed`, '
               '`flashqla_legacy` or `legacy-gdn-linear-attn-v020` on an error line or in a traceback'),
        title="the legacy SM75 GDN kernel path failed",
        needles=("CUDA error: invalid resource handle", "GDN prefill kernel warmup failed",
                 "flashqla_legacy", "legacy-gdn-linear-attn-v020"),
        error_context=True,
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("A GDN (linear-attention) prefill kernel failed on this card; 'invalid resource handle' "
               "is what CUDA says when a kernel or stream handle from another context or graph is used."),
        fix=GDN_FIX),
    # flashinfer/jit/cpp_ext.py run_ninja ("Ninja build failed."), get_cuda_path, get_cuda_version;
    # ninja's own "ninja: build stopped: subcommand failed."; nvcc's "fatal error: curand.h: ...".
    Signature(
        id="flashinfer-sampler-jit",
        shown=("`curand.h: No such file`, `Ninja build failed`, `ninja: build stopped`, `Could not find nvcc`, "
               "`nvcc not found` with FlashInfer's sampling sources within 80 lines"),
        title="FlashInfer's sampling kernels failed to compile (JIT)",
        needles=("curand.h: No such file", "Ninja build failed", "ninja: build stopped",
                 "Could not find nvcc", "nvcc not found", "nvcc: not found", "nvcc: command not found"),
        context=("cached_ops/sampling", "sampling.cu", "flashinfer/sampling", "topk_topp_sampler",
                 "flashinfer_sample", "top_k_top_p_sampling"),
        otherwise="jit-build-failed",
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("vLLM turned on FlashInfer's top-k/top-p sampler, whose CUDA code is compiled on first "
               "use; that build fails under some CUDA 12.9/13 toolchains (curand.h missing, no nvcc, "
               "a compiler that does not match torch's CUDA)."),
        fix=SAMPLER_FIX),
    Signature(
        id="jit-build-failed",
        shown="the same build errors without FlashInfer's sampling sources nearby",
        title="a CUDA JIT build (nvcc/ninja) failed",
        needles=(),   # only reached through flashinfer-sampler-jit's `otherwise`
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("A kernel that is compiled on first use could not be built: nvcc is missing, its CUDA "
               "release does not match torch's, or a header (curand.h, cuda_fp16.h) is not installed."),
        fix=("Run `caovan-sm75-doctor`: its nvcc/ptxas check names the mismatch. Put a CUDA toolkit "
             "matching torch's CUDA on PATH (or set CUDA_HOME), and start through `caovan-vllm-serve` "
             "so builds target sm_75 only (CAOVAN_ARCH_GUARD=1).")),
    # A traceback through FlashInfer's sampling (vLLM's _dummy_sampler_run at start calls it through
    # topk_topp_sampler.py): on SM75 its kernels fail to build or to run; the frames say where.
    Signature(
        id="flashinfer-sampler-failed",
        shown=("FlashInfer's sampling in a traceback (`flashinfer/sampling.py`, `top_k_top_p_sampling_from_probs`, "
               "`flashinfer_sample`), e.g. under `_dummy_sampler_run`"),
        title="FlashInfer's sampler failed (at start: vLLM's dummy sampler run)",
        needles=("flashinfer/sampling.py", "flashinfer/sampling/", "flashinfer.sampling", "flashinfer_sample",
                 "top_k_top_p_sampling_from_probs", "top_k_top_p_sampling_from_logits"),
        error_context=True,
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("vLLM ran FlashInfer's top-k/top-p sampler (at start in its dummy sampler run), and it failed on "
               "this GPU: FlashInfer's JIT build or its kernels do not support SM75 in this release."),
        fix=SAMPLER_FIX),
    # vllm/v1/sample/ops/topk_topp_sampler.py, raised when the user forced the sampler on
    # (0.34: "FlashInfer top-p/top-k sampling unavailable: <why>. Unset VLLM_USE_FLASHINFER_SAMPLER=1.").
    Signature(
        id="flashinfer-sampler-refused",
        title="FlashInfer sampler forced on for a GPU it does not support",
        needles=("FlashInfer does not support compute capability", "FlashInfer top-p/top-k sampling unavailable:"),
        confirm=re.compile(r"does not support compute capability|[Uu]nset VLLM_USE_FLASHINFER_SAMPLER=1"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause="VLLM_USE_FLASHINFER_SAMPLER=1 was set, and this vLLM refuses FlashInfer on this compute capability.",
        fix="Unset VLLM_USE_FLASHINFER_SAMPLER (or set it to 0). " + SAMPLER_FIX),
    # vllm/v1/attention/backends/flash_attn.py (0.7-0.8, V1 on Turing before vLLM PR #12828):
    # `assert is_fa_version_supported(self.fa_version)`, a bare AssertionError; the frame names it.
    Signature(
        id="fa2-unsupported",
        shown="`is_fa_version_supported` on an error line or in a traceback (its AssertionError says nothing)",
        title="vLLM chose FlashAttention, which needs SM80, on this GPU",
        needles=("is_fa_version_supported",),
        error_context=True,
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("FlashAttention 2 needs compute capability 8.0 (Ampere); this vLLM picked it for a Turing "
               "(SM75) or older GPU and its version check failed."),
        fix=("Choose a backend that runs on SM75: --attention-backend TRITON_ATTN (vLLM 0.10+; older: "
             "VLLM_ATTENTION_BACKEND=XFORMERS), or run a vLLM from 0.8 on, which no longer picks "
             "FlashAttention there; `caovan-vllm-serve` sets the backend for SM75.")),
    # A component that works only with FlashAttention (LMCache's connector, 2025: "Only FlashAttention
    # backend is supported for now."), on a GPU where vLLM uses another backend.
    Signature(
        id="needs-flash-attention",
        title="a component needs FlashAttention, which this GPU cannot run",
        needles=("Only FlashAttention backend is supported",),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("A connector or extension (LMCache's KV connector, for one) supports only vLLM's FlashAttention "
               "backend; on Turing (SM75) vLLM uses another backend, since FlashAttention 2 needs SM80."),
        fix=("Start without that connector or extension (drop its --kv-transfer-config), or use a release of "
             "it that supports the Triton or XFormers attention backends.")),
    # vllm/model_executor/model_loader (_get_quantization_config): "The quantization method X is not
    # supported for the current GPU. Minimum capability: 80. Current capability: 75."; compressed
    # tensors' _check_scheme_supported: "... Min capability: 80. ', 'Current capability: 75."
    Signature(
        id="quant-capability",
        shown=("`Minimum capability: N. Current capability: M`, `Min capability: N`, or "
               "`_check_scheme_supported` / `_get_quantization_config` on an error line or in a traceback"),
        title="the checkpoint's quantization needs a newer GPU",
        needles=("Minimum capability:", "Min capability:", "Min capability ", "_check_scheme_supported",
                 "_get_quantization_config"),
        confirm=re.compile(r"[Mm]in(?:imum)? capability:? ?(?P<min>\d+)"
                           r"|_check_scheme_supported|_get_quantization_config"),
        extract=re.compile(r"[Cc]urrent capability:? ?(?P<current>\d+)"),
        error_context=True,
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("The quantization kernels of this checkpoint (or of the --quantization asked for) need a higher "
               "compute capability than this GPU's: Marlin, FP8 and NVFP4 kernels need 8.0 or more; AWQ "
               "needs 7.5, so it runs on Turing but not on Volta (7.0)."),
        fix=("Use a checkpoint in a format whose kernels run on this GPU (on SM75: AWQ with --quantization awq, "
             "GPTQ with --quantization gptq), or let vLLM pick (drop --quantization *_marlin); "
             "`caovan-sm75-doctor --model PATH` reads a checkpoint's quantization.")),
    # NCCL's error names through torch.distributed ("NCCL error in: ..., unhandled system error"),
    # and its communicator set-up in a traceback.
    Signature(
        id="nccl-init-failed",
        shown="`NCCL error`, `ncclSystemError`, `ncclInternalError`, `ncclUnhandledCudaError`, `ncclCommInitRank`",
        title="NCCL could not connect the GPUs (tensor/pipeline parallel)",
        needles=("NCCL error", "ncclSystemError", "ncclInternalError", "ncclUnhandledCudaError",
                 "ncclInvalidUsage", "ncclRemoteError", "ncclCommInitRank"),
        error_context=True,
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("NCCL failed to set up communication between the GPUs: on consumer cards (RTX 2080 Ti) "
               "peer-to-peer over PCIe is often missing or broken, in a container /dev/shm is too small, "
               "or the GPUs of another node are not reachable."),
        fix=("Retry with NCCL_P2P_DISABLE=1; in docker add --ipc=host (or --shm-size 16g); set NCCL_DEBUG=INFO "
             "to see which step fails; `caovan-sm75-doctor` checks peer access between the GPUs.")),
    # The CUDA runtime's cudaErrorNoKernelImageForDevice, raised through torch or a kernel library.
    Signature(
        id="no-kernel-image",
        title="a CUDA library here has no code for this GPU",
        needles=("no kernel image is available for execution on the device",),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("A compiled CUDA library in this environment (vLLM's, torch's, or a kernel package's) was built "
               "without code for this GPU's architecture (sm_75 on Turing) and without PTX the driver could "
               "compile: wheels built for Ampere and later only, or a source build whose TORCH_CUDA_ARCH_LIST "
               "left 7.5 out."),
        fix=("Install builds that include sm_75 (vLLM's own PyPI wheels of 0.21-0.34 and torch's cu12x/cu13x "
             "wheels do); rebuild a source build with TORCH_CUDA_ARCH_LIST=7.5; `caovan-sm75-doctor` names the "
             "installed vLLM, torch and Triton.")),
    # The dynamic loader through Python's ImportError: a compiled extension built against another torch.
    Signature(
        id="abi-mismatch",
        title="a compiled extension does not match the installed torch",
        needles=("undefined symbol:",),
        confirm=re.compile(r"(?P<library>[\w./-]+\.so)\S*: undefined symbol: (?P<symbol>\S+)"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("An extension (vLLM's _C, FlashAttention, xformers, ...) was compiled against another torch than "
               "the one installed: the symbol it needs is not there. It happens after torch was upgraded or "
               "downgraded beside a vLLM wheel that pins another."),
        fix=("Install the torch the vLLM release pins (`pip install vllm==X` brings it; `pip show vllm` lists "
             "the pin), or reinstall the extension named here for the installed torch. Our wheel never changes "
             "torch, Triton or vLLM.")),
    # torch and vLLM's platform detection when no GPU is visible to the process (a container started
    # without --gpus, a wrong CUDA_VISIBLE_DEVICES, a driver that is not loaded).
    Signature(
        id="no-gpu-visible",
        title="no GPU is visible to vLLM",
        needles=("Failed to infer device type", "No CUDA GPUs are available", "Found no NVIDIA driver on your system"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("vLLM found no CUDA GPU in this process: the container was started without the GPUs, "
               "CUDA_VISIBLE_DEVICES names none that exists, or the NVIDIA driver is not loaded."),
        fix=("Run `nvidia-smi` where vLLM runs; in docker add `--gpus all` (with the NVIDIA container toolkit); "
             "check CUDA_VISIBLE_DEVICES; `caovan-sm75-doctor` reports the driver and the GPUs it sees.")),
    # vllm/platforms/cuda.py check_if_supports_dtype.
    Signature(
        id="bf16-unsupported",
        title="bfloat16 requested on a GPU without bfloat16",
        needles=("Bfloat16 is only supported on GPUs with compute capability of at least 8.0",
                 "does not support bfloat16", "check_if_supports_dtype"),
        extract=re.compile(r"Your (?P<gpu>.+?) GPU has compute capability (?P<capability>\d+\.\d+)"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("The model's config asks for bfloat16, and Turing (SM75) has no bfloat16: vLLM refuses "
               "to start."),
        fix="Add `--dtype half` (float16) to the command line."),
    # triton/runtime/errors.py OutOfResources.__str__, raised from triton/compiler/compiler.py.
    Signature(
        id="triton-shared-memory",
        title="a Triton kernel needs more shared memory than the GPU has",
        needles=("out of resource: shared memory", "OutOfResources"),
        confirm=re.compile(r"shared memory, Required: (?P<required>\d+), Hardware limit: (?P<limit>\d+)"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("The kernel's block sizes / num_stages were tuned for newer GPUs: SM75 has 64 KiB "
               "(65,536 bytes) of shared memory per block, Ampere and later 100 KiB or more."),
        fix=("Start through `caovan-vllm-serve` with CAOVAN_MODE=auto so that the GDN kernels use our "
             "configs that fit in 64 KiB. If the kernel named here is not a GDN kernel, it needs smaller "
             "block sizes or num_stages=1 upstream: report it with this log.")),
    # vllm/v1/attention/backends/triton_attn.py (0.24-0.34): "FP8 KV cache is not supported by the Triton
    # attention backend on <GPU> (compute capability 7.5); native FP8 (fp8e4nv) requires SM89+." Raised for
    # the MTP drafter, which picks its own backend (policy/vllm_versions.py: drafter-picks-own-attention-backend).
    Signature(
        id="fp8-kv-mtp-drafter",
        title="fp8 KV refused by the speculative drafter's attention backend",
        needles=("FP8 KV cache is not supported by the Triton attention backend ",),   # 0.24-0.34 only: no Wording
        context=("llm_base_proposer", "Loading drafter model", "drafter.load_model", "_mtp.py"),
        otherwise="fp8-kv-unsupported",
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("Speculative decoding (MTP) was on with fp8 KV. vLLM never gives the drafter the "
               "--attention-backend of the model: it picks its own, TRITON_ATTN on SM75, and from vLLM 0.24 "
               "that backend refuses fp8 KV below SM89, even where our backend (CUSTOM) serves the model's "
               "layers."),
        fix=('Add "attention_backend":"CUSTOM" to --speculative-config (for example '
             '\'{"method":"mtp","num_speculative_tokens":3,"attention_backend":"CUSTOM"}\'; our engine check '
             'proved it exact on 0.24, a prefix-cache hit under MTP among its prompts), or serve fp16 KV '
             '(--kv-cache-dtype auto). `caovan-vllm-serve` fills fp8 KV beside MTP on 0.24 with the drafter\'s '
             'backend named, fp16 KV on releases the check has not run, and names it when you ask for fp8.')),
    # triton/language/core.py: "type fp8e4nv not supported in this architecture. The supported fp8
    # dtypes are ..." (e4m3 needs SM89); vllm/platforms/cuda.py: "No valid attention backend found
    # for cuda with AttentionSelectorConfig(... kv_cache_dtype=fp8 ...). Reasons: {...}"; the Triton
    # attention message above, without the drafter around it.
    Signature(
        id="fp8-kv-unsupported",
        shown=('`type fp8e4nv not supported`, '
               '`No valid attention backend found` with `kv_cache_dtype=fp8` or `kv_cache_dtype not supported`, '
               '`FP8 KV cache is not supported by the Triton attention backend` (0.24+)'),
        title="fp8 KV cache refused on this GPU",
        needles=("fp8e4nv not supported", "No valid attention backend found",
                 "FP8 KV cache is not supported by the Triton attention backend "),
        confirm=re.compile(r"fp8e4nv not supported|kv_cache_dtype=(?P<kv_cache_dtype>fp8\w*)"
                           r"|kv_cache_dtype not supported|FP8 KV cache is not supported"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("fp8 (e4m3) needs SM89 in Triton; from vLLM 0.24 the Triton attention backend also rejects "
               "fp8 KV below SM89, so on SM75 there is no built-in backend for it."),
        fix=("From vLLM 0.24 serve fp8 KV through our attention backend (--attention-backend CUSTOM, with "
             "the plugin on: `caovan-vllm-serve` fills it), or serve with vLLM 0.21-0.23 (0.21.0 is the "
             "reference release: `pip install vllm==0.21.0`), where fp8 KV works on SM75, or drop "
             "`--kv-cache-dtype fp8` (use `auto`: fp16 KV, half the tokens per GiB) and lower "
             "--max-model-len to fit.")),
    # torch: "CUDA out of memory. Tried to allocate ..."; vllm/v1/worker/gpu_model_runner.py load_model
    # and _dummy_sampler_run; vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory.
    Signature(
        id="cuda-oom",
        title="the GPU ran out of memory",
        needles=("CUDA out of memory", "OutOfMemoryError", "Failed to load model - not enough GPU memory"),
        extract=re.compile(r"Tried to allocate (?P<tried>[\d.]+ [KMG]iB)(?:\. GPU \d+ has a total capacity of "
                           r"(?P<total>[\d.]+ [KMG]iB).*?Of the allocated memory (?P<allocated>[\d.]+ [KMG]iB))?"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause="The memory the start-up step needed was not free on the GPU.",
        fix=("Lower --gpu-memory-utilization by 0.02-0.05 or --max-num-seqs / --max-num-batched-tokens; "
             "`caovan-vllm-serve` fills these from the hardware profile (CAOVAN_PROFILE=auto). Check that "
             "nothing else holds GPU memory (nvidia-smi)."),
        fixes_by_phase={
            "load": ("The weights alone do not fit, so a lower --gpu-memory-utilization cannot help: use a "
                     "quantised checkpoint (AWQ/GPTQ INT4), --dtype half where the checkpoint is float32, or "
                     "more GPUs (--tensor-parallel-size 2); check nvidia-smi for other processes on the GPU."),
            "profile": ("The profile run (one forward pass of --max-num-batched-tokens tokens) did not fit: "
                        "lower --max-num-batched-tokens (e.g. 4096) and --max-num-seqs; "
                        "`caovan-vllm-serve` takes them from the hardware profile (CAOVAN_PROFILE=auto)."),
            "kv-cache": ("The KV cache did not fit in what is left: lower --max-model-len or --max-num-seqs, "
                         "or use fp8 KV (--kv-cache-dtype fp8)."),
            "graph-capture": ("CUDA-graph capture needs memory beyond the KV cache: lower "
                              "--gpu-memory-utilization by 0.02-0.05, capture fewer sizes (--compilation-config "
                              "'{\"cudagraph_mode\":\"PIECEWISE\",\"cudagraph_capture_sizes\":[1,2,4,8]}'), "
                              "or --enforce-eager."),
            "serving": ("A request needed more memory than was left: lower --max-num-seqs / "
                        "--max-num-batched-tokens or --gpu-memory-utilization."),
        }),
    # The kernel's OOM killer (SIGKILL = exit 137; vLLM reports -9 for the core process): shells
    # print "Killed", vllm/v1/engine/utils.py "Engine core initialization failed ... Failed core
    # proc(s): {'EngineCore_DP0': -9}", 0.34's multiproc_executor.py "Worker proc NAME died
    # unexpectedly (exit code: -9)" and "died with exit code -9", dmesg "Out of memory: Killed process".
    Signature(
        id="host-oom-kill",
        shown=('a `Killed` line, `exited with code 137`, `Out of memory: Killed process`, '
               '`Failed core proc(s): {...: -9}`'),
        title="a process was killed by the host's out-of-memory killer",
        needles=("Killed", "exit", "Failed core proc(s)", "oom-kill", "oom_reaper"),   # every form of `confirm`
        confirm=re.compile(r"^Killed\b|\d+ Killed\s|[Oo]ut of memory: Killed process|\boom-kill\b|oom_reaper"
                           r"|exit(?:ed)?(?: with)?(?: exit)? (?:code|status)[ :=]*137\b"
                           r"|Failed core proc\(s\): \{[^}]*: -9[,}]|\(exit code: -9\)|died with exit code -9\b"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("Host RAM (not GPU memory) ran out and the kernel killed the process (SIGKILL, exit 137). "
               "Loading weights passes them through RAM, more so with several TP workers loading at once: "
               "a 27B checkpoint does not fit next to everything else on a 32 GiB host."),
        fix=("Add swap (e.g. a 32 GiB swap file), stop other memory users, keep the default lazy "
             "(memory-mapped) weight loading (do not pass --safetensors-load-strategy eager), and check "
             "`caovan-sm75-doctor --model PATH`, which compares the checkpoint with free host memory.")),
    # vllm/v1/engine/exceptions.py, core.py, async_llm.py, utils.py.
    Signature(
        id="engine-dead",
        title="the engine core process died",
        needles=("EngineDeadError", "EngineCore encountered a fatal error", "EngineCore failed to start",
                 "Engine core initialization failed", "AsyncLLM output_handler failed"),
        rule=Rule.FATAL, role=Role.CONSEQUENCE,
        cause="The engine stopped after an error in one of its processes; the real cause is above it in the log.",
        fix="Fix the cause named as the first real failure; then restart the server (it does not recover)."),
    # vllm/v1/executor/multiproc_executor.py monitor_workers.
    Signature(
        id="worker-died",
        shown='`Worker proc <name> died unexpectedly`',
        title="a tensor-parallel worker process died",
        needles=("died unexpectedly",),
        confirm=re.compile(r"(?:Worker proc |RayWorkerProc rank=)(?P<worker>\S+) died unexpectedly"),
        rule=Rule.FATAL, role=Role.CONSEQUENCE,
        cause=("A worker exited without reporting an error: killed (host out of memory), crashed in a "
               "CUDA kernel, or stopped by a signal."),
        fix="Look just above for its last messages; if there are none, check the host's memory (dmesg, `free -g`)."),
    # uvicorn access log: '127.0.0.1:40112 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error'.
    Signature(
        id="http-5xx",
        shown='uvicorn\'s access line with a 5xx status, `"POST /v1/chat/completions HTTP/1.1" 500`',
        title="the server answered requests with a server error (5xx)",
        needles=(' HTTP/1.1" 5', ' HTTP/1.0" 5', ' HTTP/2" 5'),
        confirm=re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>5\d\d)\b'),
        rule=Rule.FATAL, role=Role.CONSEQUENCE,
        cause="The server was up but failed requests (500), or reported itself unhealthy (503 after the engine died).",
        fix="Fix the cause named as the first real failure and restart the server."),
    # Our own status lines (docs/design.md): the banner's runtime=, the warmup's result, register()'s warning.
    Signature(
        id="caovan-runtime-fail",
        shown='the banner line `runtime=FAIL`',
        title="our plugin's checks failed (runtime=FAIL)",
        needles=("runtime=FAIL",),
        confirm=re.compile(r"^(?:\[Caovan\] )?runtime=FAIL\b"),
        # Information about our plugin, never the engine's failure: where the launcher stopped, its own
        # line (caovan-launch-stopped) says so; triage judges this harmless without an SM75 GPU.
        rule=Rule.WARNING, role=Role.CAUSE,
        cause=("A check of our plugin failed (no Turing GPU, driver too old for torch's CUDA, too little host "
               "memory, ...): our accelerated paths may be off; vLLM itself may still serve."),
        fix="Run `caovan-sm75-doctor`: it names the failing check and its remedy."),
    Signature(
        id="caovan-runtime-warn",
        shown='the banner line `runtime=WARN`',
        title="our plugin's checks warned (runtime=WARN)",
        needles=("runtime=WARN",),
        confirm=re.compile(r"^(?:\[Caovan\] )?runtime=WARN\b"),
        rule=Rule.WARNING, role=Role.CAUSE,
        cause="A runtime check warned; the server may still run.",
        fix="Run `caovan-sm75-doctor` to see which check and its remedy."),
    Signature(
        id="caovan-warmup-failed",
        shown='`[Caovan] warmup=FAILED step=<name> reason=<...>`',
        title="caovan-sm75-warmup failed",
        needles=("warmup=FAILED",),
        confirm=re.compile(r"warmup=FAILED(?: step=(?P<step>\S+))?(?: reason=(?P<reason>.*))?"),
        rule=Rule.FATAL, role=Role.SYMPTOM,
        cause="A warmup request failed; the server's own log around that time says why.",
        fix="Fix the failure the server logged for that request, restart, and run the warmup again."),
    Signature(
        id="caovan-refused",
        title="our launcher refused to start",
        needles=("refused: ", "is on, but our GDN prefill cannot serve this process"),
        shown=("the banner line `refused: <reason>`, "
               "`require-turbo3 (...) is on, but our GDN prefill cannot serve this process: <reason>`"),
        confirm=re.compile(r"^refused: (?P<reason>.+)|require-turbo3 .*is on, but our GDN prefill cannot serve "
                           r"this process: (?P<why>.*)"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause=("CAOVAN_REQUIRE_TURBO3=1 (or caovan_require_turbo3) asks for a refusal when the accelerated path "
               "cannot be active, and it cannot (the reason is on the line); or runtime=FAIL stopped the launch."),
        fix=("Fix the reason on the line, or unset CAOVAN_REQUIRE_TURBO3 / drop caovan_require_turbo3 to start "
             "on vLLM's own kernels; `caovan-vllm-serve --dry-run` shows the plan without starting.")),
    # cli/common.py run_cli: "caovan-vllm-serve: error: <why>", the launcher stopping before vLLM.
    Signature(
        id="caovan-launch-stopped",
        shown="`caovan-vllm-serve: error: <why>`",
        title="our launcher stopped before vLLM started",
        needles=("caovan-vllm-serve: error: ",),
        confirm=re.compile(r"caovan-vllm-serve: error: (?P<reason>.+)"),
        rule=Rule.FATAL, role=Role.CAUSE,
        cause="caovan-vllm-serve found a reason not to start vLLM (it is on the line) and exited with code 2.",
        fix=("Fix the reason on the line; `caovan-vllm-serve --dry-run ...` shows the whole plan without "
             "starting anything.")),
    Signature(
        id="caovan-plugin-inactive",
        title="our plugin is inactive in a process",
        needles=(f"{PRODUCT}: plugin inactive", NOT_APPLIED, NOT_DISPATCHED),   # the first: releases before 0.3
        shown=(f"`{NOT_APPLIED} in this process (pid N): <reason>`, `{NOT_DISPATCHED}: <reason>`"),
        confirm=re.compile(r"(?:plugin inactive in this process|guards not applied in this process(?: \(pid \d+\))?"
                           r"|not dispatched): ?(?P<reason>.*)"),
        rule=Rule.WARNING, role=Role.CAUSE,
        cause="register() met an error and left this process to plain vLLM (the reason is on the line).",
        fix="Run `caovan-sm75-doctor --settings`; a CAOVAN_* value it rejects is the usual reason."),
    # Harmless messages people ask about on Turing boxes.
    Signature(
        id="flashinfer-sampler-fallback",
        title="FlashInfer sampler off, PyTorch sampler used",
        needles=("FlashInfer top-p/top-k sampling not supported on compute capability",
                 "FlashInfer top-p/top-k sampling disabled via VLLM_USE_FLASHINFER_SAMPLER=0",
                 "FlashInfer top-p/top-k sampling unavailable:"),   # 0.34: "...; falling back."
        rule=Rule.HARMLESS, role=Role.CAUSE,
        cause="The sampler guard (or vLLM itself on this GPU) chose PyTorch's sampler: it works everywhere.",
        fix="Nothing to do. CAOVAN_FLASHINFER_SAMPLER=probe tries FlashInfer's (+15-20 % decode where it builds)."),
    # vllm/distributed/device_communicators/custom_all_reduce.py.
    Signature(
        id="custom-allreduce-disabled",
        title="custom all-reduce disabled, NCCL used",
        needles=("Custom allreduce is disabled",),
        rule=Rule.HARMLESS, role=Role.CAUSE,
        cause="GeForce cards without P2P/NVLink cannot use vLLM's custom all-reduce; NCCL does the job.",
        fix="Nothing to do (pass --disable-custom-all-reduce to silence it)."),
    # torch/_inductor/utils.py.
    Signature(
        id="inductor-few-sms",
        title="torch.compile skips max-autotune GEMMs on this GPU",
        needles=("Not enough SMs to use max_autotune_gemm mode",),
        rule=Rule.HARMLESS, role=Role.CAUSE,
        cause="torch.compile's autotuned GEMMs want more SMs than a consumer card has; it uses its defaults.",
        fix="Nothing to do."),
)
