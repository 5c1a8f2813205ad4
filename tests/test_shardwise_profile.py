"""The `shardwise` profile states what this project's runtime does (the contract: "exactly what this project's runtime
does"). Each case reads the behaviour off the runtime, on gloo ranks, and checks the planner prices that, not another
stack's: a pipeline's data-parallel reduction after the schedule, split experts' after the backward, whole experts'
gradients summed over tp."""

from __future__ import annotations

import json
import os

from torch.nn.parallel import DistributedDataParallel

from shardwise.launch import spawn_ranks
from shardwise.planner.job import make_job
from shardwise.planner.overlap import grad_reduce_behind
from shardwise.planner import estimate
from shardwise.planner.step_time import whole_experts_time
from shardwise.specs import Layout, load_cluster, load_model


def _runtime_facts(rank, world, out_dir):
    from shardwise.parallel import build_mesh
    from shardwise.train import TrainConfig, build_runtime

    facts = {}
    for name, model, lay in (("pp2-dp2", "tiny", Layout(dp=2, pp=2, micro_batch=2)),
                             ("tp2-ep1", "tiny-moe", Layout(dp=2, tp=2, micro_batch=2)),
                             ("dp4-ep2", "tiny-moe", Layout(dp=4, ep=2, micro_batch=1)),
                             ("dp4-zero3", "tiny", Layout(dp=4, zero=3, micro_batch=1)),
                             ("pp2-tp2", "tiny", Layout(pp=2, tp=2, micro_batch=2))):
        if lay.world_size != world:
            continue
        cfg = TrainConfig(load_model(model), lay, steps=1, global_batch=8, seq_len=16, progress=False)
        rt = build_runtime(cfg, build_mesh(lay.pp, lay.dp, lay.tp, backend="gloo", timeout_s=60))
        executor = getattr(rt.forward_backward, "executor", None)
        facts[name] = {"sent": [list(executor.activation_shape), str(executor.dtype)] if executor else None,
                       "ddp": any(isinstance(c.module, DistributedDataParallel) for c in rt.chunks),
                       "tp_summed_experts": [n for c in rt.chunks for n in c.sp_partial_grads if ".experts." in n],
                       "split_experts": any(c.experts is not None for c in rt.chunks),
                       "fsdp2": any(type(m).__name__.startswith("FSDP") for c in rt.chunks for m in c.module.modules())}
    if rank == 0:
        with open(os.path.join(out_dir, f"facts-{world}.json"), "w") as f:
            json.dump(facts, f)


def test_the_profile_reduces_where_the_runtime_does(tmp_path):
    spawn_ranks(_runtime_facts, 4, str(tmp_path), timeout_s=120)
    facts = json.loads((tmp_path / "facts-4.json").read_text())
    h100 = load_cluster("dgx-h100-80gb")
    dense, moe = load_model("llama3-8b"), load_model("mixtral-8x7b")

    # A pipeline's chunks are not DDP modules: no hook reduces behind their backward; PipelineStep all-reduces after
    # the schedule. The profile says so (megatron-core's overlaps it).
    assert not facts["pp2-dp2"]["ddp"]
    pp = Layout(dp=2, pp=2, micro_batch=1, zero=1)
    assert grad_reduce_behind(make_job(dense, h100, 64, 4096, "shardwise"), pp) is False
    assert grad_reduce_behind(make_job(dense, h100, 64, 4096, "shardwise"), pp.with_(pp=1, dp=4)) is True
    assert grad_reduce_behind(make_job(dense, h100, 64, 4096, "megatron-core"), pp) is True

    # Whole experts under tp (ep = etp = 1): their gradients are in the list summed over tp once a step; priced.
    assert facts["tp2-ep1"]["tp_summed_experts"] and not facts["tp2-ep1"]["split_experts"]
    job = make_job(moe, h100, 256, 4096, "shardwise")
    whole = Layout(dp=16, tp=2, pp=2, micro_batch=1, zero=1)
    assert whole_experts_time(job, whole) > 0 and whole_experts_time(job, whole.with_(ep=2)) == 0
    assert whole_experts_time(make_job(moe, h100, 256, 4096, "megatron-core"), whole) == 0
    assert estimate(job, whole).time_s["step_comm"] > estimate(job, whole.with_(ep=2)).time_s["step_comm"]

    # ZeRO-3 is FSDP2's fully_shard: its copies into and out of the collectives' buffers are priced on a datasheet
    # cluster (a calibration measured them with the calls).
    from shardwise.planner.frameworks import get
    from shardwise.planner.overlap import fsdp_copy_time

    assert facts["dp4-zero3"]["fsdp2"] and get("shardwise").torch_fsdp == 2
    assert fsdp_copy_time(make_job(dense, h100, 64, 4096, "shardwise"), get("shardwise"), 1e9, 1e9, 1e9, 8) > 0

    # A stage sends the next its whole FP32 activation from every TP rank without SP (no scatter-gather): the pipeline
    # term's transfer is that message (hidden 64 of tiny, micro-batch 2 x 16 tokens).
    from shardwise.planner.step_time import pipeline_costs

    assert facts["pp2-tp2"]["sent"] == [[2, 16, load_model("tiny").hidden], "torch.float32"]
    lay = Layout(pp=2, tp=2, dp=2, micro_batch=1)
    ours = pipeline_costs(make_job(dense, h100, 64, 4096, "shardwise"), lay)[1]
    split = pipeline_costs(make_job(dense, h100, 64, 4096, "megatron-core"), lay)[1]  # 1/tp, in BF16
    assert ours > 2 * split

    # Split experts: reduced over their replicas by sync_expert_grads after the backward, not by DDP's hooks.
    assert facts["dp4-ep2"]["split_experts"] and not facts["dp4-ep2"]["tp_summed_experts"]
    split = Layout(dp=32, pp=1, ep=8, micro_batch=1, zero=1)
    assert grad_reduce_behind(job, split, experts=True) is False and grad_reduce_behind(job, split) is True
