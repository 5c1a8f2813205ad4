"""`shardwise train` checkpoints end to end, through the CLI and the launcher, against an uninterrupted run
of the same layout (dp 2, CPU, gloo, fp32), compared bitwise:

- a run split by --stop-after 5 and --resume;
- a run SIGKILLed while saving step 6 (after every shard is written, before the checkpoint is published):
  the half-written step_000006.tmp is ignored, the resume starts from step 3, and --keep 2 leaves the last two;
- a rank killed mid-run with --max-restarts 1: torchrun's agent restarts the job, which resumes from the
  newest checkpoint by itself and finishes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ARGS = ["--model", "tiny", "--dp", "2", "--steps", "10", "--global-batch", "8", "--seq-len", "32", "--seed", "11",
        "--timeout", "60"]

pytestmark = pytest.mark.slow


def _train(argv, env=None, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardwise", "train", *ARGS, *argv], env={**ENV, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def _metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _same(path, straight):
    got = _metrics(path)
    assert [r["step"] for r in got] == list(range(1, 11))
    for field in ("loss", "grad_norm", "lr"):
        assert [r[field] for r in got] == [r[field] for r in straight], field


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    m = tmp_path_factory.mktemp("straight") / "m.jsonl"
    proc = _train(["--no-progress", "--metrics-file", str(m)])
    assert proc.returncode == 0, proc.stderr
    return _metrics(m)


def test_stop_after_then_resume_is_bitwise(tmp_path, straight):
    ckpt, m = tmp_path / "ckpt", tmp_path / "m.jsonl"
    first = _train(["--checkpoint-dir", str(ckpt), "--stop-after", "5", "--metrics-file", str(m)])
    assert first.returncode == 0, first.stderr
    assert "trained 5 steps" in first.stdout and f"saved {ckpt / 'step_000005'}" in first.stdout
    second = _train(["--checkpoint-dir", str(ckpt), "--resume", "--metrics-file", str(m)])
    assert second.returncode == 0, second.stderr
    assert f"resumed from {ckpt / 'step_000005'} (step 5, saved by dp2·tp1·pp1 zero 0)" in second.stdout
    _same(m, straight)


def test_sigkill_while_saving_resumes_from_the_previous_checkpoint(tmp_path, straight):
    ckpt, m = tmp_path / "ckpt", tmp_path / "m.jsonl"
    opts = ["--checkpoint-dir", str(ckpt), "--save-every", "3", "--keep", "2", "--no-progress", "--metrics-file", str(m)]
    killed = _train(opts, env={"SHARDWISE_TEST_KILL_IN_SAVE": "6"})
    assert killed.returncode == 1
    assert "rank 0 died (exit code -9, SIGKILL)" in killed.stderr
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == ["step_000003", "step_000006.tmp"]
    half = ckpt / "step_000006.tmp"
    assert (half / ".metadata").exists() and list(half.glob("*.distcp")) and not (half / "manifest.json").exists()
    resumed = _train([*opts, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    _same(m, straight)
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_000009", "step_000010"]  # saves 6, 9, 10; keep 2


def test_elastic_restart_resumes_by_itself(tmp_path, straight):
    ckpt, m = tmp_path / "ckpt", tmp_path / "m.jsonl"
    proc = _train(["--checkpoint-dir", str(ckpt), "--save-every", "2", "--max-restarts", "1", "--metrics-file", str(m)],
                  env={"SHARDWISE_TEST_KILL_RANK": "1", "SHARDWISE_TEST_KILL_AT_STEP": "6"})
    assert proc.returncode == 0, proc.stderr
    # said, not silent: the restart, where it resumed, and which steps the last attempt trained
    assert "restart 1 of 1: rank 1 died (exit code 13), so every rank was started again; resuming from the newest " \
        "checkpoint" in proc.stdout
    assert f"resumed from {ckpt / 'step_000004'} (step 4" in proc.stdout
    assert re.search(r"trained \d+ steps \(steps 5-\d+\)", proc.stdout), proc.stdout
    _same(m, straight)


def test_an_elastic_restart_under_json_says_what_ended_the_first_attempt(tmp_path):
    """--json keeps stdout for the JSON: the restart is said on stderr, and the summary names the rank that died and
    the step the last attempt's records start at (the earlier steps are in the metrics file)."""
    import json

    ckpt, m = tmp_path / "ckpt", tmp_path / "m.jsonl"
    proc = _train(["--checkpoint-dir", str(ckpt), "--save-every", "2", "--max-restarts", "1", "--metrics-file", str(m),
                   "--json"], env={"SHARDWISE_TEST_KILL_RANK": "1", "SHARDWISE_TEST_KILL_AT_STEP": "6"})
    assert proc.returncode == 0, proc.stderr
    assert "restart 1 of 1: rank 1 died (exit code 13)" in proc.stderr, proc.stderr
    summary = json.loads(proc.stdout)["summary"]
    assert summary["restarts"] == 1 and summary["restarted_after"].startswith("rank 1 died (exit code 13)")
    assert summary["first_step"] == 5 and [json.loads(ln)["step"] for ln in m.read_text().splitlines()][0] == 1


def test_a_diverged_job_is_not_replayed_by_its_restarts(tmp_path):
    # every restart resumed from the last checkpoint before the nan and diverged again at the same step: each one
    # now stops at once on the note the first attempt left, and a new run in the folder clears the note
    ckpt = tmp_path / "ckpt"
    proc = _train(["--checkpoint-dir", str(ckpt), "--save-every", "2", "--max-restarts", "2", "--lr", "1e4",
                   "--grad-clip", "1e30"])
    assert proc.returncode == 1
    assert "training diverged at step" in proc.stderr and "(restart 2 stopped at once" in proc.stderr, proc.stderr
    assert "(the last of 3 attempts: --max-restarts 2 used)" in proc.stderr, proc.stderr  # why no restart followed
    assert (ckpt / "diverged.txt").read_text().startswith("training diverged at step")
    # a new job (--resume: the same settings, as a resume must be) is not held to the note: it runs, and diverges
    again = _train(["--checkpoint-dir", str(ckpt), "--save-every", "2", "--lr", "1e4", "--grad-clip", "1e30", "--resume"])
    assert again.returncode == 1 and "training diverged at step" in again.stderr
    assert "stopped at once" not in again.stderr, again.stderr
