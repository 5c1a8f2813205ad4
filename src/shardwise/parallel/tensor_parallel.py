"""Megatron-style tensor parallelism, applied to a plain Transformer by slicing its weights in place.

Per block (Shoeybi et al. 2019):
  attention:    f -> wq, wk, wv column-parallel (heads and KV heads split over tp) -> attention on the
                local heads -> wo row-parallel -> g
  feed-forward: f -> w1 (and w3) column-parallel -> w2 row-parallel -> g
  f: identity forward, all-reduce backward; g: all-reduce forward, identity backward (conjugates).
  One f per block, not per linear: the projections of one input are one `project` call of the model
  (`ColumnParallel`), like Megatron's fused QKV and gate/up linears.

Sequence parallelism (Korthikanti et al. 2022): between blocks the activations are split along the
sequence; f becomes all-gather (backward: reduce-scatter) and g becomes reduce-scatter (backward:
all-gather), so norms run on 1/tp of the tokens. Their weights (and the row-parallel biases) then
see only part of the tokens, so their gradients are summed over tp once per step
(`sync_sequence_parallel_grads`). The column-parallel linears keep only the sequence shard of their
input for backward and all-gather it again there for the weight gradients (`_GatherLinears`, as
Megatron's LinearWithGradAccumulationAndAsyncCommunication with sequence_parallel): the saved input
is s*b*h/tp, as the paper counts it, at the price of one more all-gather per group in backward.

Vocabulary: the embedding and the LM head are split by vocabulary rows; the loss is computed on the
vocabulary shards (`VocabParallelCrossEntropy`), so no rank ever holds the full logits. A vocabulary
that tp does not divide is padded with zero rows as Megatron does, and the padded logits are masked to
-inf, so every layout computes exactly the unpadded model.

Plain tensors and torch.distributed collectives inside autograd Functions (no DTensor): for small
per-rank work DTensor's dispatch overhead dominates the step (see benchmarks/runtime_vs_torch.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from shardwise.parallel.sharded import Sharded

# --------------------------------------------------------------------------- collectives

# torch 2.13 renamed the tensor-in/tensor-out collectives; keep working on older releases too.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _identity(x, group):
    return x


def _all_reduce(x, group):
    x = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(x, group=group)
    return x


def _gather_seq(x, group):
    """(batch, s, ...) on each rank -> (batch, s * tp, ...), ranks in order along the sequence."""
    xs = x.transpose(0, 1).contiguous()
    out = xs.new_empty((dist.get_world_size(group) * xs.shape[0],) + xs.shape[1:])
    _all_gather_single(out, xs, group=group)
    return out.transpose(0, 1).contiguous()


def _reduce_scatter_seq(x, group):
    """(batch, S, ...) partial sums -> this rank's (batch, S / tp, ...) slice of the sum."""
    xs = x.transpose(0, 1).contiguous()
    out = xs.new_empty((xs.shape[0] // dist.get_world_size(group),) + xs.shape[1:])
    _reduce_scatter_single(out, xs, group=group)
    return out.transpose(0, 1).contiguous()


def _split_seq(x, group):
    return x.chunk(dist.get_world_size(group), dim=1)[dist.get_rank(group)].contiguous()


# Conjugate pairs (forward op, backward op): the backward of each is the adjoint of its forward.
COPY = (_identity, _all_reduce)  # Megatron's f
REDUCE = (_all_reduce, _identity)  # Megatron's g
REDUCE_SCATTER_SEQ = (_reduce_scatter_seq, _gather_seq)  # g under sequence parallelism
SCATTER_SEQ = (_split_seq, _gather_seq)  # enter the sequence-parallel region from replicated values


class _Collective(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ops):
        ctx.group, ctx.backward_op = group, ops[1]
        return ops[0](x, group)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backward_op(grad, ctx.group), None, None


def collective(ops, x, group):
    return _Collective.apply(x, group, ops)


class _GatherLinears(torch.autograd.Function):
    """all_gather(x along the sequence) -> every linear (w_i, b_i) of it, saving only the shard x.

    Backward all-gathers x again for the weight gradients and reduce-scatters the summed input
    gradient. Under autocast (GPU) x is cast to the autocast dtype first: what is gathered and kept
    is then the bf16 activation that a plain linear would keep, and the fp32 weights are saved as
    themselves (no bf16 copy)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, group, *params):
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        ctx.group = group
        ctx.save_for_backward(x, *params)
        full = _gather_seq(x, group)
        return tuple(F.linear(full, w, b) for w, b in zip(params[::2], params[1::2]))

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, *grads):
        x, *params = ctx.saved_tensors
        full = _gather_seq(x, ctx.group)
        tokens = full.reshape(-1, full.shape[-1])
        grad_full, out = None, []
        for w, b, g in zip(params[::2], params[1::2], grads):
            w = w.to(g.dtype)  # what autocast does on a GPU; explicit, so a CPU's bf16 autocast runs the same path
            grad_full = g.matmul(w) if grad_full is None else grad_full + g.matmul(w)
            g = g.reshape(-1, g.shape[-1])
            out += [g.t().matmul(tokens), None if b is None else g.sum(0)]
        return (_reduce_scatter_seq(grad_full, ctx.group), None, *out)


class ColumnParallel:
    """The model's `project(x, linears)` over column-parallel linears that share their input x:
    f (COPY) once, then each linear; under sequence parallelism one `_GatherLinears` for the group."""

    def __init__(self, group, sequence_parallel: bool):
        self.group, self.sequence_parallel = group, sequence_parallel

    def __call__(self, x, linears):
        if not self.sequence_parallel:
            x = collective(COPY, x, self.group)
            return tuple(F.linear(x, w.weight, w.bias) for w in linears)
        return _GatherLinears.apply(x, self.group, *(t for w in linears for t in (w.weight, w.bias)))


# --------------------------------------------------------------------------- layers


class ColumnParallelLinear(nn.Module):
    """The LM head on its vocabulary rows: y = f(x) @ W_shard^T (the logits stay split over tp)."""

    def __init__(self, weight: nn.Parameter, columns: ColumnParallel):
        super().__init__()
        self.weight, self.bias, self.columns = weight, None, columns

    def forward(self, x):
        return self.columns(x, (self,))[0]


class RowParallelLinear(nn.Module):
    """y = g(x_shard @ W_shard^T) + b: input features split over tp; the bias is added once, after the sum."""

    def __init__(self, linear: nn.Linear, rank: int, tp: int, group, exit_ops):
        super().__init__()
        self.weight = nn.Parameter(_slice(linear.weight, 1, rank, tp))
        self.bias = linear.bias
        self.group, self.exit_ops = group, exit_ops

    def forward(self, x):
        y = collective(self.exit_ops, F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + n) of the (padded) table; tokens outside give zeros, the sum over tp gives the lookup."""

    def __init__(self, weight: torch.Tensor, vocab_start: int, group, exit_ops):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.vocab_start, self.group, self.exit_ops = vocab_start, group, exit_ops

    def forward(self, tokens):
        local = tokens - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return collective(self.exit_ops, out, self.group)


class _VocabParallelCE(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary. One all-gather of (log-sum-exp, target logit) per token."""

    @staticmethod
    def forward(ctx, logits, targets, vocab_start, vocab_size, group):
        x = logits.float().clone()
        n = x.shape[-1]
        if vocab_size - vocab_start < n:  # Megatron's padding rows: never a prediction
            x[..., max(vocab_size - vocab_start, 0):] = float("-inf")
        local = targets - vocab_start
        mine = (local >= 0) & (local < n)
        idx = local.clamp(0, n - 1).unsqueeze(-1)
        stats = torch.stack([torch.logsumexp(x, dim=-1), x.gather(-1, idx).squeeze(-1).masked_fill(~mine, 0.0)])
        tp = dist.get_world_size(group)
        gathered = stats.new_empty((tp * stats.shape[0],) + stats.shape[1:])
        _all_gather_single(gathered, stats.contiguous(), group=group)
        gathered = gathered.view((tp,) + stats.shape)
        lse, target_logit = torch.logsumexp(gathered[:, 0], dim=0), gathered[:, 1].sum(0)
        ctx.save_for_backward(x, lse, idx, mine)
        ctx.dtype = logits.dtype
        return (lse - target_logit).mean()

    @staticmethod
    def backward(ctx, grad):
        x, lse, idx, mine = ctx.saved_tensors
        dx = torch.exp(x - lse.unsqueeze(-1))  # softmax restricted to this rank's vocabulary
        dx.scatter_add_(-1, idx, -mine.unsqueeze(-1).to(dx.dtype))
        dx.mul_(grad / lse.numel())
        return dx.to(ctx.dtype), None, None, None, None


class VocabParallelCrossEntropy(nn.Module):
    def __init__(self, vocab_start: int, vocab_size: int, group):
        super().__init__()
        self.vocab_start, self.vocab_size, self.group = vocab_start, vocab_size, group

    def forward(self, logits, targets):
        return _VocabParallelCE.apply(logits, targets, self.vocab_start, self.vocab_size, self.group)


# --------------------------------------------------------------------------- the transformation


@dataclass(frozen=True)
class TPShard:
    """How one parameter is split over tp: along `dim`, `full` rows/columns before padding."""

    dim: int
    full: int


COLUMN = ("wq", "wk", "wv", "w1", "w3")  # output features split: heads, KV heads, FFN columns
ROW = ("wo", "w2")  # input features split


def _slice(t: torch.Tensor, dim: int, rank: int, tp: int, padded: int | None = None) -> torch.Tensor:
    t = t.detach()
    if padded is not None and padded > t.shape[dim]:
        pad = list(t.shape)
        pad[dim] = padded - t.shape[dim]
        t = torch.cat([t, t.new_zeros(pad)], dim=dim)
    return t.chunk(tp, dim=dim)[rank].clone(memory_format=torch.contiguous_format)


def padded_vocab(vocab_size: int, tp: int) -> int:
    return -(-vocab_size // tp) * tp


def tensor_parallel(model: nn.Module, tp_mesh, sequence_parallel: bool = False) -> Sharded:
    """Slice `model` (a full shardwise Transformer or a pipeline stage of one) over the 1-D `tp_mesh`, in place.

    Returns the model with its split: `tp_shards` ({parameter name: TPShard}) and `sp_partial_grads`
    (names whose gradients are partial sums over tp under sequence parallelism); names do not change."""
    tp = 1 if tp_mesh is None else tp_mesh.size()
    if tp == 1:
        return Sharded(model, model)
    group, rank = tp_mesh.get_group(), tp_mesh.get_local_rank()
    columns = ColumnParallel(group, sequence_parallel)
    exit_ = REDUCE_SCATTER_SEQ if sequence_parallel else REDUCE
    shards, sp_partial = {}, []

    for name, module in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("attention", "feed_forward", "shared_experts") and not getattr(module, "is_moe", False):
            module.project = columns  # a MoE layer's routed tokens enter their own way (expert_parallel.py)
        elif leaf in COLUMN and module is not None:
            module.weight = nn.Parameter(_slice(module.weight, 0, rank, tp))
            shards[f"{name}.weight"] = TPShard(0, module.out_features)
            if module.bias is not None:
                module.bias = nn.Parameter(_slice(module.bias, 0, rank, tp))
                shards[f"{name}.bias"] = TPShard(0, module.out_features)
            module.out_features //= tp
        elif leaf in ROW:
            parent, _, _ = name.rpartition(".")
            model.get_submodule(parent).register_module(leaf, RowParallelLinear(module, rank, tp, group, exit_))
            shards[f"{name}.weight"] = TPShard(1, module.in_features)
            if sequence_parallel and module.bias is not None:
                sp_partial.append(f"{name}.bias")
        elif "norm" in leaf and sequence_parallel:
            sp_partial.extend(f"{name}.{p}" for p, _ in module.named_parameters())

    vocab = model.spec.vocab_size
    rows = padded_vocab(vocab, tp)
    start = rank * rows // tp
    if model.tok_embeddings is not None:
        weight = _slice(model.tok_embeddings.weight, 0, rank, tp, rows)
        model.tok_embeddings = VocabParallelEmbedding(weight, start, group, REDUCE_SCATTER_SEQ if sequence_parallel else REDUCE)
        shards["tok_embeddings.weight"] = TPShard(0, vocab)
    if model.pos_embeddings is not None and sequence_parallel:
        model.pos_embeddings.register_forward_hook(lambda mod, args, out: collective(SCATTER_SEQ, out, group))
    if model.output is not None:
        if model.spec.tie_embeddings and model.tok_embeddings is not None:
            weight = model.tok_embeddings.weight  # still tied: both are the same vocab rows
        else:
            weight = nn.Parameter(_slice(model.output.weight, 0, rank, tp, rows))
            shards["output.weight"] = TPShard(0, vocab)
        model.output = ColumnParallelLinear(weight, columns)
        model.loss_fn = VocabParallelCrossEntropy(start, vocab, group)
    return Sharded(model, model, tp_shards=shards, sp_partial_grads=tuple(sp_partial), tp_group=group)


# --------------------------------------------------------------------------- helpers for the loop


def sync_sequence_parallel_grads(chunk: Sharded) -> None:
    """Sum over tp the gradients that sequence parallelism left partial (norms, row biases): one all-reduce."""
    if not chunk.sp_partial_grads:
        return
    params = dict(chunk.model.named_parameters())
    grads = [_local(params[n].grad) for n in chunk.sp_partial_grads if params[n].grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=chunk.tp_group)
    for g, new in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(new.view_as(g))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def unshard(chunk: Sharded, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The full (unpadded) tensor of parameter `name` from this rank's TP shard. Collective over tp."""
    shard = chunk.tp_shards.get(name)
    if shard is None:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(chunk.tp_group))]
    dist.all_gather(parts, tensor.contiguous(), group=chunk.tp_group)
    return torch.cat(parts, dim=shard.dim).narrow(shard.dim, 0, shard.full)
