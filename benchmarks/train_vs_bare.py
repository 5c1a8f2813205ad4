"""End to end: `shardwise train`'s own step against a bare PyTorch loop of the same layout, in one run.

    python benchmarks/train_vs_bare.py [--layouts dp,1f1b,tp] [--model tiny] [--batch 8] [--seq-len 32]
                                       [--rounds 30] [--steps 5] [--json]

World 2 on gloo (CPU, fp32), the tiny model (h64, 4 layers) at a global batch of 8 x 32 tokens, as a new user
would try it. Per layout, two contenders on the same ranks, the same model and the same data:
  shardwise  train's loop (`train.TrainLoop`): data, forward/backward (DDP, the pipeline executor or
             shardwise TP), the global-norm clip, the LR schedule, AdamW, the loss reduction, the record of
             every step written to a metrics file (rank 0) — everything `shardwise train` does per step;
  bare       the loop a PyTorch user writes for that layout: zero_grad, forward + loss, backward, AdamW, on
             the same data — DP: DistributedDataParallel (buffers not broadcast, as ours); 1F1B:
             torch.distributed.pipelining's Schedule1F1B over the same stage modules; TP: DTensor's
             parallelize_module with torchtitan's plan and loss_parallel. No clipping, no logging.
Each round runs `--steps` steps of every contender back to back (in a rotating order, after a barrier);
a round's time per step is its slowest rank's. Reported: the median over rounds of each, and the median
of the per-round ratios (goal <= 1.1), with the 1-minute load average before and after; beside them the
CPU time per step of the busier rank (all its threads), which other jobs on a shared machine do not
inflate. On a shared machine absolute times are inflated; the ratios are the figures to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # runtime_vs_torch: the DTensor TP contender

from shardwise import data  # noqa: E402
from _ranks import ranks_json  # noqa: E402
from shardwise.model import Transformer  # noqa: E402
from shardwise.parallel import build_mesh  # noqa: E402
from shardwise.specs import Layout, load_model  # noqa: E402
from shardwise.train import TrainConfig, TrainLoop, build_runtime, lr_at  # noqa: E402

GOAL = 1.1


def layouts(args) -> dict[str, Layout]:
    per_rank = args.batch // 2
    return {"dp": Layout(dp=2, micro_batch=per_rank),  # `train --dp 2`: one micro-batch per rank
            "1f1b": Layout(pp=2, micro_batch=args.batch // args.microbatches, schedule="1f1b"),
            "tp": Layout(tp=2, micro_batch=args.batch)}


def _adamw(params, cfg: TrainConfig):
    return torch.optim.AdamW(params, lr=lr_at(cfg, 1), betas=(0.9, 0.95), eps=1e-8, weight_decay=cfg.weight_decay)


def _batches(cfg: TrainConfig, dp: int, rank: int, micro_batch: int):
    """Step s's micro-batches of this dp rank: the very batches train's loop reads."""
    return lambda s: data.local_microbatches(cfg.seed, s, cfg.global_batch, cfg.seq_len, dp, rank, micro_batch)


def bare_dp(cfg: TrainConfig, rank: int):
    model = torch.nn.parallel.DistributedDataParallel(Transformer(cfg.spec, seed=cfg.seed), forward_sync_buffers=False)
    opt, batches = _adamw(model.parameters(), cfg), _batches(cfg, 2, rank, cfg.layout.micro_batch)

    def step(s):
        ((x, y),) = batches(s)
        opt.zero_grad(set_to_none=True)
        model(x, y).backward()
        opt.step()
    return step


def bare_1f1b(cfg: TrainConfig, rank: int):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from shardwise.parallel.pipeline_step import build_stage_chunks

    (chunk,) = build_stage_chunks(cfg.spec, 2, 1, rank, seed=cfg.seed, seq_len=cfg.seq_len)
    m = cfg.layout.num_microbatches(cfg.global_batch)
    schedule = Schedule1F1B(PipelineStage(chunk, rank, 2, torch.device("cpu")), m,
                            loss_fn=lambda logits, y: F.cross_entropy(logits.flatten(0, -2).float(), y.flatten()))
    opt, batches = _adamw(chunk.parameters(), cfg), _batches(cfg, 1, 0, cfg.global_batch)

    def step(s):
        ((x, y),) = batches(s)
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(x, return_outputs=False)
        else:
            schedule.step(target=y, losses=[], return_outputs=False)
        opt.step()
    return step


def bare_tp(cfg: TrainConfig, rank: int):
    from torch.distributed.tensor.parallel import loss_parallel

    from runtime_vs_torch import dtensor_tp

    model = dtensor_tp(cfg.spec, build_mesh(1, 1, 2, backend="gloo", timeout_s=cfg.timeout_s))
    opt, batches = _adamw(model.parameters(), cfg), _batches(cfg, 1, 0, cfg.global_batch)

    def step(s):
        ((x, y),) = batches(s)
        opt.zero_grad(set_to_none=True)
        with loss_parallel():
            model(x, y).backward()
        opt.step()
    return step


BARE = {"dp": bare_dp, "1f1b": bare_1f1b, "tp": bare_tp}


def shardwise_loop(cfg: TrainConfig, sink):
    lay = cfg.layout
    loop = TrainLoop(build_runtime(cfg, build_mesh(lay.pp, lay.dp, lay.tp, backend="gloo", timeout_s=cfg.timeout_s)),
                     last=cfg.steps, sink=sink)
    return lambda steps: loop.run(steps)


def _slowest(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def bench_layout(name: str, args, rank: int, sink) -> dict:
    cfg = TrainConfig(load_model(args.model), layouts(args)[name], steps=10**6, global_batch=args.batch,
                      seq_len=args.seq_len, progress=False, timeout_s=300)
    ours, bare = shardwise_loop(cfg, sink), BARE[name](cfg, rank)
    step = {"bare": 0}

    def run_bare(n):
        for _ in range(n):
            step["bare"] += 1
            bare(step["bare"])

    contenders = {"shardwise": ours, "bare": run_bare}
    for run in contenders.values():  # warm-up
        run(args.warmup)
    times, cpu = {k: [] for k in contenders}, {k: [] for k in contenders}
    for r in range(args.rounds):
        for i in range(len(contenders)):
            key = list(contenders)[(r + i) % len(contenders)]  # rotate so drift hits both alike
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            contenders[key](args.steps)
            times[key].append(_slowest((time.perf_counter() - t0) / args.steps))
            cpu[key].append(_slowest((time.process_time() - c0) / args.steps))
    ratios = [a / b for a, b in zip(times["shardwise"], times["bare"])]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return {"layout": name, "shardwise_step_s": statistics.median(times["shardwise"]),
            "bare_step_s": statistics.median(times["bare"]), "ratio": statistics.median(ratios), "ratio_iqr": [q1, q3],
            # CPU seconds per step of the busier rank (all its threads): what load on a shared machine cannot inflate
            "shardwise_cpu_s": statistics.median(cpu["shardwise"]), "bare_cpu_s": statistics.median(cpu["bare"])}


def _worker(rank, world, args, out_path):
    with tempfile.TemporaryDirectory() as tmp:
        sink = open(os.path.join(tmp, "metrics.jsonl"), "w") if rank == 0 else None  # what --metrics-file writes
        results = [bench_layout(name, args, rank, sink) for name in args.layouts.split(",")]
        if sink:
            sink.close()
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))


def table(results: list[dict]) -> str:
    rows = ["| layout | shardwise train step | bare torch loop | ratio (paired IQR) | goal | CPU per step: shardwise / bare |",
            "|---|---:|---:|---|---|---|"]
    bare_name = {"dp": "DDP", "1f1b": "torch pipelining Schedule1F1B", "tp": "DTensor TP"}
    for r in results:
        rows.append(f"| {r['layout']} | {r['shardwise_step_s'] * 1e3:.1f} ms | {r['bare_step_s'] * 1e3:.1f} ms "
                    f"({bare_name[r['layout']]}) | {r['ratio']:.2f}x ({r['ratio_iqr'][0]:.2f}-{r['ratio_iqr'][1]:.2f}) "
                    f"| {'met' if r['ratio'] <= GOAL else 'not met'} (<= {GOAL}) | {r['shardwise_cpu_s'] * 1e3:.1f} / "
                    f"{r['bare_cpu_s'] * 1e3:.1f} ms ({r['shardwise_cpu_s'] / r['bare_cpu_s']:.2f}x) |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", default="dp,1f1b,tp", help="comma-separated: dp, 1f1b, tp")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--batch", type=int, default=8, help="global batch (sequences per step)")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=4, help="pipeline micro-batches per step")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=5, help="steps per contender and round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    load = [os.getloadavg()[0]]
    results = ranks_json(_worker, 2, args, timeout_s=300)
    load.append(os.getloadavg()[0])
    if args.json:
        print(json.dumps({"config": vars(args), "load_average_1min": load, "rows": results}, indent=2))
        return 0
    print(f"world 2, gloo, {args.model}, batch {args.batch} x {args.seq_len}, median of {args.rounds} rounds of "
          f"{args.steps} steps per contender; load average (1 min) {load[0]:.1f} before, {load[1]:.1f} after\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
