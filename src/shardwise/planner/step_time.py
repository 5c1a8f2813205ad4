"""Time of one optimizer step, with its breakdown (seconds), and the FLOPs behind MFU and HFU.

FLOPs follow the PaLM paper (Chowdhery et al. 2022, App. B): model FLOPs per token are
6 N_matmul + 12 L q_dim s (attention scores and their product with V, forward + backward,
causal masking not discounted) plus the LM head. Hardware FLOPs add what recompute runs again.
The pipeline's makespan comes from `shardwise.schedules.closed_forms.pipeline_makespan`, the same
closed form the schedule simulator is tested against. Constants and their sources: docs/planner.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardwise.planner.comm import collective_time, p2p_sync_time, sync_time
from shardwise.planner.memory import Job, pipeline_ranks, rank_layers, rank_params
from shardwise.schedules.closed_forms import pipeline_makespan
from shardwise.specs import Layout, ModelSpec

# Achievable GEMM rate: a GEMM streams its operand tiles through HBM, and the tensor cores are not
# fully fed while they do. Model: time = FLOPs / peak + FLOPs / (GEMM_INTENSITY * HBM bandwidth),
# i.e. rate = peak / (1 + (peak / HBM) / GEMM_INTENSITY) — the serial roofline at an effective
# arithmetic intensity of GEMM_INTENSITY FLOP per HBM byte (tiles re-used through L2).
# 475 gives 0.76 of peak on A100, 0.62 on H100 and 0.70 on H200 (fitted on the published runs;
# in the range large bf16 cuBLAS GEMMs sustain under training power/clock limits).
GEMM_INTENSITY = 475.0
# The attention core as one fused kernel (FlashAttention-2 forward+backward) runs at this share of
# the GEMM rate (softmax and masking between its two GEMMs).
FLASH_EFFICIENCY = 0.8
# Element-wise traffic (norms, residual adds, activation function, RoPE) in activation-sized
# reads+writes per token per layer in forward; backward moves about twice as much.
ELEMENTWISE_PASSES_HIDDEN = 10  # on h-wide tensors (replicated over TP unless sequence parallel)
ELEMENTWISE_PASSES_FFN = 3  # on f-wide tensors (split by TP)
# Materialised softmax (no fused kernel): scale, mask, softmax, dropout read and write the scores.
SCORE_PASSES = 8
# Share of the data-parallel traffic hidden behind compute (bucketed overlap: Megatron
# overlap_grad_reduce, DDP buckets, FSDP prefetch). The rest is exposed: the collectives compete
# with the GEMMs for SMs and HBM, and the last buckets cannot overlap. Fitted on published runs.
DP_OVERLAP = 0.3
# With tp_comm_overlap, the share of TP communication still exposed (chunk start-up, the first and
# last chunk of each overlapped GEMM).
TP_OVERLAP_EXPOSED = 0.2
# Bytes read+written per parameter by the Adam step: fp32 master, m, v, grad read (16) and
# master, m, v, bf16 weight written (14). The step is bound by HBM bandwidth.
OPTIMIZER_BYTES_PER_PARAM = 30


def matmul_params_per_layer(model: ModelSpec) -> int:
    h, f = model.hidden, model.ffn_hidden
    return h * model.q_dim + 2 * h * model.kv_dim + model.q_dim * h + (3 if model.gated_mlp else 2) * h * f


def model_flops_per_step(job: Job) -> float:
    """PaLM model FLOPs of one step over the whole job (forward + backward, no recompute)."""
    m, s = job.model, job.train.seq_len
    per_token = 6 * (m.num_layers * matmul_params_per_layer(m) + m.hidden * m.vocab_size) + 12 * m.num_layers * m.q_dim * s
    return per_token * s * job.train.global_batch


def achievable_flops(job: Job) -> float:
    """The calibrated rate of the model's layers (`model_tflops`), else of its GEMMs, else the roofline below."""
    measured = job.cluster.measured or {}
    rate = measured.get("model_tflops") or measured.get("matmul_tflops")
    if rate:
        return float(rate) * 1e12
    c = job.cluster
    return c.peak_flops / (1 + c.peak_flops / c.hbm_bandwidth / GEMM_INTENSITY)


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


def column_group_flops(model: ModelSpec, tokens: int, tp: int) -> tuple[float, float]:
    """Forward FLOPs (= input-gradient FLOPs) of the two column-parallel groups of a layer: q/k/v, and
    gate/up (fc1 without a gate), per GPU."""
    h = model.hidden
    return (2 * tokens * h * (model.q_dim + 2 * model.kv_dim) / tp,
            2 * tokens * h * model.ffn_hidden * (2 if model.gated_mlp else 1) / tp)


def stage_cost(job: Job, layout: Layout, rank: int) -> StageCost:
    model, tp, b = job.model, layout.tp, layout.micro_batch
    s_kv = job.train.seq_len
    tokens = b * job.tokens_per_sequence_per_gpu
    layers = rank_layers(job, layout, rank)
    rate = achievable_flops(job)
    e = job.train.activation_bytes
    hbm = job.cluster.hbm_bandwidth

    mm_flops = 2 * tokens * matmul_params_per_layer(model) / tp  # forward, one layer
    attn_flops = 4 * tokens * s_kv * model.q_dim / tp
    mm = mm_flops / rate
    if job.flash_attention:
        attn = attn_flops / (rate * FLASH_EFFICIENCY)
        scores_io = 0.0
    else:
        attn = attn_flops / rate
        scores_io = SCORE_PASSES * e * model.num_heads * tokens * s_kv / tp / hbm
    sp = tp if layout.sequence_parallel else 1
    elem = tokens * e * (ELEMENTWISE_PASSES_HIDDEN * model.hidden / sp + ELEMENTWISE_PASSES_FFN * model.ffn_hidden / tp) / hbm
    # Two all-reduces per layer in forward and two in backward (or all-gather + reduce-scatter
    # pairs with sequence parallelism: the same bytes on the wire, twice the calls). A call that comes
    # after compute also pays the calibrated cost of synchronising (0 for datasheet clusters); under
    # sequence parallelism a block's gather follows the previous scatter with only a norm between
    # them, the ranks still in lockstep, so each pair synchronises once.
    act = tokens * model.hidden * e
    sync = sync_time(job.cluster) if tp > 1 else 0.0
    if layout.sequence_parallel:
        one = collective_time(job.cluster, "all_gather", act, tp) + collective_time(job.cluster, "reduce_scatter", act, tp) + sync
    else:
        one = collective_time(job.cluster, "all_reduce", act, tp) + sync
    exposed = TP_OVERLAP_EXPOSED if job.tp_comm_overlap else 1.0
    tp_fwd = 2 * one * exposed
    # Backward: the same pairs, and under sequence parallelism one more all-gather per column-parallel
    # group (q/k/v, gate/up): its input was saved sequence-sharded and is gathered again for the weight
    # gradients (Megatron; shardwise.parallel.tensor_parallel._GatherLinears). Megatron issues it
    # asynchronously behind the group's input-gradient GEMM (Job.async_sp_regather); shardwise waits.
    tp_bwd = tp_fwd
    if layout.sequence_parallel:
        regather = collective_time(job.cluster, "all_gather", act, tp) + sync
        for group_flops in column_group_flops(model, tokens, tp):
            tp_bwd += max(0.0, regather - group_flops / rate) if job.async_sp_regather else regather * exposed
    edge_f, edge_b = tp_edge_time(job, layout, rank, tokens)

    # Calibrated fixed cost of a layer per micro-batch (op dispatch, kernel launches), a third per pass.
    oh = float((job.cluster.measured or {}).get("layer_overhead_s", 0.0)) / 3
    fwd_layer = mm + attn + scores_io + elem + tp_fwd + oh
    f = layers * fwd_layer + edge_f
    b_in = layers * (mm + 2 * attn + 2 * scores_io + 2 * elem + tp_bwd + oh) + edge_b
    w = layers * (mm + oh)
    flops_model = layers * 3 * (mm_flops + attn_flops)
    # Recompute, plus the calibrated cost of each checkpointed region (0 for datasheet clusters).
    ckpt = float((job.cluster.measured or {}).get("checkpoint_overhead_s", 0.0))
    if layout.recompute == "full":
        rec, flops_rec = layers * (fwd_layer + ckpt), layers * (mm_flops + attn_flops)
    elif layout.recompute == "selective":
        rec, flops_rec = layers * (attn + scores_io + ckpt), layers * attn_flops
    else:
        rec, flops_rec = 0.0, 0.0
    if rank == layout.pp - 1:  # LM head: logits forward, their input and weight gradients
        head_flops = 2 * tokens * model.hidden * model.vocab_size / tp
        head = head_flops / rate
        f, b_in, w = f + head, b_in + head, w + head
        flops_model += 3 * head_flops
    tp_comm = layers * (tp_fwd + tp_bwd) + edge_f + edge_b
    compute = f + b_in + w - tp_comm
    return StageCost(f=f, b=b_in + rec, w=w, compute=compute, recompute=rec, tp_comm=tp_comm,
                     flops_model=flops_model, flops_recompute=flops_rec)


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


def dp_comm_time(job: Job, layout: Layout, rank: int, m: int, window: float) -> float:
    """Exposed data-parallel time of one step on pipeline rank `rank`: gradient reduction and, with
    ZeRO, parameter gathers — one term per call, each paying the calibrated synchronisation cost.

    ZeRO-0: one all-reduce of the gradients. ZeRO-1: reduce-scatter + all-gather of the updated
    weights (the same bytes); with `zero1_broadcast_per_tensor`, an all-reduce then one broadcast per
    parameter tensor, back to back. ZeRO-2/3 shard per FSDP unit (each layer, plus a root unit per
    model chunk with the embedding, final norm and head) and reduce-scatter every micro-batch's
    gradients, so that only their shard is held (DeepSpeed's ZeRO-2; shardwise's runtime); ZeRO-2
    gathers every unit once per micro-batch (kept from forward to backward), ZeRO-3 gathers every
    unit in forward and every layer again in backward (the root stays gathered). Gradients travel
    in 16 bits (weight_bytes). DP_OVERLAP of it hides behind backward compute, at most `window`
    seconds of it.
    """
    d = layout.dp * job.context_parallel
    if d <= 1:
        return 0.0
    c, wb, stride, sync = job.cluster, job.train.weight_bytes, layout.tp, sync_time(job.cluster)
    params = rank_params(job, layout, rank)

    def calls(kind: str, sizes: list[float], extra: float = sync) -> float:
        return sum(collective_time(c, kind, wb * n, d, stride) + extra for n in sizes)

    chunks = layout.vpp if layout.pp > 1 else 1
    if layout.zero == 0:
        total = calls("all_reduce", [params / chunks] * chunks)
    elif layout.zero == 1 and job.zero1_broadcast_per_tensor:
        n = param_tensors(job, layout, rank)
        total = calls("all_reduce", [params / chunks] * chunks) + n * collective_time(c, "broadcast", wb * params / n, d, stride)
    elif layout.zero == 1:
        total = calls("reduce_scatter", [params]) + calls("all_gather", [params])
    else:
        layers = rank_layers(job, layout, rank)
        layer = job.model.params_per_layer() / layout.tp
        blocks, roots = [layer] * layers, [(params - layers * layer) / chunks] * chunks
        # FSDP's calls: the calibrated cost of one in a step beyond the table (its synchronisation and
        # its own copy-in/copy-out and hooks), else the plain synchronisation cost.
        fsdp = float((c.measured or {}).get("fsdp_call_s", sync))
        gathers, scatters = calls("all_gather", blocks + roots, fsdp), calls("reduce_scatter", blocks + roots, fsdp)
        if layout.zero == 2:
            total = m * (gathers + scatters)
        else:
            total = m * (gathers + calls("all_gather", blocks, fsdp) + scatters)
    # A calibrated profile says how much overlaps where it knows (CPU: none, collectives block the
    # compute thread); datasheet clusters use DP_OVERLAP.
    overlap = float((c.measured or {}).get("comm_overlap", DP_OVERLAP))
    hidden = min(overlap * total, window)
    return total - hidden


def step_comm_time(job: Job, layout: Layout) -> float:
    """Small all-reduces once per step, each a synchronisation: the gradient norm over tp and pp (and
    dp when FSDP shards the gradients), the logged loss over pp and dp, and under sequence
    parallelism the norms' partial gradients over tp (Megatron does the same)."""
    tp, pp, d = layout.tp, layout.pp, layout.dp * job.context_parallel
    groups = [(tp, 1), (pp, tp * layout.dp), (pp, tp * layout.dp), (d, tp)]
    if layout.zero >= 2:
        groups.append((d, tp))
    if layout.sequence_parallel:
        groups.append((tp, 1))
    c = job.cluster
    return sum(collective_time(c, "all_reduce", 4, n, stride) + sync_time(c) for n, stride in groups if n > 1)


def pipeline_receives(layout: Layout, m: int) -> int:
    """Blocking receives per step on the busiest pipeline rank: each of its virtual stages receives
    every micro-batch's activation (unless it is the first stage) and its gradient (unless the last)."""
    p, v = layout.pp, layout.vpp
    if p == 1:
        return 0
    last = p * v - 1
    return max(m * sum((c * p + r > 0) + (c * p + r < last) for c in range(v)) for r in range(p))


def pipeline_costs(job: Job, layout: Layout) -> tuple[StageCost, float]:
    """What the pipeline term is evaluated with: the slowest kind of rank's per micro-batch costs (every
    stage is timed at them; `pipeline_ranks`: first, last, and the most-layered between) and one
    activation transfer between neighbouring ranks (seconds).
    The report's timeline simulates the schedule with the same numbers."""
    costs = [stage_cost(job, layout, r) for r in pipeline_ranks(job, layout)]
    slow = max(costs, key=lambda c: c.f + c.b + c.w)
    # Activation handoff between neighbouring ranks (split over TP: scatter-gather / SP layout).
    act = layout.micro_batch * job.tokens_per_sequence_per_gpu * job.model.hidden * job.train.activation_bytes / layout.tp
    c = collective_time(job.cluster, "send_recv", act, 2, layout.dp * layout.tp * job.context_parallel) if layout.pp > 1 else 0.0
    return slow, c


def step_time(job: Job, layout: Layout) -> dict:
    """Breakdown (seconds) of one step on the slowest pipeline rank, plus the FLOP totals."""
    m = layout.num_microbatches(job.train.global_batch)
    p, v = layout.pp, layout.vpp
    ranks = pipeline_ranks(job, layout)
    slow, c = pipeline_costs(job, layout)
    span0 = pipeline_makespan(layout.schedule, p, m, v, slow.f, slow.b, slow.w, 0.0)
    # Transfers on the critical path, plus the calibrated synchronisation of every blocking receive
    # (each one, on or off the critical path, leaves a rank waiting to be woken; 0 for datasheet clusters).
    span = pipeline_makespan(layout.schedule, p, m, v, slow.f, slow.b, slow.w, c) + pipeline_receives(layout, m) * p2p_sync_time(job.cluster)
    work = m * (slow.f + slow.b + slow.w)
    # The rank with most parameters (first or last) sets the DP and optimizer time.
    heavy = max(ranks, key=lambda r: rank_params(job, layout, r))
    params = rank_params(job, layout, heavy)
    dp = dp_comm_time(job, layout, heavy, m, window=m * slow.b if layout.zero >= 2 else slow.b)
    sharded = params / (layout.dp * job.context_parallel) if layout.zero >= 1 else params
    opt = OPTIMIZER_BYTES_PER_PARAM * sharded / job.cluster.hbm_bandwidth
    # A calibrated fixed cost per step: clipping and the optimizer's per-tensor work, and with FSDP the
    # dispatch of each sharded parameter tensor (0 for datasheet clusters).
    measured = job.cluster.measured or {}
    opt += float(measured.get("step_overhead_s", 0.0))
    if layout.zero >= 2 and layout.dp * job.context_parallel > 1:
        opt += param_tensors(job, layout, heavy) * float(measured.get("fsdp_tensor_s", 0.0))
    # DDP (ZeRO 0/1 without pipelining) wraps every micro-batch: its calibrated cost (0 for datasheet clusters).
    wrapper = 0.0
    if layout.zero < 2 and layout.pp == 1 and layout.dp * job.context_parallel > 1:
        wrapper = m * float((job.cluster.measured or {}).get("ddp_microbatch_s", 0.0))
    breakdown = {
        "compute": m * slow.compute + wrapper,
        "recompute": m * slow.recompute,
        "tp_comm": m * slow.tp_comm,
        "pp_p2p": span - span0,
        "pipeline_bubble": span0 - work,
        "dp_comm": dp,
        "step_comm": step_comm_time(job, layout),
        "optimizer": opt,
    }
    return breakdown


def step_flops(job: Job, layout: Layout) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of one step over all GPUs."""
    model_flops = model_flops_per_step(job)
    m = layout.num_microbatches(job.train.global_batch)
    # Recompute FLOPs per micro-batch summed over all ranks ~ the whole model's share once.
    stage = stage_cost(job, layout, 0)
    layers0 = rank_layers(job, layout, 0)
    per_layer_rec = stage.flops_recompute / max(layers0, 1)
    rec = per_layer_rec * job.model.num_layers * layout.tp * m * layout.dp * job.context_parallel
    return model_flops, model_flops + rec
