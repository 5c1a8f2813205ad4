"""Start the ranks of a calibration: spawned here, or this process as one rank under torchrun."""

from __future__ import annotations

import datetime as _dt
import os
import queue as _queue
import socket
import time
from dataclasses import replace

from shardwise.calibrate.config import CalibrateConfig
from shardwise.calibrate.profile import Profile


class CalibrationFailed(RuntimeError):
    """A rank died or hung; the message says which and why."""


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def calibrate(cfg: CalibrateConfig, report=lambda label: None) -> Profile | None:
    """Measure with cfg.world ranks: the Profile (None on torchrun ranks other than 0).

    Under torchrun this process is one rank and the world comes from the environment; otherwise
    cfg.world ranks are spawned and this process only relays their progress and collects the result."""
    cfg = cfg.resolved()
    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        cfg = replace(cfg, world=world)
        return _run_rank(cfg, rank, "env://", report if rank == 0 else (lambda label: None))
    if cfg.world == 1:
        return _run_rank(cfg, 0, "", report)
    return _spawn(cfg, report)


def _run_rank(cfg: CalibrateConfig, rank: int, init_method: str, report) -> Profile | None:
    import torch
    import torch.distributed as dist

    from shardwise.calibrate.measure import measure_rank

    if cfg.device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    if cfg.world > 1:
        dist.init_process_group(cfg.backend, init_method=init_method, rank=rank, world_size=cfg.world,
                                timeout=_dt.timedelta(seconds=cfg.timeout_s))
    try:
        out = measure_rank(cfg, rank, cfg.world, report)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return None if out is None else Profile(**out)


def _spawned(rank: int, cfg: CalibrateConfig, init_method: str, results) -> None:
    """A spawned rank: rank 0 sends its progress and the result to the parent through `results`."""
    report = (lambda label: results.put(("step", label))) if rank == 0 else (lambda label: None)
    profile = _run_rank(cfg, rank, init_method, report)
    if profile is not None:
        results.put(("result", profile))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(cfg: CalibrateConfig, report) -> Profile:
    import torch.multiprocessing as mp

    results = mp.get_context("spawn").Queue()
    ranks = mp.start_processes(_spawned, args=(cfg, f"tcp://127.0.0.1:{_free_port()}", results),
                               nprocs=cfg.world, join=False, start_method="spawn")
    profile, last = None, time.monotonic()
    try:
        while True:
            try:
                kind, value = results.get(timeout=0.2)
                last = time.monotonic()
                if kind == "step":
                    report(value)
                else:
                    profile = value
            except _queue.Empty:
                pass
            try:
                if ranks.join(timeout=0) and profile is not None:
                    return profile
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
                raise CalibrationFailed(f"rank {exc.error_index} failed: {_last_line(str(exc))}") from None
            if time.monotonic() - last > cfg.timeout_s:  # the ranks' own collective timeouts fire first
                raise CalibrationFailed(f"no progress for {cfg.timeout_s:.0f} s — a rank hangs; "
                                        f"use fewer or smaller --sizes, or a longer --timeout")
    finally:
        for p in ranks.processes:
            if p.is_alive():
                p.terminate()


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else text
