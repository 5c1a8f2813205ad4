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


def train_loops(spec, layouts, world: int, global_batch: int = 8, seq_len: int = 64):
    """validate.measure.run_rank's build: `train`'s loop for each layout on pooled meshes (one per split), warmed up
    two steps. Returns (the loops, the meshes by split)."""
    from shardwise.parallel import build_mesh
    from shardwise.train import TrainConfig, TrainLoop, build_runtime, train_step
    from shardwise.validate.measure import mesh_split

    loops, meshes, groups = [], {}, {}
    for lay in layouts:
        cfg = TrainConfig(spec=spec, layout=lay, steps=10**6, global_batch=global_batch, seq_len=seq_len,
                          backend="gloo", progress=False)
        split = mesh_split(lay)
        if split not in meshes:
            meshes[split] = build_mesh(*split[:3], cp=split[3], backend="gloo", pool=groups)
        rt = build_runtime(cfg, meshes[split])
        for _ in range(2):
            train_step(rt)
        loops.append(TrainLoop(rt, last=10**6))
    return loops, meshes


def add_rank_args(ap: argparse.ArgumentParser, repeats: int) -> None:
    """The flags every two-rank timing benchmark takes: repeats, threads and backend of its ranks, --json."""
    ap.add_argument("--repeats", type=int, default=repeats, help="timed steps per contender (interleaved)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--json", action="store_true")


def add_pipeline_args(ap: argparse.ArgumentParser, layouts: str) -> None:
    """The flags of the two-rank pipeline diagnostics (pipeline_lockstep.py, pipeline_woken.py)."""
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--layouts", default=layouts)
    ap.add_argument("--dedicated", action="store_true", help="the real-time FIFO scheduler, for a few minutes only")
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
