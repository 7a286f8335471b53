"""Launch configurations of the paged attention kernel, pinned per (head dim, KV format).

Two shapes per pair, picked on the host from `max_seqlen_q` alone (no autotuning, no device read):
`decode` for calls whose longest query fits its BLOCK_Q (decode, speculative verify), `prefill`
otherwise; a third, `PREFILL_PLAIN`, is the launcher's fallback when the prefill build came out
without the Turbo rewrite and cannot launch on Turing. BLOCK_M is the mma's M: the query rows of
a program are (token, GQA head) pairs of one KV head, so a decode step still fills M >= 16 with
the query heads sharing that KV head. Every decode and prefill entry is checked to build for sm_75
with the Turbo rewrite in <= 64 KiB of shared memory and without spills, and every plain fallback
to fit in <= 64 KiB (tests/test_kernels_attention_fit.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

HEAD_DIMS = (128, 256)
# KV cache formats: fp16 as it is, or fp8 bytes widened to fp16 in registers by integer bit work.
KV_FORMATS = ("fp16", "fp8_e4m3", "fp8_e5m2")
# The names vLLM's --kv-cache-dtype uses for fp8, and the format each one means on CUDA: their one home.
FP8_CACHE_DTYPES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
FORMAT_CODE = {"fp16": 0, "fp8_e4m3": 1, "fp8_e5m2": 2}  # the kernel's KV_FMT constexpr

# Split-KV (flash-decoding): when the (query block, KV head) programs cannot fill the GPU, each one's
# keys are shared among NUM_SPLITS programs and a second kernel merges their partial softmaxes.
TARGET_PROGRAMS_PER_SM = 2
MAX_SPLITS = 64
MIN_KEYS_PER_SPLIT = 512  # below this a split's fixed cost (Q load, partial write, merge) dominates


@dataclass(frozen=True)
class AttentionConfig:
    """One kernel shape: BLOCK_M query rows x TILE_N keys per step, by `num_warps` warps.

    `maxnreg` (None: ptxas chooses) is Triton's launch option of that name, `.maxnreg` in the PTX;
    the launcher and the sm_75 specs both pass it, so the product runs the build the fit test checks.
    """

    block_m: int
    tile_n: int
    num_warps: int
    kind: str  # "decode" or "prefill": which table it comes from (specs name their builds by it)
    maxnreg: int | None = None


# (head dim, KV format) -> config. fp8 tiles are widened in registers before the products, so they
# need the same operand registers as fp16 ones. Decode: 16 rows (one token's GQA heads, or a few
# tokens' at small G) by 4 warps. Prefill: 64 rows by 8 warps; with 4 warps the head-dim-128 build
# spilled (16-104 bytes at 255 registers) and 128 rows spilled for fp8 e4m3, so 64 x 8 warps it is.
# Key tiles: 64 for head dim 128, 32 for 256 (the [BLOCK_M, 256] fp32 accumulator leaves less room).
# e5m2 decode: on the PTX of Triton 3.7.1 (head dim 128) and 3.8.0 (256) ptxas stops at 128
# registers and spills 24 bytes unless capped; `.maxnreg 255` lets it take 160-177, no spills. That
# costs no occupancy: a decode program's 22-25 KiB of shared memory already allow only 2 per Turing
# SM, which leaves 256 registers per thread. On Triton 3.6 the cap changes nothing (160 stays, 166
# -> 168: the same 8-register allocation). Other formats keep ptxas's choice (0 spills on all three).
DECODE_MAXNREG = {"fp16": None, "fp8_e4m3": None, "fp8_e5m2": 255}
DECODE: dict[tuple[int, str], AttentionConfig] = {
    (d, f): AttentionConfig(block_m=16, tile_n=64 if d == 128 else 32, num_warps=4, kind="decode",
                            maxnreg=DECODE_MAXNREG[f])
    for d in HEAD_DIMS for f in KV_FORMATS
}
PREFILL: dict[tuple[int, str], AttentionConfig] = {
    (d, f): AttentionConfig(block_m=64, tile_n=64 if d == 128 else 32, num_warps=8, kind="prefill")
    for d in HEAD_DIMS for f in KV_FORMATS
}
# Prefill when the build comes out plain (no Turbo hook, or its build fell back): Triton's own sm_75
# code keeps the tiles in shared memory, and the head-dim-256 prefill tile above then needs 98,304
# bytes, more than Turing's 65,536, so it would fail to launch. Plain sm_75 builds (Triton 3.6,
# 2026-12-05, one stage): 64 x 32 x 8 warps 98,304 B; 32 x 32 x 4 65,536 B, 17 KB spilled;
# 32 x 16 x 4 49,152 B, 2.0-2.6 KB spilled. Slow, never broken. Head dim 128's prefill tile builds
# plain in 65,536 B and stays.
PREFILL_PLAIN: dict[tuple[int, str], AttentionConfig] = {
    (d, f): PREFILL[(d, f)] if d == 128 else AttentionConfig(block_m=32, tile_n=16, num_warps=4, kind="prefill")
    for d in HEAD_DIMS for f in KV_FORMATS
}


def select(head_dim: int, kv_format: str, group: int, max_seqlen_q: int, plain: bool = False) -> AttentionConfig:
    """The pinned config for a call: decode when every query fits one program's rows, else prefill
    (`PREFILL_PLAIN` for a build without the Turbo rewrite).

    `group` is the GQA ratio (query heads per KV head); BLOCK_M grows to a power of two >= group.
    """
    for table in (DECODE, PREFILL_PLAIN if plain else PREFILL):
        cfg = table[(head_dim, kv_format)]
        block_m = max(cfg.block_m, _pow2(group))
        if max_seqlen_q <= block_m // group or table is not DECODE:
            return replace(cfg, block_m=block_m)
    raise AssertionError("unreachable")


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
