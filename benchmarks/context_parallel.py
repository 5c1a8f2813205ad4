"""Context parallelism against its floor, world 2, in one run (ratios, not tests).

    python benchmarks/context_parallel.py [--batch 2] [--seq-len 1024] [--repeats 20] [--json]

Two processes on gloo (CPU, fp32; nccl on GPUs with --backend nccl: models, batches and the replayed K/V on each
rank's GPU, the device synchronized before each timer is read) time one optimizer step (zero_grad,
forward + loss, backward, the gradient average over cp, AdamW) of a 3M-parameter Llama (h256, 4 layers, 8
heads, 4 KV heads) as the median of `repeats` steps, contenders interleaved step by step:
  single     the whole model on the whole batch, in each process at once (so the cores are as busy as under CP)
  cp ring    shardwise cp=2, K/V passed around the ring (`--cp-mode ring`)
  cp gather  shardwise cp=2, K/V all-gathered (`--cp-mode allgather`)
  K/V comm   exactly the K/V traffic one CP step moves, recorded from a real step, replayed alone (per mode)
The floor of a CP step is single / 2 + its K/V traffic: half the work, plus what it must move. The ratio is the
median over rounds of (CP step / that round's floor). Goal: cp 2 step <= 1.3x its floor. Timings are only comparable within one run: on a shared machine, compare ratios.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time

import torch
import torch.distributed as dist

from _ranks import add_rank_args, run_and_print, write_json
from shardwise.model import Transformer
from shardwise.parallel import build_mesh, parallelize, shard_sequence
from shardwise.parallel.mesh import collective_device
from shardwise.specs import Layout, model_from_hf_config
from shardwise.train import forward_backward

cp_module = importlib.import_module("shardwise.parallel.context_parallel")  # the module, not the function

SMALL = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 8192}


def _batch(args, device):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (args.batch, args.seq_len + 1), generator=g).to(device)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def _sync(device) -> None:
    """Wait for the work queued on `device` (a GPU runs it after the host returns; NCCL on streams of its own)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step(chunk, microbatches):
    opt = torch.optim.AdamW(chunk.module.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = forward_backward([chunk], microbatches)
        opt.step()
        return loss
    return step


# --------------------------------------------------------------------------- the K/V traffic of one step


class _Recorder:
    """Every point-to-point exchange and collective the CP attention issues in one step: (kind, shape, dtype)."""

    def __init__(self):
        self.calls = []
        self.saved = (cp_module._Ring.exchange, cp_module._all_gather_single, cp_module._reduce_scatter_single)

    def __enter__(self):
        exchange, gather, scatter = self.saved
        calls = self.calls

        def rec_exchange(ring, send, tag):
            calls.append(("p2p", tuple(send.shape), send.dtype))
            return exchange(ring, send, tag)

        def rec(kind, fn):
            def wrapped(out, inp, group):
                calls.append((kind, tuple(inp.shape), inp.dtype))
                return fn(out, inp, group=group)
            return wrapped
        cp_module._Ring.exchange = rec_exchange
        cp_module._all_gather_single, cp_module._reduce_scatter_single = rec("ag", gather), rec("rs", scatter)
        return self

    def __exit__(self, *exc):
        cp_module._Ring.exchange, cp_module._all_gather_single, cp_module._reduce_scatter_single = self.saved
        return False


def _replay(calls, group, device):
    """A step of exactly the K/V traffic one CP step moves, nothing else."""
    ring, size = cp_module._Ring(group), dist.get_world_size(group)
    tensors = [(kind, torch.randn(shape).to(device, dtype)) for kind, shape, dtype in calls]

    def once():
        for i, (kind, t) in enumerate(tensors):
            if kind == "p2p":
                works, _ = ring.exchange(t, tag=i)
                for w in works:
                    w.wait()
            elif kind == "ag":
                cp_module._all_gather_single(t.new_empty((t.shape[0] * size,) + t.shape[1:]), t, group=group)
            else:
                cp_module._reduce_scatter_single(t.new_empty((t.shape[0] // size,) + t.shape[1:]), t, group=group)
        return torch.zeros(())
    return once


def _time(steps: dict, repeats: int, device) -> dict:
    """Seconds per contender and round, samples interleaved step by step, ranks starting each step together; on a
    GPU each sample ends when the device has finished the step (its collectives included)."""
    for step in steps.values():
        for _ in range(2):
            step()
    samples = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            _sync(device)
            dist.barrier()
            t0 = time.perf_counter()
            float(step().detach())
            _sync(device)
            samples[name].append(time.perf_counter() - t0)
    return samples


def _worker(rank, world, args, path):
    torch.set_num_threads(args.threads)
    spec = model_from_hf_config(SMALL, "small", "benchmark")
    device = collective_device()  # this rank's GPU under nccl (the runtime's choice), else the CPU
    x, y = _batch(args, device)
    mesh = build_mesh(1, 1, 1, cp=2, backend=args.backend, timeout_s=300)
    local = [(shard_sequence(x, 2, rank), shard_sequence(y, 2, rank))]
    contenders = {"single_s": _step(parallelize(Transformer(spec, seed=0), None, Layout(), device), [(x, y)])}
    comm = {}
    for mode in ("ring", "allgather"):
        chunk = parallelize(Transformer(spec, seed=0), mesh, Layout(cp=2, cp_mode=mode), device,
                            seq_len=args.seq_len)
        contenders[f"cp_{mode}_s"] = step = _step(chunk, local)
        with _Recorder() as rec:
            step()
        comm[mode] = rec.calls
        contenders[f"kv_{mode}_s"] = _replay(rec.calls, mesh["cp"].get_group(), device)
    out = {"params": sum(p.numel() for p in Transformer(spec).parameters()), "batch": args.batch, "seq_len": args.seq_len,
           "repeats": args.repeats, "backend": args.backend}
    samples = _time(contenders, args.repeats, device)
    out.update({name: statistics.median(v) for name, v in samples.items()})
    for mode, calls in comm.items():
        out[f"kv_{mode}_calls"] = len(calls)
        out[f"kv_{mode}_bytes"] = sum(torch.Size(s).numel() * torch.empty((), dtype=d).element_size() for _, s, d in calls)
        out[f"floor_{mode}_s"] = out["single_s"] / 2 + out[f"kv_{mode}_s"]
        # per round: this round's CP step over this round's floor (the contenders ran back to back)
        ratios = sorted(c / (s / 2 + k) for c, s, k in zip(samples[f"cp_{mode}_s"], samples["single_s"], samples[f"kv_{mode}_s"]))
        out[f"ratio_{mode}"] = statistics.median(ratios)
        out[f"ratio_{mode}_iqr"] = (ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4])
    write_json(rank, path, out)


def table(r: dict) -> str:
    ms = lambda k: f"{r[k] * 1e3:.1f} ms"  # noqa: E731
    rows = ["| mode | single process | cp 2 step | K/V traffic (calls, MB) | floor = single/2 + K/V | cp 2 / floor (goal <= 1.3; IQR) |",
            "|---|---:|---:|---:|---:|---:|"]
    for mode in ("ring", "allgather"):
        lo, hi = r[f"ratio_{mode}_iqr"]
        rows.append(f"| {mode} | {ms('single_s')} | {ms(f'cp_{mode}_s')} | {ms(f'kv_{mode}_s')} ({r[f'kv_{mode}_calls']}, "
                    f"{r[f'kv_{mode}_bytes'] / 1e6:.1f}) | {ms(f'floor_{mode}_s')} | {r[f'ratio_{mode}']:.2f}x ({lo:.2f}-{hi:.2f}) |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=1024)
    add_rank_args(ap, repeats=20)
    args = ap.parse_args(argv)
    return run_and_print(_worker, args, lambda r: (
        f"world 2 (cp 2), {args.backend}, {r['params']:,}-parameter Llama, batch {args.batch} x {args.seq_len}, "
        f"median of {args.repeats} interleaved steps, {args.threads} thread(s) per rank"), table, timeout_s=600)


if __name__ == "__main__":
    sys.exit(main())
