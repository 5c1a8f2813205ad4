"""Expert parallelism against its floor, world 2, in one run (ratios, not tests).

    python benchmarks/expert_parallel.py [--batch 8] [--seq-len 256] [--repeats 20] [--json]

Two processes on gloo (CPU, fp32) time one optimizer step (zero_grad, forward + loss, backward, AdamW) of a
Mixtral-shaped MoE (h256, 4 layers, 8 experts of width 512, top-2) as the median of `repeats` steps,
contenders interleaved step by step:
  single   the whole model on the whole global batch, in each process at once (the cores as busy as under EP)
  ep 2     shardwise dp 2 x ep 2: each process its half of the batch and 4 of the 8 experts
  a2a      exactly the all-to-alls one EP step issues (counts, dispatch and combine, forward and backward, with
           their uneven splits), recorded from a real step and replayed alone
The floor of an EP step is single / 2 + its all-to-all traffic: half the work, plus what it must move. The
ratio is the median over rounds of (EP step / that round's floor). Goal: <= 1.3x. The EP step also averages
the dense weights' gradients over dp (DDP) and sums the expert gradients (sync_expert_grads): not in the floor.
Timings are only comparable within one run: on a shared machine, compare ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from context_parallel import _batch, _step, _time  # noqa: E402  (the CP benchmark's batch, step and interleaved timer)

from _ranks import add_rank_args, run_and_print, write_json  # noqa: E402
from shardwise.model import Transformer  # noqa: E402
from shardwise.parallel import build_mesh, parallelize, sync_expert_grads  # noqa: E402
from shardwise.specs import Layout, model_from_hf_config  # noqa: E402

MOE = {"model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
       "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 4096,
       "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.01}


class _Recorder:
    """Every all_to_all_single of one step: (output shape, input shape, output splits, input splits, dtype)."""

    def __init__(self):
        self.calls, self.saved = [], dist.all_to_all_single

    def __enter__(self):
        def rec(out, inp, output_split_sizes=None, input_split_sizes=None, group=None, **kw):
            self.calls.append((tuple(out.shape), tuple(inp.shape), output_split_sizes, input_split_sizes, inp.dtype))
            return self.saved(out, inp, output_split_sizes=output_split_sizes, input_split_sizes=input_split_sizes,
                              group=group, **kw)
        dist.all_to_all_single = rec
        return self

    def __exit__(self, *exc):
        dist.all_to_all_single = self.saved
        return False


def _replay(calls, group):
    """A step of exactly the all-to-alls one EP step issues, nothing else."""
    tensors = [(torch.empty(o, dtype=d), torch.ones(i, dtype=d), os_, is_) for o, i, os_, is_, d in calls]

    def once():
        for out, inp, out_splits, in_splits in tensors:
            dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits, group=group)
        return torch.zeros(())
    return once


def _worker(rank, world, args, path):
    torch.set_num_threads(args.threads)
    spec = model_from_hf_config(MOE, "moe-small", "benchmark")
    x, y = _batch(args)
    mesh = build_mesh(1, 2, 1, backend=args.backend, timeout_s=300)
    half = args.batch // 2
    local = [(x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half])]
    chunk = parallelize(Transformer(spec, seed=0), mesh, Layout(dp=2, ep=2))
    ep_step = _step(chunk, local)

    def step():
        loss = ep_step()
        sync_expert_grads(chunk)
        return loss
    with _Recorder() as rec:
        step()
    contenders = {"single_s": _step(parallelize(Transformer(spec, seed=0), None, Layout()), [(x, y)]),
                  "ep_s": step, "a2a_s": _replay(rec.calls, chunk.experts.group("ep"))}
    samples = _time(contenders, args.repeats)
    out = {"params": sum(p.numel() for p in Transformer(spec).parameters()), "batch": args.batch,
           "seq_len": args.seq_len, "repeats": args.repeats, "backend": args.backend, "a2a_calls": len(rec.calls),
           "a2a_bytes": sum(torch.Size(i).numel() * torch.empty((), dtype=d).element_size() for _, i, _, _, d in rec.calls)}
    out.update({name: statistics.median(v) for name, v in samples.items()})
    out["floor_s"] = out["single_s"] / 2 + out["a2a_s"]
    ratios = sorted(e / (s / 2 + a) for e, s, a in zip(samples["ep_s"], samples["single_s"], samples["a2a_s"]))
    out["ratio"], out["ratio_iqr"] = statistics.median(ratios), (ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4])
    write_json(rank, path, out)


def table(r: dict) -> str:
    ms = lambda k: f"{r[k] * 1e3:.1f} ms"  # noqa: E731
    lo, hi = r["ratio_iqr"]
    return "\n".join([
        "| single process | ep 2 step | all-to-alls (calls, MB sent per rank) | floor = single/2 + all-to-alls | ep 2 / floor (goal <= 1.3; IQR) |",
        "|---:|---:|---:|---:|---:|",
        f"| {ms('single_s')} | {ms('ep_s')} | {ms('a2a_s')} ({r['a2a_calls']}, {r['a2a_bytes'] / 1e6:.1f}) | {ms('floor_s')} "
        f"| {r['ratio']:.2f}x ({lo:.2f}-{hi:.2f}) |"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8, help="global batch (sequences), split over the 2 ranks")
    ap.add_argument("--seq-len", type=int, default=256)
    add_rank_args(ap, repeats=20)
    args = ap.parse_args(argv)
    return run_and_print(_worker, args, lambda r: (
        f"world 2 (dp 2 x ep 2), {args.backend}, {r['params']:,}-parameter MoE (8 experts, top-2), global batch "
        f"{args.batch} x {args.seq_len}, median of {args.repeats} interleaved steps, {args.threads} thread(s) per rank"),
        table, timeout_s=600)


if __name__ == "__main__":
    sys.exit(main())
