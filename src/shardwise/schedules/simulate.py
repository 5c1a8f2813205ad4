"""Simulate any schedule with given per-stage costs: times, bubble, activations in flight.

Semantics (the same rules an executor follows):
- Each rank runs its actions in order, one at a time, as soon as the previous one is done and every
  dependency has arrived.
- Costs are per micro-batch for one whole pipeline stage (all its v chunks): F costs f/v, I costs
  b/v, W costs w/v, and a full backward B costs (b+w)/v per chunk.
- Communication: a tensor crossing ranks arrives `c` after its producer ends (a transfer delay on
  each cross-rank dependency). Sends are asynchronous, so they do not occupy the sender; hand-offs
  between chunks on the same rank are free.
- Activations in flight on a rank: a micro-batch's activations on a chunk are held from the start
  of its F to the end of its B, or of its W when the backward is split, because the weight gradient
  (x^T dy) needs the saved inputs x. Counted in stage-activation units: one micro-batch through one
  chunk is 1/v unit, so the numbers compare across schedules with different v; where the chunks hold
  different layers (Costs.held, a real model's cut), its share of the rank's layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shardwise.schedules.schedule import Schedule, virtual_stage
from shardwise.schedules.validate import resolve
from shardwise.timeline import Event

Cost = float | Sequence[float]


# Beyond this many actions, one at a time, a simulation stops being a matter of seconds (~60 us each with the
# message-by-message check): `simulate` answers with the closed forms instead, the report page leaves the picture out.
MAX_SIMULATED = 20_000


def action_count(name: str, p: int, m: int, v: int) -> int:
    """Actions of one schedule: each rank's forward and backward of every micro-batch and chunk, ZB-H1's split too."""
    return p * m * v * (3 if name == "zb-h1" else 2)


@dataclass(frozen=True)
class Costs:
    """Per micro-batch costs. Each of f, b, w is one number for every stage, a list of p (one per
    rank, split evenly over its v chunks) or a list of p*v (one per virtual stage, used as is)."""

    f: Cost = 1.0  # forward
    b: Cost = 1.0  # backward for inputs
    w: Cost = 1.0  # backward for weights
    c: float = 0.0  # one point-to-point transfer
    # What one micro-batch leaves on each virtual stage (p*v entries: its layers), for activations in flight; None:
    # the same on every chunk. A chunk holding only the embedding or the loss holds no layer activations.
    held: Sequence[float] | None = None

    def of(self, kind: str, stage: int, p: int, v: int) -> float:
        if kind == "B":
            return self.of("I", stage, p, v) + self.of("W", stage, p, v)
        value = {"F": self.f, "I": self.b, "W": self.w}[kind]
        if isinstance(value, (int, float)):
            return value / v
        if len(value) == p * v:
            return float(value[stage])
        if len(value) == p:
            return value[stage % p] / v
        raise ValueError(f"a per-stage cost list needs p={p} or p*v={p * v} entries, got {len(value)}")


def model_costs(spec, p: int, v: int, seq_len: int, f: float = 1.0, b: float = 1.0, w: float = 1.0,
                c: float = 0.0, rule: str = "balanced") -> Costs:
    """Per-virtual-stage costs of a real model cut by the stage split (shardwise.stage_split; `rule`: the runtime's
    cost-balanced one, or a stack's, Framework.stage_split): each stage's f, b, w in proportion to its FLOPs, an
    average stage costing the given f, b, w."""
    from shardwise.stage_split import stage_flops, stage_layer_counts

    flops = stage_flops(spec, p * v, seq_len, rule)
    scale = [x * len(flops) / sum(flops) / v for x in flops]  # a whole rank's stage = v chunks
    return Costs(f=[f * k for k in scale], b=[b * k for k in scale], w=[w * k for k in scale], c=c,
                 held=stage_layer_counts(spec, p * v, seq_len, rule))


@dataclass
class Simulation:
    schedule: Schedule
    costs: Costs
    events: list[Event]  # one per action
    transfers: list[Event]  # kind "send" on the producing rank, from its end to arrival
    makespan: float
    busy_per_rank: list[float]
    inflight: list[list[tuple[float, float]]] = field(repr=False)  # per rank: (time, units held from then on)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of all ranks' time during the step."""
        total = self.makespan * self.schedule.p
        return 1.0 - sum(self.busy_per_rank) / total if total > 0 else 0.0

    @property
    def bubble_fraction_per_rank(self) -> list[float]:
        return [1.0 - busy / self.makespan if self.makespan > 0 else 0.0 for busy in self.busy_per_rank]

    @property
    def peak_inflight_per_rank(self) -> list[float]:
        return [max((units for _, units in steps), default=0.0) for steps in self.inflight]

    def to_dict(self) -> dict:
        s = self.schedule
        return {
            "schedule": s.name, "pp": s.p, "microbatches": s.m, "vpp": s.v,
            "makespan": self.makespan,
            "bubble_fraction": self.bubble_fraction,
            "bubble_fraction_per_rank": self.bubble_fraction_per_rank,
            "peak_inflight_microbatches_per_rank": self.peak_inflight_per_rank,
        }


def simulate(schedule: Schedule, costs: Costs = Costs()) -> Simulation:
    p, v = schedule.p, schedule.v
    free = [0.0] * p  # when each rank finishes its current action
    end: dict = {}
    events, transfers = [], []
    for r, action, deps in resolve(schedule):
        ready = max((end[(d.rank, d.action)] + (costs.c if d.transfer else 0.0) for d in deps), default=0.0)
        start = max(free[r], ready)
        stop = start + costs.of(action.kind, virtual_stage(r, action.chunk, p), p, v)
        end[(r, action)] = free[r] = stop
        events.append(Event(r, action.kind, action.microbatch, action.chunk, start, stop))
        transfers += [Event(d.rank, "send", d.action.microbatch, d.action.chunk, end[(d.rank, d.action)],
                            end[(d.rank, d.action)] + costs.c,
                            f"{'activation' if d.action.kind == 'F' else 'gradient'} mb{d.action.microbatch} to rank {r}")
                      for d in deps if d.transfer and costs.c > 0]
    busy = [0.0] * p
    for e in events:
        busy[e.rank] += e.end - e.start
    makespan = max((e.end for e in events), default=0.0)
    return Simulation(schedule, costs, events, transfers, makespan, busy, _inflight(schedule, events, costs.held))


def _chunk_weights(schedule: Schedule, held: Sequence[float] | None) -> list[tuple[list[float], float]]:
    """Per rank, what one micro-batch holds on each chunk and the rank's whole stage (the unit): 1 of v, or the chunk's
    `held` of the rank's sum (1 of v again on a rank that holds nothing)."""
    p, v = schedule.p, schedule.v
    out = []
    for r in range(p):
        own = [held[virtual_stage(r, c, p)] for c in range(v)] if held is not None else []
        out.append((own, sum(own)) if sum(own) > 0 else ([1.0] * v, float(v)))
    return out


def _inflight(schedule: Schedule, events: list[Event], held: Sequence[float] | None = None) -> list[list[tuple[float, float]]]:
    """Per rank, the step function of activations held, in stage-activation units."""
    split = {(e.rank, e.microbatch, e.chunk) for e in events if e.kind == "I"}
    weights = _chunk_weights(schedule, held)
    changes: list[list[tuple[float, int, int]]] = [[] for _ in range(schedule.p)]
    for e in events:
        if e.kind == "F":
            changes[e.rank].append((e.start, +1, e.chunk))
        elif e.kind == ("W" if (e.rank, e.microbatch, e.chunk) in split else "B"):
            changes[e.rank].append((e.end, -1, e.chunk))
    curves = []
    for (own, unit), rank_changes in zip(weights, changes):
        held_now, curve = 0.0, [(0.0, 0.0)]
        for t, sign, chunk in sorted(rank_changes):  # at equal times, frees (-1) sort before new F (+1)
            held_now += sign * own[chunk]  # whole numbers (chunk-micro-batches or layers), then units
            curve.append((t, held_now / unit))
        curves.append(curve)
    return curves
