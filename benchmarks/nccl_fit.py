"""The planner's collective times against published nccl-tests logs: the datasheet model, and a fit on other logs.

    python benchmarks/nccl_fit.py [--json]

The logs are tests/data/nccl_tests/ (sources in its SOURCES.md). For every cluster with more than one multi-node
log, each log is scored with the network fitted on the cluster's other logs only (`shardwise calibrate --nccl-tests`,
calibrate/nccl_tests.py): leave-one-log-out. Every log is also scored on the datasheet preset its hardware names
(the base), and flagged where it is faster than a ring can be (reported, never fitted). Median |error| over the
log's sizes of 64 KiB and up, and over 64 MiB and up (where data-parallel reductions live). Prints figures; asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from shardwise.calibrate.nccl_tests import MIN_FIT_BYTES, beyond_ring, errors, fit, read_log  # noqa: E402
from shardwise.specs import load_cluster  # noqa: E402

LOGS = ROOT / "tests" / "data" / "nccl_tests"
# cluster -> (base preset, the line rate per GPU in GB/s where it differs from the preset's, its logs)
CLUSTERS = {
    "H100, 400G InfiniBand (nccl-tests #309)": ("dgx-h100-80gb", None, [
        "nccltests309-gjaion_all_reduce_2x8.txt", "nccltests309-gjaion_all_reduce_4x8.txt",
        "nccltests309-gjaion_all_reduce_8x8.txt"]),
    "Google Cloud A3 Mega (8 x 200 Gb/s)": ("dgx-h100-80gb", 25.0, [
        "a3mega-ztan_all_reduce_2x8.txt", "all_gather@2x8=dstack-a3mega_all_gather_2x8.txt"]),
    "AWS p5, one node": ("dgx-h100-80gb", None, ["all_reduce@1x8=awsome-awsbatch-p5_all_reduce_1x8.txt"]),
    "OCI BM.GPU4.8 (A100 40GB, 16 x 100 Gb/s RoCE)": ("dgx-a100-40gb", 25.0, [
        "ocihpcoke-BMGPU4.8_all_reduce_2x8.txt"]),
    "Azure NDm A100 v4 (8 x 200 Gb/s HDR)": ("dgx-a100-80gb", None, [
        "all_reduce@2x8=azureml-NDm-A100-v4_all_reduce_2x8.txt"]),
    "AWS p4d (A100 40GB, 4 x 100 Gb/s EFA, NCCL 2.9.9)": ("aws-p4d", None, [
        "all_reduce@2x8=awsefaeks-p4d_all_reduce_2x8.txt"]),
}


def _arg(name: str) -> str:
    head, sep, tail = name.partition("=")
    return f"{head}={LOGS / tail}" if sep else str(LOGS / name)


def _scores(cluster, log) -> dict:
    sizes = [b for b, _ in log.points if b >= MIN_FIT_BYTES]
    errs = errors(cluster, log)
    big = [e for b, e in zip(sizes, errs) if b >= 1 << 26]
    return {"median": statistics.median(abs(e) for e in errs),
            "median_64mib_up": statistics.median(abs(e) for e in big) if big else None}


def rows() -> list[dict]:
    out = []
    for name, (preset, line_rate, names) in CLUSTERS.items():
        base = load_cluster(preset)
        if line_rate:
            base = replace(base, inter_node_bandwidth=line_rate * 1e9)
        logs = [read_log(_arg(n)) for n in names]
        for log in logs:
            others = [o for o in logs if o is not log and o.nodes > 1 and not beyond_ring(base, o)]
            held_out = fit(base, others) if others and log.nodes > 1 else None
            out.append({"cluster": name, "log": Path(log.source).name, "kind": log.kind, "ranks": log.ranks,
                        "nodes": log.nodes, "faster_than_a_ring": beyond_ring(base, log),
                        "datasheet": _scores(base, log),
                        "fitted_on_the_others": _scores(held_out.cluster, log) if held_out and held_out.fitted else None,
                        "fitted_keys": held_out.fitted if held_out else None})
    return out


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    table = rows()
    if args.json:
        json.dump(table, sys.stdout, indent=2)
        print()
        return
    print("| cluster | log | ranks / nodes | faster than a ring | datasheet: median (>= 64 MiB) | "
          "fitted on the cluster's other logs: median (>= 64 MiB) |")
    print("|---|---|---|---|---|---|")
    for r in table:
        held = r["fitted_on_the_others"]
        held_text = "—" if held is None else f"{_pct(held['median'])} ({_pct(held['median_64mib_up'])})"
        print(f"| {r['cluster']} | {r['log']} | {r['ranks']} / {r['nodes']} | {'yes' if r['faster_than_a_ring'] else 'no'} "
              f"| {_pct(r['datasheet']['median'])} ({_pct(r['datasheet']['median_64mib_up'])}) | {held_text} |")


if __name__ == "__main__":
    main()
