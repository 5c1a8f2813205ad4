"""A long `plan` shows how far its search is on a terminal (the issue's "show progress on long work"): a count of the
dp x tp x pp x cp splits taken, on stderr, drawn only after half a second and erased at the end; nothing on a pipe,
and the answer unchanged. The count comes from the search itself (forked.map_pieces' on_piece), in one process or
several."""

from __future__ import annotations

import json
import multiprocessing
import os
import pty
import select
import subprocess
import sys

from shardwise.console import SearchProgress
from shardwise.forked import map_pieces
from shardwise.planner.job import make_job
from shardwise.planner.search import search
from shardwise.specs import load_cluster, load_model


def _square(p: int) -> int:
    return p * p


def test_each_finished_piece_is_told_with_how_many_are_taken():
    told = []
    assert map_pieces(_square, list(range(5)), [1] * 5, 1, lambda k, n: told.append((k, n))) == [0, 1, 4, 9, 16]
    assert told == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    told.clear()
    meet = multiprocessing.get_context("fork").Barrier(2)

    def piece(p: int) -> int:
        if p < 2:
            meet.wait(60)  # the first two taken, one in each process: this one finishes at least one
        return _square(p)

    out = map_pieces(piece, list(range(40)), [1] * 40, 2, lambda k, n: told.append((k, n)))
    assert out == [p * p for p in range(40)]
    counts = [k for k, _ in told]  # this process's pieces only; the count is everyone's
    assert told and {n for _, n in told} == {40} and counts == sorted(counts) and 1 <= counts[0] and counts[-1] <= 40


def test_a_search_tells_its_progress_and_finds_the_same():
    job = make_job(load_model("llama2-13b"), load_cluster("dgx-h100-80gb"), 256, 4096, "megatron-core")
    told = []
    quiet = search(job, 64, workers=1)
    shown = search(job, 64, workers=1, progress=lambda k, n: told.append((k, n)))
    assert [(e.layout, e.step_time) for e in shown.ranked] == [(e.layout, e.step_time) for e in quiet.ranked]
    assert told[-1][0] == told[-1][1] > 1 and len(told) == told[-1][1]


def _later():
    """A clock that reads 0 at the start and a second on every later call: past the line's delay."""
    calls = []
    return lambda: 1.0 if calls.append(None) or len(calls) > 1 else 0.0


class _Tty:
    def __init__(self, tty: bool):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_the_line_waits_half_a_second_and_is_erased_at_the_end():
    now = [0.0]
    stream = _Tty(True)
    with SearchProgress(stream, clock=lambda: now[0], on=True) as progress:
        progress(1, 9)
        assert stream.text == ""  # a quick search draws nothing
        now[0] = 0.6
        progress(4, 9)
        assert stream.text.endswith("searching: 4 of 9 dp x tp x pp x cp splits taken")
    assert stream.text.endswith("\r\x1b[K")


def test_an_error_still_erases_the_line_and_a_terminal_gone_ends_the_count():
    stream = _Tty(True)
    try:
        with SearchProgress(stream, clock=_later(), on=True) as progress:
            progress(2, 9)
            raise KeyboardInterrupt  # Ctrl-C mid-search: the one-line message must start on a clean line
    except KeyboardInterrupt:
        pass
    assert stream.text.endswith("\r\x1b[K")

    class Gone(_Tty):
        def write(self, text):
            raise OSError(5, "Input/output error")

    with SearchProgress(Gone(True), clock=_later(), on=True) as progress:
        assert progress.on
        progress(2, 9)
        assert not progress.on  # no more tries, no error


def test_no_line_on_a_pipe_a_file_or_a_dumb_terminal(tmp_path, monkeypatch):
    with open(tmp_path / "err", "w") as file:
        assert not SearchProgress(file).on
    assert not SearchProgress(_Tty(True)).on  # no descriptor to ask about
    main, side = pty.openpty()
    try:
        with os.fdopen(os.dup(side), "w") as terminal:
            assert SearchProgress(terminal).on
            monkeypatch.setenv("TERM", "dumb")
            assert not SearchProgress(terminal).on
    finally:
        os.close(main)
        os.close(side)


def test_the_line_fits_one_row_of_a_narrow_terminal():
    main, side = pty.openpty()
    try:
        import fcntl
        import struct
        import termios

        fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))  # 40 columns
        with os.fdopen(os.dup(side), "w") as terminal:
            with SearchProgress(terminal, clock=_later(), on=True) as progress:
                progress(12, 55)
        assert select.select([main], [], [], 10)[0], "nothing drawn"
        drawn = os.read(main, 4096).decode()
    finally:
        os.close(main)
        os.close(side)
    first = drawn.split("\r\x1b[K")[1]
    assert first == "searching: 12 of 55 dp x tp x pp x cp splits taken"[:39]


# the line drawn at once (DELAY_S 0), so the test does not depend on how long the search takes on this machine
_SHELL = ("import sys, shardwise.console as c; c.SearchProgress.DELAY_S = 0; from shardwise.cli import main; "
          "sys.exit(main())")


def test_plan_on_a_terminal_shows_the_count_and_prints_the_same_answer():
    args = ["plan", "--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--gpus", "16384", "--global-batch",
            "2048", "--seq-len", "8192", "--json"]
    main, side = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", _SHELL, *args], stdout=subprocess.PIPE, stderr=side)
    os.close(side)
    seen = b""
    try:
        while select.select([main], [], [], 120)[0]:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the command ended: the terminal's other side closed
                break
            if not chunk:
                break
            seen += chunk
        out, _ = proc.communicate(timeout=120)
    finally:
        os.close(main)
        proc.kill()
        proc.wait()
    assert proc.returncode == 0
    assert b"searching: " in seen and b"dp x tp x pp x cp splits taken" in seen and seen.endswith(b"\r\x1b[K")
    piped = subprocess.run([sys.executable, "-c", _SHELL, *args], capture_output=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == b""
    assert out == piped.stdout  # the answer byte for byte
    assert json.loads(out)["best"]
