"""contention.py: other processes' CPU use while a job runs (Linux /proc/stat against our own rusage)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardwise.contention import BUSY_NEIGHBOURS, OtherCpu, _sample, busy_seconds, neighbours_note, other_cores


def test_busy_seconds_counts_everything_but_idle_and_iowait():
    # user nice system idle iowait irq softirq steal guest guest_nice, in ticks of 1/100 s
    line = "cpu  1000 20 300 90000 400 5 6 70 111 0"
    assert busy_seconds(line, 100) == pytest.approx((1000 + 20 + 300 + 5 + 6 + 70) / 100)
    assert busy_seconds("cpu 1 2 3 4", 1) == pytest.approx(6)  # an old kernel's four fields


def test_other_cores_is_the_machines_busy_time_less_ours_per_wall_second():
    start, end = (10.0, 100.0, 5.0), (12.0, 103.0, 6.0)  # 2 s: the machine busy 3 CPU s, ours 1
    assert other_cores(start, end) == pytest.approx(1.0)
    assert other_cores(start, (12.0, 101.0, 7.0)) == 0.0  # tick rounding can put ours above the machine's
    assert other_cores(start, start) == 0.0


def test_a_waited_for_child_counts_as_ours():
    """The ranks of a job are its children, waited for before the block ends: their CPU time is ours, not
    another process's (what makes `OtherCpu` usable around `run_ranks`)."""
    if _sample() is None:
        pytest.skip("no /proc/stat on this system: OtherCpu reports None (tested below)")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    before = _sample()
    subprocess.run([sys.executable, "-c", burn], check=True)
    after = _sample()
    assert after[2] - before[2] >= 0.3  # the child's CPU seconds are in our rusage
    with OtherCpu() as other:
        subprocess.run([sys.executable, "-c", burn], check=True)
    assert other.cores is not None and other.cores >= 0


def _burn(rank: int, world: int) -> None:
    import time

    t = time.process_time()
    while time.process_time() - t < 0.5:
        pass


def test_ranks_forked_from_the_fork_server_count_as_ours():
    """run_ranks forks the ranks from a fork server this process started: they are the server's children, not
    ours, so getrusage misses them; without the server's /proc/<pid>/stat (its reaped children) two ranks burning
    0.5 s of CPU each would show as another process's ~1 s."""
    if _sample() is None:
        pytest.skip("no /proc/stat on this system: OtherCpu reports None (tested below)")
    from shardwise.contention import fork_server_seconds
    from shardwise.launch import spawn_ranks

    before = _sample()
    spawn_ranks(_burn, 2)
    after = _sample()
    assert fork_server_seconds() > 0  # the server ran (its preload) and reaped the ranks
    assert after[2] - before[2] >= 2 * 0.5  # both ranks' CPU seconds are ours


def test_unknown_without_proc_stat(monkeypatch):
    import shardwise.contention as c

    monkeypatch.setattr(c, "_sample", lambda: None)
    with OtherCpu() as other:
        pass
    assert other.cores is None
    with OtherCpu(enabled=False) as off:
        pass
    assert off.cores is None


def test_neighbours_note_only_above_the_threshold():
    assert neighbours_note("the sweep", None) is None
    assert neighbours_note("the sweep", BUSY_NEIGHBOURS) is None
    note = neighbours_note("the sweep", 0.9)
    assert "0.9" in note and "the sweep" in note
