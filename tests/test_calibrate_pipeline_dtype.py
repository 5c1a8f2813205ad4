"""calibrate times a pipeline's calls on the bytes the pipeline executor moves: its exchanges, send/recv and a middle
stage's input and output gradient are in the executor's dtype (fp32: the residual stream), also where the layers run
in BF16 (a GPU); tensor parallelism's all-reduce keeps the layers' dtype. The GPU's dtype flow is the CPU's under
--dtype bfloat16 (shardwise.precision), so no GPU is needed; the collectives are recorded, not run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from shardwise.calibrate import comm, compute
from shardwise.parallel.pipeline import BatchP2P, PipelineExecutor
from shardwise.specs import load_model


def _timer(dtype: str, rank: int = 0):
    from shardwise import precision

    cfg = SimpleNamespace(model=load_model("tiny"), micro_batch=1, seq_len=16, dtype=dtype, repeats=1)
    return SimpleNamespace(cfg=cfg,
                           device=torch.device("cpu"), dtype=precision.compute_dtype("cpu", dtype), rank=rank, world=2)


@pytest.fixture
def recorded(monkeypatch):
    """(call, dtype) of every send, receive, all-reduce, exchange and backward the workloads issue."""
    calls = []
    backward = torch.autograd.backward
    monkeypatch.setattr(dist, "send", lambda t, peer: calls.append(("send", t.dtype)))
    monkeypatch.setattr(dist, "recv", lambda t, peer: calls.append(("recv", t.dtype)))
    monkeypatch.setattr(dist, "all_reduce", lambda t, **kw: calls.append(("all_reduce", t.dtype)))
    monkeypatch.setattr(BatchP2P, "post", lambda self, sends, recvs, group: calls.extend(
        [("exchange send", t.dtype) for t, _, _ in sends] + [("exchange recv", t.dtype) for t, _, _ in recvs]) or [])

    def recorded_backward(tensors, grad_tensors=None, *args, **kw):
        calls.append(("backward", tensors.dtype, grad_tensors.dtype))
        return backward(tensors, grad_tensors, *args, **kw)
    monkeypatch.setattr(torch.autograd, "backward", recorded_backward)
    return calls


def test_the_dtype_is_the_executors():
    assert compute.pipeline_dtype() is PipelineExecutor.dtype is torch.float32


@pytest.mark.parametrize("rank", [0, 1])
def test_under_bf16_the_pipelines_calls_move_the_executors_dtype(recorded, rank):
    loops, act = comm.call_workloads(_timer("bfloat16", rank))
    assert act.dtype == torch.bfloat16  # the all-reduce's message (measure_sync's sync_bytes): the layers' dtype
    for name in ("alone", "p2p alone", "exchange", "stage"):
        loops[name]()
    f32 = torch.float32
    assert recorded == [("all_reduce", torch.bfloat16), ("send" if rank == 0 else "recv", f32),
                        ("exchange send", f32), ("exchange recv", f32), ("backward", f32, f32)]


def test_on_fp32_one_tensor_as_before(recorded):
    loops, act = comm.call_workloads(_timer(""))
    for name in ("alone", "p2p alone", "exchange", "stage"):
        loops[name]()
    assert {c[1] for c in recorded} == {torch.float32}


def test_the_split_backward_chunk_takes_the_executors_dtype(recorded, monkeypatch):
    def once(t, fns, repeats, label, **kw):  # each workload once, no timing
        for fn in fns.values():
            fn()
        yield label
        return {name: [1.0] for name in fns}
    monkeypatch.setattr(compute, "in_rounds", once)
    out = {}
    for _ in compute.measure_split_backward(_timer("bfloat16"), out):
        pass
    if out["split_points"]:  # this torch has the split backward
        assert recorded[0] == ("backward", torch.float32, torch.float32)
