"""How long `plan` takes over the whole search space (the issue's target: llama3.1-405b on 16,384 H100s < 2 s).

    python benchmarks/plan_speed.py [--model llama3.1-405b] [--cluster dgx-h100-80gb] [--gpus 16384]
                                    [--global-batch 2048] [--seq-len 8192] [--repeats 5]

Prints the wall time of the first search (what one `shardwise plan` call pays: its caches start empty), the
median of the repeats (caches warm) and how many layouts were scored (memory) and timed (step time). The CLI adds
Python's start and the imports (about 0.3 s). A timing, not a test: it never asserts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from shardwise.planner.frameworks import DEFAULT_FRAMEWORK
from shardwise.planner.job import make_job
from shardwise.planner.search import search
from shardwise.specs import load_cluster, load_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3.1-405b")
    ap.add_argument("--cluster", default="dgx-h100-80gb")
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--global-batch", type=int, default=2048)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--framework", default=DEFAULT_FRAMEWORK)
    args = ap.parse_args(argv)
    job = make_job(load_model(args.model), load_cluster(args.cluster), args.global_batch, args.seq_len,
                   args.framework)  # as the CLI builds it
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        result = search(job, args.gpus)
        times.append(time.perf_counter() - t0)
    best = result.ranked[0] if result.ranked else None
    print(f"plan {args.model} on {args.gpus} x {args.cluster} ({args.framework}), batch {args.global_batch} x {args.seq_len}: "
          f"first {times[0]:.3f} s, median {statistics.median(times):.3f} s over {args.repeats} runs; "
          f"{result.scored} layouts scored for memory, {result.timed} timed, {len(result.ranked)} fit")
    if best:
        print(f"best: {best.layout.describe()} {best.layout.schedule} ZeRO-{best.layout.zero} "
              f"{best.layout.recompute} recompute, {best.step_time:.2f} s/step, MFU {best.mfu:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
