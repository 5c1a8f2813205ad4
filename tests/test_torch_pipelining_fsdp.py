"""How torch.distributed.pipelining runs FSDP2, measured on torch itself, and the torchtitan profile that
relies on it (planner/framework.py `pipeline_fsdp_once`): under a pipeline schedule the units gather once
and reduce-scatter once per step, whatever the number of micro-batches; without one, FSDP2 gathers and
reduce-scatters in every micro-batch."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from shardwise.launch import spawn_ranks
from shardwise.planner.job import make_job
from shardwise.planner.memory import memory_breakdown, model_state_bytes, rank_layers, rank_params
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
    got["held"], got["params"] = _held_by_dtype()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(got, f)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp") / "counts.json"
    spawn_ranks(_worker, 2, str(out), timeout_s=120)
    return json.loads(out.read_text())


def test_pipelining_gathers_and_reduces_fsdp_units_once_per_step(measured):
    got = measured
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


def _held_by_dtype():
    """What FSDP2 holds per parameter between a forward and its backward when it does not reshard (ZeRO-2), under
    torchtitan's MixedPrecisionPolicy: bytes of every distinct storage its FSDPParams reference, by dtype."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.Linear(64, 64, bias=False))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mp_policy=policy, reshard_after_forward=False)
    fully_shard(model, mp_policy=policy, reshard_after_forward=False)
    model(torch.randn(4, 64))  # gathered, not resharded: the ZeRO-2 state
    seen, held = set(), {}

    def walk(obj):
        if isinstance(obj, (list, tuple)):
            for o in obj:
                walk(o)
        elif isinstance(obj, torch.Tensor) and obj.device.type != "meta":
            walk(getattr(obj, "_local_tensor", None))  # a DTensor's shard
            try:
                storage = obj.untyped_storage()
                ptr, size = storage.data_ptr(), storage.nbytes()
            except RuntimeError:  # a freed or fake storage
                return
            if ptr and size and ptr not in seen:
                seen.add(ptr)
                held[str(obj.dtype)] = held.get(str(obj.dtype), 0) + size

    for layer in model:
        for param in fully_shard.state(layer)._fsdp_param_group.fsdp_params:
            for value in vars(param).values():
                walk(value)
    return held, sum(p.numel() for p in model.parameters())


def test_fsdp2_keeps_no_bf16_shard_beside_the_gathered_weights(measured):
    # FSDP2 keeps the FP32 shard (the optimizer's master) and the gathered BF16 weights, nothing else: the planner's
    # torchtitan weights under ZeRO-2 are the gathered BF16 copy alone, the FP32 shard being in its optimizer's 12 B.
    got = measured
    params = got["params"]  # FSDP's parameters are DTensors: numel() is the whole parameter's
    assert got["held"] == {"torch.float32": 4 * params // 2, "torch.bfloat16": 2 * params}
    job = make_job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), 64, 2048, "torchtitan")
    for zero in (2, 3):
        layout = Layout(dp=8, tp=8, pp=1, micro_batch=1, zero=zero, sequence_parallel=True)
        rank, mem = memory_breakdown(job, layout)
        states = model_state_bytes(job, layout, rank_params(job, layout, rank), rank_layers(job, layout, rank))
        gathered = states["weights"] / job.train.weight_bytes
        if zero == 2:
            assert gathered == pytest.approx(rank_params(job, layout, rank))  # the whole rank's weights, no shard
        else:  # two layers and the root, no shard of the rest
            assert gathered < rank_params(job, layout, rank) / 8
        assert mem["weights"] == pytest.approx(states["weights"])


def test_torchtitan_pipelines_hold_the_experts_gradients_unsharded_too():
    # The pipeline turns every FSDP unit's sync off, the experts' units too (helper-226): their FP32 gradients are held
    # whole, so a GPU's gradients do not shrink as more data-parallel replicas join; without a pipeline they do.
    def gradients(gpus: int, pp: int) -> float:
        job = make_job(load_model("mixtral-8x7b"), load_cluster("dgx-a100-80gb"), 4 * gpus, 4096, "torchtitan")
        layout = Layout(dp=gpus // pp, tp=1, pp=pp, ep=2, micro_batch=1, zero=2)
        return memory_breakdown(job, layout)[1]["gradients"]

    assert gradients(128, 4) == pytest.approx(gradients(64, 4), rel=1e-9)
    assert gradients(64, 1) < 0.6 * gradients(32, 1)
    expert_params = 8 * 3 * 4096 * 14336 * 32 / 2 / 4  # 8 experts of 3 matrices, 32 layers over pp 4, ep 2
    assert gradients(128, 4) > 4 * expert_params * 0.5  # FP32, at least the half created by the activations' peak
    # they stay on the GPU under --offload params as the dense ones do (helper-231: the experts' went to 0), and a GPU
    # holding half the experts holds less, their units on one replica (ep = dp) or more
    job = make_job(load_model("mixtral-8x7b"), load_cluster("dgx-a100-80gb"), 256, 4096, "torchtitan")
    lay = Layout(dp=16, tp=1, pp=4, ep=2, micro_batch=1, zero=2, recompute="full")
    held = memory_breakdown(job, lay)[1]["gradients"]
    assert memory_breakdown(replace(job, offload="params"), lay)[1]["gradients"] == pytest.approx(held, rel=1e-9)
    halves = [memory_breakdown(job, lay.with_(ep=ep))[1]["gradients"] for ep in (8, 16)]
    assert halves[1] < halves[0] < held
