"""Schedules as data: the stage mapping, the generators' shapes, p2p plans, and the validator."""

from __future__ import annotations

import graphlib
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.errors import UsageError
from shardwise.schedules.generators import build
from shardwise.schedules.p2p import SEMANTICS, Exchange, check, p2p_program, unpaired_program
from shardwise.schedules.schedule import (Action, Schedule, dependencies, next_rank, p2p_plan, prev_rank,
                                          stage_owner, virtual_stage)
from shardwise.schedules.validate import InvalidSchedule, problems, validate
from shardwise.specs import SCHEDULES


@st.composite
def shapes(draw, names=SCHEDULES, max_p=6, max_m=10, max_v=3):
    name = draw(st.sampled_from(names))
    p = draw(st.integers(1, max_p))
    if name == "interleaved-1f1b":
        return name, p, p * draw(st.integers(1, max(1, max_m // p))), draw(st.integers(1, max_v))
    return name, p, draw(st.integers(1, max_m)), 1


def test_virtual_stage_is_megatrons_round_robin():
    # p=4, v=2: rank 1 holds stages 1 and 5; stage 5 comes after stage 4 on rank 0.
    assert [virtual_stage(1, c, 4) for c in range(2)] == [1, 5]
    assert all(stage_owner(virtual_stage(r, c, 4), 4) == (r, c) for r in range(4) for c in range(2))
    assert next_rank(3, 0, 4, 2) == (0, 1)  # the last rank's chunk 0 feeds rank 0's chunk 1
    assert next_rank(3, 1, 4, 2) is None and prev_rank(0, 0, 4) is None
    assert prev_rank(0, 1, 4) == (3, 0)


def test_1f1b_warmup_and_order():
    s = build("1f1b", 4, 8)
    kinds = ["".join(a.kind for a in acts) for acts in s.ranks]
    assert kinds[0] == "FFF" + "FB" * 5 + "BBB"  # p-r-1 = 3 warm-up forwards, 3 cool-down backwards
    assert kinds[3] == "FB" * 8
    assert [a.microbatch for a in s.ranks[0][:6]] == [0, 1, 2, 3, 0, 4]


def test_zb_h1_splits_backward_and_delays_weights_by_rank():
    s = build("zb-h1", 4, 8)
    for r, acts in enumerate(s.ranks):
        assert Counter(a.kind for a in acts) == {"F": 8, "I": 8, "W": 8}
        first_w = next(i for i, a in enumerate(acts) if a.kind == "W")
        assert sum(a.kind == "I" for a in acts[:first_w]) == r + 1  # rank r holds back r weight passes


def test_interleaved_is_megatrons_order():
    s = build("interleaved-1f1b", 2, 4, 2)
    # Rank 0 warm-up: (p-1)*2 + (v-1)*p = 4 forwards, micro-batches in groups of p through chunk 0 then 1.
    assert [(a.kind, a.microbatch, a.chunk) for a in s.ranks[0][:6]] == [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1), ("F", 2, 0), ("B", 0, 1)]


def test_naive_runs_one_microbatch_at_a_time():
    s = build("naive", 3, 2)
    assert [str(a) for a in s.ranks[1]] == ["F0", "B0", "F1", "B1"]


@pytest.mark.parametrize("name,p,m,v,msg", [
    ("interleaved-1f1b", 4, 6, 2, "multiple of --pp"),
    ("1f1b", 4, 8, 2, "needs --schedule interleaved-1f1b"),
    ("1f1b", 0, 8, 1, "--pp must be at least 1"),
    ("gpipe", 2, 0, 1, "--microbatches must be at least 1"),
    ("pipedream", 2, 2, 1, "unknown schedule"),
])
def test_bad_shapes_are_usage_errors(name, p, m, v, msg):
    with pytest.raises(UsageError, match=msg):
        build(name, p, m, v)


@settings(max_examples=120, deadline=None)
@given(shapes())
def test_every_generator_is_valid(shape):
    s = build(*shape)
    assert problems(s) == []
    name, p, m, v = shape
    for acts in s.ranks:  # every micro-batch forwarded and backwarded once per chunk
        assert Counter((a.microbatch, a.chunk) for a in acts if a.kind == "F") == {(i, c): 1 for i in range(m) for c in range(v)}


@settings(max_examples=60, deadline=None)
@given(shapes(), st.data())
def test_p2p_plan_matches_every_send_with_one_recv(shape, data):
    s = build(*shape)
    plan = p2p_plan(s)
    sends = Counter(t for steps in plan for step in steps for t in step.send)
    recvs = Counter(t for steps in plan for step in steps for t in step.recv)
    assert sends == recvs and all(n == 1 for n in sends.values())
    name, p, m, v = shape
    # Each micro-batch crosses every rank boundary once forward and once backward.
    crossings = sum(1 for st_ in range(p * v - 1) if stage_owner(st_, p)[0] != stage_owner(st_ + 1, p)[0])
    assert len(sends) == 2 * m * crossings
    for r, steps in enumerate(plan):
        for step in steps:
            assert all(t.dst_rank == r for t in step.recv) and all(t.src_rank == r for t in step.send)


def _acyclic(s: Schedule) -> bool:
    """Independent oracle: program order + dependencies form a DAG iff in-order execution cannot deadlock."""
    graph: dict = {}
    for r, acts in enumerate(s.ranks):
        for i, a in enumerate(acts):
            preds = {(d.rank, d.action) for d in dependencies(s, r, a)}
            if i:
                preds.add((r, acts[i - 1]))
            graph[(r, a)] = preds
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
        return True
    except graphlib.CycleError:
        return False


def _same_order(s: Schedule) -> bool:
    sent, received = {}, {}
    for steps in p2p_plan(s):
        for step in steps:
            for t in step.send:
                sent.setdefault((t.src_rank, t.dst_rank), []).append(t)
            for t in step.recv:
                received.setdefault((t.src_rank, t.dst_rank), []).append(t)
    return sent == received


def _with_rank(s: Schedule, r: int, acts: list[Action]) -> Schedule:
    ranks = list(s.ranks)
    ranks[r] = tuple(acts)
    return Schedule(s.name, s.p, s.m, s.v, ranks)


@settings(max_examples=150, deadline=None)
@given(shapes(), st.data())
def test_validator_agrees_with_a_graph_oracle_on_swapped_actions(shape, data):
    s = build(*shape)
    r = data.draw(st.integers(0, s.p - 1))
    acts = list(s.ranks[r])
    if len(acts) < 2:
        return
    i = data.draw(st.integers(0, len(acts) - 2))
    acts[i], acts[i + 1] = acts[i + 1], acts[i]
    mutated = _with_rank(s, r, acts)
    same_pair = acts[i].microbatch == acts[i + 1].microbatch and acts[i].chunk == acts[i + 1].chunk
    # Swapping F/B or I/W of one micro-batch breaks order. Otherwise the program must finish under both
    # kinds of send — unless a rank now sends two messages in another order than its peer consumes them:
    # NCCL matches by order, so that is valid only if the program can receive the later one early.
    expect_valid = _acyclic(mutated) and not same_pair
    found = problems(mutated)
    if not expect_valid:
        assert found
    elif _same_order(mutated):
        assert found == []
    else:
        assert found == [] or all("different orders" in f for f in found), found


@settings(max_examples=80, deadline=None)
@given(shapes(), st.data())
def test_removed_or_duplicated_action_is_rejected(shape, data):
    s = build(*shape)
    r = data.draw(st.integers(0, s.p - 1))
    acts = list(s.ranks[r])
    i = data.draw(st.integers(0, len(acts) - 1))
    removed = _with_rank(s, r, acts[:i] + acts[i + 1:])
    duplicated = _with_rank(s, r, acts + [acts[i]])
    for bad in (removed, duplicated):
        with pytest.raises(InvalidSchedule):
            validate(bad)


def test_validator_finds_a_cross_rank_deadlock():
    # Rank 0 waits for B0 from rank 1 before its F1; rank 1 wants F1 before it runs B0.
    s = Schedule("bad", 2, 2, 1, [[Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1)],
                                  [Action("F", 0), Action("F", 1), Action("B", 0), Action("B", 1)]])
    with pytest.raises(InvalidSchedule, match="deadlock: rank 0 at B0 waits for B0 on rank 1"):
        validate(s)


@pytest.mark.parametrize("acts,msg", [
    ([Action("B", 0), Action("F", 0)], "B0 comes before F0"),
    ([Action("F", 0), Action("W", 0), Action("I", 0)], "W0 comes before I0"),
    ([Action("F", 0), Action("B", 0), Action("W", 0)], "needs one F and one B"),
    ([Action("F", 0), Action("B", 3)], "out of range"),
])
def test_validator_names_the_problem(acts, msg):
    with pytest.raises(InvalidSchedule, match=msg):
        validate(Schedule("bad", 1, 1, 1, [acts]))


@settings(max_examples=60, deadline=None)
@given(shapes())
def test_sends_and_receives_between_two_ranks_happen_in_the_same_order(shape):
    # So an executor can match point-to-point messages in posting order (NCCL has no tags).
    assert _same_order(build(*shape))


# --------------------------------------------------------------------------- point-to-point programs


def every_shape(max_p=8, max_m=16, max_v=4):
    """Every schedule shape the issue names: p <= 8, m <= 16, v <= 4 (interleaved: m a multiple of p)."""
    for name in SCHEDULES:
        for p in range(1, max_p + 1):
            for v in range(1, max_v + 1) if name == "interleaved-1f1b" else (1,):
                for m in range(1, max_m + 1):
                    if name != "interleaved-1f1b" or m % p == 0:
                        yield name, p, m, v


def test_every_program_finishes_under_buffered_and_rendezvous_sends_and_the_old_order_does_not():
    """All 680 shapes, exhaustively: the executor's messages finish whether sends complete when posted
    (gloo) or only when their receive is posted, one FIFO per pair of ranks (NCCL). The order the
    executor used before always finished on gloo, and deadlocks under NCCL's rules wherever two
    neighbours each send before they receive (1F1B and ZB-H1 with p > 1, m >= 2)."""
    shapes_seen, old_deadlocks = 0, 0
    for shape in every_shape():
        s = build(*shape)
        programs = p2p_program(s)
        assert [check(s, programs, semantics) for semantics in SEMANTICS] == [None, None], shape
        # the program runs exactly the schedule's actions, in its order
        assert [tuple(x for x in items if isinstance(x, Action)) for items in programs] == list(s.ranks), shape
        old = unpaired_program(s)
        assert check(s, old, "buffered") is None, shape  # why it always ran on gloo
        name, p, m, v = shape
        if p > 1 and m >= 2 and name in ("1f1b", "zb-h1"):
            assert check(s, old, "rendezvous").startswith("deadlock (rendezvous sends)"), shape
            old_deadlocks += 1
        shapes_seen += 1
    assert shapes_seen == 680 and old_deadlocks == 2 * 7 * 15


def _exchanges_receiving(items):
    return [i for i, x in enumerate(items) if isinstance(x, Exchange) and x.recvs]


@settings(max_examples=80, deadline=None)
@given(shapes(max_p=8, max_m=16, max_v=4), st.data())
def test_a_mutated_program_is_caught_under_both_semantics(shape, data):
    """The check can fail: a receive posted after the action that needs it, or two messages from one
    peer received in the other order, is refused whatever the kind of send."""
    s = build(*shape)
    if s.p == 1:
        return
    programs = p2p_program(s)
    r = data.draw(st.sampled_from([r for r, items in enumerate(programs) if _exchanges_receiving(items)]))
    items = programs[r]
    late, swap = [list(x) for x in (items, items)]
    # 1. one receive moved to just after the action it feeds
    i = data.draw(st.sampled_from(_exchanges_receiving(items)))
    t = data.draw(st.sampled_from(items[i].recvs))
    rest = Exchange(items[i].sends, tuple(x for x in items[i].recvs if x != t), items[i].wait)
    late[i] = rest
    user = next(j for j in range(i + 1, len(items)) if isinstance(items[j], Action)
                and any(t in step.recv for step in p2p_plan(s)[r] if step.action == items[j]))
    late.insert(user + 1, Exchange(recvs=(t,)))
    # 2. two receives of the same kind from the same peer, in the other order
    received = [(j, x) for j in _exchanges_receiving(items) for x in items[j].recvs]
    pairs = [(a, b) for a in received for b in received if a[0] < b[0] and a[1].src_rank == b[1].src_rank]
    for semantics in SEMANTICS:
        assert check(s, [late if k == r else programs[k] for k in range(s.p)], semantics), (semantics, t)
    if pairs:
        (ja, ta), (jb, tb) = data.draw(st.sampled_from(pairs))
        swap[ja] = Exchange(items[ja].sends, tuple(tb if x == ta else x for x in items[ja].recvs), items[ja].wait)
        swap[jb] = Exchange(items[jb].sends, tuple(ta if x == tb else x for x in items[jb].recvs), items[jb].wait)
        for semantics in SEMANTICS:
            assert check(s, [swap if k == r else programs[k] for k in range(s.p)], semantics), (semantics, ta, tb)


def test_the_old_1f1b_order_deadlocks_as_the_issue_describes():
    # Rank 0 [send act0, send act1, recv grad0, recv grad1], rank 1 [recv act0, send grad0, recv act1, send grad1]:
    # each side's second message waits on the other's.
    s = build("1f1b", 2, 2)
    found = check(s, unpaired_program(s), "rendezvous")
    assert found == ("deadlock (rendezvous sends): rank 0 waits for recv grad0.s1 from rank 1, send act1.s0 to rank 1; "
                     "rank 1 waits for recv act1.s0 from rank 0, send grad0.s1 to rank 0")


def test_1f1b_pairs_each_forward_send_with_the_next_backward_receive():
    # Megatron's send_forward_recv_backward / torch's fwd_send_bwd_recv, derived from the schedule.
    s = build("1f1b", 2, 4)
    rank0 = [str(x) for x in p2p_program(s)[0]]
    assert rank0[:4] == ["F0", "{send act0.s0}", "F1", "{send act1.s0, recv grad0.s1}"]
    rank1 = [str(x) for x in p2p_program(s)[1]]
    assert rank1[:5] == ["{recv act0.s0}", "F0", "B0", "{send grad0.s1, recv act1.s0}", "F1"]


def test_interleaved_receives_early_where_pairing_alone_would_deadlock():
    # p = 2, v = 2: rank 0's gradient send and rank 1's would each wait for the other's receive, which
    # each posts only after its own send; the program moves a receive into the exchange waiting then
    # (pairing alone receives one message per exchange at most).
    s = build("interleaved-1f1b", 2, 4, 2)
    programs = p2p_program(s)
    assert any(len(x.recvs) > 1 for items in programs for x in items if isinstance(x, Exchange))
    assert check(s, programs, "rendezvous") is None


def test_a_program_that_would_hang_is_refused_not_returned(monkeypatch):
    # Interleaved p = 2, v = 2 needs receives moved earlier; without that step no order finishes.
    from shardwise.schedules import p2p

    monkeypatch.setattr(p2p, "_post_receives_earlier", lambda programs, run: False)
    s = build("interleaved-1f1b", 2, 4, 2)
    with pytest.raises(p2p.NoSafeOrder, match="no message order found that finishes under rendezvous sends: deadlock"):
        p2p_program(s)
    assert problems(s)[0].startswith("point-to-point: interleaved-1f1b (p=2, m=4, v=2): no message order")


def test_messages_in_different_orders_on_the_two_sides_are_refused():
    s = build("gpipe", 2, 2)
    programs = p2p_program(s)
    rank1 = programs[1]
    first, second = (i for i, x in enumerate(rank1) if isinstance(x, Exchange) and x.recvs
                     and x.recvs[0].kind == "activation")
    rank1[first], rank1[second] = rank1[second], rank1[first]  # receive act1 before act0
    found = check(s, programs, "buffered")
    assert "different orders" in found or "before receiving" in found


def _program_span(name, p, m, v, f, b, w, c=0.0, wake=0.0, exchange=0.0, spread=0.0):
    from shardwise.schedules.p2p import program_makespan
    from shardwise.schedules.simulate import Costs

    sched, costs = build(name, p, m, v), Costs(f, b, w)
    return program_makespan(sched, p2p_program(sched), lambda r, a: costs.of(a.kind, virtual_stage(r, a.chunk, p), p, v),
                            c, wake, exchange, spread)


def test_lockstep_spread_charges_calibrates_own_exchange_loop_what_it_measured():
    # calibrate's workload (measure_sync): both ranks compute d, then exchange (each sends to the other and waits for
    # both messages), n times. It measures d + x + k d per round (k: the slope against d), and the program charges it.
    from shardwise.schedules.p2p import program_makespan
    from shardwise.schedules.schedule import Transfer

    n, d, x, k = 5, 2.0, 0.3, 0.1

    def program(r):
        items = []
        for i in range(n):
            out = Transfer("activation", i, r, 1 - r, r, 1 - r)
            back = Transfer("activation", i, 1 - r, r, 1 - r, r)
            items += [Action("F", i), Exchange(sends=(out,), recvs=(back,))]
        return items
    sched = build("1f1b", 2, 1)  # only named in an error
    progs = [program(0), program(1)]
    assert program_makespan(sched, progs, lambda r, a: d, 0.0, 0.0, x, k) == pytest.approx(n * (d + x + k * d))
    assert program_makespan(sched, progs, lambda r, a: d, 0.0, 0.0, x) == pytest.approx(n * (d + x))
    # one side computing longer: the exchange costs k x the longer compute (measured: dearer than between equals)
    assert program_makespan(sched, progs, lambda r, a: d + r, 0.0, 0.0, x, k) == pytest.approx(n * (d + 1 + x + k * (d + 1)))


def test_with_a_scatter_who_waits_pays_and_equals_still_pay_the_lockstep_exchange():
    # calibrate's lockstep loop: both ranks compute, then exchange. Equal computes: the two arrive together and pay the
    # lockstep x as before. One side 1 s longer, far beyond the scatter (0.05 of ~2 s): the early side waits and pays
    # the hand-off figure h once its message arrives (+ c); the late side finds its message there and goes on, so a
    # round is the longer compute (the early side's d + c + h fits in the wait; the last one's ends the step). Taking
    # turns (the naive schedule's shape), every turn pays c + h: the rank that waited is on the critical path.
    from shardwise.schedules.p2p import exchange_paid, program_makespan
    from shardwise.schedules.schedule import Transfer

    n, d, x, c, h, k = 5, 2.0, 0.3, 0.01, 0.1, 0.05
    handoff = ((1e-3, h), (3.0, h))

    def swap(r, i):
        return Exchange(sends=(Transfer("activation", i, r, 1 - r, r, 1 - r),),
                        recvs=(Transfer("activation", i, 1 - r, r, 1 - r, r),))

    def lockstep(r):
        return [item for i in range(n) for item in (Action("F", i), swap(r, i))]
    sched = build("1f1b", 2, 1)  # only named in an error
    span = lambda progs, cost: program_makespan(sched, progs, cost, c, 0.0, x, 0.0, (), k, handoff)
    assert span([lockstep(0), lockstep(1)], lambda r, a: d) == pytest.approx(n * (d + c + x))
    uneven = span([lockstep(0), lockstep(1)], lambda r, a: d + r)
    assert uneven == pytest.approx(n * (d + 1) + c + h, abs=n * x * 1e-2)  # the old rule: n (d + 1 + c + x)

    def turns(r):
        items = []
        for i in range(n):
            turn = [Action("F", i), swap(r, 2 * i), swap(r, 2 * i + 1)]
            items += turn if r == 0 else [turn[1], turn[0], turn[2]]
        return items
    assert span([turns(0), turns(1)], lambda r, a: d) == pytest.approx(2 * n * (d + c + h), rel=1e-4)
    # the blend between the two: at no lead the lockstep figure, far ahead or behind the settled one
    assert exchange_paid(x, 0.0, 0.1, handoff) == x
    assert exchange_paid(x, 2.0, 0.1, handoff) == pytest.approx(0.0, abs=1e-8)
    assert exchange_paid(x, -2.0, 0.1, handoff) == pytest.approx(h)


def test_wait_penalty_charges_calibrates_own_handoff_what_it_measured():
    # calibrate's handoff (measure_sync): the two ranks take turns computing d, each waiting in the exchange while the
    # other computes. A round (both turns) measured 2 (d + x + p): the lockstep exchange x and the penalty p of a rank
    # woken after waiting d. The program charges it from the points, and nothing to an exchange nobody waited in.
    from shardwise.schedules.p2p import program_makespan, wait_penalty
    from shardwise.schedules.schedule import Transfer

    d, x, p = 2.0, 0.3, 0.4

    def swap(r, i):
        return Exchange(sends=(Transfer("activation", i, r, 1 - r, r, 1 - r),),
                        recvs=(Transfer("activation", i, 1 - r, r, 1 - r, r),))

    def program(r, n):
        items = []
        for i in range(n):
            turn = [Action("F", i), swap(r, 2 * i), swap(r, 2 * i + 1)]
            items += turn if r == 0 else [turn[1], turn[0], turn[2]]
        return items
    sched = build("1f1b", 2, 1)  # only named in an error

    def span(n, points):
        return program_makespan(sched, [program(0, n), program(1, n)], lambda r, a: d, 0.0, 0.0, x, 0.0, points)
    for points in (((d, p),), ((d / 2, p / 2), (d, p))):
        assert span(6, points) - span(5, points) == pytest.approx(2 * (d + x + p))
    assert span(6, ()) - span(5, ()) == pytest.approx(2 * (d + x))
    # the line through (0, 0) and the points, the last point's penalty beyond it
    assert wait_penalty(((1.0, 0.1), (3.0, 0.5)), 0.5) == pytest.approx(0.05)
    assert wait_penalty(((1.0, 0.1), (3.0, 0.5)), 2.0) == pytest.approx(0.3)
    assert wait_penalty(((1.0, 0.1), (3.0, 0.5)), 9.0) == pytest.approx(0.5)
    assert wait_penalty((), 9.0) == 0.0 and wait_penalty(((1.0, 0.1),), 0.0) == 0.0
    # lockstep (both compute d, then exchange): nobody waits, nothing beyond the exchange
    both = [[Action("F", i), swap(r, i)] for r in (0, 1) for i in range(3)]
    progs = [sum(both[:3], []), sum(both[3:], [])]
    assert program_makespan(sched, progs, lambda r, a: d, 0.0, 0.0, x, 0.0, ((d, p),)) == pytest.approx(3 * (d + x))


def test_lockstep_spread_grows_with_the_compute_between_exchanges():
    # Every schedule's exchanges after compute: the step grows with the spread, by the same share of twice the work
    # for twice the action times; the free program (no spread) is the makespan the rendezvous tests below pin.
    for name, v in (("1f1b", 1), ("interleaved-1f1b", 2), ("gpipe", 1), ("naive", 1), ("zb-h1", 1)):
        w = 0.7 if name == "zb-h1" else 0.0
        free, one = _program_span(name, 2, 8, v, 1.0, 1.5, w), _program_span(name, 2, 8, v, 1.0, 1.5, w, spread=0.1)
        two = _program_span(name, 2, 8, v, 2.0, 3.0, 2 * w, spread=0.1)
        assert one > free and two == pytest.approx(2 * one)


def test_program_makespan_by_hand_gpipe_p2_m2():
    # rank 0: F0 {send a0} F1 {send a1, recv g0} B0 {recv g1} B1; rank 1: {recv a0} F0 {recv a1} F1 B0
    # {send g0} B1 {send g1}; f = b = 1. Rank 1 sleeps for a0 (woken at 1 + x), gets a1 already posted;
    # rank 0 sleeps for g0 (posted at 4 + x, woken at 4 + 2x); g1 is posted before rank 0 asks: 6 + 2x.
    x = 0.1
    assert _program_span("gpipe", 2, 2, 1, 1.0, 1.0, 0.0, wake=x) == pytest.approx(6 + 2 * x)
    assert _program_span("gpipe", 2, 2, 1, 1.0, 1.0, 0.0) == pytest.approx(6.0)


@pytest.mark.parametrize("name", ["naive", "gpipe", "1f1b"])
def test_rendezvous_sends_cost_nothing_where_each_send_meets_a_waiting_receive(name):
    # The executor's program (sends that complete only once their receive is posted, as on gloo) against
    # the simulator (asynchronous sends), free transfers: these schedules never make a sender wait.
    from shardwise.schedules.simulate import Costs, simulate

    for p in (2, 3, 4):
        for m in (2, 4, 8):
            assert _program_span(name, p, m, 1, 1.0, 1.5, 0.0) == pytest.approx(
                simulate(build(name, p, m), Costs(1.0, 1.5, 0.0)).makespan)


def test_rendezvous_sends_stall_interleaved_and_zero_bubble_schedules():
    # Their senders run ahead of the receive (interleaved: the next chunk's activation; ZB-H1: the W
    # passes), so under rendezvous a send waits and the step grows; never shrinks for any schedule.
    from shardwise.schedules.simulate import Costs, simulate

    for name, p, m, v, w in (("interleaved-1f1b", 2, 8, 2, 0.0), ("interleaved-1f1b", 4, 8, 2, 0.0),
                             ("zb-h1", 2, 8, 1, 0.7)):
        program = _program_span(name, p, m, v, 1.0, 1.5, w)
        assert program > 1.1 * simulate(build(name, p, m, v), Costs(1.0, 1.5, w)).makespan
    for name, p, m, v in (("interleaved-1f1b", 2, 2, 2), ("zb-h1", 4, 4, 1), ("zb-h1", 2, 2, 1)):
        w = 0.7 if name == "zb-h1" else 0.0
        assert _program_span(name, p, m, v, 1.0, 1.5, w) >= simulate(build(name, p, m, v), Costs(1.0, 1.5, w)).makespan - 1e-9
