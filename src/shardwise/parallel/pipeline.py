"""The pipeline executor: run one schedule (data, from shardwise.schedules) on this rank's model chunks.

Each rank walks its list from `schedules.p2p_plan` in order. Receives are posted right before the
action that needs them and waited on; sends are non-blocking and waited on at the end of the step —
exactly the simulator's rules, so a schedule the validator accepts cannot deadlock here. Tags name
each transfer (kind, micro-batch, producing stage), so gloo matches them by name; NCCL ignores tags
but sees the same per-pair order on both sides because both follow the schedule.

Zero-bubble split backward: I computes only the input gradient (autograd.grad w.r.t. the stage
input, keeping the graph), W then computes the weight gradients from the same graph.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from shardwise.schedules.schedule import Schedule, Step, Transfer, p2p_plan, virtual_stage
from shardwise.timeline import Event

try:  # torch's split of one backward into input- and weight-gradient passes (private; torch >= 2.5)
    from torch.distributed.pipelining import _backward as _split_backward
except ImportError:  # pragma: no cover - older torch: W walks the kept graph again
    _split_backward = None


@dataclass
class _Held:
    """What one (micro-batch, chunk) keeps between its forward and its backward."""

    inputs: torch.Tensor | None = None  # received activation (requires grad), None on virtual stage 0
    output: torch.Tensor | None = None  # the chunk's output, or its loss / m on the last stage
    grad_output: torch.Tensor | None = None  # kept from I for W (zero-bubble)
    param_groups: list | None = None  # the weight-gradient part of the graph, kept from I for W


@dataclass
class PipelineExecutor:
    """Runs one schedule on this pipeline rank (pp > 1, so neighbouring stages are on other ranks).

    chunks: this rank's model chunks (already tensor-parallel); activation_shape: the tensor that
    crosses stages for one micro-batch (batch, seq (÷tp with sequence parallelism), hidden).
    """

    schedule: Schedule
    pp_rank: int
    chunks: list[nn.Module]
    pp_group: dist.ProcessGroup | None
    activation_shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    device: torch.device | str = "cpu"
    saved: object = None  # a validate.saved_bytes.SavedBytes, to measure activation bytes in flight
    records: list[Event] = field(default_factory=list)  # measured, seconds since the aligned epoch
    # (chunk, is_last_weight_backward) -> context for each backward: FSDP's gradient sync switch
    grad_sync: Callable | None = None
    amp: Callable = nullcontext  # autocast context for forwards (bf16 on GPU)

    def __post_init__(self):
        assert self.schedule.p > 1, "the executor runs pipelines; pp == 1 trains without it"
        self.steps: list[Step] = p2p_plan(self.schedule)[self.pp_rank]
        self.last_stage = self.schedule.num_stages - 1
        # The last action computing weight gradients of each chunk: data-parallel sync goes with it.
        self.last_weight_step = {s.action.chunk: i for i, s in enumerate(self.steps) if s.action.kind in ("B", "W")}

    # -- point to point
    def _peer(self, pp_peer: int) -> int:
        return dist.get_global_rank(self.pp_group, pp_peer) if self.pp_group is not None else pp_peer

    def _tag(self, t: Transfer) -> int:
        return (t.src_stage * 2 + (t.kind == "grad")) * self.schedule.m + t.microbatch

    def _recv(self, t: Transfer) -> torch.Tensor:
        buf = torch.empty(self.activation_shape, dtype=self.dtype, device=self.device)
        dist.recv(buf, src=self._peer(t.src_rank), group=self.pp_group, tag=self._tag(t))
        return buf

    def _send(self, t: Transfer, tensor: torch.Tensor, pending: list) -> None:
        tensor = tensor.detach().contiguous()  # kept alive in `pending` until the send completes
        pending.append((dist.isend(tensor, dst=self._peer(t.dst_rank), group=self.pp_group, tag=self._tag(t)), tensor))

    # -- one step
    def step(self, inputs: list[torch.Tensor], targets: list[torch.Tensor], t0: float) -> torch.Tensor | None:
        """Run this rank's actions for one optimizer step over m micro-batches. Returns the mean
        micro-batch loss on the rank holding the last stage, else None. Times are recorded
        relative to t0 (wall-clock seconds, the same zero on every rank)."""
        held: dict[tuple[int, int], _Held] = {}
        pending, loss = [], None
        for i, step in enumerate(self.steps):
            a = step.action
            start = time.time() - t0
            received = {t.kind: self._recv(t) for t in step.recv}
            if step.recv:
                self.records.append(Event(self.pp_rank, "recv", a.microbatch, a.chunk, start, time.time() - t0))
                start = time.time() - t0
            stage = virtual_stage(self.pp_rank, a.chunk, self.schedule.p)
            h = held.setdefault((a.microbatch, a.chunk), _Held())
            if a.kind == "F":
                with self.amp():
                    out = self._forward(a, h, stage, received.get("activation"), inputs, targets)
                if stage == self.last_stage:
                    loss = out.detach() if loss is None else loss + out.detach()
            else:
                sync = self.grad_sync(a.chunk, i == self.last_weight_step[a.chunk]) if self.grad_sync else nullcontext()
                with sync:
                    out = self._backward(a, h, received.get("grad"))
                if h.output is None:
                    del held[(a.microbatch, a.chunk)]
            self.records.append(Event(self.pp_rank, a.kind, a.microbatch, a.chunk, start, time.time() - t0))
            for t in step.send:
                self._send(t, out, pending)
        for work, _ in pending:
            work.wait()
        return loss

    def forward_only(self, inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> torch.Tensor | None:
        """Validation: each micro-batch through the stages in order, no backward. Returns the mean micro-batch
        loss on the rank holding the last stage, else None. Every rank walks (micro-batch, stage) in the same
        order and a receive needs only earlier items, so blocking sends (NCCL's rendezvous) cannot deadlock."""
        p, loss = self.schedule.p, None
        with torch.no_grad():
            for mb in range(len(inputs)):
                for stage in range(self.pp_rank, self.schedule.num_stages, p):
                    x = inputs[mb]
                    if stage > 0:
                        x = torch.empty(self.activation_shape, dtype=self.dtype, device=self.device)
                        dist.recv(x, src=self._peer((stage - 1) % p), group=self.pp_group)
                    last = stage == self.last_stage
                    with self.amp():
                        out = self.chunks[stage // p](x, targets[mb] if last else None)
                    if last:
                        loss = out.float() / len(inputs) + (0 if loss is None else loss)
                    else:
                        dist.send(out.contiguous(), dst=self._peer((stage + 1) % p), group=self.pp_group)
        return loss

    def _forward(self, a, h: _Held, stage: int, activation, inputs, targets):
        if stage == 0:
            x = inputs[a.microbatch]
        else:
            x = h.inputs = activation.requires_grad_(True)
        target = targets[a.microbatch] if stage == self.last_stage else None
        with self.saved.hooks((a.microbatch, a.chunk)) if self.saved else nullcontext():
            out = self.chunks[a.chunk](x, target)
        h.output = out / self.schedule.m if target is not None else out  # step loss = mean over micro-batches
        return h.output

    def _backward(self, a, h: _Held, grad_output):
        """B: full backward. I: input gradient only, graph kept. W: weight gradients from that graph."""
        if a.kind == "W":
            params = [p for p in self.chunks[a.chunk].parameters() if p.requires_grad]
            if h.param_groups is not None:  # only the weight part of the graph is left to walk
                _split_backward.stage_backward_weight(iter(params), h.param_groups)
            else:
                torch.autograd.backward(h.output, h.grad_output, inputs=params)
            return self._release(a, h)
        if a.kind == "B":
            torch.autograd.backward(h.output, grad_output)
            grad_in = h.inputs.grad if h.inputs is not None else None
            self._release(a, h)
            return grad_in
        h.grad_output = grad_output
        if h.inputs is None:  # virtual stage 0: no input gradient to produce; W does all the work
            return None
        if _split_backward is not None:
            # torch's graph split: the input gradient now, the weight-gradient subgraph kept for W,
            # so I + W cost one backward (the plain fallback below walks the graph twice).
            params = [p for p in self.chunks[a.chunk].parameters() if p.requires_grad]
            grads, h.param_groups = _split_backward.stage_backward_input(
                [h.output], None if grad_output is None else [grad_output], [h.inputs], iter(params))
            return grads[0]
        (grad_in,) = torch.autograd.grad(h.output, [h.inputs], grad_output, retain_graph=True)
        return grad_in

    def _release(self, a, h: _Held):
        if self.saved:
            self.saved.release((a.microbatch, a.chunk))
        h.inputs = h.output = h.grad_output = h.param_groups = None
