"""Predicted vs published throughput for the published runs in benchmarks/data/published_runs.csv.

For each row the planner estimates the published layout, on the published architecture and hardware,
under the framework profile of the stack that ran it (`framework` column), and we compare per-GPU
throughput in the source's own FLOP convention (`flop_convention`). Whatever the convention, the
source's FLOP count of a step is the same number on both sides, so the comparison is one of step
times: error = published step time / predicted step time - 1 (positive: the planner is optimistic).

Every constant of the planner comes from datasheets, kernel and collective measurements or framework code
(docs/planner.md) but three, which come from training runs: the in-situ efficiency per GPU architecture (the dense
rows), and a MoE layer's fixed cost per micro-batch and the host's time to issue a MoE layer's pass (the
mixture-of-experts rows, scored apart). Each is refitted here on its rows, and for every source on the other
sources' rows: that source's errors with the constants fitted without it (leave one source out) are printed beside
the plain ones.
Rows the planner cannot model yet (compiled FP8, ...) are printed as skipped
with the reason; rows marked '?' in the throughput are printed but kept out of the summary.

    python benchmarks/published_runs.py [--csv PATH] [--json] [--six-profiles] [--measured-fabric] [--write-check]

--six-profiles scores each row under the nearest of the six profiles most users name (SIX_PROFILES below).
--measured-fabric is a what-if: every row's network as a measured InfiniBand cluster delivers it (MEASURED_FABRIC).
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from shardwise.errors import UsageError
from shardwise.forked import map_pieces, worker_count
from shardwise.planner import estimate, kernels
from shardwise.planner import moe as moe_terms
from shardwise.planner.estimate import complete_layout, fewest_recomputed
from shardwise.planner.frameworks import FRAMEWORKS
from shardwise.planner.job import make_job
from shardwise.planner.step_time import model_flops_per_step
from shardwise.specs import Layout, ModelSpec, load_cluster, load_model, validate_layout
from shardwise.stage_split import max_chunk_layers
from shardwise.validate.stats import kendall_tau, widest_discordant_gap

DEFAULT_CSV = Path(__file__).resolve().parent / "data/published_runs.csv"

# Vocabulary when the row says NR: the tokenizer of that model family where it is public,
# else the padded GPT-2 BPE Megatron uses (51200).
VOCAB_BY_NAME = {"Llama3.1": 128256, "Llama 3.1": 128256, "Llama 3 ": 128256, "Llama3": 128256,
                 "Nemotron4": 256000, "Nemotron-4": 256000, "GLM-130B": 150528, "Llama 2": 32000, "LLAMA2": 32000}
DEFAULT_VOCAB = 51200
# The `framework` column names the stack; `fsdp` (PyTorch/FairScale FSDP outside torchtitan: MosaicML
# Composer, metaseq) runs FSDP semantics: the torchtitan profile; `other` is closest to megatron-core's
# distributed optimizer, except Meta's in-house Llama 3 stack, which has its own profile (`llama3`: the stack
# "The Llama 3 Herd of Models" Sec. 3.3 describes), and InternEvo (`internevo`: its Hybrid ZeRO-1).
PROFILE_OF = {"fsdp": "torchtitan", "other": "megatron-core"}
OTHER_BY_SOURCE = (("The Llama 3 Herd of Models", "llama3"), ("InternLM/InternEvo", "internevo"),
                   ("Hagemann et al. 2023", "aleph-alpha"), ("flash-attention training/", "flash-attn"),
                   ("huggingface/nanotron", "nanotron"))
# Rows without a framework column (the older copy of the file): by source.
PROFILE_BY_SOURCE = (("Korthikanti", "megatron-2021"), ("Narayanan", "megatron-2021"), ("dgxc-benchmarking", "nemo"),
                     ("mosaicml", "torchtitan"), ("Zhang et al. 2022", "deepspeed"))
# Runs from before FlashAttention (2022 and earlier) materialised the softmax.
PRE_FLASH = ("2021", "2022", "2104.04473", "2201.11990", "2204.06745", "2205.05198", "2205.01068", "2210.02414",
             "2211.05100", "bigscience")
# Recipes that train GPT-style models without dropout: llm-foundry's MPT (MPTConfig: resid_pdrop, emb_pdrop and
# attn_pdrop 0.0) and mosaicml/examples' MosaicGPT before it (configuration_mosaic_gpt.py at v0.0.4: the same three
# 0.0); GPT-NeoX-20B (EleutherAI/gpt-neox configs/20B.yml, "as it was trained": "hidden-dropout": 0,
# "attention-dropout": 0); Pythia (EleutherAI/pythia models/*/pythia-*.yml at a19eecb: "hidden-dropout": 0,
# "attention-dropout": 0 in every size's config). BLOOM's training script sets neither flag, so Megatron-DeepSpeed's 0.1 defaults applied
# (bigscience tr11-176B-ml.slurm), though its released config.json says 0.0.
NO_DROPOUT = ("mosaicml", "configs/20B.yml", "EleutherAI/pythia models/")
# Gated-MLP models (parsed as the Llama family, which trains without dropout) whose recipe kept Megatron's dropout:
# GLM-130B's script (THUDM LargeScale configs/glm-130b/glm-130b.sh) sets neither --hidden-dropout nor
# --attention-dropout, whose defaults are 0.1 (LargeScale megatron/arguments.py).
WITH_DROPOUT = ("2210.02414", "THUDM/GLM-130B")
PEAK_TFLOPS = {"A100": 312.0, "H100": 989.0, "H200": 989.0}


@dataclass
class Run:
    name: str
    source: str
    framework: str = ""
    series: str = ""
    job: object = None
    layout: Layout | None = None
    published_step_s: float | None = None
    weak: bool = False
    weak_reason: str = ""  # why a row is kept out of the summary, from its notes ("Weak: ...")
    skip: str = ""  # why the row is not modelled
    stand_in: bool = False  # scored under another stack's profile (stands_in): not that stack's own record


def _int(cell: str) -> int | None:
    m = re.search(r"\d+", cell.replace(",", ""))
    return int(m.group()) if m else None


def _float(cell: str) -> float | None:
    m = re.search(r"\d+(\.\d+)?(e[+-]?\d+)?", cell.replace(",", ""))
    return float(m.group()) if m else None


# The network a row states, per node (a node's NICs together, shared by its GPUs) or per GPU, as line rate in Gb/s:
# "8x400 Gb/s IB per node", "8x ConnectX-7 NDR 400 Gb/s IB per node", "... 400 Gb/s per VM", "RoCE 1600 Gbps
# node-node", "800 Gb/s per node", "RoCE 400 Gb/s per GPU"; Jean Zay's and the 12-node cluster's links by count.
PER_NODE_NETWORK = (re.compile(r"(\d+)\s*x\s*[^;),]*?(\d+)\s*Gb/s[^;),]*?per (?:node|VM)"),
                    re.compile(r"()(\d+)\s*Gb(?:ps|/s)\s*(?:per node|node-node)"))
PER_GPU_NETWORK = re.compile(r"(\d+)\s*Gb(?:ps|/s)[^;),]*?per GPU")
NAMED_LINKS = {"4x Omni-Path links per node": 4 * 100, "4x ConnectX-6 HDR per node": 4 * 200}  # 100 / 200 Gb/s links


def stated_network(gpu_type: str, gpus_per_node: int) -> float | None:
    """Bytes/s per GPU of the network the row states (a node's line rate split over its GPUs), or None."""
    gbits = next((rate for text, rate in NAMED_LINKS.items() if text in gpu_type), None)
    for pattern in PER_NODE_NETWORK:
        m = pattern.search(gpu_type) if gbits is None else None
        if m:
            gbits = int(m.group(1) or 1) * int(m.group(2))
    if gbits is not None:
        return gbits / 8 * 1e9 / gpus_per_node
    m = PER_GPU_NETWORK.search(gpu_type)
    return int(m.group(1)) / 8 * 1e9 if m else None


def power_capped(gpu_type: str) -> bool:
    """Meta's Grand Teton H100s (torchtitan's rows): "96GB HBM2e", "the default 500W power limit" (the 2024-25
    benchmark files); the older docs/performance.md rows say "HBM2e-based SXM H100 with lower TDP" of the same hosts."""
    return "H100" in gpu_type and ("500 W" in gpu_type or "lower TDP" in gpu_type)


def cluster_preset(gpu_type: str) -> str:
    """The shipped cluster preset of a row's GPU: what `--cluster` names for it (AWS's p4d / p4de instances by
    name: their 400 Gb/s EFA per node of eight A100s is a quarter of a DGX A100's network)."""
    if "p4de" in gpu_type or "p4d." in gpu_type:
        return "aws-p4de" if "p4de" in gpu_type else "aws-p4d"
    if gpu_type.startswith(("H800", "A800")):  # the export variants, where stated: the same dies, NVLink at 400 GB/s
        return "hgx-h800-80gb" if gpu_type.startswith("H800") else "hgx-a800-80gb"
    return ("h100-96gb-500w" if power_capped(gpu_type) else "dgx-h200" if "H200" in gpu_type
            else "dgx-h100-80gb" if "H100" in gpu_type else "dgx-a100-40gb" if "40GB" in gpu_type else "dgx-a100-80gb")


# --measured-fabric (a what-if, never the shipped figure): every row's network at explain.MEASURED_FABRIC, what one
# measured 400G InfiniBand cluster delivers (docs/accuracy.md, "A measured fabric for every cluster, tried").
MEASURED_FABRIC: dict | None = None


def _cluster(gpu_type: str):
    """The row's preset with the network and GPU memory the row states (and, under --measured-fabric, that network
    at the measured share of its line rate with the measured extra time per crossing)."""
    cluster = load_cluster(cluster_preset(gpu_type))
    network = stated_network(gpu_type, cluster.gpus_per_node)
    if network:
        cluster = replace(cluster, inter_node_bandwidth=network)
    if MEASURED_FABRIC:
        cluster = replace(cluster, inter_node_bandwidth=cluster.inter_node_bandwidth * MEASURED_FABRIC["line_rate_share"],
                          net_step_extra=MEASURED_FABRIC["net_step_extra_s"])
    if re.search(r"9[46]\s*-?\s*(GB|9[46]GB)", gpu_type):
        cluster = replace(cluster, gpu_memory_bytes=96e9)
    return cluster


def _model(row: dict) -> ModelSpec:
    name = row["run"]
    heads = _int(row["heads"])
    kv = heads
    m = re.search(r"(\d+) (query groups|KV)", row["heads"])
    if m:
        kv = int(m.group(1))
    mlp = row.get("mlp", "").split("(")[0].strip("? ")  # "swiglu (clamped)": GPT-OSS's SwiGLU, clamped
    gated = mlp in ("swiglu", "geglu") if mlp else ("Llama" in name or "GeGLU" in row["ffn_hidden"])
    # Llama-style blocks (RoPE, no biases, untied head) with a gated MLP, or Nemotron-4's squared ReLU; else GPT.
    family = "llama" if gated or mlp == "squared-relu" else "gpt2"
    hidden = _int(row["hidden"])
    vocab = _int(row["vocab"]) if row["vocab"].strip()[:1].isdigit() else next(
        (v for k, v in VOCAB_BY_NAME.items() if k in name), DEFAULT_VOCAB)
    # GPT-NeoX's blocks (its config key, quoted in the row's notes): parallel attention + MLP, rotary positions, as
    # its Hugging Face config.json reads (hf_architectures.gpt_neox)
    neox = '"gpt_j_residual": true' in row["notes"]
    return ModelSpec(name=name, family=family, hidden=hidden, ffn_hidden=_int(row["ffn_hidden"]),
                     num_layers=_int(row["layers"]), num_heads=heads, num_kv_heads=kv, vocab_size=vocab,
                     head_dim=hidden // heads, max_positions=_int(row["seq_len"]),
                     tie_embeddings=family == "gpt2" and "Untied embeddings" not in row["notes"],
                     mlp=mlp if family == "llama" and mlp not in ("", "swiglu") else "",
                     parallel_residual=neox, positions="rotary" if neox else "",
                     dropout=False if source_names(row, NO_DROPOUT)
                     else True if source_names(row, WITH_DROPOUT) else None)


def _moe(row: dict, model: ModelSpec) -> ModelSpec:
    """A mixture-of-experts row's experts on the parsed model, from its columns (experts, top-k, expert width,
    shared experts, dense first layers, head size); MLA rows (DeepSeek-V3, Kimi K2) take the deepseek-v3
    preset's latent-attention shapes. Dense rows come back unchanged."""
    experts = _int(row.get("moe_experts", "") or "") or 0
    if experts <= 1:
        return model
    width = _int(row["moe_ffn_hidden"])
    fields = dict(num_experts=experts, experts_per_token=_int(row["moe_topk"]), moe_ffn_hidden=width,
                  shared_ffn_hidden=(_int(row["moe_shared_experts"]) or 0) * width,
                  moe_layers=tuple(range(_int(row["moe_dense_layers"]) or 0, model.num_layers)),
                  head_dim=_int(row.get("head_dim", "") or "") or model.head_dim)
    if "MLA" in row["heads"]:
        v3 = load_model("deepseek-v3")
        fields.update({k: getattr(v3, k) for k in ("attention", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                   "qk_rope_head_dim", "v_head_dim", "head_dim", "router_scoring")})
    return replace(model, **fields)


def _recompute(cell: str) -> str:
    c = cell.lower()
    if c.startswith("selective"):
        return "selective"
    if c.startswith("full") or c.startswith("yes"):
        return "full"
    return "none"


def _recompute_layers(cell: str, chunk_layers: int) -> int | None:
    """Full recompute of only some layers per model chunk, as the recompute cell names it: every k-th block
    (torchtitan's selective_ac_option k, fms-fsdp's selective_checkpointing: a chunk's layers // k) or Megatron's
    block method (recompute_num_layers N); None: every layer or none."""
    c = cell.lower()
    every = re.search(r"every (\d+)(?:st|nd|rd|th) \w*(?:block|layer)", c)
    if every:
        return chunk_layers // int(every.group(1))
    block = re.search(r"(?:recompute[-_]num[-_]layers|activations_checkpoint_num_layers)[ =:]*(\d+)", c)
    return int(block.group(1)) if block and "block" in c and int(block.group(1)) > 0 else None


def _zero(cell: str) -> int:
    c = cell.strip()
    return int(c[0]) if c[:1].isdigit() else (0 if c.startswith("none") or c.startswith("NR") or not c else 1)


def _dp_shard(cell: str, dp: int, tp_cp: int) -> int:
    """HSDP rows ("HYBRID_SHARD ... within a node of 8"): one node's dp ranks per shard group; InternEvo's ZeRO-1 group
    ("zero1=8: optimizer states sharded within 8 data-parallel ranks"); else 0 (all of dp)."""
    m = re.search(r"HYBRID_SHARD.*?within a node of (\d+)", cell)
    if m:
        return min(dp, int(m.group(1)) // tp_cp)
    z = re.search(r"zero1=(\d+): optimizer states sharded within", cell)
    return min(dp, int(z.group(1))) if z else 0


# The six profiles a user names most (`--framework` of plan, estimate and explain), and the nearest of them for each
# other profile: what a user who names only those six gets (--six-profiles).
SIX_PROFILES = ("megatron-2021", "megatron-core", "nemo", "deepspeed", "torchtitan", "shardwise")
NEAREST_OF_SIX = {"composer": "torchtitan", "composer-pure": "torchtitan", "llama3": "torchtitan",
                  "llama2": "torchtitan", "automodel": "torchtitan", "deepspeed-2024": "deepspeed",
                  "deepspeed-bf16": "deepspeed", "lit-gpt": "torchtitan", "fms-fsdp": "torchtitan",
                  "internevo": "megatron-core", "aleph-alpha": "megatron-core",
                  "flash-attn": "megatron-core", "gpt-neox": "deepspeed", "nanotron": "megatron-core"}


def _profile(row: dict) -> str:
    fw = row.get("framework", "").strip()
    if "NVIDIA-NeMo/Automodel" in row["source"] and (_int(row.get("moe_experts", "") or "") or 0) > 1:
        return "automodel"  # its own MoE model path (TE kernels, DeepEP, bf16 states), not the HF path of its dense runs
    if fw == "fsdp" and "mosaicml" in row["source"]:  # Composer's FSDP, with the run's FSDP mixed precision
        return "composer-pure" if "/ PURE" in row["notes"] else "composer"
    if fw == "fsdp" and "jzhang38/TinyLlama" in row["source"]:  # Lit-GPT on Lightning Fabric's FSDP, fused kernels
        return "lit-gpt"
    if fw == "fsdp" and "foundation-model-stack/fms-fsdp" in row["source"]:  # FSDP1, BF16 reduce (bfSixteen)
        return "fms-fsdp"
    if fw == "deepspeed" and "BF16_Optimizer" in row["zero_stage"]:  # its bf16 pipeline path (profiles/deepspeed.py)
        return "deepspeed-bf16"
    if fw == "deepspeed" and "EleutherAI/pythia" in row["source"]:  # GPT-NeoX v1.0's own attention layer
        return "gpt-neox"
    if fw == "other":
        return next((p for key, p in OTHER_BY_SOURCE if key in row["source"]), PROFILE_OF[fw])
    if fw:
        return PROFILE_OF.get(fw, fw)
    text = row["run"] + " " + row["source"]
    return next((p for key, p in PROFILE_BY_SOURCE if key.lower() in text.lower()), "deepspeed")


def stands_in(row: dict, profile: str) -> bool:
    """Whether the row's stack has no profile of its own and `profile` stands in for it (PROFILE_OF: an FSDP stack
    outside torchtitan as torchtitan, an unnamed one as megatron-core): its errors are not that profile's record."""
    fw = row.get("framework", "").strip()
    return fw in PROFILE_OF and profile == PROFILE_OF[fw]


def _batch(cell: str, dp: int, mb: int) -> int:
    """The configured global batch (NeoX: paper 1538, config 1536), else the nearest multiple of dp * mb."""
    head = cell.split("(")[0]
    batches = [int(x) for x in re.findall(r"\d+", head + " " + " ".join(re.findall(r"config[^)]*?(\d+)", cell)))]
    batch = next((b for b in reversed(batches) if b % (dp * mb) == 0), None)
    return batch if batch is not None else max(1, round(batches[0] / (dp * mb))) * dp * mb


def source_flops_per_step(row: dict, job) -> float:
    """The source's own FLOP count of one step (only used to turn a TFLOP/s figure into a step time)."""
    conv = row.get("flop_convention", "").strip("? ")
    m = job.model
    B, s, l, h, V = job.train.global_batch, job.train.seq_len, m.num_layers, m.hidden, m.vocab_size
    if not conv:
        conv = "megatron-hw" if any(k in row["run"] for k in ("MT-NLG", "BLOOM", "GPT-NeoX")) else "palm"
    if conv == "megatron-hw":
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    if conv == "megatron-model" and m.is_moe:
        return megatron_core_flops(m, B, s)
    if conv == "megatron-model":
        return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    if conv == "neox-logger":  # GPT-NeoX's logger until 5f364017 (2023-09): 6 x all parameters + 60 s h l per token,
        # no recompute (EleutherAI/gpt-neox megatron/logging.py get_flops, the same at 2cc9e846, 2022-02, and v1.0)
        return B * s * (6 * m.num_params() + 60 * s * h * l)
    per_seq = re.search(r"[Mm]odel flops/seq = ([\d.]+e[+]?\d+)", row["notes"])
    proxy = re.search(r"\(([\d/]+) layers\)", row["notes"])  # reduced-depth proxies of the full model
    if conv == "nemo-model" and per_seq and not (proxy and str(l) in proxy.group(1).split("/")):
        return float(per_seq.group(1)) * B
    return model_flops_per_step(job)  # PaLM / torchtitan: 6N + 12 l q s per token


def megatron_core_flops(m: ModelSpec, B: int, s: int) -> float:
    """Megatron-Core's own FLOP counter of a step (megatron/training/training.py num_floating_point_operations,
    transformer_flops: GQA or MLA projections, causal attention halved, SwiGLU, routed top-k and shared experts,
    dense first layers, the logits; each GEMM 3 times): what its MoE runs report as TFLOP/s per GPU."""
    h, heads, swiglu = m.hidden, m.num_heads, 3 if m.gated_mlp else 2
    if m.attention == "mla":
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = m.q_lora_rank * (h + heads * qk + 1) if m.q_lora_rank else h * heads * qk
        attn = (q + m.kv_lora_rank * (h + heads * (m.qk_nope_head_dim + m.v_head_dim) + 1) + h * m.qk_rope_head_dim
                + heads * m.v_head_dim * h + s * heads * qk / 2 + s * heads * m.v_head_dim / 2)
    else:
        attn = h * (m.q_dim + 2 * m.kv_dim) + m.q_dim * s / 2 * 2 + m.q_dim * h
    moe_layers = len(m.moe_layers)
    mlp = ((m.num_layers - moe_layers) * h * m.ffn_hidden * swiglu
           + moe_layers * h * (m.moe_ffn_hidden * m.experts_per_token + m.shared_ffn_hidden) * swiglu)
    return 3 * 2 * B * s * (m.num_layers * attn + mlp + h * m.vocab_size)


def published_step_time(row: dict, job, gpus: int) -> float | None:
    """Seconds per step as published: the step time when printed, else tokens/s, else TFLOP/s or MFU."""
    step = _float(row.get("step_time_s", "") or "")
    if step:
        return step
    tps = _float(row.get("tokens_per_s_per_gpu", "") or "")
    if tps:
        return job.train.global_batch * job.train.seq_len / (tps * gpus)
    it = re.search(r"iteration time ([\d.]+) s", row["notes"])
    if it:
        return float(it.group(1))
    tf = _float(row["tflops_per_gpu"])
    if not tf and _float(row["mfu_or_peak_pct"]):
        gpu = next((k for k in PEAK_TFLOPS if k in row["gpu_type"]), "A100")
        tf = _float(row["mfu_or_peak_pct"]) / 100 * PEAK_TFLOPS[gpu]
    if not tf:
        return None
    return source_flops_per_step(row, job) / (tf * 1e12 * gpus)


def _precision(row: dict) -> str:
    """fp8 when the row's GEMMs ran in FP8 (Transformer Engine, torchao Float8), else bf16 (FP16 counts as bf16). A
    filled `precision` cell decides; only a row without one is read from its name (a "... BF16" row of a paper titled
    FP8-something stays BF16)."""
    stated = row.get("precision", "").strip().lower()
    stated = "" if stated.startswith("nr") else stated  # "not reported" states nothing
    fp8 = "fp8" in stated if stated else ("Float8" in row["run"] or "FP8" in row["run"])
    return "fp8" if fp8 else "bf16"


def stated_sequence_parallel(row: dict) -> bool:
    """The row says its TP sharded the sequence (Megatron's --sequence-parallel)."""
    return "SP" in row["recompute"] or "SP on" in row["notes"] or "sequence parallel" in row["run"].lower()


def stated_no_sequence_parallel(row: dict) -> bool:
    """The row says its TP did not shard the sequence ('SP off': plain Megatron TP, e.g. InternEvo's tensor mode
    'mtp'), so the command line names --no-sequence-parallel instead of choosing."""
    return "SP off" in row["notes"]


def stated_tp_comm_overlap(row: dict) -> bool | None:
    """TP comm overlap as the row states it (async TP, NeMo's tp_comm_overlap; 'tp comm overlap off': NeMo's
    ub_tp_comm_overlap false, whatever its profile's default), None when it says nothing."""
    notes = row["notes"].lower()
    if "tp comm overlap off" in notes:
        return False
    # "Async TP", "AsyncTP" in the name, or a technique list in the notes ("compile + Float8 + AsyncTP")
    asynchronous = re.search(r"async ?tp", row["run"].lower()) or re.search(r"\+ ?async ?tp", notes)
    return True if asynchronous or "tp-comm-overlap" in notes or "tp comm overlap" in notes else None


def stated_fp8_params(row: dict) -> bool:
    """FP8 parameters (NeMo's FP8_PARAMS / fp8_params): weights stored and gathered in FP8, one byte each; or torchao's
    float8 all-gather for FSDP (torchtitan's enable_fsdp_float8_all_gather, OLMo-core's float8 config), the command
    line's --fp8-params under torchtitan."""
    notes = row["notes"].lower()
    return _precision(row) == "fp8" and ("FP8_PARAMS=True" in row["notes"] or "fp8_params" in notes
                                         or "float8 all-gather" in notes
                                         or "enable_fsdp_float8_all_gather = true" in notes)


def pre_flash(row: dict) -> bool:
    """A run whose attention materialised the softmax: from before FlashAttention (PRE_FLASH), or later but launched
    without it, as its notes say ('FlashAttention off': e.g. Megatron-LM without --use-flash-attn, its default)."""
    return any(k in row["source"] + " " + row["run"] for k in PRE_FLASH) or "FlashAttention off" in row["notes"]


def stated_flash(row: dict) -> bool:
    """A run whose config names FlashAttention where its profile's default is a materialised softmax (GPT-NeoX's
    "attention-config": [[["flash"], N]], as Pythia's configs at a19eecb and the paper's Sec. 2.4 say; Megatron-LM's
    --use-flash-attn in the launch script, as StarCoder's). `pre_flash` is asked first: a note saying the script
    passes neither flag is FlashAttention off."""
    return '[["flash"]' in row["notes"] or "--use-flash-attn" in row["notes"]


def ran_compiled(row: dict) -> bool:
    """The run's blocks ran under torch.compile, as its name or notes say (scored with --compile)."""
    notes = row["notes"].replace("no torch.compile", "")  # "Eager (no torch.compile)" is an eager run
    # torchtitan's tables 5 and 6 (benchmarks/llama3_h100_202412_torchtitan.md) are titled "+ torch.compile + Float8
    # + AsyncTP"; their rows' notes shorten it to "compile + Float8"
    return ("compile" in row["run"].lower() or "torch.compile" in notes or "compile=true" in notes
            or "compile + " in notes)


# Compiled torchtitan runs of releases that compiled the blocks only: its train.py kept the loss eager ("TODO: compiling
# loss function causes CUDA errors, turning off for now") until bbb1b616e (2025-04-02, "Compiling the loss function
# with torch.compile"). The 2024 performance tables (docs/performance.md at 3faaa1a0d; benchmarks/
# llama3_h100_202412_torchtitan.md, torchtitan 9dec370), AWS's 2024 SageMaker post and IBM and Meta's float8 + FSDP2 post
# (2024-11-25) ran such releases.
LOSS_LEFT_EAGER = ("3faaa1a0d", "llama3_h100_202412_torchtitan",
                   "AWS Machine Learning Blog 'Efficient Pre-training of Llama 3",
                   "pytorch/ao torchao/float8/README.md",  # torchtitan 0.0.2, run from its 2025-03 preset
                   "Supercharging Training using float8 and FSDP2")  # torchtitan of 2024-11: blocks compiled, not the loss


# torchtitan's performance tables of 2024-04 (docs/performance.md, 395a52627 / 1ea476e9f) ran its presets, whose
# norm_type was "fused_rmsnorm" (train_configs/llama2_13b.toml, llama3_8b.toml at 1ea476e9f) until 3faaa1a0d (2024-08)
# made it "rmsnorm", eager.
FUSED_NORM_RUNS = ("commits 395a52627 and 1ea476e9f",)


def source_names(row: dict, keys) -> bool:
    """Whether the row's source names any of `keys` (a release, a paper, a repository)."""
    return any(key in row["source"] for key in keys)


def not_modelled(row: dict) -> str:
    """Why the planner cannot model this row yet ('' if it can)."""
    if "mla_up_proj" in row["recompute"]:
        return "recompute of MLA's up-projections (Megatron's mla_up_proj): MLA's activations are not modelled"
    if "recipe_name=rowwise" in row["notes"]:
        return "torchao's row-wise FP8 scaling (recipe_name rowwise): the planner prices tensor-wise scaling only"
    return ""


def _depth_unreported(row: dict) -> bool:
    """An interleaved pipeline whose virtual stages per rank the source does not report."""
    return "NR (inte" in row.get("vpp_interleave", "")


def _schedule_unstated(row: dict) -> bool:
    """The row names no schedule ("NR"; "n/a" says the run had no virtual stages: plain 1F1B, as outside_view.py's
    outsider states it)."""
    return row.get("vpp_interleave", "").strip() == "NR"


def _schedule_unreported(row: dict, fw, pp: int) -> bool:
    """A pipeline whose schedule the row does not state, on a stack whose pipelines `estimate` weighs interleaved
    when none is named (Framework.interleave_unnamed): the command line's rule, as for an unreported depth."""
    return pp > 1 and fw.interleave_unnamed and _schedule_unstated(row)


def _complete_unreported(row: dict, job, layout: Layout, sp: bool) -> Layout:
    """`shardwise estimate`'s own choice for what the row leaves unreported (planner/estimate.py complete_layout):
    the interleaving depth, the ZeRO stage, the recompute policy and sequence parallelism, jointly the fastest that
    fits. Used for rows whose interleaving depth or ZeRO stage is not reported, where the memory they leave decides
    the other knobs together."""
    named = {"cp_mode"} | ({"sequence_parallel"} if sp or stated_no_sequence_parallel(row) else set())
    named |= {k for k, cell in (("zero", row["zero_stage"]), ("recompute", row["recompute"]))
              if not cell.strip().startswith("NR")}
    if not (_depth_unreported(row) or _schedule_unstated(row)):  # a schedule the row states
        named |= {"schedule", "vpp"}
    return complete_layout(job, layout, named)[0]


def parse(row: dict, six_profiles: bool = False, as_eager: bool = False) -> Run:
    """The row as the planner's job and layout. `as_eager`: a torch.compile run scored as if eager (without
    --compile), as a checker who passes only the row's layout does (outside_view.py --as-eager)."""
    run = Run(row["run"], row["source"], series=row.get("series", "").strip())
    tput = row["tflops_per_gpu"] + row["mfu_or_peak_pct"]
    run.weak = "?" in tput or "convention not stated" in row["notes"] or row.get("flop_convention", "") == "?"
    weak = re.search(r"Weak: (.+?)\.(?:\s|$)", row["notes"])  # a figure its own source contradicts
    if weak:
        run.weak, run.weak_reason = True, weak.group(1).strip()
    run.skip = not_modelled(row)
    if run.skip:
        return run
    profile = _profile(row)
    run.stand_in = stands_in(row, profile)
    profile = NEAREST_OF_SIX.get(profile, profile) if six_profiles else profile
    model = _moe(row, _model(row))
    seq = _int(row["seq_len"])
    gpus, tp, pp = _int(row["gpus"]), _int(row["tp"]), _int(row["pp"])
    cp = _int(row["cp"]) or 1
    dp = gpus // (tp * pp * cp)
    mb = _int(row["micro_batch"]) or 1  # NR: one sequence per micro-batch
    # README vs yaml disagree: the yaml is what ran; an unreported depth is chosen below (_complete_unreported)
    vpp = 1 if _depth_unreported(row) else _int(row["vpp_interleave"].split(" / ")[-1]) or 1
    recompute_cell = row["recompute"]
    sp = stated_sequence_parallel(row) or "dgxc-benchmarking" in row["source"]
    flash = False if pre_flash(row) else (True if stated_flash(row) else None)
    fw = FRAMEWORKS[profile]
    if fw.sequence_parallel == "always" or (fw.sequence_parallel == "default" and not stated_no_sequence_parallel(row)):
        sp = True
    zero = _zero(row["zero_stage"])
    if profile == "automodel" and pp > 1 and zero == 3:  # its FSDP2 reshards after forward only without PP
        zero = fw.default_zero_with_pp
    if zero not in fw.zero_stages and dp > 1:  # the stack's nearest stage (Llama 3's FSDP without reshard: 2)
        zero = min(fw.zero_stages, key=lambda z: abs(z - zero))
    if dp * cp == 1:  # nothing to shard over: ZeRO-0's step, as plan and estimate report it
        zero = 0
    chunk = max_chunk_layers(model, pp, vpp, seq, fw.stage_split) if pp * vpp <= model.num_layers else 1
    partial = _recompute_layers(recompute_cell, chunk)
    layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch=mb, vpp=vpp, zero=zero,
                    recompute="full" if partial else _recompute(recompute_cell),
                    recompute_layers=partial if partial and partial < chunk else None,
                    sequence_parallel=sp and tp > 1,
                    schedule="interleaved-1f1b" if vpp > 1 or _depth_unreported(row) else "1f1b",
                    ep=_int(row.get("ep", "") or "") or 1, etp=_int(row.get("etp", "") or "") or 1,
                    dp_shard=_dp_shard(row["zero_stage"], dp, tp * cp) if zero != 1 or fw.zero1_shard_group else 0,
                    cp_mode="allgather" if cp > 1 and "CP uses all-gather" in row["notes"] else "ring")
    batch = _batch(row["global_batch_seqs"], dp, mb)
    notes = row["notes"].lower()
    overlap = stated_tp_comm_overlap(row)
    if overlap and tp > 1 and fw.tp_comm_overlap_available:  # TP comm overlap needs sequence parallelism
        layout = layout.with_(sequence_parallel=True)
    else:
        overlap = None if not fw.tp_comm_overlap_available else overlap
    fused_norms = source_names(row, FUSED_NORM_RUNS)
    # compiled as the run was, or as the command line compiles a stack by default (torchao's Float8, unflagged)
    compiled = (ran_compiled(row) and not as_eager) or fw.compiles_by_default(_precision(row), fused_norms)
    try:
        # FP8 parameters (NeMo's FP8_PARAMS / fp8_params): weights stored and gathered in FP8, one byte each.
        cluster = replace(_cluster(row["gpu_type"]), num_gpus=layout.world_size)  # as `--gpus` sets it
        job = make_job(model, cluster, batch, seq, profile, flash_attention=flash,
                       tp_comm_overlap=overlap, precision=_precision(row), fp8_params=stated_fp8_params(row),
                       compile=compiled, compile_loss=False if compiled and source_names(row, LOSS_LEFT_EAGER) else None,
                       fused_norms=fused_norms)
        if model.is_moe:  # how the stack moved tokens, as the row says; Megatron runs MoE under TP with SP only
            modules = re.findall(r"[a-z_]+", recompute_cell.lower()) if _recompute(recompute_cell) == "selective" else []
            # Megatron's --recompute-modules; the ModelZoo's tables write "norm, act" for "moe_act layernorm"
            # (best_practice/qwen3/run_h100_235b.sh)
            named = tuple(dict.fromkeys({"norm": "layernorm", "act": "moe_act"}.get(m, m) for m in modules
                                        if m in ("norm", "act", "layernorm", "moe_act", "moe", "core_attn")))
            job = replace(job, moe_dispatcher="deepep" if "deepep" in notes else "alltoall",
                          ep_comm_overlap="all-to-all overlapped" in notes, recompute_modules=named,
                          moe_recompute="moe" if "moe" in named else ("act" if "moe_act" in named else ""),
                          moe_routing="contiguous" if "fakebalancedgate" in notes else "random")
            runs = re.search(r"\bga (\d+)", notes) if profile == "automodel" else None
            if runs:  # AutoModel runs one pipeline schedule per local batch (its GA)
                job = replace(job, schedule_runs=int(runs.group(1)))
            layout = layout.with_(sequence_parallel=tp > 1)
        if "NVTE_FUSED_ATTN=0" in row["notes"]:  # Transformer Engine told off cuDNN: flash-attn's FlashAttention-2
            job = replace(job, attention="fa2")
        validate_layout(layout, model, batch, edge_chunks=fw.edge_chunks)
    except UsageError as exc:
        run.skip = f"not a valid layout here: {exc}"
        return run
    refusal = fw.refusal(layout, model.num_layers)
    if refusal:
        run.skip = f"{profile} profile: {refusal}"
        return run
    # Not reported: the interleaving depth, or the ZeRO stage: `shardwise estimate`'s own choice for what it is not
    # told (the stack's default stage up, the fastest that fits), as the command line makes it.
    if (_depth_unreported(row) or _schedule_unreported(row, fw, layout.pp)
            or (row["zero_stage"].strip().startswith("NR") and dp > 1)):
        layout = _complete_unreported(row, job, layout, layout.sequence_parallel)
    elif recompute_cell.strip().startswith("NR"):  # the cheapest recompute the stack fits the layout with
        layout = next((layout.with_(recompute=r) for r in fw.recompute if estimate(job, layout.with_(recompute=r)).fits),
                      layout)
        if layout.recompute == "full":  # only every layer fits? maybe fewer do (estimate's rule: the cheapest that fits)
            layout = fewest_recomputed(job, layout) or layout
    run.framework, run.job, run.layout = profile, job, layout
    run.published_step_s = published_step_time(row, job, gpus)
    if run.published_step_s is None:
        run.skip = "no throughput reported"
    return run


def read_rows(path: Path) -> list[dict]:
    """The CSV's rows as dicts of their cells."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def load_runs(path: Path, six_profiles: bool = False) -> list[Run]:
    return [parse(row, six_profiles) for row in read_rows(path)]


def source_key(run: Run) -> str:
    """A source: the paper ("Author et al. YEAR") or repository ("owner/name") the row comes from — the unit
    of leave-one-source-out."""
    text = run.source.strip()
    paper = re.match(r"(.+? et al\.? \d{4})", text)
    if paper:
        return paper.group(1)
    first = text.split()[0] if text else ""
    return first if "/" in first else re.split(r"[,;(]", text)[0].strip()[:40]


GRID = [0.6 + 0.025 * i for i in range(17)]  # candidate in-situ efficiencies (kernels.IN_SITU_EFFICIENCY)


def _predict(run: Run, factor: float | None = None, moe: tuple[float, float] | None = None):
    """The estimate of a run, with the in-situ efficiency of its GPU architecture set to `factor` and, for a MoE
    run, its two fitted constants (planner/moe.py MOE_LAYER_OVERHEAD_S, MOE_LAYER_HOST_S) set to `moe`."""
    arch = kernels.situ_key(run.job.cluster.arch, run.job.precision)
    saved, saved_moe = dict(kernels.IN_SITU_EFFICIENCY), (moe_terms.MOE_LAYER_OVERHEAD_S, moe_terms.MOE_LAYER_HOST_S)
    if factor is not None:
        kernels.IN_SITU_EFFICIENCY[arch] = factor
    if moe is not None:
        moe_terms.MOE_LAYER_OVERHEAD_S, moe_terms.MOE_LAYER_HOST_S = moe
    try:
        return estimate(run.job, run.layout)
    finally:
        kernels.IN_SITU_EFFICIENCY.clear()
        kernels.IN_SITU_EFFICIENCY.update(saved)
        moe_terms.MOE_LAYER_OVERHEAD_S, moe_terms.MOE_LAYER_HOST_S = saved_moe


# Candidate values of the MoE rows' two constants (seconds): a MoE layer's fixed cost per micro-batch, and the host
# time below which its pass does not go (none, or 7-11.5 ms). Every strong MoE row is estimated at each pair (an
# estimate takes ~0.5 ms).
MOE_GRID = [(0.2e-3 * i, h) for i in range(13) for h in [0.0] + [0.5e-3 * j for j in range(14, 24)]]
MOE_CONSTANTS = ("MOE_LAYER_OVERHEAD_S", "MOE_LAYER_HOST_S")


def _log_error(entry: dict, factor: float, grid: list[float] = GRID) -> float:
    """log(published / predicted step) at `factor`, interpolated on the grid (the step is smooth in it)."""
    return _log_errors([entry], [[math.log(step) for step in entry["grid"]]], factor, grid)[0]


def _log_errors(entries: list[dict], logs: list[list[float]], factor: float, grid: list[float]) -> list[float]:
    """_log_error of each entry at one factor, given the logs of each entry's grid of steps (a fit's bisection
    asks for every entry at ~40 factors)."""
    i = min(max(int((factor - grid[0]) / (grid[1] - grid[0])), 0), len(grid) - 2)
    w = (factor - grid[i]) / (grid[1] - grid[0])
    return [math.log(e["published"] / math.exp((1 - w) * lg[i] + w * lg[i + 1])) for e, lg in zip(entries, logs)]


def source_weighted_median(values: list[float], sources: list[str]) -> float:
    """The median of `values` with each source weighing the same whatever its number of rows (a row weighs one over
    its source's rows): a constant meant to hold on sources not yet seen is not set by the source with most rows."""
    return _weighted_median(values, _source_weights(sources))


def _source_weights(sources: list[str]) -> list[float]:
    count = collections.Counter(sources)
    return [1 / count[s] for s in sources]


def _weighted_median(values: list[float], weights: list[float]) -> float:
    pairs = sorted(zip(values, weights))
    half, run = sum(w for _, w in pairs) / 2, 0.0
    for i, (v, w) in enumerate(pairs):
        run += w
        if run > half + 1e-12:
            return v
        if abs(run - half) <= 1e-12:  # exactly half: between this value and the next, as statistics.median
            return (v + pairs[i + 1][0]) / 2
    return pairs[-1][0]


def _zero_median(entries: list[dict], grid: list[float], rising: bool) -> float:
    """The grid value at which the source-weighted median log error of `entries` is zero (bisection; `rising`: the
    error grows with the value — a higher efficiency shortens the predicted step — else it falls)."""
    lo, hi = grid[0], grid[-1]
    weights = _source_weights([e["source"] for e in entries])
    logs = [[math.log(step) for step in e["grid"]] for e in entries]
    for _ in range(40):
        mid = (lo + hi) / 2
        if (_weighted_median(_log_errors(entries, logs, mid, grid), weights) > 0) == rising:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def fit_in_situ(entries: list[dict]) -> dict[str, float]:
    """Per GPU architecture, the in-situ efficiency that makes the source-weighted median log error of `entries`
    zero (each source weighs the same: source_weighted_median)."""
    return {arch: round(_zero_median([e for e in entries if e["arch"] == arch], GRID, True), 3)
            for arch in sorted({e["arch"] for e in entries})}


def fit_moe(entries: list[dict]) -> tuple[float, float]:
    """The pair of MoE constants on MOE_GRID with the smallest median |log error| over `entries` (the smaller pair
    on a tie)."""
    def cost(i: int) -> tuple[float, float]:
        return statistics.median(abs(math.log(e["published"] / e["grid"][i])) for e in entries), sum(MOE_GRID[i])
    return MOE_GRID[min(range(len(MOE_GRID)), key=cost)]


def compare(path: Path, six_profiles: bool = False, workers: int | None = None) -> tuple[list[dict], dict]:
    """Every row scored with the shipped constants; the in-situ efficiency refitted on all strong rows and,
    for leave-one-source-out figures, on all rows but each source's. The rows are scored over `workers` forked
    processes (None: one per core where it pays, forked.worker_count); the answer is the one process's."""
    runs = load_runs(path, six_profiles)
    costs = [_estimates(run) for run in runs]
    scored = map_pieces(_score, runs, costs, worker_count(workers, sum(costs), PARALLEL_ESTIMATES))
    rows = [row for kind, row, _ in scored if kind != "moe"]
    entries = [entry for kind, _, entry in scored if entry is not None]
    summary = summarize(rows, entries)
    summary["moe"] = moe_summary([row for kind, row, _ in scored if kind == "moe"])
    return rows, summary


# Dense estimates' worth of work (about 0.9 ms each on one core) above which compare forks: the set is ~20,000.
PARALLEL_ESTIMATES = 2000
MOE_ESTIMATE = 1.8  # a MoE run's estimate costs 1.8 dense ones (1.6 against 0.9 ms, measured over the set)


def _estimates(run: Run) -> float:
    """The estimates _score makes of a run, in dense estimates' worth (its share of compare's work)."""
    if run.skip:
        return 0
    if run.job.model.is_moe:
        return MOE_ESTIMATE * (1 + (0 if run.weak else len(MOE_GRID)))
    return 1 + (0 if run.weak else len(GRID))


def _score(run: Run) -> tuple[str, dict, dict | None]:
    """One run as compare keeps it: (kind, row, the strong dense row's refit entry or None); kind is "skip", "moe"
    (scored apart, moe_summary: not in the dense figures, their own fitted constants) or "dense"."""
    if run.skip:
        return "skip", {"run": run.name, "skip": run.skip, "source": source_key(run)}, None
    if run.job.model.is_moe:
        return "moe", _moe_row(run), None
    est = _predict(run)
    err = run.published_step_s / est.step_time - 1
    row = {"run": run.name, "source": source_key(run), "framework": run.framework, "series": run.series,
           "layout": run.layout.describe(), "gpus": est.gpus,
           "arch": kernels.situ_key(run.job.cluster.arch, run.job.precision),
           "published_step_s": round(run.published_step_s, 4), "predicted_step_s": round(est.step_time, 4),
           "error": round(err, 4), "fits": est.fits, "weak": run.weak, "weak_reason": run.weak_reason,
           "stand_in": run.stand_in, "mfu": round(est.mfu, 4),
           "published_tokens_per_s_per_gpu": round(run.job.train.global_batch * run.job.train.seq_len
                                                   / run.published_step_s / est.gpus, 1),
           "predicted_tokens_per_s_per_gpu": round(est.tokens_per_s / est.gpus, 1)}
    if run.weak:
        return "dense", row, None
    return "dense", row, {"row": row, "arch": row["arch"], "source": row["source"], "published": run.published_step_s,
                          "grid": [_predict(run, f).step_time for f in GRID]}


def _moe_row(run: Run) -> dict:
    est = _predict(run)
    grid = [] if run.weak else [_predict(run, moe=pair).step_time for pair in MOE_GRID]
    return {"grid": grid, "published": run.published_step_s, "run": run.name, "source": source_key(run),
            "framework": run.framework, "series": run.series, "moe": True, "stand_in": run.stand_in,
            "arch": kernels.situ_key(run.job.cluster.arch, run.job.precision),
            "layout": run.layout.describe(), "published_step_s": round(run.published_step_s, 4),
            "predicted_step_s": round(est.step_time, 4), "error": round(run.published_step_s / est.step_time - 1, 4),
            "fits": est.fits, "weak": run.weak, "weak_reason": run.weak_reason, "time_breakdown_s": {k: round(v, 3) for k, v in est.time_s.items()},
            "published_tokens_per_s_per_gpu": round(run.job.train.global_batch * run.job.train.seq_len
                                                    / run.published_step_s / est.gpus, 1),
            "predicted_tokens_per_s_per_gpu": round(est.tokens_per_s / est.gpus, 1)}


def moe_summary(rows: list[dict]) -> dict:
    """The mixture-of-experts rows (planner/moe.py, shipped constants): median and max |error| over the strong
    rows, per source, which do not fit, and Kendall tau of their one-knob series. Two constants come from these
    runs, a MoE layer's fixed cost per micro-batch and the host time below which its pass does not go
    (moe.MOE_LAYER_OVERHEAD_S, MOE_LAYER_HOST_S): refitted on all strong rows, and for each source on the others,
    that source's rows scored with them (leave one source out)."""
    strong = [r for r in rows if not r["weak"]]
    errors = [abs(r["error"]) for r in strong]
    by_source, loso = {}, []
    for src in sorted({r["source"] for r in strong}):
        errs = [abs(r["error"]) for r in strong if r["source"] == src]
        by_source[src] = {"rows": len(errs), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs)}
        others = [r for r in strong if r["source"] != src]
        if not others:  # a set of one source (--csv): nothing to fit the constants on without it
            continue
        without = fit_moe(others)
        held = [abs(r["published"] / r["grid"][MOE_GRID.index(without)] - 1) for r in strong if r["source"] == src]
        loso += held
        by_source[src] |= {"moe_constants_fitted_without_s": dict(zip(MOE_CONSTANTS, without)),
                           "leave_one_source_out_median_abs_error": statistics.median(held),
                           "leave_one_source_out_max_abs_error": max(held)}
    series = {}
    for name in sorted({r["series"] for r in strong if r["series"]}):
        members = [r for r in strong if r["series"] == name]
        if len(members) >= 2:
            series[name] = {"rows": len(members), "kendall_tau": kendall_tau([r["published_tokens_per_s_per_gpu"] for r in members],
                                                                             [r["predicted_tokens_per_s_per_gpu"] for r in members])}
    fitted = fit_moe(strong) if strong else None
    for r in rows:
        del r["grid"], r["published"]
    shipped = (moe_terms.MOE_LAYER_OVERHEAD_S, moe_terms.MOE_LAYER_HOST_S)
    return {"rows": len(strong), "median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None, "by_source": by_source,
            "moe_constants_s": {"shipped": dict(zip(MOE_CONSTANTS, shipped)),
                                "fitted_on_all_rows": dict(zip(MOE_CONSTANTS, fitted)) if fitted else None},
            "leave_one_source_out": {"median_abs_error": statistics.median(loso) if loso else None,
                                     "max_abs_error": max(loso) if loso else None},
            "not_fitting": [r["run"] for r in strong if not r["fits"]], "kendall_tau_by_series": series, "runs": rows}


def summarize(rows: list[dict], entries: list[dict]) -> dict:
    strong = [r for r in rows if "error" in r and not r["weak"]]
    errors = [abs(r["error"]) for r in strong]
    fitted = fit_in_situ(entries) if entries else {}
    # Leave one source out: each source's rows scored with the efficiency fitted on the other sources.
    loso_errors, by_source = [], {}
    for src in sorted({e["source"] for e in entries}):
        others = [e for e in entries if e["source"] != src]
        factors = fit_in_situ(others)
        errs = []
        for e in entries:
            if e["source"] == src:
                f = factors.get(e["arch"], kernels.IN_SITU_EFFICIENCY.get(e["arch"], 1.0))
                errs.append(abs(math.exp(_log_error(e, f)) - 1))
        loso_errors += errs
        by_source[src] = {"rows": len(errs), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs),
                          "fitted_without": factors}
    series = {}
    for name in sorted({r["series"] for r in strong if r["series"]}):
        members = [r for r in strong if r["series"] == name]
        if len(members) >= 2:
            pub = [r["published_tokens_per_s_per_gpu"] for r in members]
            pred = [r["predicted_tokens_per_s_per_gpu"] for r in members]
            series[name] = {"rows": len(members), "kendall_tau": kendall_tau(pub, pred),
                            "widest_discordant_gap": widest_discordant_gap(pub, pred)}
    return {"rows": len(strong), "skipped": sum("skip" in r for r in rows),
            "median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
            "all_fit": all(r["fits"] for r in strong),
            "not_fitting": [r["run"] for r in strong if not r["fits"]],
            "in_situ_efficiency": {"shipped": dict(kernels.IN_SITU_EFFICIENCY), "fitted_on_all_rows": fitted},
            "leave_one_source_out": {"median_abs_error": statistics.median(loso_errors) if loso_errors else None,
                                     "max_abs_error": max(loso_errors) if loso_errors else None,
                                     "by_source": by_source},
            "kendall_tau_by_series": series,
            "min_kendall_tau": min((v["kendall_tau"] for v in series.values()), default=None)}


def _by_stack(rows: list[dict]) -> dict:
    """The strong rows' errors by the stack that ran them and GPU: rows, median |error|, signed median, max |error|
    (a row scored under a stand-in profile, stands_in, is no stack's record)."""
    groups: dict = {}
    for r in rows:
        if "error" in r and not r["weak"] and not r["stand_in"]:
            groups.setdefault(r["framework"], {}).setdefault(r["arch"], []).append(r["error"])
    return {fw: {arch: {"rows": len(errs), "median_abs_error": round(statistics.median(map(abs, errs)), 4),
                        "signed_median_error": round(statistics.median(errs), 4),
                        "max_abs_error": round(max(map(abs, errs)), 4)}
                 for arch, errs in sorted(archs.items())}
            for fw, archs in sorted(groups.items())}


def check_table(rows: list[dict], moe_runs: list[dict]) -> dict:
    """The strong dense rows' and MoE rows' errors by stack and GPU (planner/published_check.py reads it): what
    `explain` and `estimate --json` say of a prediction's record."""
    by_stack, moe_by_stack = _by_stack(rows), _by_stack(moe_runs)
    return {"source": "python benchmarks/published_runs.py --write-check: strong rows, the shipped constants",
            "rows": _count(by_stack), "by_stack": by_stack, "moe_rows": _count(moe_by_stack),
            "moe_by_stack": moe_by_stack}


def _count(table: dict) -> int:
    return sum(v["rows"] for archs in table.values() for v in archs.values())


def discordant_note(gap: float | None) -> str:
    """What the per-series line adds after tau when the prediction orders some pair the other way: how far apart the
    source's own figures for those pairs are (stats.widest_discordant_gap), so a tau lowered by near-ties reads as such."""
    return "" if gap is None else f"  (pairs ranked the other way: published at most {gap:.1%} apart)"


def markdown(rows: list[dict], s: dict) -> str:
    """Per source: rows, frameworks, plain and leave-one-source-out median / max |error|, fit."""
    lines = ["| source | rows | framework | median abs. error | max abs. error | leave-one-source-out median / max | all fit |",
             "|---|---|---|---|---|---|---|"]
    strong = [r for r in rows if "error" in r and not r["weak"]]
    for src, v in s["leave_one_source_out"]["by_source"].items():
        mine = [r for r in strong if r["source"] == src]
        errs = [abs(r["error"]) for r in mine]
        fws = ", ".join(sorted({r["framework"] for r in mine}))
        fit = "yes" if all(r["fits"] for r in mine) else f"{sum(r['fits'] for r in mine)} of {len(mine)}"
        lines.append(f"| {src} | {len(mine)} | {fws} | {statistics.median(errs):.1%} | {max(errs):.1%} | "
                     f"{v['median_abs_error']:.1%} / {v['max_abs_error']:.1%} | {fit} |")
    lo = s["leave_one_source_out"]
    fit = "yes" if s["all_fit"] else f"{s['rows'] - len(s['not_fitting'])} of {s['rows']}"
    lines.append(f"| **all** | **{s['rows']}** | | **{s['median_abs_error']:.1%}** | **{s['max_abs_error']:.1%}** | "
                 f"**{lo['median_abs_error']:.1%} / {lo['max_abs_error']:.1%}** | {fit} |")
    return "\n".join(lines).replace("%", " %")


def _weak_mark(r: dict) -> str:
    """A weak row's mark in the table: the reason its notes give ('Weak: ...'), else the uncertain cell's."""
    if r.get("weak_reason"):
        return f" (weak, not in summary: {r['weak_reason']})"
    return " (weak: not in summary)" if r["weak"] else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV, help="published_runs.csv")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--markdown", action="store_true", help="print the per-source summary table (README, docs)")
    ap.add_argument("--six-profiles", action="store_true",
                    help="score every row under one of " + ", ".join(SIX_PROFILES) + " (each other profile under its "
                         "nearest: composer, llama2/3 and automodel under torchtitan, deepspeed-2024/-bf16 under deepspeed)")
    ap.add_argument("--write-check", action="store_true",
                    help="write src/shardwise/planner/published_check.json (each stack's record on each GPU, which "
                         "explain and estimate --json report)")
    ap.add_argument("--measured-fabric", action="store_true",
                    help="what-if: every row's network at what a measured 400G InfiniBand cluster delivers "
                         "(explain.MEASURED_FABRIC: a share of the line rate and an extra time per network crossing)")
    args = ap.parse_args(argv)
    if not args.csv.is_file():
        print(f"published_runs.py: {args.csv} not found — pass --csv PATH", file=sys.stderr)
        return 2
    if args.write_check and (args.measured_fabric or args.six_profiles or args.csv.resolve() != DEFAULT_CSV):
        print("published_runs.py: --write-check records the shipped set as shipped — drop --csv, --six-profiles and "
              "--measured-fabric", file=sys.stderr)
        return 2
    if args.measured_fabric:
        global MEASURED_FABRIC
        from shardwise.planner.explain import MEASURED_FABRIC as measured
        MEASURED_FABRIC = measured
    rows, summary = compare(args.csv, args.six_profiles)
    if args.write_check:
        from shardwise.planner.published_check import PATH

        PATH.write_text(json.dumps(check_table(rows, summary["moe"]["runs"]), indent=1) + "\n")
        print(f"wrote {PATH}")
        return 0
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=2))
        return 0
    if args.markdown:
        print(markdown(rows, summary))
        return 0
    print(f"{'run':56} {'framework':14} {'layout':20} {'publ s':>8} {'pred s':>8} {'error':>7} fits")
    for r in rows:
        if "skip" in r:
            print(f"{r['run'][:56]:56} skipped: {r['skip']}")
            continue
        print(f"{r['run'][:56]:56} {r['framework']:14} {r['layout']:20} {r['published_step_s']:8.3f} "
              f"{r['predicted_step_s']:8.3f} {r['error']:+7.1%} {'yes' if r['fits'] else 'NO'}{_weak_mark(r)}")
    s = summary
    eff = s["in_situ_efficiency"]
    if not s["rows"]:  # a scratch CSV of rows all kept out of the summary (or all skipped): nothing to sum up
        print(f"\n0 rows ({s['skipped']} skipped): no row in the summary")
        return 0
    print(f"\n{s['rows']} rows ({s['skipped']} skipped): median |error| {s['median_abs_error']:.1%}, "
          f"max |error| {s['max_abs_error']:.1%}, every published layout fits: {s['all_fit']}"
          + (f" (not: {', '.join(s['not_fitting'])})" if s["not_fitting"] else ""))
    print(f"one constant comes from training runs, the in-situ efficiency per GPU architecture: shipped {eff['shipped']}, "
          f"fitted on all rows {eff['fitted_on_all_rows']}")
    lo = s["leave_one_source_out"]
    print(f"leave-one-source-out (each source scored with it fitted without that source): median {lo['median_abs_error']:.1%}, "
          f"max {lo['max_abs_error']:.1%}")
    for src, v in lo["by_source"].items():
        print(f"  {src[:60]:60} {v['rows']:3} rows  median {v['median_abs_error']:6.1%}  max {v['max_abs_error']:6.1%}"
              f"  (fitted without: {v['fitted_without']})")
    if s["kendall_tau_by_series"]:
        print("Kendall tau per one-knob series (published vs predicted tokens/s per GPU):")
        for name, v in s["kendall_tau_by_series"].items():
            print(f"  {name:45} {v['rows']:2} rows  tau {v['kendall_tau']:+.2f}{discordant_note(v['widest_discordant_gap'])}")
    moe = s["moe"]
    if moe["rows"]:
        print("\nmixture of experts (planner/moe.py; scored apart, two constants fitted on them, below):")
        for r in moe["runs"]:
            print(f"{r['run'][:56]:56} {r['framework']:14} {r['layout'][:24]:24} {r['published_step_s']:8.3f} "
                  f"{r['predicted_step_s']:8.3f} {r['error']:+7.1%} {'yes' if r['fits'] else 'NO'}{_weak_mark(r)}")
        print(f"{moe['rows']} mixture-of-experts rows, median "
              f"|error| {moe['median_abs_error']:.1%}, max {moe['max_abs_error']:.1%}"
              + (f"; predicted not to fit: {', '.join(moe['not_fitting'])}" if moe["not_fitting"] else ""))
        o, lo = moe["moe_constants_s"], moe["leave_one_source_out"]
        ms = lambda d: f"{d['MOE_LAYER_OVERHEAD_S'] * 1e3:.1f} + host {d['MOE_LAYER_HOST_S'] * 1e3:.1f} ms"  # noqa: E731
        print(f"two constants come from these runs, a MoE layer's fixed cost per micro-batch and the host time below which "
              f"its pass does not go: shipped {ms(o['shipped'])}, fitted on all rows {ms(o['fitted_on_all_rows'])}; "
              + (f"leave-one-source-out (each source scored with them fitted without that source): median "
                 f"{lo['median_abs_error']:.1%}, max {lo['max_abs_error']:.1%}" if lo["median_abs_error"] is not None
                 else "no leave-one-source-out figure: the rows come from one source"))
        for src, v in moe["by_source"].items():
            print(f"  {src[:50]:50} {v['rows']:3} rows  median {v['median_abs_error']:6.1%}  max {v['max_abs_error']:6.1%}"
                  + (f"  (without it: {ms(v['moe_constants_fitted_without_s'])}, median "
                     f"{v['leave_one_source_out_median_abs_error']:6.1%}, max {v['leave_one_source_out_max_abs_error']:6.1%})"
                     if "moe_constants_fitted_without_s" in v else ""))
        for name, v in moe["kendall_tau_by_series"].items():
            print(f"  series {name:38} {v['rows']:2} rows  tau {v['kendall_tau']:+.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
