"""forked.map_pieces: pieces spread over forked processes come back in the pieces' order, as one process gives them;
each process takes the costliest piece left when it is free (so one long piece does not hold back cheap ones dealt
beside it); a piece's exception is raised in the parent whichever process ran it; and a worker that ends without
answering is named, never waited for.

Which process takes which piece is left to the scheduler; where a test needs each process to hold one piece, the
pieces meet at a barrier (a process waiting there cannot take another), never a sleep."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from shardwise import forked
from shardwise.forked import claim_order, map_pieces, worker_count

FORK = multiprocessing.get_context("fork")


def _where(piece: int) -> tuple[int, int]:
    return piece * piece, os.getpid()


def test_pieces_come_back_in_order_from_several_processes():
    pieces = list(range(23))
    costs = [1 + (p % 5) for p in pieces]  # the costliest three, taken first: 4, 9 and 14
    meet = FORK.Barrier(3)

    def piece(p: int) -> tuple[int, int]:
        if p in (4, 9, 14):
            meet.wait(60)  # each of the three processes holds one of them
        return _where(p)

    out = map_pieces(piece, pieces, costs, 3)
    assert [v for v, _ in out] == [p * p for p in pieces]
    assert len({pid for _, pid in out}) == 3 and os.getpid() in {pid for _, pid in out}
    assert map_pieces(_where, pieces, [1] * 23, 1) == [(p * p, os.getpid()) for p in pieces]  # one process: all here


def test_the_costliest_piece_is_taken_first():
    assert claim_order([1, 5, 3, 5, 0]) == [1, 3, 2, 0, 4]  # ties in piece order


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


def test_a_pieces_failure_is_raised_here_whichever_process_ran_it():
    pieces = list(range(12))
    for n in (1, 2, 3):
        with pytest.raises(ValueError, match="piece seven is bad"):
            map_pieces(_fails_on_seven, pieces, [10 if p == 7 else 1 for p in pieces], n)


def test_a_forked_workers_failure_comes_back_as_itself_with_its_traceback():
    here, meet = os.getpid(), FORK.Barrier(2)

    def piece(i: int) -> int:
        meet.wait(60)  # one piece each
        if os.getpid() != here:
            raise KeyError(f"piece {i} failed in a forked worker")
        return i

    with pytest.raises(KeyError, match="failed in a forked worker") as caught:
        map_pieces(piece, [0, 1], [1, 1], 2)
    assert "in a forked worker" in str(caught.value.__cause__) and "Traceback" in str(caught.value.__cause__)


class _Unbuildable(Exception):
    def __init__(self, a, b):  # pickles, but cannot be rebuilt from its args
        super().__init__(f"{a}{b}")


def test_an_exception_that_cannot_be_rebuilt_comes_back_as_its_traceback():
    here, meet = os.getpid(), FORK.Barrier(2)

    def piece(i: int) -> int:
        meet.wait(60)
        if os.getpid() != here:
            raise _Unbuildable("odd", "one")
        return i

    with pytest.raises(RuntimeError, match="(?s)a forked worker failed.*_Unbuildable: oddone"):
        map_pieces(piece, [0, 1], [1, 1], 2)


def test_small_work_stays_in_one_process():
    assert worker_count(None, 10, 400) == 1
    assert worker_count(3, 10, 400) == 3  # asked for


def test_a_worker_ends_silently_on_ctrl_c_or_terminate_whatever_handlers_the_parent_has():
    """The CLI's process raises on SIGTERM (interrupt.cli_handlers) and Python on SIGINT; a worker inheriting those
    printed a traceback when terminate() reached it while it was exiting. Its own are the system's defaults."""
    meet = FORK.Barrier(2)

    def signals(piece: int):
        meet.wait(60)
        return (os.getpid(), signal.getsignal(signal.SIGINT) is signal.SIG_DFL,
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)

    def _raise(signum, frame):
        raise KeyboardInterrupt

    # Python's own SIGINT handler, as in a terminal (a suite started in a script's background inherits it ignored)
    old = signal.signal(signal.SIGTERM, _raise), signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        out = map_pieces(signals, [0, 1], [2, 1], 2)
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])
    assert sorted(pid == os.getpid() for pid, _, _ in out) == [False, True]  # one piece here, one in the worker
    for pid, sigint_default, sigterm_default in out:
        assert sigint_default is sigterm_default is (pid != os.getpid())  # this process keeps its handlers; the
        # forked worker's are the defaults


def test_a_worker_keeps_ignoring_a_signal_the_command_was_started_ignoring():
    """`shardwise plan ... &` from a script starts with SIGINT ignored: its forked workers ignore it too, so a SIGINT
    to the group does not end them under a parent that goes on."""
    meet = FORK.Barrier(2)

    def ignores_sigint(piece: int):
        meet.wait(60)
        return os.getpid(), signal.getsignal(signal.SIGINT) is signal.SIG_IGN

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        out = map_pieces(ignores_sigint, [0, 1], [1, 1], 2)
    finally:
        signal.signal(signal.SIGINT, old)
    assert out[0][0] != out[1][0] and all(ignored for _, ignored in out)


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
    monkeypatch.setattr(forked, "LOCK_CHECK_S", 0.1)
    taken = FORK.Value("i", 0)

    def die_holding_it():
        taken.get_lock().acquire()
        os._exit(9)

    proc = FORK.Process(target=die_holding_it)
    proc.start()
    proc.join()
    with pytest.raises(RuntimeError, match=r"a forked worker ended before answering \(exit code 9\)"):
        forked._take(_where, [1, 2], [0, 1], taken, lambda: forked._dead_worker([proc]))


def test_the_parent_names_a_worker_killed_holding_the_lock_after_its_own_share(monkeypatch, tmp_path: Path):
    """The parent has taken its last piece and waits for the workers' answers; then the second worker dies holding the
    counter's lock, and the first, asking for its next piece, waits on that lock. The parent names the dead worker
    instead of waiting for the first one's answer forever (found by a review, 2026-12-07)."""
    monkeypatch.setattr(forked, "LOCK_CHECK_S", 0.1)
    here, meet, held = os.getpid(), FORK.Barrier(3), tmp_path / "held"
    values = []
    real = FORK.Value
    monkeypatch.setattr(type(FORK), "Value", lambda self, *a, **k: values.append(real(*a, **k)) or values[-1])

    def piece(i: int) -> int:
        me = multiprocessing.current_process()._identity  # a worker's creation number: (k,), the later one larger
        (tmp_path / f"w{'-'.join(map(str, me))}").touch()
        meet.wait(60)  # one piece each
        if os.getpid() == here:
            return i
        workers = sorted(tuple(map(int, p.name[1:].split("-"))) for p in tmp_path.iterdir()
                         if p.name.startswith("w") and p.name[1:])
        taken, second = values[0], workers[-1] == me
        deadline = time.monotonic() + 60
        if second:  # once the parent has taken its last piece (the counter past the end), die holding the lock
            while taken.value < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            taken.get_lock().acquire()
            held.touch()
            os._exit(9)
        while not held.exists() and time.monotonic() < deadline:  # the first: asks for its next piece after that
            time.sleep(0.01)
        return i

    with pytest.raises(RuntimeError, match=r"a forked worker ended before answering \(exit code 9\)"):
        map_pieces(piece, [0, 1, 2], [1, 1, 1], 3)
