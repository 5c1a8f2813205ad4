"""Time of one optimizer step, with its breakdown (seconds), and the FLOPs behind MFU and HFU.

Per pipeline rank and micro-batch: its layers (planner/layer_time.py), the embedding and the head with
its loss, recompute and the TP edges. The pipeline's makespan comes from
`shardwise.schedules.closed_forms.uneven_makespan` (the closed form the schedule simulator is tested against, with
each rank's fill and drain at its own cost; DeepSpeed's lockstep schedule: plus `closed_forms.lockstep_transfers`); data-parallel traffic is scheduled against the compute beside it (planner/overlap.py); the
optimizer step runs at HBM bandwidth. On a calibrated cluster (`shardwise calibrate`) the measured rates
and per-call costs replace the datasheet models (docs/accuracy.md).

FLOPs follow the PaLM paper (Chowdhery et al. 2022, App. B): model FLOPs per token are
6 N_matmul + 12 L w s (attention scores and their product with V, forward + backward, causal masking not
discounted; w the attention core's width, ModelSpec.attention_width: q_dim, or heads x (qk + v) / 2 under MLA;
s the window instead on the layers that attend through one shorter than the sequence, as MaxText counts them)
plus the LM head. Hardware FLOPs add what recompute runs again.
Constants and their sources: docs/planner.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from shardwise import stage_split
from shardwise.frozen import replaced
from shardwise.planner import kernels, moe, offload
from shardwise.planner.comm import collective_time, p2p_sync_time, sync_time, tp_call_time
from shardwise.planner.frameworks import get as get_framework
from shardwise.planner.layer_time import (achievable_flops, cache_key, calibrated, elementwise_mode, fp8_weight_cast, layer_cost,
                                          LayerCost, fc2_flops, matmul_params_per_layer, paced,
                                          tp_element_bytes)
from shardwise.planner.job import Job, per_rank_job
from shardwise.planner.memory import (expert_replicas, layer_params, local_seq, node_gpus, offload_shard, op_checkpointing,
                                      pipeline_ranks, rank_expert_params, rank_layers, rank_params,
                                      rank_recomputed_layers, split_rule)
from shardwise.planner.overlap import Window, dp_exposed, fp8_gathered
from shardwise.schedules.closed_forms import lockstep_transfers, uneven_makespan
from shardwise.specs import Layout

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
#     (4 + 4 + 4 + a sum pass 4) and the cast back (4 + 2) = 26;
#   "composer": llm-foundry's MPT loss, flash-attn's xentropy kernel on the BF16 logits (a max and a sum pass, 2 + 2;
#     backward reads them and writes the gradient, 2 + 2), plus Composer's training metrics, computed every
#     micro-batch on the same logits (composer v0.16.4 trainer.py _eval_train_metrics; MPT's LanguageCrossEntropy and
#     LanguagePerplexity): two F.cross_entropy under BF16 autocast, whose log_softmax runs in FP32 (cast 2 + 4, then
#     22 - 6 = 16 as "eager"): 4 + 2 x 22 = 48 forward, 4 backward.
#   "xentropy": flash-attn's xentropy kernel alone on the BF16 logits (Lit-GPT's FusedCrossEntropyLoss, TinyLlama's
#     pretrain/tinyllama.py): the "composer" loss without Composer's metrics, 4 forward, 4 backward.
#   "flash-attn": flash-attn's training code (its GPT recipes' base.yaml: flash_attn.losses.cross_entropy), the xentropy
#     kernel on the 16-bit logits, then its Perplexity metric, updated every micro-batch on the same logits without
#     the loss (training/src/metrics/perplexity.py), runs that kernel's forward again: 4 + 4 forward, 4 backward.
#   "compiled": F.cross_entropy(logits.float()) under torch.compile (torchtitan's compile.components "loss", OLMo-core's
#     compile_loss): Inductor keeps the cast in registers and runs the log-softmax as a looped reduction over each BF16
#     row, a max pass and a sum-of-exponentials pass (2 + 2), writing only per-token statistics; backward recomputes the
#     softmax from the logits and writes the BF16 gradient (2 + 2): 4, 4.
LOSS_BYTES = {"megatron": (38, 14), "fused": (10, 6), "eager": (22, 26), "composer": (48, 4), "xentropy": (4, 4),
              "flash-attn": (8, 4), "compiled": (4, 4)}
# Gemma 2's soft-cap of its final logits, cap * tanh(logits / cap), in the model's code before any of those losses
# (transformers' Gemma2ForCausalLM, NeMo's Gemma 2 output layer), in units of the activations' bytes e per logit:
# eager, three element-wise kernels (divide, tanh, multiply) each reading and writing the logits, 6e; backward, the
# multiply's and the divide's gradients (2e each) and tanh's, which reads the gradient and its kept output (3e), 7e.
# Eager under --compile too: the cap runs after the LM head, outside the blocks torch.compile wraps (torchtitan
# compiles each block and the loss, not the model's output code).
SOFTCAP_PASSES = (6, 7)


def flop_params(model) -> float:
    """The parameters PaLM's count multiplies per token: every layer's matrices (a token's experts only) and the LM
    head's, not the embedding lookup's."""
    return model.num_layers * matmul_params_per_layer(model) + model.hidden * model.vocab_size


def model_flops_per_step(job: Job) -> float:
    """PaLM model FLOPs of one step over the whole job (forward + backward, no recompute)."""
    return 6 * flop_params(job.model) * job.train.seq_len * job.train.global_batch + attention_flops_per_step(job)


def attention_flops_per_step(job: Job) -> float:
    """The attention cores' share of model_flops_per_step: PaLM's 12 x layers x width x keys per token, unmasked, the
    keys the sequence or, on a layer that attends through a shorter sliding window, the window (ModelSpec.attended_keys)."""
    m, s = job.model, job.train.seq_len
    return 12 * m.num_layers * m.attention_width * m.attended_keys(s) * s * job.train.global_batch


def layer_flops(job: Job, layout: Layout, tokens: int) -> tuple[float, float]:
    """(matmul, attention core) forward FLOPs of one layer, one micro-batch, one GPU (PaLM's count, as above)."""
    model = job.model
    return (2 * tokens * matmul_params_per_layer(model) / layout.tp,
            4 * tokens * model.attended_keys(job.train.seq_len) * model.attention_width / layout.tp)


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
    host_wait: float = 0.0  # a GPU's time waiting on its host beyond the device's work (inside f, b, w; host_floor_time)


def stage_cost(job: Job, layout: Layout, rank: int) -> StageCost:
    """Per micro-batch costs of pipeline rank `rank` (cached: the search asks for the same ones often)."""
    job = per_rank_job(job, layout.tp)
    return _stage_cost(job, layout, rank, *cache_key(job))


@lru_cache(maxsize=4096)
def _stage_cost(job: Job, layout: Layout, rank: int, in_situ: float, measured: str) -> StageCost:
    model, tp = job.model, layout.tp
    tokens = layout.micro_batch * local_seq(job, layout)
    layers = rank_layers(job, layout, rank)
    moe_layers = moe.rank_moe_layers(model, layout, rank, job.train.seq_len, split_rule(job))
    lc, slowest = rank_layer_cost(job, layout, layers, moe_layers)
    oh = lc.overhead / 3
    edge_f, edge_b = (a + b for a, b in zip(tp_edge_time(job, layout, rank, tokens),
                                           pipe_regather_time(job, layout, rank, tokens)))
    f = layers * (lc.fwd + lc.tp_fwd + lc.cp_fwd + lc.ep_fwd + oh) + edge_f
    cast = 0.0  # weights cast again every micro-batch, inside each layer's forward (torchao's Float8Linear)
    if job.precision == "fp8" and get_framework(job.framework).fp8 != "te":
        cast = fp8_weight_cast(job, layout, layers)
    f += cast
    f += autocast_cast_time(job, layout, rank) * slowest
    b_in = layers * (lc.bwd_in + lc.tp_bwd + lc.cp_bwd + lc.ep_bwd + oh) + edge_b
    w = layers * (lc.bwd_w + oh) + accumulation_time(job, layout, rank) * slowest
    if layout.schedule == "zb-h1" and layout.pp > 1 and rank > 0:  # I and W walk the graph apart (calibrated)
        w += layers * float((job.cluster.measured or {}).get("split_backward_s", 0.0))
    mm_flops, attn_flops = layer_flops(job, layout, tokens)
    flops_model = layers * 3 * (mm_flops + attn_flops)
    redone = rank_recomputed_layers(job, layout, rank)  # full recompute: all layers, or --recompute-layers' share
    rec, flops_rec, rec_tp, rec_cp = recompute_terms(job, layout, lc, slowest, tokens, layers, redone, moe_layers)
    if layout.recompute == "full":  # each recomputed layer's weights cast again under autocast
        rec += redone * recompute_cast_time(job, layout, rank) * slowest
    if rank == layout.pp - 1:  # LM head: logits forward, their input and weight gradients, the loss
        hf, hb, hw = (t * slowest for t in head_time(job, layout, tokens))
        f, b_in, w = f + hf, b_in + hb, w + hw
        flops_model += 3 * 2 * tokens * model.hidden * model.vocab_size / tp
    edge = edge_overhead(job, layout, rank) / 3  # a third per pass, as a layer's
    f, b_in, w = f + edge, b_in + edge, w + edge
    host, device = host_floor_time(job, layout, rank, layers), f + b_in + w
    lift = host / device if host > device > 0 else 1.0  # a GPU's stage bound by its host: the host's time
    f, b_in, w, host_wait = f * lift, b_in * lift, w * lift, (lift - 1) * device
    tp_comm = layers * (lc.tp_fwd + lc.tp_bwd) + edge_f + edge_b + rec_tp
    cp_comm = layers * (lc.cp_fwd + lc.cp_bwd) + rec_cp
    rec_ep = redone * lc.ep_fwd  # full recompute dispatches again
    if moe_layers and job.moe_recompute == "moe" and layout.recompute != "full":  # Megatron's MoE recompute
        mlc = layer_cost(job, layout, moe_layer=True)
        rec, rec_ep = rec + moe_layers * mlc.ffn_fwd, moe_layers * mlc.ep_fwd
    ep_comm = layers * (lc.ep_fwd + lc.ep_bwd) + rec_ep
    compute = f + b_in + w - layers * (lc.tp_fwd + lc.tp_bwd + lc.cp_fwd + lc.cp_bwd + lc.ep_fwd + lc.ep_bwd) - edge_f - edge_b \
        - host_wait
    return StageCost(f=f, b=b_in + rec + rec_tp + rec_cp + rec_ep, w=w, compute=compute, recompute=rec, tp_comm=tp_comm,
                     flops_model=flops_model, flops_recompute=flops_rec, layers=layers,
                     # the window a prefetched gather hides behind: the layer's whole forward, its weight cast included
                     layer_f=(lc.fwd + lc.tp_fwd + lc.cp_fwd + lc.ep_fwd + oh + cast / max(layers, 1)) * lift,
                     layer_b=(lc.bwd_in + lc.bwd_w + lc.tp_bwd + lc.cp_bwd + lc.ep_bwd + 2 * oh) * lift + rec / max(layers, 1),
                     cp_comm=cp_comm, ep_comm=ep_comm, host_wait=host_wait)



def rank_layer_cost(job: Job, layout: Layout, layers: int, moe_layers: int) -> tuple[LayerCost, float]:
    """The mean layer of a pipeline rank with `moe_layers` of its `layers` MoE ones, as this stack runs it, and the
    straggler factor its compute terms carry (the job computes at its slowest GPU's pace)."""
    slowest = straggler(job, layout)
    # a DTensor plan keeps the gathered input (Framework.dtensor_sp), and a full recompute gathers it again (rec_tp):
    # only op-level selective checkpointing, which recomputes the gather, gathers in the backward
    kept = get_framework(job.framework).dtensor_sp and not op_checkpointing(job, layout)

    def as_run(lc: LayerCost, paired_share: float) -> LayerCost:  # before the host's floor, which bounds the whole pass
        if kept:
            lc = replaced(lc, dict(tp_bwd=lc.tp_bwd - lc.tp_regather, tp_regather=0.0))
        return paced(lc, paired_share, slowest)

    lc = as_run(layer_cost(job, layout), 1.0)
    if moe_layers:
        # under the EP overlap, warm-up forwards and cool-down backwards have no partner to hide behind
        share = moe.paired_share(layout, layout.num_microbatches(job.train.global_batch)) if job.ep_comm_overlap else 1.0
        lc = lc.mix(as_run(layer_cost(job, layout, moe_layer=True), share), moe_layers / layers)
    return lc, slowest


def recompute_terms(job: Job, layout: Layout, lc: LayerCost, slowest: float, tokens: int, layers: int, redone: int,
                    moe_layers: int) -> tuple[float, float, float, float]:
    """(time, FLOPs, TP traffic, K/V traffic) a stage runs again in backward for its recompute, with the calibrated
    cost of each checkpointed region (0 on datasheet clusters)."""
    model, tp, oh = job.model, layout.tp, lc.overhead / 3
    mm_flops, attn_flops = layer_flops(job, layout, tokens)
    ckpt = float((job.cluster.measured or {}).get("checkpoint_overhead_s", 0.0))
    if layout.recompute == "full":  # a layer checkpointed whole: its own measured cost, where calibrate timed it
        # (calibrate.compute.full_checkpoint_overhead: beyond the forward less the FC2 an early stop skips, so the saving
        # scales with the model planned, not the calibration's)
        ckpt = float((job.cluster.measured or {}).get("full_checkpoint_overhead_s", ckpt))
        rec, flops_rec = redone * (lc.fwd + oh + ckpt), redone * (mm_flops + attn_flops)
        if get_framework(job.framework).recompute_early_stop and lc.fwd_tail:  # FC2 not run again (Framework)
            rec -= redone * lc.fwd_tail * slowest  # the mean layer's: 0 for the MoE ones
            flops_rec -= redone * (1 - moe_layers / max(layers, 1)) * fc2_flops(model, tokens, tp)
        return rec, flops_rec, redone * lc.tp_fwd, redone * lc.cp_fwd  # its TP collectives and K/V traffic again
    if op_checkpointing(job, layout):
        return layers * (lc.op_recompute * slowest + ckpt), layers * lc.op_recompute_flops, 0.0, 0.0
    if layout.recompute == "selective" and job.recompute_modules:  # Megatron's named modules, each run again
        rec = layers * ckpt + module_recompute(job, layout, tokens, layers, moe_layers)
        if "core_attn" in job.recompute_modules:
            return rec + layers * lc.attn_fwd, layers * attn_flops, 0.0, layers * lc.cp_fwd
        return rec, 0.0, 0.0, 0.0
    if layout.recompute == "selective":
        return layers * (lc.attn_fwd + ckpt), layers * attn_flops, 0.0, layers * lc.cp_fwd
    return 0.0, 0.0, 0.0, 0.0

def autocast_cast_time(job: Job, layout: Layout, rank: int) -> float:
    """Seconds per micro-batch of the forward's casts of this rank's FP32 weights to the compute type, where the stack
    keeps FP32 parameters under autocast (Framework.autocast_cast_bytes), at HBM bandwidth."""
    per = get_framework(job.framework).autocast_cast_bytes
    if not per or calibrated(job):
        return 0.0
    return per * rank_params(job, layout, rank) / kernels.hbm_rate(job.cluster)


def recompute_cast_params(job: Job, layout: Layout, rank: int = 0) -> float:
    """Parameters of the mean fully recomputed layer of pipeline rank `rank` whose FP32 weights the recompute casts
    again, where the stack keeps them FP32 under autocast (Framework.autocast_cast_bytes): torch.utils.checkpoint
    re-enters the forward's autocast for the recompute, a region of its own whose weight cache starts empty. Every
    linear's weight and bias, FC2's too under early stop (its BF16 weight is a tensor its backward saved, so the
    recompute runs the cast and stops before the GEMM); not the norms' (applied in FP32). In MoE layers every local
    routed expert's too: the runtime slices each expert's matrices out of its stacked parameter, a view autocast never
    caches, cast again whether or not the expert got tokens (shardwise.moe.Experts)."""
    if not get_framework(job.framework).autocast_cast_bytes:
        return 0.0
    experts = rank_expert_params(job, layout, rank) / max(rank_layers(job, layout, rank), 1)
    return layer_params(job.model, layout.tp) - job.model.layer_norm_params + experts


def recompute_cast_time(job: Job, layout: Layout, rank: int = 0) -> float:
    """Seconds of recompute_cast_params' casts (read FP32, write the compute type), at HBM bandwidth; 0 on a calibrated
    cluster, whose measured layer costs hold the casts its precision makes."""
    if calibrated(job):
        return 0.0
    per = get_framework(job.framework).autocast_cast_bytes
    return per * recompute_cast_params(job, layout, rank) / kernels.hbm_rate(job.cluster)


def accumulation_time(job: Job, layout: Layout, rank: int) -> float:
    """Seconds per micro-batch, on average over the step, of the framework's gradient accumulation outside the
    weight-gradient GEMMs (Framework.grad_accumulation_bytes): one pass over this rank's local gradients at HBM
    bandwidth after each micro-batch's backward (m - 1 of the m when the first gradient is taken as it is), and the
    gradient's cast to FP32 before it, every micro-batch (Framework.grad_cast_bytes). Sharded gradients (ZeRO-2/3) are
    reduced every micro-batch instead: their add is not counted, unless the stack holds them unsharded under FSDP's
    no_sync() (Framework.fsdp_no_sync)."""
    fw = get_framework(job.framework)
    if calibrated(job):
        return 0.0
    added = 0.0
    if fw.grad_accumulation_bytes and (layout.zero_in_effect < 2 or fw.fsdp_no_sync):
        m = layout.num_microbatches(job.train.global_batch)
        added = ((m - 1) / m if fw.grad_accumulation_first_free else 1.0) * fw.grad_accumulation_bytes
    return (fw.grad_cast_bytes + added) * rank_params(job, layout, rank) / kernels.hbm_rate(job.cluster)


def module_recompute(job: Job, layout: Layout, tokens: int, layers: int, moe_layers: int) -> float:
    """Seconds per micro-batch of the element-wise modules Megatron recomputes by name: "layernorm" runs a layer's
    two norms again (a pass over h per token, 1/tp of them under SP), "moe_act" the experts' activation (k c f_e
    gated elements per routed token, 1/tp of the tokens). Both at HBM bandwidth (kernels.ELEMENTWISE's bytes)."""
    model, c, tp = job.model, job.cluster, layout.tp
    norm, _, swiglu, gelu, _ = kernels.ELEMENTWISE[elementwise_mode(job)]
    norm = norm.get(model.family, norm["llama"]) if isinstance(norm, dict) else norm
    scale = job.train.activation_bytes / 2  # the byte counts are for 2-byte activations
    t = 0.0
    if "layernorm" in job.recompute_modules:
        t += layers * tokens * 2 * norm * model.hidden / (tp if layout.sequence_parallel else 1) * scale
    if "moe_act" in job.recompute_modules and moe_layers:
        width = model.experts_per_token * job.capacity_factor * model.moe_ffn_hidden
        t += moe_layers * tokens / tp * (swiglu if model.gated_mlp else gelu) * width * scale
    return t / kernels.hbm_rate(c)


# The [measured] keys of a GPU calibration's host floor (calibrate.compute.host_floor): per layer, embedding, head.
HOST_FLOOR_KEYS = ("host_layer_s", "host_embedding_s", "host_head_s")


def host_floor_time(job: Job, layout: Layout, rank: int, layers: int) -> float:
    """Seconds per micro-batch, forward + backward, that the host of a GPU calibrated by `calibrate` takes to launch
    pipeline rank `rank`'s work (its layers, and the embedding or the head where the rank holds them): a GPU runs its
    kernels behind the host, so a micro-batch whose kernels take less waits on the host and costs this (calibrate's
    host_layer_s, host_embedding_s, host_head_s, at a handful of tokens; 0 for datasheet clusters and CPUs, whose
    synchronous ops the calibrated overheads already add)."""
    measured = job.cluster.measured or {}
    t = layers * float(measured.get("host_layer_s", 0.0))
    t += float(measured.get("host_embedding_s", 0.0)) if rank == 0 else 0.0
    return t + (float(measured.get("host_head_s", 0.0)) if rank == layout.pp - 1 else 0.0)


# The least host time this project's runtime took to launch a layer's forward + backward on a GPU's host: gpt2 on H200
# hosts, 2.4-3.7 ms a layer and micro-batch by calibrate's floor and the host-floor sweeps, 2.0-2.6 ms in validate's
# training steps (docs/accuracy.md, "The H200 again: the host's floor"). Not a prediction: where a datasheet cluster
# prices a layer's GPU work below it, `estimate` and `explain` say that the step is likely bound by the host.
RUNTIME_HOST_LAYER_S = 2.0e-3


def host_bound_note(job: Job, layout: Layout) -> str:
    """For this project's runtime (the `shardwise` profile, the one stack whose host was measured) on a cluster that
    prices the GPU only (a datasheet's, or a GPU calibration from before the host floor): a note when one dense
    layer's GPU work per micro-batch (its compute and exposed TP/CP traffic) is under RUNTIME_HOST_LAYER_S; ""
    otherwise, on a calibration that holds the host's floor, and on a CPU's (its synchronous ops are in its times)."""
    measured = job.cluster.measured or {}
    if job.model.is_moe:  # a MoE layer's host time is priced already (moe.MOE_LAYER_HOST_S): said where it binds
        return moe_host_floor_note(job, layout)
    if job.framework != "shardwise" or measured.get("host_layer_s") or measured.get("backend") == "gloo":
        return ""
    lc = layer_cost(job, layout)
    device = lc.fwd + lc.bwd_in + lc.bwd_w + lc.tp_fwd + lc.tp_bwd + lc.cp_fwd + lc.cp_bwd  # all that keeps it busy
    if device >= RUNTIME_HOST_LAYER_S:
        return ""
    return (f"each layer's GPU work is {device * 1e3:.2f} ms a micro-batch, under the {RUNTIME_HOST_LAYER_S * 1e3:.1f} "
            f"ms or more this runtime's host took to launch one on an H200's host: the step is likely bound by the "
            f"host and slower than predicted (a larger micro-batch does more work a launch) — `shardwise calibrate` "
            f"on the GPU measures the host's floor, which the planner then holds")


def moe_host_floor_note(job: Job, layout: Layout) -> str:
    """A note when a MoE layer's time per micro-batch is the host floor fitted on published MoE runs
    (moe.MOE_LAYER_HOST_S: its GPU work ends before the host has issued the next layer's), not its GPU work; "" where
    the GPU work is longer, or on a calibrated cluster (layer_time.calibrated: no floor there)."""
    lc = layer_cost(job, layout, moe_layer=True)
    floor = moe.MOE_LAYER_HOST_S
    if not lc.host_floor or lc.fwd + lc.tp_fwd + lc.cp_fwd + lc.ep_fwd >= floor / 3:
        return ""
    return (f"each MoE layer takes the host's {floor * 1e3:.1f} ms a micro-batch (the floor fitted on published MoE runs: "
            f"the layer's GPU work is shorter), so this step is bound by the host — a larger micro-batch, less tp or "
            f"fewer micro-batches a step do more work a launch")


def edge_overhead(job: Job, layout: Layout, rank: int) -> float:
    """Calibrated fixed seconds per micro-batch of the model's edges on pipeline rank `rank`: the embedding on the
    first, the final norm, head and loss beyond the head's FLOPs on the last (`calibrate`'s embedding_overhead_s and
    head_overhead_s, split from its fitted intercept; 0 for datasheet clusters)."""
    measured = job.cluster.measured or {}
    first = float(measured.get("embedding_overhead_s", 0.0)) if rank == 0 else 0.0
    return first + (float(measured.get("head_overhead_s", 0.0)) if rank == layout.pp - 1 else 0.0)


def head_time(job: Job, layout: Layout, tokens: int) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) seconds of the LM head and the loss on the last stage."""
    model, c, tp = job.model, job.cluster, layout.tp
    vocab = model.vocab_size // tp
    if calibrated(job):
        t = 2 * tokens * model.hidden * model.vocab_size / tp / achievable_flops(job)
        return t, t, t
    fw = get_framework(job.framework)
    loss = fw.loss_run(job.compile, job.compile_loss)
    gather_f = gather_b = 0.0
    loss_vocab = vocab
    if fw.loss_gathers_logits and tp > 1:  # the whole vocabulary's BF16 logits on every TP rank (Framework)
        loss_vocab = model.vocab_size  # the loss runs over all of it
        # an all-gather into a list, each entry copied out of NCCL's buffer (2 + 2), then torch.cat (2 + 2); backward:
        # the rank's slice of the logits' gradient made contiguous (2 + 2 per local element)
        gather_f = (tp_call_time(c, "all_gather", 2 * tokens * loss_vocab, tp, layout.sequence_parallel)
                    + 8 * tokens * loss_vocab / kernels.hbm_rate(c))
        gather_b = 4 * tokens * vocab / kernels.hbm_rate(c)
    loss_f, loss_b = (n * tokens * loss_vocab / kernels.hbm_rate(c) for n in loss_bytes(job, loss))
    prec = job.precision  # the head stays BF16, at the job's in-situ share
    return (kernels.gemm_time(c, tokens, vocab, model.hidden, precision=prec) + loss_f + gather_f,
            kernels.gemm_time(c, tokens, model.hidden, vocab, precision=prec) + loss_b + gather_b,
            kernels.gemm_time(c, model.hidden, vocab, tokens, out_bytes=2 * job.train.grad_bytes, precision=prec))


def loss_bytes(job: Job, loss: str) -> tuple[float, float]:
    """(forward, backward) bytes through HBM per logit beyond the head's GEMMs: the loss's (LOSS_BYTES) and, where the
    model soft-caps its final logits, the cap's element-wise passes (SOFTCAP_PASSES)."""
    f, b = LOSS_BYTES[loss]
    if job.model.final_softcap:
        e = job.train.activation_bytes
        cap_f, cap_b = SOFTCAP_PASSES
        f, b = f + cap_f * e, b + cap_b * e
    return f, b


def tp_edge_time(job: Job, layout: Layout, rank: int, tokens: int) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch of the vocabulary-parallel edges: the embedding's
    sum over tp (first stage; a reduce-scatter under sequence parallelism, whose backward gathers),
    the LM head's input (last stage: the conjugate of a layer's entry) and the loss's all-gather of
    two fp32 statistics per token (runtime's VocabParallelCrossEntropy; Megatron's all-reduces move
    the same few bytes)."""
    tp, c = layout.tp, job.cluster
    if tp == 1 or 0 < rank < layout.pp - 1:  # no edge on this rank
        return 0.0, 0.0
    sp, per = layout.sequence_parallel, tp_element_bytes(job)
    # the embedding's output and, without SP, the head's input are the residual stream's (FP32 under autocast)
    act, stream = (tokens * job.model.hidden * n for n in per)
    ag, rs = (tp_call_time(c, k, act, tp, sp) for k in ("all_gather", "reduce_scatter"))
    stream_ar, stream_ag, stream_rs = (tp_call_time(c, k, stream, tp, sp) for k in ("all_reduce", "all_gather",
                                                                                     "reduce_scatter"))
    f = b = 0.0
    if rank == 0:
        f, b = (stream_rs, stream_ag) if sp else (stream_ar, 0.0)
        if sp and job.model.learned_positions and get_framework(job.framework).sp_scatters_positions:
            # one sequence's positions (no batch dimension), in the stream's dtype
            b += tp_call_time(c, "all_gather", local_seq(job, layout) * job.model.hidden * per.residual, tp, sp)
    if rank == layout.pp - 1:  # under SP the head's input is gathered again in backward (Megatron)
        stats = 0.0 if get_framework(job.framework).loss_gathers_logits else (  # (head_time gathers the logits)
            tp_call_time(c, "all_gather", 8 * tokens * tp, tp, sp))
        f += (ag if sp else 0.0) + stats
        b += rs + ag if sp else stream_ar
    return f, b


def pipe_regather_time(job: Job, layout: Layout, rank: int, tokens: int) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch that pipeline rank `rank` spends putting back together what its
    neighbours sent it split over TP (Framework.p2p_regathers): an all-gather of the whole activation over the TP
    group and the HBM copies around it. Every model chunk but the first receives its input, every chunk but the
    last a gradient (interleaving gives a rank `vpp` chunks). Nothing to gather without TP, or under SP (the
    tensor stays sequence-sharded)."""
    fw, tp, c = get_framework(job.framework), layout.tp, job.cluster
    if layout.pp == 1 or tp == 1 or layout.sequence_parallel or fw.p2p_regathers == (0, 0):
        return 0.0, 0.0
    act = tokens * job.model.hidden * job.train.activation_bytes
    one = tp_call_time(c, "all_gather", act, tp) + fw.p2p_regather_copies * act / kernels.hbm_rate(c)
    v = layout.vpp
    receives = (v - (rank == 0), v - (rank == layout.pp - 1))
    return tuple(n * per * one for n, per in zip(receives, fw.p2p_regathers))


def param_tensors(job: Job, layout: Layout, rank: int, routed: bool = True) -> int:
    """Parameter tensors on one GPU of pipeline rank `rank` (what per-tensor collectives count; without the routed
    experts' stacked tensors unless `routed`). A MoE layer holds the router and its experts' stacked w1 / w3 / w2 (and
    a shared expert's FFN and gate) in place of the dense FFN."""
    model = job.model
    mlp = 3 if model.gated_mlp else 2
    per_layer = model.layer_norms * model.norm_vectors + (4 * (1 + model.attention_bias) + mlp * (1 + model.ffn_bias))
    n = rank_layers(job, layout, rank) * per_layer
    if model.is_moe:  # the router, a shared expert's FFN and gate, the routed experts' stacked FFN (moe_expert_tensors)
        moe_layers = moe.rank_moe_layers(model, layout, rank, job.train.seq_len, split_rule(job))
        shared = (mlp + model.shared_expert_gate) if model.shared_ffn_hidden else 0
        n += moe_layers * (1 + shared - mlp * (1 + model.ffn_bias) + mlp * routed)
    if rank == 0:
        n += 1 + model.learned_positions + model.embed_norm * model.norm_vectors
    if rank == layout.pp - 1:
        n += model.norm_vectors + (0 if model.tie_embeddings and layout.pp == 1 else 1) + model.head_bias
    return n


def moe_expert_tensors(job: Job, layout: Layout, rank: int) -> int:
    """The routed experts' parameter tensors on one GPU of pipeline rank `rank`: each MoE layer's experts stacked into
    w1, w3 and w2 (w1 and w2 without a gated FFN)."""
    model = job.model
    return moe.rank_moe_layers(model, layout, rank, job.train.seq_len, split_rule(job)) * (3 if model.gated_mlp else 2)


def dp_comm_time(job: Job, layout: Layout, rank: int, m: int, cost: StageCost) -> tuple[float, float]:
    """(after-backward, before-forward) exposed data-parallel seconds of one step on pipeline rank
    `rank`, scheduled against its compute (planner/overlap.py) as the job's framework issues it."""
    fw = get_framework(job.framework)
    win = Window(forward=cost.f, backward=cost.b + cost.w, layer_forward=cost.layer_f, layer_backward=cost.layer_b,
                 layers=cost.layers, microbatches=m)
    params, experts = rank_params(job, layout, rank), rank_expert_params(job, layout, rank)
    edp, split = expert_replicas(job, layout), layout.ep * layout.etp
    dense = layer_params(job.model, layout.tp)
    fp8 = dense if fp8_gathered(job, layout) else 0.0  # torchao's FP8 gather: the dense linears, never the experts
    if experts and split == 1 and fw.experts_in_layer_units:  # the experts in their layers' own calls
        per_layer = dense + (experts / cost.layers if cost.layers else 0.0)
        return dp_exposed(job, layout, fw, params, per_layer, param_tensors(job, layout, rank), win, fp8)
    expert_share = _expert_link_share(job, layout, params - experts, experts, edp, split) if experts else 0.0
    after, before = dp_exposed(job, layout, fw, params - experts, dense,
                               param_tensors(job, layout, rank, routed=not experts), share(win, 1.0 - expert_share), fp8)
    if experts:  # the experts' gradients over their edp replicas, ep * etp ranks apart (the same overlap rules)
        e_after, e_before = dp_exposed(job, layout.with_(dp=edp, tp=split, cp=1, dp_shard=0), fw, experts,
                                       experts / cost.layers if cost.layers else experts,
                                       moe_expert_tensors(job, layout, rank), share(win, expert_share), experts=True)
        after, before = after + e_after, before + e_before
    return after, before


def _expert_link_share(job: Job, layout: Layout, dense: float, experts: float, edp: int, split: int) -> float:
    """The share of the compute window the experts' data-parallel traffic hides behind when the dense parameters'
    traffic runs beside it on the same links: the share of the links' time it takes — a reduction of the same dtype
    over each group, the dense one over dp x cp ranks tp apart, the experts' over their edp replicas ep x etp apart
    (their groups differ in size and in how many members share a node, so bytes alone would misplace it; either
    share alone would let both streams count the whole window as their own)."""
    nbytes = get_framework(job.framework).grad_reduce_bytes
    t_e = collective_time(job.cluster, "reduce_scatter", nbytes * experts, edp, split) if edp > 1 else 0.0
    t_d = collective_time(job.cluster, "reduce_scatter", nbytes * dense, layout.dp * layout.cp, layout.tp) \
        if layout.dp * layout.cp > 1 else 0.0
    return t_e / (t_e + t_d) if t_e + t_d > 0 else experts / (dense + experts)


def share(win: Window, fraction: float) -> Window:
    """The part of a compute window one of several streams of traffic on the same links can hide behind."""
    return replaced(win, dict(forward=win.forward * fraction, backward=win.backward * fraction,
                              layer_forward=win.layer_forward * fraction, layer_backward=win.layer_backward * fraction))


def step_comm_time(job: Job, layout: Layout) -> float:
    """Small all-reduces once per step, each a synchronisation: the gradient norm over tp and pp (and
    dp when FSDP shards the gradients), the logged loss over pp and dp, and under sequence
    parallelism the norms' partial gradients over tp (Megatron does the same). A framework with
    `one_scalar_allreduce` (shardwise) sends norm and loss in one all-reduce over every rank, waited for
    only when the norm needs it; otherwise the loss's reduction runs behind the next step. Plus a tied embedding's
    gradient all-reduce between the edge stages (tied_embedding_time)."""
    tp, pp, d = layout.tp, layout.pp, layout.dp * layout.cp
    # stages are tp * dp * cp ranks apart (rank order pp, dp, cp, tp), as tied_embedding_time has them
    groups = [(tp, 1), (pp, tp * d), (pp, tp * d), (d, tp)]
    if layout.zero >= 2:
        groups.append((d, tp))
    if get_framework(job.framework).one_scalar_allreduce:
        split = tp > 1 or pp > 1 or (layout.zero >= 2 and d > 1) or layout.ep * layout.etp > 1
        groups = [(tp * pp * d, 1)] if split else []
    if layout.sequence_parallel:
        groups.append((tp, 1))
    c = job.cluster
    scalars = sum(collective_time(c, "all_reduce", 4, n, stride) + sync_time(c) for n, stride in groups if n > 1)
    return scalars + tied_embedding_time(job, layout) + whole_experts_time(job, layout)


def whole_experts_time(job: Job, layout: Layout) -> float:
    """Seconds of the all-reduce that sums whole experts' gradients over tp (Framework.tp_sums_whole_experts: ep = etp
    = 1 under tp > 1), once a step, waited for: the busiest pipeline rank's experts in the stack's reduce dtype."""
    fw = get_framework(job.framework)
    if not (fw.tp_sums_whole_experts and job.model.is_moe and layout.tp > 1 and layout.ep * layout.etp == 1):
        return 0.0
    experts = max(rank_expert_params(job, layout, r) for r in pipeline_ranks(job, layout))
    if layout.zero >= 2:  # FSDP shards them with their blocks: each rank sums its own 1/(dp x cp) of them
        experts /= layout.dp * layout.cp
    return collective_time(job.cluster, "all_reduce", fw.grad_reduce_bytes * experts, layout.tp, 1) + sync_time(job.cluster)


def tied_embedding_time(job: Job, layout: Layout) -> float:
    """Seconds of the all-reduce that sums a tied embedding's gradient between the first and the last pipeline
    stage, which each hold a copy (this GPU's vocabulary rows, in the dtype the stack reduces gradients in), once
    a step after the last backward and before the optimizer, waited for: Megatron's embedding group
    (finalize_model_grads, _allreduce_word_embedding_grads, after the data-parallel sync has finished), DeepSpeed's
    ReduceTiedGrads instruction (PipelineEngine._exec_reduce_tied_grads, before ReduceGrads), this project's
    TiedEmbeddings.sync. The two ranks are (pp - 1) x dp x cp x tp ranks apart."""
    model, p = job.model, layout.pp
    if not model.tie_embeddings or p < 2:
        return 0.0
    rows = -(-model.vocab_size // layout.tp) * model.hidden
    fw = get_framework(job.framework)
    nbytes = rows * (fw.tied_grad_bytes or fw.grad_reduce_bytes)
    stride = (p - 1) * layout.dp * layout.cp * layout.tp
    return collective_time(job.cluster, "all_reduce", nbytes, 2, stride) + sync_time(job.cluster)


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
def _program_wait(schedule: str, p: int, m: int, v: int, per_rank: tuple, c: float, wake: float,
                  exchange: float = 0.0, spread: float = 0.0, wait_points: tuple = (), scatter: float = 0.0,
                  handoff: tuple = ()) -> float:
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
    timed = program_makespan(built, programs, lambda r, a: costs.of(a.kind, virtual_stage(r, a.chunk, p), p, v), c, wake,
                             exchange, spread, wait_points, scatter, handoff)
    return max(timed - simulate(built, costs).makespan, 0.0)


def neighbour_stride(job: Job, layout: Layout) -> int:
    """Rank distance of the pipeline's slowest neighbouring pair. Stages sit dp*tp*cp ranks apart; a pipeline that
    spans nodes has a pair across them (its interleaved wrap-around, last stage to first, too), and every
    steady-state transfer of the schedule waits for that pair's as much as for the others'."""
    stride = layout.dp * layout.tp * layout.cp
    per_node = job.cluster.gpus_per_node
    return stride if layout.pp * stride <= per_node else max(stride, per_node)


def distinct_costs(job: Job, layout: Layout) -> dict[int, StageCost]:
    """Per micro-batch costs of one pipeline rank of each kind (pipeline_ranks), by rank; `job` as one TP rank
    computes it (per_rank_job)."""
    return {r: stage_cost(job, layout, r) for r in pipeline_ranks(job, layout)}


def pipeline_costs(job: Job, layout: Layout, costs: dict | None = None) -> tuple[StageCost, float]:
    """What the pipeline term is evaluated with beside every rank's own costs (rank_costs): the slowest rank's per
    micro-batch costs (its pace is the steady state's) and one exposed activation transfer between the slowest
    neighbouring ranks (seconds: split over TP, the scatter-gather / SP layout, unless the framework sends it whole
    (Framework.p2p_split_over_tp)), whole whether or not the framework posts it behind compute: the closed form's
    sends are already asynchronous, and the transfers it charges are the ones a dependency waits for. The report's
    timeline simulates the schedule with the same numbers."""
    costs = costs or distinct_costs(job, layout)
    slow = max(costs.values(), key=lambda c: c.f + c.b + c.w)
    fw = get_framework(job.framework)
    split = layout.tp if fw.p2p_split_over_tp or layout.sequence_parallel else 1
    act = layout.micro_batch * local_seq(job, layout) * job.model.hidden * (fw.p2p_bytes or job.train.activation_bytes) / split
    c = 0.0
    if layout.pp > 1:
        stride = neighbour_stride(job, layout)
        c = collective_time(job.cluster, "send_recv", act, 2, stride)
        c += (fw.p2p_messages - 1) * collective_time(job.cluster, "send_recv", META_BYTES, 2, stride)
    return slow, c


def rank_costs(job: Job, layout: Layout, costs: dict) -> list[StageCost]:
    """Every pipeline rank's per micro-batch costs, from `costs` (those of the distinct ranks, pipeline_ranks)."""
    kinds = stage_split.rank_kinds(job.model, layout.pp, layout.vpp, job.train.seq_len, split_rule(job))
    return [costs[k] for k in kinds]


# DeepSpeed's PartitionedTensor.to_meta: a LongTensor of the shape's rank and sizes, the part count, this rank and
# the tp + 1 partition offsets (runtime/utils.py), sent ahead of its data: a few dozen bytes, a message's latency.
META_BYTES = 8 * 12


def step_time(job: Job, layout: Layout) -> dict:
    """Breakdown (seconds) of one step on the slowest pipeline rank."""
    job = per_rank_job(job, layout.tp)
    m = layout.num_microbatches(job.train.global_batch)
    costs = distinct_costs(job, layout)  # first, last, and each other kind between (stage_split.rank_kinds)
    ranks = list(costs)
    slow, c = pipeline_costs(job, layout, costs)
    # A stack that runs each local batch as its own pipeline schedule (NeMo AutoModel) fills and drains the
    # pipeline, and syncs the data-parallel gradients, once per run.
    runs = job.schedule_runs if layout.pp > 1 and m % max(job.schedule_runs, 1) == 0 else 1
    span0, span = _pipeline_spans(job, layout, costs, slow, c, runs, m // runs)
    work = m * (slow.f + slow.b + slow.w)
    # A calibrated machine computes at the rate measured with every rank busy; a pipeline rank that computes
    # while the others wait (the fill and drain; all of a naive schedule) runs as measured alone (1 elsewhere).
    solo = 1.0 / concurrent_slowdown(job) if layout.pp > 1 else 1.0
    alone = solo if layout.schedule == "naive" else 1.0
    return {
        "compute": m * slow.compute * alone + _wrapper_time(job, layout, m, slow),
        **({"host_wait": m * slow.host_wait * alone} if slow.host_wait else {}),  # a calibrated GPU bound by its host
        "recompute": m * slow.recompute * alone,
        "tp_comm": m * slow.tp_comm,
        "cp_comm": m * slow.cp_comm,
        **({"ep_comm": m * slow.ep_comm} if job.model.is_moe else {}),
        "pp_p2p": span - span0,
        "pipeline_bubble": (span0 - work) * solo,
        "dp_comm": _dp_time(job, layout, costs, runs, m // runs),
        "step_comm": step_comm_time(job, layout),
        "optimizer": _optimizer_time(job, layout, ranks),
        **({"offload": _offload_time(job, layout)} if job.offload else {}),
    }


def _offload_time(job: Job, layout: Layout) -> float:
    """The host side of the optimizer step under --offload (planner/offload.py step_time): the CPU step moves the
    bytes per parameter the stack's GPU step would (Framework.optimizer_traffic), through the node's memory."""
    fw, t = get_framework(job.framework), job.train
    return offload.step_time(fw, job.cluster, job.offload, layout.zero_in_effect, offload_shard(job, layout),
                             t.weight_bytes, fw.optimizer_traffic or OPTIMIZER_BYTES_PER_PARAM, node_gpus(job, layout),
                             layout.num_microbatches(t.global_batch))


def _pipeline_spans(job: Job, layout: Layout, costs: dict, slow: StageCost, c: float, runs: int, mr: int
                    ) -> tuple[float, float]:
    """(the step's pipeline makespan without transfers, with them) over `runs` schedules of `mr` micro-batches."""
    p, v = layout.pp, layout.vpp
    # The fill and drain cross each rank at its own cost; the steady state runs at the slowest rank's.
    kinds = stage_split.rank_kind_counts(job.model, p, v, job.train.seq_len, split_rule(job))
    ranks = tuple(((costs[r].f, costs[r].b, costs[r].w), n) for r, n in kinds)
    span0 = runs * uneven_makespan(layout.schedule, p, mr, v, ranks)
    # Transfers on the critical path. A calibrated machine runs the executor's own program, timed: its sends
    # wait for their receives and a rank that waits for a message pays the calibrated wake-up; beyond
    # MAX_PROGRAM_ACTIONS, each receiving exchange of the busiest rank pays it. Datasheet clusters: the
    # closed form (their search never builds the program).
    span = runs * uneven_makespan(layout.schedule, p, mr, v, ranks, c)
    if get_framework(job.framework).p2p_lockstep:  # DeepSpeed's TrainSchedule: every exchange on the critical path
        span = span0 + runs * lockstep_transfers(p, mr) * c
    p2p_sync = p2p_sync_time(job.cluster)
    # A calibration that timed the executor's own exchange after compute charges every exchange a rank waits on, after
    # the later of the two sides arrives, what such an exchange took there: `pipeline_exchange_s` (a send and a
    # receive posted together, both waited for, in lockstep, beyond the table's transfer; wake-up included) plus
    # `lockstep_spread` x the longer side's compute since its previous exchange (measured: the same exchange costs more
    # after a longer compute). Older calibrations: the one-way receive's wake-up where a rank arrives first.
    measured = job.cluster.measured or {}
    exchange, spread = float(measured.get("pipeline_exchange_s", 0.0)), float(measured.get("lockstep_spread", 0.0))
    wake = 0.0 if exchange > 0 else p2p_sync  # (the lockstep exchange's figure holds the wake-up of a short wait)
    # A rank that waited for its neighbour's action runs slower once woken, more after a longer wait: calibrate's two
    # ranks taking turns (`wait_penalty_points`), charged by the wait the program gives each exchange.
    waits = tuple(tuple(float(x) for x in point) for point in measured.get("wait_penalty_points", ()))
    # Who waits pays (a calibration that timed one action's scatter): the lockstep figure only where the two sides
    # arrive within that scatter, the transfer alone for the later side, a hand-off's cost for a side that waited long.
    scatter = float(measured.get("action_scatter", 0.0))
    handoff = tuple(tuple(float(x) for x in point) for point in measured.get("handoff_points", ()))
    if p2p_sync + exchange > 0 and p * mr * v <= MAX_PROGRAM_ACTIONS:  # the executor's own program, timed
        per_rank = tuple((x.f, x.b, x.w) for x in rank_costs(job, layout, costs))
        span = span0 + runs * _program_wait(layout.schedule, p, mr, v, per_rank, c, wake, exchange, spread, waits,
                                            scatter, handoff)
    elif p2p_sync + exchange > 0:  # each waited exchange of the busiest rank, after one action
        per_exchange = exchange + spread * (slow.f + slow.b + slow.w) / 2 / v if exchange > 0 else p2p_sync
        span += runs * pipeline_waits(layout, mr) * per_exchange
    return span0, span


def _dp_time(job: Job, layout: Layout, costs: dict, runs: int, mr: int) -> float:
    """Data-parallel traffic of each candidate rank, less the idle time that rank has: in a pipeline the
    last micro-batch's backward ends on rank r the backwards of ranks 0..r-1 earlier than on rank 0, and its next
    forward starts their forwards later (each at its own cost). Under interleaving that is each rank's first chunk
    alone, 1/v of its cost (the last backward and the first forward are chunk 0's); under ZB-H1 the deferred weight
    passes fill the drain but for each earlier rank's input-gradient pass beyond its weight pass, b - w (every rank
    ends together where they are equal: schedules.simulate, p 4, m 8). The slowest rank's."""
    per_rank = rank_costs(job, layout, costs)
    chunk = 1 / (layout.vpp if layout.schedule == "interleaved-1f1b" else 1)
    dp = 0.0
    for r, cost in costs.items():
        after, before = dp_comm_time(job, layout, r, mr, cost)
        drain = (sum(max(0.0, x.b - x.w) for x in per_rank[:r]) if layout.schedule == "zb-h1"
                 else chunk * sum(x.b + x.w for x in per_rank[:r]))
        fill = chunk * sum(x.f for x in per_rank[:r])
        dp = max(dp, runs * (max(0.0, after - drain) + max(0.0, before - fill)))
    return dp


def _optimizer_time(job: Job, layout: Layout, ranks) -> float:
    """The optimizer step of the rank with the most parameters, at HBM bandwidth, with its calibrated fixed costs."""
    fw = get_framework(job.framework)
    heavy = max(ranks, key=lambda r: rank_params(job, layout, r))
    params, experts = rank_params(job, layout, heavy), rank_expert_params(job, layout, heavy)
    sharded = params
    if layout.zero >= 1 and layout.dp * layout.cp > 1:  # the experts' states shard over their own replicas, as
        # moe.expert_states shards their memory
        sharded = (params - experts) / layout.shard_group + experts / expert_replicas(job, layout)
    # Calibrated fixed costs per step: the optimizer's per-tensor work in a bare step, with FSDP the
    # dispatch of each sharded parameter tensor, and what the framework's loop adds to a bare step (the
    # `shardwise` profile's CALIBRATED_STEP_OVERHEAD: its scalars and records; calibrate takes the clip's and DDP's
    # zeroing's bytes out of it, priced here per parameter, `grad_pass_bytes`); 0 for datasheet clusters.
    measured = job.cluster.measured or {}
    loop = float(measured.get(fw.calibrated_step_overhead, 0.0)) if fw.calibrated_step_overhead else 0.0
    held = params if layout.zero_in_effect < 2 else sharded  # ZeRO 0/1 keep every gradient whole
    # DDP (no pipeline: its chunks are averaged after the schedule) zeroes its bucket views in place (Framework)
    ddp = layout.zero_in_effect < 2 and layout.pp == 1 and layout.dp * layout.cp > 1
    opt = ((fw.optimizer_traffic or OPTIMIZER_BYTES_PER_PARAM) * sharded
           + (fw.grad_pass_bytes + (fw.ddp_zero_bytes if ddp else 0)) * held) / kernels.hbm_rate(job.cluster)
    if job.offload:  # none on the GPU: the host steps (_offload_time)
        opt = 0.0
    opt += float(measured.get("step_overhead_s", 0.0)) + loop
    if layout.zero_in_effect >= 2:
        opt += param_tensors(job, layout, heavy) * float(measured.get("fsdp_tensor_s", 0.0))
    return opt


def _wrapper_time(job: Job, layout: Layout, m: int, slow: StageCost) -> float:
    """What the framework's wrappers add to a step's compute."""
    # DDP (ZeRO 0/1 without pipelining) wraps every micro-batch: its calibrated cost (0 for datasheet clusters).
    wrapper = 0.0
    if layout.zero < 2 and layout.pp == 1 and layout.dp * layout.cp > 1:
        wrapper = m * float((job.cluster.measured or {}).get("ddp_microbatch_s", 0.0))
    if get_framework(job.framework).fp8 == "te":  # Transformer Engine casts the weights once per step
        wrapper += fp8_weight_cast(job, layout, slow.layers)
    return wrapper


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
