"""What torchtitan's whole-block activation checkpointing runs again, measured on torch itself, against what the
planner charges (Framework.recompute_early_stop): torch's non-reentrant checkpoint, as torchtitan wraps each block
(`checkpoint_wrapper(block, use_reentrant=False, preserve_rng_state=False)`), stops the recomputation once the last
tensor the backward needs is saved again, so a Llama block's last GEMM (FC2, whose input is saved before it runs)
does not run again. Counted in matmul and attention FLOPs (torch's FlopCounterMode), as the planner's recompute
FLOPs are; the attention through SDPA's math path, whose matmuls the counter sees on CPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from shardwise.planner.job import make_job
from shardwise.planner.step_time import stage_cost
from shardwise.specs import Layout, load_cluster, load_model

SEQ = 64


class _Block(nn.Module):
    """A torchtitan Llama TransformerBlock's shape (models/llama3/model.py): RMSNorm, grouped-query attention through
    SDPA, SwiGLU as w2(silu(w1 x) * w3 x), two residual adds."""

    def __init__(self, model):
        super().__init__()
        h, f, self.heads, self.kv = model.hidden, model.ffn_hidden, model.num_heads, model.num_kv_heads
        self.hd = h // self.heads
        self.wq, self.wo = nn.Linear(h, h, bias=False), nn.Linear(h, h, bias=False)
        self.wk, self.wv = nn.Linear(h, self.kv * self.hd, bias=False), nn.Linear(h, self.kv * self.hd, bias=False)
        self.w1, self.w3, self.w2 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False)
        self.attention_norm, self.ffn_norm = nn.RMSNorm(h), nn.RMSNorm(h)

    def forward(self, x):
        b, s, _ = x.shape
        y = self.attention_norm(x)
        q = self.wq(y).view(b, s, self.heads, self.hd).transpose(1, 2)
        k, v = (w(y).view(b, s, self.kv, self.hd).transpose(1, 2).repeat_interleave(self.heads // self.kv, 1)
                for w in (self.wk, self.wv))
        with sdpa_kernel(SDPBackend.MATH):  # on CPU the FLOP counter sees the math path's matmuls, not the fused kernel
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        h = x + self.wo(o)
        y = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(y)) * self.w3(y))


def _backward_flops(block, x) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    y = block(x)
    with FlopCounterMode(display=False) as counter:
        y.sum().backward()
    return counter.get_total_flops()


def test_torchtitan_full_recompute_charges_what_torch_runs_again():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.flop_counter import FlopCounterMode

    model = load_model("tiny")
    torch.manual_seed(0)
    block = _Block(model)
    x = torch.randn(1, SEQ, model.hidden, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        block(x)
    forward = counter.get_total_flops()
    plain = _backward_flops(block, x)
    # torchtitan's "full" AC: non-reentrant (the wrapper's default CheckpointImpl; torchtitan 1ea476e9f passed
    # use_reentrant=False, which torch 2.13's wrapper takes from checkpoint_impl), no RNG state
    wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
    again = _backward_flops(wrapped, x) - plain
    assert 0 < again < forward  # torch runs the forward again, but not all of it

    layout = Layout(dp=1, tp=1, pp=1, micro_batch=1, recompute="full")
    cluster = load_cluster("dgx-a100-80gb")
    titan = stage_cost(make_job(model, cluster, 1, SEQ, "torchtitan"), layout, 0)
    whole = stage_cost(make_job(model, cluster, 1, SEQ, "megatron-core"), layout, 0)  # Megatron re-runs it all
    assert whole.flops_recompute == pytest.approx(model.num_layers * forward)
    assert titan.flops_recompute == pytest.approx(model.num_layers * again)
    # and its seconds: less than the layers' forwards it used to repeat whole (Megatron's still do)
    assert titan.recompute < model.num_layers * titan.layer_f
    assert whole.recompute == pytest.approx(model.num_layers * whole.layer_f)


def test_shardwise_full_recompute_charges_what_its_own_model_runs_again():
    """This project's runtime checkpoints each block with torch's non-reentrant checkpoint too (shardwise.model
    Block): the FLOPs its backward runs again, counted on its own model, are the shardwise profile's recompute FLOPs
    (its w2 does not run again; the profile had charged the whole forward)."""
    from torch.utils.flop_counter import FlopCounterMode

    from shardwise.model import Transformer

    model = load_model("tiny")

    def backward_flops(recompute):
        net = Transformer(model, seed=0, recompute=recompute)
        x = torch.randint(0, model.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(0))
        with sdpa_kernel(SDPBackend.MATH):  # the attention's matmuls, for the counter
            loss = net(x, x)
            with FlopCounterMode(display=False) as counter:
                loss.backward()
        return counter.get_total_flops()

    again = backward_flops("full") - backward_flops("none")
    layout = Layout(dp=1, tp=1, pp=1, micro_batch=1, recompute="full")
    ours = stage_cost(make_job(model, load_cluster("dgx-a100-80gb"), 1, SEQ, "shardwise"), layout, 0)
    whole = stage_cost(make_job(model, load_cluster("dgx-a100-80gb"), 1, SEQ, "megatron-core"), layout, 0)
    assert ours.flops_recompute == pytest.approx(again) and again < whole.flops_recompute


@pytest.mark.parametrize("name", ["tiny", "tiny-moe"])
def test_shardwise_full_recompute_casts_again_the_weights_it_runs_again(name):
    """Under autocast (a GPU's precision; a CPU's autocast runs the same dtype flow) the recomputed forward is an
    autocast region of its own (torch.utils.checkpoint re-enters the forward's), whose weight cache starts empty:
    every linear it runs again casts its FP32 weight again. Counted on the runtime's own model, as the elements of the
    parameters cast to BF16 in backward; the shardwise profile charges those (FC2's too: early stop stops after
    its cast, a saved tensor; in MoE layers every local expert's, each a view sliced out of a stacked parameter,
    which autocast does not cache)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from shardwise.model import Transformer
    from shardwise.planner.step_time import recompute_cast_params

    model = load_model(name)

    class _Casts(TorchDispatchMode):
        def __init__(self, params):
            super().__init__()
            self.params, self.elements = params, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if (func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16
                    and args[0].untyped_storage().data_ptr() in self.params):  # a parameter, or a view of one
                self.elements += args[0].numel()
            return func(*args, **kwargs)

    def cast_in_backward(recompute):
        net = Transformer(model, seed=0, recompute=recompute)
        x = torch.randint(0, model.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(0))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = net(x, x)
        with _Casts({p.untyped_storage().data_ptr() for p in net.parameters()}) as casts:
            loss.backward()
        return casts.elements

    again = cast_in_backward("full") - cast_in_backward("none")
    assert again > 0
    job = make_job(model, load_cluster("dgx-a100-80gb"), 1, SEQ, "shardwise")
    layout = Layout(dp=1, tp=1, pp=1, micro_batch=1, recompute="full")
    assert model.num_layers * recompute_cast_params(job, layout) == pytest.approx(again)
    # Megatron's BF16 weights are not cast at all
    assert recompute_cast_params(make_job(model, load_cluster("dgx-a100-80gb"), 1, SEQ, "megatron-core"), layout) == 0
    # and the seconds are in the recompute
    costs = stage_cost(job, layout, 0)
    assert costs.recompute > stage_cost(job, layout.with_(recompute="none"), 0).recompute
