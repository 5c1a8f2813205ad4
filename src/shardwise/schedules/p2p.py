"""The point-to-point program of a schedule, and its check under both kinds of send.

A rank's program is its actions with `Exchange`s between them: messages posted together (one
`torch.distributed.batch_isend_irecv`) and waited on before the rank goes on. `p2p_program` pairs the
sends that follow an action with the receives that the next action needs, in one exchange — what
Megatron's `send_forward_recv_backward` and torch's `Schedule1F1B` ("fwd_send_bwd_recv") do — so two
neighbours that each send before they receive post both directions at once. Where that is not enough
(interleaved schedules, whose chunks also talk around the ring from the last rank to the first), a rank
that would wait forever for its neighbour to receive gets that receive posted earlier, in the
neighbour's exchange that is waiting at that moment — found by running the programs on paper under
rendezvous semantics and repeated until they finish (Megatron's interleaved schedule posts the next
backward's receive together with the forward's send for the same reason). A schedule for which that
finds no order that finishes is refused (NoSafeOrder), never run: every program `p2p_program` returns
has just run to the end under rendezvous sends, and so under buffered ones.

`check(programs, semantics)` runs the programs on paper and names the ranks that would wait forever:
  buffered    a send completes when posted, whether or not its receive is (gloo's sends, and NCCL's
              below its eager threshold); a receive completes once its send is posted;
  rendezvous  a send completes only when its matching receive is posted (NCCL above ~64 KiB), and all
              messages between two ranks pass through one FIFO: an exchange's messages to a peer are
              served only after that rank's earlier exchanges with the same peer completed. Messages
              of one exchange progress together (NCCL's group semantics).
Messages in one direction between two ranks match in posting order (NCCL has no tags), so the check
also refuses programs whose two sides post them in different orders.

`unpaired_program` is the executor's earlier order — each send posted alone and left in flight, each
receive posted alone right before its action and waited — kept because it shows what the pairing
fixes: under rendezvous it deadlocks (1F1B, p = 2, m = 2: rank 0's second send waits for rank 1,
whose gradient send waits for rank 0 behind it).
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass

from shardwise.schedules.schedule import Schedule, Transfer, p2p_plan

SEMANTICS = ("buffered", "rendezvous")


class NoSafeOrder(RuntimeError):
    """No message order for this schedule finishes under rendezvous sends (the schedule is not run)."""


@dataclass(frozen=True)
class Exchange:
    """Messages posted together; `wait`: the rank waits for all of them before going on (else at the
    end of the step, like an isend left in flight)."""

    sends: tuple[Transfer, ...] = ()
    recvs: tuple[Transfer, ...] = ()
    wait: bool = True

    def __str__(self) -> str:
        parts = [f"send {_name(t)}" for t in self.sends] + [f"recv {_name(t)}" for t in self.recvs]
        return "{" + ", ".join(parts) + ("" if self.wait else ", no wait") + "}"


def _name(t: Transfer) -> str:
    return f"{'act' if t.kind == 'activation' else 'grad'}{t.microbatch}.s{t.src_stage}"


Program = list  # of Action | Exchange, in the order one rank runs them


def p2p_program(schedule: Schedule) -> list[Program]:
    """Per rank: each action's sends fused with the next action's receives in one exchange, then receives
    moved earlier wherever rendezvous sends would otherwise wait on each other in a cycle."""
    programs = []
    for steps in p2p_plan(schedule):
        items, carried = [], ()
        for step in steps:
            if carried or step.recv:
                items.append(Exchange(carried, step.recv))
            items.append(step.action)
            carried = step.send
        if carried:
            items.append(Exchange(carried, ()))
        programs.append(items)
    run = _Run(schedule, programs, "rendezvous")
    while not run.error and run.stuck and _post_receives_earlier(programs, run):
        run.resume()
    if run.error or run.stuck:  # never hand the executor a program that would hang on NCCL
        raise NoSafeOrder(f"{schedule.name} (p={schedule.p}, m={schedule.m}, v={schedule.v}): no message order "
                           f"found that finishes under rendezvous sends: {check(schedule, programs, 'rendezvous')}")
    return programs


def _post_receives_earlier(programs: list[Program], run: "_Run") -> bool:
    """For every send that waits for a receive its peer posts only later, while that peer waits in an
    exchange of its own: receive it in that exchange (in the program, and in the run going on). True if
    anything moved."""
    moved = False
    for r in run.stuck:
        for kind, t, _ in run.pending(r):
            b = t.dst_rank
            if kind != "send" or run.waiting_at[b] is None:
                continue
            k = run.waiting_at[b]
            j = next((i for i in range(k + 1, len(programs[b])) if isinstance(programs[b][i], Exchange)
                      and t in programs[b][i].recvs), None)
            if j is None:  # posted already (in flight or in the exchange waiting): moving cannot help
                continue
            _move(programs[b], t, j, k)
            run.post_into_waiting(b, t)
            moved = True
    return moved


def _move(items: Program, t: Transfer, src: int, dst: int) -> None:
    """Receive `t` in the exchange at `dst` instead of the later one at `src`; drop `src` if it empties."""
    old = items[src]
    items[dst] = Exchange(items[dst].sends, items[dst].recvs + (t,), items[dst].wait)
    rest = tuple(r for r in old.recvs if r != t)
    if rest or old.sends:
        items[src] = Exchange(old.sends, rest, old.wait)
    else:
        del items[src]


def unpaired_program(schedule: Schedule) -> list[Program]:
    """Per rank: every receive alone and waited right before its action, every send alone and left in
    flight until the end of the step (the executor's order before the pairing)."""
    programs = []
    for steps in p2p_plan(schedule):
        items = []
        for step in steps:
            items += [Exchange(recvs=(t,)) for t in step.recv]
            items.append(step.action)
            items += [Exchange(sends=(t,), wait=False) for t in step.send]
        programs.append(items)
    return programs


def check(schedule: Schedule, programs: list[Program], semantics: str) -> str | None:
    """None if every rank runs its program to the end under `semantics`, receiving each action's inputs
    before it, else what went wrong (for a deadlock: what each stuck rank waits for)."""
    run = _Run(schedule, programs, semantics)
    if run.error:
        return run.error
    if not run.stuck:
        return None
    waits = []
    for r in run.stuck:
        what = ", ".join(f"{kind} {_name(t)} {'to' if kind == 'send' else 'from'} rank "
                         f"{t.dst_rank if kind == 'send' else t.src_rank}" for kind, t, _ in run.pending(r))
        waits.append(f"rank {r} waits for {what or 'nothing'}")
    return f"deadlock ({semantics} sends): " + "; ".join(waits)


def deadlock_free(schedule: Schedule) -> dict[str, bool]:
    """{"deadlock_free_buffered": ..., "deadlock_free_rendezvous": ...}: whether the executor's program for
    `schedule` (`p2p_program`) runs to the end under each kind of send."""
    programs = p2p_program(schedule)
    return {f"deadlock_free_{semantics}": check(schedule, programs, semantics) is None for semantics in SEMANTICS}


class _Unit:
    """One exchange's messages to one peer: served together, once they reach the head of that pair's FIFO."""

    __slots__ = ("owner", "peer", "left")

    def __init__(self, owner: int, peer: int):
        self.owner, self.peer, self.left = owner, peer, 0


class _Op:
    __slots__ = ("kind", "t", "unit", "done", "waiter")

    def __init__(self, kind: str, t: Transfer, unit: _Unit, waiter: int | None):
        self.kind, self.t, self.unit, self.done, self.waiter = kind, t, unit, False, waiter


class _Run:
    """The programs run on paper to the end or until no rank can move. After construction: `error` (a
    program that is wrong whatever the timing), `stuck` (ranks that never finish), `waiting_at[r]` (the
    index of the exchange rank r waits in, or None) and `pending(r)` (its messages not done, as
    (kind, transfer, unit))."""

    def __init__(self, schedule: Schedule, programs: list[Program], semantics: str):
        if semantics not in SEMANTICS:
            raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
        self.programs, self.rendezvous = programs, semantics == "rendezvous"
        self.needs = {(r, step.action): step.recv for r, steps in enumerate(p2p_plan(schedule)) for step in steps}
        p = len(programs)
        self.pos, self.waiting, self.waiting_at, self.left = [0] * p, [[] for _ in range(p)], [None] * p, [0] * p
        self.in_flight = [[] for _ in range(p)]
        self.fifo: dict[tuple[int, int], deque] = defaultdict(deque)  # (rank, peer) -> posted units, oldest first
        self.sends: dict[tuple[int, int], list] = defaultdict(list)  # (src, dst) -> send ops in posting order
        self.recvs: dict[tuple[int, int], list] = defaultdict(list)  # (src, dst) -> receive ops in posting order
        self.matched: dict[tuple[int, int], int] = defaultdict(int)  # (src, dst) -> pairs completed
        self.received = [set() for _ in range(p)]
        self.units: list[dict] = [{} for _ in range(p)]  # peer -> unit of the exchange each rank waits in
        self.ready, self.dirty = deque(range(p)), set()  # ranks that may move; directions that may match
        self.error, self.stuck = None, []
        self.resume()

    def resume(self) -> None:
        """Run until every rank finished or none can move."""
        try:
            while self.ready or self.dirty:
                while self.ready:
                    self._advance(self.ready.popleft())
                while self.dirty:
                    self._match(*self.dirty.pop())
        except _OrderError as exc:
            self.error = str(exc)
            return
        self.stuck = [r for r in range(len(self.programs)) if self.pos[r] < len(self.programs[r]) or self.pending(r)]

    def pending(self, r: int) -> list:
        return [(op.kind, op.t, op.unit) for op in self.waiting[r] + self.in_flight[r] if not op.done]

    def post_into_waiting(self, r: int, t: Transfer) -> None:
        """Post the receive of `t` as part of the exchange rank r waits in."""
        self.waiting[r] += self._post(r, Exchange(recvs=(t,)), self.units[r], waiter=r)
        self.ready.append(r)

    def _post(self, r: int, ex: Exchange, units: dict, waiter: int | None) -> list:
        ops = []
        for kind, transfers in (("send", ex.sends), ("recv", ex.recvs)):
            for t in transfers:
                peer = t.dst_rank if kind == "send" else t.src_rank
                if peer not in units or units[peer].left == 0:  # a new unit joins the back of the pair's FIFO
                    units[peer] = _Unit(r, peer)
                    self.fifo[(r, peer)].append(units[peer])
                op = _Op(kind, t, units[peer], waiter)
                op.unit.left += 1
                (self.sends if kind == "send" else self.recvs)[(t.src_rank, t.dst_rank)].append(op)
                self.dirty.add((t.src_rank, t.dst_rank))
                if waiter is not None:
                    self.left[waiter] += 1
                ops.append(op)
                if kind == "send" and not self.rendezvous:
                    self._finish(op)  # buffered: a send completes when posted
        return ops

    def _finish(self, op: _Op) -> None:
        op.done = True
        op.unit.left -= 1
        if op.kind == "recv":
            self.received[op.t.dst_rank].add(op.t)
        if op.waiter is not None:
            self.left[op.waiter] -= 1
            if self.left[op.waiter] == 0:
                self.ready.append(op.waiter)
        queue = self.fifo[(op.unit.owner, op.unit.peer)]
        while queue and queue[0].left == 0:  # the next exchange with that peer reaches the head
            queue.popleft()
            self.dirty.update(((op.unit.owner, op.unit.peer), (op.unit.peer, op.unit.owner)))

    def _at_head(self, unit: _Unit) -> bool:
        queue = self.fifo[(unit.owner, unit.peer)]
        return bool(queue) and queue[0] is unit

    def _match(self, src: int, dst: int) -> None:
        """Complete the messages src -> dst whose send and receive are both posted (and, for rendezvous,
        both at the head of their pair's FIFO); messages in one direction match in posting order."""
        sends, recvs, k = self.sends[(src, dst)], self.recvs[(src, dst)], self.matched[(src, dst)]
        while k < len(sends) and k < len(recvs):
            send, recv = sends[k], recvs[k]
            if send.t != recv.t:
                raise _OrderError(f"rank {src} sends {_name(send.t)} to rank {dst} where rank {dst} receives "
                                  f"{_name(recv.t)}: the two sides post their messages in different orders")
            if self.rendezvous and not (self._at_head(send.unit) and self._at_head(recv.unit)):
                break
            if not send.done:
                self._finish(send)
            self._finish(recv)
            k += 1
        self.matched[(src, dst)] = k

    def _advance(self, r: int) -> None:
        """Run rank r until it must wait."""
        items = self.programs[r]
        while self.left[r] == 0 and self.pos[r] < len(items):
            self.waiting_at[r] = None
            item = items[self.pos[r]]
            if isinstance(item, Exchange):
                self.units[r] = {}
                ops = self._post(r, item, self.units[r], waiter=r if item.wait else None)
                if item.wait:
                    self.waiting[r], self.waiting_at[r] = ops, self.pos[r]
                else:
                    self.in_flight[r] += ops
            else:
                missing = [t for t in self.needs[(r, item)] if t not in self.received[r]]
                if missing:
                    raise _OrderError(f"rank {r} runs {item} before receiving {', '.join(map(_name, missing))}")
            self.pos[r] += 1
        if self.left[r] == 0:
            self.waiting_at[r] = None


class _OrderError(Exception):
    pass


def wait_penalty(points, waited: float) -> float:
    """What a rank that waited `waited` seconds in an exchange for its neighbour pays beyond the lockstep exchange:
    the line through (0, 0) and `points` ([[wait s, penalty s], ...], calibrate's Profile.wait_penalty_points, by
    increasing wait), the last point's penalty beyond it; 0 without points."""
    if waited <= 0 or not points:
        return 0.0
    x0 = y0 = 0.0
    for x1, y1 in points:
        if waited <= x1:
            return y0 + (y1 - y0) * (waited - x0) / (x1 - x0) if x1 > x0 else y1
        x0, y0 = x1, y1
    return y0


def exchange_paid(lockstep: float, lead: float, scale: float, handoff=()) -> float:
    """What a waited exchange costs a rank beyond the transfer, where the lockstep exchange costs `lockstep` and the
    rank arrived `lead` seconds after its neighbour posted the other side (< 0: before, and it waited -lead), when the
    two ranks' arrivals scatter by `scale` seconds (the calibrated action_scatter x the compute since their previous
    exchange). Arriving together (|lead| well within the scatter), either may be the one that waits, and the pair pays
    what calibrate's lockstep loop measured. Arriving last by more, the rank finds its message posted and pays the
    transfer only; arriving first by more, it pays what a rank woken after that wait pays (`handoff`, calibrate's
    Profile.handoff_points: a hand-off turn beyond its compute and the transfer; 0 without points). Measured in the
    executor's records, 2 gloo ranks, a 3-layer model's 2 + 1 stages: the last-arriving rank's exchanges 0.2-0.6 ms
    against the lockstep loop's 1.1-1.5 ms (docs/accuracy.md, "Pipelines: who waits pays")."""
    blend = math.exp(-abs(lead) / scale) if scale > 0 else float(lead == 0)
    settled = wait_penalty(handoff, -lead) if lead < 0 else 0.0
    return settled + (lockstep - settled) * blend


def program_makespan(schedule: Schedule, programs: list[Program], cost, c: float = 0.0, wake: float = 0.0,
                     exchange: float = 0.0, spread: float = 0.0, wait_points=(), scatter: float = 0.0,
                     handoff=()) -> float:
    """Time of one step when every rank walks its program as the executor does on gloo, whose send, like
    NCCL's above its eager threshold, completes only once its receive is posted (measured: a 16 KiB isend
    waits the 50 ms its peer sleeps before posting the receive). An exchange is posted when its rank reaches
    it and ends when each of its messages has both sides posted, plus `c` for the transfer. A rank that
    reaches a receive before its peer posts the send sleeps, and pays `wake` to be woken (the calibrated
    `p2p_sync_s`, a blocking receive after compute); a receive whose send is already posted, and a wait on
    sends only, do not (measured: GPipe, whose last rank waits on 8 sends per step, runs in 1F1B's time).
    `cost(rank, action)`: seconds of one action. The simulator's sends never wait; here a rank that sends
    blocks until its neighbour reaches the receive, which stalls interleaved and zero-bubble schedules
    (tests/test_schedules.py). `exchange`, `spread` (the calibrated `pipeline_exchange_s`, `lockstep_spread`): every
    waited exchange also costs `exchange` + `spread` x the longer of the two sides' compute since their previous waited
    exchange, once both sides have posted (instead of `wake`). Measured by `calibrate` (two ranks
    computing, then exchanging): the exchange costs more the longer the ranks computed before it — on tiny 0.40 ms
    after a layer's forward, 0.69-0.76 ms after a two-layer stage's forward + backward, 0.84-0.88 ms with a stage on
    one side and a stage and a layer on the other (docs/accuracy.md, "Pipelines: an exchange costs more after more
    compute"), as the slower side's scatter and a longer sleep before the wake-up both would. `wait_points` (the
    calibrated `wait_penalty_points`): a waited exchange with receives whose rank arrived first and waited for its
    neighbour also costs `wait_penalty` of that wait — the woken rank's next action runs slower, more after a longer wait
    (measured by `calibrate` with the two ranks taking turns; docs/accuracy.md, "Interleaved 1F1B: a rank that waited
    runs slower"). The lockstep exchange behind `exchange` has both sides arrive together, so it holds none of it.
    `scatter` (the calibrated `action_scatter`) > 0: who waits pays (`exchange_paid`): the lockstep cost only where
    the two sides arrive within the scatter of their compute, the transfer alone for the side that arrives last, and
    `handoff` (the calibrated `handoff_points`, instead of `wait_points`) for the side that waited long."""
    p = len(programs)
    pos, t, posted, end = [0] * p, [0.0] * p, {}, [0.0] * p
    ran, ran_at = [0.0] * p, {}  # compute since the rank's last waited exchange; the same for each posted message
    while any(pos[r] < len(programs[r]) for r in range(p)):
        moved = False
        for r in range(p):
            items = programs[r]
            while pos[r] < len(items):
                item = items[pos[r]]
                if not isinstance(item, Exchange):
                    took = cost(r, item)
                    t[r] += took
                    ran[r] += took
                    pos[r] += 1
                    moved = True
                    continue
                for side, transfers in (("send", item.sends), ("recv", item.recvs)):
                    for x in transfers:
                        posted.setdefault((side, x), t[r])
                        ran_at.setdefault((side, x), ran[r])
                peers = [("recv", x) for x in item.sends] + [("send", x) for x in item.recvs]
                if not all(k in posted for k in peers):
                    break  # the neighbour has not reached the other side yet
                done = max((posted[k] for k in peers), default=t[r])
                if item.wait:
                    computed = max([ran[r]] + [ran_at[k] for k in peers])
                    if scatter > 0 and peers:
                        paid = exchange_paid(exchange + spread * computed, t[r] - done, scatter * computed, handoff)
                    else:
                        slept = bool(item.recvs) and done > t[r]  # its receive came after it: the thread sleeps
                        paid = (exchange + spread * computed if peers else 0.0) + (wake if slept else 0.0) + \
                            (wait_penalty(wait_points, done - t[r]) if slept else 0.0)
                    t[r] = max(t[r], done + c if peers else t[r]) + paid
                    ran[r] = 0.0
                else:
                    end[r] = max(end[r], done + c)
                pos[r] += 1
                moved = True
        if not moved:
            raise NoSafeOrder(f"{schedule.name}: the programs wait on each other: "
                              f"{check(schedule, programs, 'rendezvous')}")
    return max(max(a, b) for a, b in zip(t, end))
