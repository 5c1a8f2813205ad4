"""DeepSpeed's profiles: its 2021-22 releases, its releases since 2022, its bf16 pipeline path, and GPT-NeoX on it."""

from __future__ import annotations

from dataclasses import replace

from shardwise.planner.framework import Framework


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
    # ZeRO-3's live parameters: each submodule gathered by its pre-forward/backward hook and released after it
    # (v0.5.5 stage3.py release_sub_module; the reuse check fails as above), the default cap from v0.6 on
    zero3_max_live_params=1e9,
    # ZeRO-Offload (`cpu_offload` under zero_optimization stage 2/3 in v0.3-0.5; `offload_optimizer: {device: cpu}`
    # later): each gradient partition copied to pinned host memory as FP32 (stage2.py
    # async_inplace_copy_grad_to_fp32_buffer_from_gpu), DeepSpeedCPUAdam stepping on the host, the FP16/BF16 partition
    # copied back; ZeRO-3's `offload_param` keeps the parameter partitions on the host too, each copied in before its
    # gather (partition_parameters.py). Ren et al. 2021, "ZeRO-Offload" (USENIX ATC); Rajbhandari et al. 2021,
    # "ZeRO-Infinity" (SC'21).
    offload=("optimizer", "params"), offload_zero=2, offload_params_zero=3, offload_grads=True,
    bucket_bytes=5e8 * 2, schedules=("1f1b",), zero_stages=(0, 1, 2, 3), max_zero_with_pp=1, flash_attention=False,
    sequence_parallel="never", context_parallel=(),
    # runtime/pipe/engine.py (is_pipe_partitioned, is_grad_partitioned): the forward rebuilds its received input
    # with PartitionedTensor.full(), the backward its own output (cleared after the send) and the received
    # gradient; full() = zeros, copy of the local part, all_gather, clone (runtime/utils.py): 3 passes.
    p2p_lockstep=True, p2p_messages=2, p2p_regathers=(1, 2), p2p_regather_copies=3,
    # PipelineModule's partition_method "type:<regex>" balances the layer specs whose class matches: BLOOM's
    # --pp-partition-method 'type:transformer|embedding' (bigscience tr11-176B-ml.slurm) counts its two EmbeddingPipe
    # specs as layers, so 70 layers ran on 72 stages, the first and the last holding an embedding alone
    # (reshaping-log.md, TP=1/PP=72; v0.6.5 runtime/pipe/module.py _partition_layers).
    edge_chunks=True,
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
    offload_zero=1,  # stage 1 offloads too (stage_1_and_2.py: one optimizer for both, cpu_offload for either)
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
    offload=(),  # BF16_Optimizer has no offload path
    cannot=("ZeRO-0/2/3 (its BF16_Optimizer always partitions the optimizer states, and only that)",
            "interleaved, GPipe and ZB-H1 schedules", "sequence parallelism", "ring or all-gather context parallelism"),
)
