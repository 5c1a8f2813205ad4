"""Memory per GPU on the worst pipeline rank, with its breakdown (bytes).

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 4, generalised from GPT (4h FFN, h == q_dim == kv_dim, dropout) to grouped-query
attention, any FFN width and SwiGLU's three matrices. Every formula is derived in docs/planner.md.
Pure Python: the search calls these functions tens of thousands of times.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardwise.schedules.closed_forms import peak_inflight_microbatches
from shardwise.specs import ClusterSpec, Layout, ModelSpec, TrainSpec, stage_layer_counts

# CUDA context, cuBLAS/NCCL workspaces and communication buckets: a fixed allowance per GPU.
WORKSPACE_BYTES = 1.0 * 2**30
# The caching allocator cannot reuse every freed block: allow 5 % of everything else for fragmentation.
FRAGMENTATION = 0.05
# Per logit element on the last stage: bf16 logits (2) + fp32 copy for the softmax/cross-entropy (4).
LOGITS_BYTES = 6
# ZeRO-3 keeps the current and the prefetched layer gathered.
ZERO3_GATHERED_LAYERS = 2


@dataclass(frozen=True)
class Job:
    """What the planner models for one training job (the specs plus two facts about the software).

    flash_attention: the attention core is one fused kernel (FlashAttention / SDPA) that never stores
    the s x s scores and recomputes them in backward. Off = the paper's materialised softmax.
    context_parallel: sequence split over cp ranks (Megatron CP); not searched, used to check
    published runs that ran with it. The job then occupies dp * tp * pp * cp GPUs.
    tp_comm_overlap: TP collectives are split and pipelined with the GEMMs that produce/consume them
    (Transformer Engine userbuffers, NeMo's tp_comm_overlap); off = Megatron 2022, fully exposed.
    """

    model: ModelSpec
    cluster: ClusterSpec
    train: TrainSpec
    flash_attention: bool = False
    context_parallel: int = 1
    tp_comm_overlap: bool = False

    @property
    def tokens_per_sequence_per_gpu(self) -> int:
        return self.train.seq_len // self.context_parallel


# --------------------------------------------------------------------------- activations


def layer_activation_terms(model: ModelSpec, s: int, b: int, tp: int, sp: bool, e: int = 2) -> tuple[float, float]:
    """(linear, scores): bytes one layer stores for backward, per GPU, without recompute.

    linear  — terms proportional to s*b (Korthikanti's 34 s*b*h for GPT without parallelism);
    scores  — the s^2 terms of the materialised softmax (5 a s^2 b for GPT).
    With TP, the block inputs and layer-norm inputs are replicated on every TP rank unless sequence
    parallelism splits them along s; everything inside the attention and the MLP is split by TP.
    """
    h, q, kv, f, a = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden, model.num_heads
    mask = 1 if model.family == "gpt2" else 0  # GPT trains with dropout (1-byte masks); Llama recipes do not
    # LN1 input, QKV input, LN2 input, FC1 input (e each) + attention-out and MLP-out dropout masks.
    replicated = s * b * h * (4 * e + 2 * mask)
    # Q and K (for QK^T), V (for softmax @ V), and the input of the output projection.
    attention = s * b * e * ((q + kv) + kv + q)
    # GELU MLP: GELU input and output (2 f-wide); SwiGLU: gate, up and their product (3 f-wide).
    mlp = s * b * f * e * (3 if model.gated_mlp else 2)
    # Softmax output (e), dropout mask (1) and dropout output (e) per score, for every head.
    scores = a * s * s * b * (e + (1 + e) * mask)
    linear = replicated / (tp if sp else 1) + (attention + mlp) / tp
    return linear, scores / tp


def checkpoint_bytes(model: ModelSpec, s: int, b: int, tp: int, sp: bool, e: int = 2) -> float:
    """Full recompute keeps only each layer's input (split along s by sequence parallelism)."""
    return s * b * model.hidden * e / (tp if sp else 1)


def stage_activation_bytes(job: Job, layout: Layout, layers: int, inflight: float) -> float:
    """Activations of `layers` layers with `inflight` micro-batches held at once."""
    s, b, e = job.tokens_per_sequence_per_gpu, layout.micro_batch, job.train.activation_bytes
    linear, scores = layer_activation_terms(job.model, s, b, layout.tp, layout.sequence_parallel, e)
    if job.flash_attention:
        scores = 0.0  # the fused kernel never stores the s x s scores
    held = layers * inflight
    if layout.recompute == "none":
        return held * (linear + scores)
    if layout.recompute == "selective":
        return held * linear  # the attention core (the s^2 part) is recomputed
    # full: every layer input is kept; the layer being recomputed holds its full set once
    # (its attention core in a fused kernel), so the total never exceeds selective's.
    ckpt = checkpoint_bytes(job.model, s, b, layout.tp, layout.sequence_parallel, e)
    return max(held - 1, 0) * ckpt + min(held, 1) * linear


# --------------------------------------------------------------------------- model states


def rank_layers(num_layers: int, pp: int, vpp: int, rank: int) -> int:
    """Layers on pipeline rank `rank`: its vpp chunks, ceil/floor of L/(pp*vpp) each (extras go first)."""
    return sum(stage_layer_counts(num_layers, pp * vpp)[rank::pp])


def rank_params(model: ModelSpec, layout: Layout, rank: int) -> float:
    """Parameters held by one GPU of pipeline rank `rank` (matrices split by TP, vocab-parallel embedding)."""
    p = rank_layers(model.num_layers, layout.pp, layout.vpp, rank) * model.params_per_layer()
    if rank == 0:
        p += model.embedding_params()
    if rank == layout.pp - 1:
        p += model.head_params()
        if model.tie_embeddings and layout.pp > 1:
            p += model.vocab_size * model.hidden  # the last stage keeps its own copy of the tied matrix
    return p / layout.tp


def model_state_bytes(job: Job, layout: Layout, params: float) -> dict[str, float]:
    """Weights, gradients and optimizer states of `params` parameters under the layout's ZeRO stage.

    ZeRO shards over the data-parallel group (times CP, as Megatron's distributed optimizer does):
    stage 1 the optimizer states, stage 2 also the gradients, stage 3 also the weights — which then
    need the current and the prefetched layer gathered in full.
    """
    t, d = job.train, layout.dp * job.context_parallel
    zero = layout.zero if d > 1 else 0
    weights = t.weight_bytes * params
    grads = t.grad_bytes * params
    optim = t.optimizer_bytes * params
    if zero >= 1:
        optim /= d
    if zero >= 2:
        grads /= d
    if zero >= 3:
        layer = job.model.params_per_layer() / layout.tp
        gathered = min(ZERO3_GATHERED_LAYERS * layer, params)
        weights = t.weight_bytes * (params / d + gathered * (1 - 1 / d))
    return {"weights": weights, "gradients": grads, "optimizer": optim}


# --------------------------------------------------------------------------- per GPU


def rank_memory(job: Job, layout: Layout, rank: int) -> dict[str, float]:
    """Breakdown (bytes) for one GPU of pipeline rank `rank`."""
    m = layout.num_microbatches(job.train.global_batch)
    inflight = peak_inflight_microbatches(layout.schedule, layout.pp, m, layout.vpp, stage=rank)
    layers = rank_layers(job.model.num_layers, layout.pp, layout.vpp, rank)
    out = model_state_bytes(job, layout, rank_params(job.model, layout, rank))
    out["activations"] = stage_activation_bytes(job, layout, layers, inflight)
    logits = 0.0
    if rank == layout.pp - 1:  # logits and the fp32 loss buffers of one micro-batch
        logits = job.tokens_per_sequence_per_gpu * layout.micro_batch * job.model.vocab_size / layout.tp * LOGITS_BYTES
    out["logits"] = logits
    out["workspace"] = WORKSPACE_BYTES + FRAGMENTATION * sum(out.values())
    return out


def memory_breakdown(job: Job, layout: Layout) -> tuple[int, dict[str, float]]:
    """(worst pipeline rank, its breakdown in bytes). The first and last ranks are the candidates:
    the first holds the embedding and the most micro-batches in flight, the last the LM head and logits."""
    ranks = {0, layout.pp - 1}
    best = max(((r, rank_memory(job, layout, r)) for r in sorted(ranks)), key=lambda x: sum(x[1].values()))
    return best


def total_bytes(breakdown: dict[str, float]) -> float:
    return sum(breakdown.values())
