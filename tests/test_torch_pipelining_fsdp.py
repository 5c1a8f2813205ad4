"""How torch.distributed.pipelining runs FSDP2, measured on torch itself, and the torchtitan profile that
relies on it (planner/frameworks.py `pipeline_fsdp_once`): under a pipeline schedule the units gather once
and reduce-scatter once per step, whatever the number of micro-batches; without one, FSDP2 gathers and
reduce-scatters in every micro-batch."""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from shardwise.launch import spawn_ranks
from shardwise.planner.memory import make_job, memory_breakdown
from shardwise.planner.step_time import step_time
from shardwise.specs import Layout, load_cluster, load_model

MICROBATCHES = 4
UNITS = 2  # FSDP units holding parameters (the root holds none)
CALLS = ("reduce_scatter_single", "all_gather_single")  # what FSDP2's collectives call (_fsdp_collectives.py)


def _worker(rank, world, out):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    counts = dict.fromkeys(CALLS, 0)
    for name in CALLS:
        def counted(*a, _real=getattr(dist, name), _name=name, **k):
            counts[_name] += 1
            return _real(*a, **k)
        setattr(dist, name, counted)
    one_stage = [dist.new_group([r]) for r in range(world)]  # each rank its own one-stage pipeline
    torch.manual_seed(0)
    x, got = torch.randn(2 * MICROBATCHES, 16), {}
    for mode in ("pipelining", "plain"):
        model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
        for layer in model:
            fully_shard(layer, reshard_after_forward=False)  # ZeRO-2, as torchtitan shards under a pipeline
        fully_shard(model, reshard_after_forward=False)
        if mode == "pipelining":
            stage = PipelineStage(model, 0, 1, torch.device("cpu"), group=one_stage[rank])
            schedule = ScheduleGPipe(stage, MICROBATCHES, loss_fn=lambda y, t: y.sum())
            schedule.step(x, target=x)  # the first step also infers shapes
            counts.update(dict.fromkeys(CALLS, 0))
            schedule.step(x, target=x)
        else:
            for chunk in x.chunk(MICROBATCHES):
                model(chunk).sum().backward()
        got[mode] = dict(counts)
        counts.update(dict.fromkeys(CALLS, 0))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(got, f)


def test_pipelining_gathers_and_reduces_fsdp_units_once_per_step(tmp_path):
    out = tmp_path / "counts.json"
    spawn_ranks(_worker, 2, str(out), timeout_s=120)
    got = json.loads(out.read_text())
    assert got["pipelining"] == {"reduce_scatter_single": UNITS, "all_gather_single": UNITS}
    assert got["plain"] == {"reduce_scatter_single": UNITS * MICROBATCHES, "all_gather_single": UNITS * MICROBATCHES}


def _dp_comm(framework: str, microbatches: int) -> float:
    job = make_job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), 4 * microbatches, 2048, framework)
    layout = Layout(dp=4, tp=8, pp=2, micro_batch=1, zero=2, sequence_parallel=True)
    return step_time(job, layout)["dp_comm"]


def test_torchtitan_pipelines_reduce_once_and_the_shardwise_runtime_every_microbatch():
    # torchtitan under a pipeline: one reduce-scatter per unit per step, so 16x the micro-batches costs the same;
    # shardwise's own runtime (FSDP2 without pipelining's no-sync) reduce-scatters in every micro-batch.
    titan = _dp_comm("torchtitan", 8), _dp_comm("torchtitan", 128)
    assert titan[1] == titan[0] > 0
    ours = _dp_comm("shardwise", 8), _dp_comm("shardwise", 128)
    assert ours[1] > 8 * ours[0]


def test_torchtitan_pipelines_hold_unsharded_fp32_gradients():
    # With gradient sync off, FSDP2 accumulates each unit's unsharded gradient in the reduce dtype (FP32).
    job = make_job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), 64, 2048, "torchtitan")
    piped = memory_breakdown(job, Layout(dp=4, tp=8, pp=2, micro_batch=1, zero=2, sequence_parallel=True))[1]
    flat = memory_breakdown(job, Layout(dp=8, tp=8, pp=1, micro_batch=1, zero=2, sequence_parallel=True))[1]
    params = job.model.num_params()
    assert piped["gradients"] == pytest.approx(4 * params / (8 * 2), rel=0.1)  # tp 8 x pp 2, about evenly split
    assert flat["gradients"] == pytest.approx(4 * params / (8 * 8), rel=0.01)  # sharded over dp 8
