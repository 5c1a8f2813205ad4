"""The simulator against the textbook closed forms, and closed_forms.py proven equal to it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.schedules import closed_forms as cf
from shardwise.schedules.generators import build
from shardwise.specs import SCHEDULES
from shardwise.schedules.schedule import stage_owner, virtual_stage
from shardwise.schedules.simulate import Costs, simulate


def grid():
    for name in SCHEDULES:
        for p in (1, 2, 3, 4, 8):
            for m in (1, 2, 3, 4, 5, 8, 16):
                for v in ((1, 2, 3) if name == "interleaved-1f1b" else (1,)):
                    if name != "interleaved-1f1b" or m % p == 0:
                        yield name, p, m, v


COSTS = [(1, 1, 1), (1, 2, 0.5), (2, 1, 1), (1, 0.5, 2), (1, 1, 0)]


@pytest.mark.parametrize("name,p,m,v", list(grid()))
def test_closed_forms_equal_the_simulator(name, p, m, v):
    s = build(name, p, m, v)
    for f, b, w in COSTS:
        sim = simulate(s, Costs(f, b, w))
        assert cf.pipeline_makespan(name, p, m, v, f, b, w) == pytest.approx(sim.makespan, abs=1e-9)
        assert cf.bubble_fraction(name, p, m, v, f, b, w) == pytest.approx(sim.bubble_fraction, abs=1e-9)
    assert [cf.peak_inflight_microbatches(name, p, m, v, r) for r in range(p)] == sim.peak_inflight_per_rank


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(SCHEDULES), st.integers(1, 6), st.integers(1, 4), st.integers(1, 12),
       st.tuples(*[st.integers(0, 8).map(lambda x: x / 4)] * 3).filter(lambda t: sum(t) > 0))
def test_closed_forms_equal_the_simulator_for_any_costs(name, p, v, m, fbw):
    v = v if name == "interleaved-1f1b" else 1
    m = m * p if name == "interleaved-1f1b" else m
    f, b, w = fbw
    sim = simulate(build(name, p, m, v), Costs(f, b, w))
    assert cf.pipeline_makespan(name, p, m, v, f, b, w) == pytest.approx(sim.makespan, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SCHEDULES), st.integers(2, 6), st.integers(1, 3), st.integers(1, 12),
       st.tuples(st.integers(1, 8), st.integers(1, 8), st.integers(0, 8)).map(lambda t: tuple(x / 4 for x in t)),
       st.lists(st.integers(1, 16).map(lambda x: x / 8), min_size=6, max_size=6))
def test_uneven_ranks_closed_form_bounds_the_simulator(name, p, v, m, fbw, scale):
    """Ranks at different costs, each splitting its time among F, B and W alike (a stack of layers): the uneven form
    is exact for naive and GPipe, never above the even form at the slowest rank's cost, and never below the
    simulator but for ZB-H1 with fewer micro-batches than ranks (3 % at most) and for interleaved 1F1B with ranks
    more than 2x apart or a forward under a quarter of the backward (two slow ranks each waiting on the other:
    8.3 % at most, two ranks 16x the other four)."""
    v = v if name == "interleaved-1f1b" else 1
    m = m * p if name == "interleaved-1f1b" else m
    k = scale[:p]
    sim = simulate(build(name, p, m, v), Costs(*([x * fbw[i] for x in k] for i in range(3)))).makespan
    uneven = cf.uneven_makespan(name, p, m, v, tuple((tuple(x * y for y in fbw), 1) for x in k))
    f, b, w = (max(k) * x for x in fbw)
    if name in ("naive", "gpipe"):
        assert uneven == pytest.approx(sim, abs=1e-9)
    slack = 0.97 if name == "zb-h1" and m < p else 0.91 if name == "interleaved-1f1b" and (
        max(k) > 2 * min(k) or 4 * fbw[0] < fbw[1] + fbw[2]) else 1
    assert sim * slack - 1e-9 <= uneven
    assert uneven <= cf.pipeline_makespan(name, p, m, v, f, b, w) + 1e-9


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["naive", "gpipe"]), st.integers(2, 6), st.integers(1, 12), st.floats(0, 0.5),
       st.lists(st.tuples(*[st.integers(0, 8).map(lambda x: x / 4)] * 3).filter(lambda t: sum(t) > 0),
                min_size=6, max_size=6))
def test_uneven_naive_and_gpipe_are_exact_for_any_costs(name, p, m, c, per_rank):
    """Naive and GPipe in closed form for any per-rank f, b, w and transfer: a head whose forward is the slowest
    beside a layer stage whose backward is (recompute runs on the layers, not on the head)."""
    ranks = per_rank[:p]
    sim = simulate(build(name, p, m), Costs(*([x[i] for x in ranks] for i in range(3)), c=c)).makespan
    assert cf.uneven_makespan(name, p, m, 1, tuple((x, 1) for x in ranks), c) == pytest.approx(sim, abs=1e-9)


def test_uneven_ranks_closed_form_is_exact_where_only_the_last_rank_is_slower():
    """A head's rank 1.5x a layer rank's, an embedding-only first rank (DeepSpeed's type:transformer|embedding
    split), every rank splitting its time alike: the uneven form equals the simulator for 1F1B, interleaved 1F1B
    and GPipe, where the even form at the slowest rank's cost is 8-25 % over."""
    for name, p, m, v in (("1f1b", 8, 8, 1), ("1f1b", 16, 32, 1), ("interleaved-1f1b", 8, 16, 2), ("gpipe", 8, 8, 1)):
        k = [0.05] + [1.0] * (p - 2) + [1.5]
        sim = simulate(build(name, p, m, v), Costs(k, [2 * x for x in k], [0.0] * p)).makespan
        even = cf.pipeline_makespan(name, p, m, v, 1.5, 3.0, 0.0)
        uneven = cf.uneven_makespan(name, p, m, v, tuple(((x, 2 * x, 0.0), 1) for x in k))
        assert uneven == pytest.approx(sim, rel=1e-9) and even >= sim * 1.08, (name, sim, uneven, even)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 8)])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(name, p, m):
    sim = simulate(build(name, p, m), Costs(1, 1, 1))
    assert sim.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    assert sim.bubble_fraction_per_rank == pytest.approx([(p - 1) / (m + p - 1)] * p)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (8, 16, 2)])
def test_interleaved_bubble_is_p_minus_1_over_vm_of_ideal(p, m, v):
    f, b, w = 1, 1.5, 0.5
    sim = simulate(build("interleaved-1f1b", p, m, v), Costs(f, b, w))
    ideal = m * (f + b + w)
    assert (sim.makespan - ideal) / ideal == pytest.approx((p - 1) / (v * m))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_zb_h1_bubble_is_a_third_of_1f1b_when_f_b_w_are_equal(p, m):
    ideal = m * 3.0
    zb = simulate(build("zb-h1", p, m), Costs(1, 1, 1)).makespan - ideal
    ofob = simulate(build("1f1b", p, m), Costs(1, 1, 1)).makespan - ideal
    assert zb == pytest.approx(ofob / 3)


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (4, 3), (8, 16)])
def test_peak_activations_in_flight(p, m):
    gpipe = simulate(build("gpipe", p, m)).peak_inflight_per_rank
    ofob = simulate(build("1f1b", p, m)).peak_inflight_per_rank
    zb = simulate(build("zb-h1", p, m)).peak_inflight_per_rank
    assert gpipe[0] == m  # GPipe holds every micro-batch on stage 0
    assert ofob == [min(p - r, m) for r in range(p)]  # 1F1B: at most p
    assert max(zb) == max(ofob)  # ZB-H1 keeps 1F1B's peak (in stage-activation units)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4)])
def test_interleaved_peak_is_megatrons(p, m, v):
    peaks = simulate(build("interleaved-1f1b", p, m, v)).peak_inflight_per_rank
    # Megatron (Narayanan et al. 2021): rank 0 holds p * (1 + (p-1)/(p*v)) micro-batches of activations.
    assert peaks[0] == pytest.approx(p * (1 + (p - 1) / (p * v)))


costs = st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["naive", "gpipe", "1f1b"]), st.integers(1, 7), st.integers(1, 16), costs, costs, costs,
       st.sampled_from([0.01, 0.1, 0.5, 1.0, 3.0]))
def test_comm_closed_form_is_exact_for_naive_gpipe_1f1b(name, p, m, f, b, w, c):
    sim = simulate(build(name, p, m), Costs(f, b, w, c))
    assert cf.pipeline_makespan(name, p, m, 1, f, b, w, c) == pytest.approx(sim.makespan, abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(2, 4), costs, costs, costs, st.floats(0, 1))
def test_comm_closed_form_interleaved_exact_while_slack_hides_transfers(p, k, v, f, b, w, x):
    c = 0.25 * x * min(f, b, w)  # transfers up to a quarter of the smallest pass
    m = k * p
    sim = simulate(build("interleaved-1f1b", p, m, v), Costs(f, b, w, c))
    assert cf.pipeline_makespan("interleaved-1f1b", p, m, v, f, b, w, c) == pytest.approx(sim.makespan, abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 16), costs, costs, costs, st.floats(0, 1))
def test_comm_closed_form_zb_h1_exact_for_equal_passes_and_close_otherwise(p, m, f, b, w, x):
    c = 0.25 * x * f
    equal = simulate(build("zb-h1", p, m), Costs(f, f, f, c)).makespan
    assert cf.pipeline_makespan("zb-h1", p, m, 1, f, f, f, c) == pytest.approx(equal, abs=1e-9)
    # Unequal passes: within 3.0 %, the worst of an exhaustive scan of this test's space (every p <= 6, m <= 16 and pass
    # cost it draws, x in {0, 0.5, 1}): 51.5 against 50.0 at p 6, m 7, f 1.5, b = w = 2, x 1. The bound was 2.5 %
    # until hypothesis drew p 4, m 5 of the same costs (35.3 against 34.4, 2.6 %).
    c = 0.1 * x * min(f, b, w)
    sim = simulate(build("zb-h1", p, m), Costs(f, b, w, c)).makespan
    assert cf.pipeline_makespan("zb-h1", p, m, 1, f, b, w, c) == pytest.approx(sim, rel=0.0301)


@pytest.mark.parametrize("name,p,m,v", [(n, 4, 8, 2 if n == "interleaved-1f1b" else 1) for n in SCHEDULES]
                         + [("interleaved-1f1b", 2, 8, 4), ("1f1b", 3, 2, 1), ("zb-h1", 5, 7, 1)])
@pytest.mark.parametrize("c", [0.1, 0.5, 2.0])
def test_comm_bounds_for_any_c(name, p, m, v, c):
    """Lower bound: the c = 0 step plus fill and drain. Upper bound: charging c to the producer of
    every cross-rank tensor (longer passes, no transfer delay) can only delay things more.
    For interleaved the closed form itself stays a lower bound at any c."""
    f, b, w = 1.0, 1.5, 0.5
    s = build(name, p, m, v)
    sim = simulate(s, Costs(f, b, w, c)).makespan
    assert cf.pipeline_makespan(name, p, m, v, f, b, w, 0) + 2 * (p - 1) * c <= sim + 1e-9
    assert sim <= simulate(s, Costs(f + v * c, b + v * c, w, 0.0)).makespan + 1e-9
    if name == "interleaved-1f1b":
        assert cf.pipeline_makespan(name, p, m, v, f, b, w, c) <= sim + 1e-9


@pytest.mark.parametrize("name", SCHEDULES)
def test_events_respect_order_and_dependencies(name):
    p, m, v, c = 4, 8, (2 if name == "interleaved-1f1b" else 1), 0.3
    s = build(name, p, m, v)
    sim = simulate(s, Costs(1, 2, 1, c))
    by_key = {(e.rank, e.kind, e.microbatch, e.chunk): e for e in sim.events}
    for r in range(p):
        evs = [e for e in sim.events if e.rank == r]
        assert [(e.kind, e.microbatch, e.chunk) for e in evs] == [(a.kind, a.microbatch, a.chunk) for a in s.ranks[r]]
        assert all(a.end <= b.start + 1e-12 for a, b in zip(evs, evs[1:]))  # one action at a time
    for e in sim.events:  # a forward starts only after its input arrived from the previous stage
        st_ = virtual_stage(e.rank, e.chunk, p)
        if e.kind == "F" and st_ > 0:
            r, ch = stage_owner(st_ - 1, p)
            prev = by_key[(r, "F", e.microbatch, ch)]
            assert e.start >= prev.end + (c if r != e.rank else 0) - 1e-12
    assert sum(sim.busy_per_rank) == pytest.approx(p * m * 4)


def test_per_rank_costs_slow_stage_sets_the_pace():
    # Rank 1 twice as slow: the step takes at least its m * 6 of work plus rank 0's first F and last B.
    p, m = 4, 8
    slow = simulate(build("1f1b", p, m), Costs([1, 2, 1, 1], [1, 2, 1, 1], [1, 2, 1, 1]))
    assert slow.busy_per_rank == [24, 48, 24, 24]
    assert slow.makespan >= 48 + 1 + 2
    assert slow.bubble_fraction_per_rank[1] < slow.bubble_fraction_per_rank[0]
    # A list of p*v per-virtual-stage costs equals the same split given per rank.
    s = build("interleaved-1f1b", 2, 4, 2)
    assert simulate(s, Costs([0.5] * 4, [1] * 4, [0.25] * 4)).makespan == simulate(s, Costs(1, 2, 0.5)).makespan


def test_inflight_curve_returns_to_zero():
    sim = simulate(build("zb-h1", 4, 8), Costs(1, 1, 1))
    for curve in sim.inflight:
        assert curve[-1][1] == 0 and min(u for _, u in curve) >= 0
        assert [t for t, _ in curve] == sorted(t for t, _ in curve)


def _chunks_with_gradients_at_peak(schedule, rank: int) -> int:
    """Walk rank `rank`'s actions in order: a forward adds a chunk-micro-batch of activations, a backward frees one
    when it ends and creates its chunk's gradients when it starts. The chunks with gradients at the last backward
    that starts while the held activations are at their maximum."""
    held, peak, seen, at_peak = 0, 0, set(), 0
    for action in schedule.ranks[rank]:
        if action.kind == "F":
            held += 1
            peak = max(peak, held)
            continue
        seen.add(action.chunk)
        if held == peak:
            at_peak = len(seen)
        held -= 1
    return at_peak


@pytest.mark.parametrize("name,p,m,v", list(grid()))
def test_gradient_chunks_at_the_activation_peak_follow_the_schedule(name, p, m, v):
    s = build(name, p, m, v)
    assert [cf.chunks_with_gradients_at_peak(name, p, m, v, r) for r in range(p)] == [
        _chunks_with_gradients_at_peak(s, r) for r in range(p)]


def test_llama3_405b_splits_hold_their_gradients_as_the_schedule_says():
    # p 16, v 7, rank 1: warm-up 2·14 + 6·16 = 124 chunk-micro-batches. 16 micro-batches (16,384 GPUs): 16·7 = 112
    # <= 124, every forward before any backward, one chunk's gradients at the peak; 32 (8,192 GPUs): 224 − 124 = 100
    # steady-state backwards reach ceil(100/16) = 7 chunks, all of them.
    assert cf.chunks_with_gradients_at_peak("interleaved-1f1b", 16, 16, 7, 1) == 1
    assert cf.chunks_with_gradients_at_peak("interleaved-1f1b", 16, 32, 7, 1) == 7
    assert _chunks_with_gradients_at_peak(build("interleaved-1f1b", 16, 16, 7), 1) == 1


def test_uneven_interleaved_with_two_slow_ranks_falls_below_the_simulator_by_at_most_9_percent():
    """Where the slack above comes from: the first and last ranks 16x the four between them, interleaved 1F1B with
    two chunks a rank and a forward a sixteenth of the backward. Each slow rank waits on the other's chunks across
    the cheap ones, which the closed form's single slowest pace does not see: 8.3 % below the simulator, 2.3 % at
    2x. With the forward a quarter of the backward or more (a forward is a third to a half of it, with or without
    recompute) and the ranks within 2x (the planner's own: a layer more from an uneven cut, a head of up to ~1.7
    layers), it stays above."""
    def ratio(k, fbw):
        sim = simulate(build("interleaved-1f1b", 6, 12, 2), Costs(*([x * fbw[i] for x in k] for i in range(3))))
        return cf.uneven_makespan("interleaved-1f1b", 6, 12, 2, tuple((tuple(x * y for y in fbw), 1) for x in k)) / sim.makespan
    assert 0.91 <= ratio([16, 1, 1, 1, 1, 16], (0.25, 2.0, 2.0)) < 0.92
    assert 0.97 <= ratio([2, 1, 1, 1, 1, 2], (0.25, 2.0, 2.0)) < 0.98
    assert ratio([2, 1, 1, 1, 1, 2], (0.5, 1.0, 1.0)) >= 1 - 1e-12
