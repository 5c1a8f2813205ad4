"""What idle gloo process groups cost the compute beside them: calibrate's reference workload on every rank at once,
with no extra groups and with N idle ones, alternately.

    python benchmarks/idle_groups.py [--model tiny] [--groups 88] [--cycles 2] [--seconds 3] [--json]

Every gloo process group keeps an event-loop thread that wakes every 10 ms even when idle (gloo's
transport/tcp/loop.cc: Loop::run calls epoll_wait with a 10 ms timeout), and a DeviceMesh makes one group per
dimension. `validate` once built a mesh per layout: 91 groups per rank for the default world-2 sweep, against 1-9
while `calibrate` measures and 5 in a `train` job (validate.measure.mesh_split). Per phase, read exactly from
/proc/self/task/*/schedstat (nanoseconds, not tick samples): rank 0's milliseconds per call (the slower rank's), its
compute thread's on-CPU and run-queue milliseconds per call and its time slices per second, and the CPU share and
wake-ups per second of every other thread of the rank (the groups' loops). The machine's other processes' cores are
printed beside them (contention.py): they change the picture (see docs/accuracy.md, "Idle process groups").
"""

from __future__ import annotations

import argparse
import json
import os
import time

from _ranks import ranks_json, write_json


def _threads() -> dict[int, tuple[int, int, int]]:
    """tid -> (on-CPU ns, run-queue ns, time slices) of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = tuple(int(x) for x in f.read().split())
        except OSError:  # the thread ended meanwhile
            pass
    return out


def _phase(t, run, tag: str, seconds: float) -> dict:
    t.barrier()
    before, start, calls = _threads(), time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        run()
        calls += 1
    wall, after = time.perf_counter() - start, _threads()
    me = os.getpid()
    delta = {tid: [a - b for a, b in zip(v, before.get(tid, (0, 0, 0)))] for tid, v in after.items()}
    others = [v for tid, v in delta.items() if tid != me]
    return {"phase": tag, "ms_per_call": 1e3 * t.reduce([wall / calls], "max")[0],
            "compute_thread_cpu_ms": delta[me][0] / 1e6 / calls, "compute_thread_waiting_ms": delta[me][1] / 1e6 / calls,
            "compute_thread_slices_per_s": delta[me][2] / wall,
            "other_threads_cpu_share": sum(v[0] for v in others) / 1e9 / wall,
            "other_threads_wakeups_per_s": sum(v[2] for v in others) / wall, "threads": len(after)}


def _worker(rank, world, model, groups, cycles, seconds, path):
    import gc
    from datetime import timedelta

    import torch.distributed as dist

    from shardwise.calibrate.config import CalibrateConfig
    from shardwise.calibrate.timer import Timer, reference
    from shardwise.specs import load_model

    t = Timer(CalibrateConfig(model=load_model(model), world=world), rank, world)
    run = reference(t)
    for _ in range(10):
        run()
    rows = []
    for _ in range(cycles):
        rows.append(_phase(t, run, "no extra groups", seconds))
        extra = [dist.new_group(list(range(world)), timeout=timedelta(seconds=60)) for _ in range(groups)]
        rows.append(_phase(t, run, f"{groups} idle groups", seconds))
        for g in extra:
            dist.destroy_process_group(g)
        del extra, g  # the last reference: the groups' threads end with them
        gc.collect()
    rows.append(_phase(t, run, "no extra groups", seconds))
    write_json(rank, path, rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--groups", type=int, default=88, help="idle groups added (the old default sweep's, less its own)")
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0, help="per phase")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from shardwise.contention import OtherCpu

    load = os.getloadavg()[0]
    with OtherCpu() as other:
        rows = ranks_json(_worker, 2, args.model, args.groups, args.cycles, args.seconds)
    if args.json:
        print(json.dumps({"load_average_1min": load, "other_cpu_cores": other.cores, "phases": rows}, indent=2))
        return 0
    print(f"load {load:.1f}, other processes' cores {other.cores}")
    print("phase | ms per call | compute thread: CPU ms, waiting ms per call, slices/s | other threads: CPU share, "
          "wake-ups/s | threads")
    for r in rows:
        print(f"{r['phase']} | {r['ms_per_call']:.2f} | {r['compute_thread_cpu_ms']:.2f}, "
              f"{r['compute_thread_waiting_ms']:.2f}, {r['compute_thread_slices_per_s']:.0f} | "
              f"{r['other_threads_cpu_share']:.3f}, {r['other_threads_wakeups_per_s']:.0f} | {r['threads']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
