"""What every rank measures: timed steps (barrier, slowest rank) and memory (states + saved activations)."""

from __future__ import annotations

import random
import time

from shardwise.validate.saved_bytes import SavedBytes, storage_address
from shardwise.validate.config import ValidateConfig, describe
from shardwise.validate.stats import spread

# A layout whose spread (IQR / median) exceeds this after its rounds gets one more round.
NOISY = 0.25
STATE_KEYS = ("weights", "gradients", "optimizer", "activations")


class SavedActivations(SavedBytes):
    """The executor's saved-bytes accounting plus the peak of FSDP's gathered parameters.

    FSDP's gathered parameters are parameters when a tensor is saved, so they count as weights
    (`gathered_peak`: the full parameters FSDP holds beside its shards, sampled whenever a tensor is
    saved in forward or unpacked in backward), never as activations."""

    def __init__(self, modules, fsdp: bool = False, exclude=()):
        super().__init__(modules, exclude)
        self.fsdp, self.gathered_peak = fsdp, 0

    def observe(self) -> None:
        """FSDP's gathered (plain, allocated) parameters right now; its shards are DTensors."""
        from torch.distributed.tensor import DTensor

        if not self.fsdp:
            return
        full = {storage_address(p): p.numel() * p.element_size() for m in self.modules for p in m.parameters()
                if not isinstance(p, DTensor) and storage_address(p)}
        self.gathered_peak = max(self.gathered_peak, sum(full.values()) + _prefetched_bytes(self.modules))


def _prefetched_bytes(modules) -> int:
    """FSDP's all-gathers issued ahead (backward prefetch) whose output is not yet unpacked into
    parameters: their buffers hold the next unit in full already. FSDP2 keeps them in a private
    attribute; 0 if a future torch moves it."""
    from torch.distributed.fsdp import FSDPModule

    total = 0
    for m in modules:
        for sub in m.modules():
            if isinstance(sub, FSDPModule):
                group = getattr(sub._get_fsdp_state(), "_fsdp_param_group", None)
                result = getattr(group, "_all_gather_result", None)
                out = getattr(result, "all_gather_output", None)
                total += out.numel() * out.element_size() if out is not None else 0
    return total


def recompute_working_bytes(rt, fsdp: bool) -> int:
    """Full recompute: what the layer being recomputed in backward saves beyond its input (which is
    already counted, as its checkpoint) — measured by running one layer's forward with its checkpoint
    off under the same hooks. The activation peak is then every checkpoint held plus this working set."""
    import torch

    lay, cfg = rt.cfg.layout, rt.cfg
    model = next(m for m in rt.models if len(m.layers))
    block = next(iter(model.layers.values()))
    seq = cfg.seq_len // lay.cp  # this cp rank's tokens
    seq = seq // lay.tp if lay.sequence_parallel and lay.tp > 1 else seq
    x = torch.randn(lay.micro_batch, seq, cfg.spec.hidden, device=rt.device, requires_grad=True)
    rope = (model.rope_cos, model.rope_sin) if cfg.spec.family == "llama" else None
    counter = SavedActivations(rt.models, fsdp, exclude=[x])
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if rt.device.type == "cuda" else _nothing()
    block.recompute = False
    try:
        with counter.hooks(0), amp:
            block(x, rope)  # no backward: the graph (and what it saved) is dropped here
    finally:
        block.recompute = True
    return counter.peak


def _nothing():
    from contextlib import nullcontext

    return nullcontext()


def _local_bytes(t) -> int:
    from torch.distributed.tensor import DTensor

    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def measure_memory(rt) -> dict:
    """One untimed step with saved-tensor accounting, then the states this rank holds (bytes).
    On a GPU also the caching allocator's peak over that step ("allocator_peak")."""
    import torch

    from shardwise.train import train_step

    cuda = rt.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    from torch.distributed.fsdp import FSDPModule

    models = rt.models
    fsdp = any(isinstance(m, FSDPModule) for m in models)
    counter = SavedActivations(models, fsdp)
    executor = getattr(rt.forward_backward, "executor", None)
    if executor is not None:  # the pipeline executor keys by (micro-batch, chunk) and releases after backward
        executor.saved = counter
        train_step(rt)
        executor.saved = None
    else:  # micro-batches run forward then backward one at a time: a new forward releases the last one
        state = {"n": 0, "ctx": None}

        def pre(module, args):
            counter.release(state["n"] - 1)
            state["ctx"] = counter.hooks(state["n"])
            state["ctx"].__enter__()

        def post(module, args, output):
            state["ctx"].__exit__(None, None, None)
            state["n"] += 1

        handles = [models[0].register_forward_pre_hook(pre), models[0].register_forward_hook(post)]
        try:
            train_step(rt)
        finally:
            for h in handles:
                h.remove()
    params = {id(p): p for m in models for p in m.parameters()}.values()
    opt = getattr(rt.optimizer, "optim", rt.optimizer)  # ZeroRedundancyOptimizer keeps its shard's optimizer
    optim = sum(_local_bytes(v) for s in opt.state.values() for v in s.values() if hasattr(v, "numel"))
    out = {"weights": sum(_local_bytes(p) for p in params) + counter.gathered_peak,
           "gradients": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
           "optimizer": optim, "activations": counter.peak,
           "allocator_peak": torch.cuda.max_memory_allocated() if cuda else 0}
    if rt.cfg.layout.recompute == "full":
        out["activations"] += recompute_working_bytes(rt, fsdp)
    return out


def _timed_steps(rt, steps: int, world: int) -> list[float]:
    import torch
    import torch.distributed as dist

    from shardwise.train import train_step

    out = []
    for _ in range(steps):
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        train_step(rt)  # ends with .item() of the loss: the step's work is done
        if rt.device.type == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def _slowest(values: list[float], world: int) -> list[float]:
    """Element-wise max over ranks."""
    import torch
    import torch.distributed as dist

    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def run_rank(cfg: ValidateConfig, rank: int, world: int, report) -> list[dict] | None:
    """Every layout on this rank: build, warm up, timed rounds in random order, memory."""
    import torch

    from shardwise.parallel import build_mesh
    from shardwise.train import TrainConfig, build_runtime, train_step

    torch.manual_seed(cfg.seed)
    runtimes = []
    for lay in cfg.layouts:
        tcfg = TrainConfig(spec=cfg.model, layout=lay, steps=10**6, global_batch=cfg.global_batch,
                           seq_len=cfg.seq_len, seed=cfg.seed, backend=cfg.backend, timeout_s=cfg.timeout_s,
                           progress=False)
        mesh = build_mesh(lay.pp, lay.dp, lay.tp, cp=lay.cp, backend=cfg.backend, timeout_s=cfg.timeout_s) if world > 1 else None
        rt = build_runtime(tcfg, mesh)
        for _ in range(cfg.warmup):
            train_step(rt)
        runtimes.append(rt)
        report(f"built {describe(lay)}")
    order, times = random.Random(cfg.seed), [[] for _ in runtimes]

    def round_of(indices):
        indices = list(indices)
        order.shuffle(indices)
        for i in indices:
            times[i] += _slowest(_timed_steps(runtimes[i], cfg.steps, world), world)
            report(f"timed {describe(cfg.layouts[i])}")

    for _ in range(cfg.repeats):
        round_of(range(len(runtimes)))
    round_of(i for i, ts in enumerate(times) if spread(ts) > NOISY)  # every rank has the same times
    out = []
    for i, rt in enumerate(runtimes):
        mem = measure_memory(rt)
        states = [float(mem[k]) for k in STATE_KEYS]
        worst = _slowest(states + [sum(states), float(mem["allocator_peak"])], world)
        out.append({"times": times[i], "memory": dict(zip(STATE_KEYS, worst[:4])), "memory_total": worst[4],
                    "allocator_peak": worst[5]})
        report(f"memory {describe(cfg.layouts[i])}")
    return out if rank == 0 else None
