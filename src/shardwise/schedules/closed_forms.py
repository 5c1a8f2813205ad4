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
    """Time of one step (all m micro-batches through all p stages and back).

    Equal to the simulator for c = 0, and for naive, GPipe and 1F1B at any c. For interleaved and
    ZB-H1 the transfer term is exact while c is small enough for the schedule's slack to hide the
    steady-state transfers, and a lower bound beyond (docs/pipeline.md gives the tested bounds).
    """
    work = m * (f + b + w)
    if p == 1:
        return work
    if schedule == "naive":
        # One micro-batch at a time: every stage and every transfer is on the critical path.
        return m * (p * (f + b + w) + 2 * (p - 1) * c)
    if schedule == "gpipe":
        return work + (p - 1) * (f + b + w) + 2 * (p - 1) * c
    if schedule == "1f1b":
        # Besides fill and drain, 1F1B's steady state has no slack: each backward waits for a round
        # trip, except once every p micro-batches when the warm-up forward covers it.
        exposed = m - 2 - (m - 2) // p if m >= 2 else 0
        return work + (p - 1) * (f + b + w) + 2 * (p - 1 + exposed) * c
    if schedule == "interleaved-1f1b":
        # Warm-up and cool-down shrink by v (each chunk is 1/v of a stage), but a micro-batch now
        # crosses p*v - 1 rank boundaries each way.
        return work + (p - 1) * (f + b + w) / v + 2 * (p * v - 1) * c
    if schedule == "zb-h1":
        # W passes fill the cool-down bubble, leaving (p-1)(f+b-w) (Qi et al. 2023, Sec. 3) when
        # w <= min(f, b); a larger W cannot shrink it below (p-1)*max(f, b), the time the first
        # backward needs to come back. With m < p the warm-up never fills, costing min(f,b,w) per
        # missing micro-batch. Transfers: fill and drain plus up to p-1 exposed round trips.
        exposed = min(m - 2, p - 1) if m >= 2 else 0
        return (work + (p - 1) * max(f + b - w, f, b) + max(p - m, 0) * min(f, b, w)
                + 2 * (p - 1 + exposed) * c)
    raise ValueError(f"unknown schedule {schedule!r}")


def uneven_makespan(schedule: str, p: int, m: int, v: int, ranks: tuple, c: float = 0.0) -> float:
    """pipeline_makespan when the ranks cost different times. `ranks`: ((f, b, w), count) for each kind of rank,
    the counts adding up to p. Naive and GPipe in closed form, exactly: a micro-batch's pass is the sum of the
    ranks' costs, and GPipe's forward and backward waves each run at their slowest rank's pace (m - 1 more of its
    forwards, of its backwards). 1F1B, interleaved 1F1B and ZB-H1: the steady state runs at the slowest rank's pace
    (by f + b + w: m times its cost, as with even ranks), the fill and drain cross every other rank at that rank's
    own cost, so the even form's fill-and-drain part, (p - 1) x the slowest cost, is scaled to the others' sum.
    Where every rank splits its time among F, B and W alike (a stack of layers) that bounds the simulator from above,
    but for ZB-H1 with fewer micro-batches than ranks (up to 3 % below) and for interleaved 1F1B with two slow ranks
    more than 2x the others or a forward under a quarter of the backward (each slow rank waits on the other's
    chunks, which one slowest pace does not see: up to 8.3 % below); where the splits differ (a head beside
    layers under recompute), 1F1B stays above it and the others can fall a few per cent below (docs/pipeline.md
    gives the tested bounds). Transfers are added as in the even form, at the slowest rank's costs."""
    (f, b, w), _ = max(ranks, key=lambda x: sum(x[0]))
    even = pipeline_makespan(schedule, p, m, v, f, b, w, 0.0)
    transfers = pipeline_makespan(schedule, p, m, v, f, b, w, c) - even if c else 0.0
    if p <= 1:
        return even + transfers
    if schedule == "naive":
        return m * sum(n * sum(x) for x, n in ranks) + transfers
    if schedule == "gpipe":
        # (B and W run together in GPipe's backward wave: its pace is the slowest rank's b + w)
        return (sum(n * x[0] for x, n in ranks) + (m - 1) * max(x[0] for x, _ in ranks)
                + sum(n * (x[1] + x[2]) for x, n in ranks) + (m - 1) * max(x[1] + x[2] for x, _ in ranks) + transfers)
    stage = f + b + w
    if stage <= 0:
        return even + transfers
    others = sum(n * sum(x) for x, n in ranks) - stage
    work = m * stage
    share = min(max(others / ((p - 1) * stage), 0.0), 1.0)
    return work + (even - work) * share + transfers


def lockstep_transfers(p: int, m: int) -> int:
    """Transfers on the critical path of one step of DeepSpeed's pipeline (`TrainSchedule`, its only training
    schedule): 1F1B, but run as 2(m + p - 1) lockstep steps in which every stage exchanges with one neighbour
    before computing: a forward step receives the activation and sends back the previous step's gradient, a
    backward step sends the previous step's activation and receives the gradient (deepspeed/runtime/pipe/
    schedule.py, `TrainSchedule.steps`). Its transfers are blocking (p2p.py: `dist.send` / `dist.recv`, or a
    `broadcast` within the pair before torch 1.8; `async_op=True` is refused), so each step's two transfers
    run one after the other, between two computes. With uniform stage costs the critical path then carries
    4m + 2p - 8 transfers (p >= 3, m >= 2) where 1F1B with its sends overlapped carries about 2(m + p - 1):
    two per micro-batch more. A single micro-batch crosses each boundary once each way; two stages exchange
    with one neighbour only. Derived by simulating the schedule's command stream with rendezvous transfers
    (schedules/lockstep.py; tests/test_deepspeed_pipeline.py checks the two agree), at any stage costs f, b, w."""
    if p <= 1:
        return 0
    if p == 2:
        return 2 * m
    if m <= 1:
        return 2 * (p - 1)
    return 4 * m + 2 * p - 8


def bubble_fraction(schedule: str, p: int, m: int, v: int, f: float = 1.0, b: float = 1.0, w: float = 1.0,
                    c: float = 0.0) -> float:
    """Idle share of the step on the busiest rank: 1 - useful work / makespan."""
    span = pipeline_makespan(schedule, p, m, v, f, b, w, c)
    return 1.0 - m * (f + b + w) / span if span > 0 else 0.0


def peak_inflight_microbatches(schedule: str, p: int, m: int, v: int, stage: int = 0) -> float:
    """Micro-batches of a whole stage's activations held at once on pipeline rank `stage`.

    A micro-batch's activations are held from its forward to its backward (to its W for zero-bubble,
    since the weight gradient needs the saved inputs). Interleaved counts chunk-micro-batches / v,
    giving Megatron's p * (1 + (p-1)/(p*v)) on rank 0.
    """
    if schedule == "naive":
        return 1.0  # one micro-batch at a time
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(p - stage, m))
    if schedule == "zb-h1":
        # Rank r delays its first r weight passes, so every rank peaks at 1F1B's worst (rank 0's) p.
        return float(min(p, m))
    if schedule == "interleaved-1f1b":
        chunks = min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)
        return chunks / v
    raise ValueError(f"unknown schedule {schedule!r}")


def peak_inflight_layers(schedule: str, p: int, m: int, v: int, stage: int, chunk_layers: tuple[int, ...]) -> float:
    """Layer-micro-batches of activations held at once on pipeline rank `stage`, whose v chunks hold `chunk_layers`
    layers: what `peak_inflight_microbatches` * layers is when every chunk holds as many, and otherwise the peak of
    the rank's own order weighted chunk by chunk. An uneven split (a first chunk holding only the embedding, a last
    one only the loss: Llama 3's, Megatron-Core's --account-for-embedding/loss-in-pipeline-split) moves where the
    peak is: rank 0's first chunk is the one it keeps the most micro-batches of (2p), the last rank's last chunk
    the one it frees at once.

    Interleaved 1F1B on rank r runs W = 2(p - r - 1) + (v - 1)p forwards, then forward/backward pairs, then the
    remaining backwards; forward k runs chunk (k // p) mod v, backward k chunk v - 1 - (k // p) mod v
    (generators.interleaved_1f1b). The peak is right after a steady-state forward (the warm-up only adds, the
    cool-down only frees), and the held layers after the i-th one, F(W + i + 1) - B(i), repeat with period p*v:
    the forwards and the backwards of one period cover every chunk p times."""
    if len(set(chunk_layers)) <= 1 or schedule != "interleaved-1f1b":
        return peak_inflight_microbatches(schedule, p, m, v, stage) * sum(chunk_layers)
    return float(_interleaved_peak_layers(p, m, v, stage, tuple(chunk_layers)))


def _interleaved_peak_layers(p: int, m: int, v: int, stage: int, layers: tuple[int, ...]) -> int:
    total = m * v
    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    period = p * v
    forward = [0]  # layers over the first k forwards, k = 0 .. period
    for k in range(period):
        forward.append(forward[-1] + layers[(k // p) % v])

    def forwards(k: int) -> int:
        return (k // period) * forward[period] + forward[k % period]

    peak = forwards(warmup)  # every forward first (m * v <= warm-up), else the warm-up's end
    backwards = 0  # layers freed by the first i backwards
    for i in range(min(total - warmup, period)):
        peak = max(peak, forwards(warmup + i + 1) - backwards)
        backwards += layers[v - 1 - (i // p) % v]
    return peak


def chunks_with_gradients_at_peak(schedule: str, p: int, m: int, v: int, stage: int = 0) -> int:
    """Model chunks of pipeline rank `stage` whose gradients exist while its activations are at their peak, for a
    stack that creates a chunk's gradients at its first backward (autograd's `.grad`, FSDP2's unsharded FP32
    accumulation) instead of preallocating them. Interleaved 1F1B holds its peak through the steady state, whose
    backwards run the chunks from the last down, p micro-batches each (Megatron's and torch's order): the chunks
    those backwards reach, and at least the one whose backward starts at the peak (all forwards before any
    backward when m * v <= warm-up). Every other schedule has one chunk per rank: v."""
    if schedule != "interleaved-1f1b":
        return v
    total = m * v
    steady = total - min((p - stage - 1) * 2 + (v - 1) * p, total)
    return min(v, max(1, -(-steady // p)))
