"""This project's own runtime as a profile: what `shardwise train` runs (parallel/, train.py)."""

from __future__ import annotations

from shardwise.planner.framework import CALIBRATED_STEP_OVERHEAD, Framework
from shardwise.specs import SCHEDULES


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
    glu_tensors=4,  # shardwise.model's SwiGLU, silu(w1 x) * w3 x, eager (job.SHARDWISE_RUNTIME)
    # FP32 parameters under autocast: each forward casts every weight (4 + 2), each backward casts its gradient back
    # (grad_cast_bytes 2 + 4) and AccumulateGrad adds it into the FP32 gradient after the first micro-batch (4 + 4 + 4).
    autocast_cast_bytes=6, grad_cast_bytes=6, grad_accumulation_bytes=12,
    param_gather_bytes=4, async_sp_regather=False,
    # data_parallel.make_optimizer: torch's fused AdamW on the FP32 parameters, one pass reading p, g, m, v and writing
    # p, m, v (28 B; no master copy, no 16-bit weight to write); grad_norm.GlobalGradNorm: torch._foreach_norm over
    # every gradient the rank holds (4) and _foreach_mul_ by the clip coefficient (8); train.py zeroes DDP's bucket
    # views in place (4), other gradients are set to None.
    optimizer_traffic=28, grad_pass_bytes=12, ddp_zero_bytes=4,
    sp_scatters_positions=True,  # parallel/tensor_parallel.py: a SCATTER_SEQ hook on the position embedding's output
    overlap_grad_reduce=True, zero1="broadcast", fsdp_reduce_every_microbatch=True,
    # parallel/pipeline_step.py PipelineStep: average_gradients after the schedule; expert_parallel.sync_expert_grads
    pipeline_reduce_after_schedule=True, expert_reduce_after_backward=True, tp_sums_whole_experts=True,
    # model.Block / Attention: torch.utils.checkpoint(use_reentrant=False), early stop on (torch's default): w2 is not
    # run again in backward (checked with a forward hook on every linear)
    recompute_early_stop=True,
    schedules=SCHEDULES, zero_stages=(0, 1, 2, 3),
    # parallel/pipeline_step.py build_pipeline: each TP rank sends the whole (mb, seq, hidden) activation without SP
    # (its sequence shard with SP), as FP32 (the executor's dtype: the residual stream stays FP32 under autocast)
    p2p_split_over_tp=False, p2p_bytes=4,
    # parallel/context_parallel.py: off CPU each block is FP32 math (no fused GPU kernel returning its log-sum-exp yet)
    cp_attention="shardwise",
    torch_fsdp=2,  # parallel/data_parallel.py: fully_shard (FSDP2), its copies into and out of the collectives' buffers
    calibrated_step_overhead=CALIBRATED_STEP_OVERHEAD, one_scalar_allreduce=True,
    expert_gemm_streams=1,  # shardwise.moe.Experts: one local expert after another
    experts_in_layer_units=True,  # parallel/data_parallel.py: experts apart only under an expert placement
    # data_parallel._shard_experts: each block's experts an FSDP2 unit of their own, prefetched implicitly (one unit
    # ahead): one layer's local experts gathered at a time under ZeRO-3, not two (measured by train --json, validate)
    zero3_expert_layers_gathered=1,
    cannot=("ZB-H1 with ZeRO-2/3 (FSDP cannot follow a split backward)", "TP comm overlap"),
    loss="eager", unnamed_sequence_parallel=False,
    partial_recompute="block",  # shardwise.model Transformer.set_recompute: the first N blocks of each chunk
    autocast_saved=True,  # measured on one H200 (benchmarks/data/gpu) and under CPU autocast (tests/test_memory_truth.py)
    selective_recomputes_rope=True,
)
