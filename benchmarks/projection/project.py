"""Project the engine rows measured on a lent Hopper card onto an RTX 2080 Ti (a projection, not
a measurement), and check the model against a field figure it did not use.

    python3 benchmarks/projection/project.py ENGINE_RUN.json --launch LAUNCH.json [--json OUT]

ENGINE_RUN.json is an `engine_check.py --profile` run (sm75 mode: the Turing code path, every
Triton kernel built as sm_75 PTX); LAUNCH.json is `benchmarks/launch_overhead.py`'s, same call.

The model, per row (prefill 8K/32K, late chunk at 32K/128K, decode at 1K and at depth):
1. Each GPU kernel of the row is put in a class by its name (CLASSES, first match): linear-layer
   GEMMs, GDN prefill, GDN decode, attention, the short convolution, the rest.
2. Each class gets its FLOPs and DRAM bytes from the model's shapes (`work`): the weights the
   run counted (`weights`), the config's heads and dims, the row's tokens and context.
3. A class's roofline time on a card is max(FLOPs / peak, bytes / bandwidth), its peak the card's
   tensor rate for classes that run on tensor cores on the Turing path (cuBLAS GEMMs, our Turbo
   GDN prefill and attention) and its FP32 rate for the rest (cards.json, published figures).
4. A class's measured time is split in two: its launches times the per-kernel cost measured here
   under CUDA graph replay (the GPU's front end and an empty kernel's life; assumed alike on
   Turing, so carried over), and the rest, scaled by the ratio of its rooflines, 2080 Ti over the
   measured card: a kernel keeps the fraction of its roofline it reached here (the assumption that
   matters most). Classes without a work count (`other`) scale by bandwidth alone.
5. Decode's many small kernels (norms, activations, 1K attention) reach a few per cent of any
   roofline: they are latency-bound, and their time past the per-kernel cost still scales by the
   ratio, which overstates them on the slower card (pessimistic; the field check shows how much).
6. The host's share (the row's wall time less its GPU time) is carried over unchanged: a 2080 Ti
   box's CPU may be slower, and the field's decode is CPU-bound.

Biases, stated: the measured card runs our sm_75 tensor-core code as legacy mma.sync, which
reaches less of its peak than Hopper's own instructions, so scaling from its published peak
makes tensor-bound classes look slower on Turing than they are (pessimistic); memory-bound classes
assume the 2080 Ti reaches the same fraction of its 616 GB/s as Hopper of its HBM; L2 (5.5 MB
against 50 MB) and clocks under load are not modelled.

The field check (`field_check`): the measured 8-layer model is Qwen3.6-27B's per-GPU shapes at
TP 2 with 6 GDN and 2 attention layers, fp16 weights, the whole vocabulary; the field's model has
64 layers (48 GDN, 16 attention), AWQ 4-bit layer weights (about 4.25 bits with scales), the LM
head split over 2 GPUs, and 2 all-reduces a layer between the two cards. Its projected decode at
1K, without MTP, is compared with the field's "about 45 tok/s without MTP" on 2 x 2080 Ti 22G.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET = "rtx-2080-ti"

# (class, name pattern). First match wins; why each:
CLASSES: tuple[tuple[str, str], ...] = (
    ("gdn_prefill", r"^_prep_kernel$|^_state_kernel$|gdn_prep|gdn_state|chunk_|solve_tril|recompute_w_u|"
                    r"merge_16x16|kkt"),                                   # ours, or FLA's chunk kernels
    ("gdn_decode", r"fused_recurrent|fused_sigmoid_gating|delta_rule_update|packed_decode"),
    ("attention", r"_attn_kernel|unified_attention|paged_attention|reduce_segments|_merge_kernel|attn"),
    ("conv1d", r"causal_conv1d"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|cublas|sm90_|sm80_|ampere_"),       # cuBLAS
)
# Which kernels run on tensor cores on the Turing path: cuBLAS's GEMMs, and our Turbo kernels where
# the plugin was on (these names are our Triton kernels' own; a test holds them to kernels/). Stock
# Triton builds for sm_75 use no tensor cores, so vLLM's and FLA's Triton kernels count on FP32 FMA,
# on the measured card too (the sm75-mode run executed that same sm_75 code).
OURS_ON_TENSOR_CORES = ("_prep_kernel", "_state_kernel", "_attn_kernel")
OTHER = "other"


@dataclass(frozen=True)
class Card:
    key: str
    name: str
    sms: int
    fp32_fma_tflops: float
    tensor_fp16_fp32acc_tflops: float
    dram_gbps: float

    def roofline_s(self, flops: float, bytes_: float, tensor: bool) -> float:
        peak = (self.tensor_fp16_fp32acc_tflops if tensor else self.fp32_fma_tflops) * 1e12
        return max(flops / peak, bytes_ / (self.dram_gbps * 1e9))


def cards() -> tuple[dict[str, Card], dict[str, str]]:
    data = json.loads((HERE / "cards.json").read_text())
    out = {k: Card(k, v["name"], v["sms"], v["fp32_fma_tflops"], v["tensor_fp16_fp32acc_tflops"], v["dram_gbps"])
           for k, v in data["cards"].items()}
    return out, data["measured_as"]


def measured_card(gpu_name: str) -> Card:
    """The cards.json entry of the card a run names (nvidia-smi's name)."""
    table, names = cards()
    for needle, key in names.items():
        if needle in gpu_name:
            return table[key]
    raise SystemExit(f"project.py: no limits in cards.json for the card '{gpu_name}' (known: {', '.join(names)})")


def classify(name: str, plugin_on: bool = True) -> tuple[str, bool]:
    """A kernel's class and whether it runs on tensor cores on the Turing path."""
    cls = next((c for c, pattern in CLASSES if re.search(pattern, name)), OTHER)
    return cls, cls == "gemm" or (plugin_on and name in OURS_ON_TENSOR_CORES)


@dataclass(frozen=True)
class Shapes:
    """What the work counts need of the model (its config and the weights the run counted)."""
    hidden: int
    gdn_layers: int
    attn_layers: int
    k_heads: int
    v_heads: int
    head_k: int
    head_v: int
    q_heads: int
    kv_heads: int
    head_dim: int
    layer_weight_elements: int
    layer_weight_bytes: int
    lm_head_elements: int
    lm_head_bytes: int
    kv_bytes: float = 2.0      # fp16 KV
    state_bytes: float = 4.0   # fp32 GDN state (mamba_ssm_dtype)

    @classmethod
    def of(cls, config: dict[str, Any], weights: dict[str, Any]) -> "Shapes":
        t = config.get("text_config", config)
        # Qwen3.5/3.6 list the layer types; Qwen3-Next gives every n-th layer full attention
        types = t.get("layer_types") or ["full_attention" if (i + 1) % t["full_attention_interval"] == 0
                                         else "linear_attention" for i in range(t["num_hidden_layers"])]
        return cls(hidden=t["hidden_size"], gdn_layers=types.count("linear_attention"),
                   attn_layers=types.count("full_attention"), k_heads=t["linear_num_key_heads"],
                   v_heads=t["linear_num_value_heads"], head_k=t["linear_key_head_dim"],
                   head_v=t["linear_value_head_dim"], q_heads=t["num_attention_heads"],
                   kv_heads=t["num_key_value_heads"], head_dim=t["head_dim"],
                   layer_weight_elements=weights["matrix"]["elements"], layer_weight_bytes=weights["matrix"]["bytes"],
                   lm_head_elements=weights["lm_head"]["elements"], lm_head_bytes=weights["lm_head"]["bytes"])


@dataclass(frozen=True)
class Row:
    """What one engine row computes: new tokens, forward steps, the context each attends to."""
    name: str
    tokens: int        # tokens computed
    steps: int         # forward steps (chunks of a prefill, one per decode token)
    pairs: float       # attention (query, key) pairs over all tokens
    context: int       # keys at the end of the row


def row_of(name: str, tokens: int, chunk: int) -> Row:
    """The row's work from its name (engine_check's profile rows) and the tokens it stands for
    (a decode row's steps, a late chunk's length)."""
    if name.startswith("prefill_"):
        n = int(name.split("_")[1])
        return Row(name, n, -(-n // chunk), n * (n + 1) / 2, n)
    if name.startswith("late_chunk_"):
        n = int(name.split("_")[2])
        return Row(name, tokens, 1, tokens * (n - tokens) + tokens * (tokens + 1) / 2, n)
    if name.startswith("decode_"):
        depth = 1024 if name == "decode_1024" else int(name.split("_")[2])
        return Row(name, tokens, tokens, tokens * (depth + tokens / 2), depth)
    raise ValueError(f"unknown profile row {name!r}")


def work(cls: str, r: Row, s: Shapes) -> tuple[float, float] | None:
    """(FLOPs, DRAM bytes) of a class over a row; None where the class has no count (`other`)."""
    decode = r.name.startswith("decode")
    if cls == "gemm":   # every layer matrix on every token; the LM head on one token a step
        flops = 2.0 * (s.layer_weight_elements * r.tokens + s.lm_head_elements * r.steps)
        act = 2.0 * r.tokens * s.hidden * 2 * 8   # about 8 activations of hidden size in and out a layer's GEMMs
        return flops, (s.layer_weight_bytes + s.lm_head_bytes) * r.steps + act
    if cls == "gdn_prefill":
        chunks, bt = -(-r.tokens // 64), 64
        per_chunk = 2 * bt * bt * (4 * s.head_k + 2 * s.head_v) + 6 * bt * s.head_k * s.head_v
        io = r.tokens * (2 * s.k_heads * s.head_k * 2 + 2 * s.v_heads * s.head_v * 2 + 2 * s.v_heads * 4)
        state = 2 * r.steps * s.v_heads * s.head_k * s.head_v * s.state_bytes
        return float(s.gdn_layers * chunks * s.v_heads * per_chunk), float(s.gdn_layers * (io + state))
    if cls == "gdn_decode":
        state = s.v_heads * s.head_k * s.head_v
        return float(s.gdn_layers * r.tokens * 6 * state), float(s.gdn_layers * r.tokens * 2 * state * s.state_bytes)
    if cls == "attention":
        flops = 4.0 * s.q_heads * s.head_dim * r.pairs * s.attn_layers
        kv_per_token = 2 * s.kv_heads * s.head_dim * s.kv_bytes
        reads = (r.tokens if decode else r.steps) * r.context * kv_per_token   # the context's KV, once a step (or a token)
        return flops, float(s.attn_layers * reads)
    if cls == "conv1d":
        dim = 2 * s.k_heads * s.head_k + s.v_heads * s.head_v
        return 0.0, float(s.gdn_layers * r.tokens * dim * 2 * 3)   # in, out and the gated copy, fp16
    return None


def project_row(prof: dict[str, Any], r: Row, s: Shapes, here: Card, there: Card, launch_us: float,
                plugin_on: bool = True) -> dict[str, Any]:
    """One row: per class, measured time, work, rooflines on both cards and the projected time. A
    class's roofline uses tensor cores where most of its measured time did."""
    by: dict[str, dict[str, Any]] = {}
    for k in prof["kernels"]:
        cls, tensor = classify(k["name"], plugin_on)
        c = by.setdefault(cls, {"us": 0.0, "tensor_us": 0.0, "launches": 0, "kernels": 0})
        c["us"] += k["us"]
        c["tensor_us"] += k["us"] if tensor else 0.0
        c["launches"] += k["calls"]
        c["kernels"] += 1
    total = 0.0
    for cls, c in by.items():
        c["tensor"] = c["tensor_us"] > c["us"] / 2
        w = work(cls, r, s)
        if w is None:
            ratio = here.dram_gbps / there.dram_gbps
            c.update(flops=None, bytes=None)
        else:
            flops, bytes_ = w
            rh, rt = here.roofline_s(flops, bytes_, c["tensor"]), there.roofline_s(flops, bytes_, c["tensor"])
            ratio = rt / rh if rh > 0 else 1.0
            c.update(flops=flops, bytes=bytes_, roofline_us_here=rh * 1e6, roofline_us_there=rt * 1e6,
                     fraction_of_roofline_here=rh * 1e6 / c["us"] if c["us"] else None)
        c["ratio"] = ratio
        fixed = min(c["launches"] * launch_us, c["us"])   # the per-kernel cost: alike on both cards
        c["projected_us"] = fixed + (c["us"] - fixed) * ratio
        total += c["projected_us"]
    host_s = max(prof["wall_s"] - prof["gpu_us"] / 1e6, 0.0)
    seconds = total / 1e6 + host_s
    return {"row": r.name, "tokens": r.tokens, "measured_gpu_ms": prof["gpu_us"] / 1e3, "host_ms": host_s * 1e3,
            "measured_wall_ms": prof["wall_s"] * 1e3, "projected_gpu_ms": total / 1e3,
            "projected_tok_s": r.tokens / seconds, "measured_tok_s_profiled": r.tokens / prof["wall_s"],
            "classes": by}


@dataclass(frozen=True)
class Field:
    """The field's setup the check scales to (see the module's docstring)."""
    layers: int = 64
    gdn_layers: int = 48
    attn_layers: int = 16
    weight_bits: float = 4.25       # AWQ 4-bit with group-128 fp16 scales and zeros
    lm_head_split: int = 2          # vocabulary split over TP 2
    all_reduces_per_layer: int = 2
    all_reduce_us: float = 20.0     # assumed: a small NCCL all-reduce between two PCIe cards
    tok_s: float = 45.0
    source: str = ("field report, 2 x RTX 2080 Ti 22G, Qwen3.6-27B-AWQ-INT4, TP 2, vLLM 0.21.0: about 45 tok/s "
                   "decode without MTP (src/caovan_vllm_sm75_turbo3/data/profiles.json)")


def field_check(decode: dict[str, Any], s: Shapes, f: Field = Field()) -> dict[str, Any]:
    """The projected decode at 1K scaled to the field's model and TP 2, against the field's figure."""
    c = decode["classes"]
    per_token = {k: v["projected_us"] / decode["tokens"] for k, v in c.items()}
    gemm = per_token.get("gemm", 0.0)
    layer_bytes, head_bytes = s.layer_weight_bytes, s.lm_head_bytes
    layer_share = layer_bytes / (layer_bytes + head_bytes)
    scaled = {
        "gemm_layers": gemm * layer_share * (f.layers / (s.gdn_layers + s.attn_layers)) * (f.weight_bits / 16),
        "lm_head": gemm * (1 - layer_share) / f.lm_head_split,
        "gdn_decode": per_token.get("gdn_decode", 0.0) * f.gdn_layers / s.gdn_layers,
        "conv1d": per_token.get("conv1d", 0.0) * f.gdn_layers / s.gdn_layers,
        "attention": per_token.get("attention", 0.0) * f.attn_layers / s.attn_layers,
        "other": per_token.get(OTHER, 0.0) * f.layers / (s.gdn_layers + s.attn_layers),
        "all_reduce": f.layers * f.all_reduces_per_layer * f.all_reduce_us,
        "host": decode["host_ms"] * 1e3 / decode["tokens"],
    }
    us = sum(scaled.values())
    projected = 1e6 / us
    return {"per_token_us": scaled, "projected_tok_s": projected, "field_tok_s": f.tok_s,
            "off_by": projected / f.tok_s, "assumptions": asdict(f)}


def project(run: dict[str, Any], config: dict[str, Any], launch: dict[str, Any], gpu_name: str) -> dict[str, Any]:
    """Every profiled row of `run` projected onto a 2080 Ti, and the field check."""
    here = measured_card(gpu_name)
    there = cards()[0][TARGET]
    s = Shapes.of(config, run["weights"])
    chunk = _arg(run["argv"], "--chunk", 2048)
    plugin_on = bool(run.get("plugin_loaded", True))
    rows = [project_row(p, row_of(name, p["tokens"], chunk), s, here, there,
                        launch["graph_us_per_kernel"], plugin_on)
            for name, p in run["profile"].items()]
    out = {"measured_on": asdict(here), "projected_onto": asdict(there), "launch": launch, "shapes": asdict(s),
           "plugin_on": plugin_on, "rows": rows}
    decode = next((r for r in rows if r["row"] == "decode_1024"), None)
    if decode is not None:
        out["field_check"] = field_check(decode, s)
    return out


def _arg(argv: list[str], flag: str, default: int) -> int:
    return int(argv[argv.index(flag) + 1]) if flag in argv else default


def markdown(p: dict[str, Any]) -> str:
    """The projection as a table: measured here, projected onto the 2080 Ti, the leading class."""
    lines = ["| row | measured GPU ms | host ms | projected GPU ms | projected tok/s | largest class (share) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in p["rows"]:
        top = max(r["classes"].items(), key=lambda kv: kv[1]["projected_us"])
        share = top[1]["projected_us"] / 1e3 / r["projected_gpu_ms"] if r["projected_gpu_ms"] else 0
        lines.append(f"| {r['row']} | {r['measured_gpu_ms']:,.2f} | {r['host_ms']:,.2f} | {r['projected_gpu_ms']:,.2f} "
                     f"| {r['projected_tok_s']:,.0f} | {top[0]} ({share:.0%}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="an engine_check.py --profile JSON")
    ap.add_argument("--launch", type=Path, required=True, help="launch_overhead.py's JSON from the same call")
    ap.add_argument("--config", type=Path, default=HERE.parent / "engine" / "qwen36-27b-tp2-8layer" / "config.json")
    ap.add_argument("--gpu", default=None, help="the measured card's name (default: the launch JSON's)")
    ap.add_argument("--json", type=Path, help="write the projection here")
    a = ap.parse_args(argv)
    run = json.loads(a.run.read_text())
    if "profile" not in run:
        ap.error(f"{a.run}: no profile rows (run engine_check.py with --profile)")
    launch = json.loads(a.launch.read_text())
    p = project(run, json.loads(a.config.read_text()), launch, a.gpu or launch["card"])
    print(markdown(p))
    if "field_check" in p:
        fc = p["field_check"]
        print(f"\nfield check: projected {fc['projected_tok_s']:.1f} tok/s decode (2 x 2080 Ti 22G, the 27B model, "
              f"TP 2, no MTP) against the field's {fc['field_tok_s']:.0f}: {fc['off_by']:.2f}x")
    if a.json:
        a.json.write_text(json.dumps(p, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
