"""What a pipeline rank's actions cost beside their exchanges, world 2 (times, not tests).

    python benchmarks/pipeline_woken.py [--model tiny] [--steps 40] [--layouts pp2,pp2:v2,...] [--dedicated] [--json]

Builds `shardwise train`'s step for each pipeline layout in one job of two gloo ranks (as `validate` does) and runs
each in two ways, in rounds of 5 steps in a new order: as it is ("real"), and with the executor's exchanges replaced
by a local stand-in that fills each receive buffer and sends nothing ("local": every action back to back, both ranks
computing, nobody waiting). From the executor's records (each action's and each waited exchange's start and end):

- each action's time, real against local, by how long the exchange before it took (the rank's wait + the
  transfer): what a rank that waited for its neighbour loses once woken;
- the replays of the executor's own program (`schedules.p2p.program_makespan`) with the local mean action times —
  the compute a planner with exact costs would be given — and (a) no exchange cost, (b) the exchange line
  calibrate measures (the executor's exchange after a layer and after a two-layer stage, both ranks in lockstep),
  (c) that line + the wait penalty calibrate measures (the same two computes taken in turns: Profile.wait_penalty_points),
  both timed in the same job after the steps (calibrate.comm.call_workloads), against the real spans.

--dedicated: the real-time FIFO scheduler (Linux, root), as benchmarks/validate_accuracy.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

from _ranks import add_pipeline_args, train_loops

from shardwise.specs import load_model

LAYOUTS = "pp2,pp2:v2,pp2:gpipe,pp2:naive,pp2:zb-h1,pp2:full"
BINS = (0.0, 1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3, float("inf"))  # the exchange before an action took (s)


class LocalP2P:
    """The executor's p2p with no peer: receives get a fixed random activation, sends go nowhere."""

    def __init__(self):
        self.fill = None

    def post(self, sends, recvs, group) -> list:
        import torch

        for t, _, _ in recvs:
            if self.fill is None or self.fill.shape != t.shape:
                self.fill = torch.randn(t.shape)
            t.copy_(self.fill)
        return []


def _calls(spec, rank: int, world: int, repeats: int = 10) -> dict:
    """calibrate's pipeline workloads in the same job: the lockstep exchange line and the handoffs' wait penalty."""
    from shardwise.calibrate.config import CalibrateConfig
    from shardwise.calibrate.comm import call_workloads
    from shardwise.calibrate.timer import Timer, paired

    t = Timer(CalibrateConfig(model=spec, world=world, seq_len=64, repeats=repeats, warmup=2), rank, world)
    fns, _ = call_workloads(t)
    names = ("layer", "exchange", "stage", "stage exchange", "layer handoff", "stage handoff")
    reps = {k: [] for k in names}
    for r in range(3):
        for k, v in t.interleaved({k: fns[k] for k in names}, repeats, seed=r, barrier_each=True).items():
            reps[k] += v
    layer, stage = statistics.median(reps["layer"]), statistics.median(reps["stage"])
    after_layer, after_stage = paired(reps, "exchange", "layer"), paired(reps, "stage exchange", "stage")
    slope = max((after_stage - after_layer) / (stage - layer), 0.0)
    turn = {k: statistics.median(h / 2 - x for h, x in zip(reps[f"{k} handoff"], reps[x_]))
            for k, x_ in (("layer", "exchange"), ("stage", "stage exchange"))}
    return {"layer": layer, "stage": stage, "exchange_after_layer": after_layer, "exchange_after_stage": after_stage,
            "intercept": after_layer - slope * layer, "slope": slope,
            "wait_points": ((layer, max(turn["layer"], 0.0)), (stage, max(turn["stage"], 0.0)))}


def _rank(model_ref: str, layouts: list[str], steps: int) -> dict | None:
    import torch.distributed as dist

    from shardwise.validate.config import parse_layout

    spec, world = load_model(model_ref), dist.get_world_size()
    loops, _ = train_loops(spec, [parse_layout(name, world) for name in layouts], world)
    real = [loop.rt.forward_backward.executor.p2p for loop in loops]
    local = LocalP2P()
    jobs = [(i, v) for i in range(len(loops)) for v in ("real", "local")]
    recs = {j: [] for j in jobs}
    order = random.Random(0)
    for _ in range(max(1, steps // 5)):
        for j in order.sample(jobs, len(jobs)):
            ex = loops[j[0]].rt.forward_backward.executor
            ex.p2p = real[j[0]] if j[1] == "real" else local
            dist.barrier()
            for _ in range(5):
                loops[j[0]].step()
                recs[j].append(list(ex.records))
            loops[j[0]].flush()
            ex.p2p = real[j[0]]
    calls = _calls(spec, dist.get_rank(), world)
    gathered = [None] * world
    dist.all_gather_object(gathered, recs)
    if dist.get_rank() != 0:
        return None
    return {name: _analyse(loops[i].rt.forward_backward.executor.schedule, [g[(i, "real")] for g in gathered],
                           [g[(i, "local")] for g in gathered], calls) for i, name in enumerate(layouts)} | \
        {"calls_ms": {k: (1e3 * v if isinstance(v, float) and k != "slope" else v) for k, v in calls.items()
                      if k != "wait_points"} | {"wait_points_s": calls["wait_points"]}}


def _analyse(schedule, real: list, local: list, calls: dict) -> dict:
    from shardwise.schedules.p2p import Exchange, p2p_program, program_makespan

    programs = p2p_program(schedule)
    world = len(real)

    def means(per_rank):
        d = {}
        for events in (e for steps in per_rank for step in steps for e in step):
            if events.kind not in ("send", "recv"):
                d.setdefault((events.rank, events.kind, events.microbatch, events.chunk), []).append(events.end - events.start)
        return {k: statistics.mean(v) for k, v in d.items()}
    lm = means(local)
    spans = [max(e.end for r in range(world) for e in real[r][s]) - min(e.start for r in range(world) for e in real[r][s])
             for s in range(len(real[0]))]
    span = statistics.median(spans)

    def replay(exchange=0.0, slope=0.0, waits=()):
        return program_makespan(schedule, programs, lambda r, a: lm[(r, a.kind, a.microbatch, a.chunk)], 0.0, 0.0,
                                exchange, slope, waits)
    out = {"real_span_ms": 1e3 * span,
           "local_busy_per_microbatch_ms": [1e3 * sum(v for k, v in lm.items() if k[0] == r) / schedule.m
                                            for r in range(world)],
           "replay_local_ms": {"no exchange cost": 1e3 * replay(),
                               "lockstep exchange line": 1e3 * replay(calls["intercept"], calls["slope"]),
                               "+ wait penalty": 1e3 * replay(calls["intercept"], calls["slope"], calls["wait_points"])}}
    # Each action's excess over its local mean, by the waited exchange just before it on the same rank.
    by_bin = {}
    for r in range(world):
        waited = [x for x in programs[r] if isinstance(x, Exchange) and x.wait]
        for step in real[r]:
            assert len([e for e in step if e.kind in ("send", "recv")]) == len(waited)
            for a, b in zip(step, step[1:]):
                if a.kind in ("send", "recv") and b.kind not in ("send", "recv"):
                    took = a.end - a.start
                    lo = max(x for x in BINS if x <= took)
                    by_bin.setdefault(lo, []).append(b.end - b.start - lm[(b.rank, b.kind, b.microbatch, b.chunk)])
    out["action_excess_by_exchange_before_ms"] = {
        f"{1e3 * lo:.1f}-{1e3 * BINS[BINS.index(lo) + 1]:.1f}": [round(1e3 * statistics.median(v), 3), len(v)]
        for lo, v in sorted(by_bin.items())}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pipeline_args(ap, LAYOUTS)
    args = ap.parse_args(argv)
    if args.dedicated:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    from shardwise.launch import run_ranks

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.time()
    out = run_ranks(_rank, args.model, args.layouts.split(","), args.steps, world=2, backend="gloo")[0]
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    calls = out.pop("calls_ms")
    print(f"same job, ms: exchange after a {calls['layer']:.2f} ms layer {calls['exchange_after_layer']:.3f}, after a "
          f"{calls['stage']:.2f} ms stage {calls['exchange_after_stage']:.3f}; wait penalty points (wait, penalty) "
          + ", ".join(f"({1e3 * w:.2f}, {1e3 * p:.3f})" for w, p in calls["wait_points_s"]) + f"; {time.time() - t0:.0f} s")
    for name, r in out.items():
        reps = ", ".join(f"{k} {v:.1f} ({100 * (v / r['real_span_ms'] - 1):+.0f} %)" for k, v in r["replay_local_ms"].items())
        print(f"{name:10s} real span {r['real_span_ms']:.1f} ms; local busy per micro-batch "
              f"{' / '.join(f'{x:.2f}' for x in r['local_busy_per_microbatch_ms'])} ms; replays of the local action times: {reps}")
        print(f"{'':10s} action excess over local (median ms, n) by the exchange before it (ms): "
              + ", ".join(f"{k}: {v[0]:+.3f} ({v[1]})" for k, v in r["action_excess_by_exchange_before_ms"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
