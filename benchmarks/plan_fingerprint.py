"""A fingerprint of what `plan` ranks, to show that a speed-up changed no result.

    python benchmarks/plan_fingerprint.py [--out FILE] [--quick]

For each case (dense and mixture-of-experts models, every contract framework, GPU counts from 8 to 16,384,
context parallelism, FP8) it runs the search and prints one line: how many layouts were scored and timed, how
many fit, and a hash of the exact ranked list (each layout's knobs, its memory and time breakdowns as exact
floats, its FLOPs) and of the leanest layout. Run it before and after a change and diff the two outputs: equal
lines mean the same ranking, bit for bit. A check, not a timing (--quick leaves out the 16,384-GPU cases).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import asdict

from shardwise.planner.job import make_job
from shardwise.planner.search import SearchSpace, search
from shardwise.specs import load_cluster, load_model

CONTRACT = ("megatron-2021", "megatron-core", "nemo", "deepspeed", "torchtitan", "shardwise")
# (model, cluster, gpus, global batch, sequence length, frameworks, make_job options)
CASES = [
    ("llama3.1-405b", "dgx-h100-80gb", 16384, 2048, 8192, CONTRACT, {}),
    ("llama3.1-70b", "dgx-h100-80gb", 256, 512, 8192, CONTRACT, {}),
    ("llama3.1-70b", "dgx-h100-80gb", 512, 512, 32768, ("megatron-core", "torchtitan"), {}),
    ("llama3.1-8b", "dgx-h100-80gb", 64, 256, 8192, ("megatron-core", "nemo", "torchtitan"), {"precision": "fp8"}),
    ("llama2-13b", "dgx-a100-40gb", 16, 64, 2048, CONTRACT, {}),
    ("gpt3-175b", "dgx-a100-80gb", 1024, 1536, 2048, CONTRACT, {}),
    ("llama-65b", "dgx-a100-80gb", 64, 256, 2048, CONTRACT, {}),
    ("tiny", "dgx-a100-40gb", 8, 16, 1024, CONTRACT, {}),
    ("mixtral-8x7b", "dgx-h100-80gb", 64, 256, 4096, ("megatron-core", "torchtitan", "shardwise"), {}),
    ("qwen3-30b-a3b", "dgx-h100-80gb", 128, 512, 4096, ("megatron-core",), {}),
    ("deepseek-v3", "dgx-h100-80gb", 2048, 4096, 4096, ("megatron-core",), {}),
]


def _exact(estimate) -> str:
    """Everything a ranked layout carries that a change could move, floats in full (repr)."""
    return repr((sorted(asdict(estimate.layout).items()), estimate.num_microbatches, estimate.worst_rank,
                 sorted(estimate.memory_bytes.items()), sorted(estimate.time_s.items()),
                 estimate.model_flops, estimate.hardware_flops))


def fingerprint(model, cluster, gpus, batch, seq, framework, options) -> str:
    job = make_job(load_model(model), load_cluster(cluster), batch, seq, framework, **options)
    result = search(job, gpus, SearchSpace())
    digest = hashlib.sha256("\n".join(_exact(e) for e in result.ranked).encode()).hexdigest()[:16]
    lean = hashlib.sha256(_exact(result.leanest).encode()).hexdigest()[:8] if result.leanest else "-"
    extra = "".join(f" {k}={v}" for k, v in options.items())
    return (f"{model} {gpus}x{cluster} {batch}x{seq} {framework}{extra}: scored {result.scored} timed {result.timed} "
            f"fit {len(result.ranked)} ranked {digest} leanest {lean} refused {bool(result.refused)} "
            f"thinned {bool(result.thinned)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="also write the lines to this file")
    ap.add_argument("--quick", action="store_true", help="leave out the 16,384-GPU cases")
    args = ap.parse_args(argv)
    lines = []
    for model, cluster, gpus, batch, seq, frameworks, options in CASES:
        if args.quick and gpus > 4096:
            continue
        for fw in frameworks:
            lines.append(fingerprint(model, cluster, gpus, batch, seq, fw, options))
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
