"""Calibrate, sweep, calibrate again — in one job — and score the sweep with each calibration.

    python benchmarks/validate_one_job.py [--model tiny] [--world 2] [--calibrations 2] [--json]

`benchmarks/validate_accuracy.py` runs `shardwise calibrate` and then `shardwise validate` as a user does, minutes
apart; on a machine shared with other jobs the load moves every absolute time by 2-5x in that while, and the error it
reports is mostly that drift. Here the same measurements (calibrate's `measure_rank`, validate's `run_rank`, the
default sweep) run in one world of ranks, a calibration before the sweep and one (or more) after it, so a
calibration and the sweep it predicts are minutes apart at most and the load between them is printed. Each
calibration scores the sweep separately (the planner's prediction from that profile alone: nothing is fitted on the
sweep, nothing averaged over calibrations). Reported per calibration: the 1-minute load average when it started,
median and p90 |error|, Kendall tau, top-1 regret; with --layouts, every layout's prediction beside its measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


def _job(ccfg, vcfg, calibrations: int):
    import torch.distributed as dist

    from shardwise.calibrate.measure import measure_rank
    from shardwise.validate.measure import run_rank

    rank, world = dist.get_rank(), dist.get_world_size()
    loads, cals = [os.getloadavg()[0]], [measure_rank(ccfg, rank, world)]
    loads.append(os.getloadavg()[0])
    runs = run_rank(vcfg)
    for _ in range(calibrations - 1):
        loads.append(os.getloadavg()[0])
        cals.append(measure_rank(ccfg, rank, world))
    loads.append(os.getloadavg()[0])
    return {"calibrations": cals, "runs": runs, "loads": loads} if rank == 0 else None


def main(argv=None) -> int:
    from shardwise.calibrate import CalibrateConfig, Profile
    from shardwise.launch import run_ranks
    from shardwise.planner import estimate
    from shardwise.planner.job import runtime_job
    from shardwise.specs import load_cluster, load_model
    from shardwise.validate import ValidateConfig, default_layouts, describe, summarize

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--calibrations", type=int, default=2, help="one before the sweep, the rest after it")
    ap.add_argument("--layouts", action="store_true", help="print every layout's prediction and measurement")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model = load_model(args.model)
    layouts = tuple(default_layouts(model, args.world, 8, 64))
    ccfg = CalibrateConfig(model=model, world=args.world).resolved()
    # The sweep itself never reads the cluster (predictions are made here, per calibration).
    vcfg = ValidateConfig(model=model, cluster=load_cluster("dgx-h100-80gb"), world=args.world, layouts=layouts)
    out = run_ranks(_job, ccfg, vcfg, max(1, args.calibrations), world=args.world, what="validation")[0]
    measured = [statistics.median(r["times"]) for r in out["runs"]["layouts"]]
    rows = []
    for i, cal in enumerate(out["calibrations"]):
        job = runtime_job(model, Profile(**cal).to_cluster(), 8, 64, gpu=False)
        predicted = [estimate(job, lay).step_time for lay in layouts]
        s = summarize(predicted, measured)
        load = out["loads"][0 if i == 0 else i + 1]
        rows.append({"calibration": "before the sweep" if i == 0 else f"after the sweep ({i})", "load_average_1min": load,
                     **{k: s[k] for k in ("median_abs_error", "p90_abs_error", "kendall_tau", "top1_regret")},
                     "per_layout": [{"name": describe(lay), "predicted_step_time_s": p, "measured_step_time_s": m}
                                    for lay, p, m in zip(layouts, predicted, measured)]})
    if args.json:
        print(json.dumps({"model": args.model, "loads": out["loads"], "rows": rows}, indent=2))
        return 0
    print(f"{args.model}, world {args.world}, {len(layouts)} layouts; load average (1 min) at each stage: "
          + " / ".join(f"{x:.1f}" for x in out["loads"]))
    print("| calibration | load | median abs. error | p90 | Kendall tau | top-1 regret |\n|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['calibration']} | {r['load_average_1min']:.1f} | {100 * r['median_abs_error']:.1f} % "
              f"| {100 * r['p90_abs_error']:.0f} % | {r['kendall_tau']:.2f} | {100 * r['top1_regret']:.1f} % |")
    if args.layouts:
        for r in rows:
            print(f"\n{r['calibration']}:\n| layout | predicted ms | measured ms | error |\n|---|---:|---:|---:|")
            for x in sorted(r["per_layout"], key=lambda x: x["measured_step_time_s"]):
                p, m = x["predicted_step_time_s"], x["measured_step_time_s"]
                print(f"| {x['name']} | {1e3 * p:.1f} | {1e3 * m:.1f} | {100 * (p - m) / m:+.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
