"""The whole model's gradient norm under any layout, from one scalar all-reduce over every rank.

Every rank adds the squares of the gradients it is the counted holder of, so that the sum over all ranks
(one all-reduce of the world) is the single-process squared norm:

| gradient | split over | counted by |
|---|---|---|
| dense, split over tp (`Sharded.tp_shards`) | tp (and dp x cp under FSDP) | tp: every rank; dp x cp: the first replica, or every rank under FSDP |
| dense, whole on every tp rank | - (and dp x cp under FSDP) | tp rank 0; dp x cp as above |
| a tied LM head's copy on the last stage (`Sharded.replicas`) | - | nobody (its twin on the first stage counts) |
| experts split over ep / etp | ep, etp (and edp under FSDP) | the first edp replica, or every rank under FSDP |
| anything, on pipeline stage s | pp | every stage: the sum runs over them |

DDP averages the gradients over dp x cp, so every replica holds the same values and the first one (dp
and cp coordinate 0) stands for all. With no tp, pp, FSDP shards or split experts every rank already holds
the whole gradient: the norm is computed locally and no collective runs at all. The same all-reduce
carries other per-step scalars (the loss and the MoE aux loss, `extra`), so a training step issues one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from shardwise.parallel.expert_parallel import expert_names
from shardwise.parallel.mesh import coordinates, size
from shardwise.parallel.sharded import Sharded


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class GlobalGradNorm:
    """Which gradients this rank counts and which it scales, decided once for a runtime's chunks."""

    def __init__(self, chunks: list[Sharded], mesh):
        where = coordinates(mesh)
        params = [(chunk, expert_names(chunk), name, p) for chunk in chunks for name, p in chunk.model.named_parameters()]
        # One collective when some rank holds a part the others do not; none when every rank holds it all.
        self.collective = mesh is not None and mesh.size() > 1 and (
            size(mesh, "tp") > 1 or size(mesh, "pp") > 1 or any(c.experts is not None for c in chunks)
            or any(isinstance(p, DTensor) for *_, p in params))
        # Without the collective this rank counts everything it holds (all of it, replicated everywhere).
        first_replica = not self.collective or (where["dp"] == 0 and where["cp"] == 0)
        self.scaled = [p for *_, p in params]  # every gradient this rank holds: clipped by the global coefficient
        self.counted: list[torch.nn.Parameter] = []  # their squares are this rank's part of the sum
        for chunk, experts, name, p in params:
            if name in chunk.replicas:
                continue
            if name in experts:
                counted = chunk.experts.fsdp or chunk.experts.rank("edp") == 0
            else:
                sharded_over_data = isinstance(p, DTensor)  # FSDP (ZeRO 2/3): this rank's rows only
                counted = (name in chunk.tp_shards or where["tp"] == 0) and (sharded_over_data or first_replica)
            if counted:
                self.counted.append(p)

    def local_square(self, device: torch.device) -> torch.Tensor:
        """This rank's part of the squared norm (0-dim fp64). Accumulated in fp64: an fp32 norm's rounding grows
        with the tensor's size (about 1e-5 relative at 4M elements on a CPU), so a layout that splits a large
        tensor (TP's vocabulary rows) would report another norm, and clip by another coefficient, than one process."""
        grads = [_local(p.grad) for p in self.counted if p.grad is not None]
        if not grads:
            return torch.zeros((), device=device, dtype=torch.float64)
        return torch.stack(torch._foreach_norm(grads, dtype=torch.float64)).square().sum()  # one kernel for all

    def clip_(self, max_norm: float, device: torch.device, extra: list[torch.Tensor] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """Scale every gradient by min(1, max_norm / norm); returns (norm, the sum of `extra` over all ranks,
        stacked) — or, when the norm needs no collective, (norm, the `extra` of this rank alone): the caller
        reduces those itself, off the critical path."""
        values = torch.stack([self.local_square(device), *[e.to(device=device, dtype=torch.float64) for e in extra]])
        if self.collective:
            dist.all_reduce(values)
        norm = values[0].sqrt()
        grads = [_local(p.grad) for p in self.scaled if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0).float())
        return norm.float(), values[1:].float()


def clip_grad_norm_(chunks: list[Sharded], max_norm: float, mesh) -> torch.Tensor:
    """Clip by the norm of the whole model's gradient, whatever the layout; returns that norm."""
    grads = [p.grad for c in chunks for p in c.model.parameters() if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    return GlobalGradNorm(chunks, mesh).clip_(max_norm, device)[0]
