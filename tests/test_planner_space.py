"""Narrowing the search: only the allowed knobs appear, and the full search is never worse."""

import functools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.cli import main
from shardwise.planner.job import Job
from shardwise.planner.search import SearchSpace, search
from shardwise.specs import TrainSpec, load_cluster, load_model

JOB = Job(load_model("llama2-13b"), load_cluster("dgx-a100-80gb"), TrainSpec(64, 4096), flash_attention=True)


@functools.lru_cache(maxsize=1)
def _full():
    return search(JOB, 16)


@settings(max_examples=15, deadline=None)
@given(tp=st.sets(st.sampled_from([1, 2, 4, 8]), min_size=1), zero=st.sets(st.sampled_from([0, 1, 2, 3]), min_size=1),
       recompute=st.sets(st.sampled_from(["none", "selective", "full"]), min_size=1),
       schedules=st.sets(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"]), min_size=1))
def test_only_allowed_knobs_and_never_better_than_everything(tp, zero, recompute, schedules):
    space = SearchSpace(tp=tuple(tp), zero=tuple(zero), recompute=tuple(recompute), schedules=tuple(schedules),
                        max_vpp=4)
    narrow = search(JOB, 16, space)
    for e in narrow.ranked:
        lay = e.layout
        assert lay.tp in tp and lay.recompute in recompute and lay.vpp <= 4
        assert lay.zero in zero or lay.dp == 1
        assert lay.pp == 1 or lay.schedule in schedules
    full = _full()
    if narrow.ranked:
        assert full.ranked[0].step_time <= narrow.ranked[0].step_time + 1e-12


def test_zero_0_is_searched_with_data_parallelism_when_asked(capsys):
    code = main(["plan", "--model", "gpt2", "--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "64",
                 "--seq-len", "1024", "--zero", "0", "--tp", "1", "--pp", "1", "--json"])
    assert code == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert (best["dp"], best["tp"], best["pp"], best["zero"]) == (8, 1, 1, 0)


def test_nothing_fits_in_a_narrowed_space_says_to_widen_it(capsys):
    code = main(["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "64",
                 "--seq-len", "2048", "--zero", "0", "--tp", "1", "--pp", "1"])
    assert code == 2 and "widen the search" in capsys.readouterr().err
