"""shardwise's pipeline executor vs torch.distributed.pipelining: same model, same split, same data.

Two gloo CPU processes (pp = 2), m micro-batches, one Llama-style model from shardwise.model cut by
`split_layers`. Each repeat runs, in a rotating order, shardwise GPipe / 1F1B (`PipelineExecutor`)
and torch's `ScheduleGPipe` / `Schedule1F1B` on a `PipelineStage` built from the very same stage
module. Reported:
  - step time (forward + backward of the m micro-batches, median over repeats after warm-up) and the
    ratio shardwise / torch (goal <= 1.0): the median over repeats of the two back-to-back steps'
    ratio, with its interquartile range;
  - CPU time per step of the busier rank (all its threads), which other jobs on a shared machine do not
    inflate, and the 1-minute load average before and after the run;
  - shardwise's measured bubble per rank (1 - busy / makespan, from the executor's records) next to the
    simulated bubble (`schedules.simulate` fed with the measured per-stage F and B and the measured
    point-to-point time of one activation).
Before timing, one step of each checks that both runtimes compute the same gradients.

    python benchmarks/pipeline_vs_torch.py [--repeats 30] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shardwise.launch import run_ranks
from shardwise.specs import load_model

SCHEDULES = ("gpipe", "1f1b")


def model_spec(args):
    return dataclasses.replace(load_model("tiny"), name="bench", hidden=args.hidden, ffn_hidden=2 * args.hidden,
                               num_layers=args.layers, num_heads=4, num_kv_heads=2, head_dim=args.hidden // 4,
                               vocab_size=args.vocab, max_positions=max(args.seq, 256))


def batches(args, spec):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, spec.vocab_size, (args.microbatches * args.micro_batch, args.seq + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_fn(logits, targets):
    """torch's schedules call this on the last stage's output; shardwise's last stage does the same inside."""
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


# --------------------------------------------------------------------------- the two runtimes


class Shardwise:
    def __init__(self, name, args, rank, chunk, spec):
        from shardwise.parallel.pipeline import PipelineExecutor
        from shardwise.schedules import build, validate

        self.executor = PipelineExecutor(validate(build(name, 2, args.microbatches, 1)), rank, [chunk], None,
                                         (args.micro_batch, args.seq, spec.hidden))

    def step(self, x, y):
        self.executor.records.clear()
        m = self.executor.schedule.m
        # t0 = 0: perf_counter is one monotonic clock for every process on a machine.
        self.executor.step(list(x.chunk(m)), list(y.chunk(m)), 0.0)

    def compute_events(self):
        return [(e.kind, e.start, e.end) for e in self.executor.records]


class Torch:
    def __init__(self, name, args, rank, chunk, spec):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        stage = PipelineStage(chunk, rank, 2, torch.device("cpu"))
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
        self.schedule = cls(stage, args.microbatches, loss_fn=loss_fn)
        self.rank = rank

    def step(self, x, y):
        if self.rank == 0:
            self.schedule.step(x, return_outputs=False)
        else:
            self.schedule.step(target=y, losses=[], return_outputs=False)

    def compute_events(self):
        return []


def p2p_seconds(args, spec, rank, rounds=20) -> float:
    """One activation's send + receive between the two ranks: half a measured round trip (median)."""
    buf = torch.zeros(args.micro_batch, args.seq, spec.hidden)
    times = []
    for _ in range(rounds):
        dist.barrier()
        t = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        times.append((time.perf_counter() - t) / 2)
    return statistics.median(times)


def _grads(chunk):
    return {n: p.grad.detach().clone() for n, p in chunk.named_parameters()}


def worker(args):
    """One of the two ranks (started by launch.run_ranks, in a gloo process group of two)."""
    from shardwise.parallel.pipeline_step import build_stage_chunks

    rank = dist.get_rank()
    spec = model_spec(args)
    chunk = build_stage_chunks(spec, 2, 1, rank, seed=1, seq_len=args.seq)[0]
    x, y = batches(args, spec)
    runners = {(lib, name): cls(name, args, rank, chunk, spec)
               for lib, cls in (("shardwise", Shardwise), ("torch", Torch)) for name in SCHEDULES}

    # Same gradients from both runtimes (one step each from zero gradients).
    grads = {}
    for key, runner in runners.items():
        chunk.zero_grad(set_to_none=True)
        runner.step(x, y)
        grads[key] = _grads(chunk)
    ref = grads[("shardwise", "gpipe")]
    grad_diff = max((g[n] - ref[n]).abs().max().item() for g in grads.values() for n in ref)

    c = p2p_seconds(args, spec, rank)
    keys = list(runners)
    times = {k: [] for k in keys}
    cpu = {k: [] for k in keys}
    events = {k: [] for k in keys}
    for rep in range(args.warmup + args.repeats):
        for i in range(len(keys)):
            key = keys[(rep + i) % len(keys)]  # rotate the order so drift hits every runtime alike
            chunk.zero_grad(set_to_none=True)
            dist.barrier()
            t, c0 = time.perf_counter(), time.process_time()
            runners[key].step(x, y)
            c = time.process_time() - c0
            dist.barrier()
            if rep >= args.warmup:
                times[key].append(time.perf_counter() - t)
                cpu[key].append(c)
                events[key].append(runners[key].compute_events())
    return {"times": times, "cpu": cpu, "events": events, "grad_diff": grad_diff, "p2p": c}


# --------------------------------------------------------------------------- analysis


COMPUTE = ("F", "B", "I", "W")


def measured_bubble(per_rank_events, kinds=COMPUTE):
    """Per repeat: 1 - busy / makespan for each rank, the makespan spanning both ranks' actions.
    With kinds=("recv",): the share of the makespan spent waiting in a receive."""
    start = min(s for ev in per_rank_events for k, s, _ in ev if k in COMPUTE)
    end = max(e for ev in per_rank_events for k, _, e in ev if k in COMPUTE)
    busy = [sum(e - s for k, s, e in ev if k in kinds) for ev in per_rank_events]
    return [b / (end - start) for b in busy] if kinds != COMPUTE else [1 - b / (end - start) for b in busy]


def analyse(name, results, args):
    from shardwise.schedules import Costs, build, simulate, validate
    from shardwise.schedules.closed_forms import bubble_fraction

    key = ("shardwise", name)
    ours = statistics.median(results[0]["times"][key])
    theirs = statistics.median(results[0]["times"][("torch", name)])
    # Each repeat times both runtimes back to back, so the ratio is the median of the per-repeat ratios:
    # on a shared machine a burst of load slows both sides of a pair, not one side of the medians.
    paired = [a / b for a, b in zip(results[0]["times"][key], results[0]["times"][("torch", name)])]
    q1, _, q3 = statistics.quantiles(paired, n=4) if len(paired) > 1 else (paired[0],) * 3
    repeats = len(results[0]["events"][key])
    bubbles = [measured_bubble([results[r]["events"][key][i] for r in (0, 1)]) for i in range(repeats)]
    measured = [statistics.median(b[r] for b in bubbles) for r in (0, 1)]
    # The executor records its blocking receives (if it does): how much of the bubble is waiting on the peer.
    waits = [measured_bubble([results[r]["events"][key][i] for r in (0, 1)], ("recv",)) for i in range(repeats)]
    recv_wait = [statistics.median(w[r] for w in waits) for r in (0, 1)]

    def median_cost(rank, kind):
        return statistics.median(e - s for ev in results[rank]["events"][key] for k, s, e in ev if k == kind)

    def busier_cpu(lib):  # per repeat the busier rank's CPU seconds, median over repeats
        return statistics.median(map(max, results[0]["cpu"][(lib, name)], results[1]["cpu"][(lib, name)]))

    f = [median_cost(r, "F") for r in (0, 1)]
    b = [median_cost(r, "B") for r in (0, 1)]
    c = statistics.median(results[r]["p2p"] for r in (0, 1))
    sim = simulate(validate(build(name, 2, args.microbatches, 1)), Costs(f=f, b=b, w=0.0, c=c))
    return {
        "schedule": name, "shardwise_step_s": ours, "torch_step_s": theirs, "ratio": statistics.median(paired),
        "paired_ratio_quartiles": [q1, q3],
        "shardwise_cpu_s": busier_cpu("shardwise"), "torch_cpu_s": busier_cpu("torch"),
        "measured_bubble_per_rank": measured, "simulated_bubble_per_rank": sim.bubble_fraction_per_rank,
        "measured_recv_wait_per_rank": recv_wait,
        "uniform_closed_form_bubble": bubble_fraction(name, 2, args.microbatches, 1),
        "forward_s_per_rank": f, "backward_s_per_rank": b, "p2p_s": c,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    os.environ["OMP_NUM_THREADS"] = "1"
    load = [os.getloadavg()[0]]
    results = dict(enumerate(run_ranks(worker, args, world=2, backend="gloo", timeout_s=120)))
    load.append(os.getloadavg()[0])
    rows = [analyse(name, results, args) for name in SCHEDULES]
    grad_diff = max(results[r]["grad_diff"] for r in (0, 1))
    config = {k: getattr(args, k) for k in ("hidden", "layers", "vocab", "seq", "micro_batch", "microbatches",
                                            "repeats", "warmup")}
    if args.json:
        print(json.dumps({"config": config, "load_average_1min": load, "max_grad_diff_vs_shardwise_gpipe": grad_diff,
                          "rows": rows}, indent=2))
        return 0
    print(f"pp 2 on gloo/CPU, {args.layers} layers, hidden {args.hidden}, seq {args.seq}, micro-batch "
          f"{args.micro_batch}, m {args.microbatches}; median of {args.repeats} steps after {args.warmup} "
          f"warm-up; gradients agree to {grad_diff:.1e}; load average {load[0]:.1f} -> {load[1]:.1f}\n")
    print("| schedule | shardwise step | torch step | ratio (paired IQR) | CPU per step, shardwise / torch | "
          "measured bubble (rank 0 / 1) | of which in recv | simulated bubble (rank 0 / 1) | uniform closed form |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mb, sb, rw = r["measured_bubble_per_rank"], r["simulated_bubble_per_rank"], r["measured_recv_wait_per_rank"]
        print(f"| {r['schedule']} | {r['shardwise_step_s'] * 1e3:.1f} ms | {r['torch_step_s'] * 1e3:.1f} ms | "
              f"{r['ratio']:.2f} ({r['paired_ratio_quartiles'][0]:.2f}–{r['paired_ratio_quartiles'][1]:.2f}) | "
              f"{r['shardwise_cpu_s'] * 1e3:.1f} / {r['torch_cpu_s'] * 1e3:.1f} ms "
              f"({r['shardwise_cpu_s'] / r['torch_cpu_s']:.2f}x) | "
              f"{mb[0]:.1%} / {mb[1]:.1%} | {rw[0]:.1%} / {rw[1]:.1%} | {sb[0]:.1%} / {sb[1]:.1%} | "
              f"{r['uniform_closed_form_bubble']:.1%} |")
    (f0, f1), (b0, b1) = rows[0]["forward_s_per_rank"], rows[0]["backward_s_per_rank"]
    print(f"\nmeasured per micro-batch (GPipe run): F {f0 * 1e3:.2f} / {f1 * 1e3:.2f} ms, B {b0 * 1e3:.2f} / "
          f"{b1 * 1e3:.2f} ms (rank 0 / 1), one activation send/recv {rows[0]['p2p_s'] * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
