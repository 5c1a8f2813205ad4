"""Closed forms of pipeline-schedule timing and memory, for the planner's inner loop.

The simulator (`shardwise.schedules.simulate`) is the source of truth: tests check that
these formulas equal what it computes for uniform per-stage costs. The planner scores
millions of layouts, so it uses these O(1) forms instead of simulating each one.

Costs are per micro-batch for one whole pipeline stage (all its v chunks together):
  f  forward, b  backward for inputs (activation gradients), w  backward for weights,
  c  one point-to-point transfer between neighbouring stages.
Sources: GPipe (Huang et al. 2019), 1F1B / PipeDream-Flush (Narayanan et al. 2021),
interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2), ZB-H1 (Qi et al. 2023, Sec. 3).
"""

from __future__ import annotations


def pipeline_makespan(schedule: str, p: int, m: int, v: int, f: float, b: float, w: float, c: float = 0.0) -> float:
    """Time of one step (all m micro-batches through all p stages and back)."""
    work = m * (f + b + w)
    if p == 1:
        return work
    if schedule in ("naive", "gpipe", "1f1b"):
        return work + (p - 1) * (f + b + w + 2 * c)
    if schedule == "interleaved-1f1b":
        # Warm-up and cool-down shrink by v: each chunk is 1/v of a stage.
        return work + (p - 1) * (f + b + w) / v + 2 * (p - 1) * c
    if schedule == "zb-h1":
        # W passes fill the cool-down bubble; only F and B sit on the critical path (Qi et al. eq. 1).
        return work + (p - 1) * max(f + b - w, 0.0) + 2 * (p - 1) * c
    raise ValueError(f"unknown schedule {schedule!r}")


def bubble_fraction(schedule: str, p: int, m: int, v: int, f: float = 1.0, b: float = 1.0, w: float = 1.0,
                    c: float = 0.0) -> float:
    """Idle share of the step on the busiest rank: 1 - useful work / makespan."""
    span = pipeline_makespan(schedule, p, m, v, f, b, w, c)
    return 1.0 - m * (f + b + w) / span if span > 0 else 0.0


def peak_inflight_microbatches(schedule: str, p: int, m: int, v: int, stage: int = 0) -> float:
    """Micro-batches of a whole stage's activations held at once on `stage` (stage 0 is the worst).

    Interleaved counts chunk-micro-batches / v, giving Megatron's p * (1 + (p-1)/(p*v)) on stage 0.
    """
    if schedule in ("naive", "gpipe"):
        return float(m)
    if schedule in ("1f1b", "zb-h1"):
        return float(min(p - stage, m))
    if schedule == "interleaved-1f1b":
        chunks = min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)
        return chunks / v
    raise ValueError(f"unknown schedule {schedule!r}")
