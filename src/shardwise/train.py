"""The training loop: one optimizer step = forward/backward over micro-batches, sync, clip, AdamW.

    runtime = build_runtime(cfg, mesh)     # model built from the seed, then parallelized for the layout
    for step in 1..N:
        loss = runtime.forward_backward(runtime.chunks, microbatches)   # replaceable: the pipeline executor
        sync sequence-parallel gradients; clip by the global norm; set the LR; optimizer.step()

`forward_backward(chunks, microbatches) -> loss` is the one seam for pipeline parallelism: `chunks` are the
model chunks this rank holds (one, without PP) as `parallelize` returned them (`Sharded`), `microbatches`
this dp rank's (inputs, targets) pairs;
it runs every forward and backward of the step and returns the sum of micro-batch losses / M on the
last pipeline stage (None elsewhere). Everything else in the step is layout-agnostic.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shardwise import moe, precision
from shardwise.corpus.batches import batches, validation_batches
from shardwise.errors import JobFailed, UsageError
from shardwise.hf.load import loader
from shardwise.model import Transformer
from shardwise.parallel import (GlobalGradNorm, Sharded, build_mesh, coordinates, data_dim, data_mesh, expert_names,
                                grad_sync, make_optimizer, parallelize, shard_sequence, size, sync_expert_grads,
                                sync_sequence_parallel_grads)
from shardwise.parallel.data_parallel import Optimizers
from shardwise.specs import Layout, ModelSpec
from shardwise.units import GIB


@dataclass(frozen=True)
class TrainConfig:
    spec: ModelSpec
    layout: Layout
    steps: int
    global_batch: int
    seq_len: int
    seed: int = 0
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int | None = None  # default: 10 % of the steps
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    backend: str = "gloo"
    timeout_s: float = 300.0
    metrics_file: str | None = None
    json_output: bool = False  # rank 0 keeps the records and a summary as one JSON object (TrainResult.json_out)
    measure_memory: bool = False  # the first step runs under validate's memory counters (summary: memory_*_gib)
    autocast: str = ""  # precision.CHOICES: "" BF16 autocast on a GPU, FP32 on a CPU; "bfloat16" the GPU's on a CPU
    trace_dir: str | None = None  # pipeline runs: Chrome trace + measured vs simulated timeline here
    progress: bool = True  # rank 0's progress bar
    messages: bool | None = None  # the resumed / saved / summary lines (default: with the progress bar)
    memory_check: bool = True  # refuse a job the planner predicts cannot fit this machine (shardwise.preflight)
    # checkpoints (shardwise.checkpoint): where, how often, how many to keep; stop early; resume; restarts
    checkpoint_dir: str | None = None
    save_every: int | None = None  # default: only after the last step of this invocation
    keep: int = 3
    stop_after: int | None = None  # end this invocation after this step (with a checkpoint); --steps sets the schedule
    resume: bool = False  # start from the newest complete checkpoint in checkpoint_dir, under any layout
    max_restarts: int = 0  # torchrun's agent restarts the job this often; a restart resumes by itself
    run_id: str = ""  # the run's name in its metrics records and checkpoints: kept across resumes (metrics_records)
    # real models and data: None = weights from the seed / the built-in corpus
    weights: object | None = None  # hf.load.HFFolder (--model DIR): each rank reads only its slices
    model_given: str | None = None  # --model: a preset's name, or a config file's or folder's absolute path
    init: str | None = None  # --init as given: a resume command repeats it
    hf_config: dict | None = None  # that folder's config.json, written back by `checkpoint export --format hf`
    data: object | None = None  # corpus.TokenFile: --data, tokenized once into a memory-mapped file
    val_data: object | None = None  # corpus.TokenFile: --val-data
    eval_every: int | None = None  # validation loss and perplexity every N steps (and after the last)
    eval_batches: int = 4  # global batches of --val-data per evaluation (at most)

    @property
    def device_type(self) -> str:
        return "cuda" if self.backend == "nccl" else "cpu"

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def warmup(self) -> int:
        """Warm-up steps of the LR schedule: --warmup-steps, else 10 % of the steps."""
        return self.steps // 10 if self.warmup_steps is None else self.warmup_steps


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to cfg.lr * min_lr_ratio at the last step (step is 1-based)."""
    warmup = cfg.warmup
    i = step - 1
    if i < warmup:
        return cfg.lr * (i + 1) / warmup
    progress = (i - warmup) / max(1, cfg.steps - 1 - warmup)
    low = cfg.lr * cfg.min_lr_ratio
    return low + 0.5 * (cfg.lr - low) * (1 + math.cos(math.pi * min(progress, 1.0)))


# --------------------------------------------------------------------------- building


@dataclass
class Runtime:
    cfg: TrainConfig
    mesh: object  # DeviceMesh or None for a single process
    device: torch.device
    chunks: list[Sharded]  # this rank's model chunks, as parallelize returned them
    optimizer: torch.optim.Optimizer
    forward_backward: Callable = None
    step: int = 0
    data: object = None  # corpus.batches: this rank's rows of each step's global batch, and the saved position
    # Decided once, read every step (a DeviceMesh look-up or a module walk costs 0.1-2 ms on a CPU):
    where: dict = field(default_factory=dict)  # this rank's mesh coordinates
    grad_norm: GlobalGradNorm | None = None  # which gradients this rank counts in the global norm
    moe_layers: list = field(default_factory=list)  # the MoE layers of this rank's chunks

    def __post_init__(self):
        self.where = coordinates(self.mesh)
        self.ddp = any(isinstance(c.module, DistributedDataParallel) for c in self.chunks)
        self.grad_norm = GlobalGradNorm(self.chunks, self.mesh)
        self.moe_layers = moe.moe_layers_of(self.models)

    @property
    def parts(self) -> list[nn.Module]:
        """What forward_backward calls (DDP- or FSDP-wrapped)."""
        return [c.module for c in self.chunks]

    @property
    def models(self) -> list[nn.Module]:
        """The plain (unwrapped) model chunks: layout-free parameter names."""
        return [c.model for c in self.chunks]


def _device(cfg: TrainConfig) -> torch.device:
    if cfg.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def build_optimizer(chunks: list[Sharded], cfg: TrainConfig, mesh) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (nanoGPT). Same groups under every layout. Experts split over
    ep get their own AdamW, ZeRO-1-partitioned over their replicas (edp) instead of dp."""
    def groups(params):
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]

    adamw = {"lr": lr_at(cfg, 1), "betas": (0.9, 0.95), "eps": 1e-8}
    split = {id(p) for c in chunks for n, p in c.model.named_parameters() if n in expert_names(c)}
    params = [p for chunk in chunks for p in chunk.module.parameters()]
    dense = make_optimizer(groups([p for p in params if id(p) not in split]), cfg.layout.zero,
                           data_mesh(mesh), **adamw)
    if not split:
        return dense
    placement = next(c.experts for c in chunks if c.experts is not None)
    experts = make_optimizer(groups([p for p in params if id(p) in split]), 1 if cfg.layout.zero == 1 else 0,
                             placement.mesh["edp"], **adamw)
    return Optimizers([dense, experts])


def build_runtime(cfg: TrainConfig, mesh) -> Runtime:
    """The whole model from the seed (every layout starts from the same weights), parallelized for cfg.layout."""
    device = _device(cfg)
    if cfg.layout.pp > 1:
        from shardwise.parallel.pipeline_step import build_pipeline

        chunks, step = build_pipeline(cfg, mesh, device)
        return Runtime(cfg, mesh, device, chunks, build_optimizer(chunks, cfg, mesh), step, data=batches(cfg))
    model = Transformer(cfg.spec, seed=cfg.seed, recompute=cfg.layout.recompute,
                        recompute_layers=cfg.layout.recompute_layers, device="meta" if cfg.weights else "cpu")
    chunks = [parallelize(model, mesh, cfg.layout, device, seq_len=cfg.seq_len, weights=loader(cfg.weights))]
    step = partial(forward_backward, amp=cfg.autocast)
    return Runtime(cfg, mesh, device, chunks, build_optimizer(chunks, cfg, mesh), step, data=batches(cfg))


# --------------------------------------------------------------------------- one step


def forward_backward(chunks: list[Sharded], microbatches: list[tuple[torch.Tensor, torch.Tensor]],
                     amp: str = "") -> torch.Tensor:
    """Gradient accumulation without pipelining: each micro-batch's mean loss / M, backward at once;
    the dp gradient reduction runs only with the last micro-batch. `amp`: TrainConfig.autocast."""
    (chunk,) = chunks
    model = chunk.module
    autocast = precision.autocast(microbatches[0][0].device.type, amp)
    total = torch.zeros((), device=microbatches[0][0].device)
    for i, (x, y) in enumerate(microbatches):
        with grad_sync(chunk, enabled=i == len(microbatches) - 1):
            with autocast:
                loss = model(x, y) / len(microbatches)
            loss.backward()
        total += loss.detach()
    return total


def _loss_part(loss: torch.Tensor | None, rt: Runtime) -> torch.Tensor:
    """This rank's part of the step's loss in a sum over all ranks: the last pipeline stage's loss from tp
    rank 0 (every tp rank holds the same), 0 elsewhere. The sum over all ranks divided by the data-parallel
    ranks (dp x cp: every cp rank holds the mean over the same number of tokens) is the step's loss."""
    counted = loss is not None and rt.where["tp"] == 0 and rt.where["pp"] == size(rt.mesh, "pp") - 1
    return loss.detach().float() if counted else torch.zeros((), device=rt.device)


def _world(rt: Runtime) -> int:
    return 1 if rt.mesh is None else rt.mesh.size()


@dataclass
class StepScalars:
    """One step's gradient norm, loss and aux loss, still on the device; the sum of the losses over the ranks
    may still be in flight (`pending`). `read()` brings them to the host: the step's one host sync."""

    norm: torch.Tensor
    sums: torch.Tensor  # [loss, aux] summed over all ranks (once `pending` is done)
    pending: object  # the async all-reduce of `sums`, or None
    lr: float
    loss_replicas: int  # the data-parallel ranks (dp x cp) whose losses `sums` adds up
    aux_replicas: int  # dp: the aux loss's parts add up over every other dimension
    moe: bool

    def read(self) -> dict:
        if self.pending is not None:
            self.pending.wait()
        norm, loss, aux = torch.cat([self.norm.reshape(1), self.sums]).tolist()
        rec = {"loss": loss / self.loss_replicas, "grad_norm": norm, "lr": self.lr}
        if self.moe:  # the loss is the objective: cross-entropy + the load-balancing term
            rec["aux_loss"] = aux / self.aux_replicas
            rec["loss"] += rec["aux_loss"]
        return rec


def _cp_shards(rt: Runtime, mbs: list) -> list:
    """This cp rank's zig-zag chunks of every sequence (all of them without context parallelism)."""
    cp = rt.cfg.layout.cp
    if cp == 1:
        return mbs
    rank = rt.where["cp"]
    return [(shard_sequence(x, cp, rank), shard_sequence(y, cp, rank)) for x, y in mbs]


def forward_only(chunks: list[Sharded], microbatches: list[tuple[torch.Tensor, torch.Tensor]],
                 amp: str = "") -> torch.Tensor:
    """Validation without pipelining: the mean micro-batch loss, no gradients."""
    (chunk,) = chunks
    autocast = precision.autocast(microbatches[0][0].device.type, amp)
    with torch.no_grad(), autocast:
        return sum(chunk.module(x, y).float() for x, y in microbatches) / len(microbatches)


def evaluate(rt: Runtime) -> dict:
    """Validation loss (mean next-token loss over the same --val-data sequences for every layout) and perplexity."""
    lay = rt.cfg.layout
    # the pipeline's own, under pp > 1
    run = getattr(rt.forward_backward, "forward_only", partial(forward_only, amp=rt.cfg.autocast))
    val = validation_batches(rt.cfg, lay.dp, rt.where["dp"], lay.micro_batch, rt.device)
    parts = torch.stack([_loss_part(run(rt.chunks, _cp_shards(rt, mbs)), rt) for mbs in val])
    if _world(rt) > 1:
        dist.all_reduce(parts)  # every batch's loss in one collective
    loss = parts.sum().item() / size(rt.mesh, data_dim(rt.mesh)) / len(parts)
    return {"val_loss": loss, "val_perplexity": math.exp(min(loss, 700.0))}


def eval_due(cfg: TrainConfig, step: int) -> bool:
    """--val-data: every --eval-every steps and after the run's last step."""
    return cfg.val_data is not None and (step == cfg.steps or bool(cfg.eval_every) and step % cfg.eval_every == 0)


def launch_step(rt: Runtime) -> StepScalars:
    """One optimizer step. Its scalars stay on the device: the loss and aux loss travel in the gradient
    norm's all-reduce when the norm needs one (tp, pp, FSDP, split experts), else in an all-reduce of
    their own that runs while the loop goes on (read back by `StepScalars.read`)."""
    cfg, lay = rt.cfg, rt.cfg.layout
    rt.step += 1
    mbs = _cp_shards(rt, rt.data.local_microbatches(rt.step, lay.dp, rt.where["dp"], lay.micro_batch, rt.device))
    # DDP's gradients are views into its buckets: zeroed in place, they stay there (set to None, a step's no_sync
    # micro-batches would make fresh gradients beside the buckets, every gradient twice until the last one)
    rt.optimizer.zero_grad(set_to_none=not rt.ddp)
    moe.set_microbatches(rt.moe_layers, len(mbs))
    loss = rt.forward_backward(rt.chunks, mbs)
    for chunk in rt.chunks:
        sync_sequence_parallel_grads(chunk)
        sync_expert_grads(chunk)
    aux = moe.take_aux_loss(rt.moe_layers)
    extra = [_loss_part(loss, rt), torch.zeros((), device=rt.device) if aux is None else aux.detach()]
    norm, sums = rt.grad_norm.clip_(cfg.grad_clip, rt.device, extra)
    lr = lr_at(cfg, rt.step)
    for g in rt.optimizer.param_groups:
        g["lr"] = lr
    rt.optimizer.step()
    pending = None
    if not rt.grad_norm.collective and _world(rt) > 1:
        pending = dist.all_reduce(sums, async_op=True)
    return StepScalars(norm, sums, pending, lr, size(rt.mesh, data_dim(rt.mesh)), size(rt.mesh, "dp"), aux is not None)


def train_step(rt: Runtime) -> dict:
    """One optimizer step; returns the loss, gradient norm and learning rate of that step."""
    return launch_step(rt).read()


# --------------------------------------------------------------------------- the loop


@dataclass
class TrainResult:
    records: list[dict] = field(default_factory=list)
    runtime: Runtime | None = None
    memory: dict | None = None  # this rank's measured memory (cfg.measure_memory), bytes per part
    json_out: dict | None = None  # rank 0 under --json: the records and summary `train --json` prints

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.records]


def _messages(cfg: TrainConfig) -> bool:
    return cfg.progress if cfg.messages is None else cfg.messages


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _maybe_die(step: int) -> None:
    """Fault injection for the tests: SHARDWISE_TEST_KILL_RANK dies at SHARDWISE_TEST_KILL_AT_STEP
    (on the first attempt only: a job restarted by torchrun's agent then runs to the end); with
    SHARDWISE_TEST_HANG set it stops itself instead (SIGSTOP: a hang no signal but SIGKILL ends), after writing
    the time it stopped to that file."""
    rank = os.environ.get("SHARDWISE_TEST_KILL_RANK")
    if rank is not None and dist.is_initialized() and dist.get_rank() == int(rank) \
            and step == int(os.environ.get("SHARDWISE_TEST_KILL_AT_STEP", "1")) \
            and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        if os.environ.get("SHARDWISE_TEST_HANG"):
            import signal

            Path(os.environ["SHARDWISE_TEST_HANG"]).write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(13)


class StepClock:
    """A training step's boundaries (`mark`) and the seconds between two of them (`seconds`).

    On the CPU a mark is the host's clock. On a GPU the host runs ahead of the device: it blocks where it must wait
    for the device (a step's batch copy from pageable memory waits for the step before to end, reading scalars waits
    for all the work queued before), so host clock readings would give step k's device time to step k + 1. There a
    mark is a CUDA event recorded on the current stream: it fires when the work queued before it has run, so two
    marks time the device's work between two boundaries (the idle time the host's own work leaves in it included).
    `seconds` is called once the end mark's work has been waited for (the step's scalars are read first): it adds no
    host sync of its own. `events` and `clock` are the event factory and host clock (tests give fakes)."""

    def __init__(self, device: torch.device | str, events=None, clock=time.perf_counter):
        self.cuda = torch.device(device).type == "cuda"
        self.events = events or (lambda: torch.cuda.Event(enable_timing=True))
        self.clock = clock

    def mark(self):
        if not self.cuda:
            return self.clock()
        event = self.events()
        event.record()
        return event

    def seconds(self, start, end) -> float:
        if not self.cuda:
            return end - start
        end.synchronize()  # already passed: the step's scalars, queued after it, have been read
        return start.elapsed_time(end) / 1e3  # milliseconds


class TrainLoop:
    """The steps of a run and their records. Step k's scalars are read back (the step's one host sync) and
    logged (metrics file, progress bar) after step k + 1 has been launched, so the loss's all-reduce and the
    logging never hold up a step. A step's time runs from its start to the next step's start: it holds its own
    work and the logging of the step before (on a GPU the device's time between those points: StepClock).
    Evaluation and checkpoints read their step at once and are not counted in any step's time."""

    def __init__(self, rt: Runtime, last: int, sink=None, update=lambda rec: None, messages: bool = False,
                 measure_memory: bool = False):
        self.rt, self.last, self.sink, self.update, self.messages = rt, last, sink, update, messages
        self.measure_next = measure_memory  # the first step runs under validate's memory counters
        self.records: list[dict] = []
        self.memory: dict | None = None
        self._pending = None  # (step, StepScalars, start): launched, not yet logged
        self.clock = StepClock(rt.device)

    def run(self, steps: int) -> list[dict]:
        """Run `steps` steps and log every one of them; returns their records."""
        first = len(self.records)
        for _ in range(steps):
            self.step()
        self.flush()
        return self.records[first:]

    def step(self) -> None:
        from shardwise import checkpoint

        rt, cfg = self.rt, self.rt.cfg
        _maybe_die(rt.step + 1)
        start = self.clock.mark()
        if self.measure_next:  # (imported here: the validate package stays out of every plain training run)
            from shardwise.validate.memory import measure_memory

            scalars, self.memory = measure_memory(rt, launch_step)
            self.measure_next = False
        else:
            scalars = launch_step(rt)
        if self._pending:
            self._log(*self._pending, end=start)
        self._pending = (rt.step, scalars, start)
        save = checkpoint.due(cfg, rt.step, self.last)
        if eval_due(cfg, rt.step) or save:
            self.flush()  # evaluation joins this step's record; a checkpoint follows its metrics
        if save:
            saved = checkpoint.save(rt, cfg.checkpoint_dir)
            if self.messages:
                print(f"saved {saved}", flush=True)

    def flush(self) -> None:
        """Log the launched step now (its time ends here)."""
        if self._pending:
            self._log(*self._pending, end=None)
            self._pending = None

    def _log(self, step: int, scalars: StepScalars, start, end) -> None:
        """`start`, `end`: StepClock marks (`end` None: now, once the step's scalars are read)."""
        rt, cfg = self.rt, self.rt.cfg
        values = scalars.read()
        try:
            check_finite(step, values, first=_starting_weights(cfg) if step == 1 else None)
        except JobFailed as exc:  # said beside the checkpoints, so that a restart of this job stops at once
            marker = diverged_marker(cfg)
            if marker is not None and _is_rank0():
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(str(exc))
            raise
        elapsed = self.clock.seconds(start, self.clock.mark() if end is None else end)
        rec = {"step": step, "loss": values["loss"], "step_time_s": elapsed, "tokens_per_s": cfg.tokens_per_step / elapsed,
               "lr": values["lr"], "grad_norm": values["grad_norm"],
               **({"aux_loss": values["aux_loss"]} if "aux_loss" in values else {})}
        if eval_due(cfg, step):
            rec.update(evaluate(rt))
            check_finite(step, {k: v for k, v in rec.items() if k.startswith("val_")})  # the metrics stay strict JSON
            if self.messages:
                print(f"step {step}: validation loss {rec['val_loss']:.4f}, perplexity {rec['val_perplexity']:.2f}", flush=True)
        self.records.append(rec)
        if self.sink:
            self.sink.write(json.dumps({**rec, "run": self.rt.cfg.run_id} if self.rt.cfg.run_id else rec) + "\n")
            self.sink.flush()
        self.update(rec)


def diverged_marker(cfg: TrainConfig) -> Path | None:
    """The file in the checkpoint folder that says this job diverged (None without a checkpoint folder)."""
    return Path(cfg.checkpoint_dir) / "diverged.txt" if cfg.checkpoint_dir else None


def check_finite(step: int, values: dict, first: str | None = None) -> None:
    """Stop the job at the first step whose loss or gradient norm is not a number, as Megatron-LM's default
    --check-for-nan-in-loss-and-grad does: training on would only spread it through the weights. Every rank reads
    the same reduced scalars, so every rank stops at the same step; the steps before it are in the metrics file.
    `first`: the step is the run's first, whose loss and gradients come before any update, from the weights it
    started from (said where they came from): no learning rate made them."""
    bad = {k: v for k, v in values.items() if isinstance(v, float) and not math.isfinite(v)}
    if bad and first:
        said = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in bad.items())
        raise JobFailed(f"training stopped at step {step}, before any update ({said}): the weights it started from "
                        f"({first}) or its data make it, not the learning rate — check them for NaN or inf")
    if bad:
        said = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in bad.items())
        raise JobFailed(f"training diverged at step {step} ({said}): stopped there — start again with a lower --lr or "
                        f"a finite --grad-clip (a resume replays the same settings)")


def _starting_weights(cfg: TrainConfig) -> str:
    """Where a run's step-1 weights came from, for check_finite (a resumed run's first step is not before every
    update: its checkpoint's weights are the learning rate's work)."""
    return f"--model {cfg.model_given}'s" if cfg.weights is not None else "the seeded initialisation"


def train(cfg: TrainConfig, mesh=None) -> TrainResult:
    """Train up to step cfg.steps (or cfg.stop_after) on this rank's part of `mesh` (None: a single process,
    no torch.distributed), from step 0 or from the newest checkpoint when resuming; save checkpoints on the way."""
    from shardwise import checkpoint

    result = TrainResult(runtime=build_runtime(cfg, mesh))
    rt, rank0 = result.runtime, _is_rank0()
    resume_from = checkpoint.resume_path(cfg)
    restarts = checkpoint.restart_count()
    marker = diverged_marker(cfg)
    if marker is not None and marker.is_file():
        if restarts:  # this job diverged before its restart: resuming would replay the same steps to the same nan
            raise JobFailed(f"{marker.read_text().strip()} (restart {restarts} stopped at once: the same steps would "
                            f"diverge again)")
        if rank0:  # a new job, with other settings or not: its own run decides
            marker.unlink(missing_ok=True)
    why = os.environ.get("SHARDWISE_RESTARTED_AFTER", "a rank had failed")  # the launcher's (not torchrun's)
    if restarts and rank0 and (_messages(cfg) or cfg.json_output):  # torchrun's agent started every rank again
        allowed = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", cfg.max_restarts))  # torchrun's own, under torchrun
        # under --json stdout is the JSON alone: the restart is said on stderr (and in the summary)
        print(f"restart {restarts} of {allowed}: {why}, so every rank was started again; "
              f"{'resuming from the newest checkpoint' if resume_from else 'no checkpoint yet: from step 0'}",
              file=sys.stdout if _messages(cfg) else sys.stderr, flush=True)
    if resume_from is not None:
        manifest = checkpoint.restore(rt, resume_from)
        if rank0 and _messages(cfg):
            lay = Layout(**manifest["layout"])
            print(f"resumed from {resume_from} (step {rt.step}, saved by {split(lay)} zero {lay.zero})", flush=True)
    last = min(cfg.steps, cfg.stop_after or cfg.steps)
    sink = open_metrics(cfg.metrics_file, after_step=rt.step if resume_from else None) if rank0 and cfg.metrics_file else None
    with progress_bar(cfg, enabled=rank0 and cfg.progress, start=rt.step) as update:
        loop = TrainLoop(rt, last, sink=sink, update=update, messages=rank0 and _messages(cfg),
                         measure_memory=cfg.measure_memory)
        loop.run(last - rt.step)
    result.records, result.memory = loop.records, loop.memory
    if sink:
        sink.close()
    memory = memory_summary(cfg, result.memory) if result.memory is not None else {}
    if rank0 and _messages(cfg) and result.records:
        print(summary(result.records, cfg), flush=True)
    trace = _write_trace(result.runtime) if cfg.trace_dir and cfg.layout.pp > 1 else None
    if rank0 and cfg.json_output:  # printed by whoever launched the job, once it has ended (commands/train.py)
        result.json_out = {"records": result.records, "trace": trace,
                           "summary": {**summary_dict(result.records, cfg), **memory, "restarts": restarts,
                                       "first_step": rt.step - len(result.records) + 1,
                                       # the records are the last attempt's; what ended the one before (the rank)
                                       **({"restarted_after": why} if restarts else {})}}
    return result


def memory_summary(cfg: TrainConfig, measured: dict) -> dict:
    """The measured peak (max over ranks; collective) against the planner's prediction for this run, GiB:
    states + saved activations as `validate` counts them (shardwise.validate.memory)."""
    from shardwise.planner.job import runtime_job
    from shardwise.planner.memory import counted_memory
    from shardwise.specs import load_cluster
    from shardwise.validate.memory import STATE_KEYS, worst_over_ranks

    worst = worst_over_ranks(measured)
    # The planner's memory does not depend on the cluster (only its time does): any preset will do.
    job = runtime_job(cfg.spec, load_cluster("dgx-h100-80gb"), cfg.global_batch, cfg.seq_len, gpu=cfg.device_type == "cuda")
    predicted = counted_memory(job, cfg.layout)
    return {"memory_measured_gib": worst["total"] / GIB, "memory_predicted_gib": sum(predicted.values()) / GIB,
            "memory_measured_breakdown_gib": {k: worst[k] / GIB for k in STATE_KEYS},
            "memory_predicted_breakdown_gib": {k: v / GIB for k, v in predicted.items()}}


def _write_trace(rt: Runtime) -> dict | None:
    from shardwise.trace import write_trace

    lay = rt.cfg.layout
    title = f"{rt.cfg.spec.name}: {split(lay)}, {lay.schedule}, {lay.num_microbatches(rt.cfg.global_batch)} micro-batches"
    info = write_trace(rt.forward_backward.executor, rt.cfg.trace_dir, title, last_step=rt.step)
    if info and not rt.cfg.json_output:
        print(f"trace: bubble measured {100 * info['measured_bubble']:.1f}% vs simulated {100 * info['simulated_bubble']:.1f}% "
              f"(the last step's pipeline schedule, before its gradient sync and optimizer: "
              f"{info['measured_step_s'] * 1e3:.1f} vs {info['simulated_step_s'] * 1e3:.1f} ms); wrote "
              + ", ".join(info["files"]), flush=True)
    return info


def split(lay: Layout) -> str:
    """dp·tp·pp, with ·cp and its mode when the sequence is split, ·ep (·etp) when the experts are."""
    return (f"dp{lay.dp}·tp{lay.tp}·pp{lay.pp}" + (f"·cp{lay.cp} ({lay.cp_mode})" if lay.cp > 1 else "")
            + (f"·ep{lay.ep}" if lay.ep > 1 else "") + (f"·etp{lay.etp}" if lay.etp > 1 else ""))


def summary_dict(records: list[dict], cfg: TrainConfig) -> dict:
    if not records:
        return {"steps": 0}
    times = sorted(r["step_time_s"] for r in records[1:] or records)  # the first step includes warm-up work
    median = times[len(times) // 2]
    lay = cfg.layout
    return {"steps": len(records), "first_loss": records[0]["loss"], "last_loss": records[-1]["loss"],
            "median_step_time_s": median, "tokens_per_s": cfg.tokens_per_step / median,
            "layout": lay.record(), "num_microbatches": lay.num_microbatches(cfg.global_batch)}


def summary(records: list[dict], cfg: TrainConfig) -> str:
    from shardwise.units import seconds

    s = summary_dict(records, cfg)
    first, last = records[0]["step"], records[-1]["step"]
    since = "" if first <= 1 else f" (step {first})" if first == last else f" (steps {first}-{last})"
    return (f"trained {s['steps']} step{'s' * (s['steps'] != 1)}{since}: loss {s['first_loss']:.4f} -> {s['last_loss']:.4f}, "
            f"median step {seconds(s['median_step_time_s'])}, {s['tokens_per_s']:,.0f} tokens/s")


def metrics_records(path: str, run_id: str = "") -> list[dict]:
    """The records of a metrics file a resumed run continues: UsageError for a line that is not one of train's
    records, or (`run_id`: the checkpoint's run) a record another run wrote — appended to, it would hold two runs."""
    records = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        try:
            rec = json.loads(line) if line.strip() else None
        except ValueError:
            rec = False
        if rec is None:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            raise UsageError(f"--metrics-file {path}: line {number} is not a record of shardwise train — give the resumed "
                             f"run's own metrics file, or a new path")
        if run_id and rec.get("run", run_id) != run_id:
            raise UsageError(f"--metrics-file {path} holds the records of another run ({rec['run']}; the checkpoint's is "
                             f"{run_id}) — give this run's metrics file, or a new path")
        records.append(rec)
    return records


def open_metrics(path: str, after_step: int | None = None):
    """A fresh metrics file; when resuming from step s (after_step), keep its records up to s and append."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    if after_step is None or not file.exists():
        return open(file, "w", encoding="utf-8")
    kept = [json.dumps(rec) for rec in metrics_records(path) if rec["step"] <= after_step]
    file.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
    return open(file, "a", encoding="utf-8")


class progress_bar:
    """Rank 0's rich progress bar: step, loss, tokens/s, step time."""

    def __init__(self, cfg: TrainConfig, enabled: bool, start: int = 0):
        self.cfg, self.enabled, self.start = cfg, enabled, start

    def __enter__(self):
        if not self.enabled:
            return lambda rec: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Column

        from shardwise.console import Console
        from shardwise.units import seconds

        lay = self.cfg.layout
        # the bar gives way on a narrow terminal (or a log's 80 columns), never the step counter ("1000/10…")
        counter = Column(no_wrap=True, min_width=2 * len(str(self.cfg.steps)) + 1)
        columns = (TextColumn(f"[bold]{self.cfg.spec.name}[/] {split(lay)}"),
                   BarColumn(bar_width=None, table_column=Column(ratio=1)), MofNCompleteColumn(table_column=counter),
                   TextColumn("loss [cyan]{task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                   TextColumn("{task.fields[dt]}/step"), TimeElapsedColumn())
        self.progress = Progress(*columns, console=Console(keep_going=True))  # the run goes on if its reader goes
        self.progress.start()
        self.task = self.progress.add_task("train", total=self.cfg.steps, completed=self.start, loss="-", tps="-", dt="-")

        def update(rec):
            self.progress.update(self.task, advance=1, loss=f"{rec['loss']:.4f}",
                                 tps=f"{rec['tokens_per_s']:,.0f}", dt=seconds(rec["step_time_s"]))
        return update

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.stop()
        return False


# --------------------------------------------------------------------------- one process of a job


def train_rank(cfg: TrainConfig) -> dict | None:
    """What every rank runs (started by `launch.run_ranks`, in its process group): build the mesh, train. One
    process without a process group trains alone. Returns rank 0's `--json` object (None elsewhere): the launcher
    prints it after the job has ended, so a signal during the ranks' teardown cannot follow it with a second one."""
    if not dist.is_initialized():
        return train(cfg).json_out
    lay = cfg.layout
    mesh = build_mesh(lay.pp, lay.dp, lay.tp, cp=lay.cp, backend=cfg.backend, timeout_s=cfg.timeout_s)
    out = train(cfg, mesh).json_out
    dist.barrier()
    return out