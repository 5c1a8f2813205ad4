"""Activation memory, measured: the bytes autograd saves for backward, per micro-batch, and their peak.

The executor and `validate` hand a `SavedBytes` the keys they run (a micro-batch, or a (micro-batch,
chunk)); it counts through `torch.autograd.graph.saved_tensors_hooks`, and the runner releases a key
when its backward is done.
"""

from __future__ import annotations

import torch
from torch import nn


def storage_address(t) -> int:
    """The address of `t`'s storage; 0 for a freed one (FSDP's resharded parameters)."""
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return 0


class SavedBytes:
    """Bytes autograd saves for backward, per key (a micro-batch, or a (micro-batch, chunk)), and the
    peak held at once. Parameters (and views of them: autograd saves `weight.t()`), buffers of
    `modules` and `exclude` are not activations: parameters are recognised by type, the others by
    storage — checks that cost nothing per saved tensor, even under FSDP, whose gathered parameters
    are `nn.Parameter`s with new storage at every gather. The same tensor saved by several ops
    (x feeds wq, wk and wv) counts once, as the Korthikanti et al. accounting does. Subclasses may
    `observe()` other memory each time a tensor is saved or unpacked, and `on_forward()` when a
    key's forward starts."""

    def __init__(self, modules, exclude=()):
        self.modules = list(modules)
        self.exclude = {storage_address(t) for t in (*exclude, *(b for m in self.modules for b in m.buffers()))}
        self.held: dict = {}
        self.current = 0
        self.peak = 0

    def _constant(self, t) -> bool:
        return isinstance(t if t._base is None else t._base, nn.Parameter) or storage_address(t) in self.exclude

    def observe(self) -> None:
        pass

    def on_forward(self) -> None:
        pass

    def hooks(self, key):
        """The saved-tensor hooks to run key's forward under."""
        self.on_forward()
        self.held.setdefault(key, 0)
        seen: set = set()

        def pack(t):
            self.observe()
            ident = (storage_address(t), t.storage_offset(), t.numel())
            if ident not in seen and not self._constant(t):
                seen.add(ident)
                nbytes = t.numel() * t.element_size()
                self.held[key] += nbytes
                self.current += nbytes
                self.peak = max(self.peak, self.current)
            return t

        def unpack(t):
            self.observe()
            return t

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def release(self, key):
        self.current -= self.held.pop(key, 0)
