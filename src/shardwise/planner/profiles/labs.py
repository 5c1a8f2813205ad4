"""The in-house stacks behind published runs: InternEvo, Meta's Llama 2 and Llama 3 stacks, flash-attn's own GPT training
code, Aleph Alpha's and nanotron."""

from __future__ import annotations

from dataclasses import replace

from shardwise.planner.framework import Framework
from shardwise.planner.profiles.megatron import MEGATRON_CORE


# InternEvo (InternLM's training framework, 2023; doc/en/train_performance.md's A100 tables): Megatron-style TP and
# pipelines, its Hybrid ZeRO-1, FlashAttention and Apex's fused kernels.
INTERNEVO = replace(
    MEGATRON_CORE, name="internevo", fp8_experts=False, expert_tp_follows_tp=False,
    moe_dispatchers=("alltoall",), ep_comm_overlap_available=False,  # DeepEP and the EP overlap are Megatron-Core's
    offload=(),  # no CPU offload path modelled for this stack (planner/offload.py)
    interleave_unnamed=False,  # its config's num_chunks (virtual stages) defaults to 1: plain 1F1B unless named
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
             "passes'; all-gather context parallelism; interleaved schedule) and its 'Numerical stability' paragraph ('FP32 gradient accumulation "
             "during backward computation over multiple micro-batches and also reduce-scatter gradients in FP32')",
             "docs/planner.md 'Llama 3's data parallelism': reduce-scattering (or gathering) every micro-batch would put "
             "9-13 s of FP32/BF16 traffic per GPU on its 400 Gb/s NIC in a 12.5 s step (8,192 GPUs), 4.5-6.8 s in 6.7 s "
             "(16,384)"),
    attention="fa2", grad_reduce_bytes=4, overlap_grad_reduce=True, pipeline_fsdp_once=True,
    weight_shard_is_master=True,  # as FSDP2 shards it: the FP32 parameter shard is the optimizer's master
    p2p_overlap=("1f1b", "interleaved-1f1b"), zero_stages=(0, 1, 2), context_parallel=("allgather",),
    # Sec. 3.3.2: "we reduce one Transformer layer each from the first and the last stages, respectively. This means
    # that the first model chunk on the first stage has only the embedding, and the last model chunk on the last stage
    # has only output projection and loss calculation."
    edge_chunks=True,
    # Sec. 3.3.2 describes its pipeline as interleaved (Fig. 6): a pipeline named without a schedule is weighed as 1F1B
    # and each interleaving depth, as NeMo's recipes are
    interleave_unnamed=True,
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
    recompute_modules=("layernorm",), zero_stages=(0, 1), schedules=(), edge_chunks=False, interleave_unnamed=False,
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


ALEPH_ALPHA = replace(
    MEGATRON_CORE, name="aleph-alpha", expert_parallel=False, fp8_experts=False,
    moe_dispatchers=("alltoall",), ep_comm_overlap_available=False,  # DeepEP and the EP overlap are Megatron-Core's
    offload=(),  # no CPU offload path modelled for this stack (planner/offload.py)
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
    MEGATRON_CORE, name="nanotron", cp_fused_attention_only=False, fp8_experts=False, expert_tp_follows_tp=False,
    moe_dispatchers=("alltoall",), ep_comm_overlap_available=False,  # DeepEP and the EP overlap are Megatron-Core's
    offload=(),  # no CPU offload path modelled for this stack (planner/offload.py)
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
