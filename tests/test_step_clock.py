"""How the training loop times a step (train.StepClock): the host's clock on a CPU, unchanged; on a GPU, CUDA events at
the step boundaries, so that a step's time is its own device work even though the host runs ahead of the device and
blocks where it must wait for it (a batch copy from pageable memory, the scalars' read-back). No GPU here: a simulated
device (a host clock, a device that runs queued work in order, events that fire when the work before them has run)
stands in for one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from shardwise import train
from shardwise.specs import Layout, load_model
from shardwise.train import StepClock, TrainConfig, TrainLoop


class _Device:
    """A host clock and a device that runs the work queued on its one stream in order: `busy_until` is when the
    queued work ends."""

    def __init__(self):
        self.host, self.busy_until = 0.0, 0.0
        self.syncs = 0

    def wait_all(self):
        self.host = max(self.host, self.busy_until)


class _Event:
    """A CUDA event on the simulated device: fires when the work queued before it has run."""

    def __init__(self, dev: _Device):
        self.dev, self.at, self.synced = dev, None, False

    def record(self):
        self.at = max(self.dev.busy_until, self.dev.host)

    def synchronize(self):
        self.synced = True
        self.dev.host = max(self.dev.host, self.at)

    def elapsed_time(self, end: "_Event") -> float:
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1e3  # milliseconds, as torch.cuda.Event's


def test_cpu_marks_are_the_host_clock():
    ticks = iter([1.0, 1.25])
    clock = StepClock("cpu", events=lambda: pytest.fail("no event on a CPU"), clock=lambda: next(ticks))
    start, end = clock.mark(), clock.mark()
    assert (start, end) == (1.0, 1.25) and clock.seconds(start, end) == 0.25


def test_cuda_marks_are_events_read_without_a_sync_of_their_own():
    dev = _Device()
    made = []

    def event():
        made.append(_Event(dev))
        return made[-1]
    clock = StepClock(torch.device("cuda", 0), events=event, clock=lambda: pytest.fail("no host clock on a GPU"))
    start = clock.mark()
    dev.busy_until = 0.75  # the step's device work, queued while the host returned at once
    end = clock.mark()
    assert made == [start, end] and (start.at, end.at) == (0.0, 0.75)
    assert clock.seconds(start, end) == pytest.approx(0.75)
    assert end.synced and not start.synced  # the end event only (passed already when the step's scalars were read)


@pytest.mark.parametrize("steps", [1, 5])
def test_each_step_gets_its_own_device_time(monkeypatch, steps):
    """A GPU-bound step (G s of device work, queued in L s of host time): the host blocks at the next step's batch copy
    until the device has finished the step before, and at the read-back until everything queued has run. Timed with
    the host's clock, step 1 read L and step 2 2G - L; with events, every step reads G."""
    G, L = 1.0, 0.1
    dev = _Device()

    def launch_step(rt):
        dev.wait_all()  # the batch copy from pageable host memory waits for the device
        began = dev.host
        dev.host += L
        dev.busy_until = max(dev.busy_until, began) + G
        rt.step += 1
        return SimpleNamespace(read=lambda: (dev.wait_all(), {"loss": 1.0, "grad_norm": 1.0, "lr": 1e-3})[1])

    monkeypatch.setattr(train, "launch_step", launch_step)
    monkeypatch.setattr(train, "time", SimpleNamespace(perf_counter=lambda: dev.host, time=lambda: dev.host))
    cfg = TrainConfig(load_model("tiny"), Layout(micro_batch=2), steps=steps, global_batch=4, seq_len=16,
                      backend="nccl", progress=False)
    rt = SimpleNamespace(cfg=cfg, step=0, device=torch.device("cuda", 0))
    loop = TrainLoop(rt, last=steps)
    loop.clock = StepClock(rt.device, events=lambda: _Event(dev), clock=lambda: dev.host)
    records = loop.run(steps)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert [r["step_time_s"] for r in records] == pytest.approx([G] * steps)
    assert [r["tokens_per_s"] for r in records] == pytest.approx([cfg.tokens_per_step / G] * steps)


def test_cpu_loop_records_unchanged():
    """A real CPU run: the loop makes no events, every step is recorded once, in order, with a positive time from the
    host clock, and tokens/s is tokens per step over it."""
    cfg = TrainConfig(load_model("tiny"), Layout(micro_batch=2), steps=3, global_batch=4, seq_len=16, progress=False)
    rt = train.build_runtime(cfg, None)
    loop = TrainLoop(rt, last=cfg.steps)
    assert not loop.clock.cuda
    records = loop.run(cfg.steps)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert isinstance(r["step_time_s"], float) and r["step_time_s"] > 0
        assert r["tokens_per_s"] == pytest.approx(cfg.tokens_per_step / r["step_time_s"])
