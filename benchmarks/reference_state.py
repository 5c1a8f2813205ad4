"""calibrate's compute reference in the process states a calibration and a validation sweep time it in, and the
machine's own speed over minutes.

    python benchmarks/reference_state.py [--model tiny] [--rounds 2] [--json]
    python benchmarks/reference_state.py --alternate 5
    python benchmarks/reference_state.py --after 30
    python benchmarks/reference_state.py --drift 300 [--block 800]

The reference is calibrate's model forward + backward at one sequence (calibrate.timer.reference), every rank at
once. Phases, in one pair of ranks:
  1. fresh process: calibrate's own figure for it (measure_model's "none 1", its three rounds beside the other
     model variants), then the reference back to back;
  2. after building validate's default sweep (every layout's runtime, mesh, optimizer and warm-up steps), the
     reference back to back, then `--rounds` sweep rounds (every layout's steps, then validate's own
     `_reference` workloads: what validate reports as `reference_s`);
  3. the same rounds with the Python GC frozen (gc.freeze) and disabled;
  4. calibrate's measure_model again, in the sweep's process.
Per phase on rank 0: ms per call (the slower rank's), its compute thread's CPU ms per call (time.thread_time), minor
page faults per call (getrusage), Python GC collections per generation and their ms per call (gc.callbacks).
A process-state cause (caches, the allocator, the GC, threads) would show as phase 2-4's figures above phase 1's.

--alternate N: N cycles of (nothing built; validate's sweep built and stepped, then deleted), calibrate's
measure_model figure and the reference back to back in each: neighbouring phases see the same machine, so their
ratio is the state's, not the machine's drift.

--after N: N cycles of 0.3 s of something, then 4 calls of the reference (about as long as one repeat of
calibrate's and validate's), on every rank at once without a barrier between: after the reference itself, after
sleeping (2 ms naps), after a Python loop (busy, little memory), after 16 MiB copies. What ran just before a
short repeat changes its time (the core's caches and predictors hold the last code and data).

--drift S: the reference back to back for S seconds in a fresh process, in blocks of --block calls, one line per
block: the machine's speed over time with nothing in the process changing (docs/accuracy.md, "The compute
reference's ratio").
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import statistics
import time

from _ranks import ranks_json, train_loops, write_json

_GC = {"n": [0, 0, 0], "s": 0.0, "t0": 0.0}


def _gc_timer(phase, info):
    if phase == "start":
        _GC["t0"] = time.perf_counter()
    else:
        _GC["n"][info["generation"]] += 1
        _GC["s"] += time.perf_counter() - _GC["t0"]


def _snap():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), time.thread_time(), r.ru_minflt, list(_GC["n"]), _GC["s"]


def _phase(t, tag, a, b, calls, **extra) -> dict:
    return {"phase": tag, "ms": 1e3 * t.reduce([(b[0] - a[0]) / calls], "max")[0], "cpu_ms": 1e3 * (b[1] - a[1]) / calls,
            "minflt": (b[2] - a[2]) / calls, "gc_collections": [y - x for x, y in zip(a[3], b[3])],
            "gc_ms": 1e3 * (b[4] - a[4]) / calls, **extra}


def _back_to_back(t, fn, calls, tag) -> dict:
    t.barrier()
    a = _snap()
    for _ in range(calls):
        t.barrier()
        fn()
    return _phase(t, tag, a, _snap(), calls)


def _calibrated_ms(t) -> float:
    """calibrate's figure for the reference: measure_model's "none 1" over its rounds."""
    from shardwise.calibrate.compute import measure_model

    out = {"copy_gbs": 10.0}  # the element-wise passes' bandwidth only enters the fit, not "none 1"
    for _ in measure_model(t, out):
        pass
    return 1e3 * out["model_points"][0][1]


def _sweep(rank, world, spec, t):
    """validate.measure.run_rank's sweep: every default layout built on pooled meshes and warmed up."""
    import torch

    from shardwise.validate.config import default_layouts

    torch.manual_seed(0)
    loops, meshes = train_loops(spec, default_layouts(spec, world, 8, 64), world)
    return loops, meshes.get((1, world, 1, 1))


def _rounds(t, loops, reference, rounds, tag) -> dict:
    """validate's rounds: each layout's 5 steps in a shuffled order, then its reference workloads."""
    order, seconds, a = random.Random(0), [], _snap()
    for _ in range(rounds):
        for i in order.sample(range(len(loops)), len(loops)):
            t.barrier()
            loops[i].run(5)
            seconds += reference()["reference"]
    return _phase(t, tag, a, _snap(), len(seconds), ms=None, reference_ms=1e3 * statistics.median(seconds))


def _worker(rank, world, model, rounds, calls, path):
    from types import SimpleNamespace

    from shardwise.calibrate.config import CalibrateConfig
    from shardwise.calibrate.timer import Timer, reference
    from shardwise.specs import load_model
    from shardwise.validate.measure import _reference

    gc.callbacks.append(_gc_timer)
    spec = load_model(model)
    t = Timer(CalibrateConfig(model=spec, world=world), rank, world)
    t.mesh()
    ref = reference(t)
    rows = [{"phase": "fresh: calibrate's figure (measure_model 'none 1')", "ms": _calibrated_ms(t)},
            _back_to_back(t, ref, calls, "fresh: back to back")]
    loops, dp_mesh = _sweep(rank, world, spec, t)
    rows.append(_back_to_back(t, ref, calls, "sweep built: back to back"))
    sweep_ref = _reference(SimpleNamespace(model=spec, backend="gloo", seq_len=64, timeout_s=300.0), rank, world, dp_mesh)
    rows.append(_rounds(t, loops, sweep_ref, rounds, "sweep rounds: validate's reference"))
    gc.collect()
    gc.freeze()
    rows.append(_rounds(t, loops, sweep_ref, rounds, "sweep rounds, gc.freeze()"))
    gc.unfreeze()
    gc.disable()
    rows.append(_rounds(t, loops, sweep_ref, rounds, "sweep rounds, gc disabled"))
    gc.enable()
    rows.append({"phase": "sweep's process: calibrate's figure (measure_model 'none 1')", "ms": _calibrated_ms(t)})
    write_json(rank, path, rows)


def _alternate(rank, world, model, cycles, path):
    import ctypes

    from shardwise.calibrate.config import CalibrateConfig
    from shardwise.calibrate.timer import Timer, reference
    from shardwise.specs import load_model

    spec = load_model(model)
    t = Timer(CalibrateConfig(model=spec, world=world), rank, world)
    t.mesh()
    ref = reference(t)
    rows = []
    for _ in range(cycles):
        rows.append({"phase": "nothing built", "calibrate_ms": _calibrated_ms(t), "ms": _back_to_back(t, ref, 200, "")["ms"]})
        loops, _ = _sweep(rank, world, spec, t)
        for loop in loops:
            loop.run(3)
        rows.append({"phase": "sweep built", "calibrate_ms": _calibrated_ms(t), "ms": _back_to_back(t, ref, 200, "")["ms"]})
        del loops, loop
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # the heap back as far as glibc can
    write_json(rank, path, rows)


def _after(rank, world, model, cycles, path):
    import torch

    from shardwise.calibrate.config import CalibrateConfig
    from shardwise.calibrate.timer import Timer, reference
    from shardwise.specs import load_model

    t = Timer(CalibrateConfig(model=load_model(model), world=world), rank, world)
    ref = reference(t)
    src, dst = torch.ones(4 * 2**20), torch.empty(4 * 2**20)

    def spin():  # busy in the interpreter, touching little memory
        sum(range(10_000))
    before = {"the reference": ref, "sleeping": lambda: time.sleep(0.002), "a Python loop": spin,
              "16 MiB copies": lambda: dst.copy_(src)}
    seconds = {name: [] for name in before}
    for _ in range(20):
        ref()
    for _ in range(cycles):
        for name, fn in before.items():
            start = time.perf_counter()
            while time.perf_counter() - start < 0.3:
                fn()
            start = time.perf_counter()
            for _ in range(4):
                ref()
            seconds[name].append((time.perf_counter() - start) / 4)
    rows = [{"phase": f"after {name}", "ms": 1e3 * statistics.median(s)} for name, s in seconds.items()]
    t.barrier()
    write_json(rank, path, rows)


def _drift(rank, world, model, seconds, block, path):
    from shardwise.calibrate.config import CalibrateConfig
    from shardwise.calibrate.timer import Timer, reference
    from shardwise.specs import load_model

    t = Timer(CalibrateConfig(model=load_model(model), world=world), rank, world)
    t.mesh()
    ref = reference(t)
    rows, start = [], time.perf_counter()
    while t.reduce([time.perf_counter() - start], "max")[0] < seconds:  # every rank agrees when to stop
        row = _back_to_back(t, ref, block, "block")
        rows.append({"t_s": round(time.perf_counter() - start, 1), "ms": row["ms"], "cpu_ms": row["cpu_ms"]})
    write_json(rank, path, rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=2, help="sweep rounds per phase")
    ap.add_argument("--calls", type=int, default=300, help="back-to-back calls per phase")
    ap.add_argument("--alternate", type=int, default=0, metavar="N", help="only N cycles of nothing / sweep built")
    ap.add_argument("--after", type=int, default=0, metavar="N", help="only N cycles of what runs before a repeat")
    ap.add_argument("--drift", type=float, default=0.0, metavar="S", help="only the speed over S seconds")
    ap.add_argument("--block", type=int, default=800, help="--drift: calls per block")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.alternate:
        rows = ranks_json(_alternate, 2, args.model, args.alternate, timeout_s=900)
    elif args.after:
        rows = ranks_json(_after, 2, args.model, args.after, timeout_s=900)
    elif args.drift:
        rows = ranks_json(_drift, 2, args.model, args.drift, args.block, timeout_s=max(600, 3 * args.drift))
    else:
        rows = ranks_json(_worker, 2, args.model, args.rounds, args.calls, timeout_s=900)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(" | ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items() if v is not None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
