"""What every rank measures: timed steps (barrier, slowest rank) and memory (states + saved activations, memory.py)."""

from __future__ import annotations

import random
import time

from shardwise.validate.config import ValidateConfig, describe
from shardwise.validate.memory import STATE_KEYS, measure_memory, worst_over_ranks
from shardwise.validate.stats import spread

# A layout whose spread (IQR / median) exceeds this after its rounds gets one more round.
NOISY = 0.25


def _timed_steps(rt, steps: int, world: int) -> list[float]:
    import torch
    import torch.distributed as dist

    from shardwise.train import train_step

    out = []
    for _ in range(steps):
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        train_step(rt)  # ends with .item() of the loss: the step's work is done
        if rt.device.type == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def _slowest(values: list[float], world: int) -> list[float]:
    """Element-wise max over ranks."""
    import torch
    import torch.distributed as dist

    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def run_rank(cfg: ValidateConfig, rank: int, world: int, report) -> list[dict] | None:
    """Every layout on this rank: build, warm up, timed rounds in random order, memory."""
    import torch

    from shardwise.parallel import build_mesh
    from shardwise.train import TrainConfig, build_runtime, train_step

    torch.manual_seed(cfg.seed)
    runtimes = []
    for lay in cfg.layouts:
        tcfg = TrainConfig(spec=cfg.model, layout=lay, steps=10**6, global_batch=cfg.global_batch,
                           seq_len=cfg.seq_len, seed=cfg.seed, backend=cfg.backend, timeout_s=cfg.timeout_s,
                           progress=False)
        mesh = build_mesh(lay.pp, lay.dp, lay.tp, cp=lay.cp, backend=cfg.backend, timeout_s=cfg.timeout_s) if world > 1 else None
        rt = build_runtime(tcfg, mesh)
        for _ in range(cfg.warmup):
            train_step(rt)
        runtimes.append(rt)
        report(f"built {describe(lay)}")
    order, times = random.Random(cfg.seed), [[] for _ in runtimes]

    def round_of(indices):
        indices = list(indices)
        order.shuffle(indices)
        for i in indices:
            times[i] += _slowest(_timed_steps(runtimes[i], cfg.steps, world), world)
            report(f"timed {describe(cfg.layouts[i])}")

    for _ in range(cfg.repeats):
        round_of(range(len(runtimes)))
    round_of(i for i, ts in enumerate(times) if spread(ts) > NOISY)  # every rank has the same times
    out = []
    for i, rt in enumerate(runtimes):
        worst = worst_over_ranks(measure_memory(rt, train_step)[1])
        out.append({"times": times[i], "memory": {k: worst[k] for k in STATE_KEYS}, "memory_total": worst["total"],
                    "allocator_peak": worst["allocator_peak"]})
        report(f"memory {describe(cfg.layouts[i])}")
    return out if rank == 0 else None
