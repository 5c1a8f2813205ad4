"""Framework profiles: what a layout costs, and whether it runs at all, depends on the software running it.

Each profile states the semantics the planner models for one training stack, with sources (papers,
the frameworks' docs and code, at the commits named in docs/planner.md):
  * model states: bytes per parameter kept for weights, gradients and the optimizer;
  * the attention kernel (fused FlashAttention-2/3 or cuDNN, or a materialised softmax);
  * data parallelism: in which dtype gradients travel, when they are reduced (once per step or every
    micro-batch), what compute hides them (a schedule, planner/overlap.py), how ZeRO stages gather;
  * pipeline transfers overlapped or blocking; TP communication overlapped with GEMMs or not;
  * which layouts the stack cannot run (the search skips them; `estimate` refuses them, naming why).

`shardwise` is exactly this project's runtime (parallel/data_parallel.py, train.py): its refusals come
from the runtime's own layout checks (specs.runtime_refusal, which launch.check raises), and it leaves
one hook, CALIBRATED_STEP_OVERHEAD, for the fixed per-step cost `calibrate` measures on the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shardwise.errors import UsageError
from shardwise.specs import RECOMPUTE, SCHEDULES, Layout, runtime_refusal

# The [measured] key of a calibrated cluster that holds the `shardwise` runtime's fixed cost per training
# step beyond the layers, collectives and optimizer the planner times (loss reduction, clipping, metrics).
# Filled by `shardwise calibrate`; 0 when absent (datasheet clusters).
CALIBRATED_STEP_OVERHEAD = "train_step_overhead_s"


@dataclass(frozen=True)
class Framework:
    name: str
    summary: str
    sources: tuple[str, ...]
    # Model states, bytes per parameter (weights as used in forward/backward, gradient buffer, optimizer).
    weight_bytes: int = 2
    grad_bytes: int = 4
    optimizer_bytes: int = 12
    # Attention (planner/kernels.py ATTENTION_KERNEL): the fused kernel the stack runs when attention is fused: "te"
    # (Transformer Engine's fused attention: cuDNN on Hopper, FlashAttention-2 on Ampere), "fa3" (FlashAttention-3 called
    # directly), "fa2" (FlashAttention-2, e.g. through PyTorch SDPA before 2.11), "sdpa" (PyTorch SDPA's own choice
    # since 2.11: cuDNN on Hopper, FlashAttention-2 on Ampere), "fa1" (FlashAttention-1, the flash-attn 0.2.x the
    # 2023 releases of the 2021-22 stacks call when told to), "xformers" (its memory-efficient attention, Meta's 2022-23
    # stack); "unfused" (materialised softmax) for a stack with none.
    # Whether it is fused by default is `flash_attention` (--flash-attention / --no-flash-attention).
    attention: str = "te"
    fused_elementwise: bool = True  # norms, activations, rotary as fused kernels (False: eager PyTorch ops)
    # A gated MLP's activation in bytes per f-element (2-byte activations) where the stack runs it its own way;
    # None: as the element-wise table says (planner/kernels.py ELEMENTWISE).
    glu_bytes: float | None = None
    # f-wide tensors its gated MLP keeps for the backward (memory.SavedTensors.gated_mlp_tensors): 3, the gate and up
    # GEMMs' outputs and their product (Megatron's fused swiglu keeps its input, the FC2 linear its output; Transformer
    # Engine's LayerNormMLP the same); 4 where the block is eager PyTorch, `w2(F.silu(w1(x)) * w3(x))`: autograd's
    # SiLU keeps its input and the product keeps both factors, silu(gate) among them (torchtitan's, fms' and nanotron's
    # MLPs; what `validate` measures on shardwise's own model, memory.SHARDWISE_RUNTIME); 2 for xformers' fused SwiGLU
    # (lit-gpt). Under --compile, 2: AOTAutograd's min-cut partitioner keeps the two GEMM outputs and recomputes the
    # point-wise silu(gate) * up in the backward's fused kernel (memory.stack_saved_tensors).
    glu_tensors: int = 3
    # The GPU architectures on which its plain (GELU) MLP runs the activation in the FC1 GEMM's epilogue and its
    # gradient in the dgrad GEMM's (layer_time.GELU_EPILOGUE_BYTES) instead of as element-wise passes.
    gelu_epilogue: tuple[str, ...] = ()
    # Its fused attention takes Q, K and V in a layout of its own, made by copies around the kernel
    # (layer_time.attention_layout_time): 0, or the GPT-NeoX v1.0 flash path's copies (GPT_NEOX below).
    attention_layout_copies: bool = False
    # The stack can run its blocks and its loss under torch.compile (Inductor), which fuses each chain of point-wise ops
    # and reductions between two GEMMs/attention calls into one kernel (`--compile`; kernels.ELEMENTWISE "compiled"):
    # torchtitan's compile.enable (per TransformerBlock, and the loss with compile.components "loss"; off by default),
    # and the stacks built on its model code. Stacks whose element-wise work already runs as fused kernels gain nothing.
    compiles: bool = False
    compile_loss: bool = False  # under --compile the loss is compiled too (step_time.LOSS_BYTES "compiled")
    # Data parallelism.
    grad_reduce_bytes: int = 4  # bytes per gradient element on the wire
    param_gather_bytes: int = 2  # bytes per parameter element all-gathered (ZeRO-1 update, FSDP units)
    overlap_grad_reduce: bool = True  # buckets reduced during the backward (False: after it)
    overlap_param_gather: bool = False  # ZeRO-1's updated weights gathered behind the next forward
    # ZeRO-1: "reduce_scatter" (+ all-gather), "broadcast" (torch ZeroRedundancyOptimizer), "allreduce" (gradients
    # all-reduced whole, then each rank's updated partition all-gathered: DeepSpeed's BF16_Optimizer) or
    # "owner_broadcast" (gradients all-reduced over every dp rank; whole parameters dealt to the ranks of the ZeRO-1
    # group, Layout.dp_shard, each owner's updated ones broadcast over that group in one call: InternEvo)
    zero1: str = "reduce_scatter"
    # With zero1 "allreduce": whether its whole-gradient all-reduce runs behind the backward (with overlap_grad_reduce)
    # or after it (nanotron's ZeRO-1 syncs the FP32 gradients once the pipeline is done; its ZeRO-0 is DDP's buckets)
    zero1_reduce_overlapped: bool = True
    zero1_shard_group: bool = False  # ZeRO-1 over groups of dp_shard ranks (InternEvo's zero1 size), not every dp rank
    # Bytes per local parameter moved through HBM once a step beside NCCL's own traffic around an all-reduce of the
    # gradients at the accumulation boundary in flattened buckets (flatten, scale, copy back: ZeRO-0, and ZeRO-1 where
    # it all-reduces). 0: the stack reduces in place (or the copies are not modelled). A list all-gather's copies
    # (ZeRO-1's updated partitions gathered into per-rank views): list_collectives.
    reduce_copy_bytes: float = 0.0
    # ZeRO-2 whose weights are never sharded, so whole all step: each micro-batch's backward reduce-scatters its
    # gradients into the shards, behind the next micro-batch, and the updated weights are gathered once after the
    # optimizer. DeepSpeed's ZeRO-2 (reduces in every backward); Megatron FSDP's optim_grads (megatron_fsdp.py:
    # grad_reduce_every_bprop, no wait until finish_grad_sync; param_and_grad_buffer.py: is_model_weight_buffer_distributed
    # False for "optim_grads").
    zero2_reduce_every_microbatch: bool = False
    fsdp_reduce_every_microbatch: bool = True  # ZeRO-3 (and FSDP's ZeRO-2) reduce-scatter each micro-batch
    # Its ZeRO-2/3 weight shard is the optimizer's FP32 master, counted in optimizer_bytes: torch FSDP with a BF16
    # param_dtype keeps the sharded parameter in FP32 and casts it only into the all-gather's input buffer (FSDP2
    # FSDPParam: _sharded_param_data FP32, all_gather_outputs BF16; FSDP1: _mp_shard freed after each all-gather), so
    # no BF16 shard lies beside the gathered weights (measured in tests/test_torch_pipelining_fsdp.py). False: the
    # shard is a copy of its own in the weights' dtype (DeepSpeed's ZeRO-3 partitions, BF16 or FP32 parameters with no
    # master). A ZeRO-2 that never shards the weights (zero2_reduce_every_microbatch) holds no shard either way.
    weight_shard_is_master: bool = False
    # Its accumulating micro-batches run under FSDP's no_sync() (Lightning Fabric's no_backward_sync over PyTorch FSDP1):
    # each unit is still gathered in every forward and (FULL_SHARD) every backward, but its gradient stays unsharded in
    # the dtype the unit computes in (param_gather_bytes), autograd adding each micro-batch's into it (AccumulateGrad:
    # grad_accumulation_bytes), and is reduce-scattered once, in the last micro-batch's backward (torch
    # distributed/fsdp/_runtime_utils.py _post_backward_hook returns before the reduce-scatter when not
    # _sync_gradients; _flat_param.py prepare_gradient_for_backward keeps the unsharded gradient of no_sync()).
    fsdp_no_sync: bool = False
    # Under a pipeline, torch.distributed.pipelining runs FSDP2 with gradient sync and reshard-after-backward off in
    # every backward but the last, and reduce-scatters every unit once after the schedule (its REDUCE_GRAD action,
    # waited for): weights gathered once per step, unsharded gradients accumulated in the reduce dtype, one exposed
    # reduce-scatter (torch/distributed/pipelining/stage.py backward_maybe_with_nosync, perform_reduce_grad).
    pipeline_fsdp_once: bool = False
    # Its training loop runs several micro-batches per optimizer step outside a pipeline (gradient accumulation). False:
    # one forward and backward per step, so without a pipeline the micro-batch is every sequence of a data-parallel rank.
    accumulates: bool = True
    # Hybrid sharding (Layout.dp_shard): ZeRO-3 within shard groups, gradients all-reduced across them (FSDP1
    # HYBRID_SHARD, FSDP2's 2-D mesh: torchtitan data_parallel_replicate_degree x data_parallel_shard_degree).
    hybrid_shard: bool = False
    # Which PyTorch FSDP runs its ZeRO-2/3 units (1: FullyShardedDataParallel, flat parameters; 2: fully_shard,
    # per-parameter DTensors; 0: neither): the HBM passes its own kernels make around each collective
    # (overlap.fsdp_copy_time).
    torch_fsdp: int = 0
    gather_per_tensor: bool = False  # ZeRO-3 gathers each parameter tensor (DeepSpeed) instead of one flat unit (FSDP)
    prefetch: bool = True  # ZeRO-3 / FSDP gathers run ahead, behind the previous unit's compute
    # Its gathers (ZeRO-1's updated partitions, ZeRO-3's parameters) and ZeRO-3's reduce-scatters take a list of
    # per-rank tensors, which PyTorch copies out of / into NCCL's flat buffer (overlap.list_copy_time); each ZeRO-3
    # gather into a freshly zero-filled buffer (DeepSpeed 2021 partition_parameters._allgather_param: torch.zeros,
    # then all_gather)
    list_collectives: bool = False
    bucket_bytes: float = 25e6  # gradient bucket (the last one cannot overlap)
    # Pipeline and tensor parallelism.
    # The schedules whose activations/gradients between stages it sends behind compute (others: each transfer waited
    # for between computes). Reported (estimate --json assumptions); it shortens no transfer a stage waits for: the
    # receiver still waits a whole transfer after its producer ends, which the pipeline's closed form already charges
    # with its sends asynchronous (step_time.pipeline_costs).
    p2p_overlap: tuple[str, ...] = ()
    # Its stage split counts the embedding and the loss as a layer each, so a model chunk may hold only one of them
    # and pp*vpp may reach the layers + 2 (stage_split.max_chunks): Megatron-Core >= 0.11.0's
    # --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split, torchtitan's input and output
    # weights, Llama 3's pipeline.
    edge_chunks: bool = False
    # How its pipeline cuts the layers when the user names no split (stage_split.RULES): "balanced" (the cost-balanced
    # cut: this project's runtime, torchtitan's and Llama 3's), or "megatron" (Megatron-LM's L / S layers per stage, or
    # with the embedding and the loss a layer's slot each when S divides L + 2: transformer_block.py
    # get_num_layers_to_build; other cuts need a named layout, which shardwise's Megatron arguments give).
    stage_split: str = "balanced"
    # Its pipeline builds L / (pp*vpp) layers per chunk and nothing else: a layout whose pp*vpp does not divide the
    # layers cannot run (Framework.refusal with the model's layers).
    even_stages_only: bool = False
    # Its interleaved pipeline deals the layers to the vpp model chunks in equal runs (then each run over the pp ranks):
    # a vpp that does not divide the layers cannot run (InternEvo's partition_uniform asserts it).
    vpp_divides_layers: bool = False
    # The least pipeline degree its interleaved schedule runs on: Megatron-LM's arguments.py and parallel_state of
    # 2021-23 assert 'pipeline-model-parallel size should be greater than 2 with interleaved schedule'; later
    # Megatron-Core runs pp 2 interleaved (NeMo's and Megatron-Bridge's pp 2 recipes with virtual stages).
    min_interleaved_pp: int = 2
    # DeepSpeed's TrainSchedule: every step a blocking exchange with one neighbour, two transfers in a row
    # (schedules/closed_forms.py lockstep_transfers), each split into this many messages (its PartitionedTensor:
    # a meta tensor, then the data).
    p2p_lockstep: bool = False
    p2p_messages: int = 1
    # A stage that receives an activation or gradient its sender split over TP puts it back together (Megatron's
    # scatter/gather, DeepSpeed's PartitionedTensor, not under SP): all-gathers over TP per received micro-batch
    # (forward, backward), and the activation-sized HBM passes each one copies besides the collective.
    p2p_regathers: tuple[int, int] = (0, 0)
    p2p_regather_copies: int = 0
    # Each TP rank sends the next stage its share of the stage's output, 1/tp of the activation (Megatron's
    # scatter-gather, DeepSpeed's PartitionedTensor, or the sequence shard under SP). False: every TP rank sends the
    # whole activation, replicated over TP without SP, to the same TP rank of the next stage.
    p2p_split_over_tp: bool = True
    # Its pipeline is torch.distributed.pipelining's PipelineStage, which holds beyond the layers' saved tensors, per
    # model chunk: a receive buffer for the activation (every stage but the first) and one for the gradient (every stage
    # but the last) for each micro-batch of the schedule, allocated at its first step and kept (stage.py
    # _setup_forward_recv_info / _setup_backward_recv_info: one _make_tensor_from_meta per micro-batch); and each
    # micro-batch's stage output in fwd_cache from its forward to its backward (forward_one_chunk, backward_one_chunk's
    # fwd_cache.pop). planner/memory.py pipeline_buffer_bytes; measured on torch in tests/test_torch_pipelining_buffers.py.
    torch_stage_buffers: bool = False
    tp_comm_overlap: bool = False  # default for TP collectives overlapped with their GEMMs
    tp_comm_overlap_available: bool = False
    # Its sequence parallelism is DTensor's plan on [batch, seq, hidden] activations, sharded along dim 1 (torchtitan
    # apply_tp: SequenceParallel norms, PrepareModuleInput Shard(1) -> Replicate, RowwiseParallel output_layouts
    # Shard(1)). Two consequences, each from torch's code. (1) torch's functional collectives run along dim 1 where NCCL
    # gathers and scatters along dim 0: reduce_scatter_single copies its whole input first (torch.cat(torch.chunk(x,
    # tp, dim=1))), and all_gather_single its whole output after unless the micro-batch is one sequence
    # (_maybe_view_chunk_cat returns a view only when dim 0 is the group; torch 2.13
    # torch/distributed/_functional_collectives.py): copies on the compute stream (planner/layer_time.py _tp_comm).
    # (2) The column-parallel linears multiply the gathered (replicated) input and autograd keeps that for their weight
    # gradients: the whole sequence, not its shard (memory.SavedTensors.gathered_linear_inputs; measured on torch in
    # tests/test_dtensor_sequence_parallel.py), so the backward gathers nothing again unless selective (op-level)
    # checkpointing recomputed the gather. Megatron keeps the shard and re-gathers, along dim 0: no copy.
    dtensor_sp: bool = False
    # The profile of the same stack's later releases (deepspeed: deepspeed-2024; megatron-2021: megatron-core): named in
    # the one-line refusal of a layout this release cannot run and that one can (frameworks.check).
    later_release: str = ""
    sequence_parallel: str = "optional"  # "optional" | "always" (implied with tp > 1) | "never"
    context_parallel: tuple[str, ...] = ("ring", "allgather")  # attention over sequence shards it runs
    # How its context parallelism runs the attention (planner/kernels.py cp_attention_time, ring_merge_bytes): "te"
    # (Transformer Engine: the p2p ring's steps merged in the activation dtype; all-gather: each local query chunk
    # against the gathered keys before it, as Llama 3 does too) or "torch" (torch's context_parallel: the ring's steps
    # whatever its rotate method, merged and dK/dV accumulated and passed on in FP32).
    cp_attention: str = "te"
    async_sp_regather: bool = True  # SP's backward re-gather runs behind the input-gradient GEMM
    # What the stack runs at all.
    schedules: tuple[str, ...] = ("1f1b", "interleaved-1f1b")
    zero_stages: tuple[int, ...] = (0, 1)
    # The ZeRO stage the stack runs when the user names none (with and without a pipeline): what its data
    # parallelism always is (torchtitan: FSDP2, resharding after forward only without PP; NeMo and the
    # megatron-core profile: the distributed optimizer).
    default_zero: int = 0
    default_zero_with_pp: int | None = None
    # Its full recompute is torch.utils.checkpoint's non-reentrant checkpoint with early stopping (on by default since
    # torch 2.1, pytorch/pytorch#96866): the recomputation stops as soon as the last tensor the backward needs has been
    # saved again (torch/utils/checkpoint.py _StopRecomputationError, raised from the pack hook). A block's last GEMM
    # (FC2: its input and weight are saved before it runs) and what follows it (the residual add) do not run again.
    # False: the whole forward runs again (Megatron's CheckpointFunction, reentrant checkpoints).
    recompute_early_stop: bool = False
    # What `--recompute selective` means on this stack: "attention" (Megatron: the attention core, Korthikanti
    # et al. 2022) or "op" (torchtitan's op-level selective checkpointing: every matmul output but every
    # second one and the attention output kept, the rest recomputed).
    selective: str = "attention"
    # How it trains in FP8 (`--precision fp8`, planner/kernels.py FP8_CAST_BYTES): "te" (Transformer Engine's delayed
    # per-tensor scaling: fused casts, FP8 weight copies cached for the step), "torchao" (torchao Float8Linear,
    # dynamic tensor-wise scaling, eager casts each micro-batch), "" (no FP8 training).
    fp8: str = ""
    # The cross-entropy it runs (step_time.LOSS_BYTES): "megatron" (vocab-parallel, one kernel per op), "fused"
    # (NeMo's cross_entropy_loss_fusion), "eager" (F.cross_entropy on FP32 logits), "composer" (flash-attn's xentropy
    # and Composer's two training metrics on the same logits).
    loss: str = "megatron"
    # Whether an "eager" loss is charged its FP32 buffers in memory (memory.EAGER_LOSS_KEPT_BYTES and its transient), as
    # read from the stack's code; False where its loss's memory was not read (the default per-logit count).
    eager_loss_memory: bool = True
    # Its LM head gathers the logits over the TP ranks before the loss (a ColumnParallelLinear left at
    # parallel_output=False: an all-gather into a list of per-rank tensors, then torch.cat), so every TP rank runs
    # `loss` over the whole vocabulary instead of its shard (step_time.head_time, memory.last_stage_bytes).
    loss_gathers_logits: bool = False
    # Gradient accumulation outside the weight-gradient GEMMs (step_time.accumulation_time): bytes per local parameter
    # an extra pass moves after each micro-batch's backward, and whether the first micro-batch's gradient is taken as
    # it is (autograd's AccumulateGrad adopts it). 0: accumulated in the GEMM's epilogue (Megatron's
    # gradient_accumulation_fusion) or as the framework's other terms already count it.
    grad_accumulation_bytes: float = 0.0
    grad_accumulation_first_free: bool = True
    # Bytes per local parameter every micro-batch's backward moves casting the 16-bit weight gradient to the FP32
    # parameter's dtype before it is accumulated (autocast's weight cast's backward, ToCopyBackward: read 2, write 4),
    # where grad_accumulation_bytes counts the add alone.
    grad_cast_bytes: float = 0.0
    # Bytes per local parameter each forward moves casting the FP32 weights to the 16-bit compute type (step_time.
    # autocast_cast_time): a stack that keeps FP32 parameters and runs its linears under torch.autocast (or casts them
    # itself inside the linear) reads each FP32 weight and writes its 16-bit copy (4 + 2) in every forward (autocast's
    # weight cache lives only as long as the autocast region, one forward). 0: the weights the
    # GEMMs read are already 16-bit (a 16-bit parameter copy updated once per step, or FSDP casting into its gather).
    autocast_cast_bytes: float = 0.0
    # The stack's model keeps FP32 weights and residual stream under torch.autocast and saves what autocast made
    # (memory.SavedTensors.autocast_casts: each linear's BF16 input cast and weight copy, FP32 norm tensors).
    autocast_saved: bool = False
    # Selective recompute runs the rotary embedding again with the attention core (the stack applies RoPE inside
    # the checkpointed function: shardwise.model Attention._core); False: RoPE before it (Megatron's core_attn).
    selective_recomputes_rope: bool = False
    # Bytes per element of the tied embedding's gradient summed between the edge stages (step_time.tied_embedding_time);
    # None: grad_reduce_bytes.
    tied_grad_bytes: int | None = None
    # Bytes per parameter its optimizer step (AdamW and gradient clipping) moves through HBM; None: one fused pass
    # (Apex/Transformer Engine FusedAdam, torch's fused=True), step_time.OPTIMIZER_BYTES_PER_PARAM. torch's foreach
    # (multi-tensor) path still makes one pass per operation (TORCHTITAN below).
    optimizer_traffic: int | None = None
    tensor_parallel: bool = True  # False: the stack has no tensor (nor sequence) parallelism
    # tp above the KV heads: every rank computes and keeps the K/V heads its query heads read, a replicated copy
    # (BigCode's Megatron-LM fork, attention_head_type multiquery: `self.key_value = get_linear_layer(hidden,
    # 2 * kv_channels)`, a plain Linear on every TP rank). False: the KV heads are split, so tp must divide them
    # (Megatron-Core: num_query_groups_per_partition = divide(num_query_groups, tp); torchtitan, nanotron alike).
    replicates_kv_heads: bool = False
    # False: the stack has no expert parallelism (no mixture-of-experts layers of its own: a MoE model runs with every
    # expert on every rank, ep 1, if at all)
    expert_parallel: bool = True
    # True: its context parallelism runs only inside the fused attention kernel (Megatron-Core: Transformer Engine's
    # DotProductAttention; its own unfused DotProductAttention asserts context_parallel_size == 1): no cp > 1 with
    # the materialised softmax (--no-flash-attention)
    cp_fused_attention_only: bool = False
    recompute: tuple[str, ...] = RECOMPUTE
    # Full recompute of only some layers (--recompute-layers N): "block" (Megatron's --recompute-method block
    # --recompute-num-layers N: the first N layers of each model chunk, any N), "every" (every k-th block
    # checkpointed: torchtitan's selective_ac_option = "k", fms-fsdp's selective_checkpointing; N = a chunk's
    # layers // k), "" (its checkpointing wraps every block or none).
    partial_recompute: str = ""
    # What `--recompute selective` runs again when the stack names it by module (Job.recompute_modules, Megatron's
    # names): () for the `selective` policy above.
    recompute_modules: tuple[str, ...] = ()
    # How a MoE layer's local experts run their GEMMs (planner/moe.py expert_gemm_time): one grouped kernel over
    # all of them (0), or one cuBLAS GEMM per expert round-robin over this many streams (Transformer Engine's
    # GroupedLinear: multi_stream_cublas_gemm over get_num_compute_streams() = 4; grouped_gemm's gmm on SM90:
    # cuBLAS over NUM_STREAM = 4).
    expert_gemm_streams: int = 0
    # With the experts unsplit (ep x etp = 1), their weights ride in their layer's own data-parallel calls: the same
    # DDP buckets, the same FSDP all-gather and reduce-scatter per block. torchtitan's apply_fsdp gives the routed experts
    # a fully_shard of their own only when ep_degree > 1 (llama4 and deepseek_v3 parallelize.py); shardwise's
    # data_parallel shards them apart only under an expert placement (ep x etp > 1). False: the stack keeps the
    # experts' gradients in buffers or groups of their own even then, one more set of calls (Megatron's DDP puts
    # parameters with allreduce=False, every expert's, in expert_parallel_buffers; DeepSpeed's MoE param groups).
    experts_in_layer_units: bool = False
    max_zero_with_pp: int = 3
    # What an unnamed --zero / --recompute may become (estimate.complete_layout): () = any stage or policy the stack
    # runs, the fastest that fits. A stack whose later options were opt-in flags keeps its own defaults instead
    # (megatron-2021: the paper's full recompute without a distributed optimizer; ZeRO-1 and selective recompute
    # arrived in 2022 and are there only when named).
    unnamed_zero: tuple[int, ...] = ()
    unnamed_recompute: tuple[str, ...] = ()
    # Whether an unnamed --sequence-parallel (neither it nor --no-sequence-parallel given) may become SP where the
    # stack runs it optionally and it is faster or fits where plain TP does not (estimate.complete_layout). False:
    # the stack's own default is off (megatron-2021: SP arrived in 2022 as an opt-in flag; shardwise: `train`
    # runs without it unless asked).
    unnamed_sequence_parallel: bool = True
    # Whether `plan` searches only those defaults for what the user does not list (--zero, --recompute,
    # --sequence-parallel; planner/search.py SearchSpace.for_stack): a stack whose later options were a later release's
    # opt-in flags (megatron-2021: the 2021 code had none of them). False: every option the stack runs is searched, the
    # plan naming what it picks (shardwise's `train` runs sequence parallelism when the plan says --sequence-parallel).
    search_as_unnamed: bool = False
    # Whether a pipeline whose schedule the user does not name (neither --schedule nor --vpp) runs interleaved 1F1B at
    # the fastest depth that fits, as the stack's recipes set it (estimate.pipeline_shapes; plain 1F1B stays a
    # candidate). False: plain 1F1B, Megatron's own default (no --num-layers-per-virtual-pipeline-stage).
    interleave_unnamed: bool = False
    zero0_only_pure_dp: bool = False  # DDP cannot combine with TP or PP
    flash_attention: bool = True  # default of --flash-attention
    calibrated_step_overhead: str | None = None  # [measured] key of a fixed per-step cost (CALIBRATED_STEP_OVERHEAD)
    # The step's scalars (gradient norm, loss) in one all-reduce over every rank, waited for only when the norm
    # needs it (tp, pp, FSDP shards, split experts); else the loss's reduction runs behind the next step.
    # False: Megatron's norm all-reduces over tp and pp and the loss's over dp, each waited for.
    one_scalar_allreduce: bool = False
    # The launcher runs PyTorch's caching allocator with expandable segments (PYTORCH_CUDA_ALLOC_CONF=
    # expandable_segments:True): one segment per stream grown and shrunk by 2 MiB pages, so the memory its free
    # blocks hold can be given back and mapped again where it is needed (planner/memory.py allocator_slack).
    expandable_segments: bool = False
    cannot: tuple[str, ...] = field(default=())  # plain-words list for docs and --help

    def cannot_run(self) -> tuple[str, ...]:
        """`cannot`, with the capabilities its flags deny (expert parallelism)."""
        return self.cannot + (() if self.expert_parallel else ("expert parallelism (no mixture-of-experts layers of its own)",))

    def loss_run(self, compile: bool, compile_loss: bool = True) -> str:
        """The cross-entropy a job runs (step_time.LOSS_BYTES, memory.stack_saved_tensors): "compiled" under --compile where
        the stack compiles its loss too (`compile_loss`, unless the job's release compiled the blocks only), else its
        own `loss`."""
        return "compiled" if compile and self.compile_loss and compile_loss else self.loss

    def compile_refusal(self) -> str | None:
        """Why `--compile` does not apply to this stack (one clause), or None."""
        if self.fused_elementwise:
            return f"{self.name} already runs its norms, activations and rotary as fused kernels (nothing left for torch.compile to fuse)"
        if not self.compiles:
            return f"{self.name} runs its model eager (it has no torch.compile option)"
        return None

    def kv_refusal(self, num_kv_heads: int, tp: int) -> str | None:
        """Why this stack cannot split `num_kv_heads` KV heads over tp (one line naming the fix), or None."""
        if num_kv_heads % tp == 0 or (self.replicates_kv_heads and tp % num_kv_heads == 0):
            return None
        also = (" (megatron-2021, as BigCode's Megatron-LM fork trained StarCoder, replicates them)"
                if tp % num_kv_heads == 0 else "")
        return (f"tp={tp} does not divide the {num_kv_heads} KV heads, and {self.name} splits them over tp{also} — "
                f"pick a tp dividing {num_kv_heads}")

    def refusal(self, layout: Layout, num_layers: int | None = None, microbatches: int | None = None) -> str | None:
        """Why this stack cannot run `layout` (one clause naming it), or None; with the model's `num_layers`, also
        whether its pipeline can cut them; with the step's `microbatches` per rank, whether it accumulates them."""
        lay = layout
        if microbatches and microbatches > 1 and lay.pp == 1 and not self.accumulates:
            return (f"{self.name} runs one micro-batch per optimizer step (no gradient accumulation), and this step has "
                    f"{microbatches} (use --micro-batch {lay.micro_batch * microbatches})")
        if num_layers and lay.pp > 1 and not self.cuts(num_layers, lay.pp * lay.vpp):
            return (f"{self.name} cuts the {num_layers} layers into equal model chunks only, and pp*vpp = "
                    f"{lay.pp * lay.vpp} does not divide them (pick pp*vpp dividing {num_layers})")
        if num_layers and lay.pp > 1 and self.vpp_divides_layers and num_layers % lay.vpp:
            return (f"{self.name} deals the {num_layers} layers to its {lay.vpp} model chunks per rank in equal runs, "
                    f"and vpp = {lay.vpp} does not divide them (pick a vpp dividing {num_layers})")
        if lay.pp > 1 and not self.schedules:
            return f"{self.name} has no pipeline parallelism (use --pp 1)"
        if lay.tp > 1 and not self.tensor_parallel:  # before any rule about combining TP with something else
            return f"{self.name} has no tensor parallelism (use --tp 1)"
        if (lay.ep > 1 or lay.etp > 1) and not self.expert_parallel:
            return f"{self.name} has no expert parallelism (use --ep 1)"
        if lay.pp > 1 and lay.schedule not in self.schedules:
            return f"{self.name} has no {lay.schedule} pipeline schedule (it runs {', '.join(self.schedules)})"
        if lay.schedule == "interleaved-1f1b" and 1 < lay.pp < self.min_interleaved_pp:
            return (f"{self.name}'s interleaved schedule needs pp >= {self.min_interleaved_pp} (use --schedule 1f1b "
                    f"or a deeper pipeline)")
        if lay.zero not in self.zero_stages and lay.dp > 1:
            return f"{self.name} has no ZeRO-{lay.zero} (it runs ZeRO {', '.join(map(str, self.zero_stages))})"
        if lay.pp > 1 and lay.dp > 1 and lay.zero > self.max_zero_with_pp:
            return f"{self.name} cannot combine a pipeline with ZeRO-{lay.zero} (at most ZeRO-{self.max_zero_with_pp})"
        if self.zero0_only_pure_dp and lay.zero == 0 and lay.dp > 1 and (lay.tp > 1 or lay.pp > 1):
            return f"{self.name}'s DDP (ZeRO-0) does not combine with tensor or pipeline parallelism (use ZeRO-2/3)"
        if lay.replicas > 1 and lay.zero == 1 and not self.zero1_shard_group:
            return f"{self.name} shards ZeRO-1 over every data-parallel rank (drop --dp-shard)"
        if lay.replicas > 1 and lay.zero != 1 and not self.hybrid_shard:
            return f"{self.name} has no hybrid sharding (HSDP; drop --dp-shard)"
        if lay.recompute not in self.recompute:
            return f"{self.name} has no {lay.recompute} recompute (it runs {', '.join(self.recompute)})"
        if lay.recompute_layers is not None and not self.partial_recompute:
            return f"{self.name} recomputes every layer or none (drop --recompute-layers)"
        if lay.tp > 1 and self.sequence_parallel == "always" and not lay.sequence_parallel:
            return f"{self.name}'s tensor parallelism always shards the sequence (add --sequence-parallel)"
        if lay.sequence_parallel and lay.tp > 1 and self.sequence_parallel == "never":
            return f"{self.name} has no sequence parallelism (drop --sequence-parallel)"
        if lay.cp > 1 and lay.cp_mode not in self.context_parallel:
            runs = f"it runs {' and '.join(self.context_parallel)}" if self.context_parallel else "drop --cp"
            return f"{self.name} has no {lay.cp_mode} context parallelism ({runs})"
        if self.name == "shardwise":
            return runtime_refusal(layout)
        return None

    def attention_refusal(self, layout: Layout, flash_attention: bool) -> str | None:
        """Why this stack cannot run `layout` with (or without) a fused attention kernel, or None."""
        if layout.cp > 1 and not flash_attention and self.cp_fused_attention_only:
            return (f"{self.name} runs context parallelism only in Transformer Engine's fused attention (Megatron-Core's "
                    f"unfused DotProductAttention asserts context_parallel_size == 1) — drop --no-flash-attention or "
                    f"use --cp 1")
        return None

    def cuts(self, num_layers: int, chunks: int) -> bool:
        """Whether its pipeline can cut `num_layers` layers into `chunks` model chunks (even_stages_only)."""
        return not self.even_stages_only or num_layers % chunks == 0

    def partial_counts(self, chunk_layers: int) -> tuple[int, ...]:
        """The --recompute-layers values below `chunk_layers` (a model chunk's layers) this stack can run, ascending."""
        if self.partial_recompute == "every":  # every k-th of the chunk's blocks, k >= 2
            return tuple(sorted({chunk_layers // k for k in range(2, chunk_layers + 1)} - {0}))
        return tuple(range(1, chunk_layers)) if self.partial_recompute == "block" else ()

    def partial_refusal(self, layout: Layout, chunk_layers: int) -> str | None:
        """Why this stack cannot recompute `layout.recompute_layers` of a `chunk_layers`-layer chunk, or None."""
        n = layout.recompute_layers
        if n is None or n >= chunk_layers or self.partial_recompute != "every" or n in self.partial_counts(chunk_layers):
            return None
        near = ", ".join(map(str, self.partial_counts(chunk_layers)[-4:]))
        return (f"{self.name} checkpoints every k-th block, so of {chunk_layers} layers it recomputes "
                f"{chunk_layers} // k: --recompute-layers {n} is none of them (the largest: {near})")

    def fsdp_once_per_step(self, layout: Layout) -> bool:
        """Whether FSDP's units gather once and reduce-scatter once per step, after a pipeline schedule, holding
        every gradient unsharded until then (`pipeline_fsdp_once` under a pipeline)."""
        return layout.pp > 1 and self.pipeline_fsdp_once

    def zero_when_unnamed(self, layout: Layout) -> int:
        """The ZeRO stage this stack runs `layout` with when the user names none."""
        if layout.pp > 1 and self.default_zero_with_pp is not None:
            return self.default_zero_with_pp
        return self.default_zero


MEGATRON_2021 = Framework(
    name="megatron-2021", expert_parallel=False, later_release="megatron-core",
    summary="Megatron-LM as in Narayanan et al. 2021: materialised softmax (FlashAttention-1 with --flash-attention), FP32 gradient all-reduce after the "
            "backward (no overlap), blocking pipeline transfers, 1F1B or interleaved 1F1B with scatter/gather, full "
            "recompute; asked for SP, selective recompute or the distributed optimizer (ZeRO-1), the same code line as "
            "released in 2022 (Korthikanti et al. 2022, Megatron-LM v3.0), still without any overlap",
    sources=("Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM' (SC'21)",
             "NVIDIA/Megatron-LM arguments.py: bf16 forces accumulate_allreduce_grads_in_fp32",
             "Korthikanti et al. 2022 and Megatron-LM v3.0 (2022-06): --sequence-parallel, "
             "--recompute-activations (selective), --use-distributed-optimizer"),
    # Materialised softmax by default, as the paper ran; --flash-attention: FlashAttention-1 (Megatron-LM's
    # --use-flash-attn, NVIDIA/Megatron-LM 2023-03, calls flash-attn's flash_attn_unpadded_func, the 0.2.x API).
    attention="fa1", grad_reduce_bytes=4, overlap_grad_reduce=False, zero_stages=(0, 1), flash_attention=False,
    replicates_kv_heads=True,  # multi-query attention came to this code line in BigCode's fork (StarCoder: MQA at TP 4)
    context_parallel=(), unnamed_zero=(0,), unnamed_recompute=("full",), unnamed_sequence_parallel=False,
    search_as_unnamed=True,
    # --checkpoint-activations --activations-checkpoint-method block --activations-checkpoint-num-layers N
    # (NVIDIA/Megatron-LM c1e0689d9, 2021-08-10: after the paper's runs, before v3.0), only when named.
    partial_recompute="block",
    # p2p_communication.py _communicate: after each receive, gather_split_1d_tensor (an all_gather into a list
    # of views of one buffer: PyTorch's list all-gather copies out of its flat result), not under SP.
    p2p_regathers=(1, 1), p2p_regather_copies=2,
    cannot=("ZeRO-2/3", "GPipe and ZB-H1 schedules",
            "context parallelism (Megatron added it in 2024, Megatron-Core --context-parallel-size)",
            "a pipeline whose pp*vpp does not divide the layers", "interleaving on a 2-stage pipeline"),
    # megatron/model/transformer.py ParallelTransformer (Megatron-LM v2, 2021, and the same line to 2023) builds
    # num_layers // pp layers a stage, asserting 'num_layers must be divisible by pipeline_model_parallel_size', and
    # // vpp of those a chunk ('num_layers_per_stage must be divisible by virtual_pipeline_model_parallel_size'); the
    # embedding/loss slots and named layouts of the "megatron" rule came later.
    stage_split="megatron", even_stages_only=True, min_interleaved_pp=3,
)

# Megatron-LM overlaps pipeline transfers with compute in the interleaved schedule only (--overlap-p2p-communication,
# f9283c5a 2023-05-31, on by default from late 2023): for 1F1B, arguments.py sets overlap_p2p_comm False ("non-interleaved
# schedule does not support overlapping p2p communication") and schedules.py waits on each send_forward_recv_backward
# between computes. NeMo runs the same schedules.
MEGATRON_P2P_OVERLAP = ("interleaved-1f1b",)

MEGATRON_CORE = Framework(
    name="megatron-core", cp_fused_attention_only=True,
    summary="Megatron-LM / Megatron-Core with --use-distributed-optimizer --overlap-grad-reduce "
            "--overlap-param-gather, Transformer Engine fused attention, FP32 gradient reduce, optional SP, "
            "selective recompute, optional TP comm overlap (--tp-comm-overlap); ZeRO-2/3 as Megatron FSDP "
            "(--use-megatron-fsdp: gradients reduce-scattered every micro-batch behind the next one; ZeRO-3's "
            "parameters gathered per layer with prefetch, ZeRO-2's never sharded, gathered once after the optimizer)",
    sources=("NVIDIA/Megatron-LM megatron/core/distributed (DistributedDataParallel, bucket_size 40M params), "
             "megatron/core/optimizer/distrib_optimizer.py, arguments.py (fp32 grad reduce with bf16)",
             "NVIDIA/Megatron-LM megatron/core/distributed/fsdp (Megatron FSDP, --data-parallel-sharding-strategy "
             "optim_grads / optim_grads_params)",
             "Korthikanti et al. 2022 (SP, selective recompute)"),
    attention="te", grad_reduce_bytes=4, overlap_grad_reduce=True, overlap_param_gather=True,
    bucket_bytes=40e6 * 4, p2p_overlap=MEGATRON_P2P_OVERLAP, tp_comm_overlap_available=True, zero_stages=(0, 1, 2, 3),
    default_zero=1,
    zero2_reduce_every_microbatch=True,
    cannot=("GPipe and ZB-H1 schedules",),
    fp8="te", expert_gemm_streams=4,
    # --recompute-granularity full --recompute-method block --recompute-num-layers N: the first N layers of each
    # TransformerBlock, one per virtual chunk (megatron/core/transformer/transformer_block.py _checkpointed_forward)
    partial_recompute="block",
    # --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split (NVIDIA/Megatron-LM ef490839e,
    # 2025-02-03, "Uneven Virtual Pipeline Parallelism", first in core_v0.11.0): the embedding and the loss take a
    # layer's slot, (L + 2) / (pp*vpp) slots a chunk, the first and the last chunk one layer fewer
    # (transformer_block.py get_num_layers_to_build)
    edge_chunks=True,
    stage_split="megatron",
)

NEMO = Framework(
    name="nemo", cp_fused_attention_only=True,
    summary="NeMo's Megatron recipes (megatron-core underneath): distributed_fused_adam with overlapped grad "
            "and param sync in bf16 (grad_sync_dtype), TP comm overlap (ub_tp_comm_overlap), SP with every TP "
            "(the recipes' sequence_parallel; TP comm overlap needs it), overlapped pipeline p2p; ZeRO-2/3 as "
            "Megatron FSDP",
    sources=("NVIDIA/dgxc-benchmarking nemo_megatron/gpt3_175b_hydra.yaml (commit 8f5cbb3): distributed_fused_adam, "
             "overlap_grad_sync, overlap_param_sync, grad_sync_dtype bf16, bucket_cap_mb 220, ub_tp_comm_overlap, "
             "sequence_parallel, overlap_p2p_comm",
             "NVIDIA/NeMo nemo/core/optim/distributed_adam.py; megatron_base_model.py setup_optimization: with a bf16 "
             "model the FP32 master weights are kept as 16-bit remainders (store_param_remainders): 2 + 4 + 4 = 10 "
             "optimizer bytes per parameter"),
    grad_bytes=2, optimizer_bytes=10, attention="te", grad_reduce_bytes=2, overlap_grad_reduce=True,
    overlap_param_gather=True, bucket_bytes=220 * 2**20, p2p_overlap=MEGATRON_P2P_OVERLAP, tp_comm_overlap=True,
    tp_comm_overlap_available=True,
    zero_stages=(0, 1, 2, 3), default_zero=1, sequence_parallel="always", zero2_reduce_every_microbatch=True,
    cannot=("GPipe and ZB-H1 schedules",),
    fp8="te", expert_gemm_streams=4,
    loss="fused",
    # Every NeMo recipe with a pipeline interleaves it (nemo/collections/llm/recipes: gpt3_175b pp 8 vpp 6, llama3_70b
    # pp 4 vpp 5, mixtral_8x7b pp 4 vpp 8; Megatron-Bridge nemotron4_340b pp 12 vpp 8; dgxc-benchmarking's NeMo configs
    # INTERLEAVED_PIPELINE).
    interleave_unnamed=True,
    # scripts/performance/executors.py: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True on every GPU but B200
    expandable_segments=True,
    partial_recompute="block",  # activations_checkpoint_granularity full, method block, num_layers N (megatron-core's)
    edge_chunks=True,  # megatron-core's account_for_embedding/loss_in_pipeline_split in its model config
    stage_split="megatron",  # megatron-core's split: its recipes name no pipeline layout
)

DEEPSPEED = Framework(
    name="deepspeed", later_release="deepspeed-2024",
    summary="DeepSpeed as its published runs used it (the 2021-22 releases behind MT-NLG, BLOOM, GPT-NeoX, GLM-130B "
            "and Narayanan et al.'s ZeRO-3 baseline; with Megatron-DeepSpeed for TP): DeepSpeed's defaults — "
            "reductions at the accumulation boundary after the backward (ZeRO-0/1) or in every micro-batch's "
            "backward (ZeRO-2), overlap_comm off; ZeRO-1 all-reducing every gradient whole, then gathering the "
            "updated partitions; ZeRO-3 gathering each parameter after a host synchronisation, never prefetched "
            "and gathered again for a recomputed forward (v0.3.14-v0.5.10, 2021-04 to 2022-01: their trace check "
            "failed on every module); gradients in the model dtype; a materialised softmax (FlashAttention-1 with "
            "--flash-attention); only its 1F1B pipeline "
            "(TrainSchedule: blocking exchanges in lockstep, activations split over TP and gathered again), with "
            "ZeRO <= 1. Releases from v0.6.0 (2022) coalesce and prefetch ZeRO-3's gathers: --framework deepspeed-2024",
    sources=("deepspeedai/DeepSpeed runtime/engine.py allreduce_gradients ('ZeRO stage >= 2 communicates during "
             "non gradient accumulation boundaries'), communication_data_type (bf16 with bf16); config docs "
             "(overlap_comm default false)",
             "7b46d11fa (2021-04-07, v0.3.14) runtime/zero/stage3.py setup_zero_stage3_hooks: the step reset runs "
             "after the top module's fetch hook, so get_params_to_prefetch ('Tracing failed. Prefetching is "
             "disabled') and _keep_for_later fail on every module until 4912e0ad7 (v0.6.0); issue #1069",
             "commit 599258f97 (2021-03-08) runtime/zero/partition_parameters.py _allgather_param: "
             "torch.cuda.synchronize() then one all_gather per parameter into a list of per-rank views, "
             "_reduce_scatter_gradient from one (PyTorch's ProcessGroupNCCL copies each list entry: one copy kernel "
             "per rank per call); replaced by coalesced gathers in 4912e0ad7 (2022-01)",
             "runtime/pipe/engine.py ('ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'), TrainSchedule (1F1B)",
             "v0.5.5 (2021-11-02) runtime/pipe/schedule.py TrainSchedule.steps (lockstep exchanges), p2p.py (blocking "
             "send/recv), engine.py _exec_forward_pass / _exec_backward_pass (PartitionedTensor.full), runtime/utils.py",
             "Rajbhandari et al. 2020, ZeRO (SC'20)",
             "v0.5.5 runtime/engine.py _configure_zero_optimizer (stage 1: FP16_DeepSpeedZeroOptimizer with "
             "contiguous_gradients and overlap_comm forced off), runtime/zero/stage2.py reduce_gradients -> "
             "reduce_ipg_grads -> buffered_reduce_fallback -> allreduce_and_copy (all_reduce of each flattened bucket, "
             "copied back), step (dist.all_gather into a list of the partitions); the same in v0.6-v0.7.1 "
             "stage_1_and_2.py, until b288cf1b9 (2022-08-23)"),
    # Materialised softmax by default (Megatron-DeepSpeed's of MT-NLG, BLOOM, GLM-130B); --flash-attention:
    # FlashAttention-1, as GPT-NeoX ran it from 2023-01 (EleutherAI/gpt-neox 841679f7 requirements-flashattention.txt
    # flash-attn==0.2.2, megatron/model/transformer.py attention-config "flash": flash_attn_unpadded_qkvpacked_func).
    grad_bytes=2, attention="fa1", grad_reduce_bytes=2, overlap_grad_reduce=False,
    # ZeRO-1 (v0.3.17-v0.7.1: stage2.py / stage_1_and_2.py with partition_grads False; engine.py forces
    # contiguous_gradients off for stage 1, so reduce_ipg_grads takes buffered_reduce_fallback): every gradient
    # all-reduced whole in the model dtype at the boundary (allreduce_and_copy: flatten 2 + 2, div_ 2 + 2,
    # all_reduce, copy back 2 + 2 = 12 B; ZeRO-0's engine.buffered_allreduce_fallback -> allreduce_and_copy the same),
    # then the updated partitions all-gathered into a list (list_collectives: copy-out 2 + 2 = 4 B). b288cf1b9
    # (2022-08-23, v0.7.2) let stage 1 keep contiguous gradients (reduced to their owners): deepspeed-2024.
    zero1="allreduce", reduce_copy_bytes=12,
    # ZeRO-3 prefetch off: in v0.3.14-v0.5.10 (7b46d11fa, 2021-04, until 4912e0ad7, 2022-01) the step reset on the top
    # module runs after its fetch hook, so every module fails the trace check (v0.5.5 stage3.py get_params_to_prefetch,
    # "Tracing failed. Prefetching is disabled"; issue #1069) and the reuse check too (_keep_for_later): a checkpointed
    # layer is gathered in the forward, the recomputed forward and the backward. Checked by running those releases'
    # hooks and coordinators over a checkpointed Megatron-shaped GPT (docs/accuracy.md).
    zero2_reduce_every_microbatch=True, gather_per_tensor=True, prefetch=False, list_collectives=True,
    bucket_bytes=5e8 * 2, schedules=("1f1b",), zero_stages=(0, 1, 2, 3), max_zero_with_pp=1, flash_attention=False,
    sequence_parallel="never", context_parallel=(),
    # runtime/pipe/engine.py (is_pipe_partitioned, is_grad_partitioned): the forward rebuilds its received input
    # with PartitionedTensor.full(), the backward its own output (cleared after the send) and the received
    # gradient; full() = zeros, copy of the local part, all_gather, clone (runtime/utils.py): 3 passes.
    p2p_lockstep=True, p2p_messages=2, p2p_regathers=(1, 2), p2p_regather_copies=3,
    # Megatron-DeepSpeed runs a GLU as eager ops after the FC1 bias it cannot fuse (arguments.py: "if glu-activation
    # is used, please set --no-bias-gelu-fusion"; model/glu_activations.py x1 * act(x2); ParallelMLP:
    # act(intermediate + bias)): the bias add over both halves (read 2f, write 2f: 8 B per f), the activation on
    # one (4), the product (6) = 18, where a fused kernel reads both halves and writes one (6). Those eager ops keep the
    # biased FC1 output (2f: the activation's and the product's views of it), the activation's output and the product
    # (FC2's input): 4 f-wide tensors.
    glu_bytes=18, glu_tensors=4,
    expert_gemm_streams=1,  # deepspeed/moe/experts.py Experts.forward: one local expert after another
    # The Megatron-DeepSpeed of these runs recomputes whole layers or none (bigscience-workshop/Megatron-DeepSpeed
    # megatron/arguments.py: --checkpoint-activations, --checkpoint-num-layers; no selective recompute, Megatron-LM
    # v3.0's): an unnamed --recompute is the faster of those two that fits, and plan lists selective only when named.
    unnamed_recompute=("none", "full"), search_as_unnamed=True,
    cannot=("interleaved, GPipe and ZB-H1 schedules", "a pipeline with ZeRO-2/3",
            "recompute of only some layers (--checkpoint-num-layers groups layers; every group is recomputed)",
            "sequence parallelism (AutoTP splits the layers, not the sequence; Ulysses is context parallelism)",
            "ring or all-gather context parallelism (its Ulysses splits the heads with all-to-all: not modelled)"),
)

# GPT-NeoX v1.0 (EleutherAI/gpt-neox, the release the Pythia suite was trained with) on DeepSpeed: as deepspeed, with
# its own attention layer around flash-attn.
GPT_NEOX = replace(
    DEEPSPEED, name="gpt-neox", expert_parallel=False, later_release="",
    summary="GPT-NeoX v1.0 on DeepSpeed (the Pythia suite's stack): as deepspeed, but its FlashAttention path "
            "copies Q, K and V into flash-attn's packed layout and the output back in every forward, and the "
            "gradients back in every backward",
    sources=("EleutherAI/gpt-neox v1.0 megatron/model/transformer.py ParallelSelfAttention.flash_attention "
             "(query/key/value .transpose(0, 1).reshape(b * s, 1, np, hn), torch.concat([q, k, v], dim=1), "
             "flash_attn_unpadded_qkvpacked_func) and forward (context_layer.permute(2, 0, 1, 3).contiguous())",
             "EleutherAI/pythia models/*/pythia-*.yml at a19eecb ('attention-config': [[['flash'], N]])"),
    attention_layout_copies=True,
)

DEEPSPEED_2024 = replace(
    DEEPSPEED, name="deepspeed-2024", unnamed_recompute=(), search_as_unnamed=False, later_release="",
    summary="DeepSpeed since 2022 (>= 0.6) with its defaults: as deepspeed, but ZeRO-3 gathers each submodule's "
            "parameters coalesced (no host synchronisation, no per-rank copies) and prefetches them behind the "
            "previous module (stage-3 overlap_comm on by default); FlashAttention-2 attention",
    sources=("deepspeedai/DeepSpeed 4912e0ad7 (2022-01-20, 'Various ZeRO Stage3 Optimizations'): coalesced "
             "all-gathers; runtime/zero/partitioned_param_coordinator.py (prefetch); config docs",),
    # prefetch: from v0.6.0 the trace recorded in the first step repeats under Megatron-DeepSpeed's checkpointing and
    # is never invalidated (v0.6.2 partitioned_param_coordinator.py trace_prologue); every gather is found in flight,
    # about a layer ahead under stage3_max_live_parameters (run from the v0.6.0-v0.6.5 code, docs/accuracy.md).
    attention="fa2", flash_attention=True, prefetch=True, list_collectives=False, sequence_parallel="optional", fp8="te",
    # stage 1 keeps contiguous gradients since b288cf1b9 (v0.7.2): average_tensor reduces each rank's range to its
    # owner (dist.reduce: a reduce-scatter's bytes)
    zero1="reduce_scatter", reduce_copy_bytes=0,
    glu_bytes=None,  # the element-wise table's (the GLU path of its Megatron-DeepSpeed release not checked)
    glu_tensors=3,  # likewise what that path keeps: the default count
    cannot=("interleaved, GPipe and ZB-H1 schedules", "a pipeline with ZeRO-2/3",
            "recompute of only some layers (--checkpoint-num-layers groups layers; every group is recomputed)"),
)

# DeepSpeed's pipeline engine with bf16 (0.6-0.7, BigScience's BLOOM): bf16 needs ZeRO stage 0 there and the
# BF16_Optimizer, which partitions its FP32 master weights and Adam states over dp itself (ZeRO-1).
DEEPSPEED_BF16 = replace(
    DEEPSPEED, name="deepspeed-bf16",
    summary="DeepSpeed's bf16 pipeline as BLOOM ran it (0.6-0.7, BF16_Optimizer): as deepspeed, but each "
            "micro-batch's BF16 gradients are added into an FP32 copy of every gradient after its backward, "
            "the FP32 gradients are all-reduced in BF16 at the end of the step (not reduce-scattered) and the "
            "tied embedding's in FP32, and each rank's updated partition of the weights is all-gathered",
    sources=("deepspeedai/DeepSpeed v0.6.5 runtime/bf16_optimizer.py (update_hp_grads: hp_grad.add_(lp.grad.to("
             "fp32)); clear_lp_grads; fp32_groups_gradients), runtime/pipe/engine.py (_exec_backward_pass calls "
             "update_hp_grads every micro-batch; _exec_reduce_grads: bf16 needs ZeRO stage 0 -> _bf16_reduce_grads -> "
             "buffered_allreduce_fallback; _exec_reduce_tied_grads on weight._hp_grad), runtime/engine.py "
             "(communication_data_type bf16; allreduce_bucket: flatten, cast, all_reduce, copy back)",
             "bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm (bf16, ZERO_STAGE=0)"),
    # The FP32 copy of every gradient (4) beside the BF16 ones autograd writes (2), both kept through the step.
    # engine.py allreduce_bucket on the FP32 gradients: flatten (4 + 4), cast to BF16 (4 + 2), mul_ (2 + 2),
    # all_reduce, cast back (2 + 4), allreduce_and_copy's copy back (4 + 4) = 32 B; all_gather_dp_groups' list
    # all-gather of the BF16 partitions (list_collectives, as deepspeed: copy-out 2 + 2) = 4 B.
    grad_bytes=6, zero1="allreduce", reduce_copy_bytes=32, tied_grad_bytes=4,
    # update_hp_grads after every backward: the BF16 gradient cast to FP32 (read 2, write 4), then added into the
    # FP32 gradient (read 4 + 4, write 4): 18 B per parameter, the first micro-batch too.
    grad_accumulation_bytes=18, grad_accumulation_first_free=False,
    # BF16_Optimizer always partitions its FP32 master weights and Adam states over dp: ZeRO-1, nothing else.
    zero_stages=(1,), default_zero=1,
    cannot=("ZeRO-0/2/3 (its BF16_Optimizer always partitions the optimizer states, and only that)",
            "interleaved, GPipe and ZB-H1 schedules", "sequence parallelism", "ring or all-gather context parallelism"),
)

TORCHTITAN = Framework(
    name="torchtitan",
    summary="torchtitan: FSDP2 (reshard after forward without PP, not with PP), FP32 reduce_dtype, reduce-scatter "
            "every micro-batch (with PP: once per step after the schedule, as torch.distributed.pipelining runs FSDP), TP always with sequence parallelism, torch.distributed.pipelining schedules, "
            "SDPA (FlashAttention-2), AdamW as torch's foreach kernels, one pass per operation (its default until "
            "2025-02; fused since)",
    sources=("pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py (apply_fsdp, apply_tp, apply_ddp), "
             "config/configs.py (mixed_precision_reduce = float32)",
             "pytorch/pytorch torch/distributed/pipelining/stage.py (backward_maybe_with_nosync: FSDP's "
             "set_requires_gradient_sync(False) and set_reshard_after_backward(False) but in the last backward; "
             "perform_reduce_grad: post_backward of every FSDP group after the schedule)",
             "Liang et al. 2024, 'TorchTitan' (ICLR 2025)"),
    weight_bytes=2, grad_bytes=4, optimizer_bytes=12, attention="fa2", fused_elementwise=False, compiles=True, compile_loss=True,
    glu_tensors=4,  # models/llama3/model.py FeedForward: self.w2(F.silu(self.w1(x)) * self.w3(x)), eager
    grad_reduce_bytes=4, overlap_grad_reduce=True, fsdp_reduce_every_microbatch=True, pipeline_fsdp_once=True, bucket_bytes=100 * 2**20,
    schedules=("gpipe", "1f1b", "interleaved-1f1b"), zero_stages=(0, 2, 3), zero0_only_pure_dp=True,
    default_zero=3, default_zero_with_pp=2, selective="op", hybrid_shard=True, torch_fsdp=2, experts_in_layer_units=True,
    torch_stage_buffers=True,  # torchtitan's pipeline_llama builds torch.distributed.pipelining PipelineStages
    weight_shard_is_master=True,  # MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), FP32 parameters
    # activation_checkpoint mode "full": ptd_checkpoint_wrapper(block, use_reentrant=False, preserve_rng_state=False)
    # (1ea476e9f parallelisms/parallelize_llama.py checkpoint_wrapper), the default early stop
    recompute_early_stop=True,
    # torch.optim.AdamW(..., weight_decay=0.1, foreach=True) (torchtitan 1ea476e9f train.py build_optimizer; `fused`
    # became an option in 40f8fd007, 2024-06, and the default only in 6e4988550, 2025-02-24): torch's
    # _multi_tensor_adamw, one multi-tensor kernel per operation, per FP32 element: params.mul_(1 - lr wd) (4 + 4),
    # exp_avgs.lerp_(grads) (4 + 4 + 4), exp_avg_sqs.mul_ (8) .addcmul_(grads, grads) (12), sqrt (8), div_ (8),
    # add_(eps) (8), params.addcdiv_(exp_avgs, denom) (16) = 80; clip_grad_norm_(foreach=True): a norm per gradient
    # (4) and every gradient times the clip coefficient (8) = 12. 92 in all, as Composer's DecoupledAdamW below.
    optimizer_traffic=92,
    # activation_checkpoint mode "selective" with selective_ac_option "k": every k-th block wrapped in a full
    # checkpoint (torchtitan 1ea476e9f parallelisms/parallelize_llama.py checkpoint_wrapper; default "2")
    partial_recompute="every",
    sequence_parallel="always", tp_comm_overlap_available=True, dtensor_sp=True,
    cannot=("ZeRO-1", "DDP (ZeRO-0) with TP or PP", "ZB-H1 (its zero-bubble schedules need several stages per rank)"),
    fp8="torchao",
    loss="eager",
    cp_attention="torch",
    expandable_segments=True,  # run_train.sh: PYTORCH_ALLOC_CONF="expandable_segments:True" (a5e57e4a9, 2024-10-22)
    # generate_llm_fqn_per_model_part counts tok_embeddings and norm + output as a layer each (input_weight =
    # output_weight = 1: pytorch/torchtitan f64cf3c18, 2025-04-15, #1103), stages up to the layers + 2, so a stage may
    # hold only one of them; module_fqns_per_model_part (0.2.x, what `plan --emit torchtitan` writes) any split
    edge_chunks=True,
)

AUTOMODEL = replace(
    TORCHTITAN, name="automodel",
    summary="NeMo AutoModel's own model path (its MoE recipes: BackendConfig attn/linear/rms_norm 'te', DeepEP): "
            "bf16 parameters (from_config's torch_dtype 'auto' is bfloat16) with no FP32 master copy, torch.optim.Adam "
            "states in bf16, FSDP2 with bf16 compute and FP32 gradient reduce-scatter (resharding after forward only "
            "without PP), Transformer Engine's fused attention (cuDNN on Hopper), norms and rotary embedding, experts "
            "as grouped_gemm's gmm (cuBLAS per expert over 4 streams on SM90), activation checkpointing of whole blocks",
    sources=("NVIDIA-NeMo/Automodel 89e3a9fdd (2025-10-06, the performance summary's first table): "
             "nemo_automodel/components/_transformers/auto_model.py from_config (torch_dtype 'auto' -> bfloat16), "
             "components/moe/parallelizer.py apply_fsdp (MixedPrecisionPolicy bf16 / fp32 reduce, "
             "reshard_after_forward = not pp_enabled) and apply_ac (checkpoint_wrapper per block), "
             "examples/benchmark/configs/*_te_deepep.yaml (torch.optim.Adam, activation_checkpointing)",
             "components/moe/layers.py GroupedExpertsDeepEP (grouped_gemm ops.gmm); fanshiqing/grouped_gemm "
             "csrc/grouped_gemm.cu ('Use cuBLAS for SM90', NUM_STREAM 4)"),
    weight_bytes=2, grad_bytes=2, optimizer_bytes=4, attention="te", fused_elementwise=True, fp8="", expert_gemm_streams=4,
    glu_tensors=3,  # its model path's activations not read here: the default count, not torchtitan's eager one
    eager_loss_memory=False,  # its loss functions' buffers not read here either
    weight_shard_is_master=False,  # BF16 parameters and no FP32 master: the shard is the BF16 parameter itself
    recompute_early_stop=False,  # non-reentrant too (apply_ac), but a MoE block's last saves follow its expert GEMMs: not derived
    expandable_segments=False,  # no source found: the default allocator
    optimizer_traffic=None,  # torch.optim.Adam with bf16 states: not derived here, the one-pass figure
    partial_recompute="",  # apply_ac wraps every block
    # its splitter (components/distributed/pipelining/functional.py generate_hf_model_fqn_per_model_part) deals the
    # layers over the stages and adds the embedding and the head to the edge ones: a layer in every stage
    edge_chunks=False,
    cannot=TORCHTITAN.cannot + ("FP8 training (not in its published runs)", "recompute of only some layers"),
)

# MosaicML Composer's FSDP (PyTorch FSDP1), as llm-foundry's MPT recipes and benchmark sweeps ran it in 2023-24
# (Composer 0.16-0.17, torch 2.0-2.1; llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml at 061f2c7c).
COMPOSER = replace(
    TORCHTITAN, name="composer",
    summary="MosaicML Composer's FSDP (PyTorch FSDP1) as llm-foundry's MPT recipes run it: FULL_SHARD (ZeRO-3) or "
            "SHARD_GRAD_OP (ZeRO-2), mixed_precision DEFAULT (BF16 parameters and compute, FP32 gradient "
            "reduce-scatter every micro-batch), eager PyTorch norms and activations, flash-attn's fused cross-entropy and "
            "Composer's two training metrics on the logits every micro-batch, "
            "Composer's DecoupledAdamW (one kernel per operation and parameter) with FSDP's gradient clipping; no "
            "tensor, pipeline or context parallelism. `composer-pure`: mixed_precision PURE (BF16 reduce-scatter)",
    sources=("mosaicml/composer v0.16.4 composer/trainer/dist_strategy.py set_fsdp_default (mixed_precision DEFAULT, "
             "use_orig_params True, backward_prefetch BACKWARD_POST), composer/trainer/mosaic_fsdp_utils.py "
             "get_mixed_precision (DEFAULT: param bf16, reduce fp32; PURE: all bf16), composer/optim/"
             "decoupled_weight_decay.py DecoupledAdamW.adamw",
             "mosaicml/llm-foundry 061f2c7c llmfoundry/models/mpt/modeling_mpt.py (loss_fn 'fused_crossentropy': "
             "flash_attn.losses.cross_entropy), scripts/train/yamls/pretrain/mpt-*.yaml (decoupled_adamw, "
             "weight_decay 0.0, gradient_clipping norm 1.0, limit_all_gathers)"),
    # DecoupledAdamW.adamw per FP32 parameter element, weight_decay 0 (the MPT recipes): exp_avg.mul_ (read + write
    # 4 + 4) .add_(grad) (4 + 4 + 4), exp_avg_sq.mul_ (8) .addcmul_(grad, grad) (12), sqrt (8), / sqrt(bias
    # correction) (8), .add_(eps) (8), param.addcdiv_(exp_avg, denom) (16) = 80; FSDP's clip_grad_norm_: a norm per
    # gradient (4) and every gradient multiplied by the clip coefficient (8) = 12. 92 in all.
    # Composer's compile_config compiles the model (Trainer(compile_config=...)); its loss and metrics run after it, eager.
    compile_loss=False,
    optimizer_traffic=92, loss="composer", tensor_parallel=False, sequence_parallel="never", schedules=(), torch_fsdp=1,
    context_parallel=(), zero_stages=(0, 2, 3), default_zero=3, default_zero_with_pp=None,
    expandable_segments=False,  # Composer 0.16-0.17 (2023); llm-foundry's expandable_segments option came in 2024-05
    # fsdp_config activation_checkpointing checkpoints every module the model's activation_checkpointing_fn names:
    # MPT's is `isinstance(module, MPTBlock)` (llm-foundry 061f2c7c modeling_mpt.py), whole blocks, so full recompute;
    # torchtitan's op-level selective checkpointing is not Composer's.
    recompute=("none", "full"), partial_recompute="",  # every MPTBlock (configurable targets: llm-foundry 2e59620a3, 2024-02)
    recompute_early_stop=False,  # Composer's activation_checkpointing_reentrant option: not read here
    cannot=("tensor, pipeline or context parallelism (Composer 0.16-0.17 runs FSDP, DDP or DeepSpeed only)",
            "ZeRO-1", "selective recompute (its activation checkpointing wraps whole blocks)",
            "recompute of only some layers (it checkpoints every block)"),
    # precision amp_fp8: Transformer Engine's fp8_autocast with DelayedScaling(Format.HYBRID, amax_history_len 16,
    # amax_compute_algo 'max') around the forward (mosaicml/composer v0.15.0-v0.17.x composer/core/precision.py
    # get_precision_context); llm-foundry's FP8 runs build MPT's linears as te.Linear (fc_type 'te': llm-foundry
    # b2a43a147 scripts/train/benchmarking/submit_benchmarks.py, TransformerEngine v0.10).
    fp8="te",
)
COMPOSER_PURE = replace(
    COMPOSER, name="composer-pure", grad_reduce_bytes=2,
    summary="as composer, with fsdp_config mixed_precision PURE: gradients reduce-scattered in BF16",
)

# Lit-GPT's pretraining script as TinyLlama ran it (2023-09): Lightning Fabric's FSDPStrategy (PyTorch FSDP1) with
# precision bf16-mixed, FlashAttention-2 and flash-attn's / xformers' fused kernels.
LIT_GPT = replace(
    COMPOSER, name="lit-gpt", expert_parallel=False,
    summary="Lit-GPT's pretraining (TinyLlama) on Lightning Fabric's FSDPStrategy (PyTorch FSDP1, FULL_SHARD, "
            "limit_all_gathers) with precision bf16-mixed: FP32 parameters gathered in FP32 and BF16 autocast, gradient "
            "accumulation under no_backward_sync (FP32 gradients held unsharded, one BF16 reduce-scatter per optimizer "
            "step); FlashAttention-2, fused RMSNorm and rotary embedding "
            "(flash-attn), xformers' fused SwiGLU, flash-attn's xentropy loss; per-tensor AdamW with gradient clipping",
    sources=("jzhang38/TinyLlama 01c9c77 pretrain/tinyllama.py (FSDPStrategy(auto_wrap_policy={Block}, "
             "activation_checkpointing_policy=None, limit_all_gathers=True); precision from "
             "get_default_supported_precision: bf16-mixed; torch.optim.AdamW(..., foreach=False); "
             "FusedCrossEntropyLoss), lit_gpt/model.py (flash_attn_func, xformers.ops.SwiGLU, "
             "apply_rotary_emb_func), lit_gpt/config.py tiny_LLaMA_1b (_norm_class FusedRMSNorm), requirements.txt "
             "(lightning==2.1.2), PRETRAIN.md (flash-attention csrc/rotary, layer_norm, xentropy built from source)",
             "Lightning-AI lightning-fabric 2.0.3 plugins/precision/fsdp.py FSDPPrecision.mixed_precision_config: "
             "bf16-mixed is param_dtype float32, reduce_dtype and buffer_dtype bfloat16",
             "jzhang38/TinyLlama 01c9c77 pretrain/tinyllama.py train loop (fabric.no_backward_sync(model, "
             "enabled=is_accumulating)); Lightning-AI lightning 2.1.2 fabric/strategies/fsdp.py "
             "_FSDPBackwardSyncControl.no_backward_sync (module.no_sync())"),
    # FP32 flat parameters (the optimizer's master copy itself), gathered in FP32, their FP32 gradients reduce-scattered
    # in BF16; Adam's two FP32 moments.
    weight_bytes=4, grad_bytes=4, optimizer_bytes=8, param_gather_bytes=4, grad_reduce_bytes=2,
    weight_shard_is_master=False,  # the FP32 flat parameter shard is the weights term itself (no separate master)
    fp8="",  # precision bf16-mixed only: no FP8 recipe in TinyLlama's script (not Composer's amp_fp8, above)
    fused_elementwise=True, loss="xentropy",
    # xformers.ops.SwiGLU (_SwiGLUFusedFunc: save_for_backward(x, w1, w2, w3, x1, x2); silu_bw_fused recomputes the
    # product in the backward): the gate and up outputs only
    glu_tensors=2,
    # pretrain/tinyllama.py: `with fabric.no_backward_sync(model, enabled=is_accumulating)` around every micro-batch
    # but the step's last (gradient_accumulation_steps = 64 / 8 on its 16 GPUs); lightning 2.1.2 fabric/strategies/
    # fsdp.py _FSDPBackwardSyncControl.no_backward_sync returns module.no_sync(). So its FP32 gradients are held
    # unsharded and summed in place by autograd (read 4 + 4, write 4 per parameter after the first micro-batch), and
    # reduce-scattered in BF16 once per optimizer step.
    fsdp_no_sync=True, grad_accumulation_bytes=12,
    # pretrain/tinyllama.py builds FSDPStrategy(...) without sharding_strategy whenever devices > 1 (one device:
    # strategy "auto", no data parallelism), so Lightning's default FULL_SHARD: ZeRO-3 over every rank, nothing else.
    # Lightning's FSDPStrategy takes SHARD_GRAD_OP, NO_SHARD and HYBRID_SHARD as arguments (lightning 2.1.2
    # fabric/strategies/fsdp.py _init_sharding_strategy), but no TinyLlama commit passes one; upstream Lit-GPT's
    # tinyllama script set HYBRID_SHARD only later (Lightning-AI/litgpt 21c1c594, 2023-11-22).
    zero_stages=(3,), hybrid_shard=False,
    # _single_tensor_adamw (foreach=False): one kernel per operation and tensor, the 80 B per FP32 element of torch's
    # AdamW (TORCHTITAN above), and fabric.clip_gradients -> FSDP's clip_grad_norm_ (12): 92.
    optimizer_traffic=92,
    cannot=("tensor, pipeline or context parallelism (its FSDPStrategy shards data-parallel only)",
            "ZeRO-0/1/2 and hybrid sharding (its FSDPStrategy names no sharding_strategy: FULL_SHARD, ZeRO-3, only)",
            "selective recompute (activation_checkpointing_policy wraps whole blocks)",
            "recompute of only some layers (the policy checkpoints every Block)"),
)

# IBM's fms-fsdp (2024-03, the PyTorch blog "Maximizing training throughput using PyTorch FSDP"): PyTorch FSDP1 around
# foundation-model-stack's eager LLaMA, mixed precision bfSixteen.
FMS_FSDP = replace(
    TORCHTITAN, name="fms-fsdp", expert_parallel=False,
    summary="IBM's fms-fsdp: PyTorch FSDP1 (FULL_SHARD, HYBRID_SHARD within a node, or NO_SHARD; limit_all_gathers) "
            "around foundation-model-stack's eager LLaMA with SDPA (FlashAttention-2), mixed precision bfSixteen "
            "(FP32 sharded parameters, BF16 gathers and BF16 gradient reduce-scatter every step), activation "
            "checkpointing of every k-th block, torch's AdamW (foreach) with FSDP's gradient clipping; no tensor, "
            "pipeline or context parallelism",
    sources=("foundation-model-stack/fms-fsdp 4ffb9bd main_training.py (FSDP(..., mixed_precision, sharding_strategy, "
             "limit_all_gathers=True); LLaMA(llama_config) built in FP32; optim.AdamW), fms_fsdp/policies/"
             "mixed_precision.py (bfSixteen: param, reduce and buffer dtype bfloat16), fms_fsdp/utils/train_utils.py "
             "(get_policies: fsdp -> FULL_SHARD, hsdp -> HYBRID_SHARD, ddp -> NO_SHARD; CrossEntropyLoss; "
             "model.clip_grad_norm_), fms_fsdp/policies/ac_handler.py (every selective_checkpointing-th LLaMABlock)",),
    grad_reduce_bytes=2, torch_fsdp=1, pipeline_fsdp_once=False,
    compile_loss=False,  # use_torch_compile compiles the model; the CrossEntropyLoss runs after it, eager
    tensor_parallel=False, sequence_parallel="never", tp_comm_overlap_available=False, schedules=(), context_parallel=(),
    zero_stages=(0, 3), default_zero=3, default_zero_with_pp=None, recompute=("none", "full"),
    expandable_segments=False,  # scripts/train.sh at 4ffb9bd sets no PYTORCH_CUDA_ALLOC_CONF
    recompute_early_stop=False,  # its ac_handler's checkpoint_wrapper implementation: not read here
    # fms_fsdp/utils/train_utils.py train (4ffb9bd): zero_grad, one forward and backward, clip, optimizer.step for every
    # batch the loader gives (batch_size sequences per GPU): no gradient accumulation.
    accumulates=False,
    fp8="", edge_chunks=False,
    cannot=("tensor, pipeline or context parallelism (it wraps FSDP only)", "ZeRO-1 and ZeRO-2",
            "selective recompute (it checkpoints whole blocks, every k-th)",
            "more than one micro-batch per step (its train loop has no gradient accumulation)"),
)

# InternEvo (InternLM's training framework, 2023; doc/en/train_performance.md's A100 tables): Megatron-style TP and
# pipelines, its Hybrid ZeRO-1, FlashAttention and Apex's fused kernels.
INTERNEVO = replace(
    MEGATRON_CORE, name="internevo",
    summary="InternEvo (InternLM) with its HybridZeroOptimizer: BF16 gradients all-reduced over every data-parallel "
            "rank in buckets during the backward; the optimizer's whole parameters dealt to the ranks of the zero1 "
            "group (all of dp, or --dp-shard ranks: its zero1 size) and each owner's updated BF16 parameters "
            "broadcast over that group after the step; Apex's fused norms; Megatron-style TP (tensor mode 'mtp': no "
            "sequence parallelism unless named); as the code of its published tables ran (July 2023: PyTorch 1.13.1, "
            "its NCCL 2.14.3, flash-attn 1.0.5, i.e. FlashAttention-1)",
    sources=("InternLM/InternEvo internlm/solver/optimizer/hybrid_zero_optim.py (_partition_param_list: whole "
             "parameters to the rank with the fewest elements; _reduce_and_copy: reduce_tensor with no destination "
             "rank, an all-reduce over ParallelMode.DATA; flat FP16 buffer per rank of the zero1 group, broadcast after "
             "the step), configs/7B_sft.py (hybrid_zero_optimizer: overlap_sync_grad True, overlap_sync_param False, "
             "reduce_bucket_size 512 * 1024 * 1024; zero1 size; use_flash_attn; dtype bfloat16), "
             "doc/en/train_performance.md (zero1=-1: all of dp, zero1=8: within a node)",
             "InternLM/InternEvo at c18bec9 (2023-07-08, the commit whose doc/en/train_performance.md holds the tables' "
             "figures): doc/en/install.md ('Pytorch == 1.13.1+cu117', 'Install flash-attention (version v1.0.5)'), "
             "hybrid_zero_optim.py (_reduce_and_copy: torch.cuda.synchronize(), flatten, reduce_tensor's div_ and "
             "all_reduce, unflatten_and_copy; _step: _check_overflow, compute_norm, AdamW, broadcast_params one "
             "dist.broadcast per owning rank, all waited for), train.py (torch.optim.AdamW)",),
    attention="fa1", grad_bytes=2, grad_reduce_bytes=2, overlap_grad_reduce=True, overlap_param_gather=False,
    # The code of the doc's tables (hybrid_zero_optim.py at c18bec9, 2023-07-08): each bucket of BF16 gradients
    # flattened (2 + 2), divided by the dp size in place (reduce_tensor: div_, 2 + 2), all-reduced and copied back
    # into the gradients (unflatten_and_copy, 2 + 2) = 12 B per parameter, as DeepSpeed's allreduce_and_copy.
    reduce_copy_bytes=12,
    # Its step over the rank's owned parameters (one flat FP32 tensor): the overflow check per gradient
    # (has_inf_or_nan: .float() 2 + 4, .sum() 4), the norm (compute_norm: .float() 2 + 4, multi-tensor L2 4), the
    # gradients flattened (2 + 2) and cast to FP32 (2 + 4), unscaled and clipped (mul_, 4 + 4), train.py's
    # torch.optim.AdamW (torch's default foreach path on CUDA: 80, as torchtitan's below) and the updated FP32 copied
    # into the BF16 flat buffer (4 + 2): 124 B per owned parameter.
    optimizer_traffic=124,
    bucket_bytes=512 * 2**20 * 2, zero1="owner_broadcast", zero1_shard_group=True, zero_stages=(0, 1), default_zero=1,
    p2p_overlap=("interleaved-1f1b",),  # its pipeline config: interleaved_overlap True (configs/7B_sft.py)
    # internlm/core/parallel/shard.py partition_uniform (0607da81): asserts num_layers % num_chunks == 0, gives each of
    # the pp ranks of a chunk its L / vpp // pp layers (the last ones one more) and raises "Some nodes in Pipeline have
    # no requests" where that is 0; the embedding and the head ride on the first and last layers' chunks. So no chunk
    # for the embedding or the loss alone (megatron-core's --account-for-*-in-pipeline-split is not InternEvo's). The
    # same function in the 2023 code line: InternLM/InternLM 84aedcd internlm/solver/pipeline_utils.py.
    edge_chunks=False, vpp_divides_layers=True,
    tp_comm_overlap_available=False, fp8="", zero2_reduce_every_microbatch=False,
    # configs/7B_sft.py: parallel.tensor mode "mtp" ('defaults to 'mtp', means the pure megatron tensor parallel without
    # sequence parallel'); "msp" (Megatron's SP) is there when named, so plan still weighs it.
    unnamed_sequence_parallel=False,
    cannot=("ZeRO-2/3", "GPipe and ZB-H1 schedules", "a model chunk holding no layer (only the embedding or the loss)",
            "a vpp that does not divide the layers"),
)

LLAMA3 = Framework(
    name="llama3", expert_parallel=False,
    summary="Meta's Llama 3 training stack as its paper describes it: 4-D parallelism in the order tp, cp, pp, dp; "
            "FSDP over dp with ZeRO-2 semantics (optimizer states sharded, weights gathered at the step's first forward "
            "and kept: no reshard after forward), under a pipeline its FP32 gradients accumulated unsharded over the "
            "micro-batches and reduce-scattered in FP32 once per step, as torch.distributed.pipelining runs FSDP2; "
            "context parallelism by all-gather of K/V; 1F1B or interleaved 1F1B; FlashAttention-2 (assumed: the kernel "
            "public while the 405B model trained; FlashAttention-3 followed in July 2024)",
    sources=("Llama Team, AI @ Meta 2024, 'The Llama 3 Herd of Models' (arXiv 2407.21783) Sec. 3.3.2 ('for model shards "
             "we do not reshard after forward computation to avoid an extra all-gather communication during backward "
             "passes'; all-gather context parallelism; interleaved schedule) and Sec. 3.3.4 ('FP32 gradient accumulation "
             "during backward computation over multiple micro-batches and also reduce-scatter gradients in FP32')",
             "docs/planner.md 'Llama 3's data parallelism': reduce-scattering (or gathering) every micro-batch would put "
             "9-13 s of FP32/BF16 traffic per GPU on its 400 Gb/s NIC in a 12.5 s step (8,192 GPUs), 4.5-6.8 s in 6.7 s "
             "(16,384)"),
    attention="fa2", grad_reduce_bytes=4, overlap_grad_reduce=True, pipeline_fsdp_once=True,
    p2p_overlap=("1f1b", "interleaved-1f1b"), zero_stages=(0, 1, 2), context_parallel=("allgather",),
    # Sec. 3.3.2: "we reduce one Transformer layer each from the first and the last stages, respectively. This means
    # that the first model chunk on the first stage has only the embedding, and the last model chunk on the last stage
    # has only output projection and loss calculation."
    edge_chunks=True,
    cannot=("ZeRO-3", "ring context parallelism (all-gather only)", "GPipe and ZB-H1 schedules",
            "recompute of only some layers (its paper describes none)"),
)

LLAMA2 = replace(
    LLAMA3, name="llama2", expert_parallel=False,
    summary="Meta's 2022-23 training stack (LLaMA and Llama 2) as the LLaMA paper describes it: xformers' causal "
            "attention (FlashAttention-1's backward), activation checkpointing by a hand-written backward that keeps "
            "the expensive activations (the linears' outputs, the attention's output and log-sum-exp) and recomputes "
            "the norms (selective), tensor parallelism with sequence parallelism, the network's all-reduces overlapped "
            "with compute: data parallelism by all-reduced gradients (ZeRO-0, or ZeRO-1's reduce-scatter + all-gather, "
            "the same bytes), no FSDP; no pipeline and no context parallelism",
    sources=("Touvron et al. 2023, 'LLaMA: Open and Efficient Foundation Language Models' (arXiv 2302.13971) Sec. 2.4 "
             "(Efficient implementation: 'we save the activations that are expensive to compute, such as the outputs "
             "of linear layers'; 'the communication between GPUs over the network (due to all_reduce operations)')",
             "Touvron et al. 2023, 'Llama 2' (arXiv 2307.09288) Sec. 2.2: 'We adopt most of the pretraining setting "
             "and model architecture from Llama 1'",
             "facebookresearch/xformers CHANGELOG.md 0.0.16 (2023-01-31): memory_efficient_attention_forward_requires_grad "
             "and memory_efficient_attention_backward 'for power-users who write custom autograd functions' (the "
             "backward takes the saved output and log-sum-exp); 0.0.22 (2023-09-27): grouped-query attention, after "
             "Llama 2 (Llama 2 70B's 8 K/V heads were expanded to its 64 query heads, as its released model code's "
             "repeat_kv does)",
             "Zhang et al. 2022, 'OPT' (arXiv 2205.01068) Sec. 2.4, Meta's large-model stack before LLaMA: 'Fully "
             "Sharded Data Parallel with Megatron-LM Tensor Parallelism', no pipeline; LLaMA Sec. 2.4 likewise names "
             "'model and sequence parallelism, as described by Korthikanti et al.' and no pipeline"),
    attention="xformers", sequence_parallel="always", context_parallel=(), recompute=("selective", "full"),
    recompute_modules=("layernorm",), zero_stages=(0, 1), schedules=(), edge_chunks=False,
    cannot=("ZeRO-2/3 (FSDP: its network collectives are all-reduces)", "context parallelism (none in 2022-23)",
            "pipeline parallelism (its sources name tensor and sequence parallelism only; Llama 3 added a pipeline)",
            "training without activation checkpointing (the paper's stack always checkpoints)"),
)

# flash-attn's own GPT training code (HazyResearch / Dao-AILab flash-attention training/, 2022-23), which the
# flash-attention README's training-speed table and Lambda's FlashAttention-2 benchmark (its fork LambdaLabsML/
# flash-attention) ran.
FLASH_ATTN = Framework(
    name="flash-attn", expert_parallel=False,
    summary="flash-attn's own GPT training code (flash-attention training/, 2022-23): PyTorch Lightning with native "
            "AMP (FP32 parameters; every forward casts each linear's weight to FP16/BF16, every backward casts its "
            "weight gradient back to FP32 and adds it into the FP32 gradient), FlashAttention-2, fused dense, MLP and "
            "dropout-add-LayerNorm kernels, flash-attn's xentropy loss and a perplexity metric that runs it again, "
            "DDP's FP32 bucketed all-reduce with torch's ZeroRedundancyOptimizer; data parallelism only",
    sources=("LambdaLabsML/flash-attention 81796d3 (2023-07-22) training/: Dockerfile (nvcr.io/nvidia/pytorch:22.12, "
             "pytorch-lightning 1.8.6, flash-attn 2.0.0.post1, csrc/fused_dense_lib, layer_norm, xentropy built), "
             "configs/experiment/owt/base.yaml (trainer.precision 16, loss flash_attn.losses.cross_entropy), "
             "gpt3s-flash.yaml (use_flash_attn, fused_bias_fc, fused_mlp, fused_dropout_add_ln), gpt3xl-flash.yaml "
             "(DDPStrategyZero1, gradient_as_bucket_view, optimizer adamw-zero), configs/optimizer/adamw-zero.yaml "
             "(torch.distributed.optim.ZeroRedundancyOptimizer over torch.optim.AdamW), src/tasks/seq.py (train "
             "metrics every micro-batch), src/metrics/perplexity.py (Perplexity.update runs CrossEntropyLoss on the "
             "logits when no loss is passed)",
             "PyTorch AMP docs (torch.autocast: FP32 parameters, ops cast their inputs to the autocast dtype, the "
             "weight cast cache cleared on leaving the autocast region); flash_attn/ops/fused_dense.py "
             "(FusedDenseFunc.forward: weight.to(torch.get_autocast_gpu_dtype()) under autocast)"),
    weight_bytes=4, grad_bytes=4, optimizer_bytes=8, attention="fa2", fused_elementwise=True,
    grad_reduce_bytes=4, param_gather_bytes=4, overlap_grad_reduce=True, zero1="broadcast",
    bucket_bytes=25 * 2**20,  # DDP's bucket_cap_mb default (25 MiB); gradient_as_bucket_view: no bucket copies
    zero_stages=(0, 1), default_zero=0, tensor_parallel=False, sequence_parallel="never", schedules=(),
    context_parallel=(), recompute=("none",), fp8="",
    # The FP16/BF16 weight gradient (the GEMM writes it in the compute type) cast back to FP32 through the weight cast's
    # backward (read 2, write 4), then added into the FP32 gradient, a DDP bucket view, by AccumulateGrad (read 4 + 4,
    # write 4): 18 B per parameter every micro-batch, counted on the first one too (there DDP copies the gradient into
    # its bucket view rather than adding it: 8 B in place of 12).
    grad_accumulation_bytes=18, grad_accumulation_first_free=False,
    autocast_cast_bytes=6,
    # FusedMLP's heuristic 'auto' (flash_attn/ops/fused_dense.py): on A100 under CUDA >= 11.8, heuristic 0, the GELU in
    # the cuBLASLt epilogue (linear_act_forward with GELU_AUX, bias_act_linear_dgrad_bgrad in the backward); on H100
    # heuristic -1, "as the fused cuBlasLt implementation is slower than the unfused version": F.linear, then GELU.
    gelu_epilogue=("ampere",),
    loss="flash-attn",
    # Lightning's AMP step: GradScaler's unscale_ (read 4, write 4), clip_grad_norm_ (12), torch's AdamW (80, as
    # torchtitan's above): 100 B per FP32 parameter, over each rank's ZeroRedundancyOptimizer partition.
    optimizer_traffic=100,
    cannot=("tensor, pipeline, sequence or context parallelism (its training configs run DDP only)",
            "ZeRO-2/3 (ZeroRedundancyOptimizer shards the optimizer states only)",
            "activation recompute of whole layers (its GPT checkpoints at most the MLP: mlp_checkpoint_lvl)", "FP8"),
)

SHARDWISE = Framework(
    name="shardwise",
    summary="this project's runtime: FP32 parameters and AdamW states (bf16 autocast on GPU), SDPA attention, "
            "DDP bucketed all-reduce (ZeRO-0), DDP + ZeroRedundancyOptimizer (ZeRO-1: one broadcast per tensor), "
            "FSDP2 (ZeRO-2 and ZeRO-3 reduce-scatter every micro-batch), FP32 reductions, SP's backward "
            "re-gather waited for, blocking pipeline p2p, every schedule",
    sources=("src/shardwise/parallel/data_parallel.py, src/shardwise/train.py, src/shardwise/launch.py (check)",),
    weight_bytes=4, grad_bytes=4, optimizer_bytes=8, fused_elementwise=False, grad_reduce_bytes=4,
    # torch's SDPA: cuDNN's kernels on Hopper since torch 2.11 (check_prefer_cudnn_attention: sm90/sm100 with the
    # bundled cuDNN past 9.15; the H200's step profile ran them), FlashAttention-2 elsewhere (kernels.ATTENTION_KERNEL).
    attention="sdpa",
    glu_tensors=4,  # shardwise.model's SwiGLU, silu(w1 x) * w3 x, eager (memory.SHARDWISE_RUNTIME)
    # FP32 parameters under autocast: each forward casts every weight (4 + 2), each backward casts its gradient back
    # (grad_cast_bytes 2 + 4) and AccumulateGrad adds it into the FP32 gradient after the first micro-batch (4 + 4 + 4).
    autocast_cast_bytes=6, grad_cast_bytes=6, grad_accumulation_bytes=12,
    param_gather_bytes=4, async_sp_regather=False,
    overlap_grad_reduce=True, zero1="broadcast", fsdp_reduce_every_microbatch=True,
    schedules=SCHEDULES, zero_stages=(0, 1, 2, 3),
    calibrated_step_overhead=CALIBRATED_STEP_OVERHEAD, one_scalar_allreduce=True,
    expert_gemm_streams=1,  # shardwise.moe.Experts: one local expert after another
    experts_in_layer_units=True,  # parallel/data_parallel.py: experts apart only under an expert placement
    cannot=("ZB-H1 with ZeRO-2/3 (FSDP cannot follow a split backward)", "TP comm overlap"),
    loss="eager", unnamed_sequence_parallel=False,
    partial_recompute="block",  # shardwise.model Transformer.set_recompute: the first N blocks of each chunk
    autocast_saved=True,  # measured on one H200 (benchmarks/data/gpu) and under CPU autocast (tests/test_memory_truth.py)
    selective_recomputes_rope=True,
)

ALEPH_ALPHA = replace(
    MEGATRON_CORE, name="aleph-alpha", expert_parallel=False,
    summary="Aleph Alpha's Megatron-style stack (Aleph-Alpha/scaling, the codebase of Hagemann et al. 2023's layout "
            "sweep): Megatron-style TP with optional SP, FlashAttention-2 (flash_attn_varlen_func), DeepSpeed-style "
            "1F1B (TrainSchedule) with blocking send/recv; the LM head's logits all-gathered over TP and "
            "F.cross_entropy on their FP32 copy over the whole vocabulary on every TP rank; BF16 gradients "
            "all-reduced once per step after the backward, in FP32 buckets of 5e8 elements, not overlapped; "
            "ZeRO-1 only (FP32 master weights and Adam states sharded, gradients all-reduced whole)",
    sources=("Aleph-Alpha/scaling 01b9d21 (2024-10-29; the config names match the 2023 sheets': topology_config.py "
             "activation_checkpointing_type 'disabled', model_parallel_size, pipe_parallel_size, micro_batch_size; "
             "tokenizer alpha-001-128k): transformer/model/layers/lm_head.py (ColumnParallelLinear without "
             "parallel_output), core/nn/linear/column_parallel_linear.py (parallel_output: bool = False; forward: "
             "all_concat of the output), core/nn/linear/utils.py _all_concat (all_gather into a list, torch.cat), "
             "transformer/model/losses/cross_entropy.py (output.activations.float(), F.cross_entropy)",
             "core/optimizer/optimizer.py (allreduce_gradients in step(), after the last backward), allreduce.py "
             "(allreduce_no_retain: numel_per_bucket 500000000; flatten, div_, .to(float32), all_reduce, copy_ "
             "back, unflatten copy), optimizer_config.py ('zero: bool', 'enable zero stage 1 optimizer'), "
             "parameter_group.py",
             "core/nn/pipeline_schedule/train.py (TrainSchedule: RecvActivation, SendGrad, SendActivation, RecvGrad), "
             "core/nn/parallel_module/communicator.py (torch.distributed.send / recv, one tensor at a time)",
             "Hagemann et al. 2023, arXiv 2311.05610 (the sheets' kernel 'flash_attention2 + RMS kernel')"),
    attention="fa2", grad_bytes=2, grad_reduce_bytes=4, overlap_grad_reduce=False, overlap_param_gather=False,
    # allreduce_and_copy on each bucket: flatten (2 + 2), div_ (2 + 2), .to(float32) (2 + 4), the FP32 result copied
    # back (4 + 2), unflattened into the gradients (2 + 2) = 24 B per parameter.
    zero1="allreduce", reduce_copy_bytes=24, bucket_bytes=5e8 * 4,
    zero_stages=(0, 1), default_zero=0, zero2_reduce_every_microbatch=False,
    # communicator.py PipeCommunicator.send_data: torch.distributed.send of each tensor of the layer IO as it is,
    # to the same TP rank of the next stage; TransformerLayerIO's activations are whole without SP (the embedding
    # reduce-scatters them over the sequence only under SP: vocab_parallel_embedding.py).
    schedules=("1f1b",), p2p_overlap=(), p2p_lockstep=True, p2p_split_over_tp=False,
    tp_comm_overlap=False, tp_comm_overlap_available=False, fp8="",
    loss="eager", loss_gathers_logits=True,
    # topology_config.py ActivationCheckpointingType: disabled, every_layer, every_pipe_stage (no selective, no
    # first-N-layers)
    recompute=("none", "full"), partial_recompute="",
    cannot=("interleaved, GPipe and ZB-H1 schedules (its TrainSchedule is 1F1B)", "ZeRO-2/3 (its zero is ZeRO-1)",
            "TP comm overlap", "FP8"),
)

NANOTRON = replace(
    MEGATRON_CORE, name="nanotron", cp_fused_attention_only=False,
    summary="Hugging Face nanotron v0.5: Llama-style model with FlashAttention-2 and fused RMSNorm, TP with optional "
            "sequence parallelism (tp_mode REDUCE_SCATTER), 1F1B or all-forward-all-backward pipelines with a "
            "compute-balanced stage split, FP32 gradient accumulation (accumulate_grad_in_fp32); ZeRO-0 as DDP, its "
            "FP32 buckets all-reduced during the backward; ZeRO-1 with the whole FP32 gradients all-reduced after the "
            "pipeline finishes (not overlapped) and the updated shards all-gathered after the optimizer step",
    sources=("huggingface/nanotron c2528430 (v0.5 benchmarks) src/nanotron/trainer.py: init_model (make_ddp only where "
             "not accumulate_grad_in_fp32 and zero_stage > 0; DistributedDataParallel(bucket_cap_mb)), training_step "
             "(sync_gradients_across_dp(..., reduce_scatter=False) after train_batch_iter: 'TODO ... overlap "
             "communication with gradient computation on the last backward pass')",
             "src/nanotron/optim/gradient_accumulator.py get_fp32_accum_hook (DDP hook: each bucket's FP32 "
             "gradients all_reduce_coalesced, async, during the backward)",
             "src/nanotron/optim/zero.py ZeroDistributedOptimizer (each rank updates its shard, then all-gathers "
             "the parameters); examples/config_tiny_llama.yaml (pp_engine 1f1b, tp_mode REDUCE_SCATTER, "
             "accumulate_grad_in_fp32 true, zero_stage 0)"),
    attention="fa2", overlap_param_gather=False, zero1="allreduce", zero1_reduce_overlapped=False,
    # models/llama.py GLUActivation: self.act(gate_states) * up_states on a split of gate_up_proj, eager: its memory
    # (4 f-wide tensors kept) and its traffic, the element-wise table's eager SwiGLU (SiLU 4 + product 6 B per f)
    glu_tensors=4, glu_bytes=10,
    zero_stages=(0, 1), default_zero=0, bucket_bytes=25 * 2**20 * 2,  # DDP's 25 MiB BF16 buckets, reduced in FP32
    schedules=("1f1b", "gpipe"), p2p_overlap=(), tp_comm_overlap_available=False, fp8="",
    recompute=("none", "full"), partial_recompute="", edge_chunks=False, stage_split="balanced",
    even_stages_only=False, context_parallel=(),
    cannot=("interleaved and ZB-H1 schedules (pp_engine 1f1b or afab)", "ZeRO-2/3 (its zero_stage is 0 or 1)",
            "context parallelism (none in v0.5)", "selective recompute (recompute_layer: whole layers)",
            "TP comm overlap as Transformer Engine runs it", "FP8"),
)

FRAMEWORKS = {f.name: f for f in (MEGATRON_2021, MEGATRON_CORE, NEMO, DEEPSPEED, TORCHTITAN, LLAMA3, SHARDWISE,
                                        LLAMA2,
                                        DEEPSPEED_2024, DEEPSPEED_BF16, AUTOMODEL, COMPOSER, COMPOSER_PURE, LIT_GPT, FMS_FSDP,
                                        INTERNEVO, ALEPH_ALPHA, FLASH_ATTN, GPT_NEOX, NANOTRON)}
# --framework not given: torchtitan, PyTorch's own stack (FSDP2, torch.distributed.pipelining, SDPA) on the
# torch.distributed this project's runtime uses; where it cannot run what the other flags ask (ZeRO-1, DDP with TP or
# PP, plain TP without sequence parallelism, Transformer Engine's attention, ...), megatron-core, the
# profile that runs the most layouts (commands/common.py under_framework).
# Why not megatron-core first: its fused kernels make it one of the fastest profiles, and a layout-free plan under it
# claims 8-35 % more than tuned runs made with other stacks (benchmarks/plausibility.py: Llama 2 7B-70B and LLaMA 65B
# on 2,048 A100), where torchtitan's plans stay within 15 % of every case; a user of a faster stack names it.
DEFAULT_FRAMEWORK = "torchtitan"
FALLBACK_FRAMEWORK = "megatron-core"
DEFAULT_HELP = (f"the training stack that will run the job (default {DEFAULT_FRAMEWORK}: PyTorch's own stack, eager "
                "FSDP2 and torch pipelining, whose layout-free plans stay within 15 %% of the tuned published runs "
                f"checked; where it cannot run what the other flags ask, such as --zero 1, "
                f"{FALLBACK_FRAMEWORK}, and the output says so. Faster stacks plan faster steps, so name the stack you "
                "run; 'shardwise' plans for this project's own runtime). "
                "It sets what overlaps, the reduce dtype, the attention kernel, the bytes per parameter, and "
                "which layouts can run at all")


def default_note(fallback_reason: str | None = None) -> str:
    """What `assumptions.implied` (and plan's note) say of the framework when --framework was not given."""
    if fallback_reason is None:
        return (f"framework {DEFAULT_FRAMEWORK} (the default, --framework not given; a faster stack plans faster "
                f"steps: name the stack you run)")
    reason = fallback_reason.split(" — ")[0].split("cannot run this layout: ", 1)[-1]  # the refusal's own words
    return (f"framework {FALLBACK_FRAMEWORK} (--framework not given, and the default {DEFAULT_FRAMEWORK} cannot run "
            f"this: {reason})")


def get(name: str) -> Framework:
    if name not in FRAMEWORKS:
        raise UsageError(f"unknown framework '{name}' — choose one of {', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[name]


def check(framework: Framework, layout: Layout, chunk_layers: int | None = None, num_layers: int | None = None,
          microbatches: int | None = None, flash_attention: bool = True, num_kv_heads: int | None = None) -> None:
    """UsageError (one line, exit 2) when the stack cannot run the layout (with `chunk_layers`, the most layers a
    model chunk holds, also the --recompute-layers counts it can run; with `num_layers`, also its pipeline's cut; with
    `microbatches`, also whether it accumulates that many a step; with `flash_attention` False, also whether its
    context parallelism runs without the fused attention; with `num_kv_heads`, also whether it splits them over tp)."""
    given = (layout, chunk_layers, num_layers, microbatches, flash_attention, num_kv_heads)
    reason = _refusal(framework, *given)
    if reason:
        later = FRAMEWORKS.get(framework.later_release)
        if later is not None and not _refusal(later, *given):  # the same stack's later releases run it: say so
            fix = f" — {later.name}, its later releases, runs it: --framework {later.name}"
        else:
            fix = "" if " — " in reason else " — change the layout or pick another --framework"
        raise UsageError(f"--framework {framework.name} cannot run this layout: {reason}{fix}")


def _refusal(framework: Framework, layout: Layout, chunk_layers: int | None, num_layers: int | None,
             microbatches: int | None, flash_attention: bool, num_kv_heads: int | None) -> str | None:
    return (framework.refusal(layout, num_layers, microbatches)
            or (framework.partial_refusal(layout, chunk_layers) if chunk_layers else None)
            or framework.attention_refusal(layout, flash_attention)
            or (framework.kv_refusal(num_kv_heads, layout.tp) if num_kv_heads else None))


PRECISIONS = ("bf16", "fp8")
