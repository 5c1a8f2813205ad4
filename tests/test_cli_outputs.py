"""What commands write: output folders created before any work (an impossible path is one line, exit 2); --json."""

import pytest

from shardwise.cli import main


def test_simulate_creates_the_output_folders(tmp_path):
    out, trace = tmp_path / "a" / "b" / "t.png", tmp_path / "c" / "t.json"
    assert main(["simulate", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--out", str(out),
                 "--trace", str(trace), "--json"]) == 0
    assert out.stat().st_size > 0 and trace.stat().st_size > 0


def test_unwritable_output_is_a_usage_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where a folder would have to be
    code = main(["simulate", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--out", str(blocker / "t.png")])
    err = capsys.readouterr().err
    assert code == 2 and "--out" in err and len(err.strip().splitlines()) == 1


def test_train_json_prints_records_and_summary(tmp_path):
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "shardwise", "train", "--model", "tiny", "--steps", "2", "--global-batch", "4",
                          "--seq-len", "16", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [r["step"] for r in data["records"]] == [1, 2]
    assert data["summary"]["steps"] == 2 and data["summary"]["layout"]["dp"] == 1
    # the contract of issue 10: the run's memory (first step, states + saved activations) and the planner's
    summary = data["summary"]
    assert summary["memory_measured_gib"] == pytest.approx(summary["memory_predicted_gib"], rel=0.01)
    assert summary["memory_measured_gib"] > 0
