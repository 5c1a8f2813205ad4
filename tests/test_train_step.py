"""What one training step costs around the layers: the global-norm clip and the step's scalars in at most one
collective (none waited for under plain data parallelism), one host read-back, the loop's records deferred by
one step. Values are the exactness tests' business (test_runtime_exactness.py, test_pipeline_exactness.py):
here, what the step issues."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist

from shardwise.launch import spawn_ranks
from shardwise.specs import Layout, load_model

# layout -> (synchronous collectives after forward/backward, async ones): the norm needs a collective when some
# rank holds a part of the gradient the others do not (tp shards, pipeline stages, FSDP shards).
LAYOUTS = {"dp2": (Layout(dp=2, micro_batch=2), 0, 1), "dp2 zero1": (Layout(dp=2, zero=1, micro_batch=2), 0, 1),
           "dp2 zero3": (Layout(dp=2, zero=3, micro_batch=2), 1, 0), "tp2": (Layout(tp=2, micro_batch=2), 1, 0),
           "pp2": (Layout(pp=2, micro_batch=2), 1, 0), "tp2 sp": (Layout(tp=2, sequence_parallel=True, micro_batch=2), 2, 0)}


class _Counter:
    """Counts all_reduce calls (by async_op) and host read-backs (.item(), .tolist()) while `on`."""

    def __init__(self):
        self.on, self.sync, self.asynchronous, self.reads = False, 0, 0, 0
        all_reduce, item, tolist = dist.all_reduce, torch.Tensor.item, torch.Tensor.tolist

        def counted_all_reduce(*args, **kwargs):
            if self.on:
                if kwargs.get("async_op"):
                    self.asynchronous += 1
                else:
                    self.sync += 1
            return all_reduce(*args, **kwargs)

        def read(fn):
            def wrapped(t, *args):
                self.reads += self.on
                return fn(t, *args)
            return wrapped
        dist.all_reduce, torch.Tensor.item, torch.Tensor.tolist = counted_all_reduce, read(item), read(tolist)


def _worker(rank, world, out_dir):
    from shardwise.parallel import build_mesh
    from shardwise.train import TrainConfig, TrainLoop, build_runtime

    counter = _Counter()
    found = {}
    for name, (lay, _, _) in LAYOUTS.items():
        cfg = TrainConfig(load_model("tiny"), lay, steps=4, global_batch=4, seq_len=16, progress=False)
        rt = build_runtime(cfg, build_mesh(lay.pp, lay.dp, lay.tp, backend="gloo", timeout_s=60))
        inner = rt.forward_backward

        def forward_backward(chunks, mbs, inner=inner):  # count what runs after forward/backward
            loss = inner(chunks, mbs)
            counter.on = True
            return loss
        rt.forward_backward = forward_backward
        batches = rt.data.local_microbatches

        def local_microbatches(*args, batches=batches):  # the step's first work: host data, not a device read
            counter.on = False
            return batches(*args)
        rt.data.local_microbatches = local_microbatches
        counter.sync = counter.asynchronous = counter.reads = 0
        loop = TrainLoop(rt, last=cfg.steps)
        loop.step()
        counter.on = False
        logged_after_one = len(loop.records)  # the first step is read back once the second has run
        loop.run(cfg.steps - 1)
        counter.on = False
        found[name] = {"sync": counter.sync / cfg.steps, "async": counter.asynchronous / cfg.steps,
                       "reads": counter.reads / cfg.steps, "logged_after_one": logged_after_one,
                       "steps": [r["step"] for r in loop.records]}
    if rank == 0:
        with open(os.path.join(out_dir, "found.json"), "w") as f:
            json.dump(found, f)


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    out = tmp_path_factory.mktemp("step")
    spawn_ranks(_worker, 2, str(out), timeout_s=120)
    with open(out / "found.json") as f:
        return json.load(f)


@pytest.mark.parametrize("name", LAYOUTS)
def test_one_collective_and_one_read_back_per_step(found, name):
    _, sync, asynchronous = LAYOUTS[name]
    got = found[name]
    # SP adds its partial-gradient all-reduce over tp (needed before the norm); everything else is one scalar
    # all-reduce over every rank, waited for only when the norm needs it.
    assert (got["sync"], got["async"]) == (sync, asynchronous)
    assert got["reads"] == 1  # loss, norm (and aux loss) come back to the host together
    assert got["logged_after_one"] == 0 and got["steps"] == [1, 2, 3, 4]
