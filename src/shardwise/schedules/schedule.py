"""A pipeline schedule is plain data: for each pipeline rank, the ordered list of actions it runs.

An action is (kind, microbatch, chunk):
  F  forward of `microbatch` through model chunk `chunk` of this rank,
  B  full backward (input gradients and weight gradients together),
  I  backward for inputs only (zero-bubble: produces the gradient the previous stage waits for),
  W  backward for weights only (zero-bubble: nobody waits for it, so it can fill a bubble).

With v chunks per rank (interleaving), rank r's chunk c is virtual stage c*p + r (Megatron's
mapping): the model is cut into p*v contiguous pieces dealt round-robin to the ranks, so a
micro-batch visits every rank v times. Everything an executor needs to move tensors follows from
the schedule: `p2p_plan` says, for each action, what to receive before it and what to send after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("F", "B", "I", "W")


@dataclass(frozen=True)
class Action:
    kind: str  # one of KINDS
    microbatch: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


@dataclass(frozen=True)
class Schedule:
    """`ranks[r]` is the ordered tuple of actions pipeline rank r runs in one optimizer step."""

    name: str
    p: int  # pipeline ranks
    m: int  # micro-batches per step
    v: int  # model chunks per rank (1 unless interleaved)
    ranks: tuple[tuple[Action, ...], ...]
    # (microbatch, chunk, rank) whose backward is split into I and W; derived once, for `dependencies`.
    split_backward: frozenset = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        ranks = tuple(tuple(acts) for acts in self.ranks)
        object.__setattr__(self, "ranks", ranks)
        split = frozenset((a.microbatch, a.chunk, r) for r, acts in enumerate(ranks) for a in acts if a.kind == "I")
        object.__setattr__(self, "split_backward", split)

    @property
    def num_stages(self) -> int:
        return self.p * self.v

    def __str__(self) -> str:
        rows = [f"rank {r}: " + " ".join(str(a) for a in acts) for r, acts in enumerate(self.ranks)]
        return f"{self.name} p={self.p} m={self.m} v={self.v}\n" + "\n".join(rows)


def virtual_stage(rank: int, chunk: int, p: int) -> int:
    """Rank r's chunk c holds virtual stage c*p + r (Megatron's interleaved mapping)."""
    return chunk * p + rank


def stage_owner(stage: int, p: int) -> tuple[int, int]:
    """(rank, chunk) that holds virtual stage `stage`: the inverse of `virtual_stage`."""
    return stage % p, stage // p


def next_rank(rank: int, chunk: int, p: int, v: int) -> tuple[int, int] | None:
    """(rank, chunk) that receives this stage's forward output; None on the last virtual stage."""
    s = virtual_stage(rank, chunk, p) + 1
    return stage_owner(s, p) if s < p * v else None


def prev_rank(rank: int, chunk: int, p: int) -> tuple[int, int] | None:
    """(rank, chunk) that receives this stage's input gradient; None on virtual stage 0."""
    s = virtual_stage(rank, chunk, p) - 1
    return stage_owner(s, p) if s >= 0 else None


@dataclass(frozen=True)
class Dep:
    """Action `action` on rank `rank` must finish first; `transfer` names the tensor that crosses, if any."""

    rank: int
    action: Action
    transfer: str | None  # "activation" (forward output), "grad" (input gradient) or None (same stage)


def backward_kind(schedule: Schedule, microbatch: int, stage: int) -> str:
    """"I" if the schedule splits the backward of (microbatch, stage) into I and W, else "B"."""
    rank, chunk = stage_owner(stage, schedule.p)
    return "I" if (microbatch, chunk, rank) in schedule.split_backward else "B"


def dependencies(schedule: Schedule, rank: int, action: Action) -> list[Dep]:
    """What must be done before `action` on `rank` can start (besides the previous action on that rank).

    F at stage s needs F at s-1 (its input). B/I at s needs F at s (saved activations) and the
    backward at s+1 (the output gradient). W needs I at the same stage (the output gradient is
    computed there and kept). Different ranks = a transfer; the same rank = a local hand-off.
    """
    p, mb = schedule.p, action.microbatch
    s = virtual_stage(rank, action.chunk, p)

    def dep(stage: int, kind: str, what: str | None) -> Dep:
        r, c = stage_owner(stage, p)
        return Dep(r, Action(kind, mb, c), what if r != rank else None)

    if action.kind == "F":
        return [dep(s - 1, "F", "activation")] if s > 0 else []
    if action.kind in ("B", "I"):
        deps = [dep(s, "F", None)]
        if s + 1 < schedule.num_stages:
            deps.append(dep(s + 1, backward_kind(schedule, mb, s + 1), "grad"))
        return deps
    if action.kind == "W":
        return [dep(s, "I", None)]
    raise ValueError(f"unknown action kind {action.kind!r}")


@dataclass(frozen=True)
class Transfer:
    """One tensor crossing between ranks: `kind` is "activation" (forward) or "grad" (backward)."""

    kind: str
    microbatch: int
    src_rank: int
    dst_rank: int
    src_stage: int  # virtual stage that produced it
    dst_stage: int  # virtual stage that consumes it


@dataclass(frozen=True)
class Step:
    """One action of one rank, with the receives to post before it and the sends to post after it."""

    action: Action
    recv: tuple[Transfer, ...]
    send: tuple[Transfer, ...]


def p2p_plan(schedule: Schedule) -> tuple[tuple[Step, ...], ...]:
    """For each rank, its actions in order with the point-to-point traffic around each one.

    Only cross-rank traffic is listed: chunk-to-chunk hand-offs on the same rank (p == 1) stay local.
    Sends are matched one to one with receives, so (kind, microbatch, src_stage) is a unique tag.
    Computed once per schedule (the program builder, the validator and the executor all read it).
    """
    cached = schedule.__dict__.get("_p2p_plan")
    if cached is None:
        cached = schedule.__dict__["_p2p_plan"] = _p2p_plan(schedule)
    return cached


def _p2p_plan(schedule: Schedule) -> tuple[tuple[Step, ...], ...]:
    p, S = schedule.p, schedule.num_stages
    plan = []
    for r, actions in enumerate(schedule.ranks):
        steps = []
        for a in actions:
            s = virtual_stage(r, a.chunk, p)
            recv = tuple(Transfer(d.transfer, a.microbatch, d.rank, r, virtual_stage(d.rank, d.action.chunk, p), s)
                         for d in dependencies(schedule, r, a) if d.transfer)
            send: tuple[Transfer, ...] = ()
            if a.kind == "F" and s + 1 < S and stage_owner(s + 1, p)[0] != r:
                send = (Transfer("activation", a.microbatch, r, stage_owner(s + 1, p)[0], s, s + 1),)
            elif a.kind in ("B", "I") and s > 0 and stage_owner(s - 1, p)[0] != r:
                send = (Transfer("grad", a.microbatch, r, stage_owner(s - 1, p)[0], s, s - 1),)
            steps.append(Step(a, recv, send))
        plan.append(tuple(steps))
    return tuple(plan)


