"""The fork server every rank on this machine is forked from (multiprocessing's "forkserver").

A spawned rank imports torch and shardwise afresh, 3-5 s of CPU each, so four ranks on two cores took 11 s to start:
forked from a server that imported them once (PRELOAD), they start in about a second. Importing never touches CUDA, so
forking the server is as safe for NCCL ranks as spawning a fresh interpreter (tests/test_launch_fork_server.py).

The server keeps the environment it started with: each rank is handed what has changed in the launching process
since (`env_changes`, taken by `adopt_env` in the rank), except the variables torch elastic sets per rank.

`start(world)` starts it once per process. `launch.run_ranks` calls it; a command that knows it will launch ranks
(train, calibrate, validate, demo) starts it first (`early`), before it imports torch itself, so the two imports run
side by side on two cores instead of one after the other (`shardwise train` on 2 ranks: 9.3-9.6 s -> 7.8-8.0 s on a
2-core machine). Nothing here imports torch.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path

# Beside torch and shardwise, what a rank would otherwise import on its first step, once per rank (0.8-1.2 s of CPU
# each here): torch._dynamo (the first meta-device initialisation imports it), ZeRO-1's optimizer, the pipeline runtime.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.distributed.optim", "shardwise.train",
           "shardwise.parallel", "shardwise.parallel.pipeline", "shardwise.checkpoint", "shardwise.launch"]
RANK_KEYS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
_server_env: dict[str, str] | None = None  # this process's environment when its fork server started


def start(world: int) -> str:
    """Start the fork server, once, for ranks of a `world`-rank launch, and set this process's environment for the
    launch; the start method elastic_launch then uses.

    The environment: one thread per rank unless told otherwise (ranks share this machine's cores), like torchrun,
    and torch's C++ error logs off (gloo's failed connect, NCCL's watchdog would follow the job's one line on stderr;
    the failure's message is in that line) — both read as the server imports torch."""
    defaults = _launch_env(world)
    _start(defaults)
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    return "forkserver"


def _launch_env(world: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(world, 1))), "TORCH_CPP_LOG_LEVEL": "FATAL"}


def _start(defaults: dict[str, str]) -> None:
    """The server, if none runs, with this process's environment and `defaults` where it sets nothing; this process's
    own environment is left as it was (its torch, imported later, keeps its threads and logs). It starts with SIGINT
    blocked, so it and its forks ignore Ctrl-C until `interrupt.rank_handlers` in each rank."""
    global _server_env
    if _server_env is not None:
        return
    import multiprocessing
    import multiprocessing.forkserver
    import threading

    from shardwise.interrupt import start_resource_tracker

    multiprocessing.set_forkserver_preload(PRELOAD)
    added = [key for key in defaults if key not in os.environ]
    # a child inherits the signal mask of the thread that starts it; signal handlers are the main thread's
    blocking = hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
    if blocking:
        start_resource_tracker()  # which would unblock SIGINT around its own start
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if blocking else None
    try:
        os.environ.update({key: defaults[key] for key in added})
        _server_env = dict(os.environ)
        multiprocessing.forkserver.ensure_running()
    finally:
        for key in added:
            os.environ.pop(key, None)
        if blocking:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)


def started() -> bool:
    return _server_env is not None


@contextmanager
def early(world: int):
    """Around a command that will launch `world` ranks: the server starts now, importing torch while the command
    does its own work (nothing for one rank, or under torchrun, where no server forks the ranks). If the command
    ends before its launch (a bad flag, Ctrl-C), the server it started ends with it, instead of finishing its
    imports behind the command's exit while holding its output open."""
    starting = world > 1 and "RANK" not in os.environ and _server_env is None
    try:
        if starting:  # inside the try: a Ctrl-C held while the server starts is raised as it returns
            _start(_launch_env(world))  # the launch (run_ranks) sets this process's environment, as without
        yield
    except BaseException:
        if starting:
            stop()
        raise


def stop() -> None:
    """End the fork server now (it would end by itself once this process has gone and it has finished its imports),
    and the ranks it forked with it; the next launch starts another. After an interrupt, and when a command that
    started it early stops before its launch.

    A rank forked just as an interrupt came is still reading its launch from this process, which is about to exit:
    left alone it fails there and prints a traceback after the command's one line. So the server is stopped first (it
    forks no more), its forks are killed while they are still its children, then the server."""
    global _server_env
    import multiprocessing.forkserver

    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)  # CPython's, since 3.4
    # A second Ctrl-C between the SIGSTOP and the SIGKILL would leave the server stopped for ever, holding the
    # command's output open: the signals wait until it is dead.
    held = {signal.SIGINT, signal.SIGTERM}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held) if hasattr(signal, "pthread_sigmask") else None
    try:
        if pid:
            signal_quietly(pid, signal.SIGSTOP)
            for child in _children(pid):
                signal_quietly(child, signal.SIGKILL)
            signal_quietly(pid, signal.SIGKILL)
        _server_env = None
    finally:
        if before is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)


def signal_quietly(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except OSError:  # gone already
        pass


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, from /proc (Linux; elsewhere none are found: the agent has stopped the
    ranks it knew of)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*") if Path("/proc").is_dir() else ():
        try:
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def env_changes() -> tuple[dict[str, str], list[str]]:
    """What this process's environment set and removed since the fork server started."""
    now = os.environ
    return ({k: v for k, v in now.items() if _server_env.get(k) != v}, [k for k in _server_env if k not in now])


def adopt_env(changes: tuple[dict[str, str], list[str]] | None) -> None:
    """In a forked rank: the launcher's environment as of the launch, over the server's older one (None: a rank
    torchrun started, or the launcher's own process)."""
    if changes is None:
        return
    changed, removed = changes
    mine = lambda k: k in RANK_KEYS or k.startswith("TORCHELASTIC_")  # noqa: E731 — torch elastic's, per rank
    os.environ.update({k: v for k, v in changed.items() if not mine(k)})
    for k in removed:
        if not mine(k):
            os.environ.pop(k, None)
