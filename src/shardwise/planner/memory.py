"""Memory per GPU on the worst pipeline rank, with its breakdown (bytes).

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 4, generalised from GPT (4h FFN, h == q_dim == kv_dim, dropout) to grouped-query
attention, any FFN width and SwiGLU's three matrices. `SavedTensors` (planner/job.py) says which tensors the training
code keeps beyond the paper's list: the paper's accounting by default, `SHARDWISE_RUNTIME` for
shardwise's own model (measured in tests/test_pipeline_memory.py). Every formula is derived in
docs/planner.md.
Pure Python: the search calls these functions tens of thousands of times.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from shardwise.planner import moe, offload
from shardwise.planner.kernels import MATH_SCORE_TENSORS
from shardwise.planner.frameworks import get as get_framework
from shardwise.planner.overlap import fp8_gathered, param_gather_bytes
from shardwise.schedules.closed_forms import chunks_with_gradients_at_peak, peak_inflight_layers, peak_inflight_microbatches
from shardwise import stage_split
from shardwise.planner.job import PAPER, Job, SavedTensors, per_rank_job
from shardwise.specs import Layout, ModelSpec

# CUDA context, cuBLAS/NCCL workspaces and communication buckets: a fixed allowance per GPU.
WORKSPACE_BYTES = 1.0 * 2**30
# PyTorch's default caching allocator cannot reuse every freed block: allow 5 % of everything else for fragmentation
# (no steady-state measurement found; docs/planner.md "Logits, workspace" gives the bracket). With expandable
# segments the allocator frees and maps memory by the 2 MiB page, and what it cannot reuse is at most a page per
# free block: inside the workspace allowance (allocator_slack).
FRAGMENTATION = 0.05
# ZeRO-3 keeps the current and the prefetched layer gathered (FSDP's backward prefetch).
ZERO3_GATHERED_LAYERS = 2


def local_seq(job: Job, layout: Layout) -> int:
    """Tokens of each sequence on one GPU: context parallelism splits the sequence over cp ranks."""
    return job.train.seq_len // layout.cp


# --------------------------------------------------------------------------- activations


def norm_bytes(model: ModelSpec, e: int, saved: SavedTensors = PAPER) -> float:
    """Bytes one norm keeps per token: its input, or with fp32 statistics (`SavedTensors`) also those; under autocast
    (`SavedTensors.autocast_casts`) every one of them FP32."""
    h = model.hidden
    e = 4 if saved.autocast_casts else e
    if not saved.norm_fp32_stats:
        return e * h
    return e * h + 8 if model.family == "gpt2" else 4 * h + e * h + 4  # LayerNorm; RMSNorm


@lru_cache(maxsize=1024)  # asked for each pipeline rank of every layout the search checks
def layer_activation_terms(model: ModelSpec, s: int, b: int, tp: int, sp: bool, e: int = 2,
                           saved: SavedTensors = PAPER, fp8: bool = False) -> tuple[float, float]:
    """(linear, scores): bytes one layer stores for backward, per GPU, without recompute.

    linear  — terms proportional to s*b (Korthikanti's 34 s*b*h for GPT without parallelism);
    scores  — the s^2 terms of the materialised softmax (5 a s^2 b for GPT).
    With TP, the block inputs and layer-norm inputs are replicated on every TP rank unless sequence
    parallelism splits them along s; everything inside the attention and the MLP is split by TP.
    """
    h, q, kv, f, a = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden, model.num_heads
    mask = 1 if model.trains_with_dropout and saved.dropout else 0  # GPT recipes train with dropout (1-byte masks)
    # LN1 and LN2 (their inputs), QKV input, FC1 input (e each) + attention-out and MLP-out dropout masks.
    # With FP8 GEMMs (Transformer Engine) each linear keeps its input as the FP8 copy it multiplied (1 byte): the QKV
    # and FC1 inputs, the FC2 input, and beside the attention kernel's own output the projection's FP8 copy of it.
    x = 1 if fp8 else e
    inputs = s * b * 2 * x * h  # the QKV and FC1 inputs: split along s by SP, unless kept as gathered (a DTensor plan)
    if saved.autocast_casts and not sp:  # every linear its own cast of the input
        inputs = s * b * x * h * (3 + (2 if model.gated_mlp else 1))
    replicated = s * b * (2 * norm_bytes(model, e, saved) + 2 * mask * h) + (0 if saved.gathered_linear_inputs else inputs)
    # Q and K (for QK^T), V (for softmax @ V), and the input of the output projection.
    attention = s * b * (e * ((q + kv) + kv + q) + (q if fp8 else 0))
    # GELU MLP: GELU input and output (2 f-wide); SwiGLU: gate, up, their product (and silu(gate)); the last one is
    # the FC2 input.
    mlp = s * b * f * (e * ((saved.gated_mlp_tensors if model.gated_mlp else 2) - 1) + x)
    # Softmax output (e), dropout mask (1) and dropout output (e) per score, for every head.
    scores = a * s * s * b * (e + (1 + e) * mask)
    linear = replicated / (tp if sp else 1) + (attention + mlp) / tp + (inputs if saved.gathered_linear_inputs else 0)
    if saved.autocast_casts:
        linear += autocast_weight_copies(model, tp, sp)
    return linear, scores / tp


def autocast_weight_copies(model: ModelSpec, tp: int, sp: bool) -> float:
    """Bytes of the BF16 weight copies one layer's graph keeps per micro-batch under autocast (SavedTensors.
    autocast_casts): every matrix's shard, or under sequence parallelism the row-parallel ones (wo, w2) alone — the
    column-parallel groups run in the runtime's own autograd function, which keeps their FP32 weights."""
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    row = (q + f) * h
    column = h * (q + 2 * kv) + (2 if model.gated_mlp else 1) * h * f
    return 2 * (row + (0 if sp else column)) / tp


def fp8_saved(job: Job) -> bool:
    """Whether the layers keep their linears' inputs in FP8: Transformer Engine's FP8 recipe does; torchao's
    Float8Linear keeps the high-precision input and casts it again in backward."""
    return job.precision == "fp8" and get_framework(job.framework).fp8 == "te"


# Transformer Engine keeps an FP8 copy of each linear's weight and its transpose between micro-batches (the weight
# workspace it casts on the step's first micro-batch, fp8_cast_transpose_fused into weight_fp8 and weight_t_fp8:
# transformer_engine/pytorch/module/linear.py; Hopper's FP8 GEMMs take both operands K-major, so the backward's
# input-gradient GEMM reads the transpose), 2 bytes per layer parameter on top of the BF16 weights.
FP8_WEIGHT_COPY_BYTES = 2


def fp8_weight_copy_bytes(job: Job) -> int:
    """Bytes per layer parameter Transformer Engine keeps beside the weights: the FP8 copy and its transpose, or, where
    the weights are FP8 themselves (fp8_model_init: weight_bytes 1), the transpose alone."""
    return FP8_WEIGHT_COPY_BYTES - (1 if job.train.weight_bytes == 1 else 0)


def softmax_stats_bytes(model: ModelSpec, s: int, b: int, tp: int, saved: SavedTensors = PAPER) -> float:
    """What a fused attention kernel keeps instead of the scores: a log-sum-exp per head and token."""
    return s * b * model.num_heads * saved.softmax_stats_bytes / tp


def layer_matmul_outputs(model: ModelSpec, tp: int) -> list[float]:
    """Elements per token of each matmul's output in one layer, in the order an eager Llama block calls them
    (wq, wk, wv, wo, w1, [w3,] w2: pytorch/torchtitan models/llama3/model.py): column-parallel outputs split by
    tp, row-parallel ones (wo, w2) full width (partial sums, before their reduction)."""
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    return [q / tp, kv / tp, kv / tp, h] + ([f / tp, f / tp, h] if model.gated_mlp else [f / tp, h])


def op_sac_bytes(model: ModelSpec, s: int, b: int, tp: int, sp: bool, e: int = 2) -> float:
    """Bytes one layer keeps under torchtitan's op-level selective checkpointing (`selective_ac_option = "op"`,
    torchtitan distributed/activation_checkpoint.py): the block's input (the checkpoint's argument), the outputs
    of the ops in its save list — every matmul but every second one (a counter per block forward: the 1st, 3rd,
    ... are saved), the attention kernel's output and its FP32 log-sum-exp — and nothing else. torchao's Float8
    linears count the same: they call aten.mm on Float8 tensor subclasses, which run _scaled_mm beneath the
    checkpoint's dispatch mode (the torchao README's peak memory under it, 47.77 GB for Llama 3 8B, bears that out
    where keeping none would give 34 GiB)."""
    outs = layer_matmul_outputs(model, tp)
    saved_mm = sum(outs[0::2])
    attention = model.q_dim / tp * e + 4 * model.num_heads / tp
    return s * b * (model.hidden / (tp if sp else 1) * e + saved_mm * e + attention)


def checkpoint_bytes(model: ModelSpec, s: int, b: int, tp: int, sp: bool, e: int = 2) -> float:
    """Full recompute keeps only each layer's input (split along s by sequence parallelism)."""
    return s * b * model.hidden * e / (tp if sp else 1)


def op_checkpointing(job: Job, layout: Layout) -> bool:
    """Selective recompute as op-level checkpointing (torchtitan's "selective": Job.selective "op"), which saves a list
    of ops' outputs and runs the others again in backward."""
    return layout.recompute == "selective" and job.selective == "op"


def stage_activation_bytes(job: Job, layout: Layout, layers: int, inflight: float, recomputed: int | None = None) -> float:
    """Activations of `layers` layers with `inflight` micro-batches held at once: what stays saved
    between forwards and backwards, plus the working set of a layer being recomputed. Under full recompute
    `recomputed` of the layers (None: all) keep only their input and the others everything (--recompute-layers)."""
    return sum(activation_parts(job, layout, layers, inflight, recomputed))


def activation_parts(job: Job, layout: Layout, layers: int, inflight: float, recomputed: int | None = None
                     ) -> tuple[float, float]:
    """stage_activation_bytes as (saved, transient): what the layers keep between their forwards and backwards, and
    what one layer being recomputed in backward holds beyond that (its attention core, or its whole set in place of
    what it kept). The transient exists only in backward, after the loss's backward has freed its logits."""
    s, b, e = local_seq(job, layout), layout.micro_batch, job.train.activation_bytes
    linear, _ = layer_activation_terms(job.model, s, b, layout.tp, layout.sequence_parallel, e, job.saved,
                                       fp8_saved(job))
    scores = attention_core_bytes(job, layout)  # a fused kernel never stores the s x s scores, only their statistics
    held = layers * inflight
    one = min(held, 1)
    if layout.recompute == "none":
        return held * (linear + scores), 0.0
    if op_checkpointing(job, layout):
        kept = op_sac_bytes(job.model, s, b, layout.tp, layout.sequence_parallel, e)
        # the layer being recomputed in backward holds its full set once more in place of what it kept
        return held * kept, one * max(0.0, linear + scores - kept)
    if layout.recompute == "selective" and job.recompute_modules:  # Megatron's named modules
        core = "core_attn" in job.recompute_modules
        kept = linear + (0.0 if core else scores)
        if "layernorm" in job.recompute_modules:  # the two norms' outputs (the QKV and FC1 inputs) are recomputed
            kept -= 2 * s * b * e * job.model.hidden / (layout.tp if layout.sequence_parallel else 1)
        return held * kept, (one * scores if core else 0.0)  # one layer's core recomputed at a time
    if layout.recompute == "selective":  # the attention core (the s^2 part) is recomputed, one layer's at a time
        return held * linear, one * scores
    ckpt = checkpoint_bytes(job.model, s, b, layout.tp, layout.sequence_parallel, residual_bytes(job))
    recomputed = layers if recomputed is None else recomputed
    kept = (layers - recomputed) * inflight  # layers outside the recomputed ones keep their full set
    return held * ckpt + kept * (linear + scores - ckpt), recompute_working_bytes(job, layout, recomputed * inflight)


def cp_buffer_bytes(job: Job, layout: Layout) -> float:
    """The K/V a context-parallel layer holds beside the saved activations while it runs (one layer at a time, as
    layer_time.cp_layer_comm moves them): all-gather, every rank's K/V block and, in backward, their gradients before
    the reduce-scatter (torch's, two dK/dV blocks on the ring); ring, the block in use and the one arriving, and two
    gradient blocks; with shardwise's FP32 math blocks (cp_math_blocks) also their largest block's scores."""
    if layout.cp <= 1:
        return 0.0
    block, dblock = cp_kv_blocks(job, layout, layout.micro_batch * local_seq(job, layout))
    # shardwise's FP32 math blocks hold their largest block's scores several times over (kernels.MATH_SCORE_TENSORS)
    scores = MATH_SCORE_TENSORS * 4 * cp_math_scores(job, layout) if cp_math_blocks(job) else 0.0
    if layout.cp_mode != "allgather":
        return 2 * (block + dblock) + scores
    return layout.cp * block + (2 * dblock if torch_dkv_ring(job) else layout.cp * dblock) + scores


def cp_math_blocks(job: Job) -> bool:
    """Whether the stack's context-parallel blocks are shardwise's FP32 math (Framework.cp_attention "shardwise" on a
    GPU, its autocast job: parallel/context_parallel.math_block_forward / backward), which materialise each block's
    scores and accumulate and pass dK/dV in FP32. On a CPU the runtime's blocks are SDPA's fused CPU kernel."""
    return get_framework(job.framework).cp_attention == "shardwise" and job.saved.autocast_casts


def cp_math_scores(job: Job, layout: Layout) -> float:
    """Scores of the largest block a rank's math blocks compute (batch x heads on this GPU x queries x keys): the ring's
    own block (its 2c local tokens against themselves, the causal one computed whole), or in the all-gather scheme a
    chunk of c queries against the 2cp - 1 chunks before it (rank 0's second chunk, the last of the sequence)."""
    c = local_seq(job, layout) / 2
    keys = 2 * c if layout.cp_mode != "allgather" else (2 * layout.cp - 1) * c
    rows = 2 * c if layout.cp_mode != "allgather" else c
    return layout.micro_batch * job.model.num_heads / layout.tp * rows * keys


def torch_dkv_ring(job: Job) -> bool:
    """Whether the stack's context parallelism is torch's, whose backward passes dK/dV around the ring even when it
    all-gathers K/V (torch.distributed.tensor.experimental._context_parallel: _templated_ring_attention_backward's
    dkv rotater is _RotateMethod.ALL_TO_ALL whatever the rotate method)."""
    return get_framework(job.framework).cp_attention == "torch"


def cp_kv_blocks(job: Job, layout: Layout, tokens: float) -> tuple[float, float]:
    """(K/V block, its gradient's block) in bytes of `tokens` tokens on one rank: what a context-parallel layer passes
    or gathers. torch's context_parallel (torch_dkv_ring; its convert_to_f32 default) and shardwise's runtime on a
    GPU (cp_math_blocks) accumulate and pass dK/dV in FP32."""
    e = job.train.activation_bytes
    block = 2 * tokens * job.model.kv_dim / layout.tp * e
    return block, block * (4 / e if torch_dkv_ring(job) or cp_math_blocks(job) else 1)


def recompute_working_bytes(job: Job, layout: Layout, held: float) -> float:
    """Full recompute keeps every layer input; the layer being recomputed in backward holds its full
    set once more in place of its input: its linear terms and its attention core's (a fused kernel's
    softmax statistics, or a materialised softmax's s x s scores). Zero for the other policies."""
    if layout.recompute != "full":
        return 0.0
    s, b = local_seq(job, layout), layout.micro_batch
    ckpt = checkpoint_bytes(job.model, s, b, layout.tp, layout.sequence_parallel, residual_bytes(job))
    return min(held, 1) * (layer_saved_bytes(job, layout) - ckpt)


def attention_core_bytes(job: Job, layout: Layout) -> float:
    """What one layer's attention core keeps for backward: the s x s scores of a materialised softmax, or a fused
    kernel's statistics."""
    s, b, e = local_seq(job, layout), layout.micro_batch, job.train.activation_bytes
    if job.flash_attention:
        return softmax_stats_bytes(job.model, s, b, layout.tp, job.saved)
    return layer_activation_terms(job.model, s, b, layout.tp, layout.sequence_parallel, e, job.saved,
                                  fp8_saved(job))[1]


def layer_saved_bytes(job: Job, layout: Layout) -> float:
    """Everything one layer keeps for backward without recompute, per micro-batch."""
    s, b, e = local_seq(job, layout), layout.micro_batch, job.train.activation_bytes
    linear, _ = layer_activation_terms(job.model, s, b, layout.tp, layout.sequence_parallel, e, job.saved,
                                       fp8_saved(job))
    return linear + attention_core_bytes(job, layout)


def residual_bytes(job: Job) -> int:
    """Bytes per element of the residual stream between layers: FP32 under autocast (SavedTensors.autocast_casts),
    else the activations'."""
    return 4 if job.saved.autocast_casts else job.train.activation_bytes


def moe_activation_delta(job: Job, layout: Layout, rank: int, inflight: float) -> float:
    """The MoE layers of pipeline rank `rank` keep this much more than dense layers would (their routed
    path is never recomputed by selective recompute; under full recompute the layer being recomputed holds it,
    and with --recompute-layers the MoE layers outside the recomputed ones, taken in proportion, keep it)."""
    n = moe.rank_moe_layers(job.model, layout, rank, job.train.seq_len, split_rule(job))
    if not n:
        return 0.0
    if layout.recompute == "full":
        recomputed = n * rank_recomputed_layers(job, layout, rank) / max(rank_layers(job, layout, rank), 1)
        kept = (n - recomputed) * inflight * _moe_layer_delta(job, layout)
        return moe_working_delta(job, layout, rank, inflight) + kept
    return n * inflight * _moe_layer_delta(job, layout)


def moe_working_delta(job: Job, layout: Layout, rank: int, inflight: float) -> float:
    """The part of moe_activation_delta that is the recomputed layer's working set (full recompute; else 0): the
    transient a MoE stage's recompute really holds is the dense one plus this (logits_overlap). Its whole set is the
    largest of the stage's: a dense one's where a MoE layer keeps less (narrow experts beside a wide dense layer) and
    the stage holds both."""
    n = moe.rank_moe_layers(job.model, layout, rank, job.train.seq_len, split_rule(job))
    if not n or layout.recompute != "full":
        return 0.0
    layers = rank_layers(job, layout, rank)
    delta = _moe_layer_delta(job, layout)
    if delta < 0 and n < layers:
        return 0.0
    return min(n * rank_recomputed_layers(job, layout, rank) / max(layers, 1) * inflight, 1) * delta


def _moe_layer_delta(job: Job, layout: Layout) -> float:
    """What one MoE layer keeps beyond a dense one, per micro-batch (moe.layer_activation_delta, as the stack keeps
    it)."""
    s, b, e = local_seq(job, layout), layout.micro_batch, job.train.activation_bytes
    gated = job.saved.gated_mlp_tensors - (1 if job.moe_recompute == "act" else 0)
    delta = moe.layer_activation_delta(job.model, s, b, layout, e, gated, job.capacity_factor)
    if job.moe_recompute == "moe":  # only the MoE FFN's input is kept: what a dense FFN keeps beyond it goes too
        delta = -s * b * e * gated * job.model.ffn_hidden / layout.tp
    if job.saved.router_aux and job.model.aux_loss_coef:  # the load-balancing loss keeps its per-sequence expert shares
        delta += 4 * job.model.num_experts * b
    return delta


def edge_inflight(schedule: str, p: int, m: int, first: bool) -> int:
    """Micro-batches held at once by the first (or the last) virtual stage alone: what multiplies
    the embedding's and the LM head's extra bytes. Equal to the schedule simulator's per-chunk peak
    (tests/test_pipeline_memory.py): GPipe holds all m; the first stage p under 1F1B (2p for the first
    chunk of interleaved); the last stage runs each backward right after its forward, except in ZB-H1,
    which keeps the micro-batch until its delayed W pass."""
    if schedule == "naive":
        return 1
    if schedule == "gpipe":
        return m
    if schedule == "zb-h1":
        return min(p, m)
    if first:
        return min(2 * p if schedule == "interleaved-1f1b" else p, m)
    return 1


def first_stage_bytes(job: Job, layout: Layout) -> float:
    """Per micro-batch, on the first stage beyond its layers: the token ids the embedding keeps."""
    return local_seq(job, layout) * layout.micro_batch * job.saved.token_id_bytes


def last_stage_bytes(job: Job, layout: Layout) -> float:
    """Per micro-batch, on the last stage beyond its layers: the logits and the loss's buffers
    (vocab-parallel with TP), a soft-cap's tanh output where the model caps its final logits (Gemma 2: tanh keeps
    its output for backward, in the activations' dtype), and, when the runtime keeps them, the final norm's and the
    head's inputs and the targets."""
    saved, model = job.saved, job.model
    tokens = local_seq(job, layout) * layout.micro_batch
    e = job.train.activation_bytes
    kept = saved.logits_bytes + (e if model.final_softcap else 0)
    out = logit_elements(job, layout) * kept + tokens * saved.token_id_bytes
    if saved.head_inputs:
        split = layout.tp if layout.sequence_parallel else 1  # replicated over TP unless SP splits the sequence
        out += tokens * (norm_bytes(model, e, saved) + e * model.hidden) / split
    if saved.autocast_casts and not layout.sequence_parallel:  # the head's BF16 weight copy (autocast_weight_copies)
        out += 2 * model.hidden * model.vocab_size / layout.tp
    return out


def logit_elements(job: Job, layout: Layout) -> float:
    """Logits of one micro-batch on one GPU of the last stage: its tokens by the vocabulary, split over TP unless the
    stack gathers the whole vocabulary (Framework.loss_gathers_logits)."""
    split = 1 if get_framework(job.framework).loss_gathers_logits else layout.tp
    return local_seq(job, layout) * layout.micro_batch * job.model.vocab_size / split


def loss_transient_bytes(job: Job, layout: Layout) -> float:
    """What the loss's backward holds once on the last stage beyond the kept logits (SavedTensors.loss_transient_bytes)."""
    return logit_elements(job, layout) * job.saved.loss_transient_bytes


def pipeline_buffer_bytes(job: Job, layout: Layout, rank: int) -> float:
    """What pipeline rank `rank`'s stages hold beyond their layers' saved tensors, where the stack runs
    torch.distributed.pipelining's PipelineStage (Framework.torch_stage_buffers; 0 elsewhere). Per model chunk and
    micro-batch of the schedule, in units of the tensor that crosses stages (local_seq x micro-batch x hidden, split
    over TP by sequence parallelism): an activation receive buffer (every stage but the first) and a gradient receive
    buffer (every stage but the last), kept all step; and the stage output from forward to backward (every stage but
    the last). The in-flight receive buffers are the first layer's inputs, already counted, and a middle chunk's
    outputs in flight are as many: each middle chunk adds 2m tensors, whatever the schedule. The first stage adds m
    gradient buffers and its outputs in flight; the last stage the activation buffers not in flight (its logits are
    `last_stage_bytes`)."""
    p = layout.pp
    if p == 1 or not get_framework(job.framework).torch_stage_buffers:
        return 0.0
    m = layout.num_microbatches(job.train.global_batch)
    if m % max(job.schedule_runs, 1) == 0:  # buffers for the micro-batches of one schedule (Job.schedule_runs)
        m //= max(job.schedule_runs, 1)
    split = layout.tp if layout.sequence_parallel else 1
    boundary = local_seq(job, layout) * layout.micro_batch * job.model.hidden * job.train.activation_bytes / split
    held = 2 * m * layout.vpp
    if rank == 0:
        held -= m - edge_inflight(layout.schedule, p, m, first=True)
    if rank == p - 1:
        held -= m + edge_inflight(layout.schedule, p, m, first=False)
    return held * boundary


# --------------------------------------------------------------------------- model states


def split_rule(job: Job) -> str:
    """How the job's stack cuts its pipeline (stage_split.RULES): its framework's Framework.stage_split."""
    return get_framework(job.framework).stage_split


def rank_layers(job: Job, layout: Layout, rank: int) -> int:
    """Layers on pipeline rank `rank`: its vpp chunks, cut as the job's stack cuts them (stage_split)."""
    return stage_split.rank_layers(job.model, layout.pp, layout.vpp, rank, job.train.seq_len, split_rule(job))


def rank_recomputed_layers(job: Job, layout: Layout, rank: int) -> int:
    """Layers pipeline rank `rank` recomputes in full (0 unless --recompute full; all of them unless
    --recompute-layers names how many of each chunk)."""
    if layout.recompute != "full":
        return 0
    return stage_split.rank_recomputed_layers(job.model, layout.pp, layout.vpp, rank, job.train.seq_len,
                                              layout.recompute_layers, split_rule(job))


def pipeline_ranks(job: Job, layout: Layout) -> list[int]:
    """The pipeline ranks worth evaluating: one of each kind (first, last, each set of chunk sizes between)."""
    return stage_split.distinct_ranks(job.model, layout.pp, layout.vpp, job.train.seq_len, split_rule(job))


@lru_cache(maxsize=1024)
def layer_params(model: ModelSpec, tp: int) -> float:
    """Parameters of one layer on one TP rank (mean over layers): the matrices (and column-parallel biases)
    split over tp; the norms, the row-parallel biases (added after the sum) and a MoE layer's router
    replicated, as the runtime keeps them. Routed experts are not in it (`rank_expert_params`)."""
    replicated = model.layer_norm_params + model.hidden * (model.attention_bias + model.ffn_bias)  # row-parallel biases
    replicated += len(model.moe_layers) * model.num_experts * model.hidden / model.num_layers  # routers
    return (model.params_per_layer() - model.expert_params_per_layer() - replicated) / tp + replicated


def largest_module_params(model: ModelSpec, tp: int) -> float:
    """Parameters of the largest module a ZeRO-3 stack gathers on its own (Framework.zero3_max_live_params) on one TP
    rank: a layer's QKV, output projection, FC1 (both halves of a gated MLP, one module) or FC2, or the embedding."""
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    linears = (h * (q + 2 * kv), q * h, h * f * (2 if model.gated_mlp else 1), f * h, model.vocab_size * h)
    return max(linears) / tp


def rank_expert_params(job: Job, layout: Layout, rank: int) -> float:
    """The routed experts' parameters on one GPU of pipeline rank `rank` (split over ep and etp)."""
    return moe.experts_per_gpu(job.model, layout, moe.rank_moe_layers(job.model, layout, rank, job.train.seq_len, split_rule(job)))


def _rank_layer_params(job: Job, layout: Layout, rank: int) -> float:
    """This rank's layers on one GPU, routed experts aside: exact per layer for a MoE model (DeepSeek's dense
    first layers differ from its MoE layers), `layer_params` times the count otherwise."""
    model = job.model
    if not model.is_moe:
        return rank_layers(job, layout, rank) * layer_params(model, layout.tp)
    return _moe_rank_layer_params(model, layout.pp, layout.vpp, rank, job.train.seq_len, layout.tp, split_rule(job))


@lru_cache(maxsize=1 << 14)  # the search asks per rank for every ZeRO stage and recompute policy of a split
def _moe_rank_layer_params(model, pp: int, vpp: int, rank: int, seq_len: int, tp: int, rule: str) -> float:
    ids = moe._rank_layer_ids(model, pp, vpp, rank, seq_len, rule)
    moe_ids = [i for i in ids if model.is_moe_layer(i)]
    routers = len(moe_ids) * model.num_experts * model.hidden
    norms = len(ids) * model.layer_norm_params
    dense = sum(model.layer_params(i) for i in ids) - len(moe_ids) * model.num_experts * model.expert_params()
    return (dense - routers - norms) / tp + routers + norms


def rank_params(job: Job, layout: Layout, rank: int) -> float:
    """Parameters held by one GPU of pipeline rank `rank`: its layers (`layer_params`), the embedding and
    the LM head split by vocabulary rows (padded to a multiple of tp, as the runtime pads; Megatron-LM pads to a
    multiple of 128·tp, --make-vocab-size-divisible-by 128: fewer than 128 rows more per rank, left out); learned
    positions and the final norm replicated."""
    model, tp = job.model, layout.tp
    rows = -(-model.vocab_size // tp) * model.hidden  # this rank's vocabulary rows
    table = model.vocab_size * model.hidden
    p = _rank_layer_params(job, layout, rank) + rank_expert_params(job, layout, rank)
    if rank == 0:
        p += rows + model.embedding_params() - table  # positions (gpt2) are replicated
    if rank == layout.pp - 1:
        head = model.head_params()
        p += head - table + rows if not model.tie_embeddings else head
        if model.tie_embeddings and layout.pp > 1:
            p += rows  # the last stage keeps its own copy of the tied matrix
    return p


def unsharded_grad_bytes(job: Job, layout: Layout, grads_held: float = 1.0) -> float | None:
    """Bytes per parameter of gradients a ZeRO-2/3 stack holds unsharded at the activations' peak, or None where it
    holds them sharded. Every FSDP unit alike, the experts' too (torch's pipelining turns every unit's sync off):
    - FSDP under torch.distributed.pipelining (and Llama 3's FSDP) holds every gradient unsharded, in the reduce
      dtype, until its one reduce-scatter after the schedule; it creates a unit's at its first backward, so at the
      activations' peak only the `grads_held` share of them exists (rank_memory);
    - FSDP under no_sync() (Framework.fsdp_no_sync) holds every gradient unsharded, in the dtype its units compute
      in, from the first micro-batch's backward on: through the later ones' activations peaks."""
    fw = get_framework(job.framework)
    if layout.zero_in_effect < 2:
        return None
    if fw.fsdp_once_per_step(layout):
        return fw.grad_reduce_bytes * grads_held
    if fw.fsdp_no_sync and layout.num_microbatches(job.train.global_batch) > 1:
        return param_gather_bytes(job, fw)
    return None


def model_state_bytes(job: Job, layout: Layout, params: float, layers: int | None = None,
                      gathered_layers: int = ZERO3_GATHERED_LAYERS, grads_held: float = 1.0) -> dict[str, float]:
    """Weights, gradients and optimizer states of `params` parameters (`layers` of them whole layers)
    under the layout's ZeRO stage.

    ZeRO shards over the data-parallel group (times CP, as Megatron's distributed optimizer does):
    stage 1 the optimizer states, stage 2 also the gradients, stage 3 also the weights. Stages 2 and 3
    shard the weights as FSDP does and gather them in full beside the shards while they are used (a shard
    counted only where it is a copy of its own: not the optimizer's FP32 master, Framework.weight_shard_is_master,
    nor a view of whole weights ZeRO-2 never shards, Framework.zero2_reduce_every_microbatch):
    stage 2 (SHARD_GRAD_OP) keeps every unit gathered from its forward to its backward; stage 3
    (FULL_SHARD) gathers one layer at a time plus the prefetched next one (`gathered_layers`: fewer
    when a model chunk holds fewer layers, as FSDP prefetches within a chunk), and keeps the root unit
    (embedding, final norm, head: the parameters outside the layers) gathered between forward and
    backward (FSDP never reshards the root after forward).
    """
    t, d = job.train, layout.shard_group  # HSDP: the shard group's ranks, not every dp rank
    zero = layout.zero_in_effect
    weights = t.weight_bytes * params
    grads = t.grad_bytes * params
    optim = t.optimizer_bytes * params
    if zero >= 1:
        optim /= d
    fw = get_framework(job.framework)
    if zero >= 2:
        grads /= d
        gathered = params
        if zero >= 3:
            layer = layer_params(job.model, layout.tp)
            root = params - layers * layer if layers is not None else 0.0
            gathered = min(root + gathered_layers * layer, params)
            if fw.zero3_max_live_params:  # submodules gathered one at a time, up to the cap
                gathered = min(gathered, max(fw.zero3_max_live_params, largest_module_params(job.model, layout.tp)))
        # the shard beside the gathered weights, unless it is the optimizer's master or a view of the whole weights, or
        # it lives on the host (--offload params)
        own_shard = (not fw.weight_shard_is_master and not (zero == 2 and fw.zero2_reduce_every_microbatch)
                     and job.offload != "params")
        weights = t.weight_bytes * ((params / d if own_shard else 0.0) + gathered)
        if fp8_gathered(job, layout) and layers is not None:  # the layers' dense weights gathered and held in FP8
            held = min(gathered_layers, layers) if zero >= 3 else layers
            weights -= (t.weight_bytes - 1) * held * layer_params(job.model, layout.tp)
    unsharded = unsharded_grad_bytes(job, layout, grads_held)
    if unsharded is not None:
        grads = unsharded * params
    elif offload.gradients_on_host(fw, job.offload, zero):
        grads = 0.0  # each reduced partition copied to the host (planner/offload.py)
    if job.offload:  # the optimizer states and master on the host
        optim = 0.0
    return {"weights": weights, "gradients": grads, "optimizer": optim}


# --------------------------------------------------------------------------- per GPU


@dataclass(frozen=True)
class RankHoldings:
    """What one GPU of a pipeline rank holds whatever the ZeRO stage and the recompute policy: the search scores
    several of both for each split, and these terms are most of a breakdown's work, so they are cached per split."""

    # micro-batches of the stage's activations held at once: with chunks of different sizes, the layer-micro-batches
    # held at the peak (closed_forms.peak_inflight_layers) per layer of the rank
    inflight: float
    layers: int
    gathered: int  # layers ZeRO-3 keeps gathered: two (the prefetched next), fewer in a smaller chunk
    grads_held: float  # the share of its chunks whose gradients exist at the activations' peak
    params: float  # parameters outside the routed experts
    experts: float  # routed experts' parameters
    first: float  # the first stage's token ids, for every micro-batch in flight there (0 elsewhere)
    logits: float  # the last stage's logits and loss buffers, likewise
    stage_buffers: float  # what the stack's pipeline stages hold beyond the layers (pipeline_buffer_bytes)


def rank_holdings(job: Job, layout: Layout, rank: int) -> RankHoldings:
    """`RankHoldings` of pipeline rank `rank` (computed on the layout without ZeRO and recompute, so they cannot
    depend on either)."""
    return _rank_holdings(job, layout.with_(zero=0, recompute="none", recompute_layers=None, dp_shard=0), rank)


@lru_cache(maxsize=1 << 14)
def _rank_holdings(job: Job, layout: Layout, rank: int) -> RankHoldings:
    m = layout.num_microbatches(job.train.global_batch)
    chunks = stage_split.stage_layer_counts(job.model, layout.pp * layout.vpp, job.train.seq_len,
                                            split_rule(job))[rank::layout.pp]
    experts = rank_expert_params(job, layout, rank)
    first = logits = 0.0
    if rank == 0:
        first = first_stage_bytes(job, layout) * edge_inflight(layout.schedule, layout.pp, m, first=True)
    if rank == layout.pp - 1:  # logits and the fp32 loss buffers of each micro-batch in flight there
        logits = last_stage_bytes(job, layout) * edge_inflight(layout.schedule, layout.pp, m, first=False)
        logits += loss_transient_bytes(job, layout)
    layers = rank_layers(job, layout, rank)
    inflight = peak_inflight_microbatches(layout.schedule, layout.pp, m, layout.vpp, stage=rank)
    if layers and len(set(chunks)) > 1:  # chunks of different sizes: the peak weighted chunk by chunk, per layer
        inflight = peak_inflight_layers(layout.schedule, layout.pp, m, layout.vpp, rank, chunks) / layers
    return RankHoldings(
        inflight=inflight, layers=layers, gathered=min(ZERO3_GATHERED_LAYERS, max(chunks)),
        grads_held=chunks_with_gradients_at_peak(layout.schedule, layout.pp, m, layout.vpp, rank) / layout.vpp,
        params=rank_params(job, layout, rank) - experts, experts=experts, first=first, logits=logits,
        stage_buffers=pipeline_buffer_bytes(job, layout, rank))


def logits_overlap(job: Job, layout: Layout, rank: int, transient: float | None = None) -> float:
    """On the last pipeline rank, what its breakdown would count twice: a recomputed layer's backward transient
    (activation_parts; given, or worked out here) comes after its micro-batch's loss backward has freed that
    micro-batch's logits and loss buffers, so the peak holds the larger of the two, not both. `job` as rank_memory
    has it (per_rank_job)."""
    if rank != layout.pp - 1:
        return 0.0
    held = rank_holdings(job, layout, rank)
    if transient is None:
        _, transient = activation_parts(job, layout, held.layers, held.inflight,
                                        rank_recomputed_layers(job, layout, rank))
    # a recomputed MoE layer's working set is the dense one's plus its own delta (helper-233: the dense one alone
    # took the last stage's activations below its saved inputs)
    if job.model.is_moe:
        transient += moe_working_delta(job, layout, rank, held.inflight)
    # ZB-H1's input-gradient pass keeps the graph, logits included, until the weight pass: only the loss's scratch goes
    freed = loss_transient_bytes(job, layout) + (0.0 if layout.schedule == "zb-h1" else last_stage_bytes(job, layout))
    return min(transient, freed)


def rank_memory(job: Job, layout: Layout, rank: int) -> dict[str, float]:
    """Breakdown (bytes) for one GPU of pipeline rank `rank`."""
    return dict(_rank_memory(per_rank_job(job, layout.tp), layout, rank))


@lru_cache(maxsize=8192)
def _rank_memory(job: Job, layout: Layout, rank: int) -> dict[str, float]:
    # Cached: fits_memory checks rank 0 alone, then memory_breakdown weighs it beside the other candidate ranks.
    held = rank_holdings(job, layout, rank)
    layers, gathered, experts = held.layers, held.gathered, held.experts
    out = model_state_bytes(job, layout, held.params, layers, gathered, held.grads_held)
    if fp8_saved(job):  # the FP8 weight copies of the layers this GPU holds whole at once
        whole = layers if layout.zero_in_effect < 3 else min(gathered, layers)
        copy = fp8_weight_copy_bytes(job)
        out["weights"] += copy * whole * layer_params(job.model, layout.tp)
        if experts and get_framework(job.framework).fp8_experts and layers:  # and of its local experts' weights
            out["weights"] += copy * experts * whole / layers
    saved, transient = activation_parts(job, layout, layers, held.inflight, rank_recomputed_layers(job, layout, rank))
    out["activations"] = saved + transient
    if experts:  # states ZeRO-sharded over the experts' own replicas; what a MoE layer saves beyond a dense one
        t, n_moe = job.train, moe.rank_moe_layers(job.model, layout, rank, job.train.seq_len, split_rule(job))
        fw = get_framework(job.framework)
        states = _experts_offloaded(job, layout, experts, moe.expert_states(
            t.weight_bytes, t.grad_bytes, t.optimizer_bytes, layout, layout.cp, experts, experts / n_moe,
            fw.experts_in_layer_units, fw.zero3_expert_layers_gathered))
        # held unsharded as the dense ones are (model_state_bytes), on the GPU whatever --offload: the experts' FSDP
        # units too, on a mesh of one replica as on more (torchtitan wraps them either way)
        unsharded = unsharded_grad_bytes(job, layout, held.grads_held)
        if unsharded is not None:
            states["gradients"] = unsharded * experts
        out = {k: out[k] + states.get(k, 0.0) for k in out}
    out["activations"] += moe_activation_delta(job, layout, rank, held.inflight) + cp_buffer_bytes(job, layout)
    if rank == 0:
        out["activations"] += held.first
    out["activations"] += held.stage_buffers
    out["logits"] = held.logits
    out["activations"] -= logits_overlap(job, layout, rank, transient)
    out["workspace"] = WORKSPACE_BYTES + allocator_slack(job) * sum(out.values())
    return out


def _experts_offloaded(job: Job, layout: Layout, experts: float, states: dict[str, float]) -> dict[str, float]:
    """The experts' states left on the GPU under --offload: as model_state_bytes leaves the dense ones, at the stage
    that acts on the experts' own replicas (moe.expert_states)."""
    if not job.offload:
        return states
    fw, zero = get_framework(job.framework), _expert_zero(job, layout)
    out = dict(states, optimizer=0.0)
    if offload.gradients_on_host(fw, job.offload, zero):
        out["gradients"] = 0.0
    if job.offload == "params" and zero >= 2 and not fw.weight_shard_is_master:
        out["weights"] -= job.train.weight_bytes * experts / expert_replicas(job, layout)
    return out


def expert_replicas(job: Job, layout: Layout) -> int:
    """moe.expert_replicas as the job's stack shards its experts (Framework.experts_in_layer_units)."""
    return moe.expert_replicas(layout, layout.cp, get_framework(job.framework).experts_in_layer_units)


def _expert_zero(job: Job, layout: Layout) -> int:
    """The ZeRO stage as it acts on the routed experts: over their edp replicas (moe.expert_states)."""
    return layout.zero if layout.dp * layout.cp > 1 and expert_replicas(job, layout) > 1 else 0


def allocator_slack(job: Job) -> float:
    """The share of the tensors' bytes the allocator holds beyond them: FRAGMENTATION under PyTorch's default
    caching allocator, 0 where the stack runs it with expandable segments (Framework.expandable_segments)."""
    return 0.0 if get_framework(job.framework).expandable_segments else FRAGMENTATION


def memory_breakdown(job: Job, layout: Layout) -> tuple[int, dict[str, float]]:
    """(worst pipeline rank, its breakdown in bytes). The candidates: the first rank (the embedding, the
    most micro-batches in flight), the last (the LM head and logits) and, when the stage split gives
    some middle ranks more layers, the first of those."""
    rank, mem = _memory_breakdown(per_rank_job(job, layout.tp), layout)
    return rank, dict(mem)


@lru_cache(maxsize=4096)
def _memory_breakdown(job: Job, layout: Layout) -> tuple[int, dict[str, float]]:
    # Cached: the search checks a layout's memory, then its estimate asks again (memory never reads the
    # calibrated tables, which the job's hash leaves out).
    return max(((r, _rank_memory(job, layout, r)) for r in pipeline_ranks(job, layout)), key=lambda x: sum(x[1].values()))


def total_bytes(breakdown: dict[str, float]) -> float:
    return sum(breakdown.values())


def fits_memory(job: Job, layout: Layout) -> bool:
    """Whether the worst pipeline rank of `layout` fits a GPU: `memory_breakdown`'s answer, but the first rank (most
    often the worst: the embedding, the most micro-batches in flight) is checked alone first, since most layouts a
    search checks do not fit and that answers for them at a third of the work. Under --offload, and what its GPUs
    offload fits the host (host_fits)."""
    limit = job.cluster.gpu_memory_bytes
    # rank 0 is always a candidate (pipeline_ranks); the cached breakdown read as it is, no copy to sum
    if total_bytes(_rank_memory(per_rank_job(job, layout.tp), layout, 0)) > limit:
        return False
    return total_bytes(memory_breakdown(job, layout)[1]) <= limit and host_fits(job, layout)


def offload_shards(job: Job, layout: Layout) -> tuple[float, float]:
    """(dense, routed-expert) parameters of the shards one GPU of the pipeline rank with the most parameters
    offloads (--offload): each over the ranks its ZeRO stage shards it over (the experts over their own replicas)."""
    rank = max(pipeline_ranks(job, layout), key=lambda r: rank_params(job, layout, r))
    params, experts = rank_params(job, layout, rank), rank_expert_params(job, layout, rank)
    dense = (params - experts) / (layout.shard_group if layout.zero_in_effect >= 1 else 1)
    return dense, experts / (expert_replicas(job, layout) if _expert_zero(job, layout) >= 1 else 1)


def offload_shard(job: Job, layout: Layout) -> float:
    """Parameters one GPU offloads (--offload): its dense and expert shards (offload_shards)."""
    return sum(offload_shards(job, layout))


def node_gpus(job: Job, layout: Layout) -> int:
    """The job's GPUs on one node: whose offloaded states share a host's memory and its CPU step."""
    return min(job.cluster.gpus_per_node, layout.world_size)


def host_memory_bytes(job: Job, layout: Layout) -> float:
    """Bytes a node's CPU memory holds for its GPUs under --offload (offload.host_bytes of each GPU's dense and expert
    shards, each at the stage that acts on it); 0 without."""
    if not job.offload:
        return 0.0
    t, fw = job.train, get_framework(job.framework)
    dense, experts = offload_shards(job, layout)
    per_gpu = sum(offload.host_bytes(fw, job.offload, zero, shard, t.weight_bytes, t.optimizer_bytes)
                  for zero, shard in ((layout.zero_in_effect, dense), (_expert_zero(job, layout), experts)))
    return per_gpu * node_gpus(job, layout)


def host_fits(job: Job, layout: Layout) -> bool:
    """Whether what the GPUs of a node offload fits its CPU memory (always, without --offload or where the cluster file
    does not say how much it has)."""
    capacity = job.cluster.host_memory_bytes
    return not (job.offload and capacity) or host_memory_bytes(job, layout) <= capacity


def counted_memory(job: Job, layout: Layout, rank: int | None = None) -> dict[str, float]:
    """What `validate` and `train --json` measure, predicted (bytes): the weights, gradients, optimizer
    states and saved activations (logits included) of the worst pipeline rank (or of `rank`), without
    the workspace and fragmentation allowances (GPU allocator terms; shardwise.validate.memory counts
    tensors)."""
    if rank is None:
        ranks = pipeline_ranks(per_rank_job(job, layout.tp), layout)
        return max((counted_memory(job, layout, r) for r in ranks), key=lambda m: sum(m.values()))
    mem = rank_memory(job, layout, rank)
    out = {k: mem[k] for k in ("weights", "gradients", "optimizer")}
    # saved tensors only: the loss's backward transient and a context-parallel layer's K/V buffers are the allocator's
    # (an H200's peak over a step: these + them)
    transient = loss_transient_bytes(job, layout) if rank == layout.pp - 1 else 0.0
    transient += cp_buffer_bytes(per_rank_job(job, layout.tp), layout)
    # and the recomputed layer's working set counted beside the logits, as validate adds it to the saved tensors' peak
    transient -= logits_overlap(per_rank_job(job, layout.tp), layout, rank)
    out["activations"] = mem["activations"] + mem["logits"] - transient
    return out
