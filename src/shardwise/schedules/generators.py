"""Generators: each returns a `Schedule` (per-rank ordered actions) for p ranks and m micro-batches.

naive        one micro-batch at a time: F then B through the whole pipeline before the next one
             starts (the layer-wise model parallelism of the article; with m = 1 it is GPipe).
gpipe        all forwards, then all backwards (Huang et al. 2019).
1f1b         warm-up of p-r-1 forwards, then one forward / one backward, then the remaining
             backwards (PipeDream-Flush, Narayanan et al. 2021).
interleaved-1f1b   Megatron's interleaved 1F1B with v chunks per rank (Narayanan et al. 2021, Sec. 2.2).
zb-h1        1F1B with each backward split into I (input grad) and W (weight grad); W is delayed
             by r steps on rank r so it fills the cool-down bubble (Qi et al. 2023, "ZB-H1").
"""

from __future__ import annotations

from shardwise.errors import UsageError
from shardwise.schedules.schedule import Action, Schedule
from shardwise.specs import SCHEDULES, check_chunks_interleave


def naive(p: int, m: int) -> Schedule:
    # Same order on every rank; the dependencies serialise it: rank 0 cannot start F(i+1) before B(i) came back.
    return Schedule("naive", p, m, 1, [[a for i in range(m) for a in (Action("F", i), Action("B", i))] for _ in range(p)])


def gpipe(p: int, m: int) -> Schedule:
    return Schedule("gpipe", p, m, 1, [[Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]
                                       for _ in range(p)])


def one_f_one_b(p: int, m: int) -> Schedule:
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)  # forwards in flight before the first backward can arrive
        acts = [Action("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            acts += [Action("F", warmup + i), Action("B", i)]
        acts += [Action("B", i) for i in range(m - warmup, m)]
        ranks.append(acts)
    return Schedule("1f1b", p, m, 1, ranks)


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Megatron's order: micro-batches go through the chunks in groups of p (m must be a multiple of p)."""
    total = m * v  # (micro-batch, chunk) pairs per rank

    def forward(k: int) -> Action:
        return Action("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def backward(k: int) -> Action:
        return Action("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    ranks = []
    for r in range(p):
        warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
        acts = [forward(k) for k in range(warmup)]
        for i in range(total - warmup):
            acts += [forward(warmup + i), backward(i)]
        acts += [backward(k) for k in range(total - warmup, total)]
        ranks.append(acts)
    return Schedule("interleaved-1f1b", p, m, v, ranks)


def zb_h1(p: int, m: int) -> Schedule:
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        acts = [Action("F", i) for i in range(warmup)]
        done_w = 0

        def backward_input(i: int) -> None:
            # Rank r holds back its first r weight passes: the 1F1B cool-down would leave
            # rank r idle for r steps, and those pending W passes fill exactly that time.
            nonlocal done_w
            acts.append(Action("I", i))
            if i >= r:
                acts.append(Action("W", done_w))
                done_w += 1

        for i in range(m - warmup):
            acts.append(Action("F", warmup + i))
            backward_input(i)
        for i in range(m - warmup, m):
            backward_input(i)
        acts += [Action("W", i) for i in range(done_w, m)]
        ranks.append(acts)
    return Schedule("zb-h1", p, m, 1, ranks)


def check_shape(name: str, p: int, m: int, v: int = 1) -> None:
    """Raise UsageError (one line, with the fix) if `name` cannot run with these p, m, v."""
    if name not in SCHEDULES:
        raise UsageError(f"unknown schedule '{name}' — choose one of {', '.join(SCHEDULES)}")
    for flag, value in (("--pp", p), ("--microbatches", m), ("--vpp", v)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    check_chunks_interleave(v, name)
    if name == "interleaved-1f1b" and m % p:
        raise UsageError(f"interleaved-1f1b needs --microbatches ({m}) to be a multiple of --pp ({p}) (Megatron's rule) — "
                         f"give {' or '.join(map(str, sorted({max(p, m // p * p), (m // p + 1) * p})))} "
                         f"micro-batches, or --schedule 1f1b{' without --vpp' if v > 1 else ''}")


def build(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """The schedule `name` for p ranks, m micro-batches and v chunks per rank."""
    check_shape(name, p, m, v)
    if name == "interleaved-1f1b":
        return interleaved_1f1b(p, m, v)
    return {"naive": naive, "gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}[name](p, m)
