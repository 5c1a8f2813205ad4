"""Pipeline parallelism: cut the model into stages, then run a schedule (data) over them.

Stages: the L layers are cut into p*v contiguous pieces (v chunks per rank when interleaving;
rank r holds virtual stages r, r+p, ...). The cut minimises the most expensive stage, where a
layer costs its forward+backward FLOPs, the LM head and loss count on the last stage and the
embedding on the first — so uneven splits (⌈L/S⌉ or ⌊L/S⌋ layers, or fewer next to a heavy head)
come out of the same rule.

Executor: each rank walks its list from `schedules.p2p_plan` in order. Receives are posted right
before the action that needs them and waited on; sends are non-blocking and waited on at the end
of the step — exactly the simulator's rules, so a schedule the validator accepts cannot deadlock
here. Tags name each transfer (kind, micro-batch, producing stage), so gloo matches them by name;
NCCL ignores tags but sees the same per-pair order on both sides because both follow the schedule.

Zero-bubble split backward: I computes only the input gradient (autograd.grad w.r.t. the stage
input, keeping the graph), W then computes the weight gradients from the same graph.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from shardwise.schedules.schedule import Schedule, Step, Transfer, p2p_plan, virtual_stage
from shardwise.specs import ModelSpec
from shardwise.timeline import Event

try:  # torch's split of one backward into input- and weight-gradient passes (private; torch >= 2.5)
    from torch.distributed.pipelining import _backward as _split_backward
except ImportError:  # pragma: no cover - older torch: W walks the kept graph again
    _split_backward = None


# --------------------------------------------------------------------------- stage split


def stage_costs(spec: ModelSpec, seq_len: int) -> tuple[float, float, float]:
    """(per layer, embedding, LM head + loss) forward FLOPs per token; backward is ~2x for all three."""
    layer = 2 * spec.params_per_layer() + 4 * seq_len * spec.q_dim  # matmuls + attention scores/values
    embedding = 2 * spec.hidden  # a lookup (and its scatter-add in backward): memory, not FLOPs
    head = 2 * spec.hidden * spec.vocab_size + 5 * spec.vocab_size  # logits matmul + softmax/loss
    return float(layer), float(embedding), float(head)


def split_layers(spec: ModelSpec, num_stages: int, seq_len: int = 2048) -> list[list[int]]:
    """Contiguous layer ids per virtual stage, minimising the costliest stage (each stage ≥ 1 layer)."""
    L = spec.num_layers
    if not 1 <= num_stages <= L:
        raise ValueError(f"cannot cut {L} layers into {num_stages} stages")
    layer, embed, head = stage_costs(spec, seq_len)

    def cost(first: int, stop: int, stage: int) -> float:
        return (stop - first) * layer + (embed if stage == 0 else 0.0) + (head if stage == num_stages - 1 else 0.0)

    # best[s][i]: minimal max-cost to place layers[:i] on stages[:s]; classic linear-partition DP.
    INF = float("inf")
    best = [[INF] * (L + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (L + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for i in range(s, L - (num_stages - s) + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], cost(j, i, s - 1))
                # Ties go to the earlier cut, so even splits put the extra layer on the first stages.
                if value < best[s][i] - 1e-9:
                    best[s][i], cut[s][i] = value, j
    bounds, i = [], L
    for s in range(num_stages, 0, -1):
        bounds.append((cut[s][i], i))
        i = cut[s][i]
    return [list(range(a, b)) for a, b in reversed(bounds)]


def build_stage_chunks(spec: ModelSpec, pp: int, vpp: int, pp_rank: int, *, seed: int, seq_len: int,
                       recompute: str = "none", device="cpu") -> list[nn.Module]:
    """The model chunks rank `pp_rank` holds, in chunk order: chunk c is virtual stage c*pp + pp_rank."""
    from shardwise.model import Transformer

    stages = split_layers(spec, pp * vpp, seq_len)
    chunks = []
    for c in range(vpp):
        s = virtual_stage(pp_rank, c, pp)
        chunks.append(Transformer(spec, seed=seed, layer_ids=stages[s], first=s == 0, last=s == pp * vpp - 1,
                                  device=device, recompute=recompute))
    return chunks


# --------------------------------------------------------------------------- activation accounting


def storage_address(t) -> int:
    """The address of `t`'s storage; 0 for a freed one (FSDP's resharded parameters)."""
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return 0


class SavedBytes:
    """Bytes autograd saves for backward, per key (a micro-batch, or a (micro-batch, chunk)), and the
    peak held at once. Parameters and buffers of `modules` (and `exclude`) are not activations: they
    are recognised by storage at the moment a tensor is saved. The same tensor saved by several ops
    (x feeds wq, wk and wv) counts once, as the Korthikanti et al. accounting does. Subclasses may
    `observe()` other memory each time a tensor is saved or unpacked."""

    def __init__(self, modules, exclude=()):
        self.modules = list(modules)
        self.exclude = {storage_address(t) for t in exclude}
        self.held: dict = {}
        self.current = 0
        self.peak = 0

    def _constants(self) -> set:
        return {storage_address(t) for m in self.modules for t in (*m.parameters(), *m.buffers())} | self.exclude

    def observe(self) -> None:
        pass

    def hooks(self, key):
        self.held.setdefault(key, 0)
        seen: set = set()

        def pack(t):
            self.observe()
            ident = (storage_address(t), t.storage_offset(), t.numel())
            if ident[0] not in self._constants() and ident not in seen:
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


# --------------------------------------------------------------------------- executor


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
    saved: SavedBytes | None = None  # set to measure activation bytes in flight
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


# --------------------------------------------------------------------------- in the training loop


def aligned_epoch(pp_group) -> float:
    """The ranks' common time zero for traces: pipeline rank 0's wall clock, broadcast. Records use
    time.time(), one clock for every process of a machine (exact alignment) and NTP-synchronised
    across machines (alignment to the network's clock skew, typically well under a millisecond)."""
    epoch = torch.tensor([time.time()], dtype=torch.float64)
    if pp_group is not None:
        dist.broadcast(epoch, src=dist.get_global_rank(pp_group, 0), group=pp_group)
    return float(epoch.item())


class PipelineStep:
    """The training loop's `forward_backward` under pipeline parallelism.

    Runs this rank's schedule over the step's micro-batches; then, once per step, averages the
    gradients over dp (ZeRO 0/1: one flat all-reduce per chunk — DDP's per-micro-batch hooks would
    fire on the wrong backward in an interleaved schedule) and sums tied embedding gradients between
    the first and the last stage. FSDP (ZeRO 2/3) reduces its own gradients with the chunk's last
    weight backward (`grad_sync`)."""

    def __init__(self, executor: PipelineExecutor, dp_group, zero: int, tied=None, keep_records: bool = False):
        self.executor, self.dp_group, self.zero, self.tied = executor, dp_group, zero, tied
        self.keep_records = keep_records  # every step's records (for --trace), else only the last step's
        self.epoch = aligned_epoch(executor.pp_group)

    def __call__(self, parts, microbatches):
        if not self.keep_records:
            self.executor.records.clear()
        loss = self.executor.step([x for x, _ in microbatches], [y for _, y in microbatches], self.epoch)
        if self.dp_group is not None and self.zero < 2:
            for part in parts:
                average_gradients(part, self.dp_group)
        if self.tied is not None:
            self.tied.sync()
        return loss


def average_gradients(module: nn.Module, group) -> None:
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    for g, new in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(new.view_as(g))


class TiedEmbeddings:
    """GPT-2 ties the LM head to the embedding; with pp > 1 they live on the first and the last stage,
    so their gradients are summed between those two ranks each step (Megatron's embedding group).
    The last stage's copy is then a replica: `clip_grad_norm_` skips it via `model.pp_replicas`."""

    def __init__(self, mesh, parts, first: bool, last: bool, timeout_s: float):
        from datetime import timedelta

        coords = {d: mesh[d].get_local_rank() for d in ("pp", "dp", "tp")}
        pp, dp, tp = (mesh[d].size() for d in ("pp", "dp", "tp"))
        self.group = None
        # Every rank must create every group, in the same order (torch.distributed's rule).
        for d in range(dp):
            for t in range(tp):
                ranks = [(0 * dp + d) * tp + t, ((pp - 1) * dp + d) * tp + t]
                g = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s))
                if (d, t) == (coords["dp"], coords["tp"]) and (first or last):
                    self.group = g
        self.weight = None
        for part in parts:
            model = getattr(part, "module", part)
            if first and model.tok_embeddings is not None:
                self.weight = model.tok_embeddings.weight
            if last and model.output is not None:
                self.weight = model.output.weight
                model.pp_replicas = {"output.weight"}

    def sync(self):
        if self.group is not None and self.weight is not None and self.weight.grad is not None:
            dist.all_reduce(self.weight.grad, group=self.group)


def build_pipeline(cfg, mesh, device) -> tuple[list[nn.Module], PipelineStep]:
    """This rank's model chunks (tensor- and data-parallel) and the step that runs the schedule on them."""
    from shardwise.parallel import coordinates, grad_sync, group, parallelize
    from shardwise.schedules import build, validate

    lay, spec = cfg.layout, cfg.spec
    pp_rank = coordinates(mesh)["pp"]
    chunks = build_stage_chunks(spec, lay.pp, lay.vpp, pp_rank, seed=cfg.seed, seq_len=cfg.seq_len,
                                recompute=lay.recompute)
    parts = [parallelize(chunk, mesh, lay, device, replicate=False) for chunk in chunks]
    schedule = validate(build(lay.schedule, lay.pp, lay.num_microbatches(cfg.global_batch), lay.vpp))
    seq = cfg.seq_len // lay.tp if lay.sequence_parallel and lay.tp > 1 else cfg.seq_len
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if torch.device(device).type == "cuda" else nullcontext
    executor = PipelineExecutor(schedule, pp_rank, parts, group(mesh, "pp"), (lay.micro_batch, seq, spec.hidden),
                                device=device, amp=amp,
                                grad_sync=lambda c, last: grad_sync(parts[c], enabled=last))
    first, last = pp_rank == 0, pp_rank == lay.pp - 1
    tied = TiedEmbeddings(mesh, parts, first, last, cfg.timeout_s) if spec.tie_embeddings else None
    return parts, PipelineStep(executor, group(mesh, "dp"), lay.zero, tied, keep_records=bool(cfg.trace_dir))


# --------------------------------------------------------------------------- timelines of a real run


def measured_costs(schedule: Schedule, events: list[Event]):
    """Per-virtual-stage mean F / B (or I and W) durations and the typical transfer time, from one run's
    records, as simulator Costs: so the simulated timeline is the same run under the schedule's rules."""
    from statistics import mean, median

    from shardwise.schedules import Costs

    def per_stage(kinds) -> list[float]:
        out = []
        for stage in range(schedule.num_stages):
            rank, chunk = stage % schedule.p, stage // schedule.p
            d = [e.end - e.start for e in events if e.rank == rank and e.chunk == chunk and e.kind in kinds]
            out.append(mean(d) if d else 0.0)
        return out

    split = any(e.kind == "I" for e in events)
    recv = [e.end - e.start for e in events if e.kind == "recv"]
    # The shortest receives are the ones whose data had already arrived: their time is the transfer itself.
    c = median(sorted(recv)[: max(1, len(recv) // 4)]) if recv else 0.0
    return Costs(f=per_stage({"F"}), b=per_stage({"I"} if split else {"B"}), w=per_stage({"W"}) if split else 0.0, c=c)


def write_trace(step: PipelineStep, out_dir, title: str) -> dict | None:
    """Gather every stage's records of the last optimizer step to global rank 0 and write there:
    trace.json (Chrome trace, all steps, opens in Perfetto), timeline.png / .svg (measured vs simulated
    with the measured per-stage costs). Collective over the pp group; returns a summary on rank 0."""
    from pathlib import Path

    from shardwise.schedules import simulate
    from shardwise.timeline import bubble_fraction, draw_timelines, write_chrome_trace

    ex = step.executor
    gathered = [None] * dist.get_world_size(ex.pp_group)
    dist.all_gather_object(gathered, ex.records, group=ex.pp_group)
    if dist.get_rank() != 0:
        return None
    events = [e for records in gathered for e in records]
    last_start = max(e.start for e in events if e.kind == "F" and e.rank == 0 and e.microbatch == 0 and e.chunk == 0)
    last = [replace(e, start=e.start - last_start, end=e.end - last_start) for e in events if e.start >= last_start - 1e-9]
    sim = simulate(ex.schedule, measured_costs(ex.schedule, last))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_chrome_trace(events, out / "trace.json")
    panels = [(f"measured ({ex.schedule.name}, last step)", last), ("simulated with the measured costs", sim.events)]
    for suffix in ("png", "svg"):
        draw_timelines(panels, out / f"timeline.{suffix}", suptitle=title)
    return {"measured_bubble": bubble_fraction(last), "simulated_bubble": sim.bubble_fraction,
            "measured_step_s": max(e.end for e in last) - min(e.start for e in last), "simulated_step_s": sim.makespan,
            "files": [str(out / n) for n in ("trace.json", "timeline.png", "timeline.svg")]}
