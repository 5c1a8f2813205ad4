"""`shardwise calibrate` then `shardwise validate` on several small models, as a user runs them, in one table.

    python benchmarks/validate_accuracy.py [--models tiny,tiny-gpt2,gqa] [--world 2] [--runs 1] [--dedicated] [--json]

Per model and run: `shardwise calibrate --model M --world W --out P` (the machine's kernels, collectives and
per-call costs, measured on M), then `shardwise validate --model M --world W --cluster P --json` (the
default sweep of real layouts, interleaved in rounds) — the calibration never sees a validated layout.
Reported: median and p90 |error| of the step time, Kendall tau, top-1 regret, memory median error and the
1-minute load average at the start of calibrate, between the two and at the end, and the cores other processes
kept busy during each of the two commands (their `other_cpu_cores`, shardwise/contention.py), and how long the
calibration's reference workload took during the sweep against during the calibration (validate's `speed_ratio`)
and its slowest round against its fastest within the calibration (calibrate's `reference_rounds_s`):
a shared machine's neighbours, and a virtual machine's host, move the absolute times; read the figures beside them.
Each score is given twice: at the machine's speed during the sweep (validate's `drift_corrected`: the same
calibration with its compute times scaled by the compute reference's ratio and each kind of call's by its own
(collectives, send/recv, the pipeline executor's exchange, FSDP), all timed after every layout of the sweep; the goal figure, docs/accuracy.md says why) and at the calibration's. Models: presets, paths to a config.json, or `gqa`
(a small grouped-query Llama: hidden 96, 4 layers, 6 heads / 2 KV heads, FFN 256).

--dedicated runs both commands under the real-time FIFO scheduler (Linux, root): their ranks then run whenever
they are ready and other processes only in the gaps they leave, as on a machine of one's own. Without it, on a
machine shared with other sessions, Linux shares CPU time between sessions rather than processes (CFS autogroups,
on by default): one busy process of another session takes a whole core of a 2-core machine from the two ranks,
and ranks that synchronise many times a step lose more than that. The neighbours wait meanwhile (they keep the
5 % of CPU time the kernel reserves for them), so use it for the few minutes of a measurement only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from shardwise.specs import load_cluster

GQA = {"model_type": "llama", "hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 4,
       "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256,
       "tie_word_embeddings": False, "rope_theta": 10000.0, "rms_norm_eps": 1e-05}
GOALS = {"median_abs_error": 0.10, "kendall_tau": 0.8, "top1_regret": 0.05}


def _load() -> float:
    return os.getloadavg()[0]


def _realtime() -> None:
    """A child's preexec: the FIFO real-time scheduler (inherited by the ranks it starts and their threads)."""
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))


def _shardwise(*argv: str, dedicated: bool = False) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run([sys.executable, "-m", "shardwise", *argv], capture_output=True, text=True, env=env,
                              preexec_fn=_realtime if dedicated else None)
    except subprocess.SubprocessError as exc:
        raise SystemExit(f"--dedicated: cannot use the real-time scheduler ({exc}) — run as root on Linux, "
                         f"or without --dedicated") from None
    if proc.returncode != 0:
        raise SystemExit(f"shardwise {' '.join(argv)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def run(model: str, world: int, tmp: Path, extra: list[str], dedicated: bool = False) -> dict:
    profile = tmp / "profile.toml"
    loads = [_load()]
    _shardwise("calibrate", "--model", model, "--world", str(world), "--out", str(profile), dedicated=dedicated)
    loads.append(_load())
    result = json.loads(_shardwise("validate", "--model", model, "--world", str(world), "--cluster", str(profile),
                                   "--json", *extra, dedicated=dedicated))
    loads.append(_load())
    s, machine = result["summary"], result.get("machine", {})
    rounds = load_cluster(str(profile)).measured.get("reference_rounds_s") or []
    others = [machine.get("calibration_other_cpu_cores"), machine.get("other_cpu_cores")]
    return {"model": model, "layouts": len(result["layouts"]), "load_average_1min": loads,
            "other_cpu_cores": others, "dedicated": dedicated, "speed_ratio": machine.get("speed_ratio"),
            **{k: machine.get(k) for k in ("call_speed_ratio", "p2p_speed_ratio", "exchange_speed_ratio",
                                            "fsdp_speed_ratio", "host_speed_ratio")},
            "calibration_drift": max(rounds) / min(rounds) if rounds and min(rounds) > 0 else None,
            **{k: s[k] for k in ("median_abs_error", "p90_abs_error", "kendall_tau", "top1_regret",
                                 "memory_median_abs_error", "noisy_layouts")},
            "drift_corrected": {k: v for k, v in s.get("drift_corrected", {}).items() if k != "best_in_top3"} or None,
            "per_layout": [{k: x.get(k) for k in ("name", "predicted_step_time_s", "drift_corrected_step_time_s",
                                                   "measured_step_time_s", "step_time_spread")}
                           for x in result["layouts"]]}


def _fmt(x) -> str:
    return "?" if x is None else f"{x:.2f}"


def _scores(s: dict | None) -> str:
    if not s:
        return "? | ? | ? | ?"
    return (f"{100 * s['median_abs_error']:.1f} % | {100 * s['p90_abs_error']:.0f} % | {s['kendall_tau']:.2f} "
            f"| {100 * s['top1_regret']:.1f} %")


def table(rows: list[dict]) -> str:
    out = ["| model | layouts | at the machine's speed during the sweep: median abs. error (goal <= 10 %) | p90 "
           "| Kendall tau (>= 0.8) | top-1 regret (<= 5 %) | at the calibration's speed: median abs. error | p90 "
           "| Kendall tau | top-1 regret | memory median error | load average (calibrate / validate / end) "
           "| other processes' cores (calibrate / validate) | reference workloads, sweep / calibration: compute "
           "| collectives | send/recv | pipeline exchange | FSDP | its drift within the calibration |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        load = " / ".join(f"{x:.1f}" for x in r["load_average_1min"])
        others = " / ".join("?" if x is None else f"{x:.2f}" for x in r["other_cpu_cores"])
        name = r["model"] + (" (dedicated)" if r.get("dedicated") else "")
        out.append(f"| {name} | {r['layouts']} | {_scores(r.get('drift_corrected'))} | {_scores(r)} "
                   f"| {100 * r['memory_median_abs_error']:.3f} % | {load} | {others} | {_fmt(r['speed_ratio'])} "
                   f"| {_fmt(r.get('call_speed_ratio'))} | {_fmt(r.get('p2p_speed_ratio'))} "
                   f"| {_fmt(r.get('exchange_speed_ratio'))} | {_fmt(r.get('fsdp_speed_ratio'))} "
                   f"| {_fmt(r.get('calibration_drift'))} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,tiny-gpt2,gqa", help="comma-separated presets, config.json paths or 'gqa'")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1, help="calibrate + validate runs per model")
    ap.add_argument("--dedicated", action="store_true",
                    help="run both commands under the real-time FIFO scheduler, as on a machine of one's own (see above)")
    ap.add_argument("--json", action="store_true")
    args, extra = ap.parse_known_args(argv)  # anything else goes to validate (e.g. --repeats 7)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        gqa = Path(tmp) / "gqa" / "config.json"
        gqa.parent.mkdir()
        gqa.write_text(json.dumps(GQA))
        for name in args.models.split(","):
            for _ in range(args.runs):
                row = run(str(gqa) if name == "gqa" else name, args.world, Path(tmp), extra, args.dedicated)
                rows.append({**row, "model": name})
                print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
