"""The planner charges a calibrated cluster's fixed per-call costs (`sync_overhead_s` for TP and MoE calls,
`fsdp_call_s` for FSDP's) once per collective it models. Here the runtime's own collectives are counted in one
micro-batch's forward + backward, on 2 gloo ranks with torch's profiler (every c10d call records a "gloo:<op>"
event), and compared with what the planner's model charges: with only that per-call cost set on a cluster, the
step's delta divided by the micro-batches is the planner's count of calls. A call the runtime adds or removes
(the MoE aux loss's count sum over tp, the root unit regathered for the backward) fails here."""

from __future__ import annotations

import collections
import dataclasses
import json
import os

import pytest
import torch

from shardwise.launch import spawn_ranks
from shardwise.planner import Job
from shardwise.planner.step_time import step_time
from shardwise.specs import Layout, TrainSpec, load_cluster, load_model

BATCH, SEQ = 8, 64
# (preset, layout, the planner's time_breakdown_s keys that hold the calls, the [measured] per-call cost they pay)
CASES = [
    ("tiny", dict(dp=2, zero=3), ("dp_comm",), "fsdp_call_s"),
    ("tiny", dict(dp=2, zero=2), ("dp_comm",), "fsdp_call_s"),
    ("tiny-moe", dict(dp=2, zero=3), ("dp_comm",), "fsdp_call_s"),  # experts in their block's unit (ep 1)
    ("tiny-moe", dict(dp=2, zero=2), ("dp_comm",), "fsdp_call_s"),
    ("tiny", dict(tp=2), ("tp_comm",), "sync_overhead_s"),
    ("tiny-gpt2", dict(tp=2), ("tp_comm",), "sync_overhead_s"),
    ("tiny-moe", dict(tp=2), ("tp_comm", "ep_comm"), "sync_overhead_s"),  # + each MoE layer's gather and count sum
    # + the counts exchanged before each dispatch, then the rows there and back (forward), and back and there
    ("tiny-moe", dict(tp=2, ep=2), ("tp_comm", "ep_comm"), "sync_overhead_s"),
    ("tiny-moe", dict(tp=2, etp=2), ("tp_comm", "ep_comm"), "sync_overhead_s"),  # the rows gathered over etp, summed back
    ("tiny-moe", dict(dp=2, ep=2), ("ep_comm",), "sync_overhead_s"),
]
# Calls of a case that are not in its keys: DDP's gradient all-reduce (dp_comm, once per step; this profiled
# micro-batch is a step's last) and its one-time broadcast of the buckets it rebuilt after the first backward.
OTHER_CALLS = {"tiny-moe dp2 ep2": ("gloo:all_reduce", "gloo:broadcast")}


def _name(model: str, lay: dict) -> str:
    return model + " " + " ".join(f"{k}{v}" for k, v in lay.items())


def _count_calls(rank: int, world: int, out_dir: str) -> None:
    from shardwise.model import Transformer
    from shardwise.parallel import build_mesh, parallelize

    counts = {}
    for model, lay, *_ in CASES:
        spec, layout = load_model(model), Layout(**lay)
        chunk = parallelize(Transformer(spec, seed=0), build_mesh(layout.pp, layout.dp, layout.tp), layout)
        x = torch.randint(0, spec.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(0))
        chunk.module(x, x).backward()  # the first step's lazy initialisation issues calls of its own
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            chunk.module(x, x).backward()
        ops = collections.Counter(e.name for e in prof.events() if e.name.startswith("gloo:"))
        counts[_name(model, lay)] = dict(ops)
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(counts, f)


@pytest.fixture(scope="module")
def runtime_calls(tmp_path_factory):
    out = tmp_path_factory.mktemp("calls")
    spawn_ranks(_count_calls, 2, str(out))
    return [json.loads((out / f"{r}.json").read_text()) for r in (0, 1)]


def _planner_calls(model: str, lay: dict, keys: tuple[str, ...], cost_key: str, base: dict | None = None) -> float:
    """Calls per micro-batch the planner charges `cost_key` for (shardwise profile, nothing overlapped), on a
    calibrated cluster whose other [measured] keys are `base`."""
    layout, y = Layout(**lay), 1e-3
    cluster = load_cluster("dgx-a100-80gb")

    def charged(**measured) -> float:
        # a calibrated cluster (a measured model rate), as `validate` predicts on
        calibrated = {"world_size": 0, "model_tflops": 0.05, "comm_overlap": 0.0, **(base or {})}
        job = Job(load_model(model), dataclasses.replace(cluster, measured={**calibrated, **measured}),
                  TrainSpec(BATCH, SEQ), flash_attention=True, framework="shardwise")
        return sum(step_time(job, layout)[k] for k in keys)
    microbatches = layout.num_microbatches(BATCH)
    return (charged(**{cost_key: y}) - charged()) / (microbatches * y)


@pytest.mark.parametrize("model,lay,keys,cost_key", CASES, ids=[_name(m, lay) for m, lay, *_ in CASES])
def test_the_planner_charges_each_call_the_runtime_issues(runtime_calls, model, lay, keys, cost_key):
    name = _name(model, lay)
    skip = ("gloo:barrier",) + OTHER_CALLS.get(name, ())
    issued = [sum(n for op, n in calls[name].items() if op not in skip) for calls in runtime_calls]
    assert issued[0] == issued[1] > 0  # every call is collective: both ranks issue it
    assert _planner_calls(model, lay, keys, cost_key) == pytest.approx(issued[0])


TP_CASES = [case for case in CASES if case[1].get("tp", 1) > 1]


@pytest.mark.parametrize("model,lay,keys,cost_key", TP_CASES, ids=[_name(m, lay) for m, lay, *_ in TP_CASES])
def test_each_call_pays_one_cost_where_calibrate_priced_the_tp_calls(runtime_calls, model, lay, keys, cost_key):
    """With `tp_call_s` measured (calibrate's TP forward + backward), each call of a TP layer and of the
    vocabulary-parallel edges pays it in place of `sync_overhead_s`, and every other synchronising call (a MoE
    layer's: its output gathered over tp, the load-balancing counts summed) still pays `sync_overhead_s`: the two
    counts add up to the runtime's calls, and a dense model's are all TP calls."""
    name = _name(model, lay)
    issued = sum(n for op, n in runtime_calls[0][name].items() if op not in ("gloo:barrier",) + OTHER_CALLS.get(name, ()))
    tp_calls = _planner_calls(model, lay, keys, "tp_call_s", base={"sync_overhead_s": 0.0})
    other = _planner_calls(model, lay, keys, "sync_overhead_s", base={"tp_call_s": 0.0})
    assert tp_calls + other == pytest.approx(issued)
    assert tp_calls >= 2 * load_model(model).num_layers  # the attention's output reduction and its input's gradient
    if not load_model(model).is_moe:
        assert other == pytest.approx(0.0)
