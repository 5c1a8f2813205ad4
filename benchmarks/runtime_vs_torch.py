"""shardwise's runtime against PyTorch's own, same model, same layout, world 2, in one run (ratios, not tests).

    python benchmarks/runtime_vs_torch.py [--models tiny,small] [--batch 8] [--seq-len 64]
                                          [--repeats 60] [--json]

Per model, two processes on gloo (CPU, fp32; nccl on GPUs with --backend nccl: models, batches and the replayed
collectives on each rank's GPU, the device synchronized before each timer is read) time one optimizer step
(zero_grad, forward + loss, backward, AdamW) as the median of `repeats` steps, contenders interleaved:
  TP    shardwise tensor_parallel (tp=2)  vs  DTensor: parallelize_module with ColwiseParallel /
        RowwiseParallel on the same linears, vocab-parallel embedding and head, loss_parallel
        (torchtitan's plan). Goal: <= 0.5x.
  floor the TP step's floor: the single-process step / tp, plus the measured time of exactly the
        collectives one TP step issues (recorded, then replayed alone).
  DP    shardwise data_parallel (dp=2, ZeRO 0) vs bare DistributedDataParallel. Goal: <= 1.05x.
  Also the full shardwise train_step (adds data sampling, global-norm clipping and the loss all-reduce).
Timings are only comparable within one run: on a shared machine, rerun and compare ratios.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time

import torch
import torch.distributed as dist

from shardwise.model import Transformer
from _ranks import add_rank_args, run_and_print, write_json
from shardwise.parallel import build_mesh, parallelize, tensor_parallel
from shardwise.parallel.mesh import collective_device
from shardwise.specs import Layout, load_model, model_from_hf_config
from shardwise.train import TrainConfig, build_runtime, forward_backward, train_step

tp_module = importlib.import_module("shardwise.parallel.tensor_parallel")  # the module, not the function

SMALL = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 512}


def spec_for(name: str):
    return model_from_hf_config(SMALL, "small", "benchmark") if name == "small" else load_model(name)


# --------------------------------------------------------------------------- the step being timed


def _batch(args, device, rank_rows=None):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (args.batch, args.seq_len + 1), generator=g)
    if rank_rows is not None:
        x = x[rank_rows]
    x = x.to(device)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def _sync(device) -> None:
    """Wait for the work queued on `device` (a GPU runs it after the host returns; NCCL on streams of its own)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step_fn(model, x, y, loss_ctx=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        with loss_ctx() if loss_ctx else _null():
            loss = model(x, y)
            loss.backward()
        opt.step()
        return loss
    return step


def _runtime_step(chunk, x, y):
    """The runtime's own path: forward_backward (grad_sync, loss scaling) then AdamW."""
    opt = torch.optim.AdamW(chunk.module.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = forward_backward([chunk], [(x, y)])
        opt.step()
        return loss
    return step


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _time(steps: dict, args, device) -> dict:
    """Median seconds of one step of each contender over `repeats` samples, after warm-up. Samples are
    interleaved step by step (A B C A B C ...) so every contender sees the same load on a shared machine;
    the ranks start each step together (a barrier outside the timed region); on a GPU a sample ends when the device
    has finished the step (its collectives included)."""
    for step in steps.values():
        for _ in range(3):
            step()
    samples = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            _sync(device)
            dist.barrier()
            t0 = time.perf_counter()
            loss = step()
            float(loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach())
            _sync(device)
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in samples.items()}


# --------------------------------------------------------------------------- the contenders


def dtensor_tp(spec, mesh, device):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = Transformer(spec, seed=0).to(device)  # buffers too (parallelize_module moves only what it shards)
    plan = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i, block in model.layers.items():
        for name in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3"):
            owner, leaf = name.split(".")
            if getattr(getattr(block, owner), leaf) is not None:  # gpt2 has no w3
                plan[f"layers.{i}.{name}"] = ColwiseParallel()
        plan[f"layers.{i}.attention.wo"] = RowwiseParallel()
        plan[f"layers.{i}.feed_forward.w2"] = RowwiseParallel()
    return parallelize_module(model, mesh["tp"], plan)


def _record_tp_collectives(step) -> list[tuple]:
    """Run one step with the TP collectives wrapped, returning (op, shape, dtype) for each call."""
    calls = []
    originals = {"all_reduce": dist.all_reduce, "ag": tp_module._all_gather_single, "rs": tp_module._reduce_scatter_single}

    def rec(kind, fn):
        def wrapped(*a, **k):
            t = a[0] if kind == "all_reduce" else a[1]
            calls.append((kind, tuple(t.shape), t.dtype))
            return fn(*a, **k)
        return wrapped
    dist.all_reduce = rec("all_reduce", originals["all_reduce"])
    tp_module._all_gather_single, tp_module._reduce_scatter_single = rec("ag", originals["ag"]), rec("rs", originals["rs"])
    try:
        step()
    finally:
        dist.all_reduce, tp_module._all_gather_single = originals["all_reduce"], originals["ag"]
        tp_module._reduce_scatter_single = originals["rs"]
    return calls


def _replay(calls, group, device):
    """A step of exactly the collectives one TP step issues, nothing else."""
    tensors = [(kind, torch.randn(shape).to(device, dtype), group) for kind, shape, dtype in calls]
    size = dist.get_world_size(group)

    def once():
        for kind, t, g in tensors:
            if kind == "all_reduce":
                dist.all_reduce(t, group=g)
            elif kind == "ag":
                out = t.new_empty((t.shape[0] * size,) + t.shape[1:])
                tp_module._all_gather_single(out, t, group=g)
            else:
                out = t.new_empty((t.shape[0] // size,) + t.shape[1:])
                tp_module._reduce_scatter_single(out, t, group=g)
        return torch.zeros(())
    return once


# --------------------------------------------------------------------------- one model, both ranks


def bench_model(name: str, args, rank: int) -> dict:
    from torch.distributed.tensor.parallel import loss_parallel

    spec = spec_for(name)
    device = collective_device()  # this rank's GPU under nccl (the runtime's choice), else the CPU
    x, y = _batch(args, device)
    xl, yl = _batch(args, device, slice(rank * args.batch // 2, (rank + 1) * args.batch // 2))
    tp_mesh = build_mesh(1, 1, 2, backend=args.backend, timeout_s=120)
    dp_mesh = build_mesh(1, 2, 1, backend=args.backend, timeout_s=120)
    ours_tp = _step_fn(tensor_parallel(Transformer(spec, seed=0), tp_mesh["tp"]).model.to(device), x, y)
    calls = _record_tp_collectives(ours_tp)
    cfg = TrainConfig(spec, Layout(dp=2, micro_batch=args.batch // 2), steps=10**6, global_batch=args.batch,
                      seq_len=args.seq_len, backend=args.backend, progress=False)
    rt = build_runtime(cfg, dp_mesh)
    ids = [device.index] if device.type == "cuda" else None  # DDP's one device per process
    contenders = {
        # the whole model in each process at once, so the cores are as busy as under TP
        "single_s": _step_fn(Transformer(spec, seed=0).to(device), x, y),
        "tp_shardwise_s": ours_tp,
        "tp_dtensor_s": _step_fn(dtensor_tp(spec, tp_mesh, device), x, y, loss_parallel),
        "tp_comm_s": _replay(calls, tp_mesh["tp"].get_group(), device),
        "dp_shardwise_s": _runtime_step(parallelize(Transformer(spec, seed=0), dp_mesh, Layout(dp=2), device), xl, yl),
        "dp_ddp_s": _step_fn(torch.nn.parallel.DistributedDataParallel(Transformer(spec, seed=0).to(device), device_ids=ids),
                             xl, yl),
        "dp_train_step_s": lambda: torch.tensor(train_step(rt)["loss"]),
    }
    out = {"model": name, "params": sum(p.numel() for p in Transformer(spec).parameters()), "tp_collectives": len(calls)}
    out.update(_time(contenders, args, device))
    out["tp_floor_s"] = out["single_s"] / 2 + out["tp_comm_s"]
    return out


def _worker(rank, world, args, path):
    torch.set_num_threads(args.threads)
    results = [bench_model(name, args, rank) for name in args.models.split(",")]
    write_json(rank, path, results)


def table(results: list[dict]) -> str:
    rows = ["| model | params | TP shardwise | TP DTensor | ratio (goal <= 0.5) | TP floor (collectives) | TP / floor "
            "| DP shardwise | bare DDP | ratio (goal <= 1.05) | shardwise train_step (DP) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        ms = lambda k: f"{r[k] * 1e3:.1f} ms"  # noqa: E731
        rows.append(f"| {r['model']} | {r['params']:,} | {ms('tp_shardwise_s')} | {ms('tp_dtensor_s')} | "
                    f"{r['tp_shardwise_s'] / r['tp_dtensor_s']:.2f}x | {ms('tp_floor_s')} ({r['tp_collectives']} in "
                    f"{r['tp_comm_s'] * 1e3:.1f} ms) | {r['tp_shardwise_s'] / r['tp_floor_s']:.2f}x | {ms('dp_shardwise_s')} | "
                    f"{ms('dp_ddp_s')} | {r['dp_shardwise_s'] / r['dp_ddp_s']:.2f}x | {ms('dp_train_step_s')} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,small", help="comma-separated: presets or 'small' (h256, 4 layers)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    add_rank_args(ap, repeats=60)
    args = ap.parse_args(argv)
    return run_and_print(_worker, args, lambda _: (
        f"world 2, {args.backend}, batch {args.batch} x {args.seq_len}, median of {args.repeats} interleaved steps, "
        f"{args.threads} thread(s) per rank"), table, timeout_s=120)


if __name__ == "__main__":
    sys.exit(main())
