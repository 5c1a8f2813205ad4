"""One DeviceMesh with named dimensions ("pp", "dp", "cp", "tp"); tp innermost, then cp (Megatron's order).

global rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank, so the tp ranks of a group are
neighbours (the same node when tp <= GPUs per node), the cp ranks next (their K/V traffic on the same node
while cp * tp <= GPUs per node) and pipeline stages are the outermost split.
With cp > 1, dp and cp are also flattened into "dp_cp": gradients are averaged and ZeRO shards over every
replica of the weights, which is dp * cp ranks (`data_dim`).
Every process group of the runtime is `mesh[dim].get_group()` (or the flattened "dp_cp"), except `edge_group`
(a tied embedding's two copies), which is cut from the same mesh's rank grid; nothing else keeps rank lists.
Every group carries the job's timeout, so a lost peer raises instead of hanging.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

DIMS = ("pp", "dp", "cp", "tp")


def init_distributed(backend: str, timeout_s: float) -> None:
    """Join the job's default process group from torchrun's environment (RANK, WORLD_SIZE, MASTER_*)."""
    if dist.is_initialized():
        return
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    store = _restarted_job_store(timeout_s)
    if store is None:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    else:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), store=store,
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def collective_device() -> torch.device:
    """Where a tensor for a collective over the default group must live: NCCL moves CUDA tensors only (gloo takes
    CPU ones: a CPU tensor passes every test here and fails on GPUs)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _restarted_job_store(timeout_s: float):
    """torchrun's agent keeps one TCPStore for every attempt of a job, without a per-attempt prefix; the ranks of
    a restarted job would read the addresses the dead attempt published there and gloo would connect to closed
    ports. Give each restart its own key space (None on the first attempt: the default rendezvous)."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    tcp = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                        timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(f"/shardwise/attempt_{attempt}", tcp)


def _group_options(backend: str, timeout_s: float):
    """DeviceMesh gives sub-groups the backend's default timeout (30 min) unless options carry one."""
    opts = dist.ProcessGroupNCCL.Options() if backend == "nccl" else dist.ProcessGroupGloo._Options()
    opts._timeout = timedelta(seconds=timeout_s)
    return opts


def build_mesh(pp: int, dp: int, tp: int, *, cp: int = 1, backend: str | None = None,
               timeout_s: float = 300.0, pool: dict | None = None) -> DeviceMesh:
    """The (pp, dp, cp, tp) mesh over all ranks of the default group. Collective: every rank calls it.
    `pool` ({ranks: group}): take each dimension's group from it (adding the missing ones), so meshes built from one
    pool share every group of the same ranks — `validate`'s many layouts in one job hold the groups of about one mesh
    (on a CPU each idle gloo group is a thread waking 100 times a second: validate.measure.mesh_split)."""
    backend = backend or dist.get_backend()
    device_type = "cuda" if backend == "nccl" else "cpu"
    opts = _group_options(backend, timeout_s)
    if pool is None:
        mesh = init_device_mesh(device_type, (pp, dp, cp, tp), mesh_dim_names=DIMS,
                                backend_override={d: (backend, opts) for d in DIMS})
    else:
        mesh = _pooled_mesh(device_type, (pp, dp, cp, tp), backend, timeout_s, pool)
    if cp > 1:  # kept on the mesh: torch asks callers to hold flattened meshes themselves
        mesh.shardwise_flat = {"dp_cp": mesh["dp", "cp"]._flatten("dp_cp", backend_override=(backend, opts))}
    mesh.shardwise_group_options = (backend, timeout_s)  # for the expert and sequence views below
    return mesh


def _pooled_mesh(device_type: str, shape: tuple, backend: str, timeout_s: float, pool: dict) -> DeviceMesh:
    """The mesh of `shape` (DIMS' order) from `pool`'s groups by rank set, creating the missing ones: every rank
    walks every line of every dimension in the same order (new_group is collective over the default group)."""
    grid = torch.arange(dist.get_world_size()).reshape(shape)
    rank, groups = dist.get_rank(), []
    for dim, n in enumerate(shape):
        mine = None
        for ranks in grid.movedim(dim, -1).reshape(-1, n).tolist():
            if tuple(ranks) not in pool:
                pool[tuple(ranks)] = dist.new_group(ranks, backend=backend, timeout=timedelta(seconds=timeout_s))
            mine = pool[tuple(ranks)] if rank in ranks else mine
        groups.append(mine)
    return DeviceMesh.from_group(groups, device_type, mesh=grid, mesh_dim_names=DIMS)


def moved(mesh: DeviceMesh, src: str, dst: str) -> DeviceMesh:
    """The same ranks with `mesh`'s `src` group as dimension `dst` (every other dimension of size 1, as in `mesh`),
    from `mesh`'s own groups: no process group is made, so no gloo thread (calibrate times a tensor-parallel model
    beside the data-parallel mesh a `train` job holds)."""
    assert all(size(mesh, d) == 1 for d in DIMS if d != src), "only a mesh with one split dimension moves"
    one = next(submesh(mesh, d).get_group() for d in DIMS if d != src)  # this rank alone
    groups = [submesh(mesh, src).get_group() if d == dst else one for d in DIMS]
    grid = torch.arange(dist.get_world_size()).reshape([size(mesh, src) if d == dst else 1 for d in DIMS])
    out = DeviceMesh.from_group(groups, mesh.device_type, mesh=grid, mesh_dim_names=DIMS)
    out.shardwise_group_options = mesh.shardwise_group_options
    return out


def data_dim(mesh: DeviceMesh | None) -> str:
    """The dimension gradients are averaged and ZeRO-sharded over: "dp", or "dp_cp" with context
    parallelism (every cp rank holds the same weights and computes part of the same sequences' gradient)."""
    return "dp_cp" if size(mesh, "cp") > 1 else "dp"


def submesh(mesh: DeviceMesh, dim: str) -> DeviceMesh:
    """The 1-D mesh of `dim`: one of DIMS, or a flattened one ("dp_cp"). Kept on the mesh after the first
    look-up: `DeviceMesh.__getitem__` builds a new sub-mesh each call (0.3-2 ms on a CPU), and the training
    step asks for its groups and coordinates every step."""
    cache = mesh.__dict__.setdefault("shardwise_submeshes", {})
    if dim not in cache:
        flat = getattr(mesh, "shardwise_flat", {})
        cache[dim] = flat[dim] if dim in flat else mesh[dim]
    return cache[dim]


def data_mesh(mesh: DeviceMesh | None) -> DeviceMesh | None:
    """The 1-D mesh of `data_dim` (None for a single process)."""
    return None if mesh is None else submesh(mesh, data_dim(mesh))


def sequence_group(mesh: DeviceMesh | None):
    """The ranks that hold parts of the same sequences (cp, and tp when a MoE layer gives each tp rank 1/tp of
    the tokens), flattened; None when that is one rank. Collective the first time."""
    dims = tuple(d for d in ("cp", "tp") if size(mesh, d) > 1)
    if len(dims) < 2:
        return group(mesh, dims[0]) if dims else None
    flat = mesh.__dict__.setdefault("shardwise_flat", {})
    if "cp_tp" not in flat:
        backend, timeout_s = mesh.shardwise_group_options
        flat["cp_tp"] = mesh["cp", "tp"]._flatten("cp_tp", backend_override=(backend, _group_options(backend, timeout_s)))
    return flat["cp_tp"].get_group()


EXPERT_DIMS = ("edp", "ep", "etp")


def expert_mesh(mesh: DeviceMesh, ep: int, etp: int) -> DeviceMesh:
    """The experts' view of the same ranks (Megatron-Core's MoE parallel folding): within one pipeline
    stage, the ranks in dense order (dp, [cp,] tp — tp fastest) are regrouped as (edp, ep, etp), etp fastest.
    So an ep group is ep * etp consecutive ranks apart by etp: it spans tp first, then dp. Built once per
    (mesh, ep, etp) by flattening the stage's dims and unflattening them (DeviceMesh._flatten/_unflatten):
    the groups are DeviceMesh groups of the same root mesh, with the job's timeout. Collective."""
    cache = mesh.__dict__.setdefault("shardwise_expert_meshes", {})
    if (ep, etp) not in cache:
        backend, timeout_s = getattr(mesh, "shardwise_group_options", (dist.get_backend(), 300.0))
        override = (backend, _group_options(backend, timeout_s))
        dims = tuple(d for d in mesh.mesh_dim_names if d != "pp")
        flat = mesh[dims]._flatten("_".join(dims), backend_override=override) if len(dims) > 1 else mesh[dims[0]]
        shape = (flat.size() // (ep * etp), ep, etp)
        cache[(ep, etp)] = flat._unflatten(0, shape, EXPERT_DIMS, backend_override={d: override for d in EXPERT_DIMS})
    return cache[(ep, etp)]


def coordinates(mesh: DeviceMesh | None) -> dict[str, int]:
    """This rank's (pp, dp, cp, tp) position; all zeros for a single process."""
    if mesh is None:
        return {d: 0 for d in DIMS}
    return {d: submesh(mesh, d).get_local_rank() for d in DIMS}


def size(mesh: DeviceMesh | None, dim: str) -> int:
    return 1 if mesh is None else submesh(mesh, dim).size()


def group(mesh: DeviceMesh | None, dim: str):
    """The process group of `dim`, or None when there is nothing to talk to (single process, size 1)."""
    return None if size(mesh, dim) == 1 else submesh(mesh, dim).get_group()


def edge_group(mesh: DeviceMesh, timeout_s: float):
    """The group of the first and the last pipeline stage of this rank's (dp, cp, tp) coordinate (Megatron's
    embedding group: a tied embedding's two copies). A mesh dimension cannot hold two non-adjacent pp
    ranks, so the groups are cut from the mesh's own rank grid. Collective: every rank creates every
    group, in the same order; returns this rank's, or None on a middle stage."""
    grid = mesh.mesh.reshape(mesh.size(0), -1)  # pp first; one column per coordinate of the other dims
    mine = None
    for column in grid.T.tolist():
        ranks = sorted({column[0], column[-1]})
        g = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s))
        if dist.get_rank() in ranks:
            mine = g
    return mine
