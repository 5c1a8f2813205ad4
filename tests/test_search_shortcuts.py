"""The search's shortcuts give the answers of the slow paths they replace (each checked against the slow path itself)."""

from shardwise.planner import search as search_mod
from shardwise.planner.job import Job, make_job
from shardwise.planner.memory import fits_memory, memory_breakdown, pipeline_ranks, rank_memory, total_bytes
from shardwise.specs import Layout, TrainSpec, load_cluster, load_model


def _layouts(job: Job, gpus: int):
    """Every (split, micro-batch, schedule, ZeRO, recompute) layout of a small space, as the search builds them."""
    for tp, pp, dp, cp in search_mod.degrees(job, gpus):
        for mb in (1, 2, 4):
            if job.train.global_batch % (dp * mb):
                continue
            for schedule in ("1f1b", "gpipe") if pp > 1 else ("1f1b",):
                for zero in (0, 1, 3):
                    for recompute in ("none", "full"):
                        yield Layout(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch=mb, schedule=schedule, zero=zero,
                                     recompute=recompute, sequence_parallel=tp > 1)


def _record_fit_checks(monkeypatch) -> list:
    """The layouts the search asks fits_memory about, in order (the real answer is still given)."""
    checked, real = [], search_mod.fits_memory

    def spy(job, layout):
        checked.append(layout)
        return real(job, layout)

    monkeypatch.setattr(search_mod, "fits_memory", spy)
    return checked


def test_fits_memory_is_the_whole_breakdown_compared_with_the_gpu():
    # The first rank is checked alone first; the answer must be the worst rank's, whichever rank that is. A large
    # vocabulary on few layers makes the last rank (logits) the worst in some layouts, the first in others.
    job = make_job(load_model("llama3.1-8b"), load_cluster("dgx-a100-40gb"), 64, 8192, "megatron-core")
    kinds = set()
    for layout in _layouts(job, 16):
        rank, mem = memory_breakdown(job, layout)
        slow = total_bytes(mem) <= job.cluster.gpu_memory_bytes
        assert fits_memory(job, layout) == slow, layout
        first_fits = total_bytes(rank_memory(job, layout, pipeline_ranks(job, layout)[0])) <= job.cluster.gpu_memory_bytes
        kinds.add((slow, first_fits, rank == 0))
    # both answers, and layouts whose first rank fits while another does not (the second check decides)
    assert {(True, True, True), (False, False, True), (False, True, False)} <= kinds, kinds


def test_the_leanest_layout_when_nothing_fits_is_the_smallest_breakdown_checked(monkeypatch):
    # Slow path: every layout the search checks, in order, compared by its whole breakdown (the first smallest wins).
    checked = _record_fit_checks(monkeypatch)
    job = Job(load_model("llama2-70b"), load_cluster("dgx-a100-40gb"), TrainSpec(64, 4096))
    result = search_mod.search(job, 8, workers=1)  # one process: the spy sees every check
    assert not result.ranked and len(checked) > 10
    totals = [total_bytes(memory_breakdown(job, layout)[1]) for layout in checked]
    assert result.leanest.layout == checked[totals.index(min(totals))]


def test_a_rank_holds_the_same_whichever_zero_stage_or_recompute_filled_the_cache():
    # rank_holdings is cached per split: a breakdown must not change with the layout that filled the cache first.
    from shardwise.planner import memory

    job = make_job(load_model("llama3.1-70b"), load_cluster("dgx-h100-80gb"), 256, 8192, "torchtitan")
    base = Layout(dp=4, tp=4, pp=4, micro_batch=1, schedule="1f1b", sequence_parallel=True)
    # (torchtitan runs ZeRO 0, 2, 3; its ZeRO-2 under a pipeline reduces once a step, holding what ZeRO-1 would)
    variants = [base.with_(zero=z, recompute=r, recompute_layers=n) for z in (0, 2, 3) for r, n in
                (("none", None), ("selective", None), ("full", None), ("full", 3))]
    alone = {}
    for layout in variants:
        memory._rank_holdings.cache_clear()
        memory._rank_memory.cache_clear()
        alone[layout] = [rank_memory(job, layout, r) for r in range(4)]
    for layout in reversed(variants):  # each now after the others filled the cache
        memory._rank_memory.cache_clear()  # (the breakdown's own cache would answer without asking rank_holdings)
        assert [rank_memory(job, layout, r) for r in range(4)] == alone[layout], layout
    assert len({repr(v) for v in alone.values()}) == len(variants)  # the variants do differ


def test_without_recompute_every_rank_holds_at_least_what_selective_recompute_holds():
    # What lets the search skip a no-recompute layout whose selective twin does not fit (search._FitChecks): under
    # Megatron's selective recompute (the attention core) every rank's total is at most the no-recompute total, exactly.
    from shardwise.planner.memory import rank_memory as rank_bytes

    checked = 0
    for model, framework in (("llama3.1-8b", "megatron-core"), ("gpt3-175b", "megatron-2021"), ("mixtral-8x7b", "nemo"),
                             ("tiny", "shardwise")):
        job = make_job(load_model(model), load_cluster("dgx-a100-40gb"), 64, 4096, framework)
        assert job.selective != "op" and not job.recompute_modules
        for layout in _layouts(job, 16):
            if layout.recompute != "none":
                continue
            for rank in pipeline_ranks(job, layout):
                none = total_bytes(rank_bytes(job, layout, rank))
                assert none >= total_bytes(rank_bytes(job, layout.with_(recompute="selective"), rank)), (model, layout)
                checked += 1
    assert checked > 500


def test_the_search_skipping_by_the_selective_bound_ranks_as_the_search_checking_everything(monkeypatch):
    calls = _record_fit_checks(monkeypatch)
    job = Job(load_model("llama2-13b"), load_cluster("dgx-a100-40gb"), TrainSpec(64, 2048))
    fast = search_mod.search(job, 16, workers=1)  # one process: the spy counts every check
    checked_fast = len(calls)
    monkeypatch.setattr(search_mod._FitChecks, "__call__", lambda self, layout: search_mod.fits_memory(self.job, layout))
    calls.clear()
    slow = search_mod.search(job, 16, workers=1)
    assert checked_fast < len(calls)  # the bound skipped some checks
    assert [(e.layout, e.step_time, e.memory_bytes) for e in fast.ranked] == \
           [(e.layout, e.step_time, e.memory_bytes) for e in slow.ranked]
    assert (fast.scored, fast.timed) == (slow.scored, slow.timed)


def test_skipping_larger_micro_batches_ranks_as_checking_them_even_where_one_micro_batch_holds_less(monkeypatch):
    """Under FSDP's no_sync() (lit-gpt) a step of several micro-batches holds every gradient unsharded in FP32; at one
    micro-batch a step it holds none: a larger micro-batch can fit where a smaller one did not (70B on 256 H100: mb 1
    needs 314 GiB, mb 2 58 GiB)."""
    job = make_job(load_model("llama3-70b"), load_cluster("dgx-h100-80gb"), 512, 8192, "lit-gpt")
    pruned = search_mod.search(job, 256, workers=1)
    monkeypatch.setattr(search_mod, "PRUNE_MICRO_BATCHES", False)
    checked = search_mod.search(job, 256, workers=1)
    assert checked.ranked and checked.ranked[0].layout.micro_batch == 2
    assert [(e.layout, e.step_time) for e in pruned.ranked] == [(e.layout, e.step_time) for e in checked.ranked]
