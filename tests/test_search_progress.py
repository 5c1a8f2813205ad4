"""A long `plan` shows how far its search is on a terminal (the issue's "show progress on long work"): a count of the
dp x tp x pp x cp splits taken, on stderr, drawn only after half a second and erased at the end; nothing on a pipe,
and the answer unchanged. The count comes from the search itself (forked.map_pieces' on_piece), in one process or
several."""

from __future__ import annotations

import json
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
    out = map_pieces(_square, list(range(40)), [1] * 40, 2, lambda k, n: told.append((k, n)))
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
    with SearchProgress(stream, clock=lambda: now[0]) as progress:
        progress(1, 9)
        assert stream.text == ""  # a quick search draws nothing
        now[0] = 0.6
        progress(4, 9)
        assert stream.text.endswith("searching: 4 of 9 dp x tp x pp x cp splits taken")
    assert stream.text.endswith("\r\x1b[K")
    piped = _Tty(False)
    with SearchProgress(piped, clock=lambda: 10.0) as progress:
        progress(4, 9)
    assert piped.text == ""


def test_plan_on_a_terminal_shows_the_count_and_prints_the_same_answer():
    argv = [sys.executable, "-m", "shardwise", "plan", "--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb",
            "--gpus", "16384", "--global-batch", "2048", "--seq-len", "8192", "--json"]
    main, side = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=side, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    os.close(side)
    seen = b""
    while True:
        ready, _, _ = select.select([main], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the command ended: the terminal's other side closed
            break
        if not chunk:
            break
        seen += chunk
    out, _ = proc.communicate(timeout=120)
    os.close(main)
    assert proc.returncode == 0
    assert b"searching: " in seen and b"dp x tp x pp x cp splits taken" in seen and seen.endswith(b"\r\x1b[K")
    piped = subprocess.run(argv, capture_output=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == b""
    assert json.loads(out)["best"] == json.loads(piped.stdout)["best"]
