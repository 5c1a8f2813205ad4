"""What every rank measures: timed steps (barrier, slowest rank) and memory (states + saved activations, memory.py)."""

from __future__ import annotations

import random

from shardwise.validate.config import ValidateConfig, describe
from shardwise.validate.memory import STATE_KEYS, measure_memory, worst_over_ranks
from shardwise.validate.stats import spread

# A layout whose spread (IQR / median) exceeds this after its rounds gets one more round.
NOISY = 0.25


def _timed_steps(loop, steps: int, world: int) -> list[float]:
    """`steps` steps of `train`'s own loop after a barrier, each timed as the loop times it (from its start
    to the next step's start, the last one to its read-back)."""
    import torch
    import torch.distributed as dist

    if world > 1:
        dist.barrier()
    records = loop.run(steps)
    if loop.rt.device.type == "cuda":
        torch.cuda.synchronize()
    return [r["step_time_s"] for r in records]


def _slowest(values: list[float], world: int) -> list[float]:
    """Element-wise max over ranks."""
    import torch
    import torch.distributed as dist

    from shardwise.parallel.mesh import collective_device

    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _reference(cfg: ValidateConfig, rank: int, world: int, mesh=None):
    """calibrate's reference workloads, to time again after every layout's steps in every round of the sweep:
    its model's forward + backward at one sequence ("reference", calibrate.timer.reference), at a handful of tokens
    where the calibration measured its host's floor ("host": a GPU's), and, at world > 1,
    one layer's forward alone, with an all-reduce, with a send/recv and with the pipeline executor's exchange of its
    activation after it ("layer", "both", "p2p", "exchange": calibrate.comm.call_workloads, the calls between layers)
    and a layer plain and under ZeRO-3 ("plain", "sharded": calibrate.comm.fsdp_workloads, FSDP's calls), side by side, every rank at once, each repeat
    as long as the slowest rank. Returns a function giving each one's seconds per call for a few repeats. The
    machine's speed can move between a calibration and a sweep minutes later (a virtual machine's host, other
    processes), and its compute and its calls need not move alike; these figures beside the calibration's own
    say by how much (validate.machine_speed)."""
    from shardwise.calibrate.config import CalibrateConfig
    from shardwise.calibrate.comm import call_workloads, fsdp_workloads
    from shardwise.calibrate.timer import Timer, reference

    t = Timer(CalibrateConfig(model=cfg.model, world=world, backend=cfg.backend, seq_len=cfg.seq_len, repeats=3,
                              warmup=1, timeout_s=cfg.timeout_s), rank, world, mesh)
    fns = {"reference": reference(t)}
    if (cfg.cluster.measured or {}).get("host_floor_points"):  # a GPU's calibration: its host's floor too
        from shardwise.calibrate.compute import HOST_FLOOR_TOKENS

        fns["host"] = reference(t, HOST_FLOOR_TOKENS)
    if world > 1:
        calls, _ = call_workloads(t)
        fsdp, _ = fsdp_workloads(t)
        fns.update({k: calls[k] for k in ("layer", "both", "p2p", "exchange")}, plain=fsdp["plain"],
                   sharded=fsdp["sharded"])
    return lambda: t.interleaved(fns, REFERENCE_REPEATS, barrier_each=world > 1)


REFERENCE_REPEATS = 1  # after each layout's steps in each round (~20 ms per workload)


def mesh_split(lay) -> tuple[int, int, int, int]:
    """The mesh a layout runs on, (pp, dp, tp, cp): every layout of one split shares one mesh, and run_rank builds the
    meshes from one pool of groups (build_mesh(pool=)), so the sweep holds the process groups of about one `train`
    job. Why it matters on a CPU: every gloo process group keeps a thread that wakes 100 times a second (gloo's tcp
    Loop::run polls epoll with a 10 ms timeout), and a DeviceMesh holds one group per dimension. A mesh per layout gave
    the default world-2 sweep's ranks 91 such threads (4 now; the calibration holds 5): 9,000 wake-ups a second,
    8-11 % of a core, the compute thread preempted ~1,000 times a second — 1.24x slower on a quiet machine, and up
    to 5x faster beside busy neighbours, whose CPU time the wake-ups won (docs/accuracy.md, "Idle process groups")."""
    return lay.pp, lay.dp, lay.tp, lay.cp


def run_rank(cfg: ValidateConfig) -> dict | None:
    """Every layout on this rank (started by `launch.run_ranks`): build, warm up, timed rounds in random
    order, memory. On rank 0 {"layouts": the measurements, "reference_s": {workload: its seconds per call after every
    layout's steps of every round} (_reference), "gloo_loop_threads": its gloo groups' event-loop threads}; None elsewhere."""
    import torch
    import torch.distributed as dist

    from shardwise.launch import progress as report

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)

    from shardwise.parallel import build_mesh
    from shardwise.train import TrainConfig, TrainLoop, build_runtime, train_step

    torch.manual_seed(cfg.seed)
    loops, meshes, groups = [], {}, {}
    for lay in cfg.layouts:
        tcfg = TrainConfig(spec=cfg.model, layout=lay, steps=10**6, global_batch=cfg.global_batch,
                           seq_len=cfg.seq_len, seed=cfg.seed, backend=cfg.backend, timeout_s=cfg.timeout_s,
                           progress=False)
        split = mesh_split(lay)
        if world > 1 and split not in meshes:
            meshes[split] = build_mesh(*split[:3], cp=split[3], backend=cfg.backend, timeout_s=cfg.timeout_s,
                                       pool=groups)
        rt = build_runtime(tcfg, meshes.get(split))
        for _ in range(cfg.warmup):
            train_step(rt)
        loops.append(TrainLoop(rt, last=10**6))
        report(f"built {describe(lay)}")
    order, times = random.Random(cfg.seed), [[] for _ in loops]
    # the sweep's data-parallel mesh, when it has one, for the reference's ZeRO-3 layer (mesh_split: no more groups)
    reference, reference_s = _reference(cfg, rank, world, meshes.get((1, world, 1, 1))), {}

    def round_of(indices):
        indices = list(indices)
        order.shuffle(indices)
        for i in indices:
            times[i] += _slowest(_timed_steps(loops[i], cfg.steps, world), world)
            report(f"timed {describe(cfg.layouts[i])}")
            for name, seconds in reference().items():  # after every layout: the machine's speed all through the sweep
                reference_s.setdefault(name, []).extend(seconds)

    for _ in range(cfg.repeats):
        round_of(range(len(loops)))
    round_of(i for i, ts in enumerate(times) if spread(ts) > NOISY)  # every rank has the same times
    out = []
    for i, loop in enumerate(loops):
        worst = worst_over_ranks(measure_memory(loop.rt, train_step)[1])
        out.append({"times": times[i], "memory": {k: worst[k] for k in STATE_KEYS}, "memory_total": worst["total"],
                    "allocator_peak": worst["allocator_peak"]})
        report(f"memory {describe(cfg.layouts[i])}")
    from shardwise.contention import gloo_loop_threads

    # gloo's idle wake-ups beside the sweep (mesh_split says why they matter on a CPU)
    return {"layouts": out, "reference_s": reference_s, "gloo_loop_threads": gloo_loop_threads()} if rank == 0 else None
