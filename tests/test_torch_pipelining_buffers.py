"""What torch.distributed.pipelining's PipelineStage holds beyond a stage's layers, measured on torch itself,
against what the planner charges the stacks that run it (planner/memory.py pipeline_buffer_bytes,
Framework.torch_stage_buffers): per model chunk, a receive buffer for the activation and one for the gradient for
every micro-batch of the schedule, kept all step, and each micro-batch's stage output from its forward to its
backward. Counted in tensors that cross stages (one micro-batch's stage input)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from ranks import measured_on_ranks

from shardwise.planner import memory
from shardwise.planner.job import make_job
from shardwise.planner.memory import local_seq, pipeline_buffer_bytes, rank_memory
from shardwise.specs import Layout, load_cluster, load_model

HIDDEN, SEQ, MICROBATCHES, RANKS = 16, 8, 4, 2
SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2))


def _held(rank, world):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    kinds = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe, "interleaved-1f1b": ScheduleInterleaved1F1B}
    boundary = SEQ * HIDDEN * 4  # one micro-batch of one sequence crossing a stage, fp32
    got = {}
    for name, v in SCHEDULES:
        torch.manual_seed(0)
        stages = [PipelineStage(nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN)),
                                c * world + rank, world * v, torch.device("cpu")) for c in range(v)]
        peak = {s.stage_index: [0, 0] for s in stages}  # outputs and received inputs in fwd_cache at once

        def watch(stage, forward):
            def counted(*a, **k):
                result = forward(*a, **k)
                held = stage.fwd_cache.values()
                outs = sum(t.nbytes for o, _ in held for t in o if isinstance(t, torch.Tensor))
                ins = sum(t.nbytes for _, i in held for t in i if isinstance(t, torch.Tensor) and t.requires_grad)
                p = peak[stage.stage_index]
                p[0], p[1] = max(p[0], outs), max(p[1], ins)
                return result
            return counted

        for s in stages:
            s.forward_one_chunk = watch(s, s.forward_one_chunk)
        schedule = (kinds[name](stages, MICROBATCHES, loss_fn=lambda y, t: y.sum()) if v > 1
                    else kinds[name](stages[0], MICROBATCHES, loss_fn=lambda y, t: y.sum()))
        x = torch.randn(MICROBATCHES, SEQ, HIDDEN)
        for _ in range(2):  # the first step also infers shapes and allocates the buffers
            if rank == 0:
                schedule.step(x, target=x)
            else:
                schedule.step(target=x, losses=[])
        held = 0
        for s in stages:
            for infos in (s.args_recv_info, s.grad_recv_info):
                storages = {id(i.buffer.untyped_storage()): i.buffer.untyped_storage().nbytes()
                            for per_mb in infos.values() for i in per_mb if getattr(i, "buffer", None) is not None}
                held += sum(storages.values())
            outs, ins = peak[s.stage_index]
            # the received inputs in flight are the first layer's inputs (the planner's activations); the last
            # stage's output is the logits (the planner's `logits`)
            held += (0 if s.is_last else outs) - ins
        got[name] = held / boundary
    return got


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return measured_on_ranks(_held, RANKS, tmp_path_factory.mktemp("buffers"))


def _job_layout(framework: str, schedule: str, vpp: int):
    job = make_job(load_model("llama3-8b"), load_cluster("dgx-h100-80gb"), MICROBATCHES, 4096, framework)
    layout = Layout(dp=1, tp=1, pp=RANKS, vpp=vpp, micro_batch=1, zero=0, schedule=schedule)
    return job, layout


@pytest.mark.parametrize("schedule,vpp", SCHEDULES)
def test_torchtitan_charges_what_torch_pipelining_stages_hold(measured, schedule, vpp):
    job, layout = _job_layout("torchtitan", schedule, vpp)
    boundary = local_seq(job, layout) * layout.micro_batch * job.model.hidden * job.train.activation_bytes
    for rank in range(RANKS):
        assert pipeline_buffer_bytes(job, layout, rank) / boundary == pytest.approx(measured[rank][schedule])


def test_the_buffers_are_in_the_memory_and_only_for_torch_pipelining(monkeypatch):
    job, layout = _job_layout("torchtitan", "interleaved-1f1b", 2)
    charged = [pipeline_buffer_bytes(job, layout, r) for r in range(RANKS)]
    assert min(charged) > 0
    with_buffers = [rank_memory(job, layout, r)["activations"] for r in range(RANKS)]
    monkeypatch.setattr(memory, "pipeline_buffer_bytes", lambda *a: 0.0)
    memory._rank_holdings.cache_clear()
    memory._rank_memory.cache_clear()
    try:
        without = [rank_memory(job, layout, r)["activations"] for r in range(RANKS)]
    finally:
        memory._rank_holdings.cache_clear()
        memory._rank_memory.cache_clear()
    assert [a - b for a, b in zip(with_buffers, without)] == pytest.approx(charged)
    # Megatron frees a stage's output once sent and receives into fresh buffers; Meta's Llama 3 stack deallocates
    # "the input and output tensors of each pipeline stage" (Sec. 3.3.2): neither runs torch's PipelineStage.
    for framework in ("megatron-core", "llama3"):
        job, layout = _job_layout(framework, "interleaved-1f1b", 2)
        assert pipeline_buffer_bytes(job, layout, 0) == pipeline_buffer_bytes(job, layout, 1) == 0.0
