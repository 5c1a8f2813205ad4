"""forked.map_hands: pieces spread over forked processes come back in the pieces' order, as one process gives them,
and a worker's failure is raised in the parent with the worker's traceback (no hang, no partial answer)."""

from __future__ import annotations

import os
import signal

import pytest

from shardwise.forked import deal, map_hands, worker_count


def _where(piece: int) -> tuple[int, int]:
    return piece * piece, os.getpid()


def test_pieces_come_back_in_order_from_several_processes():
    pieces = list(range(23))
    hands = deal([1 + (p % 5) for p in pieces], 3)
    out = map_hands(_where, pieces, hands)
    assert [v for v, _ in out] == [p * p for p in pieces]
    pids = {pid for _, pid in out}
    assert os.getpid() in pids and len(pids) == 3  # the first hand here, the other two forked
    assert map_hands(_where, pieces, [pieces])[5] == (25, os.getpid())  # one hand: all here


def _fails_on_seven(piece: int) -> int:
    if piece == 7:
        raise ValueError("piece seven is bad")
    return piece


def test_a_workers_failure_is_raised_here_with_its_traceback():
    pieces = list(range(12))
    hands = [[i for i in pieces if i % 2 == 0], [i for i in pieces if i % 2]]  # 7 is in the forked hand
    with pytest.raises(RuntimeError, match="piece seven is bad"):
        map_hands(_fails_on_seven, pieces, hands)


def test_small_work_stays_in_one_process():
    assert worker_count(None, 10, 400) == 1
    assert worker_count(3, 10, 400) == 3  # asked for


def _signals(piece: int):
    return piece, signal.getsignal(signal.SIGINT) is signal.SIG_DFL, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_worker_ends_silently_on_ctrl_c_or_terminate_whatever_handlers_the_parent_has():
    """The CLI's process raises on SIGTERM (interrupt.cli_handlers) and Python on SIGINT; a worker inheriting those
    printed a traceback when terminate() reached it while it was exiting. Its own are the system's defaults."""
    def _raise(signum, frame):
        raise KeyboardInterrupt

    # Python's own SIGINT handler, as in a terminal (a suite started in a script's background inherits it ignored)
    old = signal.signal(signal.SIGTERM, _raise), signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        out = map_hands(_signals, [0, 1], [[0], [1]])
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])
    assert out[0] == (0, False, False)  # this process keeps its handlers
    assert out[1] == (1, True, True)  # the forked worker's are the defaults


def _ignores_sigint(piece: int):
    return piece, signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_worker_keeps_ignoring_a_signal_the_command_was_started_ignoring():
    """`shardwise plan ... &` from a script starts with SIGINT ignored: its forked workers ignore it too, so a SIGINT
    to the group does not end them under a parent that goes on."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        out = map_hands(_ignores_sigint, [0, 1], [[0], [1]])
    finally:
        signal.signal(signal.SIGINT, old)
    assert out == [(0, True), (1, True)]
