"""Parallelism as transformations of a plain model, over one (pp, dp, cp, tp) DeviceMesh.

    mesh  = build_mesh(pp, dp, tp, cp=cp)             # parallel/mesh.py
    model = Transformer(spec, seed=seed)              # the full model (or a pipeline stage of it)
    chunk = parallelize(model, mesh, layout, device, seq_len=seq_len)  # TP slices it, CP shards the
    chunk.module(x, y)                                # sequence, DP/ZeRO wraps or shards it: a `Sharded`,
                                                      # the module to call and how it is split

`clip_grad_norm_` (grad_norm.py) and `full_state_dict` read the split from the `Sharded`, so they work under
any layout.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from shardwise.parallel.context_parallel import context_parallel, shard_sequence
from shardwise.parallel.data_parallel import data_parallel, grad_sync, make_optimizer
from shardwise.parallel.expert_parallel import expert_names, expert_parallel, sync_expert_grads, unshard_experts
from shardwise.parallel.grad_norm import GlobalGradNorm, clip_grad_norm_
from shardwise.parallel.mesh import build_mesh, coordinates, data_dim, data_mesh, group, init_distributed, size
from shardwise.parallel.sharded import Sharded
from shardwise.parallel.tensor_parallel import sync_sequence_parallel_grads, tensor_parallel, unshard


def parallelize(model: nn.Module, mesh, layout, device: torch.device | str = "cpu", replicate: bool = True,
                seq_len: int | None = None, weights=None) -> Sharded:
    """Full model on CPU -> the layout's TP slices it -> CP makes it run on this rank's part of `seq_len`-token
    sequences -> onto `device` -> its DP / ZeRO stage wraps or shards it over dp (x cp).
    Returns a `Sharded`: the module to call, the plain model and how every parameter is split.
    replicate=False leaves ZeRO 0/1 unwrapped: the pipeline step averages their gradients itself, once per step.
    weights(chunk, device, replicated): a model built on the meta device gets this rank's slices instead
    (shardwise.hf.load); `replicated`: the parameters have data-parallel replicas (DDP/ZeRO/FSDP below)."""
    chunk = tensor_parallel(model, None if mesh is None else mesh["tp"], layout.sequence_parallel)
    if layout.cp > 1:
        context_parallel(model, mesh["cp"], layout.cp_mode, seq_len)
    chunk = expert_parallel(chunk, mesh, layout.ep, layout.etp, layout.sequence_parallel)
    if weights is not None:
        weights(chunk, device, replicated=size(mesh, data_dim(mesh)) > 1)
    else:
        model.to(device)
    zero = layout.zero if size(mesh, data_dim(mesh)) > 1 else 0
    if not replicate and zero < 2:
        return replace(chunk, zero=zero)
    module = data_parallel(model, data_mesh(mesh), zero, chunk.experts)
    return replace(chunk, module=module, zero=zero)


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
           "data_parallel", "grad_sync", "make_optimizer", "clip_grad_norm_", "GlobalGradNorm", "full_state_dict",
           "sync_sequence_parallel_grads", "expert_parallel", "sync_expert_grads", "expert_names"]
