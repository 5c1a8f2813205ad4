"""What each of `world` gloo ranks measures, brought back to the test: for the tests that measure torch itself on
several ranks (torch.distributed.pipelining's buffers, a DTensor plan's saved tensors)."""

from __future__ import annotations

import json

import torch.distributed as dist

from shardwise.launch import spawn_ranks


def _gather(rank, world, measure, out, args):
    objs = [None] * world
    dist.all_gather_object(objs, measure(rank, world, *args))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(objs, f)


def measured_on_ranks(measure, world: int, folder, *args, timeout_s: float = 120) -> list:
    """measure(rank, world, *args) -> a JSON-able value on each of `world` ranks; the values in rank order (written
    to a file in `folder` by rank 0)."""
    out = folder / "measured.json"
    spawn_ranks(_gather, world, measure, str(out), args, timeout_s=timeout_s)
    return json.loads(out.read_text())
