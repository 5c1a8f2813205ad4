"""Static checks of any schedule: complete, well ordered, and free of deadlock.

Deadlock freedom is checked twice. First the schedule itself, run on paper: every rank executes its
actions in order, and an action may start only once everything it depends on (`dependencies`) is
done; if at some point no rank can move while actions remain, real ranks would wait on each other
forever. The simulator uses the same resolution (`resolve`) to compute times. Then the messages the
executor posts for it (`p2p.p2p_program`), under both kinds of send (`p2p.SEMANTICS`): buffered, as on
gloo, and rendezvous with one FIFO per pair of ranks, as NCCL's large messages.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Iterator

from shardwise.schedules.p2p import SEMANTICS, NoSafeOrder, check, p2p_program
from shardwise.schedules.schedule import KINDS, Action, Dep, Schedule, dependencies


class InvalidSchedule(ValueError):
    """A schedule that cannot run: the message names the first problem found."""


def resolve(schedule: Schedule) -> Iterator[tuple[int, Action, list[Dep]]]:
    """Yield (rank, action, deps) in an order where each action comes after its deps and its rank's earlier actions.

    A rank runs until its next action misses a dependency, then waits on that one action and is woken when it
    is done: each action is looked at a bounded number of times, so this takes time linear in the schedule's size.
    Raises InvalidSchedule on deadlock, naming what each stuck rank waits for.
    """
    done: set[tuple[int, Action]] = set()
    pos = [0] * schedule.p
    waiting: dict[tuple[int, Action], list[int]] = {}
    runnable = deque(range(schedule.p))
    while runnable:
        r = runnable.popleft()
        acts = schedule.ranks[r]
        while pos[r] < len(acts):
            action = acts[pos[r]]
            deps = dependencies(schedule, r, action)
            missing = next(((d.rank, d.action) for d in deps if (d.rank, d.action) not in done), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(r)
                break
            done.add((r, action))
            pos[r] += 1
            yield r, action, deps
            runnable.extend(waiting.pop((r, action), ()))
    if any(pos[r] < len(acts) for r, acts in enumerate(schedule.ranks)):
        stuck = [f"rank {r} at {acts[pos[r]]} waits for "
                 + ", ".join(f"{d.action} on rank {d.rank}" for d in dependencies(schedule, r, acts[pos[r]])
                             if (d.rank, d.action) not in done)
                 for r, acts in enumerate(schedule.ranks) if pos[r] < len(acts)]
        raise InvalidSchedule("deadlock: " + "; ".join(stuck))


def problems(schedule: Schedule) -> list[str]:
    """Everything wrong with `schedule` (empty when it is valid)."""
    p, m, v = schedule.p, schedule.m, schedule.v
    if min(p, m, v) < 1:
        return [f"p, m and v must be at least 1 (got {p}, {m}, {v})"]
    if len(schedule.ranks) != p:
        return [f"{len(schedule.ranks)} action lists for p={p} ranks"]
    found = []
    for r, acts in enumerate(schedule.ranks):
        for a in acts:
            if a.kind not in KINDS or not 0 <= a.microbatch < m or not 0 <= a.chunk < v:
                found.append(f"rank {r}: {a!r} is out of range (kinds {KINDS}, m={m}, v={v})")
        found += _count_problems(r, acts, m, v) + _order_problems(r, acts)
    if found:
        return found
    try:
        for _ in resolve(schedule):
            pass
    except InvalidSchedule as exc:
        return [str(exc)]
    try:
        programs = p2p_program(schedule)
    except NoSafeOrder as exc:
        return [f"point-to-point: {exc}"]
    return [f"point-to-point: {found}" for semantics in SEMANTICS if (found := check(schedule, programs, semantics))]


def _count_problems(rank: int, acts: tuple[Action, ...], m: int, v: int) -> list[str]:
    """Each (micro-batch, chunk): one F and either one B or one I and one W."""
    count = Counter((a.kind, a.microbatch, a.chunk) for a in acts)
    found = []
    for mb in range(m):
        for c in range(v):
            n = {k: count[(k, mb, c)] for k in KINDS}
            full, split = (n["B"], 0, 0) == (1, n["I"], n["W"]), (n["B"], n["I"], n["W"]) == (0, 1, 1)
            if n["F"] != 1 or not (full or split):
                found.append(f"rank {rank}: micro-batch {mb} chunk {c} has {n['F']} F, {n['B']} B, {n['I']} I, {n['W']} W "
                             f"(needs one F and one B, or one F, one I and one W)")
    return found


def _order_problems(rank: int, acts: tuple[Action, ...]) -> list[str]:
    """F before its backward and I before its W on the same rank (else the rank blocks itself)."""
    seen: set[tuple[str, int, int]] = set()
    found = []
    for a in acts:
        need = {"B": "F", "I": "F", "W": "I"}.get(a.kind)
        if need and (need, a.microbatch, a.chunk) not in seen:
            found.append(f"rank {rank}: {a} comes before {Action(need, a.microbatch, a.chunk)}")
        seen.add((a.kind, a.microbatch, a.chunk))
    return found


def validate(schedule: Schedule) -> Schedule:
    """Return `schedule` unchanged if it can run, else raise InvalidSchedule with the first problem."""
    found = problems(schedule)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise InvalidSchedule(f"{schedule.name}: {found[0]}{more}")
    return schedule
