"""What a framework profile is: the semantics the planner models for one training stack (the `Framework` record).

What a layout costs, and whether it runs at all, depends on the software running it. Each profile
(planner/profiles/) states, with sources (papers, the frameworks' docs and code, at the commits named in
docs/planner.md):
  * model states: bytes per parameter kept for weights, gradients and the optimizer;
  * the attention kernel (fused FlashAttention-2/3 or cuDNN, or a materialised softmax);
  * data parallelism: in which dtype gradients travel, when they are reduced (once per step or every
    micro-batch), what compute hides them (a schedule, planner/overlap.py), how ZeRO stages gather;
  * pipeline transfers overlapped or blocking; TP communication overlapped with GEMMs or not;
  * which layouts the stack cannot run (the search skips them; `estimate` refuses them, naming why).

`shardwise` is exactly this project's runtime (parallel/data_parallel.py, train.py): its refusals come
from the runtime's own layout checks (specs.runtime_refusal, which launch.check raises), and it leaves
one hook, CALIBRATED_STEP_OVERHEAD, for the fixed per-step cost `calibrate` measures on the machine.
planner/frameworks.py holds the profiles by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardwise.specs import RECOMPUTE, Layout, runtime_refusal

# The [measured] key of a calibrated cluster that holds the `shardwise` runtime's fixed cost per training
# step beyond the layers, collectives and optimizer the planner times (loss reduction, clipping, metrics).
# Filled by `shardwise calibrate`; 0 when absent (datasheet clusters).
CALIBRATED_STEP_OVERHEAD = "train_step_overhead_s"


def fp32_without_fsdp(layout: Layout) -> bool:
    """Whether torchtitan runs `layout` without mixed precision: TP or PP, and neither data nor context parallelism for
    FSDP to apply it with (Framework.amp_needs_fsdp)."""
    return layout.dp * layout.cp == 1 and (layout.tp > 1 or layout.pp > 1)


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
    # Whether its fused attention takes a sliding window where its family's kernel can (kernels.WINDOW_FAMILIES):
    # False where the stack attends through torch's SDPA, which takes none (a windowed mask computes every block).
    window_kernel: bool = True
    fused_elementwise: bool = True  # norms, activations, rotary as fused kernels (False: eager PyTorch ops)
    # A gated MLP's activation in bytes per f-element (2-byte activations) where the stack runs it its own way;
    # None: as the element-wise table says (planner/kernels.py ELEMENTWISE).
    glu_bytes: float | None = None
    # f-wide tensors its gated MLP keeps for the backward (job.SavedTensors.gated_mlp_tensors): 3, the gate and up
    # GEMMs' outputs and their product (Megatron's fused swiglu keeps its input, the FC2 linear its output; Transformer
    # Engine's LayerNormMLP the same); 4 where the block is eager PyTorch, `w2(F.silu(w1(x)) * w3(x))`: autograd's
    # SiLU keeps its input and the product keeps both factors, silu(gate) among them (torchtitan's, fms' and nanotron's
    # MLPs; what `validate` measures on shardwise's own model, job.SHARDWISE_RUNTIME); 2 for xformers' fused SwiGLU
    # (lit-gpt). Under --compile, 2: AOTAutograd's min-cut partitioner keeps the two GEMM outputs and recomputes the
    # point-wise silu(gate) * up in the backward's fused kernel (job.stack_saved_tensors).
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
    # ZeRO 0/1 under a pipeline: the data-parallel gradients reduced once after the schedule, one flat all-reduce per
    # model chunk, waited for (shardwise's PipelineStep: its executor runs the chunks' backwards itself, so no DDP hook
    # fires behind them), where the stack's own overlap would hide it behind the last backward.
    pipeline_reduce_after_schedule: bool = False
    # ZeRO 0/1 with the experts split (ep x etp > 1): their gradients all-reduced over the edp replicas once after the
    # backward, waited for (shardwise's expert_parallel.sync_expert_grads), not behind it.
    expert_reduce_after_backward: bool = False
    # Experts left whole on every tp rank (ep = etp = 1, tp > 1), each rank serving its 1/tp of the tokens: their
    # gradients summed over tp once a step after the backward, one flat all-reduce waited for (shardwise's
    # tensor_parallel.sync_sequence_parallel_grads over expert_parallel's list), apart from the dp reduction.
    tp_sums_whole_experts: bool = False
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
    # ZeRO-3 gathers each submodule (one linear) and releases it after use, keeping at most this many parameters
    # gathered (DeepSpeed's stage3_max_live_parameters, default 1e9: deepspeed/runtime/zero/config.py); 0: it
    # gathers whole units (FSDP: a layer at a time plus the prefetched next, the root kept)
    zero3_max_live_params: float = 0.0
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
    # Bytes per element of what a stage sends the next (0: the activations' dtype). shardwise's executor sends its FP32
    # residual stream whatever the autocast (PipelineExecutor.dtype): 4.
    p2p_bytes: int = 0
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
    # gradients: the whole sequence, not its shard (job.SavedTensors.gathered_linear_inputs; measured on torch in
    # tests/test_dtensor_sequence_parallel.py), so the backward gathers nothing again unless selective (op-level)
    # checkpointing recomputed the gather. Megatron keeps the shard and re-gathers, along dim 0: no copy.
    dtensor_sp: bool = False
    # The profile of the same stack's later releases (deepspeed: deepspeed-2024; megatron-2021: megatron-core): named in
    # the one-line refusal of a layout this release cannot run and that one can (frameworks.check).
    later_release: str = ""
    # "optional" | "always" (implied with tp > 1) | "never" | "default" (implied with tp > 1 unless named off: a
    # switch its recipes always set, e.g. NeMo's)
    sequence_parallel: str = "optional"
    context_parallel: tuple[str, ...] = ("ring", "allgather")  # attention over sequence shards it runs
    # How its context parallelism runs the attention (planner/kernels.py cp_attention_time, ring_merge_bytes): "te"
    # (Transformer Engine: the p2p ring's steps merged in the activation dtype; all-gather: each local query chunk
    # against the gathered keys before it, as Llama 3 does too) or "torch" (torch's context_parallel: the ring's steps
    # whatever its rotate method, merged and dK/dV accumulated and passed on in FP32) or "shardwise" (this project's
    # runtime: on a GPU FP32 math blocks, merged and dK/dV accumulated and passed on in FP32, memory.cp_math_blocks;
    # on a CPU SDPA's fused CPU kernel, priced as "te").
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
    # Whether its MoE routed experts run in FP8 under --precision fp8: Megatron-Core's TEGroupedLinear (and NeMo's,
    # on it) does; torchtitan's float8 converter swaps nn.Linear only (its GroupedExperts hold plain parameters), and
    # the other stacks' expert layers are no Transformer Engine module (llm-foundry's megablocks dMoE, DeepSpeed-MoE's
    # Experts): their experts' GEMMs, casts and weights stay BF16 (moe.fp8_gemms).
    fp8_experts: bool = False
    # The cross-entropy it runs (step_time.LOSS_BYTES): "megatron" (vocab-parallel, one kernel per op), "fused"
    # (NeMo's cross_entropy_loss_fusion), "eager" (F.cross_entropy on FP32 logits), "composer" (flash-attn's xentropy
    # and Composer's two training metrics on the same logits).
    loss: str = "megatron"
    # Whether an "eager" loss is charged its FP32 buffers in memory (job.EAGER_LOSS_KEPT_BYTES and its transient), as
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
    # (job.SavedTensors.autocast_casts: each linear's BF16 input cast and weight copy, FP32 norm tensors).
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
    # Bytes per gradient the rank holds that the step moves outside the optimizer (0: counted in optimizer_traffic): the
    # global norm's read and the clip's multiply over every local gradient (under ZeRO 0/1 the whole model's, not the
    # optimizer's shard), and, where the stack zeroes DDP's gradient views in place each step, that write (ddp_zero_bytes).
    grad_pass_bytes: int = 0
    ddp_zero_bytes: int = 0
    # Under sequence parallelism learned positions enter the sequence-split region by a scatter of their own (added
    # after the word embedding's reduce-scatter), whose backward gathers their gradient over tp (step_time.tp_edge_time).
    sp_scatters_positions: bool = False
    # CPU offload (--offload, planner/offload.py): what the stack can keep in the host's memory ("optimizer": the
    # optimizer states and FP32 master, stepped on the CPU; "params": the parameter shards too, with their gradients),
    # the lowest ZeRO stage each needs (the states it offloads are its shards), whether with "optimizer" the gradient
    # partitions live on the CPU too (DeepSpeed's ZeRO-Offload) or stay in the GPU's buffer (Megatron-Core), and the
    # bytes per parameter of the updated weights copied back after the CPU step (None: weight_bytes).
    offload: tuple[str, ...] = ()
    offload_zero: int = 1
    offload_params_zero: int = 3
    offload_grads: bool = False
    offload_update_bytes: int | None = None
    tensor_parallel: bool = True  # False: the stack has no tensor (nor sequence) parallelism
    # tp above the KV heads: every rank computes and keeps the K/V heads its query heads read, a replicated copy
    # (BigCode's Megatron-LM fork, attention_head_type multiquery: `self.key_value = get_linear_layer(hidden,
    # 2 * kv_channels)`, a plain Linear on every TP rank). False: the KV heads are split, so tp must divide them
    # (Megatron-Core: num_query_groups_per_partition = divide(num_query_groups, tp); torchtitan, nanotron alike).
    replicates_kv_heads: bool = False
    # False: the stack has no expert parallelism (no mixture-of-experts layers of its own: a MoE model is refused in
    # one line, make_job)
    expert_parallel: bool = True
    # Its expert tensor parallelism when the run names none: True, the dense layers' tp (Megatron-Core's
    # --expert-tensor-parallel-size defaults to --tensor-model-parallel-size: megatron/training/arguments.py); False, 1
    # (every expert whole on each of its ranks: torchtitan's expert_tensor_parallel_degree default)
    expert_tp_follows_tp: bool = False
    # True: the experts' tensor parallelism is the dense layers' tp or none (torchtitan's ParallelDims._validate:
    # `assert etp == tp or etp == 1, "Currently we only support ETP=TP or ETP=1"`, in every release that has etp)
    expert_tp_is_tp_or_one: bool = False
    # How it can move tokens to their experts (Job.moe_dispatcher: "alltoall", NCCL's; "deepep", DeepEP's
    # node-deduplicated kernels) and whether it can hide one micro-batch's all-to-alls behind another's compute
    # (Job.ep_comm_overlap: Megatron-Core's --overlap-moe-expert-parallel-comm)
    moe_dispatchers: tuple[str, ...] = ("alltoall",)
    ep_comm_overlap_available: bool = False
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
    # Under ZeRO-3 with the experts split (their own FSDP unit inside each block's), the layers whose local experts
    # stay gathered at once: 2, the current and the next one prefetched (torchtitan's apply_fsdp names each previous
    # block's experts in set_modules_to_backward_prefetch when ep > 1); 1 where FSDP2 prefetches implicitly, one unit
    # ahead in post-forward order, which from a block is its own experts, from the experts the previous block's dense
    # weights (shardwise's data_parallel._shard_experts: one layer's experts gathered, as validate measures).
    zero3_expert_layers_gathered: int = 2
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
    # The release whose opt-in flags the options beyond those defaults are (megatron-2021: SP, selective recompute and
    # the distributed optimizer are Megatron-LM v3.0's, 2022): said beside every estimate that names one
    # (estimate.release_note). "": the stack's options are all its own.
    named_release: str = ""
    # Whether a pipeline whose schedule the user does not name (neither --schedule nor --vpp) runs interleaved 1F1B at
    # the fastest depth that fits, as the stack's recipes set it (estimate.pipeline_shapes; plain 1F1B stays a
    # candidate). False: plain 1F1B, Megatron's own default (no --num-layers-per-virtual-pipeline-stage).
    interleave_unnamed: bool = False
    # Interleaved 1F1B named with one model chunk a rank runs as plain 1F1B (Megatron-LM's arguments.py since the
    # --num-virtual-stages-per-pipeline-rank rework sets virtual_pipeline_model_parallel_size 1 to None, so
    # get_forward_backward_func picks the non-interleaved schedule). False: the interleaved code with one chunk, twice
    # 1F1B's warm-up (torch's ScheduleInterleaved1F1B, Megatron-LM of 2021).
    one_chunk_runs_1f1b: bool = False
    zero0_only_pure_dp: bool = False  # DDP cannot combine with TP or PP, and CP turns FSDP on (torchtitan)
    # Mixed precision only through FSDP (dp or cp > 1) or, without TP and PP, DDP's autocast: a TP or PP layout with
    # neither trains in FP32 (torchtitan distributed/utils.py maybe_enable_amp: "Mixed precision training with TP or
    # PP is only supported when FSDP/HSDP/CP is enabled"; Training.dtype defaults to float32)
    amp_needs_fsdp: bool = False
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

    @property
    def weighs_interleaving(self) -> bool:
        """Whether a pipeline named without a schedule weighs interleaving (interleave_unnamed, on a stack that runs
        it; estimate.pipeline_shapes)."""
        return self.interleave_unnamed and "interleaved-1f1b" in self.schedules

    def cannot_run(self) -> tuple[str, ...]:
        """`cannot`, with the capabilities its flags deny (expert parallelism)."""
        return self.cannot + (() if self.expert_parallel else ("expert parallelism (no mixture-of-experts layers of its own)",))

    def loss_run(self, compile: bool, compile_loss: bool = True) -> str:
        """The cross-entropy a job runs (step_time.LOSS_BYTES, job.stack_saved_tensors): "compiled" under --compile where
        the stack compiles its loss too (`compile_loss`, unless the job's release compiled the blocks only), else its
        own `loss`."""
        return "compiled" if compile and self.compile_loss and compile_loss else self.loss

    def compiles_by_default(self, precision: str, fused_norms: bool = False) -> bool:
        """Whether a job on this stack runs under torch.compile unless told otherwise: torchao's Float8 does (its casts
        are meant to be fused: torchtitan's docs/float8.md, "compile.enable (required for competitive performance): use
        torch.compile to fuse the float8 scaling/casting kernels"; every published torchtitan Float8 run compiled),
        except in a release whose preset fused its norms in an otherwise eager model (`fused_norms`)."""
        return precision == "fp8" and self.fp8 == "torchao" and not fused_norms and self.compile_refusal() is None

    def compile_refusal(self) -> str | None:
        """Why `--compile` does not apply to this stack (one clause), or None."""
        if self.fused_elementwise:
            return f"{self.name} already runs its norms, activations and rotary as fused kernels (nothing left for torch.compile to fuse)"
        if not self.compiles:
            return f"{self.name} runs its model eager (it has no torch.compile option)"
        return None

    def kv_refusal(self, num_kv_heads: int, tp: int, planned: bool = True) -> str | None:
        """Why this stack cannot split `num_kv_heads` KV heads over tp (one line naming the fix), or None. `planned`:
        said to the planner's commands, which can name the stack that replicates them (train has no --framework)."""
        if num_kv_heads % tp == 0 or (self.replicates_kv_heads and tp % num_kv_heads == 0):
            return None
        also = " (--framework megatron-2021 replicates them)" if planned and tp % num_kv_heads == 0 else ""
        return (f"tp={tp} does not divide the {num_kv_heads} KV heads, and {self.name} splits them over tp{also} — "
                f"pick a tp dividing {num_kv_heads}")

    def default_etp(self, model, layout: Layout) -> int:
        """The expert tensor parallelism this stack runs `layout` with when the run names none: its dense tp where the
        stack follows it (expert_tp_follows_tp) and the experts can take it (tp divides the expert FFN, and ep x tp
        folds over the dp x tp x cp ranks), else 1."""
        tp = layout.tp
        if not (self.expert_tp_follows_tp and model.is_moe and tp > 1) or model.moe_ffn_hidden % tp:
            return 1
        return tp if (layout.dp * tp * layout.cp) % (layout.ep * tp) == 0 else 1

    def refusal(self, layout: Layout, num_layers: int | None = None, microbatches: int | None = None,
                pipeline_only: bool = False) -> str | None:
        """Why this stack cannot run `layout` (one clause naming it), or None; with the model's `num_layers`, also
        whether its pipeline can cut them; with the step's `microbatches` per rank, whether it accumulates them.
        `pipeline_only`: `layout` is a pipeline alone (simulate), whose data parallelism is not said: no rule on the
        precision it would then train in."""
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
        if self.expert_tp_is_tp_or_one and lay.etp not in (1, lay.tp):
            use = "--etp 1" + (f" or --etp {lay.tp}" if lay.tp > 1 else "")
            return f"{self.name} splits each expert by the dense tp or not at all (use {use})"
        if lay.pp > 1 and lay.schedule not in self.schedules:
            return f"{self.name} has no {lay.schedule} pipeline schedule (it runs {', '.join(self.schedules)})"
        if lay.schedule == "interleaved-1f1b" and 1 < lay.pp < self.min_interleaved_pp:
            return (f"{self.name}'s interleaved schedule needs pp >= {self.min_interleaved_pp} (use --schedule 1f1b "
                    f"or a deeper pipeline)")
        # ZeRO shards over every dp x cp rank (Layout.shard_group): at dp 1 a cp > 1 layout still runs the stage
        if lay.zero not in self.zero_stages and lay.dp * lay.cp > 1:
            return f"{self.name} has no ZeRO-{lay.zero} (it runs ZeRO {', '.join(map(str, self.zero_stages))})"
        if lay.pp > 1 and lay.dp * lay.cp > 1 and lay.zero > self.max_zero_with_pp:
            return f"{self.name} cannot combine a pipeline with ZeRO-{lay.zero} (at most ZeRO-{self.max_zero_with_pp})"
        if self.zero0_only_pure_dp and lay.zero == 0 and lay.dp > 1 and (lay.tp > 1 or lay.pp > 1):
            return f"{self.name}'s DDP (ZeRO-0) does not combine with tensor or pipeline parallelism (use ZeRO-2/3)"
        if lay.replicas > 1 and lay.zero == 1 and not self.zero1_shard_group:
            return f"{self.name} shards ZeRO-1 over every data-parallel rank (drop --dp-shard)"
        if lay.replicas > 1 and lay.zero != 1 and not self.hybrid_shard:
            return f"{self.name} has no hybrid sharding (HSDP; drop --dp-shard)"
        if lay.recompute not in self.recompute:
            runs = ", ".join(self.recompute)
            if lay.recompute == "none":
                return f"{self.name} always recomputes (it runs {runs} recompute)"
            return f"{self.name} has no {lay.recompute} recompute (it runs {runs})"
        if lay.recompute_layers is not None and not self.partial_recompute:
            return f"{self.name} recomputes every layer or none (drop --recompute-layers)"
        if lay.tp > 1 and self.sequence_parallel == "always" and not lay.sequence_parallel:
            return f"{self.name}'s tensor parallelism always shards the sequence (add --sequence-parallel)"
        if lay.sequence_parallel and lay.tp > 1 and self.sequence_parallel == "never":
            return f"{self.name} has no sequence parallelism (drop --sequence-parallel)"
        if lay.cp > 1 and lay.cp_mode not in self.context_parallel:
            runs = f"it runs {' and '.join(self.context_parallel)}" if self.context_parallel else "drop --cp"
            return f"{self.name} has no {lay.cp_mode} context parallelism ({runs})"
        if self.trains_fp32(lay) and not pipeline_only:
            return self.amp_refusal()
        if self.zero0_only_pure_dp and lay.zero == 0 and lay.cp > 1:  # parallel_dims: fsdp_enabled = dp_shard or cp
            return (f"{self.name} shards with FSDP over its context-parallel ranks whenever cp > 1: ZeRO-0 is not a "
                    f"layout it runs (use ZeRO-2/3)")
        if self.name == "shardwise":
            return runtime_refusal(layout)
        return None

    def trains_fp32(self, layout: Layout) -> bool:
        """Whether this stack would run `layout` without mixed precision (amp_needs_fsdp: TP or PP, no dp or cp)."""
        return self.amp_needs_fsdp and fp32_without_fsdp(layout)

    def amp_refusal(self) -> str:
        """Why a stack that applies mixed precision only through FSDP (amp_needs_fsdp) refuses a layout that has none."""
        return (f"{self.name} runs mixed precision only through FSDP: with TP or PP and no data or context "
                f"parallelism it trains in FP32, which is not what is planned (give it dp > 1 or cp > 1)")

    def attention_refusal(self, layout: Layout, flash_attention: bool,
                          unfused_fix: str = "drop --no-flash-attention") -> str | None:
        """Why this stack cannot run `layout` with (or without) a fused attention kernel, or None. `unfused_fix`: what
        makes the job's attention fused again (job.unfused_fix)."""
        if layout.cp > 1 and not flash_attention and (self.cp_fused_attention_only
                                                          or self.cp_attention in ("torch", "shardwise")):
            if self.cp_attention == "shardwise":  # no unfused softmax to turn to: its blocks are its own
                return (f"{self.name} runs context parallelism in its own attention blocks (parallel/context_parallel.py: "
                        f"SDPA's fused kernel on a CPU, FP32 math blocks on a GPU), never an unfused softmax — "
                        f"{unfused_fix}, or use --cp 1")
            why = (" (Megatron-Core's unfused DotProductAttention asserts context_parallel_size == 1)"
                   if self.name in ("megatron-core", "nemo") else
                   " (torch's context_parallel dispatches only SDPA's flash, memory-efficient and cuDNN kernels: "
                   "torch/distributed/tensor/experimental/_context_parallel/_attention.py)"
                   if self.cp_attention == "torch" else "")
            return f"{self.name} runs context parallelism only in its fused attention kernel{why} — {unfused_fix}, or use --cp 1"
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
        counts = self.partial_counts(chunk_layers)
        below = max((c for c in counts if c < n), default=None)
        above = min((c for c in counts if c > n), default=None)
        near = " or ".join(str(c) for c in (below, above) if c is not None)
        near += f", or all {chunk_layers} with --recompute full"
        return (f"{self.name} checkpoints every k-th block, so of {chunk_layers} layers it recomputes "
                f"{chunk_layers} // k: --recompute-layers {n} is none of them (the nearest: {near})")

    def fsdp_once_per_step(self, layout: Layout) -> bool:
        """Whether FSDP's units gather once and reduce-scatter once per step, after a pipeline schedule, holding
        every gradient unsharded until then (`pipeline_fsdp_once` under a pipeline)."""
        return layout.pp > 1 and self.pipeline_fsdp_once

    def zero_when_unnamed(self, layout: Layout) -> int:
        """The ZeRO stage this stack runs `layout` with when the user names none."""
        if layout.pp > 1 and self.default_zero_with_pp is not None:
            return self.default_zero_with_pp
        return self.default_zero
