"""Start the ranks of a measurement (calibrate, validate): spawned here, or in place under torchrun.

    result = run_ranks(entry, payload, world, backend, timeout_s, report)

`entry(payload, rank, world, report)` runs on every rank inside an initialised process group (none
when world is 1) and returns the result on rank 0 (None elsewhere); rank 0's `report(label)` calls
reach the caller's `report` (a progress bar) across the process boundary.
"""

from __future__ import annotations

import datetime as _dt
import gc
import os
import queue as _queue
import time
from dataclasses import replace

from shardwise.calibrate.config import CalibrateConfig
from shardwise.calibrate.profile import Profile


class CalibrationFailed(RuntimeError):
    """A rank died or hung; the message says which and why."""


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def calibrate(cfg: CalibrateConfig, report=lambda label: None) -> Profile | None:
    """Measure with cfg.world ranks (under torchrun: its world): the Profile on rank 0, None elsewhere."""
    cfg = cfg.resolved()
    if under_torchrun():
        cfg = replace(cfg, world=int(os.environ["WORLD_SIZE"]))
    out = run_ranks(_measure, cfg, cfg.world, cfg.backend, cfg.timeout_s, report)
    return None if out is None else Profile(**out)


def _measure(cfg: CalibrateConfig, rank: int, world: int, report):
    from shardwise.calibrate.measure import measure_rank

    return measure_rank(cfg, rank, world, report)


def run_ranks(entry, payload, world: int, backend: str, timeout_s: float, report=lambda label: None):
    """Run `entry` on `world` ranks; rank 0's result. Raises CalibrationFailed if a rank fails or hangs."""
    if under_torchrun():
        rank = int(os.environ["RANK"])
        return _rank_main(rank, entry, payload, world, backend, timeout_s, "env://",
                          report if rank == 0 else (lambda label: None))
    if world == 1:
        return _rank_main(0, entry, payload, 1, backend, timeout_s, "", report)
    return _spawn(entry, payload, world, backend, timeout_s, report)


def _rank_main(rank, entry, payload, world, backend, timeout_s, init_method, report):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one thread per rank: ranks share the machine's cores as training ranks do
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    if world > 1:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=_dt.timedelta(seconds=timeout_s))
    try:
        return entry(payload, rank, world, report)
    finally:
        if dist.is_initialized():
            # Free what still holds gloo work objects (FSDP's state sits in reference cycles) while the
            # interpreter is alive: freed during its shutdown they abort the process (SIGABRT).
            gc.collect()
            dist.destroy_process_group()


def _spawned(rank, entry, payload, world, backend, timeout_s, init_method, results) -> None:
    """A spawned rank: rank 0 sends its progress and its result to the parent through `results`."""
    report = (lambda label: results.put(("step", label))) if rank == 0 else (lambda label: None)
    out = _rank_main(rank, entry, payload, world, backend, timeout_s, init_method, report)
    if rank == 0:
        results.put(("result", out))


def _spawn(entry, payload, world, backend, timeout_s, report):
    import torch.multiprocessing as mp

    results = mp.get_context("spawn").Queue()
    from shardwise.launch import free_port

    init = f"tcp://127.0.0.1:{free_port()}"
    ranks = mp.start_processes(_spawned, args=(entry, payload, world, backend, timeout_s, init, results),
                               nprocs=world, join=False, start_method="spawn")
    done, out, last = False, None, time.monotonic()
    try:
        while True:
            try:
                kind, value = results.get(timeout=0.2)
                last = time.monotonic()
                if kind == "step":
                    report(value)
                else:
                    done, out = True, value
            except _queue.Empty:
                pass
            try:
                if ranks.join(timeout=0) and done:
                    return out
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
                raise CalibrationFailed(f"rank {exc.error_index} failed: {_last_line(str(exc))}") from None
            if time.monotonic() - last > timeout_s:  # the ranks' own collective timeouts fire first
                raise CalibrationFailed(f"no progress for {timeout_s:.0f} s — a rank hangs; "
                                        f"measure less at a time, or give a longer --timeout")
    finally:
        for p in ranks.processes:
            if p.is_alive():
                p.terminate()


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else text
