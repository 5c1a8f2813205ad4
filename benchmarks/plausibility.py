"""The planner's best layout-free plan against tuned published runs whose layout the comparison does not use.

    python benchmarks/plausibility.py [--json] [--framework NAME ...]

For each case, `plan` runs over the whole search space (no layout given) under each framework profile, and its
winner's throughput is compared with what the source published. The issue's goal: no best plan more than 15 %
faster than the tuned run. A timing of nothing and an assertion of nothing: it prints the figures.

Cases (per-GPU tokens/s from the source):
  * Llama 2 70B on 2,048 A100-80GB, 4M-token batches of 4,096: Meta's 1,720,320 GPU-hours for 2 T tokens
    (Touvron et al. 2023, Llama 2, Table 2: "Time: total GPU time required for training each model") -> 323
    tokens/s per GPU. Neither paper says these hours include restarts, failures or evaluation, and LLaMA's own table
    shows how they are counted: its 65B model's 1,022,362 GPU-hours (Touvron et al. 2023, LLaMA, Table 15) are its
    1.4 T tokens at the 380 tokens/s per GPU it measured (1.4e12 / 380 / 3600 = 1,023,392, within 0.1 %), i.e.
    tokens over throughput. So the figure is read as a throughput, with no allowance for lost time. But Llama 2's four
    figures are exact multiples of 2,048 GPU-hours (90, 180, 507 and 840 hours: GPUs x whole wall-clock hours, unlike
    LLaMA-65B's computed one), which would count the time the run lost; the script also prints the comparison at the
    "higher than 90 % effective training time" Llama 3 reports (Llama Team 2024, Sec. 3.3.4), as a bound.
  * Llama 2 7B and 13B the same way: 184,320 and 368,640 GPU-hours for 2 T tokens (the same Table 2; 90 and 180 hours
    of 2,048 GPUs) -> 3,014.2 and 1,507.1 tokens/s per GPU, at the 70B's batch of 1,024 x 4,096.
  * LLaMA 65B on 2,048 A100-80GB, 4M-token batches of 2,048: "approximately 380 tokens/sec/GPU" (Touvron et al.
    2023, LLaMA, Sec. 2.4).
Both A100 runs used Meta's 2022-23 stack (LLaMA Sec. 2.4: xformers' causal attention, checkpointing that keeps the
expensive activations, model and sequence parallelism, all-reduced gradients), before FlashAttention-2 (July 2023): the
`llama2` profile; the 405B runs Meta's 2024 stack, the `llama3` profile. Each case marks the profile of the stack that
ran it. LLaMA names model and sequence parallelism only, and Meta's stack before it (OPT) had no pipeline: the
`llama2` profile runs none.
  * Llama 3 405B on 8,192 and 16,384 H100, 2,048 x 8,192: 43 % and 41 % BF16 MFU (Llama Team 2024, Table 4).
"""

from __future__ import annotations

import argparse
import json
import sys

from shardwise.planner.frameworks import FRAMEWORKS
from shardwise.planner.job import make_job
from shardwise.planner.search import SearchSpace, search
from shardwise.planner.step_time import model_flops_per_step
from shardwise.specs import load_cluster, load_model

CASES = [
    # name, model, cluster, gpus, global batch, seq, published tokens/s per GPU (None: from MFU), published MFU,
    # the profile of the stack that ran it
    ("Llama 2 70B, 2,048 A100 (Meta GPU-hours)", "llama2-70b", "dgx-a100-80gb", 2048, 1024, 4096, 323.0, None, "llama2"),
    ("Llama 2 7B, 2,048 A100 (Meta GPU-hours)", "llama2-7b", "dgx-a100-80gb", 2048, 1024, 4096, 3014.2, None, "llama2"),
    ("Llama 2 13B, 2,048 A100 (Meta GPU-hours)", "llama2-13b", "dgx-a100-80gb", 2048, 1024, 4096, 1507.1, None, "llama2"),
    ("LLaMA 65B, 2,048 A100 (LLaMA paper)", "llama-65b", "dgx-a100-80gb", 2048, 2048, 2048, 380.0, None, "llama2"),
    ("Llama 3 405B, 8,192 H100 (43 % MFU)", "llama3.1-405b", "dgx-h100-80gb", 8192, 2048, 8192, None, 0.43, "llama3"),
    ("Llama 3 405B, 16,384 H100 (41 % MFU)", "llama3.1-405b", "dgx-h100-80gb", 16384, 2048, 8192, None, 0.41, "llama3"),
]


# Cases whose published figure is GPUs x wall-clock hours (Llama 2, Table 2: exact multiples of 2,048 GPU-hours), and
# the effective training time Llama 3 reports for its 405B run ("higher than 90 %", Sec. 3.3.4): a bound, not a fit.
WALL_CLOCK_HOURS = tuple(c[0] for c in CASES if "Meta GPU-hours" in c[0])
EFFECTIVE_TIME = 0.90


def run(frameworks: list[str], cases: list | None = None, space: SearchSpace = SearchSpace()) -> list[dict]:
    out = []
    for name, model, cluster, gpus, batch, seq, tps, mfu, ran in CASES if cases is None else cases:
        for fw in frameworks:
            job = make_job(load_model(model), load_cluster(cluster), batch, seq, fw)
            result = search(job, gpus, space)
            if not result.ranked:
                out.append({"case": name, "framework": fw, "best": None})
                continue
            best = result.ranked[0]
            published = tps if tps is not None else mfu * job.cluster.peak_flops * gpus * batch * seq \
                / model_flops_per_step(job) / gpus
            predicted = best.tokens_per_s / best.gpus
            out.append({"case": name, "framework": fw, "ran_it": fw == ran, "best": best.layout.describe(),
                        "zero": best.layout.zero,
                        "recompute": best.layout.recompute, "mfu": round(best.mfu, 4),
                        "published_tokens_per_s_per_gpu": round(published, 1),
                        "predicted_tokens_per_s_per_gpu": round(predicted, 1),
                        "faster_than_published": round(predicted / published - 1, 4)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", nargs="*",
                    default=["megatron-core", "nemo", "torchtitan", "deepspeed-2024", "llama3", "llama2"],
                    choices=list(FRAMEWORKS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = run(args.framework)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'case':42} {'framework':15} {'best plan':34} {'MFU':>6} {'publ':>7} {'plan':>7} {'faster':>7}")
    for r in rows:
        if r["best"] is None:
            print(f"{r['case']:42} {r['framework']:15} nothing fits")
            continue
        plan = f"{r['best']} Z{r['zero']} {r['recompute']}"
        print(f"{r['case']:42} {r['framework']:15} {plan:34} {r['mfu']:6.1%} {r['published_tokens_per_s_per_gpu']:7.0f} "
              f"{r['predicted_tokens_per_s_per_gpu']:7.0f} {r['faster_than_published']:+7.1%}"
              + ("  <- the stack that ran it" if r["ran_it"] else ""))
    for r in rows:
        if r["best"] is not None and r["ran_it"] and r["case"] in WALL_CLOCK_HOURS:
            bound = r["predicted_tokens_per_s_per_gpu"] / (r["published_tokens_per_s_per_gpu"] / EFFECTIVE_TIME) - 1
            print(f"{r['case']}: its GPU-hours are 2,048 GPUs x whole wall-clock hours; if the run trained "
                  f"{EFFECTIVE_TIME:.0%} of that time (Llama 3's figure), the plan is {bound:+.1%} faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
