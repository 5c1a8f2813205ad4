"""The benchmarks' one way to run a two-rank measurement and read back what rank 0 wrote."""

from __future__ import annotations

import json
import os
import tempfile

from shardwise.launch import spawn_ranks


def ranks_json(worker, world: int, *args, **spawn_kw):
    """worker(rank, world, *args, path) on `world` ranks (spawn_ranks' options in `spawn_kw`); the JSON at `path`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "results.json")
        spawn_ranks(worker, world, *args, path, **spawn_kw)
        with open(path) as f:
            return json.load(f)
