"""Time of one optimizer step, with its breakdown (seconds), and the FLOPs behind MFU and HFU.

Per layer and micro-batch on one GPU: every GEMM timed from its own shape after the TP split
(planner/kernels.py: tiles and waves over the SMs, memory-bound small GEMMs, kernel launches), the
attention core by the kernel the framework runs (FlashAttention-2/3 curves, or a materialised softmax),
element-wise traffic at HBM bandwidth, TP collectives by NCCL's model (planner/comm.py), exposed unless
the framework overlaps them with their GEMMs. The pipeline's makespan comes from
`shardwise.schedules.closed_forms.pipeline_makespan`, the closed form the schedule simulator is tested
against; data-parallel traffic is scheduled against the compute beside it (planner/overlap.py).
On a calibrated cluster (`shardwise calibrate`) the measured rates and per-call costs replace the
datasheet models (docs/accuracy.md).

FLOPs follow the PaLM paper (Chowdhery et al. 2022, App. B): model FLOPs per token are
6 N_matmul + 12 L q_dim s (attention scores and their product with V, forward + backward, causal
masking not discounted) plus the LM head. Hardware FLOPs add what recompute runs again.
Constants and their sources: docs/planner.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from functools import lru_cache

from shardwise.planner import kernels, moe
from shardwise.planner.comm import collective_time, p2p_sync_time, sync_time
from shardwise.planner.frameworks import get as get_framework
from shardwise.planner.memory import Job, layer_params, local_seq, pipeline_ranks, rank_expert_params, rank_layers, rank_params
from shardwise.planner.overlap import Window, dp_exposed, interference
from shardwise.schedules.closed_forms import pipeline_makespan
from shardwise.specs import Layout, ModelSpec

# With TP communication overlap (Transformer Engine userbuffers, NeMo's ub_tp_comm_overlap) each TP
# collective is split into chunks pipelined with the GEMM that produces or consumes it: the first chunk
# (1/TP_OVERLAP_SPLITS of it) is never hidden, and no more than the GEMM's time can hide the rest.
# NeMo's ub_tp_comm_overlap_cfg uses num_splits 4 (dgxc-benchmarking gpt3_175b_hydra.yaml).
TP_OVERLAP_SPLITS = 4
# Bytes per parameter moved by the optimizer step, bound by HBM bandwidth: Adam reads FP32 master, m,
# v and gradient (16) and writes master, m, v and the BF16 weight (14); clipping reads the gradient (4).
OPTIMIZER_BYTES_PER_PARAM = 34
# The cross-entropy per logit and micro-batch, beyond the head's GEMMs, in bytes through HBM (forward, backward), by
# the loss the framework runs (Framework.loss):
#   "megatron": Megatron's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py), one kernel
#     per line: the logits cast to FP32 (2 + 4), max (4), in-place subtract (4 + 4), in-place exp (4 + 4), sum (4),
#     in-place divide into the softmax it saves (4 + 4) = 38; backward: in-place multiply by the loss gradient
#     (4 + 4) and the cast back to BF16 (4 + 2) = 14;
#   "fused": the same fused into one kernel per pass (NeMo's cross_entropy_loss_fusion): an FP32 copy written and
#     read by max/exp/sum (2 + 4 + 4) = 10; its gradient (4 + 2) = 6;
#   "eager": F.cross_entropy(logits.float()) (torchtitan, this project): cast (2 + 4), log-softmax reading the row
#     for its max, its sum and its output (3 x 4 + 4) = 22; backward: NLL's dense zero gradient (4), log-softmax's
#     (4 + 4 + 4 + a sum pass 4) and the cast back (4 + 2) = 26.
LOSS_BYTES = {"megatron": (38, 14), "fused": (10, 6), "eager": (22, 26)}
# Calibrated clusters only (their rate was measured with this weighting, calibrate/measure.py): a fused
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


def model_flops_per_step(job: Job) -> float:
    """PaLM model FLOPs of one step over the whole job (forward + backward, no recompute)."""
    m, s = job.model, job.train.seq_len
    per_token = 6 * (m.num_layers * matmul_params_per_layer(m) + m.hidden * m.vocab_size) + 12 * m.num_layers * m.q_dim * s
    return per_token * s * job.train.global_batch


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


# Identical GPUs do not run at one speed: Sinha et al. 2022 ("Not All GPUs Are Created Equal", SC'22) measured an
# 8 % average performance spread across the GPUs of each cluster (over 90 % of its thousands of GPUs, from power
# management and manufacturing variation). Read as the range of ~4,000 normal draws (about 7.2 standard
# deviations), one GPU's speed varies by GPU_SPEED_SIGMA. A synchronous step waits for its slowest GPU: the expected
# maximum of N normal draws, sqrt(2 ln N) - (ln ln N + ln 4pi) / (2 sqrt(2 ln N)) standard deviations (Gumbel).
GPU_SPEED_SIGMA = 0.011


def straggler(job: Job, layout: Layout) -> float:
    """How much slower than the median GPU a step of `layout.world_size` GPUs computes (datasheet clusters; a
    calibrated cluster's rates are its own GPUs' measured ones)."""
    n = layout.world_size
    if n < 2 or calibrated(job) or job.cluster.measured:
        return 1.0
    a = math.sqrt(2 * math.log(n))
    z = a - (math.log(math.log(n)) + math.log(4 * math.pi)) / (2 * a) if n >= 3 else 0.56
    return 1.0 + GPU_SPEED_SIGMA * max(z, 0.0)


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

    def mix(self, other: "LayerCost", share: float) -> "LayerCost":
        """The mean of a rank's layers when `share` of them cost `other` (MoE layers among dense ones)."""
        names = [f.name for f in fields(self)]  # not astuple: it deep-copies, and the search calls this often
        return LayerCost(*((1 - share) * getattr(self, n) + share * getattr(other, n) for n in names))


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
    """One layer's costs (a dense one, or a MoE layer's): they depend on the layout only through tp, SP, cp,
    the micro-batch and, for a MoE layer, the expert split."""
    key = Layout(tp=layout.tp, micro_batch=layout.micro_batch, sequence_parallel=layout.sequence_parallel,
                 cp=layout.cp, cp_mode=layout.cp_mode, ep=layout.ep if moe_layer else 1, etp=layout.etp if moe_layer else 1)
    return _layer_cost(job, key, moe_layer, *_cache_key(job))


def _cache_key(job: Job) -> tuple:
    """What the cached costs depend on beyond the (hashable) job: ClusterSpec's `measured` tables are left out
    of its hash and equality, and the in-situ efficiency is a module constant."""
    return ((kernels.in_situ(job.cluster), kernels.in_situ(job.cluster, "fp8"), moe.MOE_LAYER_OVERHEAD_S,
             moe.MOE_LAYER_HOST_S),
            repr(job.cluster.measured))


@lru_cache(maxsize=4096)
def _layer_cost(job: Job, layout: Layout, moe_layer: bool, in_situ: float, measured: str) -> LayerCost:
    model, tp, c = job.model, layout.tp, job.cluster
    tokens = layout.micro_batch * local_seq(job, layout)
    e = job.train.activation_bytes
    sp = layout.sequence_parallel and tp > 1
    oh = float((c.measured or {}).get("layer_overhead_s", 0.0))
    if calibrated(job):
        fwd, bwd_in, bwd_w, attn, gemms = _calibrated_layer(job, layout, tokens)
        attn_b = 2 * attn
    else:
        fw = get_framework(job.framework)
        fp8 = job.precision == "fp8"  # the layer's linears (forward, input and weight gradients) in FP8
        gemms = [(kernels.gemm_time(c, m_, n_, k_, fp8=fp8), kernels.gemm_time(c, m_, k_, n_, fp8=fp8),
                  kernels.gemm_time(c, k_, n_, m_, out_bytes=2 * job.train.grad_bytes, fp8=fp8))
                 for m_, n_, k_ in layer_gemms(model, tokens, tp)]
        if model.attention == "mla":  # the latent projections in the q/k/v slot, then the output projection
            mla = [(kernels.gemm_time(c, m_, n_, k_, fp8=fp8), kernels.gemm_time(c, m_, k_, n_, fp8=fp8),
                    kernels.gemm_time(c, k_, n_, m_, out_bytes=2 * job.train.grad_bytes, fp8=fp8))
                   for m_, n_, k_ in mla_gemms(model, tokens, tp)]
            gemms[:2] = [tuple(map(sum, zip(*mla[:-1]))), mla[-1]]
        ffn = model.ffn_hidden
        if moe_layer:  # the attention's GEMMs, then the shared expert's, the router's and the experts'
            ffn = moe.active_ffn_width(model, job.capacity_factor)
            gemms = gemms[:2] + [tuple(moe.expert_gemm_time(c, *shape, n, fw.expert_gemm_streams, ob, fp8) for shape, ob in
                                       (((m_, n_, k_), 2), ((m_, k_, n_), 2), ((k_, n_, m_), 2 * job.train.grad_bytes)))
                                 for m_, n_, k_, n in moe.layer_gemms(model, tokens, layout, job.capacity_factor)]
        heads, d = model.num_heads // tp, model.head_dim
        rope_q, rope_kv = model.q_dim, model.kv_dim  # the rotary embedding's elements per token
        if model.attention == "mla":  # Q K^T over qk_nope + qk_rope, P V over v_head_dim; rotary on the rope part only
            d = (model.head_dim + model.v_head_dim) / 2
            rope_q, rope_kv = model.num_heads * model.qk_rope_head_dim, model.qk_rope_head_dim * tp
        if job.flash_attention and fw.attention != "unfused":
            kernel = kernels.ATTENTION_KERNEL[fw.attention].get(c.arch or "ampere", "fa2")
            if layout.cp > 1:  # the kernels the stack's context parallelism runs (kernels.cp_attention_time)
                scheme = "ring" if layout.cp_mode == "ring" or fw.cp_attention == "torch" else "chunks"
                attn, attn_b = kernels.cp_attention_time(c, kernel, layout.micro_batch, job.train.seq_len, layout.cp,
                                                         scheme, heads, d, job.precision, model.kv_dim / tp, e,
                                                         fw.cp_attention)
            else:
                attn, attn_b = kernels.fused_attention_time(c, kernel, tokens, job.train.seq_len, heads, d, job.precision)
        else:
            attn, attn_b = kernels.unfused_attention_time(c, layout.micro_batch, local_seq(job, layout),
                                                          job.train.seq_len, heads, d, e, model.trains_with_dropout)
        el_f, el_b = kernels.elementwise_time(c, tokens, model.hidden, ffn, rope_q, rope_kv,
                                              tp, sp, model.gated_mlp, model.family == "llama", e,
                                              fw.fused_elementwise, model.family)
        if moe_layer:  # the routed tokens' permutation and its inverse
            perm_f, perm_b = moe.permute_time(c, model, tokens, layout, e, job.capacity_factor)
            el_f, el_b = el_f + perm_f, el_b + perm_b
        if fp8:
            cast_f, cast_b = fp8_casts(job, layout, tokens, moe_layer)
            el_f, el_b = el_f + cast_f, el_b + cast_b
        fwd = sum(g[0] for g in gemms) + attn + el_f
        bwd_in = sum(g[1] for g in gemms) + attn_b + el_b
        bwd_w = sum(g[2] for g in gemms)
    # Op-level selective checkpointing keeps every other matmul's output (the 1st, 3rd, ...) and the attention
    # output; backward runs the other matmuls and every element-wise kernel of the layer again.
    again = layer_matmuls(model, tp)[1::2]
    op_flops = sum(2 * tokens * n_ * k_ for n_, k_ in again)
    if calibrated(job):
        op_rec = op_flops / achievable_flops(job) + (fwd - attn - 2 * tokens * matmul_params_per_layer(model) / tp
                                                      / achievable_flops(job))
    else:
        op_rec = sum(kernels.gemm_time(c, tokens, n_, k_) for n_, k_ in again) + el_f
    tp_fwd, tp_bwd = tp_layer_comm(job, layout, tokens, gemms, ffn_tp=not moe_layer or bool(model.shared_ffn_hidden))
    cp_fwd, cp_bwd = cp_layer_comm(job, layout, tokens, attn, attn_b)
    ep = moe.dispatch_time(c, model, tokens, layout, job.train.activation_bytes, job.capacity_factor,
                           job.moe_dispatcher, job.moe_routing) if moe_layer else 0.0
    ep_f = ep_b = ep
    mlp = [sum(g[i] for g in gemms[2:]) for i in range(3)]  # the FFN's forward, input- and weight-gradient GEMMs
    host_bound = moe_layer and not calibrated(job)  # datasheet clusters: the MoE terms fitted on published runs
    if host_bound:  # the layer's untimed small kernels and host stall (moe.MOE_LAYER_OVERHEAD_S)
        fixed = moe.MOE_LAYER_OVERHEAD_S
        fwd, bwd_in, mlp[0] = fwd + fixed / 3, bwd_in + 2 * fixed / 3, mlp[0] + fixed / 3
    if ep and job.ep_comm_overlap:  # a forward's all-to-alls run beside another micro-batch's backward, and back
        ep_f = ep_b = moe.ep_overlap_exposed(fwd - mlp[0], bwd_in - mlp[1], *mlp, ep / 2) / 2
    if host_bound:  # the GPU waits for the host where the layer's kernels run out first
        fwd += max(0.0, moe.MOE_LAYER_HOST_S / 3 - (fwd + tp_fwd + cp_fwd + ep_f))
        bwd_in += max(0.0, 2 * moe.MOE_LAYER_HOST_S / 3 - (bwd_in + bwd_w + tp_bwd + cp_bwd + ep_b))
    return LayerCost(fwd, bwd_in, bwd_w, attn, tp_fwd, tp_bwd, oh, cp_fwd, cp_bwd, op_rec, op_flops, ep_f, ep_b,
                     mlp[0], ep)


def fp8_casts(job: Job, layout: Layout, tokens: int, moe_layer: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds per layer and micro-batch of quantizing the linears' activations to FP8 with the
    framework's recipe (kernels.FP8_CAST_BYTES). Forward: each linear's input — Transformer Engine fuses the QKV
    and FC1 inputs' casts into the LayerNorm that produces them (LayerNormLinear), so only the projection's and
    FC2's inputs pay a pass; torchao casts all four. Backward: each linear's output gradient, for its input- and
    weight-gradient GEMMs. A MoE layer's experts cast their own rows (moe.fp8_cast_elements) in place of the FFN's."""
    model, tp = job.model, layout.tp
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    recipe = get_framework(job.framework).fp8
    split = tp if layout.sequence_parallel else 1
    inputs = [tokens * q / tp] + ([] if moe_layer else [tokens * f / tp])
    if recipe != "te":
        inputs += [tokens * h / split] + ([] if moe_layer else [tokens * h / split])
    grads = [tokens * (q + 2 * kv) / tp, tokens * h]
    grads += [] if moe_layer else [tokens * (2 if model.gated_mlp else 1) * f / tp, tokens * h]
    if moe_layer:
        ffn_in, ffn_grads = moe.fp8_cast_elements(model, tokens, layout, job.capacity_factor)
        inputs, grads = inputs + ffn_in, grads + ffn_grads
    return kernels.fp8_cast_time(job.cluster, inputs, recipe), kernels.fp8_cast_time(job.cluster, grads, recipe)


def fp8_weight_cast(job: Job, layout: Layout, layers: int) -> float:
    """Seconds to cast `layers` layers' weights (this GPU's shard of each) to FP8 with their transposes: once per
    step under Transformer Engine (it caches them from the first micro-batch), once per micro-batch under torchao."""
    if job.precision != "fp8" or calibrated(job):
        return 0.0
    recipe = get_framework(job.framework).fp8
    params = layers * matmul_params_per_layer(job.model) / layout.tp
    per = kernels.FP8_CAST_BYTES[recipe]
    if job.train.weight_bytes == 1:  # FP8 parameters: nothing to cast, only the transpose to write (read 1, write 1)
        per = 2
    return params * per / kernels.hbm_rate(job.cluster)


def _calibrated_layer(job: Job, layout: Layout, tokens: int):
    """A calibrated cluster's layer: FLOPs at the measured rate, as `calibrate` weighted them."""
    model, tp = job.model, layout.tp
    rate, hbm, e = achievable_flops(job), job.cluster.hbm_bandwidth, job.train.activation_bytes
    mm = 2 * tokens * matmul_params_per_layer(model) / tp / rate
    attn_flops = 4 * tokens * job.train.seq_len * model.q_dim / tp
    if job.flash_attention:
        attn = attn_flops / (rate * FLASH_EFFICIENCY)
    else:
        attn = attn_flops / rate + SCORE_PASSES * e * model.num_heads * tokens * job.train.seq_len / tp / hbm
    sp = tp if layout.sequence_parallel else 1
    elem = tokens * e * (CALIBRATED_PASSES[0] * model.hidden / sp + CALIBRATED_PASSES[1] * model.ffn_hidden / tp) / hbm
    gemms = [(mm / 4, mm / 4, mm / 4)] * 4
    return mm + attn + elem, mm + 2 * attn + 2 * elem, mm, attn, gemms


def _overlapped(comm: float, compute: float, floor: float = 0.0) -> float:
    """Exposed seconds of `comm` run beside `compute` (at least `floor`), with the slowdown its hidden part
    causes to that compute (overlap.interference)."""
    exposed = max(floor, comm - compute)
    return exposed + interference(comm, exposed)


def tp_layer_comm(job: Job, layout: Layout, tokens: int, gemms: list, ffn_tp: bool = True) -> tuple[float, float]:
    """(forward, backward) exposed TP seconds of one layer and micro-batch: two all-reduces of the
    activation in each direction (attention and MLP outputs, Shoeybi et al. 2019), or with sequence
    parallelism an all-gather + reduce-scatter pair for each (the same bytes, twice the calls; a
    calibrated synchronisation cost once per pair). Under sequence parallelism the backward also gathers
    again the sequence-sharded input each column-parallel group (q/k/v, gate/up) saved, for its weight
    gradients: Megatron issues it behind the group's input-gradient GEMM (Job.async_sp_regather),
    shardwise's runtime waits for it. With TP comm overlap (needs SP) each collective hides behind the
    GEMM beside it, all but its first chunk. A MoE layer without a shared expert has no tensor-parallel FFN
    (`ffn_tp` False): only the attention's pair (its routed tokens' traffic is moe.dispatch_time)."""
    tp, c = layout.tp, job.cluster
    if tp <= 1:
        return 0.0, 0.0
    if not ffn_tp:
        f, b = tp_layer_comm(job, layout, tokens, gemms[:2] * 2)
        return f / 2, b / 2
    act = tokens * job.model.hidden * job.train.activation_bytes
    sync = sync_time(c)
    if not layout.sequence_parallel:
        one = collective_time(c, "all_reduce", act, tp) + sync
        return 2 * one, 2 * one
    # Transformer Engine gathers the FP8 copy of a sequence-parallel input (the cast runs on the shard).
    gathered = act / job.train.activation_bytes if job.precision == "fp8" and get_framework(job.framework).fp8 == "te" else act
    ag, rs = collective_time(c, "all_gather", gathered, tp), collective_time(c, "reduce_scatter", act, tp)
    regather = ag + sync
    # q/k/v and gate/up: their input-gradient GEMMs (gemms[i][1]) run beside the re-gather.
    # (what hides runs beside the GEMM and slows it: overlap.interference)
    regathers = sum(_overlapped(regather, gemms[i][1]) if job.async_sp_regather else regather for i in (0, 2))
    if job.tp_comm_overlap:
        # forward: AG before QKV and FC1, RS after the projection and FC2; backward mirrored on the dgrads.
        pairs_f = [(ag, gemms[0][0]), (rs, gemms[1][0]), (ag, gemms[2][0]), (rs, gemms[3][0])]
        pairs_b = [(ag, gemms[3][1]), (rs, gemms[2][1]), (ag, gemms[1][1]), (rs, gemms[0][1])]
        exposed = [sum(_overlapped(x, g, x / TP_OVERLAP_SPLITS) for x, g in pairs) + 2 * sync for pairs in (pairs_f, pairs_b)]
        return exposed[0], exposed[1] + regathers
    one = ag + rs + sync
    return 2 * one, 2 * one + regathers


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
    context_parallel accumulates and passes dK/dV on in FP32 (its convert_to_f32 default): 4 bytes per element."""
    cp, tp, c = layout.cp, layout.tp, job.cluster
    if cp <= 1:
        return 0.0, 0.0
    e = job.train.activation_bytes
    block = 2 * tokens * job.model.kv_dim / tp * e
    dblock = block * (4 / e if get_framework(job.framework).cp_attention == "torch" else 1)
    if layout.cp_mode == "allgather":
        ag = collective_time(c, "all_gather", cp * block, cp, tp) + sync_time(c)
        rs = collective_time(c, "reduce_scatter", cp * dblock, cp, tp) + sync_time(c)
        return ag, ag + rs
    crosses = cp * tp > c.gpus_per_node

    def send(n: float) -> float:
        return collective_time(c, "send_recv", n, 2, c.gpus_per_node if crosses else tp) + p2p_sync_time(c)
    hop, dhop = send(block), send(dblock)
    if float((c.measured or {}).get("comm_overlap", 1.0)) <= 0:
        return (cp - 1) * hop, (cp - 1) * hop + cp * dhop
    return (cp - 1) * max(0.0, hop - attn_f / cp), (cp - 1) * max(0.0, hop + dhop - attn_b / cp) + dhop


@dataclass(frozen=True)
class StageCost:
    """Per micro-batch costs (seconds) of one pipeline rank, split as the schedules need them."""

    f: float  # forward
    b: float  # backward for inputs (+ recompute)
    w: float  # backward for weights
    compute: float  # model-FLOP work inside f+b+w
    recompute: float
    tp_comm: float
    flops_model: float
    flops_recompute: float
    layers: int = 0
    layer_f: float = 0.0  # one layer's forward compute (what an FSDP gather hides behind)
    layer_b: float = 0.0  # one layer's backward compute
    cp_comm: float = 0.0  # exposed context-parallel K/V traffic (inside f and b)
    ep_comm: float = 0.0  # the MoE layers' all-to-alls (forward and backward)


def stage_cost(job: Job, layout: Layout, rank: int) -> StageCost:
    """Per micro-batch costs of pipeline rank `rank` (cached: the search asks for the same ones often)."""
    return _stage_cost(job, layout, rank, *_cache_key(job))


@lru_cache(maxsize=4096)
def _stage_cost(job: Job, layout: Layout, rank: int, in_situ: float, measured: str) -> StageCost:
    model, tp = job.model, layout.tp
    tokens = layout.micro_batch * local_seq(job, layout)
    layers = rank_layers(job, layout, rank)
    lc = layer_cost(job, layout)
    moe_layers = moe.rank_moe_layers(model, layout, rank, job.train.seq_len)
    if moe_layers:  # the mean layer of this rank
        lc = lc.mix(layer_cost(job, layout, moe_layer=True), moe_layers / layers)
        if job.ep_comm_overlap:  # warm-up forwards and cool-down backwards have no partner to hide behind
            share = moe.paired_share(layout, layout.num_microbatches(job.train.global_batch))
            lc = replace(lc, ep_fwd=share * lc.ep_fwd + (1 - share) * lc.ep_alone,
                         ep_bwd=share * lc.ep_bwd + (1 - share) * lc.ep_alone)
    slowest = straggler(job, layout)
    if slowest != 1.0:  # the job computes at its slowest GPU's pace
        lc = replace(lc, fwd=lc.fwd * slowest, bwd_in=lc.bwd_in * slowest, bwd_w=lc.bwd_w * slowest,
                     attn_fwd=lc.attn_fwd * slowest)
    oh = lc.overhead / 3
    edge_f, edge_b = tp_edge_time(job, layout, rank, tokens)
    f = layers * (lc.fwd + lc.tp_fwd + lc.cp_fwd + lc.ep_fwd + oh) + edge_f
    if job.precision == "fp8" and get_framework(job.framework).fp8 != "te":  # weights cast again every micro-batch
        f += fp8_weight_cast(job, layout, layers)
    b_in = layers * (lc.bwd_in + lc.tp_bwd + lc.cp_bwd + lc.ep_bwd + oh) + edge_b
    w = layers * (lc.bwd_w + oh)
    if layout.schedule == "zb-h1" and layout.pp > 1 and rank > 0:  # I and W walk the graph apart (calibrated)
        w += layers * float((job.cluster.measured or {}).get("split_backward_s", 0.0))
    mm_flops = 2 * tokens * matmul_params_per_layer(model) / tp
    attn_flops = 4 * tokens * job.train.seq_len * model.q_dim / tp
    flops_model = layers * 3 * (mm_flops + attn_flops)
    # Recompute, plus the calibrated cost of each checkpointed region (0 for datasheet clusters).
    ckpt = float((job.cluster.measured or {}).get("checkpoint_overhead_s", 0.0))
    rec_tp = rec_cp = 0.0  # recompute runs the forward's TP collectives (full) and K/V traffic again
    if layout.recompute == "full":
        rec, flops_rec, rec_tp = layers * (lc.fwd + oh + ckpt), layers * (mm_flops + attn_flops), layers * lc.tp_fwd
        rec_cp = layers * lc.cp_fwd
    elif layout.recompute == "selective" and job.selective == "op":
        rec, flops_rec = layers * (lc.op_recompute * slowest + ckpt), layers * lc.op_recompute_flops
    elif layout.recompute == "selective" and job.recompute_modules:  # Megatron's named modules, each run again
        rec, flops_rec = layers * ckpt + module_recompute(job, layout, tokens, layers, moe_layers), 0.0
        if "core_attn" in job.recompute_modules:
            rec, flops_rec, rec_cp = rec + layers * lc.attn_fwd, layers * attn_flops, layers * lc.cp_fwd
    elif layout.recompute == "selective":
        rec, flops_rec, rec_cp = layers * (lc.attn_fwd + ckpt), layers * attn_flops, layers * lc.cp_fwd
    else:
        rec, flops_rec = 0.0, 0.0
    if rank == layout.pp - 1:  # LM head: logits forward, their input and weight gradients, the loss
        hf, hb, hw = (t * slowest for t in head_time(job, layout, tokens))
        f, b_in, w = f + hf, b_in + hb, w + hw
        flops_model += 3 * 2 * tokens * model.hidden * model.vocab_size / tp
    tp_comm = layers * (lc.tp_fwd + lc.tp_bwd) + edge_f + edge_b + rec_tp
    cp_comm = layers * (lc.cp_fwd + lc.cp_bwd) + rec_cp
    rec_ep = layers * lc.ep_fwd if layout.recompute == "full" else 0.0  # full recompute dispatches again
    if moe_layers and job.moe_recompute == "moe" and layout.recompute != "full":  # Megatron's MoE recompute
        mlc = layer_cost(job, layout, moe_layer=True)
        rec, rec_ep = rec + moe_layers * mlc.ffn_fwd, moe_layers * mlc.ep_fwd
    ep_comm = layers * (lc.ep_fwd + lc.ep_bwd) + rec_ep
    compute = f + b_in + w - layers * (lc.tp_fwd + lc.tp_bwd + lc.cp_fwd + lc.cp_bwd + lc.ep_fwd + lc.ep_bwd) - edge_f - edge_b
    return StageCost(f=f, b=b_in + rec + rec_tp + rec_cp + rec_ep, w=w, compute=compute, recompute=rec, tp_comm=tp_comm,
                     flops_model=flops_model, flops_recompute=flops_rec, layers=layers,
                     layer_f=lc.fwd + lc.tp_fwd + lc.cp_fwd + lc.ep_fwd + oh,
                     layer_b=lc.bwd_in + lc.bwd_w + lc.tp_bwd + lc.cp_bwd + lc.ep_bwd + 2 * oh + rec / max(layers, 1), cp_comm=cp_comm,
                     ep_comm=ep_comm)


def module_recompute(job: Job, layout: Layout, tokens: int, layers: int, moe_layers: int) -> float:
    """Seconds per micro-batch of the element-wise modules Megatron recomputes by name: "layernorm" runs a layer's
    two norms again (a pass over h per token, 1/tp of them under SP), "moe_act" the experts' activation (k c f_e
    gated elements per routed token, 1/tp of the tokens). Both at HBM bandwidth (kernels.ELEMENTWISE's bytes)."""
    model, c, tp = job.model, job.cluster, layout.tp
    norm, _, swiglu, gelu, _ = kernels.ELEMENTWISE[get_framework(job.framework).fused_elementwise]
    norm = norm.get(model.family, norm["llama"]) if isinstance(norm, dict) else norm
    scale = job.train.activation_bytes / 2  # the byte counts are for 2-byte activations
    t = 0.0
    if "layernorm" in job.recompute_modules:
        t += layers * tokens * 2 * norm * model.hidden / (tp if layout.sequence_parallel else 1) * scale
    if "moe_act" in job.recompute_modules and moe_layers:
        width = model.experts_per_token * job.capacity_factor * model.moe_ffn_hidden
        t += moe_layers * tokens / tp * (swiglu if model.gated_mlp else gelu) * width * scale
    return t / kernels.hbm_rate(c)


def head_time(job: Job, layout: Layout, tokens: int) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) seconds of the LM head and the loss on the last stage."""
    model, c, tp = job.model, job.cluster, layout.tp
    vocab = model.vocab_size // tp
    if calibrated(job):
        t = 2 * tokens * model.hidden * model.vocab_size / tp / achievable_flops(job)
        return t, t, t
    loss_f, loss_b = (n * tokens * vocab / kernels.hbm_rate(c) for n in LOSS_BYTES[get_framework(job.framework).loss])
    prec = job.precision  # the head stays BF16, at the job's in-situ share
    return (kernels.gemm_time(c, tokens, vocab, model.hidden, precision=prec) + loss_f,
            kernels.gemm_time(c, tokens, model.hidden, vocab, precision=prec) + loss_b,
            kernels.gemm_time(c, model.hidden, vocab, tokens, out_bytes=2 * job.train.grad_bytes, precision=prec))


def tp_edge_time(job: Job, layout: Layout, rank: int, tokens: int) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch of the vocabulary-parallel edges: the embedding's
    sum over tp (first stage; a reduce-scatter under sequence parallelism, whose backward gathers),
    the LM head's input (last stage: the conjugate of a layer's entry) and the loss's all-gather of
    two fp32 statistics per token (runtime's VocabParallelCrossEntropy; Megatron's all-reduces move
    the same few bytes)."""
    tp, c = layout.tp, job.cluster
    if tp == 1:
        return 0.0, 0.0
    act = tokens * job.model.hidden * job.train.activation_bytes
    sync = sync_time(c)
    ar, ag, rs = (collective_time(c, k, act, tp) + sync for k in ("all_reduce", "all_gather", "reduce_scatter"))
    sp = layout.sequence_parallel
    f = b = 0.0
    if rank == 0:
        f, b = (rs, ag) if sp else (ar, 0.0)
    if rank == layout.pp - 1:  # under SP the head's input is gathered again in backward (Megatron)
        f += (ag if sp else 0.0) + collective_time(c, "all_gather", 8 * tokens * tp, tp) + sync
        b += rs + ag if sp else ar
    return f, b


def param_tensors(job: Job, layout: Layout, rank: int) -> int:
    """Parameter tensors on one GPU of pipeline rank `rank` (what per-tensor collectives count)."""
    model = job.model
    per_layer = 2 * (2 if model.family == "gpt2" else 1) + (4 + (3 if model.gated_mlp else 2)) * (2 if model.has_bias else 1)
    n = rank_layers(job, layout, rank) * per_layer
    if rank == 0:
        n += 1 + (1 if model.learned_positions else 0)
    if rank == layout.pp - 1:
        n += (2 if model.family == "gpt2" else 1) + (0 if model.tie_embeddings and layout.pp == 1 else 1)
    return n


def dp_comm_time(job: Job, layout: Layout, rank: int, m: int, cost: StageCost) -> tuple[float, float]:
    """(after-backward, before-forward) exposed data-parallel seconds of one step on pipeline rank
    `rank`, scheduled against its compute (planner/overlap.py) as the job's framework issues it."""
    fw = get_framework(job.framework)
    win = Window(forward=cost.f, backward=cost.b + cost.w, layer_forward=cost.layer_f, layer_backward=cost.layer_b,
                 layers=cost.layers, microbatches=m)
    params, experts = rank_params(job, layout, rank), rank_expert_params(job, layout, rank)
    # The dense and the expert traffic leave through the same links beside the same compute: each is hidden by
    # its share of the window, by bytes (else each would count the whole window as its own).
    dense_win = share(win, (params - experts) / params) if experts else win
    after, before = dp_exposed(job, layout, fw, params - experts, layer_params(job.model, layout.tp),
                               param_tensors(job, layout, rank), dense_win)
    if experts:  # the experts' gradients over their edp replicas, ep * etp ranks apart (the same overlap rules)
        edp, split = moe.expert_replicas(layout, layout.cp), layout.ep * layout.etp
        e_after, e_before = dp_exposed(job, layout.with_(dp=edp, tp=split, cp=1), fw, experts,
                                       experts / cost.layers if cost.layers else experts, 3,
                                       share(win, experts / params))
        after, before = after + e_after, before + e_before
    return after, before


def share(win: Window, fraction: float) -> Window:
    """The part of a compute window one of several streams of traffic on the same links can hide behind."""
    return replace(win, forward=win.forward * fraction, backward=win.backward * fraction,
                   layer_forward=win.layer_forward * fraction, layer_backward=win.layer_backward * fraction)


def step_comm_time(job: Job, layout: Layout) -> float:
    """Small all-reduces once per step, each a synchronisation: the gradient norm over tp and pp (and
    dp when FSDP shards the gradients), the logged loss over pp and dp, and under sequence
    parallelism the norms' partial gradients over tp (Megatron does the same). A framework with
    `one_scalar_allreduce` (shardwise) sends norm and loss in one all-reduce over every rank, waited for
    only when the norm needs it; otherwise the loss's reduction runs behind the next step."""
    tp, pp, d = layout.tp, layout.pp, layout.dp * layout.cp
    groups = [(tp, 1), (pp, tp * layout.dp), (pp, tp * layout.dp), (d, tp)]
    if layout.zero >= 2:
        groups.append((d, tp))
    if get_framework(job.framework).one_scalar_allreduce:
        split = tp > 1 or pp > 1 or (layout.zero >= 2 and d > 1) or layout.ep * layout.etp > 1
        groups = [(tp * pp * d, 1)] if split else []
    if layout.sequence_parallel:
        groups.append((tp, 1))
    c = job.cluster
    return sum(collective_time(c, "all_reduce", 4, n, stride) + sync_time(c) for n, stride in groups if n > 1)


def concurrent_slowdown(job: Job) -> float:
    """How much slower a rank computes while every rank computes than alone (calibrated `concurrent_slowdown`:
    the ranks share the machine's cores, memory bandwidth and caches; 1 for datasheet clusters, a device each)."""
    return max(float((job.cluster.measured or {}).get("concurrent_slowdown", 1.0)), 1.0)


def pipeline_waits(layout: Layout, m: int) -> int:
    """Exchanges that bring the busiest pipeline rank a message, per step, read from the schedule's own
    point-to-point program (`schedules.p2p.p2p_program`, what the executor runs): each may wait for its
    neighbour and, on a calibrated machine, to be woken. The step time charges them this way only for
    programs too long to time (`_program_span` times the others). An exchange that only sends is not
    counted: waiting on it costs a hand-off, not a wake-up (measured at load 3.4: GPipe, whose last rank
    waits on 8 such sends per step, runs in 1F1B's time)."""
    p, v = layout.pp, layout.vpp
    if p == 1:
        return 0
    if p * m * v > MAX_PROGRAM_ACTIONS:  # too long to build in a search: each virtual stage's receives
        last = p * v - 1
        return max(m * sum((c * p + r > 0) + (c * p + r < last) for c in range(v)) for r in range(p))
    return _program_waits(layout.schedule, p, m, v)


MAX_PROGRAM_ACTIONS = 256  # stage-micro-batches of the largest program pipeline_waits builds (~30 ms on 2 busy cores)


@lru_cache(maxsize=256)
def _program(schedule: str, p: int, m: int, v: int) -> tuple:
    """(the schedule, every rank's point-to-point program): what the executor runs for this shape."""
    from shardwise.schedules import build
    from shardwise.schedules.p2p import p2p_program

    built = build(schedule, p, m, v)
    return built, p2p_program(built)


@lru_cache(maxsize=1024)
def _program_waits(schedule: str, p: int, m: int, v: int) -> int:
    from shardwise.schedules.p2p import Exchange

    programs = _program(schedule, p, m, v)[1]
    return max(sum(isinstance(x, Exchange) and x.wait and bool(x.recvs) for x in prog) for prog in programs)


@lru_cache(maxsize=1024)
def _program_wait(schedule: str, p: int, m: int, v: int, per_rank: tuple, c: float, wake: float) -> float:
    """What the executor's point-to-point program adds to a step (`schedules.p2p.program_makespan`) over the
    simulator without transfers, at each rank's own (f, b, w): the transfers, the calibrated wake-up of a
    receive that waits for its send, where it falls, and the sends that wait for their receives (gloo's and
    NCCL's large sends), which the closed forms and the simulator, whose sends never wait, do not see
    (interleaved 1F1B at p = 2, m = 8: +35 % at zero transfer cost)."""
    from shardwise.schedules import virtual_stage
    from shardwise.schedules.p2p import program_makespan
    from shardwise.schedules.simulate import Costs, simulate

    built, programs = _program(schedule, p, m, v)
    costs = Costs(*([x[k] for x in per_rank] for k in range(3)))
    timed = program_makespan(built, programs, lambda r, a: costs.of(a.kind, virtual_stage(r, a.chunk, p), p, v), c, wake)
    return max(timed - simulate(built, costs).makespan, 0.0)


def pipeline_costs(job: Job, layout: Layout, costs: dict | None = None) -> tuple[StageCost, float]:
    """What the pipeline term is evaluated with: the slower edge rank's per micro-batch costs (every
    stage is timed at them) and one exposed activation transfer between neighbouring ranks (seconds:
    split over TP, the scatter-gather / SP layout; 0 when the framework overlaps its pipeline transfers
    with compute). The report's timeline simulates the schedule with the same numbers."""
    costs = costs or {r: stage_cost(job, layout, r) for r in pipeline_ranks(job, layout)}
    slow = max(costs.values(), key=lambda c: c.f + c.b + c.w)
    act = layout.micro_batch * local_seq(job, layout) * job.model.hidden * job.train.activation_bytes / layout.tp
    c = 0.0
    if layout.pp > 1:
        c = collective_time(job.cluster, "send_recv", act, 2, layout.dp * layout.tp * layout.cp)
        if get_framework(job.framework).p2p_overlap and not calibrated(job):
            c = interference(c, 0.0)  # sent behind compute, which it slows while it runs
    return slow, c


def step_time(job: Job, layout: Layout) -> dict:
    """Breakdown (seconds) of one step on the slowest pipeline rank."""
    fw = get_framework(job.framework)
    m = layout.num_microbatches(job.train.global_batch)
    p, v = layout.pp, layout.vpp
    ranks = pipeline_ranks(job, layout)  # first, last, and the most-layered between (stage_split)
    costs = {r: stage_cost(job, layout, r) for r in ranks}
    slow, c = pipeline_costs(job, layout, costs)
    # A stack that runs each local batch as its own pipeline schedule (NeMo AutoModel) fills and drains the
    # pipeline, and syncs the data-parallel gradients, once per run.
    runs = job.schedule_runs if p > 1 and m % max(job.schedule_runs, 1) == 0 else 1
    mr = m // runs
    span0 = runs * pipeline_makespan(layout.schedule, p, mr, v, slow.f, slow.b, slow.w, 0.0)
    # Transfers on the critical path. A calibrated machine runs the executor's own program, timed: its sends
    # wait for their receives and a rank that waits for a message pays the calibrated wake-up; beyond
    # MAX_PROGRAM_ACTIONS, each receiving exchange of the busiest rank pays it. Datasheet clusters: the
    # closed form (their search never builds the program).
    span = runs * pipeline_makespan(layout.schedule, p, mr, v, slow.f, slow.b, slow.w, c)
    p2p_sync = p2p_sync_time(job.cluster)
    if p2p_sync > 0 and p * mr * v <= MAX_PROGRAM_ACTIONS:  # the executor's own program, timed
        per_rank = tuple((x.f, x.b, x.w) for x in (costs.get(r, slow) for r in range(p)))
        span = span0 + runs * _program_wait(layout.schedule, p, mr, v, per_rank, c, p2p_sync)
    elif p2p_sync > 0:
        span += runs * pipeline_waits(layout, mr) * p2p_sync
    work = m * (slow.f + slow.b + slow.w)
    # Data-parallel traffic of each candidate rank, less the idle time that rank has: in a pipeline the
    # last micro-batch's backward ends r stage-backwards earlier on rank r, and its next forward starts
    # r stage-forwards later.
    dp = 0.0
    for r in ranks:
        after, before = dp_comm_time(job, layout, r, mr, costs[r])
        dp = max(dp, runs * (max(0.0, after - r * (slow.b + slow.w)) + max(0.0, before - r * slow.f)))
    heavy = max(ranks, key=lambda r: rank_params(job, layout, r))
    params, experts = rank_params(job, layout, heavy), rank_expert_params(job, layout, heavy)
    sharded = params
    if layout.zero >= 1:  # the experts' optimizer states shard over their own replicas
        sharded = (params - experts) / (layout.dp * layout.cp) + experts / moe.expert_replicas(layout, layout.cp)
    opt = OPTIMIZER_BYTES_PER_PARAM * sharded / kernels.hbm_rate(job.cluster)
    # Calibrated fixed costs per step: the optimizer's per-tensor work in a bare step, with FSDP the
    # dispatch of each sharded parameter tensor, and what the framework's loop adds to a bare step (the
    # `shardwise` profile's CALIBRATED_STEP_OVERHEAD: its clip, scalars and records); 0 for datasheet clusters.
    measured = job.cluster.measured or {}
    opt += float(measured.get("step_overhead_s", 0.0))
    if fw.calibrated_step_overhead:
        opt += float(measured.get(fw.calibrated_step_overhead, 0.0))
    if layout.zero >= 2 and layout.dp * layout.cp > 1:
        opt += param_tensors(job, layout, heavy) * float(measured.get("fsdp_tensor_s", 0.0))
    # DDP (ZeRO 0/1 without pipelining) wraps every micro-batch: its calibrated cost (0 for datasheet clusters).
    wrapper = 0.0
    if layout.zero < 2 and layout.pp == 1 and layout.dp * layout.cp > 1:
        wrapper = m * float(measured.get("ddp_microbatch_s", 0.0))
    if get_framework(job.framework).fp8 == "te":  # Transformer Engine casts the weights once per step
        wrapper += fp8_weight_cast(job, layout, slow.layers)
    # A calibrated machine computes at the rate measured with every rank busy; a pipeline rank that computes
    # while the others wait (the fill and drain; all of a naive schedule) runs as measured alone (1 elsewhere).
    solo = 1.0 / concurrent_slowdown(job) if p > 1 else 1.0
    alone = solo if layout.schedule == "naive" else 1.0
    return {
        "compute": m * slow.compute * alone + wrapper,
        "recompute": m * slow.recompute * alone,
        "tp_comm": m * slow.tp_comm,
        "cp_comm": m * slow.cp_comm,
        **({"ep_comm": m * slow.ep_comm} if job.model.is_moe else {}),
        "pp_p2p": span - span0,
        "pipeline_bubble": (span0 - work) * solo,
        "dp_comm": dp,
        "step_comm": step_comm_time(job, layout),
        "optimizer": opt,
    }


def step_flops(job: Job, layout: Layout) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of one step over all GPUs."""
    model_flops = model_flops_per_step(job)
    m = layout.num_microbatches(job.train.global_batch)
    # Recompute FLOPs per micro-batch summed over all ranks ~ the whole model's share once.
    stage = stage_cost(job, layout, 0)
    layers0 = rank_layers(job, layout, 0)
    per_layer_rec = stage.flops_recompute / max(layers0, 1)
    rec = per_layer_rec * job.model.num_layers * layout.tp * m * layout.dp * layout.cp
    return model_flops, model_flops + rec
