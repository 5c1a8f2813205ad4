"""PyTorch-native stacks' profiles: torchtitan (FSDP2, torch pipelining), NeMo AutoModel, MosaicML Composer, Lit-GPT
and IBM's fms-fsdp."""

from __future__ import annotations

from dataclasses import replace

from shardwise.planner.framework import Framework


TORCHTITAN = Framework(
    name="torchtitan",
    summary="FSDP2 (reshard after forward without PP, not with PP), FP32 reduce_dtype, reduce-scatter "
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
    schedules=("gpipe", "1f1b", "interleaved-1f1b"), zero_stages=(0, 2, 3), zero0_only_pure_dp=True, amp_needs_fsdp=True,
    default_zero=3, default_zero_with_pp=2, selective="op", hybrid_shard=True, torch_fsdp=2, experts_in_layer_units=True,
    expert_tp_is_tp_or_one=True,
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
    # training.enable_cpu_offload: fully_shard(..., offload_policy=CPUOffloadPolicy()) (torchtitan parallelize.py
    # apply_fsdp): the FP32 parameter shards and their gradients live in pinned host memory, each gathered unit's
    # shard copied in before its all-gather and its reduce-scattered gradient copied out, and the optimizer steps
    # on the host tensors (torch/distributed/fsdp/_fully_shard/_fsdp_param.py: offload_to_cpu); FSDP (ZeRO-2/3) only.
    offload=("params",), offload_params_zero=2, offload_grads=True,
    # activation_checkpoint mode "selective" with selective_ac_option "k": every k-th block wrapped in a full
    # checkpoint (torchtitan 1ea476e9f parallelisms/parallelize_llama.py checkpoint_wrapper; default "2")
    partial_recompute="every",
    sequence_parallel="always", tp_comm_overlap_available=True, dtensor_sp=True,
    cannot=("ZeRO-1", "DDP (ZeRO-0 over data-parallel replicas) with TP, PP or CP (FSDP shards over its cp ranks)", "ZB-H1 (its zero-bubble schedules need several stages per rank)",
            "experts split by a tp other than the dense tp or none (ParallelDims: etp == tp or etp == 1)",
            "TP or PP with neither data nor context parallelism (mixed precision comes only through FSDP there: it "
            "would train in FP32)"),
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
    amp_needs_fsdp=False,  # BF16 parameters: no mixed precision to lose
    offload=(),  # no CPU offload path modelled for this stack (planner/offload.py)
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
    moe_dispatchers=("alltoall", "deepep"),  # GroupedExpertsDeepEP (its *_te_deepep recipes)
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
    # A pipeline named without a schedule weighs plain 1F1B and each interleaving depth (estimate.pipeline_shapes), where
    # torchtitan, its parent, keeps its config's 1F1B: AutoModel's benchmark configs and guides set AutoPipeline's
    # pp_schedule to interleaved1f1b, and its published pipeline rows ran virtual stages (DeepSeek-V3 vpp 8, Kimi K2 4)
    interleave_unnamed=True,
    cannot=TORCHTITAN.cannot + ("FP8 training (not in its published runs)", "recompute of only some layers"),
)


# MosaicML Composer's FSDP (PyTorch FSDP1), as llm-foundry's MPT recipes and benchmark sweeps ran it in 2023-24
# (Composer 0.16-0.17, torch 2.0-2.1; llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml at 061f2c7c).
COMPOSER = replace(
    TORCHTITAN, name="composer",
    offload=(),  # no CPU offload path modelled for this stack (planner/offload.py)
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
    offload=(),  # no CPU offload path modelled for this stack (planner/offload.py)
    summary="as composer, with fsdp_config mixed_precision PURE: gradients reduce-scattered in BF16",
)


# Lit-GPT's pretraining script as TinyLlama ran it (2023-09): Lightning Fabric's FSDPStrategy (PyTorch FSDP1) with
# precision bf16-mixed, FlashAttention-2 and flash-attn's / xformers' fused kernels.
LIT_GPT = replace(
    COMPOSER, name="lit-gpt", expert_parallel=False,
    offload=(),  # no CPU offload path modelled for this stack (planner/offload.py)
    window_kernel=False,  # litgpt's CausalSelfAttention: F.scaled_dot_product_attention with a sliding-window mask
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
    offload=(),  # no CPU offload path modelled for this stack (planner/offload.py)
    window_kernel=False,  # foundation-model-stack's attention: torch's SDPA
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
