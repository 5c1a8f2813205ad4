"""The planner's speed-ups on its specs keep what the plain dataclasses did (e53fd49): a spec's kept hash is the one
its fields give, is never carried into a pickle or onto a changed copy, and Layout.with_ is dataclasses.replace."""

import pickle
from dataclasses import fields, replace

import pytest

from shardwise.planner.job import make_job
from shardwise.specs import Layout, TrainSpec, load_cluster, load_model


def test_a_kept_hash_is_the_fields_hash_and_stays_out_of_pickles():
    model = load_model("llama2-7b")
    twin = replace(model)  # equal, built anew: no kept hash yet
    assert hash(model) == hash(twin) and {model: 1}[twin] == 1
    kept = [k for k in vars(model) if k not in {f.name for f in fields(model)}]
    assert kept  # the hash is kept on the instance after the first call ...
    restored = pickle.loads(pickle.dumps(model))
    assert not set(kept) & set(vars(restored))  # ... and left out of a pickle (a string's hash is per process)
    assert restored == model and hash(restored) == hash(model)
    # a changed copy hashes its own fields, not the original's kept value
    assert hash(replace(TrainSpec(64, 2048), seq_len=4096)) == hash(TrainSpec(64, 4096))
    job = make_job(model, load_cluster("dgx-h100-80gb"), 64, 2048)
    assert hash(job) == hash(make_job(model, load_cluster("dgx-h100-80gb"), 64, 2048))
    assert hash(job) != hash(make_job(model, load_cluster("dgx-h100-80gb"), 64, 4096))


def test_layout_with_is_dataclasses_replace():
    layout = Layout(dp=4, tp=2, pp=2, micro_batch=2, zero=1, recompute="full", sequence_parallel=True)
    hash(layout)  # were Layout's hash ever kept on it, with_'s copy of its fields must not carry it over
    for changes in ({"dp": 8}, {"recompute_layers": 3, "recompute": "full"}, {"schedule": "gpipe", "vpp": 1}, {}):
        copy = layout.with_(**changes)
        assert copy == replace(layout, **changes) and hash(copy) == hash(replace(layout, **changes))
        assert copy is not layout and layout == Layout(dp=4, tp=2, pp=2, micro_batch=2, zero=1, recompute="full",
                                                       sequence_parallel=True)  # the original is untouched
    with pytest.raises(TypeError):
        layout.with_(pipeline=2)  # an unknown name raises, as replace does
