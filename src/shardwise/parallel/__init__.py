"""Parallelism as transformations of a plain model, over one (pp, dp, cp, tp) DeviceMesh.

    mesh  = build_mesh(pp, dp, tp, cp=cp)             # parallel/mesh.py
    model = Transformer(spec, seed=seed)              # the full model (or a pipeline stage of it)
    chunk = parallelize(model, mesh, layout, device, seq_len=seq_len)  # TP slices it, CP shards the
    chunk.module(x, y)                                # sequence, DP/ZeRO wraps or shards it: a `Sharded`,
                                                      # the module to call and how it is split

`clip_grad_norm_` and `full_state_dict` read the split from the `Sharded`, so they work under any layout.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from shardwise.parallel.context_parallel import context_parallel, shard_sequence
from shardwise.parallel.data_parallel import data_parallel, grad_sync, make_optimizer
from shardwise.parallel.expert_parallel import (expert_grad_norm_sq, expert_names, expert_parallel, sync_expert_grads,
                                                unshard_experts)
from shardwise.parallel.mesh import build_mesh, coordinates, data_dim, data_mesh, group, init_distributed, size
from shardwise.parallel.sharded import Sharded
from shardwise.parallel.tensor_parallel import sync_sequence_parallel_grads, tensor_parallel, unshard


def parallelize(model: nn.Module, mesh, layout, device: torch.device | str = "cpu", replicate: bool = True,
                seq_len: int | None = None, weights=None) -> Sharded:
    """Full model on CPU -> the layout's TP slices it -> CP makes it run on this rank's part of `seq_len`-token
    sequences -> onto `device` -> its DP / ZeRO stage wraps or shards it over dp (x cp).
    Returns a `Sharded`: the module to call, the plain model and how every parameter is split.
    replicate=False leaves ZeRO 0/1 unwrapped: the pipeline step averages their gradients itself, once per step.
    weights(chunk, device): a model built on the meta device gets this rank's slices instead (shardwise.hf.load)."""
    chunk = tensor_parallel(model, None if mesh is None else mesh["tp"], layout.sequence_parallel)
    if layout.cp > 1:
        context_parallel(model, mesh["cp"], layout.cp_mode, seq_len)
    chunk = expert_parallel(chunk, mesh, layout.ep, layout.etp, layout.sequence_parallel)
    if weights is not None:
        weights(chunk, device)
    else:
        model.to(device)
    zero = layout.zero if size(mesh, data_dim(mesh)) > 1 else 0
    if not replicate and zero < 2:
        return replace(chunk, zero=zero)
    module = data_parallel(model, data_mesh(mesh), zero, chunk.experts)
    return replace(chunk, module=module, zero=zero)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def clip_grad_norm_(chunks: list[Sharded], max_norm: float, mesh) -> torch.Tensor:
    """Clip by the norm of the whole model's gradient, whatever the layout; returns that norm.

    TP shards add up over tp; parameters replicated over tp count once (tp rank 0); FSDP shards add
    up over dp (x cp) (DDP gradients are already equal on every dp and cp rank); pipeline stages add up over pp."""
    tp_rank = coordinates(mesh)["tp"]
    sharded, replicated, twins, sharded_over_dp, experts = [], [], [], False, []
    for chunk in chunks:
        split_over_ep = expert_names(chunk)
        for name, p in chunk.model.named_parameters():
            if p.grad is None:
                continue
            if name in split_over_ep:
                experts.append(_local(p.grad))  # split over ep/etp: their own sum below
                continue
            if name in chunk.replicas:
                twins.append(_local(p.grad))  # a tied LM head: its twin on the first stage is counted
                continue
            sharded_over_dp |= isinstance(p.grad, DTensor)
            (sharded if name in chunk.tp_shards else replicated).append(_local(p.grad))
    grads = sharded + replicated
    device = grads[0].device if grads else torch.device("cpu")
    sq = torch.zeros((), device=device)
    if sharded:
        sq = sq + torch.nn.utils.get_total_norm(sharded).float() ** 2
    if replicated and tp_rank == 0:
        sq = sq + torch.nn.utils.get_total_norm(replicated).float() ** 2
    for dim in ("tp",) + ((data_dim(mesh),) if sharded_over_dp else ()):
        if group(mesh, dim) is not None:
            dist.all_reduce(sq, group=group(mesh, dim))
    expert_sq = expert_grad_norm_sq(chunks, _local)
    if expert_sq is not None:
        sq = sq + expert_sq.to(sq.device)
    if group(mesh, "pp") is not None:
        dist.all_reduce(sq, group=group(mesh, "pp"))
    norm = sq.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    if grads or twins or experts:
        torch._foreach_mul_(grads + twins + experts, coef)
    return norm


def full_state_dict(chunk: Sharded) -> dict[str, torch.Tensor]:
    """Every parameter, gathered to its full unpadded shape under its layout-free name (CPU tensors).
    Collective: every rank of the chunk's tp and dp groups must call it."""
    out = {}
    for name, p in chunk.model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        out[name] = unshard_experts(chunk, name, unshard(chunk, name, t)).cpu()
    return out


__all__ = ["build_mesh", "init_distributed", "coordinates", "size", "group", "data_dim", "data_mesh", "parallelize",
           "Sharded", "tensor_parallel", "context_parallel", "shard_sequence",
           "data_parallel", "grad_sync", "make_optimizer", "clip_grad_norm_", "full_state_dict",
           "sync_sequence_parallel_grads", "expert_parallel", "sync_expert_grads", "expert_names"]
