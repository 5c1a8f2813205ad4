"""Megatron-LM / Megatron-Core: a bash script with the command-line arguments and the torchrun line.

Option names and meanings are Megatron-LM's `megatron/training/arguments.py` (docs/emit.md gives the
commit; tests/test_emit.py parses what is written here with that parser's option table and builds
megatron-core's config dataclasses from it):
  --tensor-model-parallel-size, --pipeline-model-parallel-size, --sequence-parallel
  --num-layers-per-virtual-pipeline-stage  interleaved 1F1B when the scored split (emit.stage_counts) is
                                           even; otherwise
  --pipeline-model-parallel-layout         that split stage by stage ("Et*26|t*27|t*27L": E embedding,
                                           t a transformer layer, L the loss; stage k = chunk·pp + rank)
  --micro-batch-size, --global-batch-size  Megatron derives the number of micro-batches from them
  ZeRO-1  --use-distributed-optimizer (with --offload optimizer also --optimizer-cpu-offload
          --use-precision-aware-optimizer); ZeRO-2/3 --use-megatron-fsdp with --data-parallel-sharding-strategy
          optim_grads / optim_grads_params (which also requires --ckpt-format fsdp_dtensor)
  recompute selective: --recompute-granularity selective (the attention core, Korthikanti et al.);
          full: --recompute-granularity full --recompute-method uniform --recompute-num-layers 1;
          full of N layers per chunk (--recompute-layers): --recompute-method block --recompute-num-layers N
  --context-parallel-size with --cp-comm-type p2p (ring) or all_gather
  mixture of experts: --num-experts, --moe-router-topk, --moe-ffn-hidden-size, --moe-layer-freq, ...;
  --expert-model-parallel-size / --expert-tensor-parallel-size (ep, etp)
  --overlap-grad-reduce / --overlap-param-gather with data parallelism (not for a plan priced on a stack that
  reduces after the backward: megatron-2021), --tp-comm-overlap when modelled.
  --bf16; --precision fp8: --fp8-format hybrid (Transformer Engine's delayed scaling), --fp8-param-gather with FP8
          parameters.
Megatron has no GPipe or zero-bubble (ZB-H1) schedule: those layouts are not expressible.
"""

from __future__ import annotations

import itertools
import shlex

from shardwise.emit import block_kinds, stage_counts, unwritable
from shardwise.planner.frameworks import get as get_framework
from shardwise.planner.layer_time import attention_kernel

SCHEDULES = ("1f1b", "interleaved-1f1b")


def attention_backend(job) -> str:
    """Megatron-Core's --attention-backend for the kernel the plan priced (layer_time.attention_kernel): cuDNN's
    fused attention is "fused", FlashAttention "flash", a materialised softmax "unfused"."""
    kernel = attention_kernel(job)
    return "unfused" if not kernel else "fused" if kernel == "cudnn" else "flash"


def problem(job, layout) -> str | None:
    if layout.recompute == "selective" and job.selective == "op":  # Megatron's selective is the attention core only
        return ("per-op selective recompute (torchtitan's, as this plan scored it) — Megatron-LM's selective recompute "
                "is the attention core; plan with --framework megatron-core, or narrow the search with --recompute "
                "none,full")
    if job.fp8_all_gather:
        return ("torchao's float8 all-gather (--fp8-params under torchtitan) — Megatron-LM gathers FP8 weights as "
                "Transformer Engine's FP8 parameters; plan with --framework megatron-core --fp8-params to emit those")
    if job.train.weight_bytes == 1 and layout.zero == 0:  # arguments.py: "--fp8-param-gather only supported with ..."
        return ("FP8 parameters without ZeRO — Megatron-LM gathers FP8 parameters (--fp8-param-gather) only through its "
                "distributed optimizer or FSDP; plan with data parallelism and --zero 1,2,3")
    if layout.pp > 1 and layout.schedule not in SCHEDULES:
        return (f"schedule {layout.schedule} — Megatron-LM runs 1F1B, or interleaved 1F1B with virtual stages "
                f"(narrow the search with --schedules 1f1b,interleaved-1f1b)")
    if job.tp_comm_overlap and layout.tp > 1 and not layout.sequence_parallel:
        return "--tp-comm-overlap needs sequence parallelism in Megatron-LM (--sequence-parallel)"
    if layout.replicas > 1:  # the file's --use-megatron-fsdp / --use-distributed-optimizer shard over every dp rank
        return (f"hybrid sharding (ZeRO over shard groups of {layout.dp_shard}, replicated across them) — the "
                "arguments written here shard over every data-parallel rank; plan without --dp-shard")
    if job.ep_comm_overlap and layout.ep > 1:  # TransformerConfig.__post_init__'s overlap_moe_expert_parallel_comm checks
        if layout.recompute == "full":
            return "--ep-comm-overlap with full recompute — Megatron-Core's EP overlap refuses recomputation"
        if layout.pp > 1 and layout.vpp == 1:
            return "--ep-comm-overlap under a pipeline without virtual stages — Megatron-Core's EP overlap needs them"
        if job.precision == "fp8":
            return "--ep-comm-overlap with FP8 — Megatron-Core's EP overlap runs on a bf16 or fp16 model only"
    return None


def pipeline_layout(counts) -> str:
    """Megatron's --pipeline-model-parallel-layout for these layers per virtual stage (stage k = chunk·pp + rank)."""
    stages = ["t" * n if n < 3 else f"t*{n}" for n in counts]
    first, middle, last = "E" + stages[0], stages[1:-1], stages[-1] + "L"
    runs = [(stage, len(list(group))) for stage, group in itertools.groupby(middle)]
    # A run of k equal stages is written (t*n|)*k, which Megatron's parser unrolls; commas are cosmetic.
    return first + "|" + ",".join([f"({stage}|)*{k}" if k > 1 else f"{stage}|" for stage, k in runs] + [last])


def model_problem(job) -> str | None:
    """What of the planned model the arguments written here would not build (the script would train another model):
    a block feature, a routing rule, an attention window or a RoPE scaling without a Megatron-LM argument below."""
    m, kind = job.model, block_kinds(job.model)
    unwritten = [
        (kind["attn_bias"] and not kind["mlp_bias"], "biases on the attention's matrices but not on the MLP's"),
        (kind["mlp_bias"] and not kind["attn_bias"], "biases on the MLP's matrices but not on the attention's"),
        (m.qk_norm not in ("", "head"), "a norm on q and k over all heads (OLMo 2's)"),
        (kind["mlp"] not in MLP_ARGS, f"a {kind['mlp']} MLP"),
        (kind["norm"] not in NORMS, f"{kind['norm']} norms"),
        (kind["positions"] not in POSITIONS, f"{kind['positions']} positions"),
        (m.position_offset != 0, "a learned position table with extra rows"),
        (kind["positions"] == "learned" and job.train.seq_len > m.max_positions,  # a longer table: another model
         f"{m.max_positions} learned positions, fewer than the --seq-len {job.train.seq_len} planned"),
        *unwritable(job),
    ]
    why = next((why for bad, why in unwritten if bad), None)
    return why or _routing_problem(m) or _rope_args(m)[1]


def _routing_problem(m) -> str | None:
    """A router Megatron-Core cannot run as the config routes: its softmax router renormalises the top k unless it
    takes the softmax first (--moe-router-pre-softmax), which top-1 needs (TransformerConfig refuses top-1 without it,
    whose weight is then the probability, not 1); its sigmoid router renormalises every top k above 1."""
    if not m.num_experts:
        return None
    if m.router_scoring == "softmax" and m.experts_per_token == 1 and m.norm_topk:
        return "top-1 routing renormalised to weight 1 (Megatron-Core routes top-1 only with the softmax first)"
    if m.router_scoring == "sigmoid" and m.experts_per_token > 1 and not m.norm_topk:
        return "sigmoid routing without renormalising the top k (Megatron-Core's sigmoid router renormalises it)"
    return None


# Megatron-Core's Llama 3.1 RoPE scaling keeps these (rotary_pos_embedding._apply_scaling): only the factor is an argument.
LLAMA3_ROPE = {"low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}
# MLATransformerConfig's YaRN constants with no argument that reaches it.
MLA_YARN = {"original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}


def _rope_args(m) -> tuple[list, str | None]:
    """(Megatron-LM's arguments for the config's RoPE scaling, or why it has none): Llama 3.1's (--use-rope-scaling
    --rope-scaling-factor), DeepSeek's YaRN under latent attention (--rotary-scaling-factor --mscale --mscale-all-dim;
    with MLA and no --rope-type, Megatron-Core runs YaRN, at factor 1 plain RoPE)."""
    scaling = dict(m.rope_scaling)
    kind = scaling.get("rope_type")
    if not kind:
        return [], None
    if kind == "llama3" and all(scaling.get(k, v) == v for k, v in LLAMA3_ROPE.items()):
        return ["--use-rope-scaling", "--rope-scaling-factor", scaling.get("factor", 8.0)], None
    if kind == "yarn" and m.attention == "mla" and all(scaling.get(k, v) == v for k, v in MLA_YARN.items()):
        return ["--rotary-scaling-factor", scaling.get("factor", 1.0), "--mscale", scaling.get("mscale", 1.0),
                "--mscale-all-dim", scaling.get("mscale_all_dim", 0.0)], None
    return [], f"{kind} RoPE scaling with {', '.join(f'{k} {v}' for k, v in sorted(scaling.items()) if k != 'rope_type')}"


# The block parts Megatron-LM's arguments spell, by the planner's names (model_spec.ModelSpec).
MLP_ARGS = {"swiglu": ["--swiglu"], "gelu": [], "squared-relu": ["--squared-relu"]}  # Megatron's default is GELU
NORMS = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
POSITIONS = {"rotary": "rope", "learned": "learned_absolute", "none": "none"}


def _model_args(job) -> list[str]:
    m, s = job.model, job.train.seq_len
    kind = block_kinds(m)
    args = ["--num-layers", m.num_layers, "--hidden-size", m.hidden, "--ffn-hidden-size", m.ffn_hidden,
            "--num-attention-heads", m.num_heads]
    if m.attention == "mla":  # DeepSeek's multi-head latent attention: its ranks and head dims
        args += ["--multi-latent-attention", "--kv-lora-rank", m.kv_lora_rank, "--qk-head-dim", m.qk_nope_head_dim,
                 "--qk-pos-emb-head-dim", m.qk_rope_head_dim, "--v-head-dim", m.v_head_dim]
        args += ["--q-lora-rank", m.q_lora_rank] if m.q_lora_rank else []
        args.append("--qk-layernorm")  # MLA: the norms on the compressed q and kv latents (the planner counts them)
    else:
        if m.head_dim * m.num_heads != m.hidden:
            args += ["--kv-channels", m.head_dim]
        if m.num_kv_heads != m.num_heads:
            args += ["--group-query-attention", "--num-query-groups", m.num_kv_heads]
    args += ["--seq-length", s, "--max-position-embeddings", max(s, m.max_positions)]
    args += ["--position-embedding-type", POSITIONS[kind["positions"]]]
    if kind["positions"] == "rotary":
        args += ["--rotary-base", int(m.rope_theta)] + _rope_args(m)[0]
    args += ["--normalization", NORMS[kind["norm"]], "--norm-epsilon", m.norm_eps] + MLP_ARGS[kind["mlp"]]
    if not kind["attn_bias"]:  # Megatron adds a bias to every linear layer unless told not to
        args += ["--disable-bias-linear"] + (["--add-qkv-bias"] if m.qkv_bias else [])
    if m.qk_norm == "head" and m.attention != "mla":
        args.append("--qk-layernorm")
    if not m.trains_with_dropout:  # Megatron's dropouts default to 0.1
        args += ["--attention-dropout", 0.0, "--hidden-dropout", 0.0]
    if not m.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    args += ["--attention-backend", attention_backend(job)]
    if m.num_experts:
        args += _moe_args(m, get_framework(job.framework))
    return args


def _moe_args(m, fw) -> list:
    """A mixture-of-experts model's FFN, in Megatron-Core's MoE arguments; its local experts' GEMMs as the plan's stack
    ran them: Transformer Engine's GroupedLinear (--moe-grouped-gemm; without it Megatron builds SequentialMLP, one
    expert after another: transformer_engine_spec_provider.py grouped_mlp_modules) unless the stack runs them one by
    one (Framework.expert_gemm_streams 1)."""
    args = ["--num-experts", m.num_experts, "--moe-router-topk", m.experts_per_token, "--moe-ffn-hidden-size", m.moe_ffn_hidden]
    if fw.expert_gemm_streams != 1:
        args.append("--moe-grouped-gemm")
    if m.shared_ffn_hidden:
        args += ["--moe-shared-expert-intermediate-size", m.shared_ffn_hidden]
        args += ["--moe-shared-expert-gate"] if m.shared_expert_gate else []
    if len(m.moe_layers) < m.num_layers:  # which layers are MoE (1) or dense (0), as a Python list
        args += ["--moe-layer-freq", "[" + ",".join("1" if m.is_moe_layer(i) else "0" for i in range(m.num_layers)) + "]"]
    if m.router_scoring != "softmax":  # DeepSeek-V3's sigmoid router balances by a per-expert bias, not by a loss alone
        args += ["--moe-router-score-function", m.router_scoring, "--moe-router-enable-expert-bias"]
    elif not m.norm_topk:  # the top-k weights as the softmax over all experts gave them (Mixtral renormalises)
        args.append("--moe-router-pre-softmax")
    if m.routed_scaling != 1.0:
        args += ["--moe-router-topk-scaling-factor", m.routed_scaling]
    if m.router_groups > 1:
        args += ["--moe-router-num-groups", m.router_groups, "--moe-router-group-topk", m.router_topk_groups]
    if m.aux_loss_coef:
        args += ["--moe-aux-loss-coeff", m.aux_loss_coef]
        # DeepSeek's per-sequence loss is Megatron-Core's seq_aux_loss (f over the top-k picks, each layer's added)
        args += ["--moe-router-load-balancing-type", "seq_aux_loss"] if m.deepseek_balance_loss else []
    return args


def _parallel_args(job, layout) -> list[str]:
    args = ["--tensor-model-parallel-size", layout.tp, "--pipeline-model-parallel-size", layout.pp]
    if layout.tp > 1 and layout.sequence_parallel:
        args.append("--sequence-parallel")
    if layout.tp > 1 and job.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    if job.model.num_experts:  # experts folded over the dp x tp ranks (Megatron's MoE parallel folding)
        args += ["--expert-model-parallel-size", layout.ep, "--expert-tensor-parallel-size", layout.etp]
        # the dispatcher the plan priced (TransformerConfig's default is allgather): NCCL's all-to-all, or DeepEP's,
        # which Megatron's flex dispatcher runs only over more than one expert rank ("DeepEP dispatcher requires
        # TPxEP > 1", MoEFlexTokenDispatcher): with none, nothing moves and all-to-all is the same step
        deepep = job.moe_dispatcher == "deepep" and layout.ep * layout.etp > 1
        args += (["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]
                 if deepep else ["--moe-token-dispatcher-type", "alltoall"])
        if job.ep_comm_overlap and layout.ep > 1:
            args.append("--overlap-moe-expert-parallel-comm")
    if layout.cp > 1:  # ring attention passes K/V point to point (p2p); all-gather gathers them once
        args += ["--context-parallel-size", layout.cp, "--cp-comm-type", "p2p" if layout.cp_mode == "ring" else "all_gather"]
    counts = stage_counts(job, layout)  # Megatron's own cut, or another named as a layout
    if layout.pp > 1 and len(set(counts)) > 1:
        args += ["--pipeline-model-parallel-layout", pipeline_layout(counts)]
    elif layout.vpp > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", counts[0]]
    if layout.zero == 1:
        args.append("--use-distributed-optimizer")
    elif layout.zero >= 2:
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                 "optim_grads" if layout.zero == 2 else "optim_grads_params", "--ckpt-format", "fsdp_dtensor"]
    if job.offload:  # HybridDeviceOptimizer: needs the precision-aware path, which needs the distributed optimizer
        if layout.zero < 1:
            args.append("--use-distributed-optimizer")
        args += ["--optimizer-cpu-offload", "--use-precision-aware-optimizer"]
    fw = get_framework(job.framework)
    args += _grad_dtype_args(layout, fw)
    # overlapped unless the plan was priced on a stack that reduces after the backward (megatron-2021, the 2021-22
    # DeepSpeed): the script then runs what was priced. DDP and the distributed optimizer reduce over the dp x cp
    # ranks (distributed_data_parallel.py), so a dp 1 layout with cp > 1 reduces too.
    if layout.dp * layout.cp > 1 and fw.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
        if layout.zero >= 2 or layout.zero == 1 and fw.overlap_param_gather:
            args.append("--overlap-param-gather")
    if layout.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif layout.recompute == "full" and layout.recompute_layers is not None:  # the first N of each chunk
        args += ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
                 layout.recompute_layers]
    elif layout.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", 1]
    return args


def _grad_dtype_args(layout, fw) -> list:
    """The dtype the gradients are accumulated and reduced in, as the plan priced it (Framework.grad_reduce_bytes).
    Megatron's DDP and distributed optimizer accumulate and reduce in FP32 under --bf16 by default
    (arguments.py: accumulate_allreduce_grads_in_fp32 follows --main-grads-dtype fp32), BF16 with
    --grad-reduce-in-bf16; Megatron-FSDP (ZeRO-2/3) in the model's dtype unless --megatron-fsdp-main-grads-dtype
    names another ('auto' is the compute dtype: megatron_fsdp/mixed_precision.py main_grads_dtype)."""
    fp32 = fw.grad_reduce_bytes == 4
    if layout.zero >= 2:
        return ["--megatron-fsdp-main-grads-dtype", "fp32" if fp32 else "bf16"]
    return [] if fp32 else ["--grad-reduce-in-bf16"]


def arguments(target) -> dict[str, list[str]]:
    """The argument groups, as strings: {"MODEL_ARGS": [...], "PARALLEL_ARGS": [...], "BATCH_ARGS": [...]}."""
    job, lay = target.job, target.layout
    batch = ["--micro-batch-size", lay.micro_batch, "--global-batch-size", job.train.global_batch, "--bf16"]
    if job.precision == "fp8":  # Transformer Engine's delayed scaling, E4M3 forward and E5M2 backward (NeMo's recipe)
        batch += ["--fp8-format", "hybrid"] + (["--fp8-param-gather"] if job.train.weight_bytes == 1 else [])
    groups = {"MODEL_ARGS": _model_args(job), "PARALLEL_ARGS": _parallel_args(job, lay), "BATCH_ARGS": batch}
    return {k: [str(a) for a in v] for k, v in groups.items()}


def _lines(args: list[str]) -> list[str]:
    """One option (with its value) per line."""
    out: list[str] = []
    for a in args:
        if a.startswith("--") or not out:
            out.append(a)
        else:
            out[-1] += " " + shlex.quote(a)
    return out


def _connections(target) -> list[str]:
    """CUDA_DEVICE_MAX_CONNECTIONS as Megatron-LM's validate_args wants it before Blackwell: 1 with TP or CP unless
    Megatron FSDP runs (which wants more) or the EP overlap does (whose all-to-alls want more; arguments.py warns,
    the plan priced the overlap, so it gets them); unset otherwise."""
    lay, job = target.layout, target.job
    if lay.zero >= 2 or (lay.tp == 1 and lay.cp == 1):
        return []
    if job.ep_comm_overlap and lay.ep > 1:
        return ["export CUDA_DEVICE_MAX_CONNECTIONS=32  # the EP overlap's all-to-alls run beside compute on more streams"]
    return ["export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron orders TP / CP communication before compute with it"]


def render(target) -> str:
    lines = ["#!/usr/bin/env bash", "# Megatron-LM launch written by `shardwise plan --emit megatron`."]
    lines += [f"# {line}" for line in target.summary()]
    lines += ["# Run it on every node with NODE_RANK (0..%d) and MASTER_ADDR set, from a Megatron-LM checkout"
              % (target.nodes - 1),
              "# (or set MEGATRON_LM); add your data, tokenizer and optimizer arguments after the script's name.",
              f"# The vocabulary comes from your tokenizer ({target.job.model.vocab_size} in the planned model).",
              *(["# The model trains with dropout: Megatron-LM's rates are 0.1 (--attention-dropout, --hidden-dropout); "
                 "add your config's if they differ."] if target.job.model.trains_with_dropout else []),
              "set -euo pipefail"]
    lines += _connections(target)
    for name, args in arguments(target).items():
        lines.append(f"{name}=(")
        lines += [f"    {line}" for line in _lines(args)]
        lines.append(")")
    lines += [
        f"torchrun --nnodes {target.nodes} --nproc-per-node {target.gpus_per_node} "
        '--node-rank "${NODE_RANK:-0}" \\',
        '    --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-6000}" \\',
        '    "${MEGATRON_LM:-.}/pretrain_gpt.py" "${MODEL_ARGS[@]}" "${PARALLEL_ARGS[@]}" "${BATCH_ARGS[@]}" "$@"',
    ]
    return "\n".join(lines) + "\n"


def launch(target, path) -> str:
    return f"NODE_RANK=<0..{target.nodes - 1}> MASTER_ADDR=<node 0> bash {path} --data-path ... --tokenizer-type ..."
