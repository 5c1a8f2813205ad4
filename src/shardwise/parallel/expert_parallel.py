"""Expert parallelism (EP), folded over the ranks of the dense layers (Megatron-Core's MoE parallel folding).

Attention and the dense weights are split tp x dp as before. The routed experts use the same ranks of a
pipeline stage regrouped as (edp, ep, etp) (parallel/mesh.py: `expert_mesh`): an ep group holds the E
experts, E/ep each; etp > 1 splits each expert's FFN width (column w1/w3, row w2); edp replicas of that
repeat. Per MoE layer (all sizes are runtime counts, dropless):

    tokens (this rank's; a tp rank takes 1/tp of the sequence)  -> route (local)
    sort by expert -> all_to_all_single(uneven splits) over ep   -> tokens of my experts, by source rank
    regroup by expert [-> etp: all-gather the rows over etp]     -> experts (grouped matmuls)
    [-> etp: reduce-scatter partial outputs] -> undo the regroup -> all_to_all back -> unsort -> weight, sum

Every transfer is an autograd Function whose backward is the adjoint collective: the all-to-all with the
splits swapped, the etp gather with a reduce-scatter and back. Counts travel first (one all-to-all of E
integers) so every rank knows its receive sizes: NCCL's all_to_all needs them on both sides.

Gradients: an expert replica has summed the gradients of every token it served, from all the ranks of its
ep group; the replicas of a stage together served every token once. So the expert gradients are summed
over edp and divided by the number of dense loss replicas (dp x cp) — what the dense weights' averaging
over dp means — exactly the single-process gradient (`sync_expert_grads`; FSDP does the same with its
divide factor). Router and shared expert are dense weights: averaged over dp as usual; the router (which
sees only its tp rank's tokens) is summed over tp first, like sequence-parallel norms.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch import nn

from shardwise.moe import MoE, unpermute
from shardwise.parallel.mesh import expert_mesh, sequence_group, submesh
from shardwise.parallel.sharded import Sharded
from shardwise.parallel.tensor_parallel import (SCATTER_SEQ, _all_gather_single, _gather_seq, _reduce_scatter_single,
                                                _split_seq, collective)

# Leave a tensor-parallel region whose output is then used replicated: gather the sequence, keep my slice of the gradient.
GATHER_SEQ_REPLICATED = (_gather_seq, _split_seq)


# --------------------------------------------------------------------------- transfers (autograd)


class _AllToAll(torch.autograd.Function):
    """Rows to ranks: send[j] rows go to rank j, recv[j] come from it; backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _all_to_all(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(recv),) + x.shape[1:])
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


def _gather_rows(x: torch.Tensor, sizes: list[int], group) -> torch.Tensor:
    """Every rank's rows (sizes[j] from rank j), concatenated in rank order (padded to the largest for the collective)."""
    most = max(sizes)
    padded = x.new_zeros((most,) + x.shape[1:])
    padded[: x.shape[0]] = x
    out = x.new_empty((len(sizes) * most,) + x.shape[1:])
    _all_gather_single(out, padded, group=group)
    return torch.cat([out[j * most: j * most + n] for j, n in enumerate(sizes)])


def _scatter_rows(y: torch.Tensor, sizes: list[int], group) -> torch.Tensor:
    """The adjoint: sum the partial rows over the ranks, each rank keeps its own sizes[rank] rows."""
    most = max(sizes)
    padded = y.new_zeros((len(sizes) * most,) + y.shape[1:])
    for j, part in enumerate(y.split(sizes)):
        padded[j * most: j * most + part.shape[0]] = part
    out = y.new_empty((most,) + y.shape[1:])
    _reduce_scatter_single(out, padded, group=group)
    return out[: sizes[dist.get_rank(group)]]


class _Rows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, sizes, group, forward_op, backward_op):
        ctx.sizes, ctx.group, ctx.backward_op = sizes, group, backward_op
        return forward_op(x, sizes, group)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backward_op(grad, ctx.sizes, ctx.group), None, None, None, None


def _regroup(counts: torch.Tensor) -> torch.Tensor:
    """Rows arrive grouped by source, then expert (counts: (sources, experts)); the order that groups them by expert."""
    sources, experts = counts.shape
    expert_of_row = torch.arange(experts, device=counts.device).repeat(sources).repeat_interleave(counts.flatten())
    return expert_of_row.argsort(stable=True)


def _through_experts(x: torch.Tensor, counts: torch.Tensor, experts: nn.Module) -> torch.Tensor:
    """Rows grouped by (source, expert) through their experts, returned in the same order."""
    order = _regroup(counts)
    y = experts(x[order], counts.sum(0).tolist())
    return unpermute(y, order)


@dataclass
class ExpertDispatch:
    """`MoE.dispatch` under expert parallelism: send every (token, expert) pair to the rank holding the expert."""

    num_experts: int
    ep_group: object
    etp_group: object = None

    def __call__(self, tokens: torch.Tensor, expert_ids: torch.Tensor, experts: nn.Module) -> torch.Tensor:
        ep = dist.get_world_size(self.ep_group)
        local = self.num_experts // ep
        k = expert_ids.shape[1]
        flat = expert_ids.reshape(-1)
        order = flat.argsort(stable=True)  # by expert, so by destination rank (experts are contiguous per rank)
        counts = torch.bincount(flat, minlength=self.num_experts)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.ep_group)  # how many of mine each rank sends to me
        received = received.view(ep, local)
        send, recv = counts.view(ep, local).sum(1).tolist(), received.sum(1).tolist()
        x = _AllToAll.apply(tokens[order // k], send, recv, self.ep_group)
        if self.etp_group is None:
            y = _through_experts(x, received, experts)
        else:
            y = self._expert_tensor_parallel(x, received, experts)
        y = _AllToAll.apply(y, recv, send, self.ep_group)
        return unpermute(y, order).view(*expert_ids.shape, -1)

    def _expert_tensor_parallel(self, x, received, experts):
        """Each etp rank holds a width slice of the same experts: gather every etp rank's rows, run them
        through the slice (partial outputs), sum the partials back onto the rows' own rank.
        x: rows grouped by (source rank, expert), received[source, expert] of them."""
        etp = dist.get_world_size(self.etp_group)
        by_expert = _regroup(received)
        per_expert = received.sum(0)
        counts = per_expert.new_empty((etp, per_expert.numel()))
        _all_gather_single(counts, per_expert.view(1, -1).contiguous(), group=self.etp_group)
        sizes = counts.sum(1).tolist()
        gathered = _Rows.apply(x[by_expert], sizes, self.etp_group, _gather_rows, _scatter_rows)
        y = _Rows.apply(_through_experts(gathered, counts, experts), sizes, self.etp_group, _scatter_rows, _gather_rows)
        return unpermute(y, by_expert)


# --------------------------------------------------------------------------- the transformation


@dataclass
class ExpertPlacement:
    """Where this rank's experts sit (`Sharded.experts`)."""

    mesh: object  # the (edp, ep, etp) DeviceMesh of this stage's ranks
    loss_replicas: int  # dp (x cp): the dense gradients are averaged over this many ranks
    names: list[str] = field(default_factory=list)  # expert parameters (full-model names)
    fsdp: bool = False  # FSDP reduces their gradients itself (ZeRO 2/3)

    def size(self, dim: str) -> int:
        return submesh(self.mesh, dim).size()

    def rank(self, dim: str) -> int:
        return submesh(self.mesh, dim).get_local_rank()

    def group(self, dim: str):
        """The process group of `dim` ("edp", "ep", "etp"), or None when it has one rank."""
        return None if self.size(dim) == 1 else submesh(self.mesh, dim).get_group()


def _size(mesh, dim: str) -> int:
    return mesh[dim].size() if dim in (mesh.mesh_dim_names or ()) else 1


def expert_parallel(chunk: Sharded, mesh, ep: int, etp: int, sequence_parallel: bool) -> Sharded:
    """Keep this rank's experts (E/ep of them, width/etp of each) of every MoE layer of `chunk.model` (a full
    Transformer or a stage), route its tokens to the others with all-to-all, and give tensor-parallel ranks
    1/tp of the tokens each. In place; returns the chunk with its `experts` placement (ep * etp > 1) and the
    gradients that are partial over tp. Run after tensor_parallel. With ep = etp = 1 the experts stay whole
    on every rank: dense weights whose gradient, like the router's, is partial over tp (each tp rank served
    its own tokens) and is summed over tp."""
    model = chunk.model
    if mesh is None or not model.spec.is_moe:
        return chunk
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, MoE)]
    tp_group = None if _size(mesh, "tp") == 1 else mesh["tp"].get_group()
    placement = None
    if ep * etp > 1:  # every rank builds the expert mesh (collective), also a stage of dense layers only
        placement = ExpertPlacement(expert_mesh(mesh, ep, etp), _size(mesh, "dp") * _size(mesh, "cp"))
    seq_group = sequence_group(mesh)
    partial = []  # gradients summed over tp once per step (tensor_parallel's sequence-parallel list)
    for name, moe in layers:
        weights = [f"{name}.experts.{w}" for w in ("w1", "w3", "w2")]
        if placement is None:
            partial += weights
        else:
            _keep_my_experts(moe, placement)
            placement.names += weights
            moe.dispatch = ExpertDispatch(moe.spec.num_experts, placement.group("ep"), placement.group("etp"))
            if ep == 1:
                moe.dispatch = _single_rank_ep(moe.dispatch)
        moe.seq_group, moe.grad_replicas = seq_group, _size(mesh, "cp")
        if tp_group is not None:  # each tp rank routes its 1/tp of every sequence
            if not sequence_parallel:
                moe.enter = lambda x, g=tp_group: collective(SCATTER_SEQ, x, g)
                moe.leave = lambda y, g=tp_group: collective(GATHER_SEQ_REPLICATED, y, g)
            partial.append(f"{name}.router.weight")
            if sequence_parallel and moe.shared_expert_gate is not None:
                partial.append(f"{name}.shared_expert_gate.weight")
    if tp_group is None:
        partial = []  # one tp rank: nothing is partial
    return replace(chunk, experts=placement if layers else None, sp_partial_grads=chunk.sp_partial_grads + tuple(partial),
                   tp_group=tp_group)


def _keep_my_experts(moe: MoE, placement: ExpertPlacement) -> None:
    """Experts [r E/ep, (r+1) E/ep) of ep rank r; of each, FFN columns of etp rank t (w1, w3 rows, w2 columns)."""
    experts, local = moe.experts, moe.spec.num_experts // placement.size("ep")
    width = moe.spec.moe_ffn_hidden // placement.size("etp")
    rows = slice(placement.rank("ep") * local, (placement.rank("ep") + 1) * local)
    cols = slice(placement.rank("etp") * width, (placement.rank("etp") + 1) * width)
    with torch.no_grad():
        experts.w1 = nn.Parameter(experts.w1[rows, cols].clone())
        experts.w3 = nn.Parameter(experts.w3[rows, cols].clone())
        experts.w2 = nn.Parameter(experts.w2[rows, :, cols].clone())


def unshard_experts(chunk: Sharded, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The full (all experts, full width) tensor of expert parameter `name`. Collective over ep and etp."""
    placement = chunk.experts
    if placement is None or name not in placement.names:
        return tensor
    for dim, axis in (("etp", 2 if name.endswith("w2") else 1), ("ep", 0)):
        if placement.group(dim) is not None:
            parts = [torch.empty_like(tensor) for _ in range(placement.size(dim))]
            dist.all_gather(parts, tensor.contiguous(), group=placement.group(dim))
            tensor = torch.cat(parts, dim=axis)
    return tensor


def _single_rank_ep(dispatch: ExpertDispatch):
    """etp > 1 with ep 1: every expert here, only the width is split; skip the all-to-all."""

    def run(tokens, expert_ids, experts):
        flat = expert_ids.reshape(-1)
        order = flat.argsort(stable=True)
        per_expert = torch.bincount(flat, minlength=dispatch.num_experts)
        y = dispatch._expert_tensor_parallel(tokens[order // expert_ids.shape[1]], per_expert.view(1, -1), experts)
        return unpermute(y, order).view(*expert_ids.shape, -1)
    return run


# --------------------------------------------------------------------------- in the step


def expert_names(chunk: Sharded) -> frozenset[str]:
    """The chunk's expert parameters split over ep/etp (empty for a dense model or ep = etp = 1)."""
    return frozenset(chunk.experts.names) if chunk.experts is not None else frozenset()


def sync_expert_grads(chunk: Sharded) -> None:
    """Sum the expert gradients over the edp replicas and divide by the dense loss replicas (dp x cp): one
    flat all-reduce per step. Under FSDP its reduce-scatter already averaged them over edp: rescale by
    edp / (dp x cp). Nothing to do for a dense model or ep = etp = 1."""
    placement = chunk.experts
    if placement is None:
        return
    params = dict(chunk.model.named_parameters())
    grads = [params[n].grad for n in placement.names if params[n].grad is not None]
    if not grads:
        return
    if placement.fsdp:
        scale = placement.size("edp") / placement.loss_replicas
        if scale != 1:
            torch._foreach_mul_([g.to_local() if hasattr(g, "to_local") else g for g in grads], scale)
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if placement.group("edp") is not None:
        dist.all_reduce(flat, group=placement.group("edp"))
    if placement.loss_replicas > 1:
        flat /= placement.loss_replicas
    for g, new in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(new.view_as(g))
