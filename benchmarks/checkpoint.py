"""Checkpoint save / load time and bytes written: shardwise (DCP, world 2) against one plain torch.save.

    python benchmarks/checkpoint.py [--models tiny,gpt2] [--layout tp2|dp2] [--repeats 5] [--dir /tmp] [--json]

Per model, two processes (gloo, CPU, fp32) build the layout's runtime and train one step (so AdamW has its
moments); rank 0 also builds the single-process runtime and trains the same step. Then, interleaved, `repeats`
times each:
  shardwise save    both ranks write their shards (DCP), hash them, rank 0 publishes step_NNNNNN atomically
  torch.save        rank 0 alone: {model.state_dict(), optimizer.state_dict(), step, rng} to one file + fsync
  shardwise load    both ranks read their slices into the runtime (restore: size checks, safe index, DCP)
  torch.load        rank 0 alone: torch.load(weights_only=True) + load_state_dict of model and optimizer
  verify            rank 0: what `train --resume` checks once before starting (manifest, every file's sha256,
                    the index), reported separately
Medians of the repeats; ratio = shardwise / torch.save in the same run. Timings depend on the disk and the page
cache (DCP fsyncs each file; the baseline fsyncs its one file too): compare ratios, rerun on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from shardwise import checkpoint
from shardwise.launch import spawn_ranks
from shardwise.parallel import build_mesh
from shardwise.specs import Layout, load_model
from shardwise.train import TrainConfig, build_runtime, train_step

LAYOUTS = {"tp2": Layout(tp=2, micro_batch=2), "dp2": Layout(dp=2, micro_batch=1)}


def _cfg(model: str, layout: Layout) -> TrainConfig:
    return TrainConfig(load_model(model), layout, steps=10, global_batch=2, seq_len=32, progress=False)


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def _timed(fn) -> float:
    if dist.is_initialized():
        dist.barrier()
    start = time.perf_counter()
    fn()
    if dist.is_initialized():
        dist.barrier()
    return time.perf_counter() - start


def _torch_save(rt, file: Path) -> None:
    state = {"model": rt.models[0].state_dict(), "optimizer": rt.optimizer.state_dict(), "step": rt.step,
             "rng": torch.get_rng_state()}
    with open(file, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def _torch_load(rt, file: Path) -> None:
    state = torch.load(file, map_location="cpu", weights_only=True)
    rt.models[0].load_state_dict(state["model"])
    rt.optimizer.load_state_dict(state["optimizer"])


def _measure(rt, single, repeats: int, work: Path) -> dict:
    """Collective over the job; rank 0 returns the medians."""
    rank0 = dist.get_rank() == 0
    times = {k: [] for k in ("save", "torch_save", "load", "torch_load", "verify")}
    sizes = {}
    for i in range(repeats):
        root = work / f"dcp_{i}"
        times["save"].append(_timed(lambda: checkpoint.save(rt, root)))
        ckpt = checkpoint.store.step_dir(root, rt.step)
        file = work / f"plain_{i}.pt"
        times["torch_save"].append(_timed(lambda: _torch_save(single, file) if rank0 else None))
        times["load"].append(_timed(lambda: checkpoint.restore(rt, ckpt)))
        times["torch_load"].append(_timed(lambda: _torch_load(single, file) if rank0 else None))
        times["verify"].append(_timed(lambda: checkpoint.validate(ckpt, rt.cfg.spec) if rank0 else None))
        if rank0:
            sizes = {"save": _bytes(ckpt), "torch_save": file.stat().st_size,
                     "files": len(list(ckpt.iterdir()))}
            shutil.rmtree(root)
            file.unlink()
        dist.barrier()
    return {k: statistics.median(v) for k, v in times.items()} | {"bytes": sizes}


def _worker(rank: int, world: int, jobs, repeats: int, work: str, out: str) -> None:
    results = []
    for model, layout in jobs:
        cfg = _cfg(model, layout)
        rt = build_runtime(cfg, build_mesh(layout.pp, layout.dp, layout.tp, backend="gloo", timeout_s=600))
        train_step(rt)
        single = None
        if rank == 0:
            single = build_runtime(TrainConfig(cfg.spec, Layout(micro_batch=2), steps=10, global_batch=2, seq_len=32,
                                               progress=False), None)
            train_step(single)
        res = _measure(rt, single, repeats, Path(work))
        results.append({"model": model, "layout": layout.describe(), "parameters": cfg.spec.num_params(), **res})
        del rt, single
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,gpt2", help="model presets (default tiny,gpt2 — gpt2 is 124M parameters)")
    p.add_argument("--layout", default="tp2", choices=sorted(LAYOUTS), help="the world-2 layout that saves and loads")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    jobs = [(m, LAYOUTS[args.layout]) for m in args.models.split(",")]
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        out = os.path.join(work, "results.json")
        spawn_ranks(_worker, 2, jobs, args.repeats, work, out, timeout_s=600)
        results = json.loads(Path(out).read_text())
    if args.json:
        print(json.dumps(results, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"checkpoint save / load, world 2 ({args.layout}) vs one torch.save, median of {args.repeats}")
    for col in ("model", "params", "", "save s", "load s", "written", "files", "save ×", "load ×", "verify s"):
        t.add_column(col, justify="left" if col in ("model", "") else "right")
    for r in results:
        b = r["bytes"]
        t.add_row(r["model"], f"{r['parameters'] / 1e6:.1f}M", f"shardwise {r['layout']}", f"{r['save']:.3f}",
                  f"{r['load']:.3f}", _mb(b["save"]), str(b["files"]), f"{r['save'] / r['torch_save']:.2f}",
                  f"{r['load'] / r['torch_load']:.2f}", f"{r['verify']:.3f}")
        t.add_row("", "", "torch.save, 1 rank", f"{r['torch_save']:.3f}", f"{r['torch_load']:.3f}", _mb(b["torch_save"]),
                  "1", "1.00", "1.00", "")
    Console(width=max(140, Console().width)).print(t)


if __name__ == "__main__":
    main()
