"""The pipeline executor: run one schedule (data, from shardwise.schedules) on this rank's model chunks.

Each rank walks its point-to-point program (`schedules.p2p_program`): its actions, with exchanges
between them. An exchange posts its messages together — one `batch_isend_irecv`, an NCCL group — and
waits for all of them before the next action: the sends of the action before and the receives of the
action after (Megatron's `send_forward_recv_backward`, torch's `fwd_send_bwd_recv`), plus any receive
moved earlier so that no two ranks wait on each other's sends. The validator proves every program
finishes whether a send completes when posted (gloo, NCCL's small messages) or only when its receive
is posted, all messages between two ranks in one FIFO (NCCL above its eager threshold).
Tags name each message (kind, micro-batch, producing stage), so gloo matches them by name; NCCL
ignores tags and matches by order, which both sides share because both follow the same program.

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

from shardwise.schedules.p2p import Exchange, p2p_program
from shardwise.schedules.schedule import Schedule, Transfer, p2p_plan, virtual_stage
from shardwise.timeline import Event

try:  # torch's split of one backward into input- and weight-gradient passes (private; torch >= 2.5)
    from torch.distributed.pipelining import _backward as _split_backward
except ImportError:  # pragma: no cover - older torch: W walks the kept graph again
    _split_backward = None


class BatchP2P:
    """Posts an exchange's messages together: one `batch_isend_irecv` (on NCCL one group, whose sends
    and receives progress together; on gloo plain isend / irecv). Returns the works to wait on."""

    def post(self, sends, recvs, group) -> list:
        """sends, recvs: (tensor, global peer rank, tag) each."""
        ops = [dist.P2POp(dist.isend, t, peer, group, tag) for t, peer, tag in sends]
        ops += [dist.P2POp(dist.irecv, t, peer, group, tag) for t, peer, tag in recvs]
        return dist.batch_isend_irecv(ops) if ops else []


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
    program: this rank's point-to-point program (default `p2p_program(schedule)[pp_rank]`);
    p2p: what posts an exchange (default `BatchP2P`; the tests swap in an emulation of NCCL's sends).
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
    program: list | None = None
    p2p: object = None
    synchronize: bool = False  # a GPU traced: each record waits for the device (else it times launches, not work)

    def __post_init__(self):
        assert self.schedule.p > 1, "the executor runs pipelines; pp == 1 trains without it"
        if self.program is None:
            self.program = p2p_program(self.schedule)[self.pp_rank]
        self.p2p = self.p2p or BatchP2P()
        steps = p2p_plan(self.schedule)[self.pp_rank]
        self.sends = {s.action: s.send for s in steps}  # what each action's output feeds on other ranks
        self.inputs = {s.action: {t.kind: t for t in s.recv} for s in steps}  # what each action receives
        # each waited exchange's record but its times, worked out once, not in every step: (kind, micro-batch, chunk,
        # what it moved and with whom)
        self.waited = {i: self._record_of(item) for i, item in enumerate(self.program)
                       if isinstance(item, Exchange) and item.wait}
        self.last_stage = self.schedule.num_stages - 1
        # The last action computing weight gradients of each chunk: data-parallel sync goes with it.
        self.last_weight_action = {s.action.chunk: s.action for s in steps if s.action.kind in ("B", "W")}

    # -- point to point
    def _peer(self, pp_peer: int) -> int:
        return dist.get_global_rank(self.pp_group, pp_peer) if self.pp_group is not None else pp_peer

    def _tag(self, t: Transfer) -> int:
        return (t.src_stage * 2 + (t.kind == "grad")) * self.schedule.m + t.microbatch

    def _post(self, ex: Exchange, outbox: dict, inbox: dict) -> list:
        """Post `ex`: its sends from `outbox` (produced by earlier actions), its receives into new buffers
        in `inbox`. Returns the works, and the sent tensors to keep alive until they complete."""
        sends = [(outbox.pop(t), self._peer(t.dst_rank), self._tag(t)) for t in ex.sends]
        recvs = []
        for t in ex.recvs:
            inbox[t] = torch.empty(self.activation_shape, dtype=self.dtype, device=self.device)
            recvs.append((inbox[t], self._peer(t.src_rank), self._tag(t)))
        return [(w, sends) for w in self.p2p.post(sends, recvs, self.pp_group)]

    def _now(self, t0: float) -> float:
        """Seconds since t0. On a GPU, NCCL's wait and the kernels return before the work is done: a traced run
        synchronises first, so an action's record spans its work (a cost only --trace pays)."""
        if self.synchronize:
            torch.cuda.synchronize(self.device)
        return time.time() - t0

    def _record_of(self, item: Exchange) -> tuple[str, int, int, str]:
        """A waited exchange's record but its times: recv or send, its first transfer's micro-batch and chunk, and what
        it moved and with whom ("activation mb3 from rank 0; gradient mb1 to rank 1"), its name in the trace."""
        p = self.schedule.p
        said = [f"{'activation' if t.kind == 'activation' else 'gradient'} mb{t.microbatch} from rank {t.src_stage % p}"
                for t in item.recvs]
        said += [f"{'activation' if t.kind == 'activation' else 'gradient'} mb{t.microbatch} to rank {t.dst_stage % p}"
                 for t in item.sends]
        t = (item.recvs or item.sends)[0]
        chunk = (t.dst_stage if item.recvs else t.src_stage) // p
        return "recv" if item.recvs else "send", t.microbatch, chunk, "; ".join(said)

    # -- one step
    def step(self, inputs: list[torch.Tensor], targets: list[torch.Tensor], t0: float) -> torch.Tensor | None:
        """Run this rank's program for one optimizer step over m micro-batches. Returns the mean
        micro-batch loss on the rank holding the last stage, else None. Times are recorded
        relative to t0 (wall-clock seconds, the same zero on every rank)."""
        held: dict[tuple[int, int], _Held] = {}
        outbox, inbox, in_flight, loss = {}, {}, [], None
        for i, item in enumerate(self.program):
            start = self._now(t0)
            if isinstance(item, Exchange):
                works = self._post(item, outbox, inbox)
                if not item.wait:
                    in_flight += works
                    continue
                for work, _ in works:
                    work.wait()
                kind, microbatch, chunk, detail = self.waited[i]
                self.records.append(Event(self.pp_rank, kind, microbatch, chunk, start, self._now(t0), detail))
                continue
            a = item
            received = {kind: inbox.pop(t) for kind, t in self.inputs[a].items()}
            stage = virtual_stage(self.pp_rank, a.chunk, self.schedule.p)
            h = held.setdefault((a.microbatch, a.chunk), _Held())
            if a.kind == "F":
                with self.amp():
                    out = self._forward(a, h, stage, received.get("activation"), inputs, targets)
                if stage == self.last_stage:
                    loss = out.detach() if loss is None else loss + out.detach()
            else:
                last = a == self.last_weight_action[a.chunk]
                with self.grad_sync(a.chunk, last) if self.grad_sync else nullcontext():
                    out = self._backward(a, h, received.get("grad"))
                if h.output is None:
                    del held[(a.microbatch, a.chunk)]
            self.records.append(Event(self.pp_rank, a.kind, a.microbatch, a.chunk, start, self._now(t0)))
            for t in self.sends[a]:
                outbox[t] = out.detach().contiguous()
        for work, _ in in_flight:
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
