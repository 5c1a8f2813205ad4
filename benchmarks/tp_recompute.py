"""What recompute costs a tensor-parallel layer, against the same layer without TP, world 2 (times, not tests).

    python benchmarks/tp_recompute.py [--model tiny] [--repeats 10] [--seq-len 64] [--layers 1] [--dedicated]

One middle layer of the model (--layers of them in one chunk) on --seq-len tokens (one sequence), forward + backward, plain, with its attention core
checkpointed (selective) and checkpointed whole (full), each without TP (every rank its own copy) and tensor-parallel
over both ranks (parallel.tensor_parallel on the data-parallel group of calibrate's one mesh), and the layer's
forward alone (no_grad) both ways; calibrate's timing (Timer.interleaved, a barrier before each workload, three rounds).
Printed (ms per chunk and sequence): each time, recompute's cost (variant - plain, paired repeat by repeat) and
full recompute's cost beyond the forward it runs again (full - plain - forward).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys


def _rank(model_ref: str, repeats: int, seq_len: int, layers: int = 1) -> dict | None:
    import torch
    import torch.distributed as dist

    from shardwise.calibrate.config import CalibrateConfig
    from shardwise.calibrate.timer import Timer, paired
    from shardwise.model import Transformer
    from shardwise.parallel.tensor_parallel import tensor_parallel
    from shardwise.specs import load_model

    spec, rank, world = load_model(model_ref), dist.get_rank(), dist.get_world_size()
    t = Timer(CalibrateConfig(model=spec, world=world, seq_len=seq_len, repeats=repeats, warmup=2), rank, world)
    every = t.mesh()["dp"]  # both ranks: a 1-D mesh of the calibration's own group, used as the TP dimension
    x = torch.randn(1, seq_len, spec.hidden)
    grad = torch.randn_like(x)
    fns = {}
    for tp in ("one", "tp"):
        for mode in ("none", "selective", "full"):
            layer = Transformer(spec, seed=0, layer_ids=range(layers), first=False, last=False)
            layer = tensor_parallel(layer, every).module if tp == "tp" else layer
            layer.set_recompute(mode)

            def run(layer=layer):
                inp = x.clone().requires_grad_(True)
                torch.autograd.backward(layer(inp, None), grad)
            fns[f"{tp} {mode}"] = run
            if mode == "none":
                def forward(layer=layer):
                    with torch.no_grad():
                        layer(x, None)
                fns[f"{tp} forward"] = forward
    reps = {k: [] for k in fns}
    for r in range(3):
        for k, v in t.interleaved(fns, repeats, seed=r, barrier_each=True).items():
            reps[k] += v
    out = {k: 1e3 * statistics.median(v) for k, v in reps.items()}
    for tp in ("one", "tp"):
        for mode in ("selective", "full"):
            out[f"{tp} {mode} - none"] = 1e3 * paired(reps, f"{tp} {mode}", f"{tp} none")
        out[f"{tp} full - none - forward"] = out[f"{tp} full - none"] - out[f"{tp} forward"]
    return out if rank == 0 else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--layers", type=int, default=1, help="middle layers in the timed chunk (times are per chunk)")
    ap.add_argument("--dedicated", action="store_true", help="the real-time FIFO scheduler, for a few minutes only")
    args = ap.parse_args(argv)
    if args.dedicated:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from shardwise.launch import run_ranks

    out = run_ranks(_rank, args.model, args.repeats, args.seq_len, args.layers, world=2, backend="gloo")[0]
    for tp, label in (("one", "without TP"), ("tp", "TP over 2 ranks")):
        print(f"{label:16s} " + ", ".join(f"{k.split(' ', 1)[1]} {v:.2f}" for k, v in out.items() if k.startswith(tp + " ")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
