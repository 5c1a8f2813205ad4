"""forked.map_pieces: pieces spread over forked processes come back in the pieces' order, as one process gives them;
each process takes the costliest piece left when it is free (so one long piece does not hold back cheap ones dealt
beside it); and a worker's failure is raised in the parent with the worker's traceback (no hang, no partial answer)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from shardwise.forked import map_pieces, worker_count


def _where(piece: int) -> tuple[int, int]:
    return piece * piece, os.getpid()


def test_pieces_come_back_in_order_from_several_processes():
    pieces = list(range(23))
    out = map_pieces(_where, pieces, [1 + (p % 5) for p in pieces], 3)
    assert [v for v, _ in out] == [p * p for p in pieces]
    assert map_pieces(_where, pieces, [1] * 23, 1) == [(p * p, os.getpid()) for p in pieces]  # one process: all here


def test_a_process_busy_with_a_long_piece_leaves_the_rest_to_the_others(tmp_path: Path):
    """The first piece waits until every other piece is done, though its guessed cost is theirs. Pieces dealt out up
    front by that guess would have put some cheap ones behind it in the same process, and it would wait for them
    forever (here: fail after 60 s); taken as each process frees up, the other process takes them all."""
    def piece(i: int) -> int:
        if i == 0:
            deadline = time.monotonic() + 60
            while len(list(tmp_path.iterdir())) < 9:
                assert time.monotonic() < deadline, "the long piece's process was given cheap pieces too"
                time.sleep(0.01)
        else:
            (tmp_path / str(i)).touch()
        return os.getpid()

    pids = map_pieces(piece, list(range(10)), [1] * 10, 2)
    assert len(set(pids[1:])) == 1 and pids[0] != pids[1]


def _fails_on_seven(piece: int) -> int:
    if piece == 7:
        raise ValueError("piece seven is bad")
    return piece


def test_a_workers_failure_is_raised_here_with_its_traceback():
    pieces = list(range(12))
    # 7 first (the costliest) in whichever process takes it: raised here, or sent back from a forked worker
    for n in (1, 2, 3):
        with pytest.raises((RuntimeError, ValueError), match="piece seven is bad"):
            map_pieces(_fails_on_seven, pieces, [10 if p == 7 else 1 for p in pieces], n)


def test_a_forked_workers_failure_comes_back_with_its_traceback():
    """Every piece fails in a forked worker; the first piece taken is slow, so the other process takes the rest."""
    here = os.getpid()

    def piece(i: int) -> int:
        if i == 0:
            time.sleep(1)
        if os.getpid() != here:
            raise ValueError(f"piece {i} failed in a forked worker")
        return i

    with pytest.raises(RuntimeError, match="(?s)a forked worker failed.*failed in a forked worker"):
        map_pieces(piece, list(range(12)), [100] + [1] * 11, 2)


def test_small_work_stays_in_one_process():
    assert worker_count(None, 10, 400) == 1
    assert worker_count(3, 10, 400) == 3  # asked for


def _signals(piece: int):
    if piece == 0:
        time.sleep(0.5)  # the other process takes piece 1 meanwhile
    return os.getpid(), signal.getsignal(signal.SIGINT) is signal.SIG_DFL, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_worker_ends_silently_on_ctrl_c_or_terminate_whatever_handlers_the_parent_has():
    """The CLI's process raises on SIGTERM (interrupt.cli_handlers) and Python on SIGINT; a worker inheriting those
    printed a traceback when terminate() reached it while it was exiting. Its own are the system's defaults."""
    def _raise(signum, frame):
        raise KeyboardInterrupt

    # Python's own SIGINT handler, as in a terminal (a suite started in a script's background inherits it ignored)
    old = signal.signal(signal.SIGTERM, _raise), signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        out = map_pieces(_signals, [0, 1], [2, 1], 2)
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])
    assert sorted(pid == os.getpid() for pid, _, _ in out) == [False, True]  # one piece here, one in the worker
    for pid, sigint_default, sigterm_default in out:
        assert sigint_default is sigterm_default is (pid != os.getpid())  # this process keeps its handlers; the
        # forked worker's are the defaults


def _ignores_sigint(piece: int):
    return piece, signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_worker_keeps_ignoring_a_signal_the_command_was_started_ignoring():
    """`shardwise plan ... &` from a script starts with SIGINT ignored: its forked workers ignore it too, so a SIGINT
    to the group does not end them under a parent that goes on."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        out = map_pieces(_ignores_sigint, [0, 1], [1, 1], 2)
    finally:
        signal.signal(signal.SIGINT, old)
    assert out == [(0, True), (1, True)]


def test_without_shared_semaphores_one_process_answers(monkeypatch):
    """A sandbox without /dev/shm cannot make the shared counter: the work runs here, the answer the same."""
    import multiprocessing.context

    def no_semaphores(*args, **kwargs):
        raise OSError("[Errno 38] Function not implemented")

    monkeypatch.setattr(multiprocessing.context.BaseContext, "Value", no_semaphores)
    pieces = list(range(9))
    assert map_pieces(_where, pieces, [1] * 9, 3) == [(p * p, os.getpid()) for p in pieces]


def test_a_worker_killed_while_holding_the_counter_ends_the_wait(monkeypatch):
    """A worker killed inside the few instructions it holds the shared counter's lock leaves it held: the others wait
    for it a few seconds at a time, and between waits find the dead worker and say so, instead of waiting forever."""
    import multiprocessing

    from shardwise import forked

    monkeypatch.setattr(forked, "LOCK_CHECK_S", 0.1)
    ctx = multiprocessing.get_context("fork")
    taken = ctx.Value("i", 0)

    def die_holding_it():
        taken.get_lock().acquire()
        os._exit(9)

    proc = ctx.Process(target=die_holding_it)
    proc.start()
    proc.join()
    with pytest.raises(RuntimeError, match=r"a forked worker ended before answering \(exit code 9\)"):
        forked._take(_where, [1, 2], [0, 1], taken, lambda: forked._dead_worker([proc]))
