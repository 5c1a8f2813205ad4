"""`shardwise calibrate` then `shardwise validate` on several small models, as a user runs them, in one table.

    python benchmarks/validate_accuracy.py [--models tiny,tiny-gpt2,gqa] [--world 2] [--runs 1] [--priority N] [--json]

Per model and run: `shardwise calibrate --model M --world W --out P` (the machine's kernels, collectives and
per-call costs, measured on M), then `shardwise validate --model M --world W --cluster P --json` (the
default sweep of real layouts, interleaved in rounds) — the calibration never sees a validated layout.
Reported: median and p90 |error| of the step time, Kendall tau, top-1 regret, memory median error and the
1-minute load average at the start of calibrate, between the two and at the end, and the cores other processes
kept busy during each of the two commands (their `other_cpu_cores`, shardwise/contention.py): a shared machine's
neighbours move the absolute times; read the figures beside them. Models: presets, paths to a config.json, or `gqa`
(a small grouped-query Llama: hidden 96, 4 layers, 6 heads / 2 KV heads, FFN 256).

--priority N runs both commands in a session of their own whose scheduling group has nice -N (Linux; negative
values need root). Linux shares CPU time between sessions, not processes (CFS autogroups): without it, one busy
process of another session takes a whole core of a 2-core machine from the two ranks. With it the two commands
see the machine nearly as its only users would (the neighbours still run whenever the ranks wait).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GQA = {"model_type": "llama", "hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 4,
       "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256,
       "tie_word_embeddings": False, "rope_theta": 10000.0, "rms_norm_eps": 1e-05}
GOALS = {"median_abs_error": 0.10, "kendall_tau": 0.8, "top1_regret": 0.05}


def _load() -> float:
    return os.getloadavg()[0]


def _session(priority: int):
    """A child's preexec: a new session (its own autogroup), with nice -priority for the group."""
    def setup():
        os.setsid()
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(-priority))
    return setup if priority else None


def _shardwise(*argv: str, priority: int = 0) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run([sys.executable, "-m", "shardwise", *argv], capture_output=True, text=True, env=env,
                              preexec_fn=_session(priority))
    except subprocess.SubprocessError as exc:
        raise SystemExit(f"--priority {priority}: cannot set the session's scheduling priority ({exc}) — "
                         f"run as root on Linux, or without --priority") from None
    if proc.returncode != 0:
        raise SystemExit(f"shardwise {' '.join(argv)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def run(model: str, world: int, tmp: Path, extra: list[str], priority: int = 0) -> dict:
    profile = tmp / "profile.toml"
    loads = [_load()]
    _shardwise("calibrate", "--model", model, "--world", str(world), "--out", str(profile), priority=priority)
    loads.append(_load())
    result = json.loads(_shardwise("validate", "--model", model, "--world", str(world), "--cluster", str(profile),
                                   "--json", *extra, priority=priority))
    loads.append(_load())
    s, machine = result["summary"], result.get("machine", {})
    others = [machine.get("calibration_other_cpu_cores"), machine.get("other_cpu_cores")]
    return {"model": model, "layouts": len(result["layouts"]), "load_average_1min": loads,
            "other_cpu_cores": others, "priority": priority,
            **{k: s[k] for k in ("median_abs_error", "p90_abs_error", "kendall_tau", "top1_regret",
                                 "memory_median_abs_error", "noisy_layouts")},
            "per_layout": [{k: x[k] for k in ("name", "predicted_step_time_s", "measured_step_time_s", "step_time_spread")}
                           for x in result["layouts"]]}


def table(rows: list[dict]) -> str:
    out = ["| model | layouts | median abs. error (goal <= 10 %) | p90 | Kendall tau (>= 0.8) | top-1 regret (<= 5 %) "
           "| memory median error | load average (calibrate / validate / end) | other processes' cores (calibrate / "
           "validate) |", "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        load = " / ".join(f"{x:.1f}" for x in r["load_average_1min"])
        others = " / ".join("?" if x is None else f"{x:.2f}" for x in r["other_cpu_cores"])
        out.append(f"| {r['model']} | {r['layouts']} | {100 * r['median_abs_error']:.1f} % | {100 * r['p90_abs_error']:.0f} % "
                   f"| {r['kendall_tau']:.2f} | {100 * r['top1_regret']:.1f} % | {100 * r['memory_median_abs_error']:.3f} % "
                   f"| {load} | {others} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,tiny-gpt2,gqa", help="comma-separated presets, config.json paths or 'gqa'")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1, help="calibrate + validate runs per model")
    ap.add_argument("--priority", type=int, default=0, metavar="N",
                    help="run both commands in their own session at nice -N (Linux autogroup; see above)")
    ap.add_argument("--json", action="store_true")
    args, extra = ap.parse_known_args(argv)  # anything else goes to validate (e.g. --repeats 7)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        gqa = Path(tmp) / "gqa" / "config.json"
        gqa.parent.mkdir()
        gqa.write_text(json.dumps(GQA))
        for name in args.models.split(","):
            for _ in range(args.runs):
                row = run(str(gqa) if name == "gqa" else name, args.world, Path(tmp), extra, args.priority)
                rows.append({**row, "model": name})
                print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
