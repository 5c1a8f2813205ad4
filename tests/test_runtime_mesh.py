"""The mesh: tp innermost, pp outermost; every group gives up after the job's timeout instead of hanging."""

from __future__ import annotations

import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardwise.parallel import build_mesh, coordinates, init_distributed

SHAPES = [(1, 2, 2), (2, 2, 1), (2, 1, 2), (4, 1, 1)]


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="4")
    torch.set_num_threads(1)
    init_distributed("gloo", 60)
    found = {}
    try:
        for pp, dp, tp in SHAPES:
            mesh = build_mesh(pp, dp, tp, backend="gloo", timeout_s=60)
            c = coordinates(mesh)
            found[(pp, dp, tp)] = (c["pp"], c["dp"], c["tp"], sorted(dist.get_process_group_ranks(mesh["tp"].get_group())))
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
    finally:
        dist.destroy_process_group()


def test_rank_order_and_timeouts(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tmp_path)), nprocs=4)
    for rank in range(4):
        found = torch.load(tmp_path / f"{rank}.pt", weights_only=False)
        for pp, dp, tp in SHAPES:
            p, d, t, tp_group = found[(pp, dp, tp)]
            assert (p * dp + d) * tp + t == rank  # global rank = (pp_rank * dp + dp_rank) * tp + tp_rank
            first = rank - t
            assert tp_group == list(range(first, first + tp))  # tp ranks are neighbours
        if rank % 2 == 0:
            assert found["timeout"] is not None and found["timeout"] < 3
