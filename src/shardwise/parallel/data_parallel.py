"""Data parallelism over the mesh's dp dimension, with the ZeRO stage the layout asks for.

zero 0  DistributedDataParallel on the dp group: bucketed all-reduce overlapped with backward.
zero 1  DDP + torch's ZeroRedundancyOptimizer on the dp group: each dp rank keeps and updates the
        AdamW state of 1/dp of the parameters, then broadcasts them (ZeRO stage 1).
zero 2  FSDP2 `fully_shard(reshard_after_forward=False)`: gradients and optimizer state sharded,
        parameters stay gathered from forward to backward (PyTorch's SHARD_GRAD_OP, its ZeRO-2).
zero 3  FSDP2 `fully_shard` per block and at the root: parameters, gradients and optimizer state
        sharded, gathered block by block (ZeRO stage 3); the root stays gathered from forward to backward.
Each composes with tensor parallelism: it sees the TP shards as ordinary local parameters.

ZeRO 2 and 3 reduce-scatter the gradients after every micro-batch's backward (DeepSpeed's ZeRO-2), so
only the 1/dp shard of the gradients is ever held between micro-batches. Accumulating unsharded
gradients over the step instead (one reduce-scatter per step) would hold all of them plus the
gathered parameters: more memory than ZeRO-1 for the same traffic, a layout nobody should pick.
The price is m reduce-scatters per step instead of one; the planner counts exactly that.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel


def data_parallel(model: nn.Module, dp_mesh, zero: int = 0, experts=None) -> nn.Module:
    """Wrap or shard `model` over the 1-D `dp_mesh`; returns the module to call in the loop. `experts` (an
    ExpertPlacement): experts split over ep, whose gradients are reduced over their replicas (edp), not dp."""
    if dp_mesh is None or dp_mesh.size() == 1:
        return model
    if zero >= 2:
        alone = set()  # experts with one replica: nothing to shard, kept out of the dp units
        if experts is not None and experts.size("edp") > 1:
            _shard_experts(model, experts, zero)
        elif experts is not None:
            names = set(experts.names)
            alone = {p for n, p in model.named_parameters() if n in names}
        for block in model.layers.values():
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=zero == 3, ignored_params=alone or None)
        # The root (embedding, final norm, head) stays gathered from forward to backward, whose first step is the
        # head's: resharding it would gather it again at once. torch's own default for the root since 2.7, but only
        # when reshard_after_forward is left unset.
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=False, ignored_params=alone or None)
        return model
    device_ids = [torch.cuda.current_device()] if dp_mesh.device_type == "cuda" else None
    accepts = inspect.signature(DistributedDataParallel.__init__).parameters
    # No buffer broadcast each forward: the only buffers are RoPE tables, identical everywhere by construction.
    options = {"forward_sync_buffers": False} if "forward_sync_buffers" in accepts else {"broadcast_buffers": False}
    # The gradients are views into DDP's all-reduce buckets: no second copy of every gradient held beside them, none
    # copied in and out each step (the planner counts one FP32 gradient per parameter, and no copies)
    options["gradient_as_bucket_view"] = True
    if "batched_grad_copy" in accepts:  # torch >= 2.13: one copy + one divide per bucket, not per parameter
        options["batched_grad_copy"] = True
    if experts is not None:  # expert_parallel.sync_expert_grads reduces them once per step (added to what CP ignores)
        model._ddp_params_and_buffers_to_ignore = list(getattr(model, "_ddp_params_and_buffers_to_ignore", [])) + experts.names
    return DistributedDataParallel(model, process_group=dp_mesh.get_group(), device_ids=device_ids, **options)


def _shard_experts(model: nn.Module, placement, zero: int) -> None:
    """ZeRO 2/3 of the experts over their own replicas (edp > 1), before the blocks are sharded over dp: FSDP
    averages their gradients over edp; sync_expert_grads rescales that to the sum over edp / dp (a custom
    divide factor would need ReduceOp.PREMUL_SUM, which gloo lacks)."""
    for module in model.modules():
        if getattr(module, "is_moe", False):
            fully_shard(module.experts, mesh=placement.mesh["edp"], reshard_after_forward=zero == 3)
    placement.fsdp = True


class Optimizers:
    """Several optimizers stepped as one: the dense weights' (ZeRO over dp) and the experts' (ZeRO over edp)."""

    def __init__(self, parts: list[torch.optim.Optimizer]):
        self.parts = parts

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.parts for g in opt.param_groups]

    @property
    def state(self) -> dict:
        """This rank's optimizer state (a ZeroRedundancyOptimizer's: its shard's)."""
        return {p: s for opt in self.parts for p, s in getattr(opt, "optim", opt).state.items()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.parts:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for opt in self.parts:
            opt.step()


@contextmanager
def grad_sync(chunk, enabled: bool):
    """Gradient accumulation under DDP (ZeRO 0/1): skip the dp all-reduce on all but the last micro-batch
    of a step. FSDP (ZeRO 2/3) reduce-scatters every micro-batch whatever `enabled` says (module docstring).
    `chunk` is what `parallelize` returned (a `Sharded`)."""
    module = chunk.module
    with module.no_sync() if isinstance(module, DistributedDataParallel) and not enabled else nullcontext():
        yield


def make_optimizer(param_groups: list[dict], zero: int, dp_mesh, **adamw) -> torch.optim.Optimizer:
    """AdamW; under ZeRO-1 its state is partitioned over the dp ranks. Fused: one kernel per parameter group
    on CPU and GPU (PyTorch's for-loop default runs ~10 ops per parameter tensor, ~4x the time on the
    tiny model's 39 tensors); element-wise, so every layout still updates each entry alike."""
    param_groups = [g for g in param_groups if g["params"]]
    adamw = {"fused": True, **adamw}
    for p in (p for g in param_groups for p in g["params"]):
        if not _dense(p):  # torch's fused AdamW walks a parameter's memory as if it were dense
            p.data = p.detach().clone()  # the same order of strides, dense (GPT-2's q/k/v: hf/load.py)
    if zero == 1 and dp_mesh is not None and dp_mesh.size() > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(param_groups, optimizer_class=torch.optim.AdamW,
                                       process_group=dp_mesh.get_group(), **adamw)
    return torch.optim.AdamW(param_groups, **adamw)


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill its memory without gaps, in some order of dimensions (not only row-major)."""
    expected = 1
    for stride, n in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1):
        if stride != expected:
            return False
        expected *= n
    return True
