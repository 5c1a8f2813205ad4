"""What context parallelism's attention costs inside a training step, world 2 (times, not tests).

    python benchmarks/cp_attention_share.py [--model tiny] [--rounds 8] [--dedicated]

Builds, in one job of two gloo ranks as `validate` does (one mesh per split, pooled groups), `shardwise train`'s
step for cp2 ring, cp2 ring with every layer's attention swapped for the plain causal attention over the rank's own
tokens (wrong maths, the same shapes: the step without the context-parallel attention), cp2 all-gather and dp2; times
them in `rounds` rounds of 5 steps in a new order each round (validate's timing: each step as long as the slower rank)
and prints each layout's median step. (cp2 - cp2 with the plain attention) / (layers x micro-batches) is what one
layer's context-parallel attention costs in a step beyond the plain one — the figure `calibrate`'s
context-parallel measurement stands for (docs/accuracy.md, "Context parallelism's attention").
--dedicated: the real-time FIFO scheduler (Linux, root), as benchmarks/validate_accuracy.py's.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys

from shardwise.specs import load_model

LAYOUTS = ("cp2", "cp2+plain", "cp2:allgather", "dp2")


def _rank(model_ref: str, rounds: int) -> dict | None:
    import torch.distributed as dist

    from shardwise.model import causal_attention
    from shardwise.parallel import build_mesh
    from shardwise.train import TrainConfig, TrainLoop, build_runtime, train_step
    from shardwise.validate.config import parse_layout
    from shardwise.validate.measure import _slowest, _timed_steps, mesh_split

    spec, world = load_model(model_ref), dist.get_world_size()
    loops, meshes, groups = [], {}, {}
    for name in LAYOUTS:
        lay = parse_layout(name.removesuffix("+plain"), world)
        cfg = TrainConfig(spec=spec, layout=lay, steps=10**6, global_batch=8, seq_len=64, backend="gloo", progress=False)
        split = mesh_split(lay)
        if split not in meshes:
            meshes[split] = build_mesh(*split[:3], cp=split[3], backend="gloo", pool=groups)
        rt = build_runtime(cfg, meshes[split])
        if name.endswith("+plain"):
            for chunk in rt.chunks:
                for block in chunk.model.layers.values():
                    block.attention.attend = causal_attention
        for _ in range(2):
            train_step(rt)
        loops.append(TrainLoop(rt, last=10**6))
    times, order = [[] for _ in loops], random.Random(0)
    for _ in range(rounds):
        for i in order.sample(range(len(loops)), len(loops)):
            times[i] += _slowest(_timed_steps(loops[i], 5, world), world)
    return {name: statistics.median(t) for name, t in zip(LAYOUTS, times)} if dist.get_rank() == 0 else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--dedicated", action="store_true", help="the real-time FIFO scheduler, for a few minutes only")
    args = ap.parse_args(argv)
    if args.dedicated:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    from shardwise.launch import run_ranks

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = run_ranks(_rank, args.model, args.rounds, world=2, backend="gloo")[0]
    for name, seconds in out.items():
        print(f"{name:16s} {1e3 * seconds:7.1f} ms per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
