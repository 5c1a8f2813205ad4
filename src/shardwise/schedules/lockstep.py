"""DeepSpeed's pipeline as its engine runs it: `TrainSchedule` (deepspeed/runtime/pipe/schedule.py, v0.5.5), its
only training schedule. 1F1B's order, but in 2(m + p - 1) lockstep steps: at each step a stage first exchanges
with one neighbour, then computes. A forward step receives the activation and sends back the previous step's
gradient (both with the stage before); a backward step sends the previous step's activation and receives the
gradient (both with the stage after). The transfers block both ends (p2p.py's `dist.send` / `dist.recv`), so a
pair meets when both have finished their previous step and runs its transfers one after the other.

The planner times this with `closed_forms.lockstep_transfers` (1F1B's makespan without transfers, plus that many
transfers); this simulation draws it (the report's timeline), with the simulator's `Simulation` and `Event`s.
"""

from __future__ import annotations

from shardwise.schedules.generators import build
from shardwise.schedules.simulate import Costs, Simulation, _inflight
from shardwise.timeline import Event


def train_schedule_step(p: int, stage: int, step: int) -> tuple[int, bool]:
    """(micro-batch, is_forward) of `stage` at `step`; a micro-batch outside 0..m-1 means the stage idles.
    TrainSchedule._step_to_micro_batch and its four _even/_odd_step_*_id helpers, transcribed."""
    even_step, even_stage = step % 2 == 0, stage % 2 == 0
    if even_step and even_stage:
        return step // 2 - stage // 2, True
    if not even_step and not even_stage:
        return (step - 1) // 2 - stage // 2, True
    if even_step:
        return step // 2 - p + (stage + 1) // 2, False
    return (step - 1) // 2 - p + 1 + stage // 2, False


def simulate_lockstep(p: int, m: int, costs: Costs = Costs()) -> Simulation:
    """TrainSchedule's step with `costs` (per stage: forward f, a full backward b + w; each transfer c)."""
    valid = range(m)
    end = [0.0] * p
    events, transfers = [], []
    for t in range(2 * (m + p - 1)):
        plan = []
        for s in range(p):
            mb, fwd = train_schedule_step(p, s, t)
            prev = train_schedule_step(p, s, t - 1)[0] if t else -1
            peer = s - 1 if fwd else s + 1
            n = (mb in valid) + (prev in valid) if 0 <= peer < p else 0
            plan.append((mb, fwd, peer, n))
        start = [max(end[s], end[peer]) + n * costs.c if n else end[s] for s, (_, _, peer, n) in enumerate(plan)]
        for s, (mb, fwd, peer, n) in enumerate(plan):
            if n:  # the pair's blocking exchange, before the compute
                transfers.append(Event(s, "send", mb, 0, start[s] - n * costs.c, start[s], f"exchange with rank {peer}"))
            if mb in valid:
                kind = "F" if fwd else "B"
                end[s] = start[s] + costs.of(kind, s, p, 1)
                events.append(Event(s, kind, mb, 0, start[s], end[s]))
            else:
                end[s] = start[s]
    busy = [sum(e.end - e.start for e in events if e.rank == r) for r in range(p)]
    schedule = build("1f1b", p, m, 1)  # the same actions per rank, in the same order
    return Simulation(schedule, costs, events, transfers, max(end), busy, _inflight(schedule, events))
