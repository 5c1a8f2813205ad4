"""Mixture-of-experts feed-forward: a top-k router over SwiGLU experts, plus an optional shared expert.

    scores = softmax(x Wr^T)  or  sigmoid(x Wr^T)                      one per expert and token
    top-k  = the k best experts of each token; their weights are the scores, renormalised to sum to 1
             when `norm_topk` (Mixtral, Qwen3, DeepSeek-V3), times DeepSeek's routed_scaling
    y      = sum over the k experts of weight * expert(x)  +  shared(x)  (DeepSeek/Qwen2: one SwiGLU all tokens use)

Dropless: every token reaches all k of its experts whatever their load (no capacity factor, no dropped
tokens), so the output does not depend on how the experts are laid out over ranks.

Load balancing (Switch Transformer eqs. 4-6, GShard): aux = E * sum_i f_i * P_i, with f_i the fraction of
tokens sent to expert i (summing to k, as transformers counts) and P_i the mean routing probability of expert
i (the softmax; a sigmoid router's scores normalised per token, as DeepSeek-V3 does). It is computed per
sequence and averaged over sequences and MoE layers (DeepSeek-V3's sequence-wise form), so the training
objective does not depend on the micro-batch size or the data-parallel degree — a per-micro-batch loss
would. The loss adds `aux_loss_coef` times it. A DeepSeek config (ModelSpec.deepseek_balance_loss) takes
DeepSeek's own MoEGate form: f_i over the top-k picks (summing to 1), each MoE layer's term added. Its gradient is attached to the layer output (identity
forward, gradient 1 for the aux term backward: Megatron-Core's MoEAuxLossAutoScaler), so it trains the
router without travelling to the last pipeline stage.

The routed experts live in three (experts, ...) tensors, like transformers' current Mixtral. Expert
parallelism (shardwise.parallel.expert_parallel) keeps a slice of them and swaps `dispatch` for one that
sends tokens to other ranks with all-to-all; the layer itself is the same code.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from shardwise.specs import ModelSpec


class Experts(nn.Module):
    """`num` SwiGLU experts: w1, w3 (num, width, hidden) and w2 (num, hidden, width)."""

    def __init__(self, num: int, hidden: int, width: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num, width, hidden))
        self.w3 = nn.Parameter(torch.empty(num, width, hidden))
        self.w2 = nn.Parameter(torch.empty(num, hidden, width))

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x: tokens sorted by expert, counts[i] rows for local expert i."""
        out = [F.linear(F.silu(F.linear(part, self.w1[i])) * F.linear(part, self.w3[i]), self.w2[i])
               for i, part in enumerate(x.split(counts))]
        return torch.cat(out) if out else x


def local_dispatch(tokens: torch.Tensor, expert_ids: torch.Tensor, experts: Experts) -> torch.Tensor:
    """Every (token, expert) pair through its expert on this rank. expert_ids: (T, k). Returns (T, k, hidden)."""
    flat = expert_ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=experts.w1.shape[0]).tolist()
    k = expert_ids.shape[1]
    y = experts(tokens[order // k], counts)
    return unpermute(y, order).view(*expert_ids.shape, -1)


def unpermute(y: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Rows y[i] that were taken in `order` put back in place: y[inverse of order]. (An index keeps only the
    integer index for backward; index_copy would also keep y.)"""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return y[inverse]


class _AttachAuxLoss(torch.autograd.Function):
    """Identity on y; backward gives `aux` the gradient 1 (its scale is already in it)."""

    @staticmethod
    def forward(ctx, y, aux):
        ctx.aux_shape = aux.shape
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad.new_ones(ctx.aux_shape)


class MoE(nn.Module):
    """The feed-forward of a MoE layer. Submodules: `router` (Linear h -> E), `experts`, `shared_experts`
    (a FeedForward, or None) and `shared_expert_gate` (Qwen2, or None)."""

    is_moe = True

    def __init__(self, spec: ModelSpec, shared: nn.Module | None):
        super().__init__()
        self.spec = spec
        self.router = nn.Linear(spec.hidden, spec.num_experts, bias=False)
        self.experts = Experts(spec.num_experts, spec.hidden, spec.moe_ffn_hidden)
        self.shared_experts = shared
        self.shared_expert_gate = nn.Linear(spec.hidden, 1, bias=False) if spec.shared_expert_gate else None
        self.dispatch = local_dispatch  # expert parallelism replaces it (all-to-all)
        self.enter = self.leave = None  # tensor parallelism: take this rank's tokens, give back the full tensor
        self.seq_group = None  # ranks holding other tokens of the same sequences (tp, cp): their counts are summed
        self.grad_replicas = 1  # cp: gradients are averaged over the cp ranks, each holding a part of the aux, so
        # its gradient is attached cp times (the average then gives the sum of the parts)
        self.microbatches = 1  # per optimizer step on this rank: the aux loss gradient is divided by it
        self.aux_loss_sum = None  # this rank's aux loss contributions since the last read (detached)

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(probabilities (T, E) for the aux loss, top-k expert ids (T, k), their weights (T, k))."""
        spec = self.spec
        logits = self.router(tokens).float()
        if spec.router_scoring == "sigmoid":
            scores = logits.sigmoid()
            probs = scores / scores.sum(-1, keepdim=True)
        else:
            scores = probs = logits.softmax(-1)
        top, ids = scores.topk(spec.experts_per_token, dim=-1)
        if spec.norm_topk:
            top = top / top.sum(-1, keepdim=True)
        return probs, ids, top * spec.routed_scaling

    def aux_loss(self, probs: torch.Tensor, ids: torch.Tensor, batch: int) -> torch.Tensor:
        """This rank's part of sum over its sequences of E * sum_i f_i P_i (the sequence's other tokens,
        on other tp ranks, add theirs: f is counted over the whole sequence, P summed locally)."""
        spec = self.spec
        counts = F.one_hot(ids, spec.num_experts).sum(1).view(batch, -1, spec.num_experts).sum(1).float()
        local_tokens = torch.tensor(float(probs.shape[0] // batch), device=probs.device)  # NCCL: a CUDA tensor
        if self.seq_group is not None:  # the sequence is split over tp: count its tokens on every rank
            stats = torch.cat([counts.flatten(), local_tokens.view(1)])
            dist.all_reduce(stats, group=self.seq_group)
            counts, local_tokens = stats[:-1].view_as(counts), stats[-1]
        seq_len = local_tokens
        f = counts / seq_len  # (batch, E)
        p_sum = probs.view(batch, -1, spec.num_experts).sum(1)  # (batch, E), over this rank's tokens
        return spec.num_experts * (f * p_sum).sum() / seq_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = None
        if self.shared_experts is not None:
            shared = self.shared_experts(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
        local = self.enter(x) if self.enter is not None else x
        b, s, h = local.shape
        tokens = local.reshape(-1, h)
        probs, ids, weights = self.route(tokens)
        y = (self.dispatch(tokens, ids, self.experts) * weights.unsqueeze(-1).to(tokens.dtype)).sum(1)
        y = y.view(b, s, h)
        if self.spec.aux_loss_coef and torch.is_grad_enabled():
            aux = self.aux_loss(probs, ids, b) * self._aux_scale(b)
            y = _AttachAuxLoss.apply(y, aux * self.grad_replicas)
            if torch._C._current_graph_task_id() == -1:  # not a recompute inside backward: count it once
                self.aux_loss_sum = aux.detach() if self.aux_loss_sum is None else self.aux_loss_sum + aux.detach()
        if self.leave is not None:
            y = self.leave(y)
        return y if shared is None else y + shared

    def _aux_scale(self, batch: int) -> float:
        """coef / (MoE layers * micro-batches * sequences): the step's loss is the mean over all of them. DeepSeek's
        form (ModelSpec.deepseek_balance_loss) sums the layers and counts f over the top-k picks: coef / (k * ...)."""
        spec = self.spec
        per = spec.experts_per_token if spec.deepseek_balance_loss else len(spec.moe_layers)
        return spec.aux_loss_coef / (per * self.microbatches * batch)


def moe_layers_of(models) -> list[MoE]:
    return [m for model in models for m in model.modules() if isinstance(m, MoE)]


def set_microbatches(models, count: int) -> None:
    for m in moe_layers_of(models):
        m.microbatches = count


def take_aux_loss(models) -> torch.Tensor | None:
    """This rank's aux loss contributions since the last call (None for a dense model), and reset them."""
    layers = moe_layers_of(models)
    if not layers:
        return None
    total = torch.zeros((), device=next(layers[0].parameters()).device)
    for m in layers:
        if m.aux_loss_sum is not None:
            total = total + m.aux_loss_sum
        m.aux_loss_sum = None
    return total
