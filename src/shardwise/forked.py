"""Independent pieces of work spread over forked processes, the answer in the order of the pieces, as one process
would give it: the planner's search (planner/search.py) and the benchmarks that score hundreds of published runs.

A forked worker shares the parent's imports and caches as they stand, so it starts at once; it sends back only what
each piece returned (pickled through a pipe). No torch."""

from __future__ import annotations

import os
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


def deal(costs: Sequence[float], n: int) -> list[list[int]]:
    """The pieces' indices dealt into n hands of about equal cost: the costliest piece first, each to the hand with
    the least so far (a few pieces often hold most of the work, so runs of neighbouring pieces would leave one
    process the bulk); each hand in piece order."""
    hands, loads = [[] for _ in range(max(1, n))], [0] * max(1, n)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        k = loads.index(min(loads))
        hands[k].append(i)
        loads[k] += costs[i]
    return [sorted(h) for h in hands if h] or [[]]


def map_hands(fn: Callable, pieces: Sequence, hands: list[list[int]]) -> list:
    """[fn(piece) for piece in pieces]: the first hand's here, every other hand's in a forked worker. A worker's
    exception is raised here, with its traceback."""
    if len(hands) <= 1:
        return [fn(piece) for piece in pieces]
    import multiprocessing

    ctx, workers = multiprocessing.get_context("fork"), []
    try:
        for hand in hands[1:]:
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker, args=(send, fn, [pieces[i] for i in hand]), daemon=True)
            proc.start()
            send.close()
            workers.append((receive, proc))
        found = {i: fn(pieces[i]) for i in hands[0]}
        for hand, (receive, proc) in zip(hands[1:], workers):
            ok, parts = receive.recv()
            if not ok:
                raise RuntimeError(f"a forked worker failed:\n{parts}")
            found.update(zip(hand, parts))
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


def _worker(send, fn: Callable, pieces: list) -> None:
    """In a forked worker: fn of each piece, sent back in one message (or the traceback that stopped it). Ctrl-C, or
    the parent's terminate() while the worker is still exiting, ends it silently: the handlers it inherited would
    raise there (the CLI's SIGTERM raises Interrupted) and print a traceback after the command's output. A signal the
    command was started with ignored stays ignored (interrupt.default_handlers)."""
    from shardwise.interrupt import default_handlers

    default_handlers()
    try:
        send.send((True, [fn(piece) for piece in pieces]))
    except BaseException:  # noqa: BLE001 — the parent raises it, with this traceback
        send.send((False, traceback.format_exc()))
    finally:
        send.close()
