"""torchtitan: its TOML job config (read by `torchtitan.config.ConfigManager`, `--job.config_file`).

Keys and meanings are torchtitan's `torchtitan/config/job_config.py` (the TOML job config of releases up
to 0.2.x; docs/emit.md gives the version; tests/test_emit.py parses what is written here with that
ConfigManager, which rejects unknown keys):
  [parallelism] data_parallel_shard_degree (FSDP2) with fsdp_reshard_after_forward "never" = ZeRO-2
      (weights stay gathered from forward to backward) or "always" = ZeRO-3; data_parallel_replicate_degree
      = DDP (ZeRO-0), which torchtitan runs only on a 1-D mesh; tensor_parallel_degree (always with
      sequence parallelism); pipeline_parallel_degree, _schedule (GPipe, 1F1B, Interleaved1F1B),
      _microbatch_size; the scored split (emit.stage_counts: the job's stack's cut) as _layers_per_stage when even (with
      _first/_last_stage_less_layers = 0) or module_fqns_per_model_part stage by stage; stage k sits on
      rank k mod pp (torchtitan's "loop" style, Megatron's order); context_parallel_degree with
      _rotate_method "alltoall" (ring) or "allgather".
  [training] local_batch_size (per data-parallel rank per accumulation step), global_batch_size (the
      rest is gradient accumulation), seq_len, bf16 parameters with fp32 reductions.
  [activation_checkpoint] mode "none" or "full" (every layer); selective recompute as the torchtitan profile prices
      it: mode "selective" with selective_ac_option "op" (per-op SAC); --recompute-layers N of a c-layer stage:
      mode "selective" with selective_ac_option "k", every k-th block (k = c // N, so that c // k = N).
  [compile] enable (with the loss among its components unless --no-compile-loss) under --compile, and for async TP;
      --precision fp8: [model] converters "quantize.linear.float8", [quantize.linear.float8] recipe_name "tensorwise"
      with the LM head ("output") left out, as the planner prices it; without TP (0.2.x's TP plans look for a converter
      named "float8" and would run the BF16 ones); --fp8-params: its tensor-wise config with
      enable_fsdp_float8_all_gather and precompute_float8_dynamic_scale_for_fsdp (no recipe_name, which it refuses
      beside them).
torchtitan has no ZeRO-1, no ZB-H1 with one stage per rank, and no attention-core selective recompute (a plan scored
under another stack's selective recompute): those layouts are not expressible.
"""

from __future__ import annotations

import json

from shardwise.emit import block_kinds, printable, stage_counts, unwritable
from shardwise.planner.framework import fp32_without_fsdp

SCHEDULE = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
# torchtitan's llama3 flavors (torchtitan/models/llama3/__init__.py): (hidden, layers, heads, kv heads, FFN width from
# its ffn_dim_multiplier and multiple_of, rope_theta, untied head) -> name; the vocabulary comes from the tokenizer.
FLAVORS = {(4096, 32, 32, 8, 14336, 500000.0, False): "8B", (8192, 80, 64, 8, 28672, 500000.0, False): "70B",
           (16384, 126, 128, 8, 53248, 500000.0, False): "405B"}
# What every flavor also sets (models/llama3/model/args.py at 0.2.2): RoPEScalingArgs' defaults, Llama 3.1's scaling,
# which precompute_freqs_cis applies whatever the flavor, and norm_eps 1e-5. Llama 3 (no scaling) is no flavor there.
FLAVOR_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
FLAVOR_NORM_EPS = 1e-5


def flavor(m) -> str | None:
    """The torchtitan llama3 flavor of this model (shape, RoPE scaling and norm epsilon), or None."""
    if m.family != "llama" or dict(m.rope_scaling) != FLAVOR_ROPE or m.norm_eps != FLAVOR_NORM_EPS:
        return None
    return FLAVORS.get((m.hidden, m.num_layers, m.num_heads, m.num_kv_heads, m.ffn_hidden, float(m.rope_theta),
                        m.tie_embeddings))


def model_problem(job) -> str | None:
    """What of the planned model torchtitan's llama3 model (the one this file names) would not build: it is Llama 3's
    block only — RMSNorm, rotary positions, a SwiGLU MLP, no biases, no dropout, grouped-query attention over the
    whole sequence."""
    m, kind = job.model, block_kinds(job.model)
    unwritten = [
        (m.family != "llama", f"{m.family} blocks"),
        (m.attention == "mla", "multi-head latent attention"),
        (kind["mlp"] != "swiglu", f"a {kind['mlp']} MLP"),
        (kind["norm"] != "rmsnorm", f"{kind['norm']} norms"),
        (kind["positions"] != "rotary", f"{kind['positions']} positions"),
        (kind["attn_bias"] or kind["mlp_bias"] or m.qkv_bias, "biases"),
        (bool(m.qk_norm), "norms on q and k"),
        (m.trains_with_dropout, "dropout"),
        *unwritable(job),
    ]
    return next((why for bad, why in unwritten if bad), None)


def problem(job, layout) -> str | None:
    if job.train.weight_bytes == 1:
        return ("Transformer Engine's FP8 parameters (--fp8-params under megatron-core or nemo) — torchtitan gathers "
                "FP8 weights with torchao's float8 all-gather; plan with --framework torchtitan --fp8-params to emit that")
    if job.precision == "fp8" and layout.tp > 1:  # models/llama3/infra/parallelize.py: "float8" in model.converters
        return ("FP8 with TP — torchtitan 0.2.x turns on its Float8 tensor-parallel plans only for a converter named "
                "'float8', which it no longer registers ('quantize.linear.float8'), so its TP would gather BF16 and cast "
                "whole, which the planner did not price; plan with --tp 1")
    if job.model.num_experts:
        return ("a mixture-of-experts model — torchtitan's MoE models are model names of their own (deepseek_v3, "
                "qwen3, llama4); this emitter writes llama3 jobs")
    if job.fused_norms:
        return ("fused norms (--fused-norms: torchtitan's fused_rmsnorm, gone since 2024-08) — torchtitan 0.2's llama3 "
                "runs nn.RMSNorm; plan without --fused-norms")
    if layout.zero == 1 and layout.dp * layout.cp > 1:  # FSDP over the cp ranks too (fsdp_enabled: dp_shard or cp)
        return ("ZeRO-1 — torchtitan shards data-parallel state only with FSDP2 (ZeRO-2/3) or replicates it with "
                "DDP (ZeRO-0); narrow the search with --zero 0,2,3")
    if layout.zero == 0 and layout.cp > 1:  # parallel_dims.fsdp_enabled = dp_shard_enabled or cp_enabled
        return "ZeRO-0 with CP — torchtitan shards with FSDP over its context-parallel ranks; use --zero 2,3"
    if fp32_without_fsdp(layout):  # distributed/utils.py maybe_enable_amp: no FSDP, so no mixed precision
        return ("TP or PP with neither data nor context parallelism — torchtitan applies mixed precision only through "
                "FSDP (data_parallel_shard_degree or context_parallel_degree > 1), so this file would train in FP32; "
                "give the plan data parallelism (more --gpus, or a smaller --tp / --pp)")
    if job.train.seq_len % (2 * layout.tp * layout.cp):  # parallelize.py asserts seq_len % parallel_dims.seq_len_divisor
        return (f"sequence length {job.train.seq_len} — torchtitan asserts it divides by tp x 2 x cp = "
                f"{2 * layout.tp * layout.cp} at startup; use a --seq-len that does")
    if layout.dp > 1 and layout.zero == 0 and (layout.tp > 1 or layout.pp > 1):
        return ("ZeRO-0 with TP or PP — torchtitan's DDP (data_parallel_replicate_degree) runs only without TP and PP; "
                "use FSDP (--zero 2,3)")
    if layout.tp > 1 and not layout.sequence_parallel:
        return "TP without sequence parallelism — torchtitan's tensor parallelism always shards the norms along the sequence"
    if layout.pp > 1 and layout.schedule not in SCHEDULE:
        return (f"schedule {layout.schedule} — torchtitan runs GPipe, 1F1B and Interleaved1F1B here (its zero-bubble "
                f"schedules need several stages per rank); narrow the search with --schedules gpipe,1f1b,interleaved-1f1b")
    if layout.recompute == "selective" and job.selective != "op":
        return ("selective recompute of the attention core — torchtitan's selective modes (per-op, every N-th layer) "
                "are not what this plan scored; plan with --framework torchtitan (its per-op mode), or narrow the "
                "search with --recompute none,full")
    counts = stage_counts(job, layout)
    chunk, n = max(counts), layout.recompute_layers
    if n is not None and n < chunk:
        k = every_kth(chunk, layout)
        # one counter per process runs over its chunks' blocks (_layer_sac_count): N in every chunk only where the
        # chunks are alike and, with several a rank, k divides them
        if len(set(counts)) > 1 or chunk // k != n or (layout.vpp > 1 and chunk % k):
            sizes = f"{chunk}" if len(set(counts)) == 1 else f"{min(counts)}-{chunk}"
            return (f"{n} layers recomputed in each of stages of {sizes} layers — torchtitan checkpoints every k-th "
                    f"block, counted over all of a rank's chunks")
    return None


def every_kth(chunk: int, layout) -> int:
    """selective_ac_option's k for --recompute-layers N of a `chunk`-layer stage: c // N (then c // k = N when any
    k gives N)."""
    return chunk // layout.recompute_layers


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a TOML basic string
    return "[" + ", ".join(_value(x) for x in v) + "]"


def toml(sections: dict[str, dict]) -> str:
    out = []
    for name, table in sections.items():
        out.append(f"[{name}]")
        out += [f"{key} = {_value(value)}" for key, value in table.items()]
        out.append("")
    return "\n".join(out)


def _split(job, layout) -> dict:
    """The planner's cut of the layers into pp*vpp stages (emit.stage_counts), in torchtitan's keys."""
    stages = layout.pp * layout.vpp
    counts = stage_counts(job, layout)
    keys = {"pipeline_parallel_first_stage_less_layers": 0, "pipeline_parallel_last_stage_less_layers": 0}
    if len(set(counts)) == 1:
        return keys | {"pipeline_parallel_layers_per_stage": counts[0]}
    parts, first = [], 0
    for k, n in enumerate(counts):
        parts.append((["tok_embeddings"] if k == 0 else []) + [f"layers.{i}" for i in range(first, first + n)]
                     + (["norm", "output"] if k == stages - 1 else []))
        first += n
    return keys | {"module_fqns_per_model_part": parts}


def sections(target) -> dict[str, dict]:
    job, lay = target.job, target.layout
    m = job.model
    named = flavor(m)
    par = {"data_parallel_replicate_degree": lay.dp if lay.zero == 0 else lay.replicas,
           "data_parallel_shard_degree": lay.dp // lay.replicas if lay.zero >= 2 else 1}
    if lay.zero >= 2:
        par["fsdp_reshard_after_forward"] = "never" if lay.zero == 2 else "always"
    par["tensor_parallel_degree"] = lay.tp
    if lay.tp > 1 and job.tp_comm_overlap:
        par["enable_async_tensor_parallel"] = True
    if lay.cp > 1:  # torch's ring rotates K/V shards with all-to-all; "allgather" gathers them
        par |= {"context_parallel_degree": lay.cp,
                "context_parallel_rotate_method": "alltoall" if lay.cp_mode == "ring" else "allgather"}
    par["pipeline_parallel_degree"] = lay.pp
    per_rank = job.train.global_batch // lay.dp
    if lay.pp > 1:
        par |= {"pipeline_parallel_schedule": SCHEDULE[lay.schedule], "pipeline_parallel_microbatch_size": lay.micro_batch}
        par |= _split(job, lay)
    out = {
        "job": {"dump_folder": "./outputs", "description": f"{m.name} {lay.describe()} (shardwise plan #{target.rank})"},
        "model": {"name": "llama3", "flavor": named or m.name},
        # With a pipeline the whole per-rank batch goes through it as micro-batches; without one, each
        # micro-batch is an accumulation step.
        "training": {"local_batch_size": per_rank if lay.pp > 1 else lay.micro_batch,
                     "global_batch_size": job.train.global_batch, "seq_len": job.train.seq_len,
                     "mixed_precision_param": "bfloat16", "mixed_precision_reduce": "float32"},
        "parallelism": par,
        "activation_checkpoint": _checkpointing(job, lay),
    }
    if job.offload:  # FSDP2's CPUOffloadPolicy: parameters, gradients and optimizer states on the host
        out["training"]["enable_cpu_offload"] = True
    if job.compile or (lay.tp > 1 and job.tp_comm_overlap):  # async TP takes effect under torch.compile only
        out["compile"] = {"enable": True, "components": ["model", "loss"] if job.compile_loss else ["model"]}
    if job.precision == "fp8":  # torchao's Float8Linear, tensor-wise, the LM head left in BF16 as the planner prices it
        out["model"]["converters"] = ["quantize.linear.float8"]
        # torchtitan asserts the float8 all-gather off under a recipe name; without one its config is tensor-wise
        out["quantize.linear.float8"] = ({"enable_fsdp_float8_all_gather": True,
                                          "precompute_float8_dynamic_scale_for_fsdp": True} if job.fp8_all_gather
                                         else {"recipe_name": "tensorwise"})
        out["quantize.linear.float8"]["filter_fqns"] = ["output"]
    return out


def _checkpointing(job, lay) -> dict:
    chunk = max(stage_counts(job, lay))
    if lay.recompute == "full" and lay.recompute_layers is not None and lay.recompute_layers < chunk:
        return {"mode": "selective", "selective_ac_option": str(every_kth(chunk, lay))}
    if lay.recompute == "selective":  # per-op, as the torchtitan profile priced it (problem() refuses the other kind)
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": "full" if lay.recompute == "full" else "none"}


def render(target) -> str:
    m = target.job.model
    head = ["# torchtitan job config written by `shardwise plan --emit torchtitan`."]
    head += [f"# {line}" for line in target.summary()]
    if flavor(m) is None:
        scaling = dict(m.rope_scaling)
        rope = (f", rope scaling {', '.join(f'{k}={v}' for k, v in sorted(scaling.items()))}" if scaling
                else ", no rope scaling")
        head.append(printable(
            f"# torchtitan has no flavor of {m.name}: register one named {m.name!r} in torchtitan/models/llama3 "
            f"with dim={m.hidden}, n_layers={m.num_layers}, n_heads={m.num_heads}, n_kv_heads={m.num_kv_heads}, "
            f"ffn hidden {m.ffn_hidden}, rope_theta={m.rope_theta:g}{rope}, "
            f"{'tied' if m.tie_embeddings else 'untied'} embeddings, vocab_size={m.vocab_size}."))
    head.append("# Run on every node: torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d "
                "--rdzv-endpoint HOST:29500 -m torchtitan.train --job.config_file THIS_FILE")
    return "\n".join(head) + "\n\n" + toml(sections(target))


def launch(target, path) -> str:
    return (f"torchrun --nnodes {target.nodes} --nproc-per-node {target.gpus_per_node} --rdzv-backend c10d "
            f"--rdzv-endpoint <node 0>:29500 -m torchtitan.train --job.config_file {path}")
