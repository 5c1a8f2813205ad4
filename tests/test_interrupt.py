"""Ctrl-C and SIGTERM on a real multi-process `shardwise train --dp 2`: exit 130 / 143, one line on stderr, no
traceback, no process of the job left running.

Ctrl-C is a SIGINT to the terminal's whole process group (launcher and ranks alike); SIGTERM comes from a
scheduler or `kill` to the launcher alone. Both jobs run at once (each in its own session, so its processes
can be found afterwards) to share their start-up time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CASES = {"ctrl-c": (signal.SIGINT, True, 130), "sigterm": (signal.SIGTERM, False, 143)}


def _alive_in_session(sid: int) -> list[str]:
    """Processes of session `sid` that still run (a zombie has ended; init reaps it)."""
    alive = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                alive.append(f"{proc.name} ({fields[0]})")
    return alive


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the job's processes through /proc (Linux)")
def test_ctrl_c_and_sigterm_stop_a_multi_process_run_in_one_line(tmp_path):
    jobs = {}
    for name in CASES:
        metrics = tmp_path / f"{name}.jsonl"
        cmd = [sys.executable, "-m", "shardwise", "train", "--model", "tiny", "--dp", "2", "--steps", "100000",
               "--global-batch", "4", "--seq-len", "16", "--no-progress", "--metrics-file", str(metrics)]
        jobs[name] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       start_new_session=True), metrics)
    try:
        deadline = time.monotonic() + 300
        for name, (proc, metrics) in jobs.items():  # both train (two steps written) before either is stopped
            while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the job did not start training"
                time.sleep(0.2)
        for name, (proc, _) in jobs.items():
            sig, whole_group, code = CASES[name]
            start = time.monotonic()
            os.killpg(proc.pid, sig) if whole_group else os.kill(proc.pid, sig)
            _, err = proc.communicate(timeout=60)
            took = time.monotonic() - start
            lines = err.strip().splitlines()
            # Stopped, not timed out: far below the job's 300 s collective timeout.
            assert proc.returncode == code and took < 20, (name, proc.returncode, took, err)
            assert len(lines) == 1 and lines[0].startswith(f"shardwise: interrupted by {sig.name}"), err
            left = _alive_in_session(proc.pid)
            for _ in range(50):  # ranks the launcher stopped may take a moment to be gone
                if not left:
                    break
                time.sleep(0.1)
                left = _alive_in_session(proc.pid)
            assert not left, (name, left)
    finally:
        for proc, _ in jobs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
