"""Where a pipeline's step goes beyond its mean action times, world 2 (times, not tests).

    python benchmarks/pipeline_lockstep.py [--model tiny] [--steps 40] [--layouts pp2,pp2:gpipe,...] [--cluster P] [--dedicated]

Builds `shardwise train`'s step for each pipeline layout in one job of two gloo ranks (as `validate` does: one mesh per
split, pooled groups), runs `--steps` steps of each in rounds of 5 in a new order (validate's timing), and keeps the
executor's records of every step (`PipelineExecutor.records`: each action's start and end on each rank). Per step it
replays the executor's own point-to-point program (`schedules.p2p.program_makespan`, no transfer or wake-up cost) twice:
with each action's measured time in that step ("replay, actual"), and with each action's mean over all steps
("replay, means": what a planner fed exact mean costs computes), and with `--cluster` once more with the mean action
times and the calibration's exchanges (its send_recv table, `pipeline_exchange_s`, `lockstep_spread`, and where it
measured them `action_scatter` and `handoff_points`: the planner's exchange model on the measured actions; and again
without the last two, every waited exchange at the lockstep figure, as older calibrations are charged). Printed per
layout (medians over steps, ms): train's step time, the executor's span, the two replays, and the lockstep gap =
actual - means: what the ranks lose because each exchange waits for the slower rank's action *that time* — the
expected maximum of scattered times exceeds the maximum of their means (docs/accuracy.md, "Pipelines: an exchange
costs more after more compute").
Also each action kind's relative spread (std / mean of its times within a rank, stage and kind), the cost per exchange
at which the replays of each step's action times give the measured spans, and the calls after a layer and after a
two-layer stage (calibrate's measure_sync workloads) timed in the same job.
--dedicated: the real-time FIFO scheduler (Linux, root), as benchmarks/validate_accuracy.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys

from _ranks import add_pipeline_args, train_loops

from shardwise.specs import load_model

LAYOUTS = "pp2,pp2:gpipe,pp2:v2,pp2:zb-h1,pp2:full,pp2:naive"


def _replay(schedule, programs, dur, c: float = 0.0, exchange: float = 0.0, spread: float = 0.0,
            scatter: float = 0.0, handoff: tuple = ()) -> float:
    from shardwise.schedules.p2p import program_makespan

    return program_makespan(schedule, programs, lambda r, a: dur[(r, a.kind, a.microbatch, a.chunk)], c, 0.0,
                            exchange, spread, (), scatter, handoff)


def _implied_exchange(schedule, programs, durs, spans) -> float:
    """The cost per exchange (program_makespan's `c`, no wake-up) at which the replays with each step's actual action
    times have the measured spans' median: what the executor's exchanges cost in its steps (a diagnostic)."""
    target, lo, hi = statistics.median(spans), 0.0, 5e-3
    for _ in range(30):
        mid = (lo + hi) / 2
        if statistics.median(_replay(schedule, programs, d, mid) for d in durs) < target:
            lo = mid
        else:
            hi = mid
    return lo


def _calls(spec, rank: int, world: int, repeats: int) -> dict:
    """calibrate's call workloads and the executor's two-way exchange after the same layer, interleaved with a barrier
    before each (ms per call; the paired differences with the layer alone)."""
    import torch

    from shardwise.calibrate.config import CalibrateConfig
    from shardwise.calibrate.comm import call_workloads
    from shardwise.calibrate.timer import Timer, paired
    from shardwise.parallel.pipeline import BatchP2P

    t = Timer(CalibrateConfig(model=spec, world=world, seq_len=64, repeats=repeats, warmup=2), rank, world)
    fns, act = call_workloads(t)
    peer, p2p = rank ^ 1, BatchP2P()

    from shardwise.model import Transformer

    chunk = Transformer(spec, seed=0, layer_ids=range(2), first=False, last=False)
    x = torch.randn_like(act)

    def stage():  # a pipeline stage's forward + backward of one micro-batch (2 layers), as the executor runs F then B
        inp = x.clone().requires_grad_(True)
        torch.autograd.backward(chunk(inp, None), act)

    def swap():
        for w in p2p.post([(act, peer, 0)], [(torch.empty_like(act), peer, 0)], None):
            w.wait()

    def exchange():
        fns["layer"]()
        swap()

    def stage_exchange():
        stage()
        swap()
    fns.update(exchange=exchange, stage=stage, stage_exchange=stage_exchange)
    out = {}
    for each in (True, False):
        reps = t.interleaved(fns, repeats, barrier_each=each)
        tag = "barrier each" if each else "no barrier"
        out[tag] = {k: 1e3 * paired(reps, k, "layer") for k in ("both", "p2p", "exchange")}
        out[tag]["stage_exchange"] = 1e3 * paired(reps, "stage_exchange", "stage")
        out[tag]["layer"] = 1e3 * statistics.median(reps["layer"])
        out[tag]["stage"] = 1e3 * statistics.median(reps["stage"])
    return out


def _rank(model_ref: str, layouts: list[str], steps: int, hop: tuple = (0.0, 0.0, 0.0, 0.0, ())) -> dict | None:
    import torch.distributed as dist

    from shardwise.schedules.p2p import p2p_program
    from shardwise.validate.config import parse_layout
    from shardwise.validate.measure import _slowest

    spec, world = load_model(model_ref), dist.get_world_size()
    loops, _ = train_loops(spec, [parse_layout(name, world) for name in layouts], world)
    times, recs, order = [[] for _ in loops], [[] for _ in loops], random.Random(0)
    for _ in range(max(1, steps // 5)):
        for i in order.sample(range(len(loops)), len(loops)):
            dist.barrier()
            ex = loops[i].rt.forward_backward.executor
            first = len(loops[i].records)
            for _ in range(5):  # as TrainLoop.run(5) runs them, keeping each step's records
                loops[i].step()
                recs[i].append(list(ex.records))
            loops[i].flush()
            times[i] += _slowest([r["step_time_s"] for r in loops[i].records[first:]], world)
    calls = _calls(spec, dist.get_rank(), world, 30)
    gathered = [None] * world
    dist.all_gather_object(gathered, recs)
    if dist.get_rank() != 0:
        return None
    out = {}
    for i, name in enumerate(layouts):
        ex = loops[i].rt.forward_backward.executor
        schedule, programs = ex.schedule, p2p_program(ex.schedule)
        per_step = [[e for r in range(world) for e in gathered[r][i][s]] for s in range(len(recs[i]))]
        durs = []
        for events in per_step:
            durs.append({(e.rank, e.kind, e.microbatch, e.chunk): e.end - e.start for e in events
                         if e.kind not in ("send", "recv")})
        keys = durs[0].keys()
        means = {k: statistics.mean(d[k] for d in durs) for k in keys}
        spans = [max(e.end for e in ev) - min(e.start for e in ev) for ev in per_step]
        actual = [_replay(schedule, programs, d) for d in durs]
        mean_replay = _replay(schedule, programs, means)
        # Each action's deviation from its own mean, per (rank, kind, chunk): relative spread, and the two ranks'
        # deviations at the same program position correlated.
        rel = {}
        for k in keys:
            group = (k[0], k[1], k[3])
            rel.setdefault(group, []).extend(d[k] / means[k] - 1 for d in durs)
        spread = {f"rank{g[0]} {g[1]}{'.' + str(g[2]) if g[2] else ''}": statistics.pstdev(v) for g, v in rel.items()}
        busy = [sum(v for k, v in means.items() if k[0] == r) for r in range(world)]
        kinds = {}
        for (r, kind, _mb, _c), v in means.items():
            kinds.setdefault(f"rank{r} {kind}", []).append(v)
        per_kind = {k: 1e3 * statistics.mean(v) for k, v in kinds.items()}
        out[name] = {"per_action_ms": per_kind, "replay_means_planned_exchanges_ms": 1e3 * _replay(schedule, programs, means, *hop),
                     # the same without the scatter: every waited exchange pays the lockstep figure (older calibrations)
                     "replay_means_lockstep_exchanges_ms": 1e3 * _replay(schedule, programs, means, *hop[:3]),
                     "implied_exchange_ms": 1e3 * _implied_exchange(schedule, programs, durs, spans),
                     "step_ms": 1e3 * statistics.median(times[i]), "span_ms": 1e3 * statistics.median(spans),
                     "replay_actual_ms": 1e3 * statistics.median(actual), "replay_means_ms": 1e3 * mean_replay,
                     "lockstep_gap_ms": 1e3 * (statistics.median(actual) - mean_replay),
                     "busy_ms": [1e3 * b for b in busy], "relative_spread": spread}
    out["calls"] = calls
    return out


def planned(model_ref: str, cluster_ref: str, name: str) -> dict:
    """The planner's per-rank, per-micro-batch (f, b, w) in ms for layout `name` on a calibrated cluster, and its step."""
    from shardwise.planner import estimate
    from shardwise.planner.job import runtime_job
    from shardwise.planner.step_time import stage_cost
    from shardwise.specs import load_cluster
    from shardwise.validate.config import parse_layout

    job = runtime_job(load_model(model_ref), load_cluster(cluster_ref), 8, 64, gpu=False)
    lay = parse_layout(name, 2)
    out = {f"rank{r}": [round(1e3 * x, 2) for x in (c.f, c.b, c.w)] for r in range(lay.pp)
           for c in [stage_cost(job, lay, r)]}
    return {**out, "step_ms": 1e3 * estimate(job, lay).step_time}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pipeline_args(ap, LAYOUTS)
    ap.add_argument("--cluster", help="a calibrate profile: print the planner's per-micro-batch f, b, w per rank beside")
    args = ap.parse_args(argv)
    if args.dedicated:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    from shardwise.launch import run_ranks

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    hop = (0.0, 0.0, 0.0, 0.0, ())
    if args.cluster:  # the calibration's exchange model: the table's 16 KiB transfer, pipeline_exchange_s, lockstep_spread
        from shardwise.planner.comm import interpolate
        from shardwise.specs import load_cluster

        m = load_cluster(args.cluster).measured
        act = 64 * load_model(args.model).hidden * 4
        hop = (interpolate(m["send_recv"], act), m.get("pipeline_exchange_s", 0.0), m.get("lockstep_spread", 0.0),
               m.get("action_scatter", 0.0), tuple(tuple(x) for x in m.get("handoff_points", ())))
    out = run_ranks(_rank, args.model, args.layouts.split(","), args.steps, hop, world=2, backend="gloo")[0]
    calls = out.pop("calls")
    if args.cluster:
        for name in out:
            out[name]["planned"] = planned(args.model, args.cluster, name)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{'layout':14s} {'step':>7s} {'span':>7s} {'replay':>7s} {'means':>7s} {'gap':>6s}  busy per rank   spread")
    for name, r in out.items():
        spread = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["relative_spread"].items()))
        print(f"{name:14s} {r['step_ms']:7.1f} {r['span_ms']:7.1f} {r['replay_actual_ms']:7.1f} {r['replay_means_ms']:7.1f} "
              f"{r['lockstep_gap_ms']:6.1f}  {' / '.join(f'{b:.1f}' for b in r['busy_ms'])}   {spread}")
        print(f"{'':14s} implied cost per exchange {r['implied_exchange_ms']:.3f} ms; replay of the mean action times with "
              f"the calibration's exchanges {r['replay_means_planned_exchanges_ms']:.1f} ms (every waited exchange at the "
              f"lockstep figure: {r['replay_means_lockstep_exchanges_ms']:.1f} ms)")
        print(f"{'':14s} per action, ms: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["per_action_ms"].items()))
              + (f"; planned f, b, w: {r['planned']}" if "planned" in r else ""))
    for tag, v in calls.items():
        print(f"calls after a layer ({tag}), ms beyond it: " + ", ".join(f"{k} {x:.3f}" for k, x in v.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
