"""A `validate --json` run scored again with another calibration's keys (times, not tests).

    python benchmarks/validate_rescore.py RUN.json --model CFG --cluster P [--without KEY ...] [--json]

The same measurements, two predictions: validate's own (the profile P as it is), and P without each `--without` key
(default `action_scatter`: every waited pipeline exchange at the lockstep figure, as a calibration from before that
key is charged), each raw and drift-corrected at the run's own speed ratios (validate.drift_corrected: nothing refitted,
nothing from the layouts). Prints per layout the two errors (+ = predicted slower than measured), then the medians,
Kendall tau and top-1 regret of each. --model and --cluster are the run's own (the JSON keeps neither path).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields, replace

from shardwise.specs import Layout, load_cluster, load_model
from shardwise.validate import ValidateConfig, predict, summarize
from shardwise.validate import drift_corrected as at_run_speed


def _layout(row: dict) -> Layout:
    return Layout(**{f.name: row[f.name] for f in fields(Layout) if f.name in row})


def _scores(cfg: ValidateConfig, run: dict) -> dict:
    """{"raw": [...], "drift_corrected": [...]} predicted step times of every layout of the run under `cfg`."""
    layouts = [_layout(x) for x in run["layouts"]]
    now = at_run_speed(cfg, run["machine"])
    out = {"raw": [predict(cfg, lay)["step_time_s"] for lay in layouts]}
    if now is not None:
        out["drift_corrected"] = [predict(now, lay)["step_time_s"] for lay in layouts]
    return out


def rescore(run: dict, model: str, cluster: str, without: list[str]) -> dict:
    base = load_cluster(cluster)
    cfg = ValidateConfig(model=load_model(model), cluster=base, world=run.get("world", 2),
                         global_batch=run.get("global_batch", 8), seq_len=run.get("seq_len", 64))
    other = replace(cfg, cluster=replace(base, measured={k: v for k, v in (base.measured or {}).items()
                                                         if k not in without}))
    measured = [x["measured_step_time_s"] for x in run["layouts"]]
    out = {"layouts": [x["name"] for x in run["layouts"]], "measured": measured}
    for tag, c in (("as_is", cfg), ("without", other)):
        scored = _scores(c, run)
        out[tag] = {kind: {"predicted": p, "summary": summarize(p, measured)} for kind, p in scored.items()}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a `shardwise validate --json` output")
    ap.add_argument("--model", required=True, help="the run's --model")
    ap.add_argument("--cluster", required=True, help="the run's --cluster (a calibrate profile)")
    ap.add_argument("--without", nargs="+", default=["action_scatter"], help="[measured] keys to drop for the second")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with open(args.run) as fh:
        run = json.load(fh)
    out = rescore(run, args.model, args.cluster, args.without)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    kinds = list(out["as_is"])
    print(f"{'layout':44s} " + " ".join(f"{k + ' as is':>22s} {k + ' without':>22s}" for k in kinds))
    for i, name in enumerate(out["layouts"]):
        m = out["measured"][i]
        cells = [f"{out[tag][k]['predicted'][i] / m - 1:+22.1%}" for k in kinds for tag in ("as_is", "without")]
        print(f"{name:44s} " + " ".join(cells))
    for tag in ("as_is", "without"):
        for k in kinds:
            s = out[tag][k]["summary"]
            print(f"{tag:8s} {k:16s} median |error| {s['median_abs_error']:.1%}, Kendall tau {s['kendall_tau']:.2f}, "
                  f"top-1 regret {s['top1_regret']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
