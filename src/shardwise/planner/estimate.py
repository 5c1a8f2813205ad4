"""One layout -> memory, step time, throughput, MFU/HFU: the record `plan`, `estimate` and `explain` share."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from shardwise.errors import UsageError
from shardwise.planner import kernels, moe, published_check
from shardwise.planner.comm import network_assumed
from shardwise.planner.frameworks import check
from shardwise.planner.frameworks import get as get_framework
from shardwise.planner.layer_time import attention_kernel, cache_key, calibrated as calibrated_cluster
from shardwise.planner.job import Job, unfused_fix
from shardwise.planner.memory import fits_memory, host_fits, host_memory_bytes, memory_breakdown
from shardwise.planner.offload import offload_refusal
from shardwise.planner.overlap import fp8_gathered, param_gather_bytes
from shardwise.planner.step_time import step_flops, step_time
from shardwise.specs import RECOMPUTE, Layout, datasheet_gpu, splits_over_tp
from shardwise.stage_split import max_chunk_layers, max_chunks, megatron_cuts, stage_layer_counts
from shardwise.units import GIB


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    num_microbatches: int
    worst_rank: int
    memory_bytes: dict
    time_s: dict
    model_flops: float
    hardware_flops: float
    gpus: int
    gpu_memory_bytes: float
    peak_flops: float
    tokens_per_step: int
    framework: str = ""
    compile: bool = False  # the blocks (and loss) under torch.compile (Job.compile)
    assumptions: dict | None = None
    total_params: int = 0
    active_params: int = 0  # what one token uses (MoE: top-k experts), the input embedding included; FLOPs count these
    # but the embedding (its lookup is no matmul)
    offload: str = ""  # --offload (Job.offload)
    host_bytes: float = 0.0  # under --offload: what a node's CPU memory holds for its GPUs (memory.host_memory_bytes)
    host_capacity: float = 0.0  # the node's CPU memory (0: not stated)

    @property
    def memory_per_gpu(self) -> float:
        return sum(self.memory_bytes.values())

    @property
    def fits(self) -> bool:
        return self.memory_per_gpu <= self.gpu_memory_bytes and (not self.host_capacity
                                                                   or self.host_bytes <= self.host_capacity)

    def host_held(self) -> str:
        """Under --offload, what a node's CPU memory holds for its GPUs, and of how much."""
        cap = f" of {self.host_capacity / GIB:,.0f}" if self.host_capacity else ""
        return f"{self.host_bytes / GIB:,.1f}{cap} GiB of CPU memory a node"

    @property
    def step_time(self) -> float:
        return sum(self.time_s.values())

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops / self.step_time / self.gpus / 1e12

    @property
    def hardware_tflops_per_gpu(self) -> float:
        return self.hardware_flops / self.step_time / self.gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.model_tflops_per_gpu * 1e12 / self.peak_flops

    @property
    def hfu(self) -> float:
        return self.hardware_tflops_per_gpu * 1e12 / self.peak_flops

    def to_dict(self) -> dict:
        lay = self.layout
        return {
            "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "vpp": lay.vpp, "micro_batch": lay.micro_batch,
            "num_microbatches": self.num_microbatches, "zero": lay.zero, "recompute": lay.recompute,
            "recompute_layers": lay.recompute_layers,
            "sequence_parallel": lay.sequence_parallel, "schedule": lay.schedule, "cp": lay.cp, "cp_mode": lay.cp_mode,
            "ep": lay.ep, "etp": lay.etp, "dp_shard": lay.dp_shard_size,
            "total_params": self.total_params, "active_params": self.active_params,
            "fits": self.fits,
            "memory_gib_per_gpu": _round(self.memory_per_gpu / GIB, 3),
            "gpu_memory_gib": _round(self.gpu_memory_bytes / GIB, 3),
            "worst_pipeline_rank": self.worst_rank,
            "memory_breakdown_gib": {k: _round(v / GIB, 3) for k, v in self.memory_bytes.items()},
            "step_time_s": _round(self.step_time, 6),
            "time_breakdown_s": {k: _round(v, 6) for k, v in self.time_s.items()},
            "tokens_per_s": _round(self.tokens_per_s, 1),
            "model_tflops_per_gpu": _round(self.model_tflops_per_gpu, 2),
            "hardware_tflops_per_gpu": _round(self.hardware_tflops_per_gpu, 2),
            "mfu": _round(self.mfu, 4),
            "hfu": _round(self.hfu, 4),
            "framework": self.framework,
            "compile": self.compile,
            "offload": self.offload or "none",
            **({"host_memory_gib_per_node": _round(self.host_bytes / GIB, 3)} if self.offload else {}),
            "assumptions": self.assumptions or {},
        }


def _round(x: float, digits: int) -> float:
    """x to `digits` decimals for the JSON, but never with fewer than three significant digits (a tiny model's
    0.000673 GiB of weights read 0.001, a one-token step's MFU 0): a figure below 10^(2 - digits) keeps three."""
    if not x or abs(x) >= 10 ** (2 - digits):
        return round(x, digits)
    return float(f"{x:.3g}")


# What mfu and hfu count (step_time.model_flops_per_step; hardware_flops adds what recompute runs again).
FLOP_COUNT = ("PaLM's: per token 6 x the matmul parameters (LM head included, input embedding not) + 12 x layers x "
              "attention width x sequence (the window, on layers that attend through one shorter than the sequence, "
              "as MaxText counts them); attention counted unmasked at every length, where a causal kernel runs half "
              "of it; hfu adds the recomputed FLOPs")


# What each --offload keeps in the host's memory, in words (planner/offload.py)
OFFLOADED = {"optimizer": "the optimizer states and FP32 master (the stack's gradient partitions where it offloads them), "
                          "stepped on the CPU",
             "params": "the parameter shards, their gradients and the optimizer states, stepped on the CPU"}


def assumptions(job: Job) -> dict:
    """What a prediction assumes about the software (planner/frameworks.py) and the precision: the same for every
    layout of a job, so built once (per job and module constants, layer_time.cache_key) and copied for each."""
    notes = _assumptions(job, *cache_key(job))
    return {k: dict(v) if isinstance(v, dict) else v for k, v in notes.items()}


@lru_cache(maxsize=64)
def _assumptions(job: Job, in_situ: tuple, measured: str) -> dict:
    fw = get_framework(job.framework)
    dtype = {1: "fp8", 2: "bf16", 4: "fp32"}
    return {
        "attention": attention_kernel(job) or "materialised softmax",
        "gradient_reduce_dtype": dtype.get(fw.grad_reduce_bytes, f"{fw.grad_reduce_bytes} B"),
        "param_gather_dtype": dtype.get(param_gather_bytes(job, fw), f"{param_gather_bytes(job, fw)} B"),
        # torchao's float8 all-gather (--fp8-params under torchtitan): the layers' dense weights gathered in FP8, the
        # rest at param_gather_dtype; true only where it runs, FSDP sharding over data-parallel ranks (estimate)
        "fp8_all_gather": job.fp8_all_gather,
        "grad_reduce_overlapped": fw.overlap_grad_reduce,
        "tp_comm_overlap": job.tp_comm_overlap,
        # Whether (a bool, as the contract's JSON has always had it) and in which schedules the stack posts its pipeline
        # transfers behind compute. A fact about the stack, not a discount: a stage still waits a whole transfer for
        # the tensor it needs, and the step time charges it whole (step_time.pipeline_costs).
        "pipeline_p2p_overlapped": bool(fw.p2p_overlap),
        "pipeline_p2p_overlapped_schedules": list(fw.p2p_overlap),
        "bytes_per_param": {"weights": job.train.weight_bytes, "gradients": job.train.grad_bytes,
                            "optimizer": job.train.optimizer_bytes},
        "activation_dtype": dtype.get(job.train.activation_bytes, f"{job.train.activation_bytes} B"),
        # what the memory counts beyond Korthikanti et al.'s list (job.stack_saved_tensors): the gated MLP's kept
        # f-wide tensors, eager norms' FP32 copies, and the loss's buffers per logit element at the step's peak
        "loss": fw.loss_run(job.compile, job.compile_loss),
        "kept_for_backward": {"gated_mlp_tensors": job.saved.gated_mlp_tensors,
                              "norm_fp32_copies": job.saved.norm_fp32_stats,
                              "loss_bytes_per_logit": float(job.saved.logits_bytes + job.saved.loss_transient_bytes)},
        # the collectives' timing: NCCL's tuner on datasheet rates, or on rates fitted to the cluster's nccl-tests logs
        "network": network_assumed(job.cluster),
        "in_situ_efficiency": kernels.in_situ(job.cluster, job.precision),  # an FP8 job's share covers all its tensor work
        # a cluster below its rated TDP: the share of the rated tensor-core rates its power limit leaves (kernels.power_share)
        **({"power_limit_w": job.cluster.power_limit_w, "tensor_core_power_share": kernels.power_share(job.cluster)}
           if job.cluster.power_limit_w else {}),
        **({"moe_capacity_factor": job.capacity_factor, "moe_dispatcher": job.moe_dispatcher,
            "ep_comm_overlapped": job.ep_comm_overlap,
            "mfu_convention": "active parameters (top-k experts, router, shared expert)",
            # fitted on published MoE runs (planner/moe.py; 0 on a calibrated cluster, whose measurements replace them)
            "moe_layer_fixed_cost_s": 0.0 if calibrated_cluster(job) else moe.MOE_LAYER_OVERHEAD_S,
            "moe_layer_host_time_s": 0.0 if calibrated_cluster(job) else moe.MOE_LAYER_HOST_S} if job.model.is_moe else {}),
        # --offload: what lives in the host's memory, and the host rates its copies and CPU step are timed at
        **({"offload": {"states": OFFLOADED[job.offload], "host_link_gbs": job.cluster.host_link_bandwidth / 1e9,
                        "host_memory_bandwidth_gbs": job.cluster.host_memory_bandwidth / 1e9,
                        "host_memory_gib": job.cluster.host_memory_bytes / GIB or None}} if job.offload else {}),
        "precision": job.precision,
        "flop_count": FLOP_COUNT,
        # how this stack's predictions on this GPU compared with its published runs, dense or MoE as the model is
        # (None: no such run, or a calibrated / unnamed GPU)
        "checked_on_published_runs": checked_record(job),
        "gemm_dtype": ("fp8 (the layers' linears, " + {"te": "Transformer Engine delayed scaling",
                                                        "torchao": "torchao dynamic tensor-wise scaling"}[fw.fp8]
                       + (", each amax taken in the compiled kernel that makes the tensor" if job.compile else "")
                       + "; attention and LM head bf16"
                       + (", routed experts and router bf16" if job.model.is_moe and not fw.fp8_experts
                          else ", the router bf16" if job.model.is_moe else "")
                       + "; MFU against the bf16 peak)") if job.precision == "fp8"
                      # this project's runtime calibrated on CPU (gloo): fp32 weights and activations, no autocast
                      else "fp32" if job.train.activation_bytes == 4 else "bf16",
    }


def checked_gpu(job: Job) -> str | None:
    """The GPU key (kernels.situ_key) under which the job's published-run record is kept: a datasheet GPU (the presets'
    A100 and H100 / H200 SXM: specs.datasheet_gpu); None for a calibrated one or any other GPU."""
    if job.cluster.measured or not datasheet_gpu(job.cluster):
        return None
    return kernels.situ_key(job.cluster.arch, job.precision)


def checked_record(job: Job) -> dict | None:
    """The published-run record of the job's stack on its GPU (planner/published_check.py; a MoE model's from the MoE
    runs), or None."""
    gpu = checked_gpu(job)
    return published_check.record(job.framework, gpu, job.model.is_moe) if gpu else None


def complete_layout(job: Job, layout: Layout, named: frozenset[str] | set[str] = frozenset()) -> tuple[Layout, list[str]]:
    """The layout as the job's framework runs it, and what it implied (one phrase each): a knob the stack always
    uses is implied (torchtitan's and NeMo's TP always shards the sequence; TP comm overlap needs sequence
    parallelism); a ZeRO stage or recompute policy the user did not name (not in `named`) is the one the stack
    runs by default (torchtitan FSDP2, NeMo's and megatron-core's distributed optimizer), else the next stage
    the stack runs with a recompute policy it runs: the fastest pair that fits. An explicit request is kept as given
    (the framework's refusal then names what it cannot run)."""
    fw = get_framework(job.framework)
    lay, implied = stack_implied(job, layout, named)
    sp = [lay.sequence_parallel]
    if ("sequence_parallel" not in named and lay.tp > 1 and not lay.sequence_parallel and fw.unnamed_sequence_parallel
            and fw.sequence_parallel == "optional" and splits_over_tp(job.train.seq_len, lay.tp, lay.cp)):
        sp = [False, True]
    shapes = pipeline_shapes(job, lay, named)
    policies = [lay.recompute]
    if "recompute" not in named:
        policies = [r for r in RECOMPUTE if r in fw.recompute and (r in fw.unnamed_recompute or not fw.unnamed_recompute)]
        policies = policies or [lay.recompute]
    stages = [lay.zero]
    if "zero" not in named and lay.dp * lay.cp > 1:
        first = fw.zero_when_unnamed(lay)
        # a stage is weighed where the stack runs it with one of the recompute policies weighed (llama2 refuses the
        # unnamed "none" whatever the stage: checked alone, every stage would look refused)
        stages = [z for z in fw.zero_stages if z >= first and (z in fw.unnamed_zero or not fw.unnamed_zero)
                  and any(not stack_refusal(job, lay.with_(zero=z, recompute=r)) for r in policies)] or [first]
    tries = [lay.with_(zero=z, recompute=r, sequence_parallel=q, schedule=k, vpp=v)
             for k, v in shapes for q in sp for z in stages for r in policies]
    chosen, fits = fastest_fitting(job, tries, partial="recompute" not in named and not fw.unnamed_recompute)
    return chosen, implied + choice_phrases(job, lay, chosen, named, fw.zero_when_unnamed(lay), fits, len(shapes) > 1)


def stack_implied(job: Job, lay: Layout, named: frozenset[str] | set[str]) -> tuple[Layout, list[str]]:
    """The knobs the stack always sets with the layout's others: sequence parallelism where its TP always shards the
    sequence or TP comm overlap needs it, the one context-parallel mode it runs. An explicit request is kept (the
    framework's refusal then names what it cannot run), but --no-sequence-parallel with TP comm overlap is refused
    here."""
    fw = get_framework(job.framework)
    implied: list[str] = []
    if ("sequence_parallel" in named and lay.tp > 1 and not lay.sequence_parallel and job.tp_comm_overlap
            and fw.sequence_parallel != "always"):  # (a stack that always shards it: its refusal says so)
        raise UsageError(f"--no-sequence-parallel with TP comm overlap ({fw.name}'s, on unless --no-tp-comm-overlap): "
                         "the overlap runs TP's collectives as the sequence-parallel all-gather and reduce-scatter — "
                         "drop --no-sequence-parallel, or add --no-tp-comm-overlap")
    if ("sequence_parallel" not in named and lay.tp > 1 and not lay.sequence_parallel
            and (fw.sequence_parallel in ("always", "default") or job.tp_comm_overlap)):
        lay = lay.with_(sequence_parallel=True)
        why = {"always": f"{fw.name} always shards the sequence with TP",
               "default": f"{fw.name}'s recipes shard the sequence with TP; --no-sequence-parallel not given"}.get(
            fw.sequence_parallel, "TP comm overlap needs it")
        implied.append(f"sequence parallelism ({why})")
    if "cp_mode" not in named and lay.cp > 1 and fw.context_parallel and lay.cp_mode not in fw.context_parallel:
        lay = lay.with_(cp_mode=fw.context_parallel[0])
        implied.append(f"{lay.cp_mode} context parallelism ({fw.name} runs only that; --cp-mode not given)")
    return lay, implied


def fastest_fitting(job: Job, tries: list[Layout], partial: bool) -> tuple[Layout, bool]:
    """Of the candidate layouts the stack runs, the fastest that fits (sharding the optimizer usually costs less than
    recomputing every layer), else the one closest to fitting (so the memory shown is the least the stack needs);
    with `partial`, full recompute of the fewest layers that fits also weighs where none does not fit. And whether
    any fits."""
    runs = [t for t in tries if not stack_refusal(job, t)] or tries[:1]
    memory = {t: sum(memory_breakdown(job, t)[1].values()) for t in runs}
    fits = [t for t in runs if memory[t] <= job.cluster.gpu_memory_bytes and host_fits(job, t)]
    if partial:
        fewer = [fewest_recomputed(job, t) for t in fits if t.recompute == "full" and t.with_(recompute="none") not in fits]
        fits += [t for t in fewer if t is not None]
    if fits and len(set(runs) | set(fits)) > 1:
        return min(fits, key=lambda t: estimate(job, t).step_time), True
    return min(runs, key=memory.get), bool(fits)


def choice_phrases(job: Job, lay: Layout, chosen: Layout, named: frozenset[str] | set[str], default_zero: int,
                   fits: bool, weighed_shapes: bool = False) -> list[str]:
    """One phrase for each knob complete_layout chose where the user named none: what it chose and why
    (`weighed_shapes`: it weighed plain 1F1B against interleaving, pipeline_shapes)."""
    fw = get_framework(job.framework)
    implied: list[str] = []
    rule = "the fastest that fits" if fits else "the closest to fitting: none fits"
    if "zero" not in named and lay.dp * lay.cp > 1:
        why = (f"{fw.name}'s default" if chosen.zero == default_zero
               else f"{rule}, from {fw.name}'s default ZeRO-{default_zero} up")
        implied.append(f"ZeRO-{chosen.zero} ({why}; --zero not given)")
    if chosen.schedule != lay.schedule:
        implied.append(f"interleaved 1F1B with {chosen.vpp} virtual stages per rank ({fw.name}'s published pipeline "
                       f"runs interleave; of plain 1F1B and each depth, {rule}; --schedule not given, --schedule 1f1b "
                       f"prices plain 1F1B)")
    elif chosen.vpp != lay.vpp:
        implied.append(f"{chosen.vpp} virtual stages per rank ({rule}; --vpp not given)")
    elif lay.pp > 1 and not {"schedule", "vpp"} & set(named) and weighed_shapes:
        implied.append(f"plain 1F1B (of it and each interleaved depth, {rule}; --schedule not given)")
    elif lay.pp > 1 and not {"schedule", "vpp"} & set(named):
        implied.append(f"{chosen.schedule} ({fw.name}'s default pipeline schedule; --schedule not given)")
    if chosen.sequence_parallel != lay.sequence_parallel:
        implied.append("sequence parallelism (faster, or fits where plain TP does not; --sequence-parallel not given)")
    if "cp_mode" not in named and lay.cp > 1 and len(fw.context_parallel) > 1:  # (one mode: stack_implied says it)
        implied.append(f"{chosen.cp_mode} context parallelism (--cp-mode not given: {fw.name} runs "
                       f"{' and '.join(fw.context_parallel)}, and plan weighs both)")
    if (chosen.recompute, chosen.recompute_layers) != (lay.recompute, lay.recompute_layers):
        why = rule
        if len(fw.unnamed_recompute) == 1:
            why = f"{fw.name}'s own"
        elif fw.unnamed_recompute:
            why = f"of {' and '.join(fw.unnamed_recompute)}, the policies {fw.name}'s code runs, {rule}"
        implied.append(f"{chosen.recompute_phrase()} ({why}; --recompute not given)")
    return implied


def pipeline_shapes(job: Job, lay: Layout, named: frozenset[str] | set[str]) -> list[tuple[str, int]]:
    """The (schedule, virtual stages per rank) pairs complete_layout weighs. Interleaving named with no depth: from two
    chunks per rank (one would be plain 1F1B) up to one layer per chunk (Megatron's
    --num-layers-per-virtual-pipeline-stage 1), and a chunk of its own for the embedding and the loss where the stack
    cuts so (Framework.edge_chunks: Llama 3's 126 layers on 16 x 8 chunks). Neither named, on a stack whose recipes interleave every pipeline
    (Framework.interleave_unnamed): plain 1F1B and those depths, where Megatron's rule (micro-batches a multiple of pp)
    allows interleaving. Else the layout's own."""
    fw, own = get_framework(job.framework), [(lay.schedule, lay.vpp)]
    most = max_chunks(job.model.num_layers, fw.edge_chunks)
    deep = [("interleaved-1f1b", v) for v in range(2, most // lay.pp + 1)] if lay.pp > 1 else []
    # --recompute-layers N counts the first N layers of each chunk: a depth whose chunks all hold fewer is refused
    # when named (specs.check_recompute_layers), so it is not weighed either
    n = lay.recompute_layers
    deep = [(k, v) for k, v in deep if n is None or n <= max_chunk_layers(job.model, lay.pp, v, job.train.seq_len, fw.stage_split)]
    if "vpp" not in named and lay.schedule == "interleaved-1f1b" and lay.vpp == 1:
        return deep or own
    if ({"vpp", "schedule"} & set(named) or not fw.weighs_interleaving or lay.schedule != "1f1b"
            or lay.num_microbatches(job.train.global_batch) % max(lay.pp, 1)):
        return own
    return own + deep


def check_runs(job: Job, layout: Layout) -> None:
    """UsageError (one line) when the job's framework cannot run `layout` (frameworks.check, with what the job says of
    the model, its chunks, its micro-batches and its attention), or cannot offload at its ZeRO stage (--offload)."""
    fw = get_framework(job.framework)
    check(fw, layout, max_chunk_layers(job.model, layout.pp, layout.vpp, job.train.seq_len, fw.stage_split),
          job.model.num_layers, layout.num_microbatches(job.train.global_batch), job.flash_attention,
          job.model.num_kv_heads, unfused_fix(job))
    reason = offload_refusal(fw, job.offload, layout)
    if reason:
        raise UsageError(f"--offload {job.offload}: {reason}")


# The stacks that take Megatron-Core's --pipeline-model-parallel-layout (a named uneven cut; NeMo passes it through).
LAYOUT_FLAG_STACKS = ("megatron-core", "nemo")


def split_note(job: Job, layout: Layout) -> str:
    """A note where the job's stack cuts its pipeline Megatron's way and this layout's chunks are a cut Megatron does
    not build itself (stage_split.megatron_cuts): what is priced instead, and how Megatron runs it; else ""."""
    chunks = layout.pp * layout.vpp
    if layout.pp == 1 or get_framework(job.framework).stage_split != "megatron" or megatron_cuts(job.model.num_layers,
                                                                                                   chunks):
        return ""
    counts = sorted(set(stage_layer_counts(job.model, chunks, job.train.seq_len, "megatron")))
    how = (", which it runs only through --pipeline-model-parallel-layout (`plan --emit megatron` writes it)"
           if job.framework in LAYOUT_FLAG_STACKS else "")  # Megatron-Core's flag, not its cut rule's other stacks'
    return (f"pp x vpp = {chunks} model chunks do not divide the {job.model.num_layers} layers (nor the layers + 2, with "
            f"the embedding and the loss a layer's slot each), which is all {job.framework} cuts by itself: priced "
            f"as the balanced cut of {' or '.join(map(str, counts))} layers a chunk{how}")


def release_note(job: Job, layout: Layout) -> str:
    """Where the job's stack has opt-in options of a later release (Framework.named_release) and this layout uses one
    that changes something here (SP at tp > 1, a ZeRO stage over dp x cp > 1, selective recompute): which, and whose
    code prices them; else ""."""
    fw = get_framework(job.framework)
    if not fw.named_release:
        if layout.recompute == "selective" and fw.unnamed_recompute and "selective" not in fw.unnamed_recompute:
            # a stack whose code recomputes whole layers or none (deepspeed's Megatron-DeepSpeed of 2021-22)
            return (f"--recompute selective: not in the code {job.framework} stands for, which recomputes every "
                    f"layer or none; priced as Megatron-LM's selective recompute (Korthikanti et al. 2022)")
        return ""
    later = [flag for flag, used in (
        ("--sequence-parallel", layout.sequence_parallel and layout.tp > 1 and not fw.unnamed_sequence_parallel),
        (f"--zero {layout.zero}", layout.zero not in fw.unnamed_zero and layout.dp * layout.cp > 1),
        ("--recompute selective", layout.recompute == "selective" and "selective" not in fw.unnamed_recompute),
    ) if used]
    if not later:
        return ""
    return (f"{', '.join(later)}: not in the code {job.framework} stands for; priced as {fw.named_release} runs "
            f"{'it' if len(later) == 1 else 'them'}, with that release's overlap (none)")


def stack_refusal(job: Job, layout: Layout) -> str | None:
    """Why the job's stack cannot run `layout` (its profile's refusal, or its offload's at the layout's ZeRO stage), or
    None: what the search and the completion of unnamed knobs skip."""
    fw = get_framework(job.framework)
    return fw.refusal(layout, job.model.num_layers) or offload_refusal(fw, job.offload, layout)


def fewest_recomputed(job: Job, layout: Layout) -> Layout | None:
    """`layout` (full recompute, fitting) with the fewest layers per chunk recomputed that its framework runs and
    that still fit (--recompute-layers), or None when only every layer fits. Fewer recomputed layers are faster and
    hold more, so the answer is the first count that fits: a binary search over the counts."""
    fw = get_framework(job.framework)
    counts = fw.partial_counts(max_chunk_layers(job.model, layout.pp, layout.vpp, job.train.seq_len, fw.stage_split))
    lo, hi = 0, len(counts)
    while lo < hi:
        mid = (lo + hi) // 2
        tried = layout.with_(recompute_layers=counts[mid])
        if fits_memory(job, tried):
            hi = mid
        else:
            lo = mid + 1
    return layout.with_(recompute_layers=counts[lo]) if lo < len(counts) else None


def estimate(job: Job, layout: Layout, implied: list[str] | None = None) -> Estimate:
    """Predict one (already validated) layout; `implied` lists what `complete_layout` filled in."""
    rank, mem = memory_breakdown(job, layout)
    model_flops, hw_flops = step_flops(job, layout)
    notes = assumptions(job)
    if implied:
        notes["implied"] = list(implied)
    if job.fp8_all_gather:  # asked for; in effect only where FSDP shards this layout's weights over dp ranks
        notes["fp8_all_gather"] = fp8_gathered(job, layout)
    return Estimate(
        layout=layout, num_microbatches=layout.num_microbatches(job.train.global_batch), worst_rank=rank,
        memory_bytes=mem, time_s=step_time(job, layout), model_flops=model_flops, hardware_flops=hw_flops,
        gpus=layout.world_size, gpu_memory_bytes=job.cluster.gpu_memory_bytes,
        peak_flops=job.cluster.peak_flops, tokens_per_step=job.train.global_batch * job.train.seq_len,
        framework=job.framework, compile=job.compile, assumptions=notes,
        total_params=job.model.num_params(), active_params=job.model.active_params(),
        offload=job.offload, host_bytes=host_memory_bytes(job, layout), host_capacity=job.cluster.host_memory_bytes,
    )
