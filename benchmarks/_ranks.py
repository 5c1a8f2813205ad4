"""The benchmarks' one way to run a two-rank measurement and read back what rank 0 wrote."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from shardwise.launch import spawn_ranks


def ranks_json(worker, world: int, *args, **spawn_kw):
    """worker(rank, world, *args, path) on `world` ranks (spawn_ranks' options in `spawn_kw`); the JSON at `path`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "results.json")
        spawn_ranks(worker, world, *args, path, **spawn_kw)
        with open(path) as f:
            return json.load(f)


def write_json(rank: int, path: str, result) -> None:
    """What a worker hands back to ranks_json: rank 0 writes `result` to `path` (the other ranks' are the same)."""
    if rank == 0:
        with open(path, "w") as f:
            json.dump(result, f)


def add_rank_args(ap: argparse.ArgumentParser, repeats: int) -> None:
    """The flags every two-rank timing benchmark takes: repeats, threads and backend of its ranks, --json."""
    ap.add_argument("--repeats", type=int, default=repeats, help="timed steps per contender (interleaved)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--json", action="store_true")


def run_and_print(worker, args, header, table, timeout_s: int) -> int:
    """worker on 2 ranks (add_rank_args' flags); its result as JSON, or header(result) and table(result)."""
    result = ranks_json(worker, 2, args, backend=args.backend, timeout_s=timeout_s)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(header(result))
        print(table(result))
    return 0
