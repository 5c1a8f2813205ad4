"""Traces of real pipeline runs: the executor's records of every action, gathered from every stage and
written as a Chrome trace (Perfetto) and a picture of the last step, measured above simulated.

    epoch = aligned_epoch()                       # one time zero for every rank (the executor records against it)
    info = write_trace(executor, out_dir, title)  # collective over every rank; a summary on global rank 0

Drawing and the trace format live in timeline.py, shared with the simulator.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from statistics import median

import torch
import torch.distributed as dist

from shardwise.schedules import Costs, simulate
from shardwise.timeline import Event, bubble_fraction, draw_timelines, write_chrome_trace


def aligned_epoch(device="cpu") -> float:
    """The ranks' common time zero for traces: global rank 0's wall clock, broadcast to every rank (on the job's
    device: NCCL moves CUDA tensors only), so every data-parallel replica's pipeline lies on one time axis. Records
    use time.time(), one clock for every process of a machine (exact alignment) and NTP-synchronised across machines
    (alignment to the network's clock skew, typically well under a millisecond). Collective over every rank."""
    epoch = torch.tensor([time.time()], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.broadcast(epoch, src=0)
    return float(epoch.item())


def measured_costs(schedule, events: list[Event]):
    """Per-virtual-stage median F / B (or I and W) durations and the typical transfer time, from one run's
    records (every traced step), as simulator Costs: so the simulated timeline is the same run under the schedule's
    rules — the median, so that one stalled action (a page fault, a neighbour's burst) is not charged to every
    micro-batch of its stage."""
    def per_stage(kinds) -> list[float]:
        out = []
        for stage in range(schedule.num_stages):
            rank, chunk = stage % schedule.p, stage // schedule.p
            d = [e.end - e.start for e in events if e.rank == rank and e.chunk == chunk and e.kind in kinds]
            out.append(median(d) if d else 0.0)
        return out

    split = any(e.kind == "I" for e in events)
    recv = [e.end - e.start for e in events if e.kind == "recv"]
    # The shortest receives are the ones whose data had already arrived: their time is the transfer itself.
    c = median(sorted(recv)[: max(1, len(recv) // 4)]) if recv else 0.0
    return Costs(f=per_stage({"F"}), b=per_stage({"I"} if split else {"B"}), w=per_stage({"W"}) if split else 0.0, c=c)


def write_trace(ex, out_dir, title: str, last_step: int | None = None) -> dict | None:
    """Gather every rank's records to global rank 0 and write there: trace.json (Chrome trace, all steps, every rank
    — each data-parallel replica's pipeline too — opens in Perfetto), timeline.png / .svg (global rank 0's pipeline:
    its last step measured vs simulated with its measured per-stage costs). Collective over every rank; returns a
    summary on rank 0. `last_step`: the run's number of the last traced step (the steps are marked in the trace)."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (dist.get_rank(ex.pp_group), ex.records))
    if dist.get_rank() != 0:
        return None
    mine = set(dist.get_process_group_ranks(ex.pp_group))  # global rank 0's pipeline: the picture's
    events = [e for g, (_, records) in enumerate(gathered) if g in mine for e in records]  # ranks: pipeline ranks
    # each step starts with pipeline rank 0's first forward
    starts = sorted(e.start for e in events if e.kind == "F" and e.rank == 0 and e.microbatch == 0 and e.chunk == 0)
    last_start = starts[-1]
    last = [replace(e, start=e.start - last_start, end=e.end - last_start) for e in events if e.start >= last_start - 1e-9]
    sim = simulate(ex.schedule, measured_costs(ex.schedule, events))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # one track per global rank (its data-, tensor- and context-parallel peers too), named by its pipeline rank
    everyone = [replace(e, rank=g) for g, (_, records) in enumerate(gathered) for e in records]
    names = {g: f"pipeline rank {pp} (rank {g})" for g, (pp, _) in enumerate(gathered)}
    first = (last_step - len(starts) + 1) if last_step is not None else 1  # the run's own step numbers
    write_chrome_trace(everyone, out / "trace.json", names, [(f"step {first + i}", at) for i, at in enumerate(starts)])
    panels = [(f"measured ({ex.schedule.name}, last step)", last), ("simulated with the measured costs", sim.events)]
    for suffix in ("png", "svg"):
        draw_timelines(panels, out / f"timeline.{suffix}", suptitle=title)
    return {"measured_bubble": bubble_fraction(last), "simulated_bubble": sim.bubble_fraction,
            "measured_step_s": max(e.end for e in last) - min(e.start for e in last), "simulated_step_s": sim.makespan,
            "files": [str(out / n) for n in ("trace.json", "timeline.png", "timeline.svg")]}

