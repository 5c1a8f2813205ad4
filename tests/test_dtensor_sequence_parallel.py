"""What a DTensor sequence-parallel plan (torchtitan's apply_tp) keeps for backward, measured on torch itself,
against what the planner charges the stacks that run it (Framework.dtensor_sp, SavedTensors.gathered_linear_inputs):
the column-parallel linears multiply the gathered input, and autograd keeps that whole sequence, once per group
(q/k/v, then gate/up), where Megatron keeps the shard and gathers it again in backward."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ranks import measured_on_ranks

from shardwise.planner.frameworks import get
from shardwise.planner.job import make_job
from shardwise.planner.memory import layer_activation_terms
from shardwise.specs import load_cluster, load_model

BATCH, SEQ, HIDDEN, FFN, RANKS = 3, 8, 16, 40, 2  # FFN / RANKS != HIDDEN: shapes tell the tensors apart


class Attention(nn.Module):
    """A Llama attention's linears (its core replaced by an element-wise product of q, k and v)."""

    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(4))

    def forward(self, x):
        return self.wo(torch.tanh(self.wq(x)) * self.wk(x) + self.wv(x))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3, self.w2 = nn.Linear(HIDDEN, FFN, bias=False), nn.Linear(HIDDEN, FFN, bias=False), nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """A Llama block's norms and linears under torchtitan's module names."""

    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(HIDDEN), nn.RMSNorm(HIDDEN)
        self.attention, self.feed_forward = Attention(), FeedForward()

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


def _plan():
    """torchtitan's per-block plan (torchtitan parallelize_llama apply_tp), on this block's module names."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    plan = {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()}
    for name, cols, row in (("attention", ("wq", "wk", "wv"), "wo"), ("feed_forward", ("w1", "w3"), "w2")):
        plan[name] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan.update({f"{name}.{c}": ColwiseParallel() for c in cols})
        plan[f"{name}.{row}"] = RowwiseParallel(output_layouts=Shard(1))
    return plan


def _kept(rank, world):
    """How many tensors autograd keeps of the gathered input's shape, and of the sequence shard's, on this rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    block = parallelize_module(Block(), init_device_mesh("cpu", (world,)), _plan())
    kept = {}

    def pack(t):
        local = t.to_local() if isinstance(t, DTensor) else t
        kept[local.untyped_storage().data_ptr()] = tuple(local.shape)  # one entry per storage, however many ops keep it
        return t

    x = torch.randn(BATCH, SEQ // world, HIDDEN, requires_grad=True)  # the block's input: this rank's sequence shard
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = block(x)
    y.sum().backward()
    return {"gathered": sum(shape in ((BATCH, SEQ, HIDDEN), (BATCH * SEQ, HIDDEN)) for shape in kept.values()),
            "shard": sum(shape == (BATCH, SEQ // world, HIDDEN) for shape in kept.values())}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return measured_on_ranks(_kept, RANKS, tmp_path_factory.mktemp("dtensor"))


def test_a_dtensor_plan_keeps_each_groups_gathered_input(measured):
    for counts in measured:  # every rank: the q/k/v input and the gate/up input, whole, each kept once
        assert counts["gathered"] == 2 and counts["shard"] >= 2  # beside the norms' sharded inputs


def test_the_planner_keeps_what_torch_keeps(measured):
    # torchtitan's layer keeps the measured gathered inputs where Megatron's order keeps their shards: the same model,
    # the same saved-tensor settings otherwise, differ by the gathered inputs less their shards.
    model, tp, s, b, e = load_model("llama3-8b"), RANKS, 4096, 2, 2
    saved = make_job(model, load_cluster("dgx-h100-80gb"), 8, s, "torchtitan").saved
    assert get("torchtitan").dtensor_sp and saved.gathered_linear_inputs
    whole, _ = layer_activation_terms(model, s, b, tp, True, e, saved)
    shard, _ = layer_activation_terms(model, s, b, tp, True, e, dataclasses.replace(saved, gathered_linear_inputs=False))
    assert whole - shard == pytest.approx(measured[0]["gathered"] * s * b * model.hidden * e * (1 - 1 / tp))
    # without sequence parallelism every TP rank keeps the whole input either way
    assert (layer_activation_terms(model, s, b, tp, False, e, saved)
            == layer_activation_terms(model, s, b, tp, False, e, dataclasses.replace(saved, gathered_linear_inputs=False)))
    assert not make_job(model, load_cluster("dgx-h100-80gb"), 8, s, "megatron-core").saved.gathered_linear_inputs
