"""One transformer layer's time for one micro-batch on one GPU (seconds), by term.

Every GEMM timed from its own shape after the TP split (planner/kernels.py: tiles and waves over the SMs,
memory-bound small GEMMs, kernel launches); the attention core by the kernel the framework runs
(FlashAttention-2/3 and cuDNN curves, context-parallel ring or all-gather steps, or a materialised
softmax); element-wise traffic at HBM bandwidth; TP and CP collectives by NCCL's model (planner/comm.py),
exposed unless the framework overlaps them with the GEMMs beside them; a MoE layer's experts, dispatch and
host floor (planner/moe.py). On a calibrated cluster (`shardwise calibrate`) the measured rates replace the
datasheet models. planner/step_time.py assembles these into stages, the pipeline and the step.
Constants and their sources: docs/planner.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import NamedTuple

from shardwise.frozen import replaced
from shardwise.planner import kernels, moe
from shardwise.planner.comm import (collective_time, one_node, overlaps, p2p_sync_time, sync_time, tp_call_time,
                                    tp_sync_time)
from shardwise.planner.frameworks import get as get_framework
from shardwise.planner.job import Job, per_rank_job
from shardwise.planner.memory import cp_kv_blocks, cp_math_blocks, local_seq, residual_bytes, torch_dkv_ring
from shardwise.planner.overlap import fp8_gathered, interference
from shardwise.specs import Layout, ModelSpec

# With TP communication overlap (Transformer Engine userbuffers, NeMo's ub_tp_comm_overlap) each TP
# collective is split into chunks pipelined with the GEMM that produces or consumes it: the first chunk
# (1/TP_OVERLAP_SPLITS of it) is never hidden, and no more than the GEMM's time can hide the rest.
# NeMo's ub_tp_comm_overlap_cfg uses num_splits 4 (dgxc-benchmarking gpt3_175b_hydra.yaml).
TP_OVERLAP_SPLITS = 4
# Calibrated clusters only (their rate was measured with this weighting, calibrate/compute.py): a fused
# attention core counts 1/FLASH_EFFICIENCY of its FLOPs; element-wise passes as below.
FLASH_EFFICIENCY = 0.8
CALIBRATED_PASSES = (10, 3)  # element-wise h-wide and f-wide activation passes per token and layer
SCORE_PASSES = 8  # materialised softmax passes over the scores (calibrated path)


@lru_cache(maxsize=256)
def matmul_params_per_layer(model: ModelSpec) -> float:
    """Weights one token multiplies in one layer (mean over layers): a MoE layer counts its active
    parameters (top-k experts, router, shared expert); MLA its projections."""
    h, f = model.hidden, model.ffn_hidden
    if model.is_moe or model.attention != "gqa":
        norms = 2 * h
        return sum(model.layer_params(i, active=True) for i in range(model.num_layers)) / model.num_layers - norms
    return h * model.q_dim + 2 * h * model.kv_dim + model.q_dim * h + (3 if model.gated_mlp else 2) * h * f


def achievable_flops(job: Job) -> float:
    """The calibrated rate of the model's layers (`model_tflops`), else of its GEMMs, else the GPU's
    maximum achievable matmul rate (a large well-quantized GEMM)."""
    measured = job.cluster.measured or {}
    rate = measured.get("model_tflops") or measured.get("matmul_tflops")
    if rate:
        return float(rate) * 1e12
    return kernels.matmul_rate(job.cluster)


def calibrated(job: Job) -> bool:
    measured = job.cluster.measured or {}
    return bool(measured.get("model_tflops") or measured.get("matmul_tflops"))


@dataclass(frozen=True)
class LayerCost:
    """One layer, one micro-batch, one GPU (seconds)."""

    fwd: float  # forward compute: GEMMs, attention core, element-wise
    bwd_in: float  # input-gradient half of the backward
    bwd_w: float  # weight-gradient GEMMs
    attn_fwd: float  # the attention core's forward (what selective recompute runs again)
    tp_fwd: float  # exposed TP communication, forward
    tp_bwd: float
    overhead: float  # calibrated fixed cost of a layer (all passes)
    cp_fwd: float = 0.0  # exposed context-parallel K/V traffic, forward (cp_layer_comm)
    cp_bwd: float = 0.0
    op_recompute: float = 0.0  # what op-level selective checkpointing runs again (torchtitan's "selective")
    op_recompute_flops: float = 0.0
    ep_fwd: float = 0.0  # a MoE layer's all-to-alls (and etp traffic), forward
    ep_bwd: float = 0.0
    ffn_fwd: float = 0.0  # the FFN's forward GEMMs (what recomputing a MoE FFN runs again, with its dispatch)
    ep_alone: float = 0.0  # a MoE layer's all-to-alls of one pass not paired with another's (EP overlap's warm-up)
    fwd_tail: float = 0.0  # a dense layer's last forward GEMM (FC2), which a recompute that stops early skips
    tp_regather: float = 0.0  # the part of tp_bwd that gathers SP's kept shards again (step_time drops it where kept whole)
    ep_counts: float = 0.0  # a MoE layer's token-count exchanges (inside ep_fwd; no overlap hides them)
    host_floor: float = 0.0  # seconds a layer takes a micro-batch at least, its host issuing it (0: the GPU's work); `paced`

    def mix(self, other: "LayerCost", share: float) -> "LayerCost":
        """The mean of a rank's layers when `share` of them cost `other` (MoE layers among dense ones)."""
        names = [f.name for f in fields(self)]  # not astuple: it deep-copies, and the search calls this often
        return LayerCost(*((1 - share) * getattr(self, n) + share * getattr(other, n) for n in names))


# A GELU run in its GEMM's cuBLASLt epilogue (Framework.gelu_epilogue; CUBLASLT_EPILOGUE_GELU_AUX_BIAS): the forward
# GEMM writes the pre-activation beside its output for the backward (2 B per f-element), and the backward's dgrad GEMM
# reads it in its DGELU epilogue (kernels.elementwise_time's backward, twice the forward's bytes, counts 4).
GELU_EPILOGUE_BYTES = 2


def layer_matmuls(model: ModelSpec, tp: int) -> list[tuple[int, int]]:
    """(N, K) of each matmul of one layer after the TP split, in an eager Llama block's call order (wq, wk, wv,
    wo, w1, [w3,] w2), the order torchtitan's op-level checkpointing counts them in."""
    h, f, q, kv = model.hidden, model.ffn_hidden, model.q_dim, model.kv_dim
    mlp = [(f // tp, h), (f // tp, h), (h, f // tp)] if model.gated_mlp else [(f // tp, h), (h, f // tp)]
    return [(q // tp, h), (kv // tp, h), (kv // tp, h), (h, q // tp)] + mlp


def layer_gemms(model: ModelSpec, tokens: int, tp: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of a layer's forward GEMMs after the TP split: QKV, output projection, FC1 (gate and
    up fused), FC2. Under sequence parallelism they see all `tokens` (after the all-gather)."""
    h, f, q, kv = model.hidden, model.ffn_hidden, model.q_dim, model.kv_dim
    return [(tokens, (q + 2 * kv) // tp, h), (tokens, h, q // tp),
            (tokens, (2 if model.gated_mlp else 1) * f // tp, h), (tokens, h, f // tp)]


def fc2_flops(model: ModelSpec, tokens: float, tp: int) -> float:
    """Forward FLOPs of a dense layer's last GEMM (FC2), the one a recompute that stops early does not run again."""
    return 2 * math.prod(layer_gemms(model, tokens, tp)[-1])


def mla_gemms(model: ModelSpec, tokens: int, tp: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of DeepSeek's multi-head latent attention projections, forward, after the TP split: the
    low-rank query and key/value down-projections (whole on every tp rank: Megatron-Core's MLA builds them
    "duplicated"), their up-projections (column-parallel) and the output projection (row-parallel), with the
    shapes `ModelSpec.layer_params` counts; the output projection last."""
    h, heads = model.hidden, model.num_heads // tp
    qk, rope = model.qk_nope_head_dim + model.qk_rope_head_dim, model.qk_rope_head_dim
    q = [(tokens, model.q_lora_rank, h), (tokens, heads * qk, model.q_lora_rank)] if model.q_lora_rank \
        else [(tokens, heads * qk, h)]
    kv = [(tokens, model.kv_lora_rank + rope, h), (tokens, heads * (model.qk_nope_head_dim + model.v_head_dim), model.kv_lora_rank)]
    return q + kv + [(tokens, h, heads * model.v_head_dim)]


def layer_cost(job: Job, layout: Layout, moe_layer: bool = False) -> LayerCost:
    """One layer's costs (a dense one, or a MoE layer's), cached per `layer_key`."""
    job = per_rank_job(job, layout.tp)
    return _layer_cost(job, layer_key(layout, moe_layer), moe_layer, *cache_key(job))


def layer_key(layout: Layout, moe_layer: bool = False) -> Layout:
    """What of a layout a layer's costs depend on: tp, SP, cp and its mode, the micro-batch and, for a MoE layer,
    the expert split (every other knob at its default)."""
    return Layout(tp=layout.tp, micro_batch=layout.micro_batch, sequence_parallel=layout.sequence_parallel,
                  cp=layout.cp, cp_mode=layout.cp_mode, ep=layout.ep if moe_layer else 1, etp=layout.etp if moe_layer else 1)


def cache_key(job: Job) -> tuple:
    """What the cached costs (a layer's here, a stage's in step_time) depend on beyond the (hashable) job:
    ClusterSpec's `measured` tables are left out of its hash and equality, and the in-situ efficiency is a module
    constant."""
    return ((kernels.in_situ(job.cluster), kernels.in_situ(job.cluster, "fp8"), moe.MOE_LAYER_OVERHEAD_S,
             moe.MOE_LAYER_HOST_S),
            repr(job.cluster.measured))


@lru_cache(maxsize=4096)
def _layer_cost(job: Job, layout: Layout, moe_layer: bool, in_situ: float, measured: str) -> LayerCost:
    c = job.cluster
    tokens = layout.micro_batch * local_seq(job, layout)
    oh = float((c.measured or {}).get("layer_overhead_s", 0.0))
    if calibrated(job):
        fwd, bwd_in, bwd_w, attn, gemms = _calibrated_layer(job, layout, tokens)
        attn_b, el_f, redo = 2 * attn, 0.0, 0.0
        tail = fc2_flops(job.model, tokens, layout.tp) / achievable_flops(job)  # the forward's FC2, at the fitted rate
    else:
        fwd, bwd_in, bwd_w, attn, attn_b, gemms, el_f, redo = _datasheet_layer(job, layout, tokens, moe_layer)
        tail = gemms[-1][0]  # the forward's FC2 (layer_gemms' order)
    own = cp_attention_work(c.measured, layout)  # forward a third (recomputed with the attention), backward the rest
    fwd, attn, bwd_in = fwd + own / 3, attn + own / 3, bwd_in + 2 * own / 3
    op_rec, op_flops = _op_recompute(job, layout, tokens, fwd, attn, el_f)
    tp_fwd, tp_bwd, tp_again = tp_layer_comm(job, layout, tokens, gemms, ffn_tp=not moe_layer or bool(job.model.shared_ffn_hidden))
    cp_fwd, cp_bwd = cp_layer_comm(job, layout, tokens, attn, attn_b)
    ep = moe.dispatch_time(c, job.model, tokens, layout, job.train.activation_bytes, job.capacity_factor,
                           job.moe_dispatcher, job.moe_routing, tp_element_bytes(job).residual) if moe_layer else 0.0
    ep_f = ep_b = ep
    mlp = [sum(g[i] for g in gemms[2:]) for i in range(3)]  # the FFN's forward, input- and weight-gradient GEMMs
    host_bound = moe_layer and not calibrated(job)  # datasheet clusters: the MoE terms fitted on published runs
    if host_bound:  # the layer's untimed small kernels and host stall (moe.MOE_LAYER_OVERHEAD_S)
        fixed = moe.MOE_LAYER_OVERHEAD_S
        fwd, bwd_in, mlp[0] = fwd + fixed / 3, bwd_in + 2 * fixed / 3, mlp[0] + fixed / 3
    if ep and job.ep_comm_overlap:  # a forward's all-to-alls run beside another micro-batch's backward, and back,
        # never exposing more than alone
        ep_f = ep_b = min(ep, moe.ep_overlap_exposed(fwd - mlp[0], bwd_in - mlp[1], *mlp, ep / 2) / 2)
    counts = 0.0
    if moe_layer:
        counts = moe.aux_counts_time(c, job.model, layout) + (0.0 if host_bound else moe.count_exchange_time(c, job.model, layout))
    return LayerCost(fwd, bwd_in, bwd_w, attn + redo, tp_fwd, tp_bwd, oh, cp_fwd, cp_bwd, op_rec, op_flops,
                     ep_f + counts, ep_b, mlp[0], ep, 0.0 if moe_layer else tail, tp_again, counts,
                     moe.MOE_LAYER_HOST_S if host_bound else 0.0)


def paced(lc: LayerCost, paired_share: float, slowest: float) -> LayerCost:
    """The layer as a pipeline rank runs it: its compute at the slowest GPU's pace (step_time.straggler); under the EP
    overlap, `paired_share` of its passes paired with another micro-batch's (`ep_fwd`, `ep_bwd`) and the rest alone
    (`ep_alone`: the warm-up forwards and cool-down backwards, moe.paired_share); and each kind of pass no shorter than
    the host's floor (`host_floor`, which no GPU's pace moves), where the GPU waits for the host."""
    fwd, bwd_in, bwd_w, attn = (t * slowest for t in (lc.fwd, lc.bwd_in, lc.bwd_w, lc.attn_fwd))
    kinds = [(paired_share, lc.ep_bwd), (1 - paired_share, lc.ep_alone)] if lc.ep_alone else [(1.0, lc.ep_bwd)]
    ep_b = sum(w * t for w, t in kinds)
    lift_f = lift_b = 0.0
    if lc.host_floor:
        lift_f = sum(w * max(0.0, lc.host_floor / 3 - (fwd + lc.tp_fwd + lc.cp_fwd + t + lc.ep_counts)) for w, t in kinds)
        lift_b = sum(w * max(0.0, 2 * lc.host_floor / 3 - (bwd_in + bwd_w + lc.tp_bwd + lc.cp_bwd + t)) for w, t in kinds)
    return replaced(lc, dict(fwd=fwd + lift_f, bwd_in=bwd_in + lift_b, bwd_w=bwd_w, attn_fwd=attn,
                             ep_fwd=ep_b + lc.ep_counts, ep_bwd=ep_b))


def _datasheet_layer(job: Job, layout: Layout, tokens: int, moe_layer: bool) -> tuple:
    """A layer's compute from the datasheet models: (forward, input-gradient, weight-gradient, attention forward,
    attention backward, each GEMM's three times, the forward's element-wise time, what selective recompute runs
    again beside the attention core)."""
    c, model = job.cluster, job.model
    gemms = _layer_gemm_times(job, layout, tokens, moe_layer)
    rope_q, rope_kv = model.q_dim, model.kv_dim  # the rotary embedding's elements per token
    if model.attention == "mla":  # rotary on the rope part only
        rope_q, rope_kv = model.num_heads * model.qk_rope_head_dim, model.qk_rope_head_dim * layout.tp
    attn, attn_b = _attention_times(job, layout, tokens)
    el_f, el_b = _elementwise_times(job, layout, tokens, moe_layer, rope_q, rope_kv)
    fwd = sum(g[0] for g in gemms) + attn + el_f
    bwd_in = sum(g[1] for g in gemms) + attn_b + el_b
    bwd_w = sum(g[2] for g in gemms)
    redo = 0.0  # what selective recompute runs again beside the attention core: RoPE too, where the stack does
    if get_framework(job.framework).selective_recomputes_rope and model.rotary:
        redo = kernels.rotary_time(c, tokens, rope_q, rope_kv, layout.tp, job.train.activation_bytes,
                                   elementwise_mode(job))
    return fwd, bwd_in, bwd_w, attn, attn_b, gemms, el_f, redo


def _layer_gemm_times(job: Job, layout: Layout, tokens: int, moe_layer: bool) -> list[tuple[float, float, float]]:
    """(forward, input-gradient, weight-gradient) time of each of a layer's GEMM groups: QKV (MLA: its latent
    projections), the output projection, then the FFN's (a MoE layer: the shared expert's, the router's and the
    experts')."""
    c, model, fw = job.cluster, job.model, get_framework(job.framework)
    fp8 = job.precision == "fp8"  # the layer's linears (forward, input and weight gradients) in FP8
    wgrad_out = 2 * job.train.grad_bytes

    def three(m_: int, n_: int, k_: int) -> tuple[float, float, float]:
        return (kernels.gemm_time(c, m_, n_, k_, fp8=fp8), kernels.gemm_time(c, m_, k_, n_, fp8=fp8),
                kernels.gemm_time(c, k_, n_, m_, out_bytes=wgrad_out, fp8=fp8))

    gemms = [three(*shape) for shape in layer_gemms(model, tokens, layout.tp)]
    if model.attention == "mla":  # the latent projections in the q/k/v slot, then the output projection
        mla = [three(*shape) for shape in mla_gemms(model, tokens, layout.tp)]
        gemms[:2] = [tuple(map(sum, zip(*mla[:-1]))), mla[-1]]
    if not moe_layer:
        return gemms
    # a BF16 GEMM of an FP8 job runs at the FP8 job's in-situ share (kernels.gemm_time's `precision`)
    ffn_fp8 = [fp8 and q for q in moe.fp8_gemms(model, fw.fp8_experts)]
    ffn_gemms = moe.layer_gemms(model, tokens, layout, job.capacity_factor)
    return gemms[:2] + [tuple(moe.expert_gemm_time(c, *shape, n, fw.expert_gemm_streams, ob, q, job.precision)
                              for shape, ob in (((m_, n_, k_), 2), ((m_, k_, n_), 2), ((k_, n_, m_), wgrad_out)))
                        for (m_, n_, k_, n), q in zip(ffn_gemms, ffn_fp8, strict=True)]


def _attention_times(job: Job, layout: Layout, tokens: int) -> tuple[float, float]:
    """(forward, backward) of the attention core: the fused kernel the stack runs (over the context-parallel ring or
    chunks where cp > 1), or a materialised softmax."""
    c, model, fw, e = job.cluster, job.model, get_framework(job.framework), job.train.activation_bytes
    heads, d = model.num_heads // layout.tp, model.attention_width / model.num_heads  # MLA: (qk + v) / 2
    kernel = attention_kernel(job)
    if not kernel:
        return kernels.unfused_attention_time(c, layout.micro_batch, local_seq(job, layout), job.train.seq_len,
                                              heads, d, e, model.trains_with_dropout)
    if layout.cp > 1:  # the kernels the stack's context parallelism runs (kernels.cp_attention_time)
        scheme = "ring" if layout.cp_mode == "ring" or fw.cp_attention == "torch" else "chunks"
        # shardwise's runtime on a GPU: FP32 math blocks, merged in FP32; on a CPU SDPA's kernel, its merges as TE's
        # (where the calibration measured the ring's own work: cp_attention_work)
        kernel, stack = ("math", "shardwise") if cp_math_blocks(job) else (
            kernel, "te" if fw.cp_attention == "shardwise" else fw.cp_attention)
        return kernels.cp_attention_time(c, kernel, layout.micro_batch, job.train.seq_len, layout.cp, scheme, heads,
                                         d, job.precision, model.kv_dim / layout.tp, e, stack)
    full = kernels.fused_attention_time(c, kernel, tokens, job.train.seq_len, heads, d, job.precision)
    if not window_skipped(job):
        return full
    # the mean layer: its windowed share in the band, the rest over the whole causal sequence
    band = kernels.band_attention_time(c, kernel, tokens, job.train.seq_len, model.sliding_window, heads, d,
                                       job.precision)
    share = model.window_share(job.train.seq_len)
    return (1 - share) * full[0] + share * band[0], (1 - share) * full[1] + share * band[1]


def _elementwise_times(job: Job, layout: Layout, tokens: int, moe_layer: bool, rope_q: int, rope_kv: int
                       ) -> tuple[float, float]:
    """(forward, backward) of a layer's element-wise and copy kernels at HBM bandwidth: norms, activations, RoPE,
    residuals, the stack's attention layout copies, a MoE layer's permutation and FP8 casts."""
    c, model, fw = job.cluster, job.model, get_framework(job.framework)
    tp = layout.tp
    sp = layout.sequence_parallel and tp > 1
    ffn = moe.active_ffn_width(model, job.capacity_factor) if moe_layer else model.ffn_hidden
    el_f, el_b = kernels.elementwise_time(c, tokens, model.hidden, ffn, rope_q, rope_kv,
                                          tp, sp, model.gated_mlp, model.rotary, job.train.activation_bytes,
                                          elementwise_mode(job), model.family,
                                          None if job.compile else fw.glu_bytes,
                                          GELU_EPILOGUE_BYTES if c.arch in fw.gelu_epilogue else None,
                                          job.fused_norms)
    extras = []
    if attention_kernel(job) and fw.attention_layout_copies:
        extras.append(attention_layout_time(job, layout, tokens))
    if moe_layer:  # the routed tokens' permutation and its inverse
        extras.append(moe.permute_time(c, model, tokens, layout, job.train.activation_bytes, job.capacity_factor))
    if job.precision == "fp8":
        extras.append(fp8_casts(job, layout, tokens, moe_layer))
    for f_, b_ in extras:
        el_f, el_b = el_f + f_, el_b + b_
    return el_f, el_b


def _op_recompute(job: Job, layout: Layout, tokens: int, fwd: float, attn: float, el_f: float) -> tuple[float, float]:
    """(time, FLOPs) of what op-level selective checkpointing runs again in backward: it keeps every other matmul's
    output (the 1st, 3rd, ...: memory.op_sac_bytes) and the attention output, and runs the other matmuls — in FP8
    under an FP8 job, as its forward ran them — and every element-wise kernel of the layer again."""
    model, tp = job.model, layout.tp
    again = layer_matmuls(model, tp)[1::2]
    op_flops = sum(2 * tokens * n_ * k_ for n_, k_ in again)
    if calibrated(job):
        rate = achievable_flops(job)
        return op_flops / rate + (fwd - attn - 2 * tokens * matmul_params_per_layer(model) / tp / rate), op_flops
    fp8 = job.precision == "fp8"  # run again as the forward ran them (_layer_gemm_times)
    return sum(kernels.gemm_time(job.cluster, tokens, n_, k_, fp8=fp8) for n_, k_ in again) + el_f, op_flops


def elementwise_mode(job: Job) -> bool | str:
    """The kernels.ELEMENTWISE key of the job's element-wise work: "compiled" under --compile, "autocast" for this
    project's runtime on a GPU (SavedTensors.autocast_casts), else its stack's own."""
    if job.compile:
        return "compiled"
    return "autocast" if job.saved.autocast_casts else get_framework(job.framework).fused_elementwise


def attention_kernel(job: Job) -> str:
    """The fused attention kernel the job's layers run (kernels.ATTENTION_KERNEL), or "" for a materialised softmax:
    the run's own choice (Job.attention) where it makes one, else its framework's."""
    family = attention_family(job)
    if not job.flash_attention or family == "unfused":
        return ""
    return kernels.ATTENTION_KERNEL[family].get(job.cluster.arch or "ampere", "fa2")


def attention_family(job: Job) -> str:
    """The attention family the job's layers run (kernels.ATTENTION_KERNEL's key): the run's own choice (Job.attention)
    where it makes one, else its framework's."""
    return job.attention or get_framework(job.framework).attention


def window_skipped(job: Job) -> bool:
    """Whether the job's windowed layers (a sliding window shorter than the sequence) attend in the band alone: the
    stack's fused kernel takes the window (kernels.WINDOW_FAMILIES) and skips the blocks outside it. Under context
    parallelism _attention_times times the ring and the chunks as full causal attention all the same."""
    return (job.model.windowed(job.train.seq_len) and bool(attention_kernel(job))
            and attention_family(job) in kernels.WINDOW_FAMILIES and get_framework(job.framework).window_kernel)


def timed_keys(job: Job) -> float:
    """Keys per query of the mean layer as a causal kernel over the whole sequence would count them: the sequence,
    or where the windowed layers attend in the band alone (window_skipped), their band's 2W - W^2/s in their share
    (kernels.band_attention_time: the same pairs)."""
    s, model = job.train.seq_len, job.model
    if not window_skipped(job):
        return float(s)
    share, w = model.window_share(s), model.sliding_window
    return (1 - share) * s + share * (2 * w - w * w / s)


def attention_layout_time(job: Job, layout: Layout, tokens: int) -> tuple[float, float]:
    """(forward, backward) seconds per layer and micro-batch of GPT-NeoX v1.0's copies around flash-attn
    (Framework.attention_layout_copies; megatron/model/transformer.py): forward, each of Q, K and V transposed from
    [s, b, np, hn] to [b * s, np, hn] by a copying reshape, then the three concatenated into flash-attn's packed QKV
    (read and write each, twice), and the output permuted back to [s, b, np, hn] by .contiguous() (read and write);
    backward, the output's gradient copied back and each of Q's, K's and V's gradients, narrow slices of the packed
    gradient, copied by the reshape's backward (read and write each once)."""
    model, e = job.model, job.train.activation_bytes
    qkv, q = (model.q_dim + 2 * model.kv_dim) / layout.tp, model.q_dim / layout.tp
    per_token_f, per_token_b = 2 * e * (2 * qkv + q), 2 * e * (qkv + q)
    hbm = kernels.hbm_rate(job.cluster)
    return tokens * per_token_f / hbm, tokens * per_token_b / hbm


def fp8_casts(job: Job, layout: Layout, tokens: int, moe_layer: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds per layer and micro-batch of quantizing the linears' activations to FP8 with the
    framework's recipe (kernels.FP8_CAST_BYTES). Forward: each linear's input — Transformer Engine fuses the QKV
    and FC1 inputs' casts into the LayerNorm that produces them (LayerNormLinear), so only the projection's and
    FC2's inputs pay a pass; torchao casts all four. Backward: each linear's output gradient, for its input- and
    weight-gradient GEMMs. A MoE layer's experts cast their own rows (moe.fp8_cast_elements) in place of the FFN's.
    torchao under --compile takes each amax in the kernel that makes the tensor (kernels.FP8_CAST_FUSED) except
    behind the attention kernel: the projection's input (its output) and V's gradient (its dV)."""
    model, tp = job.model, layout.tp
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    fw = get_framework(job.framework)
    recipe = fw.fp8
    split = tp if layout.sequence_parallel else 1
    compiled = job.compile and recipe == "torchao"
    # (elements, whether a compiled kernel produces it): the projection's input, FC2's, then the two norms' outputs
    inputs = [(tokens * q / tp, False)] + ([] if moe_layer else [(tokens * f / tp, True)])
    if recipe != "te":
        inputs += [(tokens * h / split, True)] + ([] if moe_layer else [(tokens * h / split, True)])
    # Q and K's gradients (from RoPE's backward) and V's (the attention kernel's dV; torchtitan before ff0829c10,
    # 2026-01, expanded GQA's K and V with repeat_kv, whose backward sum Inductor makes: 0.01 point on its Float8 rows),
    # the projection's, FC1's, FC2's. Not modelled: under sequence parallelism both recipes cast the projection's and
    # FC2's output gradients on their sequence shard, gather them in FP8 and transpose the gathered tensor
    # (torchao's Float8RowwiseParallel, Transformer Engine's _grad_output_preprocess); priced here as one whole-size
    # cast and transpose, a few bytes per element too many on those two tensors (docs/planner.md).
    out = tokens * h
    qkv = [(tokens * (q + kv) / tp, True), (tokens * kv / tp, False)] if compiled else [(tokens * (q + 2 * kv) / tp, False)]
    grads = qkv + [(out, True)] + ([] if moe_layer else [(tokens * (2 if model.gated_mlp else 1) * f / tp, True),
                                                         (out, True)])
    if moe_layer:  # the experts' rows, priced unfused (their casts follow the permutation; no published torchao run)
        ffn_in, ffn_grads = moe.fp8_cast_elements(model, tokens, layout, job.capacity_factor, experts=fw.fp8_experts)
        inputs, grads = inputs + [(n, False) for n in ffn_in], grads + [(n, False) for n in ffn_grads]
    return tuple(kernels.fp8_cast_time(job.cluster, [(n, compiled and f) for n, f in cast], recipe)
                 for cast in (inputs, grads))


def fp8_weight_cast(job: Job, layout: Layout, layers: int) -> float:
    """Seconds to cast `layers` layers' weights (this GPU's shard of each) to FP8 with their transposes: once per
    step under Transformer Engine (it caches them from the first micro-batch), once per micro-batch under torchao.
    Weights that arrive in FP8 (FP8 parameters, or torchao's float8 all-gather, whose cast runs on the FSDP shard:
    overlap.fsdp_copy_time) need only the transpose the backward's input-gradient GEMM reads: torch._scaled_mm takes
    its second operand column-major, and the gathered weight is row-major (read 1, write 1)."""
    if job.precision != "fp8" or calibrated(job):
        return 0.0
    fw = get_framework(job.framework)
    recipe, model = fw.fp8, job.model
    per_layer = matmul_params_per_layer(model) / layout.tp
    if model.is_moe:  # the routed experts and the router out of the mean; the router is priced BF16 (moe.fp8_gemms)
        moe_share = len(model.moe_layers) / model.num_layers
        per_layer -= moe_share * (model.experts_per_token * model.expert_params() + model.num_experts * model.hidden) \
            / layout.tp
        if fw.fp8_experts:  # Transformer Engine casts every local expert's weights, not the k a token uses
            per_layer += moe_share * model.num_experts / layout.ep * model.expert_params() / layout.etp
    params = layers * per_layer
    per = kernels.FP8_CAST_BYTES[recipe]
    if job.train.weight_bytes == 1 or fp8_gathered(job, layout):  # nothing to cast, only the transpose to write
        per = 2
    return params * per / kernels.hbm_rate(job.cluster)


def calibrated_elementwise(model: ModelSpec, tokens: int, activation_bytes: int, hbm: float, tp: int = 1,
                           sp: int = 1) -> float:
    """Seconds of one layer's element-wise passes in forward on a calibrated cluster: CALIBRATED_PASSES h-wide
    (split by sequence parallelism) and f-wide (split by tp) activation passes per token at the measured copy
    bandwidth `hbm` (bytes/s); its backward runs them twice. `calibrate` takes the same seconds out of its measured
    model times before it fits the rate, so they are counted once."""
    return tokens * activation_bytes * (CALIBRATED_PASSES[0] * model.hidden / sp
                                        + CALIBRATED_PASSES[1] * model.ffn_hidden / tp) / hbm


def _calibrated_layer(job: Job, layout: Layout, tokens: int):
    """A calibrated cluster's layer: FLOPs at the measured rate, as `calibrate` weighted them."""
    model, tp = job.model, layout.tp
    rate, hbm, e = achievable_flops(job), job.cluster.hbm_bandwidth, job.train.activation_bytes
    mm = 2 * tokens * matmul_params_per_layer(model) / tp / rate
    if job.flash_attention:  # the band alone on the windowed layers where the kernel skips the rest (not under CP)
        keys = timed_keys(job) if layout.cp == 1 else job.train.seq_len
        attn = 4 * tokens * keys * model.attention_width / tp / (rate * FLASH_EFFICIENCY)
    else:  # the masked scores whole
        attn = (4 * tokens * job.train.seq_len * model.attention_width / tp / rate
                + SCORE_PASSES * e * model.num_heads * tokens * job.train.seq_len / tp / hbm)
    sp = tp if layout.sequence_parallel else 1
    elem = calibrated_elementwise(model, tokens, e, hbm, tp, sp)
    gemms = [(mm / 4, mm / 4, mm / 4)] * 4
    return mm + attn + elem, mm + 2 * attn + 2 * elem, mm, attn, gemms


def _overlapped(comm: float, compute: float, floor: float = 0.0) -> float:
    """Exposed seconds of `comm` run beside `compute` (at least `floor`), with the slowdown its hidden part
    causes to that compute (overlap.interference)."""
    exposed = max(floor, comm - compute)
    return exposed + interference(comm, exposed)


def tp_layer_comm(job: Job, layout: Layout, tokens: int, gemms: list, ffn_tp: bool = True
                  ) -> tuple[float, float, float]:
    """(forward, backward, the part of backward that re-gathers) exposed TP seconds of one layer and micro-batch:
    two all-reduces of the activation in each direction (attention and MLP outputs, Shoeybi et al. 2019), or with sequence
    parallelism an all-gather + reduce-scatter pair for each (the same bytes, twice the calls; a
    calibrated synchronisation cost once per pair). Under sequence parallelism the backward also gathers
    again the sequence-sharded input each column-parallel group (q/k/v, gate/up) saved, for its weight
    gradients: Megatron issues it behind the group's input-gradient GEMM (Job.async_sp_regather),
    shardwise's runtime waits for it. With TP comm overlap (needs SP) each collective hides behind the
    GEMM beside it, all but its first chunk. A MoE layer without a shared expert has no tensor-parallel FFN
    (`ffn_tp` False): only the attention's pair (its routed tokens' traffic is moe.dispatch_time).

    A parallel-residual model (ModelSpec.parallel_residual) adds the attention's and the MLP's row-parallel
    outputs before ONE reduction (GPT-NeoX v1.0 ParallelTransformerLayer with gpt_j_residual: parallel_output on
    both, then reduce_from_model_parallel_region once), and under SP one gather of that sum's gradient backward;
    the column-parallel inputs keep theirs (each ColumnParallelLinear's copy_to_model_parallel_region all-reduces
    its input's gradient backward; under SP each input is gathered forward and its gradient reduce-scattered)."""
    if layout.tp <= 1:
        return 0.0, 0.0, 0.0
    if not ffn_tp:
        f, b, again = _tp_comm(job, layout, tokens, gemms[:2] * 2, merged=False)
        return f / 2, b / 2, again / 2
    return _tp_comm(job, layout, tokens, gemms, merged=job.model.parallel_residual)


class TPBytes(NamedTuple):
    """Bytes per element the tensor-parallel collectives move."""

    outputs: int  # the row-parallel linears' outputs, and everything sequence parallelism gathers or scatters
    residual: int  # the residual stream's tensors: the embedding's output; without SP, a column group's input, whose
    # gradient f sums in backward


def tp_element_bytes(job: Job) -> TPBytes:
    """TPBytes of this job: the linears' outputs in the activations' dtype; the residual stream's tensors in theirs,
    FP32 under autocast (memory.residual_bytes: shardwise's runtime on a GPU, whose norms return the FP32 stream and
    whose linears cast their inputs themselves; under SP its gathered groups cast before they gather)."""
    return TPBytes(job.train.activation_bytes, residual_bytes(job))


def _tp_comm(job: Job, layout: Layout, tokens: int, gemms: list, merged: bool) -> tuple[float, float, float]:
    """tp_layer_comm of a layer with a tensor-parallel FFN; `merged`: one output reduction (parallel residual)."""
    tp, c = layout.tp, job.cluster
    outputs = 1 if merged else 2  # reductions of the row-parallel outputs (forward), their gathers (SP backward)
    act = tokens * job.model.hidden * job.train.activation_bytes
    sync = tp_sync_time(c, layout.sequence_parallel)
    if not layout.sequence_parallel:
        stream = tokens * job.model.hidden * tp_element_bytes(job).residual  # the column groups' input gradients
        return (outputs * tp_call_time(c, "all_reduce", act, tp), 2 * tp_call_time(c, "all_reduce", stream, tp), 0.0)
    # Transformer Engine gathers the FP8 copy of a sequence-parallel input (the cast runs on the shard).
    gathered = act / job.train.activation_bytes if job.precision == "fp8" and get_framework(job.framework).fp8 == "te" else act
    ag, rs = collective_time(c, "all_gather", gathered, tp), collective_time(c, "reduce_scatter", act, tp)
    ag_copy, rs_copy = _sequence_dim_copies(job, layout, act)
    regather = max(ag + sync, 0.0)  # (a calibrated charge may be negative: comm.tp_call_time)
    # q/k/v and gate/up: their input-gradient GEMMs (gemms[i][1]) run beside the re-gather.
    # (what hides runs beside the GEMM and slows it: overlap.interference)
    regathers = sum(_overlapped(regather, gemms[i][1]) if job.async_sp_regather else regather for i in (0, 2))
    regathers += 2 * ag_copy
    # The copies run on the compute stream, never hidden: forward two gathers and `outputs` reduce-scatters, backward
    # the mirror (each gather's gradient is a reduce-scatter and the other way round).
    copies_f, copies_b = 2 * ag_copy + outputs * rs_copy, outputs * ag_copy + 2 * rs_copy
    if job.tp_comm_overlap:
        # forward: AG before QKV and FC1, RS after the projection and FC2; backward mirrored on the dgrads.
        # Merged: the projection's RS and the AG of its output gradient are FC2's.
        pairs_f = [(ag, gemms[0][0]), (rs, gemms[1][0]), (ag, gemms[2][0]), (rs, gemms[3][0])]
        pairs_b = [(ag, gemms[3][1]), (rs, gemms[2][1]), (ag, gemms[1][1]), (rs, gemms[0][1])]
        if merged:
            pairs_f, pairs_b = [p for i, p in enumerate(pairs_f) if i != 1], [p for i, p in enumerate(pairs_b) if i != 2]
        exposed = [max(sum(_overlapped(x, g, x / TP_OVERLAP_SPLITS) for x, g in pairs) + 2 * sync, 0.0)
                   for pairs in (pairs_f, pairs_b)]
        return exposed[0] + copies_f, exposed[1] + regathers + copies_b, regathers
    return (max(2 * ag + outputs * rs + 2 * sync, 0.0) + copies_f,
            max(outputs * ag + 2 * rs + 2 * sync, 0.0) + regathers + copies_b, regathers)


def _sequence_dim_copies(job: Job, layout: Layout, act: float) -> tuple[float, float]:
    """(all-gather, reduce-scatter) seconds of the copy a stack whose sequence parallelism gathers along dim 1 of
    [batch, seq, hidden] makes around each collective (Framework.dtensor_sp): the whole activation read
    and written at HBM speed; the gather's is a view for one sequence a micro-batch."""
    if not get_framework(job.framework).dtensor_sp:
        return 0.0, 0.0
    copy = 2 * act / kernels.hbm_rate(job.cluster)
    return (copy if layout.micro_batch > 1 else 0.0), copy


def cp_attention_work(measured: dict | None, layout: Layout) -> float:
    """Seconds per layer and micro-batch of a context-parallel attention's own work beyond its kernels' FLOPs and its
    exchanges (cp_layer_comm), as `calibrate` measured it on the machine (calibrate.comm.measure_cp; 0 for datasheet
    clusters): the ring's slicing, online-softmax merges and buffers, cp_ring_step_s per ring step (cp steps a layer),
    or the all-gather's reordering and block loop, cp_allgather_s a layer."""
    m = measured or {}
    if layout.cp <= 1:
        return 0.0
    if layout.cp_mode == "ring":
        return layout.cp * float(m.get("cp_ring_step_s", 0.0))
    return float(m.get("cp_allgather_s", 0.0))


def cp_layer_comm(job: Job, layout: Layout, tokens: int, attn_f: float, attn_b: float) -> tuple[float, float]:
    """(forward, backward) exposed context-parallel seconds of one layer and micro-batch.

    A rank's K/V block is 2 x tokens x kv_dim/tp elements (GQA keeps it small). Ring (Megatron's p2p,
    shardwise's ring): cp - 1 hops forward, each sent while the block before it is attended; the zig-zag
    split gives every step 1/cp of the layer's attention, so a hop is hidden when that is longer. Backward:
    each step sends the K/V on and the dK/dV accumulated so far (two blocks per step behind 1/cp of the
    attention backward), and the last dK/dV hop home is exposed. All-gather (Llama 3): one all-gather of
    every rank's block forward, exposed; backward gathers again and reduce-scatters dK/dV. The cp ranks are
    tp apart (Megatron's order): while cp x tp fits a node the traffic is on NVLink; beyond, a ring crosses
    nodes at some hop and moves at the network's pace, a collective by NCCL's inter-node model. A backend
    measured not to overlap communication (calibrated comm_overlap 0: gloo on CPU) hides nothing. torch's
    context_parallel accumulates and passes dK/dV on in FP32 (its convert_to_f32 default): 4 bytes per element, and
    around the ring in either rotate method (its backward's dK/dV rotater is all-to-all: memory.torch_dkv_ring)."""
    cp, tp, c = layout.cp, layout.tp, job.cluster
    if cp <= 1:
        return 0.0, 0.0
    block, dblock = cp_kv_blocks(job, layout, tokens)
    crosses = not one_node(c, cp, tp)  # the ring's slowest hop: between nodes where a cp group spans two

    def send(n: float) -> float:
        return collective_time(c, "send_recv", n, 2, c.gpus_per_node if crosses else tp) + p2p_sync_time(c)
    hop, dhop = send(block), send(dblock)
    blocking = not overlaps(c)

    def ring(load: float, attn: float) -> float:  # cp - 1 steps, each hidden behind 1/cp of the attention if it can be
        return (cp - 1) * (load if blocking else max(0.0, load - attn / cp))
    if layout.cp_mode == "allgather":
        ag = collective_time(c, "all_gather", cp * block, cp, tp) + sync_time(c)
        if torch_dkv_ring(job):  # torch passes dK/dV around the ring whatever gathers K/V, the last hop home exposed
            return ag, ag + ring(dhop, attn_b) + dhop
        rs = collective_time(c, "reduce_scatter", cp * dblock, cp, tp) + sync_time(c)
        return ag, ag + rs
    return ring(hop, attn_f), ring(hop + dhop, attn_b) + dhop
