"""Start a training job: check everything first, then run the ranks.

- Under torchrun (RANK and WORLD_SIZE in the environment): this process is one rank; run it.
- Otherwise, one process: train here, without torch.distributed.
- Otherwise: start dp*tp*pp*cp processes on this machine with torchrun's own machinery
  (torch.distributed.launcher.api.elastic_launch: c10d rendezvous on a free loopback port).
  If a rank dies, the agent stops the others at once; with --max-restarts R it starts them all again
  (they resume from the newest checkpoint) up to R times, then we name the rank that died.

`check` raises UsageError for anything wrong with the job, before any process group exists.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid

from shardwise.errors import UsageError
from shardwise.train import TrainConfig


class JobFailed(RuntimeError):
    """A rank of a running job failed; the message names it."""


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def resolve_backend(requested: str | None) -> str:
    """nccl on GPUs, gloo on CPUs; a backend this machine cannot run is a usage error."""
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise UsageError("this torch build has no torch.distributed — install a standard torch wheel")
    gpus = torch.cuda.is_available() and dist.is_nccl_available()
    if requested is None:
        return "nccl" if gpus else "gloo"
    if requested == "nccl" and not gpus:
        raise UsageError("backend nccl needs CUDA GPUs and a CUDA build of torch, and this machine has none — use --backend gloo")
    if requested == "gloo" and not dist.is_gloo_available():
        raise UsageError("backend gloo is not available in this torch build — use --backend nccl")
    if requested not in ("gloo", "nccl"):
        raise UsageError(f"unknown backend '{requested}' — use gloo (CPU) or nccl (GPU)")
    return requested


def check(cfg: TrainConfig) -> None:
    """Every reason this job cannot run, as one UsageError, before any process starts."""
    from shardwise.specs import runtime_refusal, validate_layout

    lay, spec = cfg.layout, cfg.spec
    for name, value in (("--steps", cfg.steps), ("--global-batch", cfg.global_batch), ("--seq-len", cfg.seq_len)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    for flag, value, low in (("--lr", cfg.lr, 0), ("--grad-clip", cfg.grad_clip, 0), ("--timeout", cfg.timeout_s, 0),
                             ("--weight-decay", cfg.weight_decay, None)):
        if not (math.isfinite(value) and (value > low if low is not None else value >= 0)):
            raise UsageError(f"{flag} must be a finite number {'above 0' if low is not None else '0 or more'}, got {value}")
    if cfg.timeout_s > 10**7:
        raise UsageError(f"--timeout {cfg.timeout_s:g} s is longer than any job (at most 10,000,000 s, ~4 months)")
    if not 0 <= cfg.seed < 2**63:
        raise UsageError(f"--seed must be between 0 and 2^63 - 1, got {cfg.seed}")
    if cfg.warmup_steps is not None and not 0 <= cfg.warmup_steps <= cfg.steps:
        raise UsageError(f"--warmup-steps must be between 0 and --steps ({cfg.steps}), got {cfg.warmup_steps}")
    if under_torchrun() and int(os.environ["WORLD_SIZE"]) != lay.world_size:
        cp = f"*cp" if lay.cp > 1 else ""
        raise UsageError(f"torchrun started {os.environ['WORLD_SIZE']} processes but dp*tp*pp{cp} = {lay.dp}*{lay.tp}*{lay.pp}"
                         f"{f'*{lay.cp}' if lay.cp > 1 else ''} = {lay.world_size} — make nnodes * nproc-per-node equal dp*tp*pp{cp}")
    validate_layout(lay, spec, cfg.global_batch, seq_len=cfg.seq_len)
    refusal = runtime_refusal(lay)
    if refusal:
        raise UsageError(refusal)
    if cfg.trace_dir and lay.pp == 1:
        raise UsageError("--trace draws the pipeline schedule's timeline — use it with --pp 2 or more")
    if cfg.seq_len > spec.max_positions:
        raise UsageError(f"--seq-len {cfg.seq_len} exceeds the {spec.max_positions} positions of {spec.name} — use at most {spec.max_positions}")
    from shardwise.model import unsupported

    missing = unsupported(spec)
    if missing:
        raise UsageError(f"{spec.name} uses {missing}, which shardwise's runtime does not implement — plan and estimate "
                         "it (counted exactly), or train a model with plain GQA attention and top-k routing")
    if spec.is_moe and lay.tp > 1 and (cfg.seq_len // lay.cp) % lay.tp:
        per_rank = f"--seq-len {cfg.seq_len}" + (f" / cp {lay.cp}" if lay.cp > 1 else "")
        raise UsageError(f"each tp rank routes 1/tp of every sequence through the experts, but {per_rank} is not "
                         f"divisible by tp={lay.tp} — use a multiple of {lay.tp * lay.cp}")
    if lay.ep * lay.etp > 1 and cfg.checkpoint_dir:
        raise UsageError("checkpoints of expert-parallel runs are not supported yet — drop --checkpoint-dir or train with --ep 1")
    if lay.sequence_parallel and lay.tp > 1 and cfg.seq_len % lay.tp:
        raise UsageError(f"sequence parallelism splits the sequence over tp={lay.tp}, but --seq-len {cfg.seq_len} is not divisible — use a multiple of {lay.tp}")
    if cfg.backend == "nccl":
        _check_gpus(lay.world_size)
    from shardwise.paths import output_dir, output_file

    output_file(cfg.metrics_file, "--metrics-file", "metrics.jsonl")
    output_dir(cfg.trace_dir, "--trace")
    output_dir(cfg.checkpoint_dir, "--checkpoint-dir")
    from shardwise import preflight

    preflight.check(cfg, memory=cfg.memory_check)  # last: the job is valid, now does it fit this machine?
    from shardwise.checkpoint import check as check_checkpoints

    check_checkpoints(cfg)


def _check_gpus(world: int) -> None:
    import torch

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if under_torchrun() else world
    if torch.cuda.device_count() < local:
        raise UsageError(f"{local} ranks on this machine need {local} GPUs, found {torch.cuda.device_count()} — "
                         f"lower dp*tp*pp or run on more machines with torchrun --nnodes")


def launch(cfg: TrainConfig) -> None:
    """Run the (already checked) job to the end; raises JobFailed naming the rank that failed."""
    from shardwise.train import train, worker_main

    if under_torchrun():
        worker_main(cfg)
    elif cfg.layout.world_size == 1:
        train(cfg)
    else:
        _launch_local(cfg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(fn, world: int, *args, backend: str = "gloo", timeout_s: float = 60.0) -> None:
    """Run fn(rank, world, *args) on `world` new local processes, each one thread, inside one process
    group (tests and benchmarks: unlike `launch`, no agent; a failing rank raises here)."""
    import torch.multiprocessing as mp

    mp.spawn(_spawned_rank, args=(world, free_port(), fn, args, backend, timeout_s), nprocs=world)


def _spawned_rank(rank, world, port, fn, args, backend, timeout_s) -> None:
    import torch
    import torch.distributed as dist

    from shardwise.parallel import init_distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    init_distributed(backend, timeout_s)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def _launch_local(cfg: TrainConfig) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from shardwise.train import worker_main

    world = cfg.layout.world_size
    # Like torchrun: one thread per rank unless told otherwise (ranks share this machine's cores).
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, run_id=f"shardwise-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=cfg.max_restarts,
                          monitor_interval=0.1, start_method="spawn", local_addr="127.0.0.1", shutdown_timeout=3)
    # The agent logs each failure with its own traceback; we report it in one line instead.
    for name in ("torch.distributed.elastic", "torch.multiprocessing"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    from shardwise.interrupt import launcher_signals

    try:
        with launcher_signals():  # Ctrl-C / SIGTERM: the agent stops the ranks, we say it in one line
            elastic_launch(config, worker_main)(cfg)
    except ChildFailedError as exc:
        raise JobFailed(describe_failures(exc.failures)) from None


def describe_failures(failures: dict) -> str:
    """Name the rank that died first: a rank that vanished without a Python error (killed, crashed, exited)
    is the cause; ranks that then raised (peer closed the connection, timeout) are the consequence."""
    def vanished(f) -> bool:
        return not (f.error_file and os.path.isfile(f.error_file))

    ordered = sorted(failures.items(), key=lambda kv: (not vanished(kv[1]), kv[1].timestamp, kv[0]))
    parts = []
    for rank, f in ordered:
        how = f"died (exit code {f.exitcode}{', ' + f.signal_name() if f.exitcode < 0 else ''})" if vanished(f) \
            else f"failed: {_last_line(f.message)}"
        parts.append(f"rank {rank} {how}")
    others = "; then " + "; ".join(parts[1:]) if len(parts) > 1 else ""
    return f"training stopped: {parts[0]}{others} — the other ranks were stopped"


def _last_line(message) -> str:
    text = message.get("message", str(message)) if isinstance(message, dict) else str(message)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown error"
