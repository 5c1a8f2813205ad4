"""A large search is split over forked processes (planner/search.py): the result must be the one process's, to the
layout, the second and the count — ranked order, ties included, the leanest layout, the first refusal."""

from __future__ import annotations

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


def test_a_small_search_stays_in_one_process(monkeypatch):
    job = make_job(load_model("llama2-7b"), load_cluster("dgx-a100-80gb"), 64, 4096)
    assert search_module.count_candidates(job, 2) < search_module.PARALLEL_CANDIDATES
    monkeypatch.setattr(search_module, "_tallies", _single)
    assert search(job, 2).ranked


def _single(tally, splits, costs, n, progress=None):
    assert n == 1
    yield tally.run(splits)
