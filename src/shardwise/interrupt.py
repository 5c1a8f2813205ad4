"""Ctrl-C and SIGTERM on a command that runs many processes: one line, exit 128 + signal, no rank left behind.

- The launching process (torch's elastic agent) turns SIGINT/SIGTERM (and SIGHUP/SIGQUIT) into a SignalException,
  stops the ranks and re-raises; `launcher_signals()` makes that `Interrupted`, which the CLI prints as one line, exit
  130 or 143 (129 / 131). The agent's own log lines about it are silenced (`quiet_agent`), and its handlers, which it
  never takes back, are taken back after each launch.
- A rank dies at once on SIGINT or SIGTERM (the default action, not Python's KeyboardInterrupt): a rank blocked
  in a collective would otherwise only see the signal when the collective returns, and each would print a
  traceback. Nothing a rank writes needs a clean exit: metrics are written line by line, a checkpoint becomes
  visible only when complete (a half-written one is removed by the next save).
- A group signal the command was started with ignored (SIGINT and SIGQUIT for a script's `shardwise train ... &`,
  SIGHUP under nohup) is ignored by every process of the job: the launcher (`_keeping_ignored`), the ranks
  (`rank_handlers`), the planner's forked workers. SIGTERM always stops the ranks and workers.
- Outside a launch (the CLI's own process, one-process training) SIGTERM and Ctrl-C are `Interrupted` too; an error
  a library raises while unwinding one is still that interrupt (`interrupt_behind`).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# What a terminal or a hangup sends a whole process group, and what a shell sets ignored for a job it means not to hear
# them: SIGINT and SIGQUIT for a script's `cmd &`, SIGHUP under nohup.
GROUP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGQUIT", "SIGHUP") if hasattr(signal, name))


class Interrupted(KeyboardInterrupt):
    """The user (Ctrl-C) or the system (SIGTERM) stopped the command; every process has been stopped. A
    KeyboardInterrupt, so that no `except Exception` swallows it."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"interrupted by {signal.Signals(self.signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process a signal ended: 130, 143


_RECEIVED: list[int] = []  # the signals that raised Interrupted during this command (cli_handlers starts it empty)


def _raise(signum, frame):
    _RECEIVED.append(int(signum))
    raise Interrupted(signum)


def cli_handlers():
    """In the CLI's process, for one command: SIGTERM raises Interrupted, and so does Ctrl-C (a KeyboardInterrupt, as
    Python's own), unless the process was started with SIGINT ignored (`shardwise plan ... &` from a script); SIGTERM
    is taken whatever the process inherited (no shell ignores it for a job). Returns what puts the previous handlers
    back (an in-process caller keeps its own once the command returns)."""
    import threading

    _RECEIVED.clear()
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN or sig not in GROUP_SIGNALS:
            signal.signal(sig, _raise)

    def restore():
        for sig, handler in previous.items():
            if handler is not None:  # None: set from outside Python, which signal.signal cannot put back
                signal.signal(sig, handler)
    return restore


def interrupt_behind(exc: BaseException) -> Interrupted | None:
    """The interrupt `exc` ends the command with: itself if it is one; or, for another error raised while one was being
    handled (or from one) or after a signal interrupted this command, that one. Interrupted is raised wherever the main
    thread is, and a library whose clean-up it cuts half-way can fail in its own way while unwinding (torch's elastic
    rendezvous registers a finalizer that joins its keep-alive thread before starting it: SIGTERM in between, and the
    agent's shutdown raises "cannot join thread before it is started" in place of the interrupt). A SystemExit is an
    interrupt only when one is in its chain."""
    seen, depth = exc, 0
    while seen is not None and depth < 32:  # the error, then what it was raised from or while handling
        if isinstance(seen, Interrupted):
            return seen
        if isinstance(seen, KeyboardInterrupt):
            return Interrupted(signal.SIGINT)
        if type(seen).__name__ == "SignalException" and hasattr(seen, "sigval"):  # torch's agent caught the signal
            return Interrupted(int(seen.sigval))
        seen, depth = seen.__cause__ or seen.__context__, depth + 1
    if isinstance(exc, SystemExit) or not _RECEIVED:
        return None
    return Interrupted(_RECEIVED[-1])


def ignored_signals(signals=GROUP_SIGNALS) -> frozenset:
    """Which of `signals` this process ignores: in the CLI's process, as the command was started (cli_handlers leaves
    an ignored one ignored)."""
    return frozenset(sig for sig in signals if signal.getsignal(sig) is signal.SIG_IGN)


def default_handlers(ignored=None) -> None:
    """In a process this command started (a rank, a forked worker): SIGINT, SIGTERM, SIGQUIT and SIGHUP back to the
    system's default (the process ends at once, silently; SIGQUIT's default also dumps core where core files are on),
    except the group signals in `ignored` (None: those this process ignores now), which are ignored: a job started in
    the background of a script (`shardwise train ... &`) or under nohup ignores them in every process, not only in the
    launcher (otherwise a SIGINT to the job's group would end the ranks that run and spare those that start later).
    SIGTERM is never kept ignored: it is how the launcher's agent and forked.map_pieces stop what they started."""
    ignored = ignored_signals() if ignored is None else frozenset(ignored)
    for sig in dict.fromkeys(SIGNALS + GROUP_SIGNALS):
        signal.signal(sig, signal.SIG_IGN if sig in ignored and sig in GROUP_SIGNALS else signal.SIG_DFL)


def rank_handlers(ignored=None) -> None:
    """In a rank that a launcher started: default_handlers, with the group signals its launcher ignores (`ignored`,
    handed over at the launch: the fork server a rank comes from is kept across launches and would give back the
    dispositions of the launch that started it; None under torchrun: the rank's own). The rank was started with SIGINT
    blocked (`launcher_signals`): one that arrived while it imported torch ends it now, unless ignored (setting a
    signal ignored discards it pending)."""
    default_handlers(ignored)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def end_with(launcher: int | None) -> None:
    """In a rank: end it (exit 1) once its launcher process `launcher` has gone. A launcher killed outright (SIGKILL, the
    OOM killer) runs no handler to stop its ranks, and their parent, its fork server, stays up while they hold its
    liveness pipe (multiprocessing hands every fork one). A daemon thread waits on the launcher's pidfd, readable once
    it has exited (a zombie not yet reaped included; a reused pid never matches); where there is none (not Linux 5.3+),
    it looks once a second. None: nothing to watch (under torchrun the agent is the parent)."""
    if launcher is None:
        return
    try:
        fd = os.pidfd_open(launcher)
    except (AttributeError, OSError):  # no pidfd here: poll the pid
        fd = None
    if fd is None and not _alive(launcher):
        os._exit(1)
    threading.Thread(target=_watch, args=(launcher, fd), name="shardwise-launcher-watch", daemon=True).start()


def _watch(launcher: int, fd: int | None) -> None:
    if fd is not None:
        select.select([fd], [], [])  # blocks until the launcher has exited
    else:
        while _alive(launcher):
            time.sleep(1.0)
    os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, under another user
        pass
    return True


def quiet_agent() -> None:
    """torch's elastic agent logs a warning per signal and per failure (with tracebacks); shardwise says it in
    one line instead. Its loggers each carry their own level, so each is set."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")):
            logging.getLogger(name).setLevel(logging.CRITICAL)


@contextmanager
def launcher_signals():
    """Around the launch of ranks: a signal the agent caught (it has stopped the ranks) becomes Interrupted.

    Ctrl-C reaches every process of the terminal's group, ranks still importing torch included, where Python
    would print a KeyboardInterrupt traceback. So the ranks start with SIGINT blocked (a child inherits the
    mask of the thread that starts it, here the main thread) until `rank_handlers` unblocks it; this process
    still hears SIGINT through a thread that leaves it unblocked (Python runs the handler in the main thread).
    A signal the command was started with ignored stays ignored in this process too (`_keeping_ignored`, in the main
    thread, where torch's agent installs its handlers), as in its ranks (`rank_handlers`)."""
    import threading

    from torch.distributed.elastic.multiprocessing.api import SignalException

    quiet_agent()
    main = threading.current_thread() is threading.main_thread()
    install = signal.signal
    # the group signals ignored as the command was started (SIGTERM is always the agent's: cli_handlers takes it too)
    keep = _keeping_ignored(install, ignored_signals()) if main else None
    blocking = hasattr(signal, "pthread_sigmask") and main
    if blocking:
        start_resource_tracker()  # started now, it leaves the mask below in place
        stop = threading.Event()
        listener = threading.Thread(target=stop.wait, name="shardwise-signals", daemon=True)
        listener.start()  # created before the mask changes: it keeps SIGINT deliverable
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        if keep is not None:
            signal.signal = keep
        yield
    except SignalException as exc:
        raise Interrupted(int(exc.sigval)) from None
    except Interrupted:  # SIGTERM before the agent took the signals over (cli_handlers): keep its name and code
        raise
    except KeyboardInterrupt:
        raise Interrupted(signal.SIGINT) from None
    finally:
        if keep is not None:
            if signal.signal is keep:
                signal.signal = install
            keep.take_back()
        if blocking:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            stop.set()


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker, if it is not running. Started on first use (a launch's queues and
    locks, the fork server), it blocks and then *unblocks* SIGINT and SIGTERM around its own start: so it is started
    before SIGINT is blocked for a launch. It runs in the job's process group and ignores only SIGINT and SIGTERM: a
    SIGHUP or SIGQUIT to the group killed it, and the launch's cleanup then printed a dozen tracebacks from the tracker
    it started again. An ignored signal stays ignored in the process started, so it is started with those two ignored."""
    from multiprocessing import resource_tracker

    group = [sig for sig in (getattr(signal, "SIGHUP", None), getattr(signal, "SIGQUIT", None)) if sig]
    before = [signal.signal(sig, signal.SIG_IGN) for sig in group]
    try:
        resource_tracker.ensure_running()
    finally:
        for sig, handler in zip(group, before):
            signal.signal(sig, handler)


def _keeping_ignored(install, ignored: frozenset):
    """`signal.signal` as it stands while ranks are launched, except that a group signal the command was started with
    ignored stays ignored: torch's elastic agent installs its own handlers for SIGTERM and the group signals whatever
    the process inherited (torch/distributed/elastic/multiprocessing/api.py, PContext.start), and would stop the job on
    a SIGINT or SIGQUIT the shell meant it not to hear (a script's `shardwise train ... &`) or a SIGHUP under nohup,
    though only once the ranks had started. (torch 2.13 would also take TORCHELASTIC_SIGNALS_TO_HANDLE; torch 2.4,
    which the package allows, has no such setting.) The agent never puts back what it replaced: `take_back()` does,
    after the launch, so the command's own handlers (cli_handlers) hold again between launches."""
    replaced: dict = {}

    def keep(sig, handler):
        if sig in ignored:
            return signal.SIG_IGN
        previous = install(sig, handler)
        replaced.setdefault(sig, previous)
        return previous

    def take_back():
        for sig, handler in replaced.items():
            if handler is not None:  # None: set from outside Python, which signal.signal cannot put back
                install(sig, handler)
        replaced.clear()

    keep.take_back = take_back
    return keep
