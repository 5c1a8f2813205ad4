"""What `parallelize` returns for one model (or one pipeline chunk): the module to call, the plain model
under it, and how each of its parameters is split.

Everything that must know a parameter's layout — gradient clipping, gathering a full state dict,
checkpoints, the sequence-parallel gradient sums, a tied LM head's twin — reads it here, never from
attributes set on the module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn


@dataclass
class Sharded:
    module: nn.Module  # what the loop calls: the model, its DDP wrapper, or the model FSDP sharded in place
    model: nn.Module  # the plain model under any wrapper: layout-free parameter names
    tp_shards: dict = field(default_factory=dict)  # parameter name -> TPShard (split over tp along a dim)
    sp_partial_grads: tuple[str, ...] = ()  # gradients that sequence parallelism leaves partial over tp
    tp_group: object = None  # the tp process group (None without TP)
    zero: int = 0  # the ZeRO stage applied over dp (0 when there is nothing to shard over)
    # Parameters that are copies of another stage's (the last stage's tied LM head): loaded from their
    # twin's key, never saved, counted once by the gradient norm.
    replicas: frozenset[str] = frozenset()
    experts: object = None  # ExpertPlacement (parallel/expert_parallel.py) when experts are split over ep/etp

    def parameters(self):
        return self.model.parameters()

    def named_parameters(self):
        return self.model.named_parameters()
