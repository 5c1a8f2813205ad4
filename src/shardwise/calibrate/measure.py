"""The measurements one rank runs (inside its process group), in rounds spread over the calibration: compute
(calibrate/compute.py) and the calls between layers (calibrate/comm.py), with one timing discipline for all
(calibrate/timer.py)."""

from __future__ import annotations

import os
import platform

import torch

from shardwise.calibrate.comm import measure_collectives, measure_cp, measure_fsdp, measure_sync, measure_tp
from shardwise.calibrate.compute import (measure_copy, measure_loop, measure_matmul, measure_model,
                                         measure_split_backward)
from shardwise.calibrate.config import MODEL_ROUNDS, CalibrateConfig
from shardwise.calibrate.timer import Timer


def measure_rank(cfg: CalibrateConfig, rank: int, world: int, report=lambda label: None) -> dict | None:
    """Every measurement on this rank (in an initialised process group when world > 1), `report(label)`
    after each. Returns the Profile fields on rank 0, None elsewhere."""
    torch.manual_seed(rank)
    t = Timer(cfg, rank, world)
    if world > 1:  # from the first round on, the threads a `train` job of this world holds (Timer.mesh)
        t.mesh()
    out: dict = {}
    # The model and every measurement compared with it run in MODEL_ROUNDS rounds spread over the whole calibration
    # (first, middle, last third; each yields once a round, then computes its figures from all of them), so the rate
    # and the per-call costs hold the same mean load: on a shared machine the load moves within the minutes a
    # calibration takes, and the planner adds the two together. The one-off tables run after the first round.
    rounds = [measure_model(t, out), measure_sync(t, out), measure_fsdp(t, out), measure_split_backward(t, out),
              measure_loop(t, out), measure_cp(t, out), measure_tp(t, out)]
    for r in range(MODEL_ROUNDS):
        for steps in rounds:
            label = next(steps, None)  # None: nothing to measure at this world (or in this torch)
            if label:
                report(label)
        for steps in (measure_matmul(t, out), measure_copy(t, out), measure_collectives(t, out)) if r == 0 else ():
            for label in steps:
                report(label)
    for steps in rounds:  # their figures, from every round
        for label in steps:
            report(label)
    if rank != 0:
        return None
    from shardwise.contention import gloo_loop_threads

    return dict(out, world=world, backend=cfg.backend, device=_device_name(t.device), gloo_loop_threads=gloo_loop_threads(),
                dtype=str(t.dtype).removeprefix("torch."), model=cfg.model.name, tokens=cfg.tokens,
                memory_gib=_memory_gib(t.device, world), repeats=cfg.repeats)


def _device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def _memory_gib(device, world: int) -> float:
    """GPU memory, or on CPU this rank's share of the host RAM."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**30
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / world / 2**30
