"""Start ranks — the one way shardwise does it — and check a training job before it starts.

`run_ranks(entry, *args, world=W)` runs entry on W ranks: in place under torchrun (RANK and WORLD_SIZE
in the environment), in this process for one rank, else with torchrun's own machinery
(torch.distributed.launcher.api.elastic_launch: c10d rendezvous on a free loopback port), each rank a fork of a
server that imported torch and shardwise once (fork_server.py). If a rank
dies, the agent stops the others at once; with --max-restarts R it starts them all again (training
resumes from the newest checkpoint) up to R times, then JobFailed names the rank that died.
Training (`launch`: dp*tp*pp*cp ranks), calibrate, validate, the tests and the benchmarks all start
their ranks here.

`check` raises UsageError for anything wrong with a training job, before any process group exists.
"""

from __future__ import annotations

import math
import os
import re
import socket
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

from shardwise import fork_server
from shardwise.errors import JobFailed, UsageError
from shardwise.train import TrainConfig


MAX_STEPS = 10**9  # optimizer steps: far beyond any training run (Llama 3 405B took about a million)
MIN_TIMEOUT_S = 1.0  # --timeout's floor: 1 ms failed the rendezvous's connection on a quiet 2-core machine


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


def check(cfg: TrainConfig, checkpoints: bool = True) -> None:
    """Every reason this job cannot run, as one UsageError, before any process starts. `checkpoints=False` leaves
    out the checkpoint folder's contents (a resume compares the run's data, known once it is tokenized)."""
    from shardwise.specs import runtime_refusal, validate_layout

    lay, spec = cfg.layout, cfg.spec
    for name, value in (("--steps", cfg.steps), ("--global-batch", cfg.global_batch), ("--seq-len", cfg.seq_len)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    for flag, value, low in (("--lr", cfg.lr, 0), ("--grad-clip", cfg.grad_clip, 0), ("--timeout", cfg.timeout_s, 0),
                             ("--weight-decay", cfg.weight_decay, None)):
        if not (math.isfinite(value) and (value > low if low is not None else value >= 0)):
            raise UsageError(f"{flag} must be a finite number {'above 0' if low is not None else '0 or more'}, got {value}")
    if cfg.steps > MAX_STEPS:
        raise UsageError(f"--steps {cfg.steps:,} is more than any run takes (at most {MAX_STEPS:,}) — the warm-up alone "
                         f"would last {cfg.steps // 10:,} steps")
    if cfg.timeout_s < MIN_TIMEOUT_S:  # the ranks' rendezvous waits under it too: a millisecond cannot connect
        raise UsageError(f"--timeout {cfg.timeout_s:g} s is too short for the ranks to meet (their rendezvous and every "
                         f"collective wait under it) — give {MIN_TIMEOUT_S:g} or more")
    if cfg.timeout_s > 10**7:
        raise UsageError(f"--timeout {cfg.timeout_s:g} s is longer than any job (at most 10,000,000 s, ~4 months)")
    if not 0 <= cfg.seed < 2**63:
        raise UsageError(f"--seed must be between 0 and 2^63 - 1, got {cfg.seed}")
    if cfg.warmup_steps is not None and not 0 <= cfg.warmup_steps <= cfg.steps:
        raise UsageError(f"--warmup-steps must be between 0 and --steps ({cfg.steps}), got {cfg.warmup_steps}")
    if under_torchrun() and int(os.environ["WORLD_SIZE"]) != lay.world_size:
        cp = "*cp" if lay.cp > 1 else ""
        raise UsageError(f"torchrun started {os.environ['WORLD_SIZE']} processes but dp*tp*pp{cp} = {lay.dp}*{lay.tp}*{lay.pp}"
                         f"{f'*{lay.cp}' if lay.cp > 1 else ''} = {lay.world_size} — make nnodes * nproc-per-node equal dp*tp*pp{cp}")
    validate_layout(lay, spec, cfg.global_batch, seq_len=cfg.seq_len)
    refusal = runtime_refusal(lay)
    if refusal:
        raise UsageError(refusal)
    from shardwise.model_spec import config_path
    from shardwise.preflight import check_runtime_model, runtime_kv_refusal

    kv = runtime_kv_refusal(spec, lay.tp)
    if kv:
        raise UsageError(kv)
    if cfg.trace_dir and lay.pp == 1:
        raise UsageError("--trace draws the pipeline schedule's timeline — use it with --pp 2 or more")
    check_runtime_model(spec, cfg.seq_len, config_path(cfg.model_given))  # a refusal names the config.json
    if spec.is_moe and lay.tp > 1 and (cfg.seq_len // lay.cp) % lay.tp:
        per_rank = f"--seq-len {cfg.seq_len}" + (f" / cp {lay.cp}" if lay.cp > 1 else "")
        raise UsageError(f"each tp rank routes 1/tp of every sequence through the experts, but {per_rank} is not "
                         f"divisible by tp={lay.tp} — use a multiple of {lay.tp * lay.cp}")
    if cfg.backend == "nccl":
        _check_gpus(lay.world_size)
    from shardwise.checkpoint import check_flags
    from shardwise.paths import output_dir, output_file

    check_flags(cfg)  # a bad --keep or --save-every is named before any folder is created
    output_file(cfg.metrics_file, "--metrics-file", "metrics.jsonl")
    output_dir(cfg.trace_dir, "--trace")
    output_dir(cfg.checkpoint_dir, "--checkpoint-dir")
    from shardwise import preflight

    preflight.check(cfg, memory=cfg.memory_check)  # last: the job is valid, now does it fit this machine?
    if checkpoints:
        from shardwise.checkpoint import check as check_checkpoints

        check_checkpoints(cfg)


def _check_gpus(world: int) -> None:
    import torch

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if under_torchrun() else world
    if torch.cuda.device_count() < local:
        raise UsageError(f"{local} ranks on this machine need {local} GPUs, found {torch.cuda.device_count()} — "
                         f"lower dp*tp*pp or run on more machines with torchrun --nnodes")


def launch(cfg: TrainConfig) -> dict | None:
    """Run the (already checked) job to the end; raises JobFailed naming the rank that failed. Returns global rank
    0's `--json` object (None under torchrun on another rank, or without --json)."""
    from shardwise.train import train_rank

    return run_ranks(train_rank, cfg, world=cfg.layout.world_size, backend=cfg.backend, timeout_s=cfg.timeout_s,
                     max_restarts=cfg.max_restarts, what="training", finish_s=cfg.timeout_s)[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- the one way to start ranks


def run_ranks(entry, *args, world: int, backend: str = "gloo", timeout_s: float = 300.0, max_restarts: int = 0,
              report=None, what: str = "the job", finish_s: float | None = None) -> list:
    """Run entry(*args) on `world` ranks, each inside the job's process group (one thread per rank unless
    OMP_NUM_THREADS says otherwise); returns their results in rank order.

    - Under torchrun this process is one of the ranks: entry runs here; returns [this rank's result].
    - world 1: entry runs here, without torch.distributed.
    - Otherwise the ranks start on this machine with torchrun's own machinery (elastic_launch: c10d
      rendezvous on a free loopback port). If a rank fails, the agent stops the others at once; with
      max_restarts R it starts them all again up to R times; then JobFailed names the rank that died.
      With `finish_s` (an entry whose last call is a collective: train's barrier), once one rank has finished the
      others get finish_s seconds to finish too; one still running then hung or stopped past its last collective,
      where no collective's timeout can reach it: it is stopped and named.
    Rank 0's `progress(label)` calls reach `report(label)` here (a progress bar)."""
    if under_torchrun():
        return [_rank_main(entry, args, backend, timeout_s, None, report)]
    if world == 1:
        return [_one_rank(entry, args, backend, timeout_s, report, what)]
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from shardwise.interrupt import ignored_signals, launcher_signals

    try:
        # Ctrl-C / SIGTERM: the agent stops the ranks, one line. The agent's folder per rank (its error file) goes in
        # a temporary folder removed with the launch: left to torch elastic, each launch leaves one in the system's.
        with launcher_signals(), _ProgressRelay(report) as queue, tempfile.TemporaryDirectory(prefix="shardwise-") as logs, \
                _stopping_within(SHUTDOWN_S, Path(logs), finish_s) as (hung, late):
            config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, run_id=f"shardwise-{uuid.uuid4().hex[:8]}",
                                  rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}",
                                  max_restarts=max_restarts, monitor_interval=0.1, start_method=fork_server.start(world),
                                  local_addr="127.0.0.1", shutdown_timeout=SHUTDOWN_S, logs_specs=DefaultLogsSpecs(log_dir=logs))
            try:
                results = elastic_launch(config, _rank_main)(entry, args, backend, timeout_s, queue, None, True,
                                                             fork_server.env_changes(), ignored_signals(), os.getpid(),
                                                             logs if finish_s is not None else None)
            except ChildFailedError as exc:
                spent = f" (the last of {max_restarts + 1} attempts: --max-restarts {max_restarts} used)" if max_restarts else ""
                raise JobFailed(describe_failures(exc.failures, what, hung, timeout_s, late, finish_s, backend) + spent,
                                details=_details(exc.failures)) from None
    except KeyboardInterrupt:
        fork_server.stop()
        raise
    return [results[r] for r in sorted(results)]


def _one_rank(entry, args, backend, timeout_s, report, what: str):
    """World 1, in this process: a rank's error is said as a launch says it ('training stopped: rank 0 failed:
    <its last line>', the traceback in `details`), not as a traceback; the project's own refusals and divergence
    pass as they are."""
    import traceback

    try:
        return _rank_main(entry, args, backend, timeout_s, None, report, join=False)
    except (JobFailed, UsageError):
        raise
    except Exception as exc:
        said = _last_line("".join(traceback.format_exception_only(exc)))
        raise JobFailed(f"{what} stopped: rank 0 failed: {said}", details=traceback.format_exc()) from None


SHUTDOWN_S = 3  # how long the ranks left after a failure get to end by themselves, then again after SIGTERM


@contextmanager
def _stopping_within(grace: float, finished: Path | None = None, finish_s: float | None = None):
    """Around a launch: when a rank fails, the others get `grace` seconds to end, then `grace` after SIGTERM, then
    SIGKILL — torch's process context (torch.multiprocessing.spawn.ProcessContext.join, which torch elastic polls
    without a grace period) waits 30 s there, so a rank that hangs where SIGTERM cannot reach it (stopped, or stuck in
    a kernel) held the job 30 s past its peers' --timeout. And with `finish_s`, a rank still running `finish_s`
    seconds after another finished (its mark in `finished`, `_rank_main`) is killed: torch elastic waits for every
    rank without a limit, so one that hung after its last collective held the job for ever. Yields (the ranks, local =
    global on one machine, that needed SIGKILL after a failure: the ones that hung, as a rank waiting in a collective
    ends at SIGTERM; the ones killed as not finished). torch is restored after, and each failed rank's copy of its
    error that torch.multiprocessing wrote in the system's temporary folder (read at the join, never removed by torch:
    a failed launch left one file there per failed rank) is removed."""
    import signal
    import time

    from torch.multiprocessing.spawn import ProcessContext, ProcessExitedException, ProcessRaisedException

    join, hung, late, contexts = ProcessContext.join, [], [], {}

    def join_quickly(self, timeout=None, grace_period=None):
        contexts[id(self)] = self
        for index, process in enumerate(self.processes):
            if not getattr(process.kill, "shardwise", False):  # once per process: join is polled every 0.1 s
                process.kill = _recording_kill(process.kill, index, hung)
        if finish_s is not None:
            started = self.__dict__.setdefault("shardwise_started", time.time())  # this round's (restarts start more)
            done = {int(m.name.split("-")[1]): m.stat().st_mtime for m in finished.glob("finished-*")}
            done = {rank: at for rank, at in done.items() if at >= started}  # not a mark of an earlier round's
            if done and time.time() - min(done.values()) > finish_s:
                for index, process in enumerate(self.processes):
                    if process.is_alive() and index not in done:
                        late.append(index)
                        fork_server.signal_quietly(process.pid, signal.SIGKILL)
        try:
            return join(self, timeout, grace if grace_period is None else grace_period)
        except (ProcessExitedException, ProcessRaisedException) as exc:
            if finished is not None:  # the next round's rank 0 names it when it says the job restarted
                (finished / f"failed-{time.time_ns()}").write_text(_failed_rank(exc, self.processes))
            raise

    ProcessContext.join = join_quickly
    try:
        yield hung, late
    finally:
        ProcessContext.join = join
        for context in contexts.values():
            for name in filter(None, context.error_files):
                Path(name).unlink(missing_ok=True)


def _failed_rank(exc, processes) -> str:
    """'rank 1 died (exit code 13)', 'rank 1 died (exit code -9, SIGKILL)', 'rank 2 failed: <its error's last line>':
    the rank torch's process context found failed (local = global on one machine), in describe_failures' words. A
    rank that raised because a peer went away (_left_waiting) is the consequence: a peer that exited otherwise than
    by a Python error (exit code 1) is named instead."""
    if not hasattr(exc, "exit_code") and _left_waiting(str(exc)):
        gone = [i for i, p in enumerate(processes) if i != exc.error_index and p.exitcode not in (None, 0, 1)]
        if gone:
            return _died(gone[0], processes[gone[0]].exitcode)
    if hasattr(exc, "exit_code"):
        return _died(exc.error_index, exc.exit_code)
    return f"rank {exc.error_index} failed: {_last_line(str(exc))}"


def _died(rank: int, code: int) -> str:
    import signal

    try:
        name = f", {signal.Signals(-code).name}" if code < 0 else ""
    except ValueError:  # no signal of that number
        name = ""
    return f"rank {rank} died (exit code {code}{name})"


def last_failure(finished: str | None) -> str | None:
    """The newest failure the launcher marked in `finished` (`_stopping_within`): what a restarted round follows."""
    marks = sorted(Path(finished).glob("failed-*")) if finished else []
    return marks[-1].read_text() if marks else None


def _recording_kill(kill, index: int, killed: list):
    def recorded():
        killed.append(index)
        kill()

    recorded.shardwise = True
    return recorded


def spawn_ranks(fn, world: int, *args, backend: str = "gloo", timeout_s: float = 60.0) -> None:
    """fn(rank, world, *args) on `world` ranks (tests and benchmarks); a failing rank raises here with
    its traceback."""
    try:
        run_ranks(_with_rank, fn, *args, world=world, backend=backend, timeout_s=timeout_s)
    except JobFailed as exc:
        raise RuntimeError(f"{exc}\n{exc.details}") from None


def _with_rank(fn, *args):
    import torch.distributed as dist

    return fn(dist.get_rank(), dist.get_world_size(), *args)


_report = None  # where progress() sends rank 0's labels in this process


def progress(label: str) -> None:
    """A step of long work done: shown by the launching process's progress bar (rank 0 only)."""
    if _report is not None:
        _report(label)


def _rank_main(entry, args, backend, timeout_s, queue, report, join: bool = True, env=None, ignored=None,
               launcher: int | None = None, finished: str | None = None):
    """One rank: take the launcher's environment and the group signals it ignores (`ignored`; None under torchrun),
    end with the launcher process (`launcher`: its pid), join the process group (from torchrun's environment), run
    entry, leave — and say so in the folder `finished` (a mark the launcher times the other ranks' finish from)."""
    global _report
    fork_server.adopt_env(env)
    import gc

    import torch
    import torch.distributed as dist

    from shardwise.parallel.mesh import init_distributed

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    rank = int(os.environ.get("RANK", 0))
    _report = (queue.put if queue is not None else report) if rank == 0 else None
    if join:
        from shardwise.interrupt import end_with, rank_handlers

        rank_handlers(ignored)  # a rank ends at once on SIGINT / SIGTERM; the launcher says it in one line
        end_with(launcher)  # and when the launcher was killed outright
        init_distributed(backend, timeout_s)
        if (failure := last_failure(finished)) is not None:  # a restarted round: what ended the one before
            os.environ["SHARDWISE_RESTARTED_AFTER"] = failure
    try:
        result = entry(*args)
    finally:
        _report = None
        if dist.is_initialized():
            # Free what still holds gloo work objects (FSDP's state sits in reference cycles) while the
            # interpreter is alive: freed during its shutdown they abort the process (SIGABRT).
            gc.collect()
            dist.destroy_process_group()
    if finished is not None:
        Path(finished, f"finished-{rank}").touch()
    return result


class _ProgressRelay:
    """A queue the ranks put rank 0's progress labels in, and a thread that hands them to `report`."""

    def __init__(self, report):
        self.report, self.queue, self.thread = report, None, None

    def __enter__(self):
        if self.report is None:
            return None
        import threading

        import torch.multiprocessing as mp

        self.queue = mp.get_context("spawn").SimpleQueue()
        self.thread = threading.Thread(target=self._relay, daemon=True)
        self.thread.start()
        return self.queue

    def _relay(self):
        while (label := self.queue.get()) is not None:
            self.report(label)

    def __exit__(self, *exc):
        if self.queue is not None:
            self.queue.put(None)
            self.thread.join(timeout=5)
        return False


def describe_failures(failures: dict, what: str = "training", hung: list | None = None,
                      timeout_s: float | None = None, late: list | None = None, finish_s: float | None = None,
                      backend: str | None = None) -> str:
    """Name the rank that died first: a rank that vanished without a Python error (killed, crashed, exited)
    is the cause; ranks that then raised (peer closed the connection, timeout) are the consequence. Where the
    failures are what a silent peer causes (a collective's timeout, a connection it closed) and ranks had to be
    SIGKILLed after them (`hung`: alive after SIGTERM), those ranks stopped answering and are named first. Ranks
    killed as not finished `finish_s` after another had (`late`) are named as such. Under NCCL (`backend`) a
    collective past its timeout raises no Python error: torch's watchdog aborts the rank (SIGABRT), said as such."""
    if late:
        who = f"rank {late[0]}" if len(late) == 1 else "ranks " + ", ".join(map(str, sorted(late)))
        return (f"{what} stopped: {who} had not finished {finish_s:g} s after the other ranks had (hung or stopped "
                f"after its last collective) — it was stopped")
    def vanished(f) -> bool:
        return not (f.error_file and os.path.isfile(f.error_file))

    ordered = sorted(failures.items(), key=lambda kv: (not vanished(kv[1]), kv[1].timestamp, kv[0]))
    parts = []
    for rank, f in ordered:
        how = f"died (exit code {f.exitcode}{', ' + f.signal_name() if f.exitcode < 0 else ''})" if vanished(f) \
            else f"failed: {_last_line(f.message)}"
        parts.append(f"rank {rank} {how}")
    stuck = sorted(set(hung or ()) - set(failures))
    if stuck and all(not vanished(f) and _left_waiting(f.message) for f in failures.values()):
        parts[0] = _hung_first(stuck, ordered[0], timeout_s)
    elif backend == "nccl" and _watchdog_aborted(ordered[0][1]) and all(vanished(f) for f in failures.values()):
        parts[0] = _nccl_timeout_first(stuck, ordered[0][0], timeout_s)
    others = "; then " + "; ".join(parts[1:]) if len(parts) > 1 else ""
    return f"{what} stopped: {parts[0]}{others} — the other ranks were stopped"


def _hung_first(stuck: list[int], first: tuple, timeout_s: float | None) -> str:
    who = f"rank {stuck[0]}" if len(stuck) == 1 else "ranks " + ", ".join(map(str, stuck))
    waited = f" --timeout {timeout_s:g} s" if timeout_s else ""
    rank, f = first
    return (f"{who} stopped answering (hung or stopped): rank {rank} waited{waited} for "
            f"{'it' if len(stuck) == 1 else 'them'} and failed: {_last_line(f.message)}")


def _watchdog_aborted(f) -> bool:
    """How NCCL's watchdog ends a rank whose collective ran past the group's timeout: it aborts the process (SIGABRT,
    exit code -6) from its own thread, with no Python error (so no error file)."""
    import signal

    return f.exitcode == -signal.SIGABRT


def _nccl_timeout_first(stuck: list[int], rank: int, timeout_s: float | None) -> str:
    """The first rank NCCL's watchdog aborted (`rank`: torch elastic reports the first rank that ended), and the ranks
    still alive after SIGTERM (`stuck`), which the others were probably waiting for."""
    limit = f"--timeout {timeout_s:g} s" if timeout_s else "its timeout"
    aborted = (f"rank {rank} ended first, aborted (exit code -6, SIGABRT) with no Python error, as NCCL's watchdog "
               f"ends a rank whose collective runs past {limit}")
    if stuck:
        who = f"rank {stuck[0]}" if len(stuck) == 1 else "ranks " + ", ".join(map(str, stuck))
        return f"{who} stopped answering (hung or stopped): {aborted}; it probably waited that long for {who}"
    return (f"{aborted}: a collective probably exceeded it (a rank hung, stopped or fell behind; raise --timeout if "
            f"a step is that slow)")


def _left_waiting(message) -> bool:
    """What a rank raises when a peer goes silent: a collective's timeout, as gloo ('Timed out waiting 5000ms for
    recv') or NCCL's watchdog ('Watchdog caught collective operation timeout', 'ran for 600000 milliseconds before
    timing out') words it; gloo's connect timeout while the group forms ('Gloo connectFullMesh failed with ... Connect
    timeout'); or the connection a neighbour closed when its own timeout ended it ('Connection closed by peer',
    'Connection reset by peer')."""
    text = message.get("message", str(message)) if isinstance(message, dict) else str(message)
    return re.search(r"Timed out waiting|before timing out|Watchdog caught collective|Connect timeout|"
                     r"Connection (?:closed|reset) by peer", text) is not None


def _details(failures: dict) -> str:
    """Every failed rank's traceback (for tests; the CLI prints the one line)."""
    out = []
    for rank, f in sorted(failures.items()):
        message = f.message if isinstance(f.message, dict) else {"message": str(f.message)}
        stack = message.get("extraInfo", {}).get("py_callstack") if isinstance(message.get("extraInfo"), dict) else None
        out.append(f"--- rank {rank}:\n{stack or message.get('message', '')}")
    return "\n".join(out)


def _last_line(message) -> str:
    """The error's last line, without the C++ source location gloo puts in front ('[.../unbound_buffer.cc:78] '), nor
    the type of an error of this project's own, whose message is already written for the user."""
    text = message.get("message", str(message)) if isinstance(message, dict) else str(message)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    last = re.sub(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", lines[-1]) if lines else "unknown error"
    return re.sub(r"^(?:shardwise\.errors\.)?(?:JobFailed|UsageError): ", "", last)
