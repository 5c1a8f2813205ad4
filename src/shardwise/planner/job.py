"""What the planner models for one training job: the `Job` record (the specs, what the stack's profile implies and what
the command line states of the run's release) and `SavedTensors`, what the training code keeps for backward beyond
Korthikanti et al.'s list; `make_job` builds the Job a framework's profile implies, `runtime_job` the one of this
project's runtime. planner/memory.py counts the bytes; layer_time.py and step_time.py the seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from shardwise.errors import UsageError
from shardwise.frozen import cached_hash
from shardwise.planner.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, PRECISIONS
from shardwise.planner.frameworks import get as get_framework
from shardwise.planner.kernels import SOFTCAP_FAMILIES
from shardwise.planner.offload import check_offload
from shardwise.specs import ClusterSpec, ModelSpec, TrainSpec


# Per logit element on the last stage: bf16 logits (2) + fp32 copy for the softmax/cross-entropy (4).
LOGITS_BYTES = 6


@cached_hash
@dataclass(frozen=True)
class SavedTensors:
    """What the training code keeps for backward beyond Korthikanti et al.'s list (the defaults).

    norm_fp32_stats: the norm keeps fp32 statistics beside its input: Llama's RMSNorm written in
      PyTorch keeps its fp32 input (4 B), its normalised output (e) and 1/rms (4 B per token); torch's
      LayerNorm kernel (GPT) keeps its e-byte input and an fp32 mean and 1/std (8 B per token) —
      instead of the paper's one e-byte input.
    dropout: GPT recipes train with dropout (a 1-byte mask after the attention and the MLP, and on
      the scores); Llama recipes never do, nor does shardwise's model.
    gated_mlp_tensors: f-wide tensors a gated MLP keeps: gate, up and product (3), or also silu(gate)
      when SiLU and the product are separate autograd ops (4).
    softmax_stats_bytes: a fused attention kernel keeps the log-sum-exp per head and token (fp32: 4);
      it belongs to the attention core, so selective recompute drops it.
    logits_bytes: per logit element on the last stage, per micro-batch in flight there.
    loss_transient_bytes: per logit element, once on the last stage: what the loss's backward holds beside the kept
      logits (eager F.cross_entropy on FP32 logits: the gradient of its log-softmax output and the input gradient,
      FP32 each, while the log-softmax output is still kept: 4 kept + 8).
    head_inputs: the last stage also keeps the final norm's and the LM head's inputs.
    token_id_bytes: integer token ids kept by the embedding (first stage) and the loss (last stage).
    gathered_linear_inputs: under sequence parallelism the QKV and FC1 inputs are kept whole, as gathered (a DTensor
      plan: Framework.dtensor_sp), not as their sequence shard (Megatron, which gathers them again in backward).
    autocast_casts: FP32 weights and residual stream under torch.autocast (shardwise's runtime on a GPU): the norms
      keep FP32 tensors throughout, each linear keeps its own BF16 cast of its FP32 input (q, k and v three, gate and
      up two) and autocast's BF16 copy of its weight, for as long as the micro-batch's graph lives; a fully recomputed
      layer keeps its FP32 input. Under sequence parallelism the runtime's column-parallel groups cast their input
      shard once and keep their FP32 weights (autocast_weight_copies).
    """

    norm_fp32_stats: bool = False
    dropout: bool = True
    gated_mlp_tensors: int = 3
    softmax_stats_bytes: int = 0
    logits_bytes: float = LOGITS_BYTES
    loss_transient_bytes: float = 0.0
    head_inputs: bool = False
    token_id_bytes: int = 0
    router_aux: bool = False
    gathered_linear_inputs: bool = False
    autocast_casts: bool = False


PAPER = SavedTensors()

# An eager loss, F.cross_entropy(pred.float(), labels) with the BF16 logits deleted before the backward (torchtitan's
# train step at 9dec370: `del pred  # need to free to before bwd to avoid peaking memory`): its log-softmax keeps its
# FP32 output (4 B per logit element) from the forward to the backward; there, NLL's backward writes the FP32 gradient
# of that output (4) and log-softmax's backward the FP32 gradient of its input (4) while the output is still kept:
# 12 at the peak, which is the step's (every layer's activations are still kept when the backward starts). The
# forward's own peak is lower: the BF16 logits (2), their FP32 copy (4) and the log-softmax output (4).
EAGER_LOSS_KEPT_BYTES = 4
EAGER_LOSS_TRANSIENT_BYTES = 8

# shardwise.model (RMSNorm with fp32 statistics or torch's LayerNorm, no dropout, SwiGLU as
# silu(w1 x) * w3 x, SDPA's fused kernel, fp32 log-softmax in the loss, int64 ids), as its saved-tensor
# hooks show; run it with TrainSpec(activation_bytes=4) for fp32 and Job(flash_attention=True): SDPA
# never keeps the scores. Its loss is the eager one above: an H200's allocator peak over a step of the 1.3B Llama was
# the saved tensors plus that transient, to 0.01 GiB at micro-batches 1 and 2 (benchmarks/data/gpu, docs/accuracy.md).
SHARDWISE_RUNTIME = SavedTensors(norm_fp32_stats=True, dropout=False, gated_mlp_tensors=4, softmax_stats_bytes=4,
                                 logits_bytes=EAGER_LOSS_KEPT_BYTES, loss_transient_bytes=EAGER_LOSS_TRANSIENT_BYTES,
                                 head_inputs=True, token_id_bytes=8, router_aux=True)


@cached_hash
@dataclass(frozen=True)
class Job:
    """What the planner models for one training job (the specs plus two facts about the software).

    flash_attention: the attention core is one fused kernel (FlashAttention / SDPA) that never stores
    the s x s scores and recomputes them in backward. Off = the paper's materialised softmax.
    tp_comm_overlap: TP collectives are split and pipelined with the GEMMs that produce/consume them
    (Transformer Engine userbuffers, NeMo's tp_comm_overlap); off = Megatron 2022, fully exposed.
    saved: which tensors the training code keeps for backward (PAPER or SHARDWISE_RUNTIME).
    zero1_broadcast_per_tensor: ZeRO-1 as torch's ZeroRedundancyOptimizer does it (shardwise's runtime):
    gradients all-reduced, then every parameter tensor broadcast from the rank that updated it, one
    call per tensor; off = Megatron's distributed optimizer (one reduce-scatter, one all-gather).
    async_sp_regather: under sequence parallelism the backward all-gather of each saved input shard
    runs behind the input-gradient GEMM of its linears (Megatron's async communication); off =
    issued and waited for in turn (shardwise's runtime).
    framework: the training stack (planner/frameworks.py): what overlaps, the reduce dtype, the attention
    kernel, what it cannot run. Its bytes per parameter are the TrainSpec's (make_job sets both).
    capacity_factor: mixture of experts: the busiest expert's tokens over the mean (1.0: balanced routing;
    a measured skew, or the capacity factor of a run that pads experts to it), what the slowest rank's
    expert compute, all-to-all and dispatch buffers scale with (planner/moe.py).
    moe_dispatcher / ep_comm_overlap: how the stack moves tokens to their experts: NCCL's all-to-all (a
    token's row sent once per expert) or DeepEP's (once per node, then NVLink); whether the all-to-alls of
    one micro-batch overlap another's compute (Megatron-Core's --overlap-moe-expert-parallel-comm).
    moe_routing: which experts a token's k choices are, for the ranks and nodes a deduplicating dispatcher
    (DeepEP) sends it to: "random" (k distinct experts at random, within the top groups of a group-limited
    router: a trained router's spread, Megatron's --moe-router-force-load-balancing) or "contiguous" (k
    consecutive experts: NeMo AutoModel's fake balanced gate).
    """

    model: ModelSpec
    cluster: ClusterSpec
    train: TrainSpec
    flash_attention: bool = False
    tp_comm_overlap: bool = False
    saved: SavedTensors = PAPER
    zero1_broadcast_per_tensor: bool = False
    async_sp_regather: bool = True
    framework: str = "megatron-core"
    selective: str = "attention"  # what selective recompute keeps: "attention" (Megatron) or "op" (torchtitan)
    capacity_factor: float = 1.0
    precision: str = "bf16"  # "fp8": the layers' GEMMs in FP8 with the framework's scaling recipe (Framework.fp8)
    # The blocks (and the loss) run under torch.compile: Inductor's fused element-wise kernels (kernels.ELEMENTWISE
    # "compiled", step_time.LOSS_BYTES "compiled") instead of the stack's eager ones.
    compile: bool = False
    # Under compile, whether the loss is compiled too where the stack compiles it (Framework.compile_loss); False for a
    # release that compiled the blocks only (torchtitan before bbb1b616e, 2025-04-02: "compiling loss function causes
    # CUDA errors, turning off for now" in its train.py until then).
    compile_loss: bool = True
    # The norms run as fused kernels in a stack whose other element-wise work is eager (torchtitan's norm_type
    # "fused_rmsnorm", a Triton kernel keeping its input and 1/rms: the default of its presets until 3faaa1a0d,
    # 2024-08): their time (kernels.elementwise_time) and what they keep (stack_saved_tensors) are a fused kernel's.
    fused_norms: bool = False
    moe_dispatcher: str = "alltoall"  # "alltoall" (NCCL all-to-all, shardwise's runtime) or "deepep" (node-deduplicated)
    ep_comm_overlap: bool = False  # all-to-alls hidden behind another micro-batch's compute (Megatron's EP A2A overlap)
    moe_recompute: str = ""  # Megatron's --recompute-modules for MoE: "moe" (the whole MoE FFN) or "act" (its SwiGLU)
    moe_routing: str = "random"  # where a token's k experts sit: "random" (k distinct at random) or "contiguous" (planner/moe.py)
    # Megatron-Core's --recompute-modules when a run names them: selective recompute then recomputes exactly these
    # ("core_attn" the attention core, "layernorm" the norms, "moe_act" the experts' activation, "moe" the MoE FFN;
    # megatron/core/transformer/transformer_config.py). Empty: the framework's `selective`.
    recompute_modules: tuple[str, ...] = ()
    # Pipeline schedules one step runs: NeMo AutoModel runs schedule.step once per local batch (its gradient
    # accumulation; nemo_automodel/recipes/llm/train_ft.py _run_train_optim_step), each filling and draining the
    # pipeline and, under FSDP, reduce-scattering at its last backward (torch.distributed.pipelining's
    # PipelineStage.backward_maybe_with_nosync). 1: one schedule over all micro-batches (Megatron, torchtitan).
    schedule_runs: int = 1
    # The attention kernel family when the run picks one apart from its framework's (Framework.attention): "fa2"
    # for Transformer Engine under NVTE_FUSED_ATTN=0, which then runs flash-attn's FlashAttention-2 (NVTE_FLASH_ATTN
    # defaults to 1) in place of cuDNN's fused attention. Empty: the framework's.
    attention: str = ""
    # torchao's float8 all-gather for FSDP (torchtitan's enable_fsdp_float8_all_gather, OLMo-core's float8 config):
    # each layer's Float8Linear weights are cast to FP8 on their shard before FSDP gathers them, so the gather moves and
    # holds one byte per element, the gathered weight feeds the forward GEMM as it is, and the backward writes only its
    # FP8 transpose (layer_time.fp8_weight_cast). The FP32 shard stays the optimizer's; the root unit (embedding,
    # final norm, head: not Float8Linear) gathers in BF16, as do MoE's routed experts. Only under FSDP over more than
    # one data-parallel rank (overlap.fp8_gathered); step_time.dp_comm_time, memory.model_state_bytes.
    fp8_all_gather: bool = False
    # CPU offload (--offload, planner/offload.py): "" (none), "optimizer" (optimizer states and master on the host,
    # stepped there) or "params" (the parameter shards and their gradients too)
    offload: str = ""



def per_rank_job(job: Job, tp: int) -> Job:
    """The job as one TP rank computes it. Where tp is above the KV heads (a stack that replicates them:
    Framework.replicates_kv_heads), each rank projects, keeps and attends over the one KV head its query heads read:
    per rank that is the model with tp KV heads split over tp, which is what the costs see. The model's own counts
    (parameters, model FLOPs: estimate.estimate) stay the job's. The replicated K/V weights' gradients are also
    summed over tp once a step (2 x hidden x head_dim a layer, under 1 % of a layer's); not charged."""
    return job if tp <= job.model.num_kv_heads else _kv_replicated(job, tp)


@lru_cache(maxsize=64)
def _kv_replicated(job: Job, tp: int) -> Job:
    return replace(job, model=replace(job.model, num_kv_heads=tp))




def runtime_job(model: ModelSpec, cluster: ClusterSpec, global_batch: int, seq_len: int, gpu: bool) -> Job:
    """The planner's view of shardwise's own runtime (`validate`, `train --json`): fp32 weights,
    gradients and AdamW states (4 + 4 + 8 bytes per parameter), fp32 activations on CPU (bf16 under
    autocast on GPU), SDPA's fused attention, the tensors shardwise.model saves, torch's
    ZeroRedundancyOptimizer for ZeRO-1 and SP's backward re-gather waited for — `--framework shardwise`'s job,
    so `estimate` on a calibration predicts what `validate` does. Its memory does not depend on the cluster; its
    time does."""
    job = make_job(model, cluster, global_batch, seq_len, "shardwise", flash_attention=True)
    saved, activation_bytes = runtime_tensors(gpu)
    return replace(job, train=replace(job.train, activation_bytes=activation_bytes), saved=saved)


def runtime_tensors(gpu: bool) -> tuple[SavedTensors, int]:
    """What shardwise's model keeps for backward, and its activations' bytes: fp32 on CPU, bf16 under autocast on GPU."""
    return replace(SHARDWISE_RUNTIME, autocast_casts=gpu), 2 if gpu else 4


# Transformer Engine's attention backends as Megatron-Core's --attention-backend names them, and the kernel family
# each runs (Job.attention; "" keeps TE's own pick, kernels.ATTENTION_KERNEL "te": cuDNN on Hopper, flash-attn's
# FlashAttention-2 on Ampere).
ATTENTION_BACKENDS = {"auto": "", "fused": "", "flash": "fa2"}


def softcap_unfused(model, fw, attention: str = "") -> bool:
    """Whether the model soft-caps its attention logits (Gemma 2) and the stack's fused attention cannot apply the cap,
    so that its layers run a materialised softmax: a family outside kernels.SOFTCAP_FAMILIES (`attention`: the run's
    own, Job.attention; else the stack's), or one reached through torch's SDPA (Framework.window_kernel False)."""
    return bool(model.attn_softcap) and not ((attention or fw.attention) in SOFTCAP_FAMILIES and fw.window_kernel)


def _cap_kept_out(model, fw) -> tuple[str, str]:
    """(why the stack's fused kernel is kept out by the model's soft-cap, the kernel that applies it where the stack
    has one): the words of unfused_fix and make_job's refusal."""
    flash = "--attention-backend flash (FA2 applies it)" if fw.attention == "te" else ""
    return f"{model.name} soft-caps its attention logits, which {fw.name}'s fused kernel cannot apply", flash


def unfused_fix(job: Job) -> str:
    """What makes the job's attention fused again, for a refusal that needs the fused kernel: --no-flash-attention
    dropped, or where the model's soft-capped logits keep the stack's kernel out (softcap_unfused), a kernel that
    applies the cap."""
    fw = get_framework(job.framework)
    if not softcap_unfused(job.model, fw, job.attention):
        return "drop --no-flash-attention"
    why, flash = _cap_kept_out(job.model, fw)
    return why + (f": use {flash}" if flash else "")


def make_job(model, cluster, global_batch: int, seq_len: int, framework: str = DEFAULT_FRAMEWORK, *,
             flash_attention: bool | None = None, tp_comm_overlap: bool | None = None, precision: str = "bf16",
             fp8_params: bool = False, compile: bool = False, compile_loss: bool | None = None, fused_norms: bool = False,
             attention_backend: str | None = None, offload: str = "", **train):
    """The planner's Job for `framework`: its bytes per parameter, its attention kernel and TP overlap
    defaults, unless given. `train` overrides TrainSpec fields (e.g. grad_bytes). `fp8_params`: the weights
    themselves in FP8 (Transformer Engine's fp8_model_init: NeMo's fp8_params, Megatron-Core's --fp8-param-gather),
    one byte each, stored and gathered so; under torchao (torchtitan) the layers' weights gathered in FP8 from their
    FP32 shards (Job.fp8_all_gather). `compile`: the blocks and loss under torch.compile (Framework.compiles);
    `compile_loss` False: the blocks only (Job.compile_loss; None: what the stack does). `fused_norms`:
    Job.fused_norms. `attention_backend`: ATTENTION_BACKENDS (Transformer Engine stacks). `offload`: Job.offload."""
    fw = get_framework(framework)
    check_offload(fw, cluster, offload)
    if compile and fw.compile_refusal():
        raise UsageError(f"--compile: {fw.compile_refusal()} — drop --compile")
    refusal = software_refusal(fw, compile, compile_loss, fused_norms)
    if refusal:
        raise UsageError(refusal)
    if tp_comm_overlap and not fw.tp_comm_overlap_available:
        raise UsageError(f"--framework {fw.name} has no TP communication overlap — drop --tp-comm-overlap")
    if precision not in PRECISIONS:
        raise UsageError(f"unknown --precision '{precision}' — choose one of {', '.join(PRECISIONS)}")
    if precision == "fp8" and not cluster.fp8_flops:
        raise UsageError(f"{cluster.name} has no FP8 tensor cores (FP8 training needs Hopper or newer) — use "
                         f"--precision bf16, or a cluster file with fp8_peak_tflops")
    if model.is_moe and not fw.expert_parallel:  # its MoE layers, routing and dispatch are no code of that stack's
        moe_stacks = ", ".join(name for name, f in FRAMEWORKS.items() if f.expert_parallel)
        raise UsageError(f"--framework {fw.name} has no mixture-of-experts layers, and {model.name} has "
                         f"{model.num_experts} experts — use a framework that trains them ({moe_stacks})")
    fp8_stacks = ", ".join(name for name, f in FRAMEWORKS.items() if f.fp8)  # one list for both refusals below
    if precision == "fp8" and not fw.fp8:
        raise UsageError(f"--framework {fw.name} has no FP8 training — use --precision bf16, or a framework that "
                         f"trains FP8 ({fp8_stacks})")
    if fp8_params and (precision != "fp8" or fw.fp8 not in ("te", "torchao")):
        raise UsageError("--fp8-params keeps the weights in FP8 (Transformer Engine) or gathers them in FP8 (torchao's "
                         f"float8 all-gather) — add --precision fp8, with a framework that trains FP8 ({fp8_stacks})")
    fp8_all_gather = fp8_params and fw.fp8 == "torchao"
    fp8_params = fp8_params and not fp8_all_gather
    fused = fw.flash_attention if flash_attention is None else flash_attention
    refusal = attention_backend_refusal(fw, cluster, attention_backend, fused)
    if refusal:
        raise UsageError(refusal)
    # soft-capped logits (Gemma 2) where the stack's kernel cannot cap: it runs its unfused attention (softcap_unfused)
    if fused and softcap_unfused(model, fw, ATTENTION_BACKENDS.get(attention_backend or "auto", "")):
        if attention_backend == "fused" or flash_attention:  # asked by name for a kernel that cannot run this model
            asked = "--attention-backend fused" if attention_backend == "fused" else "--flash-attention"
            why, flash = _cap_kept_out(model, fw)
            raise UsageError(f"{asked}: {why} — drop {asked} (the stack runs its unfused attention)"
                             + (f" or {flash}" if flash else ""))
        fused = False
    if fused and fw.attention == "fa1" and (cluster.arch or "ampere") == "ampere" and model.head_dim > 128:
        # flash-attn 0.2.x csrc/flash_attn/fmha_api.cpp: TORCH_CHECK((head_size % 8 == 0) && (head_size <= 128))
        raise UsageError(f"--flash-attention: --framework {fw.name} runs FlashAttention-1 on this GPU, which takes "
                         f"head sizes up to 128, and this model's is {model.head_dim} — use --no-flash-attention")
    states = {"weight_bytes": 1 if fp8_params else fw.weight_bytes, "grad_bytes": fw.grad_bytes,
              "optimizer_bytes": fw.optimizer_bytes}
    loss_compiled = compile_loss is not False  # None: what the stack does
    saved = stack_saved_tensors(fw, compile, loss_compiled, fused_norms)
    if fw.name == "shardwise" and not compile:  # this project's runtime as it runs (runtime_job)
        gpu = (cluster.measured or {}).get("backend") != "gloo"  # a CPU calibration: fp32, no autocast
        saved, states["activation_bytes"] = runtime_tensors(gpu)
    states.update(train)
    return Job(model, cluster, TrainSpec(global_batch, seq_len, **states),
               flash_attention=fused, saved=saved,
               compile_loss=loss_compiled, fused_norms=fused_norms,
               tp_comm_overlap=fw.tp_comm_overlap if tp_comm_overlap is None else tp_comm_overlap,
               zero1_broadcast_per_tensor=fw.zero1 == "broadcast",
               async_sp_regather=fw.async_sp_regather, framework=fw.name, selective=fw.selective,
               precision=precision, recompute_modules=fw.recompute_modules, compile=compile,
               attention=ATTENTION_BACKENDS.get(attention_backend or "auto", ""), fp8_all_gather=fp8_all_gather,
               offload=offload)



def compiled(job: Job) -> Job:
    """`job` under torch.compile (blocks and loss), as make_job builds it with --compile."""
    fw = get_framework(job.framework)
    return replace(job, compile=True, compile_loss=True, saved=stack_saved_tensors(fw, True, True, job.fused_norms))

def attention_backend_refusal(fw, cluster, backend: str | None, fused: bool) -> str | None:
    """One line naming why --attention-backend does not apply, or None."""
    if backend in (None, "auto"):
        return None
    if backend not in ATTENTION_BACKENDS:
        return f"unknown --attention-backend '{backend}' — choose one of {', '.join(ATTENTION_BACKENDS)}"
    if fw.attention != "te":
        return (f"--attention-backend picks Transformer Engine's attention, and {fw.name} does not run it — drop it, "
                f"or use --framework megatron-core, nemo or automodel")
    if not fused:
        return f"--attention-backend {backend} is a fused kernel, and --no-flash-attention asks for none — drop one"
    if backend == "fused" and (cluster.arch or "ampere") != "hopper":
        return ("--attention-backend fused: cuDNN's fused attention is modelled on Hopper only (Transformer Engine "
                "picks flash-attn on Ampere) — use auto or flash")
    return None


def software_refusal(fw, compile: bool, compile_loss: bool | None, fused_norms: bool) -> str | None:
    """One line naming why --compile-loss / --no-compile-loss / --fused-norms do not apply to this stack, or None."""
    if compile_loss is not None and not compile:
        flag = "--compile-loss" if compile_loss else "--no-compile-loss"
        return f"{flag} says what --compile does with the loss, and nothing is compiled without it — add --compile or drop {flag}"
    if compile_loss and not fw.compile_loss:
        return (f"--compile-loss: {fw.name} compiles its model, not the loss it runs after it — drop --compile-loss")
    if fused_norms and fw.fused_elementwise:
        return f"--fused-norms: {fw.name} already runs its norms as fused kernels — drop --fused-norms"
    if fused_norms and not fw.compiles:  # eager with no kernel options at all (shardwise's runtime)
        return f"--fused-norms: {fw.name} runs its model as PyTorch ops with no kernel options (no fused norm to pick) — drop it"
    if fused_norms and compile:
        return "--fused-norms: under --compile Inductor fuses the norms already — drop one of the two"
    return None


def stack_saved_tensors(fw, compile: bool, compile_loss: bool = True, fused_norms: bool = False) -> SavedTensors:
    """What a stack's layers keep for backward beyond Korthikanti et al.'s list: its gated MLP's f-wide tensors
    (Framework.glu_tensors), 2 under torch.compile (the partitioner recomputes silu(gate) * up from the two GEMM
    outputs it keeps); and where its norms are eager PyTorch (not Framework.fused_elementwise, not compiled), what
    their composite ops keep: Llama's RMSNorm `(x.float() * rsqrt(mean(x.float()^2) + eps)).type_as(x) * weight` its
    FP32 input, 1/rms and the normalised output (kernels.ELEMENTWISE prices the same ops), as `validate` measures on
    shardwise's own RMSNorm (SHARDWISE_RUNTIME); and an eager loss's FP32 buffers (EAGER_LOSS_KEPT_BYTES)."""
    tensors = 2 if compile else fw.glu_tensors
    eager_norms = not fw.fused_elementwise and not compile and not fused_norms
    loss = {}
    if fw.loss_run(compile, compile_loss) == "eager" and fw.eager_loss_memory:
        loss = {"logits_bytes": EAGER_LOSS_KEPT_BYTES, "loss_transient_bytes": EAGER_LOSS_TRANSIENT_BYTES}
    return replace(PAPER, gated_mlp_tensors=tensors, norm_fp32_stats=eager_norms,
                   gathered_linear_inputs=fw.dtensor_sp, autocast_casts=fw.autocast_saved, **loss)
