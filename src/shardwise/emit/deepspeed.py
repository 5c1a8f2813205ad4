"""DeepSpeed: its JSON config (read by `deepspeed.runtime.config.DeepSpeedConfig`, `--deepspeed_config`).

Keys and meanings are DeepSpeed's `deepspeed/runtime/config.py`, `runtime/zero/config.py`,
`runtime/tensor_parallel/config.py` and `runtime/pipe/engine.py` (docs/emit.md gives the version;
tests/test_emit.py builds DeepSpeedConfig from what is written here):
  train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size
      (DeepSpeed checks this); with a pipeline the accumulation steps are the pipeline's micro-batches. Left out
      under AutoTP: deepspeed.initialize reads the config before the engine builds AutoTP's groups, so without an
      mpu from the script it counts every rank as data-parallel (runtime/config.py world_size) and would refuse the
      batch; DeepSpeed's AutoTP tests leave it out too.
  zero_optimization.stage 0-3 (with --offload, offload_optimizer and offload_param {device: cpu}); bf16; data_types.grad_accum_dtype "fp32" when the planner scored 4-byte
      gradients (DeepSpeed's default, and the deepspeed profile's, is the model's bf16; fp32 needs ZeRO >= 1).
  tensor_parallel.autotp_size: AutoTP training (no sequence parallelism, no pipeline).
  pipeline.stages / partition / activation_checkpoint_interval: the engine reads the last one; the
      stages are the `PipelineModule(num_stages=..., partition_method=...)` the training script builds.
      DeepSpeed cuts the layers itself: "parameters" balances parameters, which, like shardwise's
      cost-balanced split, takes layers off the stages that hold the embedding and the LM head. More stages than
      layers (up to the layers + 2) run with "type:transformer|embedding", which counts the embedding specs as
      layers and gives each a stage of its own, as BLOOM ran 70 layers on 72 stages (bigscience tr11
      --pp-partition-method; the script's layer classes named so, as Megatron-DeepSpeed's are).
      DeepSpeed's pipeline runs 1F1B (its TrainSchedule) and refuses ZeRO-2/3.
  activation_checkpointing: present when every layer is recomputed (the model calls
      deepspeed.checkpointing.checkpoint per layer, as Megatron-DeepSpeed does).
Selective (attention-core) recompute is model code, not a DeepSpeed key: not expressible.
"""

from __future__ import annotations

import json

from shardwise.planner.frameworks import get as get_framework


def model_problem(job) -> str | None:
    """None: DeepSpeed's config holds no model (the training script builds it)."""
    return None


def problem(job, layout) -> str | None:
    if job.precision == "fp8":
        return ("FP8 — DeepSpeed's config has no FP8 switch (Transformer Engine's layers in the model code train in FP8); "
                "this emitter writes BF16 jobs: plan with --precision bf16")
    if layout.ep > 1 or layout.etp > 1:
        return ("expert parallelism — DeepSpeed sets it in model code (deepspeed.moe.layer.MoE(ep_size=...)), not in "
                "its config; use --ep 1")
    if layout.cp > 1:
        return ("context parallelism — DeepSpeed's sequence parallelism is Ulysses (all-to-all over heads), not "
                "ring or all-gather attention")
    if layout.replicas > 1:
        return (f"hybrid sharding (ZeRO over shard groups of {layout.dp_shard}, replicated across them) — DeepSpeed's "
                "hybrid ZeRO (MiCS) is gone from its releases, and its config shards over every data-parallel rank")
    # the split itself first: what narrowing the schedule, ZeRO or SP cannot fix
    if layout.tp > 1 and layout.pp > 1:
        return ("TP with a pipeline — DeepSpeed's pipeline takes its TP groups from Megatron-DeepSpeed's topology, "
                "not from AutoTP; use --tp 1 or --pp 1")
    if layout.pp > 1 and layout.schedule != "1f1b":
        return (f"schedule {layout.schedule} — DeepSpeed's pipeline engine runs 1F1B only; narrow the search with "
                f"--schedules 1f1b")
    if layout.pp > 1 and layout.zero >= 2:
        return f"ZeRO-{layout.zero} with a pipeline — DeepSpeed's pipeline engine refuses ZeRO-2/3; use --zero 0,1"
    if layout.tp > 1 and layout.sequence_parallel:
        return ("sequence parallelism — DeepSpeed's AutoTP (tensor_parallel.autotp_size) splits the layers but not "
                "the sequence")
    if layout.recompute == "selective":
        return ("selective recompute — it is model code (Megatron-DeepSpeed), not a DeepSpeed config key; "
                "narrow the search with --recompute none,full")
    if layout.recompute_layers is not None:
        return ("full recompute of only some layers — DeepSpeed's activation_checkpoint_interval recomputes every "
                "layer (in groups); use --framework deepspeed, which plans every layer or none")
    if layout.pp > 1 and layout.zero == 0:  # engine.py _do_optimizer_sanity_check: BFLOAT16 -> BF16_Optimizer
        return ("ZeRO-0 with a pipeline — DeepSpeed runs a bf16 pipeline at stage 0 with its BF16_Optimizer, which "
                "shards the FP32 master weights and Adam states over the data-parallel ranks as ZeRO-1 does; use "
                "--zero 1")
    if layout.zero == 0 and job.train.grad_bytes == 4:
        return ("ZeRO-0 with fp32 gradients — DeepSpeed accumulates a bf16 model's gradients in fp32 only under ZeRO "
                "(data_types.grad_accum_dtype); score with --framework deepspeed (bf16 gradients) or use ZeRO >= 1")
    return None


def config(target) -> dict:
    job, lay = target.job, target.layout
    m = lay.num_microbatches(job.train.global_batch)
    zero = {"stage": lay.zero}
    if job.offload:  # DeepSpeed offloads only from its ZeRO optimizer's stage up, over one rank too (single-GPU
        # ZeRO-Offload); below it (ZeRO-0, which a one-rank layout is priced as) it would build no ZeRO optimizer
        fw = get_framework(job.framework)
        zero["stage"] = max(lay.zero, fw.offload_params_zero if job.offload == "params" else fw.offload_zero)
    if lay.zero >= 1:  # the pipeline engine turns overlap_comm off ("Pipeline parallelism does not support
        # overlapped communication", engine.py _configure_zero_optimizer): the file says what runs
        zero |= {"overlap_comm": lay.pp == 1, "contiguous_gradients": True, "reduce_scatter": True}
    if job.offload:  # ZeRO-Offload / ZeRO-3's offload_param, as the plan priced them (planner/offload.py)
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if job.offload == "params":
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    out = {
        "train_batch_size": job.train.global_batch,
        "train_micro_batch_size_per_gpu": lay.micro_batch,
        "gradient_accumulation_steps": m,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "gradient_clipping": 1.0,
    }
    if job.train.grad_bytes == 4:  # the planner scored fp32 gradients; DeepSpeed's default is the model's bf16
        out["data_types"] = {"grad_accum_dtype": "fp32"}
    if lay.tp > 1:
        out["tensor_parallel"] = {"autotp_size": lay.tp}
        del out["train_batch_size"]  # counted over every rank without an mpu (module docstring)
    if lay.pp > 1:
        out["pipeline"] = {"stages": lay.pp, "partition": partition_method(job, lay),
                           "activation_checkpoint_interval": 1 if lay.recompute == "full" else 0}
    if lay.recompute == "full":
        out["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    return out


def partition_method(job, layout) -> str:
    """PipelineModule's partition_method for this layout (module docstring): by parameters, or, with more stages than
    layers, by layer type with the embeddings counted as layers."""
    return "type:transformer|embedding" if layout.pp * layout.vpp > job.model.num_layers else "parameters"


def render(target) -> str:
    return json.dumps(config(target), indent=2) + "\n"


def launch(target, path) -> str:
    lay = target.layout
    model = (f" (the script builds deepspeed.pipe.PipelineModule(layers, num_stages={lay.pp}, "
             f"partition_method='{partition_method(target.job, lay)}'))" if lay.pp > 1 else "")
    batch = (f" (AutoTP: the global batch is {lay.micro_batch} x {lay.num_microbatches(target.job.train.global_batch)} "
             f"x {lay.dp} data-parallel ranks = {target.job.train.global_batch}; the file leaves train_batch_size out, "
             f"which DeepSpeed counts over all {target.gpus} ranks unless the script passes an mpu)" if lay.tp > 1 else "")
    return (f"deepspeed --num_nodes {target.nodes} --num_gpus {target.gpus_per_node} --hostfile HOSTFILE "
            f"your_train.py --deepspeed --deepspeed_config {path}{model}{batch}")
