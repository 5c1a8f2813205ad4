"""The mesh: tp innermost, pp outermost; every group gives up after the job's timeout instead of hanging."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from shardwise.launch import spawn_ranks
from shardwise.parallel import build_mesh, coordinates

SHAPES = [(1, 2, 2), (2, 2, 1), (2, 1, 2), (4, 1, 1)]


def _worker(rank, world, out_dir):
    found = {}
    for pp, dp, tp in SHAPES:
        mesh = build_mesh(pp, dp, tp, backend="gloo", timeout_s=60)
        c = coordinates(mesh)
        found[(pp, dp, tp)] = (c["pp"], c["dp"], c["tp"], sorted(dist.get_process_group_ranks(mesh["tp"].get_group())))
    # the same meshes from one pool of groups (validate's sweep): the same coordinates and groups' ranks, and a group
    # of the same ranks is one group whichever mesh and dimension asked for it
    pool, pooled = {}, {}
    for pp, dp, tp in SHAPES:
        mesh = build_mesh(pp, dp, tp, backend="gloo", timeout_s=60, pool=pool)
        c = coordinates(mesh)
        groups = {d: mesh[d].get_group() for d in ("pp", "dp", "tp")}
        pooled[(pp, dp, tp)] = (c["pp"], c["dp"], c["tp"], sorted(dist.get_process_group_ranks(groups["tp"])))
        for g in groups.values():
            assert pool[tuple(dist.get_process_group_ranks(g))] is g
    found["pooled"] = pooled
    # every distinct rank set of the four shapes' dimensions, once, each rank creating all of them: the 4 singletons
    # (size-1 dimensions), {0,1} {2,3} (tp, or dp of 2x2x1), {0,2} {1,3} (dp of 1x2x2, pp of 2x..) and all four = 9
    found["pool size"] = len(pool)
    # a peer that never joins: the tp collective fails after the mesh's timeout (1 s), not the default 30 min
    mesh = build_mesh(1, 2, 2, backend="gloo", timeout_s=1)
    start = time.monotonic()
    if rank % 2 == 0:
        try:
            dist.all_reduce(torch.ones(1), group=mesh["tp"].get_group())
            found["timeout"] = None
        except RuntimeError:
            found["timeout"] = time.monotonic() - start
    else:
        time.sleep(3.5)
    torch.save(found, os.path.join(out_dir, f"{rank}.pt"))


def test_rank_order_and_timeouts(tmp_path):
    spawn_ranks(_worker, 4, str(tmp_path))
    for rank in range(4):
        found = torch.load(tmp_path / f"{rank}.pt", weights_only=False)
        for pp, dp, tp in SHAPES:
            p, d, t, tp_group = found[(pp, dp, tp)]
            assert (p * dp + d) * tp + t == rank  # global rank = (pp_rank * dp + dp_rank) * tp + tp_rank
            first = rank - t
            assert tp_group == list(range(first, first + tp))  # tp ranks are neighbours
        assert found["pooled"] == {shape: found[shape] for shape in SHAPES}
        assert found["pool size"] == 9
        if rank % 2 == 0:
            assert found["timeout"] is not None and found["timeout"] < 3
