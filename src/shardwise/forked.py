"""Independent pieces of work spread over forked processes, the answer in the order of the pieces, as one process
would give it: the planner's search (planner/search.py) and the benchmarks that score hundreds of published runs.

A forked worker shares the parent's imports and caches as they stand, so it starts at once; it sends back only what
each piece returned (pickled through a pipe). No torch."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import traceback
from typing import Callable, Sequence

MAX_WORKERS = 4


def worker_count(workers: int | None, cost: float, worth: float) -> int:
    """Processes for work of this cost: `workers` if given; else one per core (up to MAX_WORKERS) where the work is at
    least `worth` (below it a fork costs more than it saves) and forking is safe here (POSIX fork, no other Python
    thread in this process, which a fork would copy mid-step)."""
    if workers is not None:
        return max(1, workers)
    if cost < worth or not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


def map_pieces(fn: Callable, pieces: Sequence, costs: Sequence[float], n: int,
               on_piece: Callable[[int, int], None] | None = None) -> list:
    """[fn(piece) for piece in pieces] over n processes: this one and n - 1 forked workers. Each process, when free,
    takes the costliest piece no process has taken yet (a shared counter over the pieces by falling cost): a few
    pieces often hold most of the work, and a cost guessed before the work is often off (a pipeline's candidate layout
    takes twice a flat one's time), so hands dealt up front left one process with 1.8x the other's share; taking
    pieces as each frees up leaves at most about one piece's work between them. The answer is in piece order,
    whoever computed each. A piece's exception is raised here whichever process ran it (a worker's with its traceback
    as the cause); a worker that ends without answering is named, never waited for. `on_piece(taken, total)`: called
    here after each piece this process finishes, with how many pieces the processes have taken so far (a progress
    display; no thread, which would keep the work in one process: worker_count)."""
    if n <= 1 or len(pieces) <= 1:
        return _here(fn, pieces, on_piece)
    import multiprocessing

    order = claim_order(costs)
    ctx, workers = multiprocessing.get_context("fork"), []
    try:
        taken = ctx.Value("i", 0)  # how many of `order` some process has taken (its own lock)
    except (OSError, ImportError):  # no shared semaphores here (a sandbox without /dev/shm): one process answers
        return _here(fn, pieces, on_piece)
    try:
        for _ in range(min(n, len(pieces)) - 1):
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker, args=(send, fn, pieces, order, taken, os.getpid()), daemon=True)
            proc.start()
            send.close()
            workers.append((receive, proc))

        def dead() -> str | None:
            return _dead_worker([proc for _, proc in workers])

        found = _take(fn, pieces, order, taken, dead, on_piece)
        for receive, proc in workers:
            found.update(_answer(receive, proc, dead))
        return [found[i] for i in range(len(pieces))]
    finally:
        for receive, proc in workers:
            if proc.is_alive() and sys.exc_info()[0] is not None:  # answered workers end by themselves
                proc.terminate()
                proc.join(5)  # a worker still starting has this process's dispositions: SIGTERM may be ignored there
                if proc.is_alive():
                    proc.kill()
            proc.join()
            receive.close()


def claim_order(costs: Sequence[float]) -> list[int]:
    """The pieces' indices in the order the processes take them: costliest first, ties in piece order."""
    return sorted(range(len(costs)), key=lambda i: (-costs[i], i))


def _answer(receive, proc, dead: Callable[[], str | None]) -> dict:
    """One worker's {index: result}, waited for a few seconds at a time: another worker killed while holding the
    counter's lock leaves this one waiting on it, and this one's answer never comes. A piece's exception is raised
    again here (its traceback the cause)."""
    while not receive.poll(LOCK_CHECK_S):
        if why := dead():
            raise RuntimeError(f"a forked worker ended before answering ({why})")
    try:
        ok, parts = receive.recv()
    except EOFError:  # it ended without a word
        proc.join(LOCK_CHECK_S)
        raise RuntimeError(f"a forked worker ended before answering (exit code {proc.exitcode})") from None
    if ok:
        return parts
    exc, tb = parts
    try:
        exc = pickle.loads(exc) if exc is not None else None
    except Exception:  # noqa: BLE001 — an exception that cannot be rebuilt here: its traceback says what it was
        exc = None
    if exc is None:
        raise RuntimeError(f"a forked worker failed:\n{tb}")
    raise exc from RuntimeError(f"in a forked worker:\n{tb}")


def _here(fn: Callable, pieces: Sequence, on_piece: Callable[[int, int], None] | None) -> list:
    """Every piece in this process, in order, each told as it finishes."""
    return [_told(fn(piece), on_piece, i + 1, len(pieces)) for i, piece in enumerate(pieces)]


def _told(result, on_piece: Callable[[int, int], None] | None, taken: int, total: int):
    if on_piece is not None:
        on_piece(taken, total)
    return result


def _take(fn: Callable, pieces: Sequence, order: list[int], taken, dead: Callable[[], str | None],
          on_piece: Callable[[int, int], None] | None = None) -> dict:
    """{index: fn(piece)} of the pieces this process takes, one at a time, until none is left. `dead` says which
    process that could hold the counter's lock has ended (or None): one killed while holding it (a window of a few
    instructions) would otherwise leave the others waiting for it forever."""
    done, lock = {}, taken.get_lock()
    while True:
        while not lock.acquire(timeout=LOCK_CHECK_S):
            if why := dead():
                raise RuntimeError(f"a forked worker ended before answering ({why})")
        try:
            k = taken.value
            taken.value = k + 1
        finally:
            lock.release()
        if k >= len(order):
            return done
        # the count read without the lock: a display's figure, never a decision's
        done[order[k]] = _told(fn(pieces[order[k]]), on_piece, min(taken.get_obj().value, len(order)), len(order))


LOCK_CHECK_S = 5.0  # how long a process waits for the counter before it checks that the others still run


def _dead_worker(procs) -> str | None:
    """How the first forked worker that ended without its answer ended, or None while every one runs or answered."""
    for proc in procs:
        if proc.exitcode not in (None, 0):
            return f"exit code {proc.exitcode}"
    return None


def _parent_gone(parent: int) -> str | None:
    return "its parent ended" if os.getppid() != parent else None


def _worker(send, fn: Callable, pieces: Sequence, order: list[int], taken, parent: int) -> None:
    """In a forked worker: fn of each piece it takes, sent back in one message (or the exception that stopped it, with
    its traceback). Ctrl-C, or the parent's terminate() while the worker is still exiting, ends it silently: the
    handlers it inherited would raise there (the CLI's SIGTERM raises Interrupted) and print a traceback after the
    command's output. A signal the command was started with ignored stays ignored (interrupt.default_handlers)."""
    from shardwise.interrupt import default_handlers

    default_handlers()
    try:
        send.send((True, _take(fn, pieces, order, taken, lambda: _parent_gone(parent))))
    except BaseException:  # noqa: BLE001 — the parent raises it, with this traceback
        lock = taken.get_lock()
        if lock.acquire(timeout=LOCK_CHECK_S):  # the others take no more: the answer is lost already
            taken.value = len(order)
            lock.release()
        try:
            send.send((False, (_pickled(sys.exc_info()[1]), traceback.format_exc())))
        except OSError:  # the parent has ended: nobody to tell
            pass
    finally:
        send.close()


def _pickled(exc: BaseException) -> bytes | None:
    """The exception as bytes the parent can raise again, or None where it does not pickle (its traceback then says
    what it was)."""
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)  # some pickle but cannot be rebuilt (a required argument lost): the parent would fail there
        return data
    except Exception:  # noqa: BLE001
        return None
