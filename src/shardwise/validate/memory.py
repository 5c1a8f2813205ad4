"""Memory as shardwise counts it, on one rank: model states held plus the bytes autograd saves.

    mem = measure_memory(rt, train_step)   # one training step under the counters, then the states
    mem  # {"weights", "gradients", "optimizer", "activations", "allocator_peak"} in bytes

weights     parameters as allocated (this rank's shards), plus the peak of the full parameters
            FSDP holds gathered beside its shards (sampled whenever a tensor is saved or unpacked);
gradients   the peak of the gradients held between micro-batches and after the step: `p.grad`
            and FSDP's unsharded accumulation, sampled at each micro-batch's forward and after
            the step. A unit's gradients in flight to their reduce-scatter are communication
            buffers (the planner's workspace), not counted;
optimizer   AdamW's state tensors after the step (ZeroRedundancyOptimizer: this rank's shard);
activations the peak of what autograd saves for backward (`SavedBytes`), parameters and buffers
            excluded, plus under full recompute the working set of the layer being recomputed.

`validate` (measure.py) and `shardwise train --json` (train.py) both count this way; the planner's
weights + gradients + optimizer + activations + logits predict it (docs/planner.md).
"""

from __future__ import annotations

import torch

from shardwise import precision
from shardwise.moe import moe_layers_of
from shardwise.validate.saved_bytes import SavedBytes, storage_address

STATE_KEYS = ("weights", "gradients", "optimizer", "activations")


def _local(t):
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(t) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


class MemoryCounter(SavedBytes):
    """SavedBytes plus the peaks of FSDP's gathered parameters and of the gradients held.

    FSDP's gathered parameters are parameters when a tensor is saved, so they count as weights
    (`gathered_peak`), never as activations."""

    def __init__(self, modules, exclude=()):
        super().__init__(modules, exclude)
        self.fsdp_groups = list(_fsdp_param_groups(modules))
        self.gathered_peak = 0
        self.gradient_peak = 0

    def observe(self) -> None:
        """FSDP's gathered parameters right now: those whose all-gathered storage is allocated, and the
        all-gathers issued ahead (backward prefetch) not yet unpacked into parameters."""
        if self.fsdp_groups:
            self.gathered_peak = max(self.gathered_peak, gathered_bytes(self.fsdp_groups))

    def on_forward(self) -> None:
        self.sample_gradients()

    def sample_gradients(self) -> None:
        self.gradient_peak = max(self.gradient_peak, held_gradient_bytes(self.modules))


def _fsdp_param_groups(modules):
    """FSDP2's parameter groups under `modules` (private attributes; none if a future torch moves them)."""
    from torch.distributed.fsdp import FSDPModule

    for m in modules:
        for sub in m.modules():
            if isinstance(sub, FSDPModule):
                group = getattr(sub._get_fsdp_state(), "_fsdp_param_group", None)
                if group is not None:
                    yield group


def held_gradient_bytes(modules) -> int:
    """Gradients held right now: every parameter's .grad (FSDP: its shard) and the unsharded gradients
    FSDP accumulates when a backward does not reduce-scatter. Each storage once."""
    grads = [p.grad for m in modules for p in m.parameters()]
    for group in _fsdp_param_groups(modules):
        for fp in group.fsdp_params:
            grads += [getattr(fp, "unsharded_accumulated_grad", None), getattr(getattr(fp, "_unsharded_param", None), "grad", None)]
    held = {}
    for g in (_local(g) for g in grads if g is not None):
        if storage_address(g):  # FSDP's shards of one unit are views of one buffer: tell them apart by offset
            held[(storage_address(g), g.storage_offset(), g.numel())] = _nbytes(g)
    return sum(held.values())


def gathered_bytes(groups) -> int:
    """Full parameters FSDP holds beside its shards: each gathered parameter (its storage allocated) and
    each all-gather issued ahead whose output is not yet unpacked into parameters (backward prefetch:
    its buffer holds the next unit in full already). Private FSDP2 attributes; 0 if a torch moves them."""
    total = 0
    for group in groups:
        for fp in group.fsdp_params:
            p = getattr(fp, "_unsharded_param", None)
            if p is not None and p.untyped_storage().size():
                total += _nbytes(p)
        out = getattr(getattr(group, "_all_gather_result", None), "all_gather_output", None)
        total += out.numel() * out.element_size() if out is not None else 0
    return total


def recompute_working_bytes(rt) -> int:
    """Full recompute: what the layer being recomputed in backward saves beyond its input (which is
    already counted, as its checkpoint) — measured by running one layer's forward with its checkpoint
    off under the same hooks. The activation peak is then every checkpoint held plus this working set."""
    lay, cfg = rt.cfg.layout, rt.cfg
    model = next(m for m in rt.models if len(m.layers))
    block = next(iter(model.layers.values()))
    seq = cfg.seq_len // lay.cp  # this cp rank's tokens
    seq = seq // lay.tp if lay.sequence_parallel and lay.tp > 1 else seq
    x = torch.randn(lay.micro_batch, seq, cfg.spec.hidden, device=rt.device, requires_grad=True)
    rope = (model.rope_cos, model.rope_sin) if cfg.spec.family == "llama" else None
    counter = MemoryCounter(rt.models, exclude=[x])
    amp = precision.autocast(rt.device.type, rt.cfg.autocast)
    # a MoE block counts its load-balancing loss into the step's record as it runs: the probe's must not be counted
    moes = moe_layers_of([block])
    kept = [m.aux_loss_sum for m in moes]
    block.recompute = False
    try:
        with counter.hooks(0), amp:
            block(x, rope)  # no backward: the graph (and what it saved) is dropped here
    finally:
        block.recompute = True
        for m, aux in zip(moes, kept):
            m.aux_loss_sum = aux
    return counter.peak


def measure_memory(rt, step) -> tuple[dict, dict]:
    """Run `step(rt)` (one training step) under the counters: (its record, this rank's memory in bytes).
    On a GPU also the caching allocator's peak over that step ("allocator_peak")."""
    cuda = rt.device.type == "cuda"
    others = 0  # what the allocator holds for others at the start: validate keeps every layout's runtime alive
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        others = torch.cuda.memory_allocated() - _resident_bytes(rt)
    models = rt.models
    counter = MemoryCounter(models)
    executor = getattr(rt.forward_backward, "executor", None)
    if executor is not None:  # the pipeline executor keys by (micro-batch, chunk) and releases after backward
        executor.saved = counter
        try:
            record = step(rt)
        finally:
            executor.saved = None
    else:  # micro-batches run forward then backward one at a time: a new forward releases the last one
        record = _step_with_hooks(rt, step, counter)
    counter.sample_gradients()
    params = {id(p): p for m in models for p in m.parameters()}.values()
    optim = sum(_nbytes(v) for v in _optimizer_states(rt))
    out = {"weights": sum(_nbytes(p) for p in params) + counter.gathered_peak,
           "gradients": counter.gradient_peak, "optimizer": optim, "activations": counter.peak,
           "allocator_peak": torch.cuda.max_memory_allocated() - others if cuda else 0}
    if rt.cfg.layout.recompute == "full":
        out["activations"] += recompute_working_bytes(rt)
    return record, out


def _optimizer_states(rt):
    """This rank's optimizer state tensors (ZeroRedundancyOptimizer keeps its shard's optimizer as `.optim`)."""
    opt = getattr(rt.optimizer, "optim", rt.optimizer)
    return (v for s in opt.state.values() for v in s.values() if hasattr(v, "numel"))


def _resident_bytes(rt) -> int:
    """Bytes of this runtime's own tensors alive between steps: its parameters, the gradients it holds, its optimizer
    states (each storage once)."""
    tensors = [p for m in rt.models for p in m.parameters()]
    tensors += [p.grad for p in tensors if p.grad is not None]
    tensors += list(_optimizer_states(rt))
    storages = {}
    for t in map(_local, tensors):
        if t.device.type == rt.device.type:  # a CPU scalar (AdamW's step) is not in the GPU's allocator
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _step_with_hooks(rt, step, counter: MemoryCounter):
    state = {"n": 0, "ctx": None}

    def pre(module, args):
        counter.release(state["n"] - 1)
        state["ctx"] = counter.hooks(state["n"])
        state["ctx"].__enter__()

    def post(module, args, output):
        state["ctx"].__exit__(None, None, None)
        state["n"] += 1

    model = rt.models[0]
    handles = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]
    try:
        return step(rt)
    finally:
        for h in handles:
            h.remove()


def worst_over_ranks(mem: dict) -> dict:
    """{part: max over ranks} for the STATE_KEYS and "total" (the largest per-rank sum), in bytes.
    Collective over the default group when one exists."""
    import torch.distributed as dist

    from shardwise.parallel.mesh import collective_device

    parts = [float(mem[k]) for k in STATE_KEYS]
    values = torch.tensor(parts + [sum(parts), float(mem.get("allocator_peak", 0))], dtype=torch.float64,
                          device=collective_device())
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    out = dict(zip(STATE_KEYS, values.tolist()))
    out["total"], out["allocator_peak"] = values[4].item(), values[5].item()
    return out
