"""A large search is split over forked processes (planner/search.py): the result must be the one process's, to the
layout, the second and the count — ranked order, ties included, the leanest layout, the first refusal."""

from __future__ import annotations

from shardwise.forked import deal
from shardwise.planner import search as search_module
from shardwise.planner.job import make_job
from shardwise.planner.search import SearchSpace, search
from shardwise.specs import load_cluster, load_model


def _same(a, b) -> None:
    assert [(e.layout, e.step_time, e.memory_per_gpu) for e in a.ranked] == \
        [(e.layout, e.step_time, e.memory_per_gpu) for e in b.ranked]
    assert (a.scored, a.timed, a.refused, a.thinned) == (b.scored, b.timed, b.refused, b.thinned)
    assert (a.leanest.layout, a.leanest.memory_per_gpu) == (b.leanest.layout, b.leanest.memory_per_gpu)


def test_two_and_three_workers_find_what_one_does():
    job = make_job(load_model("llama2-13b"), load_cluster("dgx-h100-80gb"), 256, 4096, "megatron-core")
    one = search(job, 64, workers=1)
    assert len(one.ranked) > 1000
    for n in (2, 3):
        _same(search(job, 64, workers=n), one)


def test_workers_agree_when_nothing_fits_and_when_the_stack_refuses():
    # Nothing fits: the leanest of the unfit layouts is chosen over every worker's, first of the smallest.
    job = make_job(load_model("llama3.1-405b"), load_cluster("dgx-a100-40gb"), 64, 8192, "megatron-core")
    one = search(job, 16, workers=1)
    assert not one.ranked
    _same(search(job, 16, workers=2), one)
    # DeepSpeed cannot interleave nor run ZeRO-2/3 with a pipeline: the first refusal is kept.
    job = make_job(load_model("llama2-13b"), load_cluster("dgx-a100-80gb"), 256, 4096, "deepspeed")
    space = SearchSpace(zero=(3,), schedules=("interleaved-1f1b",))
    _same(search(job, 64, space, workers=2), search(job, 64, space, workers=1))


def test_the_hands_hold_every_split_once_in_order_and_about_equal_cost():
    costs = [5, 1, 1, 1, 1, 1, 1, 1, 1, 7]
    hands = deal(costs, 3)
    assert sorted(sum(hands, [])) == list(range(10)) and all(h == sorted(h) for h in hands)
    loads = sorted(sum(costs[i] for i in h) for h in hands)
    assert loads == [6, 7, 7]  # the 7 alone; the 5 with one 1; the other seven 1s
    assert deal(costs, 1) == [list(range(10))]
    # 405B on 16,384 H100s: a few splits hold most candidates; runs of neighbouring splits gave one process 829 of 1,281.
    job = make_job(load_model("llama3.1-405b"), load_cluster("dgx-h100-80gb"), 2048, 8192, "megatron-core")
    space, _ = search_module.check_search(job, 16384, SearchSpace())
    fw = search_module.get_framework(job.framework)
    big = [search_module._split_candidates(job, fw, space, *s) for s in search_module.degrees(job, 16384, space)]
    assert sum(big) > search_module.PARALLEL_CANDIDATES  # searched over processes
    assert max(sum(big[i] for i in h) for h in deal(big, 2)) <= 0.51 * sum(big)


def test_a_small_search_stays_in_one_process(monkeypatch):
    job = make_job(load_model("llama2-7b"), load_cluster("dgx-a100-80gb"), 64, 4096)
    assert search_module.count_candidates(job, 2) < search_module.PARALLEL_CANDIDATES
    monkeypatch.setattr(search_module, "_tallies", _single)
    assert search(job, 2).ranked


def _single(tally, splits, hands):
    assert len(hands) == 1
    yield tally.run([splits[i] for i in hands[0]])
