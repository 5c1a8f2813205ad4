"""This rank's training state in layout-free terms: full-model names, logical (unsharded, unpadded) shapes.

    model.<name>                 the parameter
    optim.<name>.exp_avg         AdamW's first moment  (same shape as the parameter)
    optim.<name>.exp_avg_sq      AdamW's second moment
    optim.<name>.step            AdamW's step count for this parameter (a scalar)
    rng.cpu                      torch's CPU generator state
    train.step                   optimizer steps done (the LR schedule and the data position follow from it)

How each rank's piece is expressed so that DCP records where it sits in the logical tensor:
- a tensor-parallel shard: a DTensor over mesh["tp"] with Shard(dim). DTensor's uneven split is torch.chunk's,
  which gives exactly the real rows of each rank's padded vocabulary shard (Megatron pads V to a multiple of
  tp and rank r holds rows [r*c, (r+1)*c) with c = ceil(V/tp); chunk gives rank r rows [r*c, min((r+1)*c, V))).
- anything not split over tp: a plain tensor; DCP keeps one copy of identical replicas (dp, tp).
- FSDP (ZeRO 2/3): parameters and AdamW moments are DTensors over dp of the TP-local tensor. One that nothing
  splits over tp or the experts is already a piece of the logical tensor: saved and loaded as that DTensor, each rank
  its own dp chunk (ZeRO-3 is chosen where the whole does not fit one GPU: gathering every tensor for the save, and
  allocating them whole for the load, would not fit either). One split over tp too is gathered to the TP-local
  tensor for the save (one all-gather each) and this rank's dp chunk is taken back on load.
- ZeRO-1: each parameter's AdamW state exists on the one dp rank that owns it; that rank saves it, and on
  load each rank reads the state of the parameters it owns under the new layout.
- pipeline stages hold different parameters, so they simply save different keys. A tied LM head on the
  last stage is a replica of tok_embeddings.weight: not saved, loaded from that key.
- routed experts split over ep x etp (parallel/expert_parallel.py): the (experts, ...) tensors under their
  single-process names and shapes, as a DTensor over the stage's (edp, ep, etp) expert mesh: Shard(0) over
  ep (E/ep experts each), Shard(width dim) over etp, Replicate over edp (DCP writes one copy). Their AdamW
  state lives in the experts' own optimizer (ZeRO-1 over edp: on the edp rank that owns it); with FSDP
  over edp (ZeRO 2/3) the shard is gathered to the ep x etp piece for the save, as the dense weights are.

Loading into any layout is then DCP's resharding: each rank asks for its own slices of the logical tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass
class Entry:
    """One parameter this rank holds."""

    key: str  # layout-free name (a tied twin's is the embedding's)
    param: nn.Parameter
    shard: object  # TPShard, ExpertShard or None
    owned: bool  # this rank keeps (and saves) its optimizer state
    replica: bool  # the last stage's tied LM head: loaded, never saved


@dataclass(frozen=True)
class ExpertShard:
    """An expert tensor split over the (edp, ep, etp) mesh: experts along dim 0 over ep, the FFN width along
    `width_dim` over etp (w1, w3: 1; w2: 2)."""

    mesh: object
    width_dim: int


def _local_optimizers(optimizer) -> list[torch.optim.Optimizer]:
    """The AdamW(s) holding this rank's state: ZeRO-1's per-rank AdamW over the parameters this rank owns,
    else the optimizer itself; the dense weights' and the experts' under expert parallelism (Optimizers)."""
    parts = getattr(optimizer, "parts", [optimizer])
    return [getattr(opt, "optim", opt) for opt in parts]


def _state_home(optimizer) -> dict[int, torch.optim.Optimizer]:
    """id(parameter) -> the local AdamW that keeps (and saves) its state on this rank."""
    return {id(p): opt for opt in _local_optimizers(optimizer) for g in opt.param_groups for p in g["params"]}


def _expert_shard(chunk, name: str):
    placement = chunk.experts
    if placement is None or name not in placement.names:
        return None
    return ExpertShard(placement.mesh, 2 if name.endswith("w2") else 1)


def entries(rt) -> list[Entry]:
    owned = _state_home(rt.optimizer)
    out = []
    for chunk in rt.chunks:
        for name, p in chunk.model.named_parameters():
            key = "tok_embeddings.weight" if name in chunk.replicas else name
            shard = chunk.tp_shards.get(name) or _expert_shard(chunk, name)
            out.append(Entry(key, p, shard, id(p) in owned, name in chunk.replicas))
    return out


# --------------------------------------------------------------------------- TP-local <-> logical


def _dp_sharded(t: torch.Tensor, shard) -> bool:
    """FSDP's shard of a tensor nothing else splits: a piece of the logical tensor as it is (saved, loaded as is)."""
    return isinstance(t, DTensor) and shard is None


def _tp_local(t: torch.Tensor) -> torch.Tensor:
    """The tensor-parallel shard whole (FSDP: all-gathered over dp, a collective)."""
    return t.full_tensor() if isinstance(t, DTensor) else t.detach()


def _logical(local: torch.Tensor, shard, mesh) -> torch.Tensor:
    """This rank's TP shard (or ep x etp piece of the experts) as a piece of the logical tensor: a DTensor
    over tp (over the expert mesh), or the tensor itself."""
    if isinstance(shard, ExpertShard):
        return DTensor.from_local(local, shard.mesh, [Replicate(), Shard(0), Shard(shard.width_dim)], run_check=False)
    if shard is None or mesh is None or mesh["tp"].size() == 1:
        return local
    tp_mesh = mesh["tp"]
    tp, rank = tp_mesh.size(), tp_mesh.get_local_rank()
    rows = -(-shard.full // tp)  # torch.chunk's chunk size == each rank's padded shard size
    real = max(0, min(rows, shard.full - rank * rows))
    shape = list(local.shape)
    shape[shard.dim] = shard.full
    stride = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        stride[i] = stride[i + 1] * shape[i + 1]
    return DTensor.from_local(local.narrow(shard.dim, 0, real), tp_mesh, [Shard(shard.dim)], run_check=False,
                              shape=torch.Size(shape), stride=tuple(stride))


def _assign(target: torch.Tensor, tp_local: torch.Tensor) -> None:
    """Copy a whole TP shard into a parameter or moment: FSDP keeps only this dp rank's dim-0 chunk (or, loaded as
    FSDP's own shard, the chunk itself)."""
    with torch.no_grad():
        if isinstance(tp_local, DTensor):
            target.to_local().copy_(tp_local.to_local())
        elif isinstance(target, DTensor):
            mesh = target.device_mesh
            chunks = tp_local.chunk(mesh.size(), dim=0)
            rank = mesh.get_local_rank()
            piece = chunks[rank] if rank < len(chunks) else tp_local.narrow(0, 0, 0)
            target.to_local().copy_(piece)
        else:
            target.copy_(tp_local)


# --------------------------------------------------------------------------- save


def collect(rt) -> dict[str, torch.Tensor]:
    """This rank's share of the layout-free state dict. Collective over dp under FSDP (same order on every rank)."""
    home = _state_home(rt.optimizer)
    out = {}
    for e in entries(rt):
        if e.replica:
            continue
        out[f"model.{e.key}"] = _saved(e.param, e.shard, rt.mesh)
        state = home[id(e.param)].state.get(e.param) if e.owned else None
        if state:
            for m in MOMENTS:
                out[f"optim.{e.key}.{m}"] = _saved(state[m], e.shard, rt.mesh)
            out[f"optim.{e.key}.step"] = state["step"].detach().cpu()
    out["rng.cpu"] = torch.get_rng_state()
    out["train.step"] = torch.tensor(rt.step, dtype=torch.int64)
    return out


def _saved(t: torch.Tensor, shard, mesh) -> torch.Tensor:
    return t.detach() if _dp_sharded(t, shard) else _logical(_tp_local(t), shard, mesh)


# --------------------------------------------------------------------------- load


def targets(rt) -> tuple[dict[str, torch.Tensor], Callable[[], None]]:
    """Empty tensors for every key this rank needs under its own layout, and the function that moves the
    loaded values into the parameters and a fresh AdamW state (call it after DCP filled the tensors)."""
    home = _state_home(rt.optimizer)
    wanted, moves = {}, []

    def want(key: str, like: torch.Tensor, shard) -> torch.Tensor:
        if _dp_sharded(like, shard):  # this rank's dp chunk, read as it was saved
            wanted[key] = piece = torch.zeros_like(like)
            return piece
        whole = torch.zeros(like.shape, dtype=like.dtype, device=like.device)  # TP-local shape, padding stays zero
        wanted[key] = _logical(whole, shard, rt.mesh)
        return whole

    for e in entries(rt):
        value = want(f"model.{e.key}", e.param, e.shard)
        moves.append(lambda p=e.param, v=value: _assign(p, v))
        if e.owned:
            moments = {m: want(f"optim.{e.key}.{m}", e.param, e.shard) for m in MOMENTS}
            step = wanted[f"optim.{e.key}.step"] = torch.zeros((), dtype=torch.get_default_dtype())
            opt = home[id(e.param)]
            moves.append(lambda p=e.param, ms=moments, s=step, o=opt: o.state.__setitem__(p, _adam_state(p, ms, s, o)))
    wanted["rng.cpu"] = torch.get_rng_state()
    wanted["train.step"] = torch.zeros((), dtype=torch.int64)

    def finish():
        for move in moves:
            move()
        torch.set_rng_state(wanted["rng.cpu"])
        rt.step = int(wanted["train.step"])

    return wanted, finish


def _adam_state(p: torch.Tensor, moments: dict[str, torch.Tensor], step: torch.Tensor, opt) -> dict:
    """AdamW's per-parameter state as AdamW itself would have built it (moments shaped and placed like p; the step
    count on p's device where the optimizer is fused or capturable, as Optimizer.load_state_dict places it: the fused
    CUDA kernel reads it on the GPU, and a CPU step there is a host pointer in a kernel)."""
    group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
    on_device = group.get("fused") or group.get("capturable")
    state = {"step": step.to(device=p.device if on_device else "cpu", dtype=step.dtype, copy=True)}
    for m, value in moments.items():
        state[m] = torch.zeros_like(p, memory_format=torch.preserve_format)
        _assign(state[m], value)
    return state
