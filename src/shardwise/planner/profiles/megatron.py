"""Megatron-LM's profiles: the 2021 paper's Megatron, Megatron-Core, and NeMo on Megatron-Core."""

from __future__ import annotations

from shardwise.planner.framework import Framework


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
    named_release="Megatron-LM v3.0 (2022-06; Korthikanti et al. 2022)",
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
    # The paper's schedule is interleaved 1F1B (Sec. 2.2.2, "Schedule with Interleaved Stages"; the profile
    # semantics): a pipeline named without a schedule is weighed as 1F1B and each interleaving depth, as nemo's and
    # llama3's are (estimate.pipeline_shapes)
    interleave_unnamed=True,
)


# Megatron-LM overlaps pipeline transfers with compute in the interleaved schedule only (--overlap-p2p-communication,
# f9283c5a 2023-05-31, on by default from late 2023): for 1F1B, arguments.py sets overlap_p2p_comm False ("non-interleaved
# schedule does not support overlapping p2p communication") and schedules.py waits on each send_forward_recv_backward
# between computes. NeMo runs the same schedules.
MEGATRON_P2P_OVERLAP = ("interleaved-1f1b",)


MEGATRON_CORE = Framework(
    name="megatron-core", cp_fused_attention_only=True, expert_tp_follows_tp=True,
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
    # --optimizer-cpu-offload (with --use-precision-aware-optimizer and the distributed optimizer): HybridDeviceOptimizer
    # copies each shard's FP32 gradients to pinned host memory, steps torch's fused CPU AdamW on FP32 master copies and
    # copies the FP32 parameters back after the step (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py,
    # param_update_in_fp32=True; --overlap-cpu-optimizer-d2h-h2d off by default); the GPU keeps its gradient buffer.
    offload=("optimizer",), offload_zero=1, offload_update_bytes=4,
    # Its published runs and recipes interleave their pipelines (the Megatron-LM README's scaling runs: "pipeline-
    # parallel communication (enabled by default)", which overlaps only under the interleaved schedule; Megatron-Bridge's
    # and NeMo's recipes set a virtual pipeline for every pp > 1): a pipeline named without a schedule is weighed as
    # 1F1B and each interleaving depth, the fastest that fits (estimate.pipeline_shapes), as nemo's is
    interleave_unnamed=True, one_chunk_runs_1f1b=True,
    cannot=("GPipe and ZB-H1 schedules",),
    fp8="te", fp8_experts=True, expert_gemm_streams=4,
    # --moe-token-dispatcher-type flex with DeepEP; --overlap-moe-expert-parallel-comm (megatron/training/arguments.py)
    moe_dispatchers=("alltoall", "deepep"), ep_comm_overlap_available=True,
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
    name="nemo", cp_fused_attention_only=True, expert_tp_follows_tp=True,
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
    zero_stages=(0, 1, 2, 3), default_zero=1, zero2_reduce_every_microbatch=True,
    # SP with every TP in the recipes, but a switch (MegatronStrategy(sequence_parallel=...)): named off, it runs (TP
    # comm overlap, on in the recipes, needs it: --no-tp-comm-overlap too)
    sequence_parallel="default",
    cannot=("GPipe and ZB-H1 schedules",),
    fp8="te", fp8_experts=True, expert_gemm_streams=4,
    # --moe-token-dispatcher-type flex with DeepEP; --overlap-moe-expert-parallel-comm (megatron/training/arguments.py)
    moe_dispatchers=("alltoall", "deepep"), ep_comm_overlap_available=True,
    loss="fused",
    # Every NeMo recipe with a pipeline interleaves it (nemo/collections/llm/recipes: gpt3_175b pp 8 vpp 6, llama3_70b
    # pp 4 vpp 5, mixtral_8x7b pp 4 vpp 8; Megatron-Bridge nemotron4_340b pp 12 vpp 8; dgxc-benchmarking's NeMo configs
    # INTERLEAVED_PIPELINE). Megatron-Core's schedules: a depth of 1 runs plain 1F1B.
    interleave_unnamed=True, one_chunk_runs_1f1b=True,
    # scripts/performance/executors.py: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True on every GPU but B200
    expandable_segments=True,
    partial_recompute="block",  # activations_checkpoint_granularity full, method block, num_layers N (megatron-core's)
    edge_chunks=True,  # megatron-core's account_for_embedding/loss_in_pipeline_split in its model config
    stage_split="megatron",  # megatron-core's split: its recipes name no pipeline layout
)
