"""Ctrl-C and SIGTERM on a command that runs many processes: one line, exit 128 + signal, no rank left behind.

- The launching process (torch's elastic agent) turns SIGINT/SIGTERM into a SignalException, stops the ranks and
  re-raises; `launcher_signals()` makes that `Interrupted`, which the CLI prints as one line, exit 130 or 143.
  The agent's own log lines about it are silenced (`quiet_agent`).
- A rank dies at once on SIGINT or SIGTERM (the default action, not Python's KeyboardInterrupt): a rank blocked
  in a collective would otherwise only see the signal when the collective returns, and each would print a
  traceback. Nothing a rank writes needs a clean exit: metrics are written line by line, a checkpoint becomes
  visible only when complete (a half-written one is removed by the next save).
- A signal the command was started with ignored (SIGINT, for a script's `shardwise train ... &`) is ignored by every
  process of the job: the launcher (`_keeping_ignored`), the ranks (`rank_handlers`), the planner's forked workers.
- Outside a launch (the CLI's own process, one-process training) SIGTERM and Ctrl-C are `Interrupted` too; an error
  a library raises while unwinding one is still that interrupt (`interrupt_behind`).
"""

from __future__ import annotations

import logging
import signal
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
    Python's own), unless the process was started with the signal ignored (`shardwise plan ... &` from a script).
    Returns what puts the previous handlers back (an in-process caller keeps its own once the command returns)."""
    import threading

    _RECEIVED.clear()
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
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


def default_handlers() -> None:
    """In a process this command started (a rank, a forked worker): SIGINT and SIGTERM back to the system's default
    (the process ends at once, silently), except a signal the command itself was started with ignored, which stays
    ignored."""
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)


def rank_handlers() -> None:
    """In a rank that a launcher started: SIGINT and SIGTERM end the process at once and silently. The rank was
    started with SIGINT blocked (`launcher_signals`): one that arrived while it imported torch ends it now.

    A signal the job was started with ignored stays ignored, as the launcher keeps it (`cli_handlers`): a job started
    in the background of a script (`shardwise train ... &`) ignores SIGINT in every process, not only in the launcher
    (otherwise a SIGINT to the job's group would end the ranks that run and spare those that start later). A rank
    inherits the disposition: a fork server's child gets back the server's, which exec kept from the launcher (an
    ignored signal stays ignored across exec, a handled one does not)."""
    default_handlers()
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


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
    A signal the command was started with ignored stays ignored in this process too (`_keeping_ignored`), as in its
    ranks (`rank_handlers`)."""
    import threading

    from torch.distributed.elastic.multiprocessing.api import SignalException

    quiet_agent()
    ignored = {sig for sig in SIGNALS if signal.getsignal(sig) is signal.SIG_IGN}  # as the command was started
    install = signal.signal
    blocking = hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
    if blocking:
        # multiprocessing's resource tracker, started on first use (the launch's queues and locks), blocks and then
        # *unblocks* SIGINT and SIGTERM around its own start: started now, it leaves the mask below in place.
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        stop = threading.Event()
        listener = threading.Thread(target=stop.wait, name="shardwise-signals", daemon=True)
        listener.start()  # created before the mask changes: it keeps SIGINT deliverable
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        if ignored:
            signal.signal = _keeping_ignored(install, ignored)
        yield
    except SignalException as exc:
        raise Interrupted(int(exc.sigval)) from None
    except Interrupted:  # SIGTERM before the agent took the signals over (cli_handlers): keep its name and code
        raise
    except KeyboardInterrupt:
        raise Interrupted(signal.SIGINT) from None
    finally:
        signal.signal = install
        if blocking:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            stop.set()


def _keeping_ignored(install, ignored: set):
    """`signal.signal` as it stands while ranks are launched, except that a signal the command was started with ignored
    stays ignored: torch's elastic agent installs its own SIGINT/SIGTERM handlers whatever the process inherited
    (torch/distributed/elastic/multiprocessing/api.py, PContext.start), and would stop the job on a SIGINT the shell
    meant it not to hear (a script's `shardwise train ... &`), though only once the ranks had started."""
    def keep(sig, handler):
        return signal.SIG_IGN if sig in ignored else install(sig, handler)
    return keep
