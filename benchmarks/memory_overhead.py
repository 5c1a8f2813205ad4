"""What measuring memory costs: a training step under the counters against a bare one, in one run.

    python benchmarks/memory_overhead.py [--models tiny,small] [--repeats 20] [--json]

`shardwise train --json` runs its first step under shardwise.validate.memory's counters (saved-tensor
hooks, FSDP's gathered parameters and held gradients sampled) and every other step bare. Per model and
layout, world 2 on gloo (CPU, fp32), this times `repeats` bare steps and `repeats` measured steps,
interleaved, and reports the median of each and their ratio. The cost on a whole run of N steps is
(ratio - 1) / N of its time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import torch

from shardwise.launch import spawn_ranks
from shardwise.parallel import build_mesh
from shardwise.specs import Layout, load_model, model_from_hf_config
from shardwise.train import TrainConfig, build_runtime, train_step
from shardwise.validate.memory import measure_memory

SMALL = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 8, "num_attention_heads": 8,
         "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 512}
LAYOUTS = {"dp2": Layout(dp=2, micro_batch=2), "dp2 zero2": Layout(dp=2, zero=2, micro_batch=2),
           "dp2 zero3": Layout(dp=2, zero=3, micro_batch=2), "tp2 sp": Layout(tp=2, sequence_parallel=True, micro_batch=4),
           "pp2 1f1b": Layout(pp=2, micro_batch=2)}


def spec_for(name: str):
    return model_from_hf_config(SMALL, "small", "benchmark") if name == "small" else load_model(name)


def _worker(rank, world, args, out_path):
    results = []
    for name in args.models.split(","):
        for label, lay in LAYOUTS.items():
            cfg = TrainConfig(spec_for(name), lay, steps=10**6, global_batch=8, seq_len=args.seq_len, progress=False)
            rt = build_runtime(cfg, build_mesh(lay.pp, lay.dp, lay.tp, backend="gloo", timeout_s=120))
            for _ in range(2):
                train_step(rt)
            bare, measured = [], []
            for _ in range(args.repeats):
                for times, step in ((bare, train_step), (measured, lambda r: measure_memory(r, train_step))):
                    torch.distributed.barrier()
                    t0 = time.perf_counter()
                    step(rt)
                    times.append(time.perf_counter() - t0)
            b, m = statistics.median(bare), statistics.median(measured)
            results.append({"model": name, "layout": label, "bare_step_s": b, "measured_step_s": m, "ratio": m / b})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,small")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        spawn_ranks(_worker, 2, args, out.name, timeout_s=300)
        results = json.load(open(out.name))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'model':6s} {'layout':10s} {'bare step':>10s} {'measured':>10s} {'ratio':>6s}")
    for r in results:
        print(f"{r['model']:6s} {r['layout']:10s} {1e3 * r['bare_step_s']:8.1f}ms {1e3 * r['measured_step_s']:8.1f}ms "
              f"{r['ratio']:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
