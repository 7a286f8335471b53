"""One vLLM engine, one mode: greedy output with logprobs, GDN call counts, speed; writes JSON.

Runs on the lent GPU machine (see run_device.sh), one process per mode, because a mode is set
before vLLM is imported:
- `--capability 7.5` reports the GPU as Turing to torch, NVML and vLLM, so vLLM takes its SM75
  paths (TRITON_ATTN, FLA's Triton GDN kernels, no FlashInfer GDN) and our plugin, reading the
  facts file in CAOVAN_FACTS, takes its Turing decisions. Triton still builds for the real GPU.
- `--shim sm75` also makes Triton build every kernel for sm_75 (Triton's own Turing code, and our
  Turbo hook's rewrite for allowlisted kernels, both through ptxas for sm_75) and hands the PTX
  to the driver, which JIT-compiles it for the GPU in hand. Test-only: what a Turing user runs,
  on another card.
- `--device cpu` runs the same requests on vLLM's CPU build (no capability report, no shim, eager,
  bfloat16): the serve lane checks this script's use of vLLM's API there.
Plugin on or off is decided by the caller: our wheel on PYTHONPATH or not (or `VLLM_PLUGINS` naming
another plugin); `plugin_loaded` in the JSON says which it was. Both runs get the same environment
(ENGINE_ENV), so they differ by the plugin alone.

Progress goes to stdout (`engine_check: ...`, one line a step). A run that may hang can dump every
thread's stack to stderr every N seconds: ENGINE_CHECK_STACKS=N.

Speculative decoding (`--spec mtp`, `--draft-tokens N`): the greedy prompts and the decode row run
with vLLM's MTP drafter, and each step's acceptance is counted (replay.py's hook, and vLLM's own
spec-decode counters). With `--reference RUN.json` (a run of the same engine without speculation),
the greedy prompts run again with replayed drafts (seeded acceptance 0..N per step), then decode
is timed at each fixed acceptance 0..N on the reference's sweep prompt: tokens per step -> tok/s.

    python3 engine_check.py --model DIR --out FILE.json [--shim native|sm75] [--speed] [--ngram]
                            [--spec mtp [--reference NO_SPEC_RUN.json]]
"""

from __future__ import annotations

import argparse
import json
import os
import faulthandler
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_profile  # noqa: E402
import replay  # noqa: E402

# A prompt longer than --max-num-batched-tokens (later chunks start from a GDN state), a short
# one, and one that repeats the long one's first 2048 tokens (a prefix-cache hit).
CHUNK = 2048
PROMPTS = (4000, 700)   # 4000: two whole blocks even at fp8 with MTP (1600-token hybrid blocks), so
# the repeat of the whole prompt keeps a hit after MTP's lookup gives one block back
SHARED_PREFIX = 2048
GEN_TOKENS = 32
CPU_MODEL_LEN = 8192   # --max-model-len's default on the CPU: the longest greedy prompt and its tokens fit
SPEED_PREFILL = (8192, 32768)
DECODE_TOKENS = 256
SWEEP_PROMPT = 1024   # the decode sweep's prompt (seeded: every run draws the same one)
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")
REPEATS = 3   # timed repeats of each speed row, after one untimed warm-up
# Turing's limits as Triton's driver reports them (RTX 2080 Ti: 64 KiB of shared memory a block
# with opt-in, 68 SMs). In sm75 mode Triton and FLA must see these, not the H100's 228 KiB and
# 132 SMs: FLA picks its tiles by shared memory (check_shared_mem), Triton refuses a launch over it.
TURING_PROPERTIES = {"max_shared_mem": 65536, "multiprocessor_count": 68}
# Set in both runs, plugin on and off: vLLM's FlashInfer sampler JIT-builds for the reported
# capability and dies there (the plugin sets this itself when on; off must not differ by it).
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",   # one process: our patches reach the engine
              "TORCHINDUCTOR_COMPILE_THREADS": "1",     # no compile workers without the shim
              "VLLM_USE_FLASHINFER_SAMPLER": "0"}


def unfix() -> None:
    """Keep our MTP prefix-cache fix out of this run (before vLLM loads the plugin, which binds it)."""
    try:
        from caovan_vllm_sm75_turbo3.plugin import cache_hit_fix
    except ImportError:   # plugin off: nothing to keep out
        return
    cache_hit_fix.install = lambda ctx: None


def progress(message: str) -> None:
    """One progress line on stdout, with the seconds since the process started."""
    print(f"engine_check: [{time.perf_counter() - STARTED:7.1f} s] {message}", flush=True)


STARTED = time.perf_counter()


def report_turing(capability: tuple[int, int], inductor_real: bool) -> None:
    """Report `capability` to torch, NVML and vLLM; Triton keeps the real one for its target.

    With `inductor_real`, torch inductor still reads the real capability (its device interface),
    so the code it builds through Triton is for the GPU in hand (native mode: no shim loads sm_75
    code there)."""
    import torch
    from triton.runtime import driver

    driver.active.get_current_target()   # Triton's driver keeps the real query, taken before the patch
    real = torch.cuda.get_device_capability()
    torch.cuda.get_device_capability = lambda device=None: capability
    if inductor_real:
        from torch._dynamo.device_interface import CudaInterface

        CudaInterface.get_compute_capability = staticmethod(lambda device=None: real[0] * 10 + real[1])
    try:
        import pynvml
        pynvml.nvmlDeviceGetCudaComputeCapability = lambda handle: capability
    except ImportError:
        pass
    import vllm.third_party.pynvml as vllm_nvml
    vllm_nvml.nvmlDeviceGetCudaComputeCapability = lambda handle: capability
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability
    type(current_platform).get_device_capability = classmethod(
        lambda cls, device_id=0: DeviceCapability(*capability))


def report_turing_limits(utils: Any) -> None:
    """Make Triton's `utils.get_device_properties` report TURING_PROPERTIES over the real ones."""
    real = utils.get_device_properties

    def turing_properties(device: Any) -> dict[str, Any]:
        return {**real(device), **TURING_PROPERTIES}

    utils.get_device_properties = turing_properties


def install_sm75_shim() -> dict[str, int]:
    """Make Triton build for sm_75 and load the PTX through the driver's JIT. Returns a live count
    of the kernels so built."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime import driver

    built = {"kernels": 0}
    driver.active.get_current_target = lambda: GPUTarget("cuda", 75, 32)
    report_turing_limits(driver.active.utils)
    add_stages = CUDABackend.add_stages

    def add_stages_sm75(self: Any, stages: dict, options: Any, *rest: Any) -> None:
        add_stages(self, stages, options, *rest)   # Triton's stages, then the Turbo hook's, for sm_75
        to_cubin = stages["cubin"]

        def ptx_for_the_driver(src: str, metadata: dict) -> bytes:
            to_cubin(src, metadata)   # ptxas for sm_75, as on a Turing card: its errors still stop us
            built["kernels"] += 1
            return src.encode() + b"\0"

        stages["cubin"] = ptx_for_the_driver

    CUDABackend.add_stages = add_stages_sm75
    return built


WORKER_SITE = Path(__file__).resolve().parent / "worker_site"


def shim_this_process(shim: str, capability: str) -> dict[str, int] | None:
    """Report `capability` (and in sm75 mode build Triton for sm_75) in this process: engine_check's
    own, or a tensor-parallel worker's (worker_site/sitecustomize.py). The sm75 build counter, if any."""
    major, minor = (int(x) for x in capability.split("."))
    report_turing((major, minor), inductor_real=shim == "native")
    return install_sm75_shim() if shim == "sm75" else None


def shim_workers(env: dict[str, str], shim: str, capability: str) -> None:
    """Make the worker processes vLLM starts run the same shim (worker_site first on PYTHONPATH)."""
    env["ENGINE_CHECK_SHIM"], env["ENGINE_CHECK_CAPABILITY"] = shim, capability
    env["PYTHONPATH"] = os.pathsep.join([str(WORKER_SITE), *filter(None, [env.get("PYTHONPATH")])])


def token_range(model: str) -> tuple[int, int]:
    """Token ids to draw prompts from: the vocabulary's first 200,000 less its first tenth (at
    most 1,000; Qwen's special tokens sit at the end, past 200,000, in the full-size vocabulary)."""
    config = json.loads((Path(model) / "config.json").read_text())
    vocab = int(config.get("text_config", config).get("vocab_size") or config["vocab_size"])
    return min(1000, vocab // 10), min(200000, vocab)


def random_prompt(rng: random.Random, n: int, ids: tuple[int, int]) -> list[int]:
    """`n` token ids drawn from range(*ids)."""
    return [rng.randrange(*ids) for _ in range(n)]


def completion(out: Any) -> dict[str, Any]:
    """Tokens, the top-2 logprobs of each step and the prefix-cache hits of one request."""
    c = out.outputs[0]
    steps = []
    for tok, lps in zip(c.token_ids, c.logprobs or []):
        ranked = sorted(((v.logprob, t) for t, v in lps.items()), reverse=True)[:2]
        steps.append({"chosen": tok, "chosen_logprob": lps[tok].logprob,
                      "top": [[t, lp] for lp, t in ranked]})
    return {"tokens": list(c.token_ids), "steps": steps, "num_cached_tokens": out.num_cached_tokens}


def scaled_weights(model: Any, skip: frozenset[int] = frozenset(), seed: int = 0) -> int:
    """Replace vLLM's dummy weights (uniform in ±1e-3: every logit near equal, every greedy choice a
    coin toss) in place with seeded ones of a trained model's scale: matrices N(0, 1/fan_in), norm
    scales near 1, GDN decays A = 1..16. In place, so captured CUDA graphs stay valid. Tensors whose
    storage is in `skip` stay (the target's, which an MTP drafter shares). Returns the number set."""
    import math

    import torch

    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.data_ptr() in skip:
                continue
            g = torch.Generator(device=p.device).manual_seed(seed + n + 1)
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape, device=p.device).uniform_(0, math.log(16), generator=g))
            elif p.ndim == 1 and "norm" in name:
                p.copy_(1 + 0.02 * torch.randn(p.shape, device=p.device, generator=g))
            elif p.ndim >= 2:
                std = 1 / math.sqrt(p.shape[-1])
                p.copy_(std * torch.randn(p.shape, device=p.device, generator=g))
            else:
                continue
            n += 1
    return n


def scaled_drafter(worker: Any) -> int:
    """scaled_weights for an MTP drafter's own tensors (run in the worker: collective_rpc), leaving
    those it shares with the target (embedding, LM head) as the target has them. 0 without one."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    model = getattr(drafter, "model", None)
    if model is None:
        return 0
    shared = frozenset(p.data_ptr() for p in worker.model_runner.get_model().parameters())
    return scaled_weights(model, skip=shared, seed=100_000)


def weight_census(model: Any) -> dict[str, Any]:
    """Parameters of the model by kind (apply_model), for the projection's FLOP and byte counts:
    2-D matrices of the layers, the embedding and the LM head, their elements and bytes."""
    out: dict[str, Any] = {}
    for name, p in model.named_parameters():
        kind = ("embedding" if "embed" in name else "lm_head" if "lm_head" in name
                else "matrix" if p.ndim >= 2 else "vector")
        row = out.setdefault(kind, {"tensors": 0, "elements": 0, "bytes": 0})
        row["tensors"] += 1
        row["elements"] += p.numel()
        row["bytes"] += p.numel() * p.element_size()
    return out


def gdn_census(model: Any) -> dict[str, Any]:
    """Which GDN ops of the model run our kernel; wraps ours to count calls (apply_model)."""
    ops = [m for m in model.modules() if hasattr(m, "_caovan_upstream") or type(m).__name__ == "ChunkGatedDeltaRule"]
    ours = [m for m in ops if getattr(m, "_caovan_kernel", None) is not None]
    for i, op in enumerate(ours):
        kernel = op._caovan_kernel
        op._caovan_calls = 0

        def counted(*a: Any, _op: Any = op, _k: Any = kernel, **kw: Any) -> Any:
            _op._caovan_calls += 1
            return _k(*a, **kw)

        op._caovan_kernel = counted
    return {"gdn_ops": len(ops), "ours": len(ours), "classes": sorted({type(m).__name__ for m in ops})}


def gdn_calls(model: Any) -> list[int]:
    """Calls of our kernel per GDN op since gdn_census (empty when none is ours)."""
    return [m._caovan_calls for m in model.modules() if hasattr(m, "_caovan_calls")]


def timed(llm: Any, prompts: list[list[int]], params: Any) -> tuple[float, list[Any]]:
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - t0, outs


def one_and_many() -> tuple[Any, Any]:
    """Greedy sampling of 1 token (a prefill's time) and of DECODE_TOKENS + 1 (that plus decode)."""
    from vllm import SamplingParams

    return (SamplingParams(temperature=0.0, max_tokens=1, detokenize=False),
            SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS + 1, ignore_eos=True, detokenize=False))


def rates(work: float, seconds: list[float]) -> dict[str, Any]:
    """A speed row from repeated timings of the same `work` (tokens): the median rate (`tok_s`),
    the slowest and fastest, and their spread over the median."""
    r = sorted(work / t for t in seconds)
    med = statistics.median(r)
    return {"seconds": seconds, "tok_s": med, "tok_s_min": r[0], "tok_s_max": r[-1], "spread": (r[-1] - r[0]) / med}


def speed(llm: Any, rng: random.Random, ids: tuple[int, int], repeats: int = REPEATS,
          prefill: tuple[int, ...] = SPEED_PREFILL) -> dict[str, Any]:
    """Prefill tok/s for each `prefill` length (fresh prompts: no cache hit) and single-stream
    decode tok/s (the time of DECODE_TOKENS+1 tokens less that of 1, same length): one untimed
    warm-up, then `repeats` timings of each, reported as median and spread."""
    one, many = one_and_many()
    rows: dict[str, Any] = {}
    for n in prefill:
        timed(llm, [random_prompt(rng, n, ids)], one)
        rows[f"prefill_{n}"] = rates(n, [timed(llm, [random_prompt(rng, n, ids)], one)[0] for _ in range(repeats)])
        progress(f"prefill {n}: {rows[f'prefill_{n}']['tok_s']:,.0f} tok/s (spread {rows[f'prefill_{n}']['spread']:.1%})")
    timed(llm, [random_prompt(rng, 1024, ids)], many)
    decode = []
    for _ in range(repeats):
        prompt = random_prompt(rng, 1024, ids)
        t1 = timed(llm, [prompt], one)[0]
        tn = timed(llm, [random_prompt(rng, 1024, ids)], many)[0]
        decode.append(max(tn - t1, 1e-9))
    rows["decode_1024"] = rates(DECODE_TOKENS, decode)
    progress(f"decode at 1024: {rows['decode_1024']['tok_s']:,.1f} tok/s (spread {rows['decode_1024']['spread']:.1%})")
    return rows


def long_context(llm: Any, rng: random.Random, ids: tuple[int, int], n: int, chunk: int,
                 repeats: int = REPEATS) -> dict[str, Any]:
    """Prefill tok/s of an `n`-token prompt, of its last `chunk` alone, and decode tok/s at that depth.

    A whole fresh prompt is timed once (`prefill_tok_s`: every chunk, the later ones attending to
    all before them). Then its first n - chunk tokens are prefilled; the whole prompt hits the
    prefix cache for them, so its time is that of the last chunk alone (each repeat a new last
    chunk on the same head). Decode: the time of DECODE_TOKENS+1 tokens less that of 1."""
    one, many = one_and_many()
    whole = random_prompt(rng, n, ids)
    t_whole, _ = timed(llm, [whole], one)
    head = random_prompt(rng, n - chunk, ids)
    t_head, _ = timed(llm, [head], one)
    late, decode, cached = [], [], []
    for _ in range(repeats):
        prompt = head + random_prompt(rng, chunk, ids)
        t_last, outs = timed(llm, [prompt], one)
        cached.append(outs[0].num_cached_tokens)
        late.append(t_last / max(n - outs[0].num_cached_tokens, 1))   # seconds a token: a hit may be a block short
        t_hit, _ = timed(llm, [prompt], one)          # all cached but the last block: the baseline for decode
        t_all, _ = timed(llm, [prompt], many)
        decode.append(max(t_all - t_hit, 1e-9))
    row = {"tokens": n, "chunk": chunk, "seconds_whole": t_whole, "prefill_tok_s": n / t_whole,
           "seconds_head": t_head, "cached_before_last_chunk": cached,
           "late_chunk": rates(1.0, late), "decode": rates(DECODE_TOKENS, decode)}
    row["late_chunk_tok_s"], row["decode_tok_s"] = row["late_chunk"]["tok_s"], row["decode"]["tok_s"]
    progress(f"long context {n}: whole prompt {row['prefill_tok_s']:,.0f} tok/s, last chunk "
             f"{row['late_chunk_tok_s']:,.0f} tok/s, decode {row['decode_tok_s']:,.1f} tok/s")
    return row


def profile_rows(llm: Any, rng: random.Random, ids: tuple[int, int], prefill: tuple[int, ...],
                 long: list[int], chunk: int, rows: dict[str, Any], saved: Callable[[str], None]) -> None:
    """Each engine row once under torch's profiler (kernel_profile.py) into `rows`: fresh prefills,
    decode at 1024 and at each long depth, and each long prompt's last chunk after its cached head.
    `saved(name)` after each row, so a run stopped at its deadline keeps the rows it finished."""
    one, many = one_and_many()

    def decode_row(prompt: list[int]) -> dict[str, Any]:
        timed(llm, [prompt], one)                       # cached from here on
        less, t1 = kernel_profile.profiled(lambda: timed(llm, [prompt], one))
        more, tn = kernel_profile.profiled(lambda: timed(llm, [prompt], many))
        return kernel_profile.row(kernel_profile.difference(more, less), DECODE_TOKENS, tn - t1)

    def done(name: str, row: dict[str, Any]) -> None:
        rows[name] = row
        progress(f"profiled {name}: {row['gpu_us'] / 1e3:,.2f} ms on the GPU in {row['launches']} launches, "
                 f"{row['wall_s'] * 1e3:,.1f} ms wall")
        saved(f"profile_{name}")

    for n in prefill:
        prompt = random_prompt(rng, n, ids)
        kernels, wall = kernel_profile.profiled(lambda: timed(llm, [prompt], one))
        done(f"prefill_{n}", kernel_profile.row(kernels, n, wall))
    done("decode_1024", decode_row(random_prompt(rng, 1024, ids)))
    for n in long:
        head = random_prompt(rng, n - chunk, ids)
        timed(llm, [head], one)
        prompt = head + random_prompt(rng, chunk, ids)
        kernels, wall = kernel_profile.profiled(lambda: timed(llm, [prompt], one))
        done(f"late_chunk_{n}", kernel_profile.row(kernels, chunk, wall))
        done(f"decode_at_{n}", decode_row(prompt))


def spec_counters(llm: Any) -> dict[str, int]:
    """vLLM's spec-decode counters so far (drafts, draft tokens, accepted tokens); {} without them."""
    try:
        metrics = llm.get_metrics()
    except Exception:   # stats off, or a release without get_metrics: the hook's counts remain
        return {}
    out = {name: 0 for name in SPEC_COUNTERS}
    for m in metrics:
        if getattr(m, "name", None) in out and hasattr(m, "value"):
            out[m.name] += int(m.value)
    return out


def counted(llm: Any, hook: replay.ReplayHook, run: Any) -> tuple[Any, dict[str, Any]]:
    """run(): its result, with the acceptance the hook and vLLM's counters saw while it ran."""
    hook.reset()
    before = spec_counters(llm)
    result = run()
    after = spec_counters(llm)
    vllm_counts = {k.split("num_")[1]: after[k] - before.get(k, 0) for k in after}
    if vllm_counts.get("drafts"):
        vllm_counts["tokens_per_step"] = 1 + vllm_counts["accepted_tokens"] / vllm_counts["drafts"]
    return result, {"hook": hook.summary(), "vllm": vllm_counts}


def greedy_prompts(ids: tuple[int, int]) -> list[list[int]]:
    """A prompt longer than --chunk and a short one (run together: two sequences at once), then one
    that repeats the long one's first SHARED_PREFIX tokens (a prefix-cache hit), one of repeats, and
    one that repeats the whole long one (a longer hit)."""
    rng = random.Random(1)
    prompts = [random_prompt(rng, n, ids) for n in PROMPTS]
    prompts.append(prompts[0][:SHARED_PREFIX] + random_prompt(rng, 400, ids))
    prompts.append((random_prompt(rng, 16, ids) * 40)[:600])   # repeats: something for the n-gram proposer
    # The whole long prompt and more: a hit of several blocks, so that with MTP (whose lookup drops a
    # block) a GDN state is still cached within the attention layers' hit (plugin/cache_hit_fix.py).
    prompts.append(prompts[0] + random_prompt(rng, 400, ids))
    return prompts


def run_greedy(llm: Any, prompts: list[list[int]]) -> list[dict[str, Any]]:
    """GEN_TOKENS greedy tokens with top-2 logprobs: the first two prompts together, then the rest
    (after the first finished: its blocks are cached)."""
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=GEN_TOKENS, logprobs=2, detokenize=False, ignore_eos=True)
    _, first = timed(llm, prompts[:2], greedy)
    _, again = timed(llm, prompts[2:], greedy)
    return [completion(o) for o in first + again]


def sweep_prompt(ids: tuple[int, int]) -> list[int]:
    """The decode sweep's prompt, the same in every run."""
    return random_prompt(random.Random(4), SWEEP_PROMPT, ids)


def sweep_reference(llm: Any, ids: tuple[int, int]) -> dict[str, Any]:
    """Plain greedy on the sweep prompt, DECODE_TOKENS + 1 tokens with top-2 logprobs: what a
    speculative run replays at each acceptance level, and what its tokens are judged against."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS + 1, logprobs=2, detokenize=False,
                            ignore_eos=True)
    return completion(timed(llm, [sweep_prompt(ids)], params)[1][0])


def acceptance_sweep(llm: Any, hook: replay.ReplayHook, ids: tuple[int, int], reference: dict[str, Any],
                     repeats: int) -> list[dict[str, Any]]:
    """Decode tok/s on the sweep prompt with replayed drafts, at each fixed acceptance 0..N: the time
    of DECODE_TOKENS+1 tokens less that of 1 (both hit the prefix cache), one warm-up then `repeats`.
    `warm_up_not_as_planned` counts the warm-up's steps that left `reference` (ties)."""
    from vllm import SamplingParams

    prompt = sweep_prompt(ids)
    one, _ = one_and_many()
    many = SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS + 1, ignore_eos=True, detokenize=False,
                          logprobs=2)
    rows = []
    for a in range(hook.plan.draft_tokens + 1):
        hook.plan.accept = a
        hook.plan.add(prompt, reference["tokens"])
        # The untimed warm-up's tokens are this level's own greedy tokens: where an exact tie breaks
        # the other way under this level's batch shapes, it leaves the plan there, and replaying its
        # tokens keeps the timed passes on track past the tie.
        (_, warm), warm_seen = counted(llm, hook, lambda: timed(llm, [prompt], many))
        hook.plan.add(prompt, completion(warm[0])["tokens"])
        times, outs = [], None

        def repeat() -> None:
            nonlocal outs
            for _ in range(repeats):
                t1 = timed(llm, [prompt], one)[0]
                tn, outs = timed(llm, [prompt], many)
                times.append(max(tn - t1, 1e-9))

        _, seen = counted(llm, hook, repeat)
        row = {"accept": a, "decode": rates(DECODE_TOKENS, times), "seen": seen,
               "warm_up_not_as_planned": warm_seen["hook"]["not_as_planned"], "completion": completion(outs[0])}
        rows.append(row)
        progress(f"replayed decode, {a} of {hook.plan.draft_tokens} accepted: {row['decode']['tok_s']:,.1f} tok/s, "
                 f"{seen['hook']['tokens_per_step'] or 0:.2f} tokens a step, "
                 f"{seen['hook']['not_as_planned']} steps not as planned")
    hook.plan.accept = None
    return rows


def speculative(llm: Any, hook: replay.ReplayHook, args: argparse.Namespace, ids: tuple[int, int],
                result: dict[str, Any]) -> None:
    """The replay phases of a speculative run (with --reference): greedy again with replayed drafts
    (seeded acceptance), the prefix cache emptied first so the run meets the same hits; then the sweep."""
    ref = json.loads(Path(args.reference).read_text())
    prompts = greedy_prompts(ids)
    for prompt, c in zip(prompts, ref["completions"]):
        hook.plan.add(prompt, c["tokens"])
    result["prefix_cache_reset"] = bool(llm.reset_prefix_cache())
    hook.plan.replay = True
    result["replay_completions"], result["replay_greedy_seen"] = counted(llm, hook, lambda: run_greedy(llm, prompts))
    progress(f"replayed greedy: {result['replay_greedy_seen']['hook']['tokens_per_step'] or 0:.2f} tokens a step, "
             f"{result['replay_greedy_seen']['hook']['not_as_planned']} steps not as planned")
    if args.speed and result.get("sweep_reference"):
        # replayed from this engine's own greedy tokens, so that a tie the two runs break apart
        # cannot end the replay; compare.py judges these tokens against the run without MTP
        result["acceptance_sweep"] = acceptance_sweep(llm, hook, ids, result["sweep_reference"], args.repeats)
    hook.plan.replay = False


def kv_capacity(llm: Any) -> dict[str, Any]:
    """The KV cache vLLM set up at start: blocks, tokens per block, tokens in all."""
    cache = llm.llm_engine.vllm_config.cache_config
    blocks, size = cache.num_gpu_blocks, cache.block_size
    return {"blocks": blocks, "block_size": size, "tokens": blocks * size if blocks and size else None,
            "kv_cache_dtype": str(cache.cache_dtype)}


def save(out: Path, result: dict[str, Any], stage: str, finished: bool = False) -> None:
    """Write the result so far, whole or not at all (a temporary file renamed over it): a run stopped at
    its deadline still leaves every stage it finished, and `finished` says whether it got to the end."""
    result.setdefault("stages", []).append(stage)
    result["finished"] = finished
    part = out.with_name(out.name + ".part")
    part.write_text(json.dumps(result, indent=1))
    part.replace(out)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """LLM(...) arguments: chunked prefill at --chunk, prefix caching, and on the GPU the attention
    backend asked for with PIECEWISE CUDA graphs."""
    kw: dict[str, Any] = dict(
        model=args.model, load_format="dummy", skip_tokenizer_init=True, seed=0, max_num_seqs=8,
        max_num_batched_tokens=args.chunk, enable_prefix_caching=args.prefix_caching,
        kv_cache_dtype=args.kv_cache_dtype, tensor_parallel_size=args.tensor_parallel_size)
    if args.attention_backend:
        kw["attention_config"] = {"backend": args.attention_backend}
    if args.device == "cpu":
        kw.update(dtype="bfloat16", mamba_ssm_cache_dtype="float32", enforce_eager=True,
                  max_model_len=args.max_model_len)
    else:
        kw.update(dtype="float16", max_model_len=args.max_model_len,
                  gpu_memory_utilization=args.gpu_memory_utilization, limit_mm_per_prompt={"image": 0, "video": 0},
                  compilation_config={"cudagraph_mode": args.cudagraph_mode, "cudagraph_capture_sizes": [1, 2, 4, 8]})
    if args.ngram:
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3,
                                    "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    if args.spec == "mtp":
        kw["speculative_config"] = {"method": "mtp", "num_speculative_tokens": args.draft_tokens}
        if args.draft_attention_backend:
            kw["speculative_config"]["attention_backend"] = args.draft_attention_backend
        kw["disable_log_stats"] = False   # vLLM's spec-decode counters (LLM.get_metrics)
    return kw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="folder with the model's config.json")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--shim", choices=("native", "sm75"), default="native")
    parser.add_argument("--capability", default="7.5", help="the capability reported (default 7.5)")
    parser.add_argument("--weights", choices=("scaled", "dummy"), default=None,
                        help="random weights of a trained model's scale, set in place (the GPU's default: "
                             "vLLM multiplies by the parameters there), or vLLM's dummy ones (the CPU's "
                             "default: its build repacks the weights at load, so later changes are unseen)")
    parser.add_argument("--speed", action=argparse.BooleanOptionalAction, default=False,
                        help="also time prefill and decode (--no-speed after a mode's --speed: not)")
    parser.add_argument("--ngram", action="store_true", help="n-gram speculative decoding")
    parser.add_argument("--spec", choices=("none", "mtp"), default="none",
                        help="speculative decoding with the model's MTP layers (acceptance counted)")
    parser.add_argument("--draft-tokens", type=int, default=3, help="MTP draft tokens a step (default 3)")
    parser.add_argument("--draft-attention-backend", default=None,
                        help="with --spec: the drafter's attention backend (vLLM 0.24+ never gives it the "
                             "target's: without this it picks its own, TRITON_ATTN on SM75)")
    parser.add_argument("--reference", default=None,
                        help="with --spec: a run of the same engine without speculation; its greedy tokens "
                             "are replayed as drafts with seeded wrong guesses (acceptance known per step)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="tensor parallel: worker processes, each with the shim (worker_site); our census "
                             "and GDN call counts per rank; no replayed drafts (the hook lives in this process)")
    parser.add_argument("--cache-fix", choices=("on", "off"), default="on",
                        help="off: keep our fix of MTP prefix-cache hits (plugin/cache_hit_fix.py) out, to "
                             "show what vLLM does without it")
    parser.add_argument("--prefill-speed", type=int, nargs="*", default=list(SPEED_PREFILL), metavar="TOKENS",
                        help="with --speed: the prefill lengths timed (default 8192 32768; none: decode only)")
    parser.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="vLLM's prefix caching (default on; vLLM 0.27's CPU build cannot combine it "
                             "with speculation on a hybrid model: a Triton kernel copies the GDN states)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--chunk", type=int, default=CHUNK, help="--max-num-batched-tokens (default 2048)")
    parser.add_argument("--max-model-len", type=int, default=0,
                        help=f"default 40960 on the GPU, {CPU_MODEL_LEN} on the CPU")
    parser.add_argument("--kv-cache-dtype", default="auto", help="auto, fp8 (e4m3) or fp8_e5m2")
    parser.add_argument("--attention-backend", default=None,
                        help="vLLM's attention backend (default on the GPU: TRITON_ATTN; CUSTOM is ours, 0.24+)")
    parser.add_argument("--cudagraph-mode", default="PIECEWISE", help="PIECEWISE (default) or FULL_AND_PIECEWISE")
    parser.add_argument("--long-context", type=int, nargs="+", default=[], metavar="TOKENS",
                        help="for each length: time a whole prompt this long, its last --chunk alone, and "
                             "decode at its depth (--max-model-len defaults to fit the longest)")
    parser.add_argument("--profile", action="store_true",
                        help="run each row once more under torch's profiler: per-kernel GPU time (kernel_profile.py); "
                             "prefill rows with --speed")
    parser.add_argument("--profile-only", action="store_true",
                        help="the profiled rows alone (prefill at --prefill-speed, decode, each --long-context), "
                             "none of them timed apart: for a start too slow to leave room for both")
    parser.add_argument("--repeats", type=int, default=REPEATS, help=f"timed repeats of each speed row (default {REPEATS})")
    args = parser.parse_args(argv)
    if not args.max_model_len:
        args.max_model_len = max([CPU_MODEL_LEN if args.device == "cpu" else 40960,
                                  *(n + DECODE_TOKENS + 64 for n in args.long_context)])
    args.weights = args.weights or ("dummy" if args.device == "cpu" else "scaled")
    if args.tensor_parallel_size > 1 and args.reference:
        parser.error("--reference replays drafts through a hook in this process; with --tensor-parallel-size > 1 "
                     "the drafter runs in a worker: leave --reference out (MTP's own acceptance is still counted)")
    if args.device == "gpu" and args.attention_backend is None:
        args.attention_backend = "TRITON_ATTN"   # FlashInfer's JIT would build sm_75 code the GPU cannot run
    for name, value in ENGINE_ENV.items():
        os.environ.setdefault(name, value)
    stacks = os.environ.get("ENGINE_CHECK_STACKS")
    if stacks:
        faulthandler.dump_traceback_later(float(stacks), repeat=True, file=sys.stderr)
    shim = None
    if args.device == "gpu":
        shim = shim_this_process(args.shim, args.capability)
        if args.tensor_parallel_size > 1:
            shim_workers(os.environ, args.shim, args.capability)   # type: ignore[arg-type]
    result: dict[str, Any] = {"argv": sys.argv[1:] if argv is None else argv, "cache_fix": args.cache_fix,
                              "env": {k: os.environ[k] for k in ENGINE_ENV}}
    from vllm import LLM

    if args.cache_fix == "off":
        unfix()
    hook = replay.ReplayHook(replay.ReplayPlan(args.draft_tokens, token_range(args.model)[1], replay=False))
    if args.spec != "none":
        replay.install(hook)
    progress(f"starting the engine ({args.device}, shim {args.shim}, speculation {args.spec})")
    t0 = time.perf_counter()
    llm = LLM(**engine_kwargs(args))
    result["engine_start_s"] = time.perf_counter() - t0
    progress(f"engine up in {result['engine_start_s']:.1f} s")
    result["plugin_loaded"] = "caovan_vllm_sm75_turbo3.plugin.register" in sys.modules
    result["kv_capacity"] = kv_capacity(llm)
    result["census_by_rank"] = llm.apply_model(gdn_census)
    result["census"] = result["census_by_rank"][0]
    if args.weights == "scaled":
        result["weights_scaled"] = llm.apply_model(scaled_weights)[0]
        if args.spec != "none":
            result["drafter_weights_scaled"] = llm.collective_rpc(scaled_drafter)[0]
    result["cudagraph_mode"] = str(llm.llm_engine.vllm_config.compilation_config.cudagraph_mode)
    result["async_scheduling"] = getattr(llm.llm_engine.vllm_config.scheduler_config, "async_scheduling", None)
    ids = token_range(args.model)
    result["completions"], seen = counted(llm, hook, lambda: run_greedy(llm, greedy_prompts(ids)))
    result["gdn_calls_by_rank"] = llm.apply_model(gdn_calls)
    result["gdn_calls_after_greedy"] = result["gdn_calls_by_rank"][0]
    progress(f"greedy done: {len(result['completions'])} prompts x {GEN_TOKENS} tokens")
    if args.spec != "none":
        result["spec"] = {"method": args.spec, "draft_tokens": args.draft_tokens, "greedy_seen": seen}
        progress(f"MTP greedy: {seen['hook']['tokens_per_step'] or 0:.2f} tokens a step (vLLM: {seen['vllm']})")
    if shim is not None:
        result["sm75_ptx_kernels"] = shim["kernels"]
    out = Path(args.out)
    save(out, result, "greedy")
    timed_rows = not args.profile_only
    if args.speed and timed_rows:
        result["speed"], seen = counted(llm, hook, lambda: speed(llm, random.Random(2), ids, args.repeats,
                                                                 tuple(args.prefill_speed)))
        if args.spec != "none":
            result["spec"]["speed_seen"] = seen
        result["sweep_reference"] = sweep_reference(llm, ids)
        save(out, result, "speed")
    if args.spec != "none" and args.reference and timed_rows:
        speculative(llm, hook, args, ids, result)
        save(out, result, "speculative")
    if args.long_context and timed_rows:
        result["long_context"] = []
        for i, n in enumerate(args.long_context):
            result["long_context"].append(long_context(llm, random.Random(3 + i), ids, n, args.chunk, args.repeats))
            save(out, result, f"long_context_{n}")
    if args.profile or args.profile_only:
        result["weights"] = llm.apply_model(weight_census)[0]
        prefill = tuple(args.prefill_speed) if args.speed or args.profile_only else ()
        result["profile"] = {}
        profile_rows(llm, random.Random(5), ids, prefill, args.long_context, args.chunk, result["profile"],
                     lambda stage: save(out, result, stage))
    save(out, result, "end", finished=True)
    progress(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
