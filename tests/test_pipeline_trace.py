"""`train --trace`: the executor's records of a real pipeline run become a Chrome trace and a picture of
the measured timeline beside the simulated one (same schedule, the run's own per-stage costs)."""

from __future__ import annotations

import json
import os

from shardwise.launch import spawn_ranks
from shardwise.parallel import build_mesh
from shardwise.trace import measured_costs, write_trace
from shardwise.schedules import build
from shardwise.specs import Layout, load_model
from shardwise.timeline import Event
from shardwise.train import TrainConfig, train


def _worker(rank, world, out_dir):
    cfg = TrainConfig(load_model("tiny"), Layout(pp=2, micro_batch=1, schedule="1f1b"), steps=2, global_batch=4,
                      seq_len=16, progress=False, trace_dir=out_dir)
    rt = train(cfg, build_mesh(2, 1, 1, backend="gloo", timeout_s=60)).runtime
    summary = write_trace(rt.forward_backward.executor, out_dir, "tiny, pp 2, 1F1B")
    if rank == 0:
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f)


def test_trace_files_from_a_real_run(tmp_path):
    spawn_ranks(_worker, 2, str(tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    trace = json.loads((tmp_path / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    # 2 steps x 2 ranks x (4 F + 4 B) compute events, plus the receives
    assert sum(e["cat"] in ("F", "B") for e in spans) == 2 * 2 * 8
    assert {e["pid"] for e in spans} == {1, 2}  # rank + 1
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {1: "pipeline rank 0 (rank 0)", 2: "pipeline rank 1 (rank 1)"}  # the stage, and who ran it
    # every exchange a rank waits in is one record: the program the planner times is the one that ran
    from shardwise.schedules.p2p import Exchange, p2p_program

    for rank, program in enumerate(p2p_program(build("1f1b", 2, 4))):
        waited = sum(isinstance(x, Exchange) and x.wait for x in program)
        assert sum(e["pid"] == rank + 1 and e["cat"] in ("recv", "send") for e in spans) == 2 * waited
    assert (tmp_path / "timeline.png").stat().st_size > 10_000 and (tmp_path / "timeline.svg").exists()
    assert 0.0 < summary["measured_bubble"] < 1.0 and 0.0 < summary["simulated_bubble"] < 1.0
    # each transfer says what moved and with whom (rank 0 sends activations to 1 and receives gradients from it),
    # and the steps are marked across every track
    comm = {e["pid"]: set() for e in spans}
    for e in spans:
        if e["cat"] in ("send", "recv"):
            comm[e["pid"]].add(e["name"])
    assert any("activation mb0 to rank 1" in n for n in comm[1]) and any("gradient mb0 from rank 1" in n for n in comm[1])
    assert any("activation mb0 from rank 0" in n for n in comm[2]) and any("gradient mb3 to rank 0" in n for n in comm[2])
    marks = [e for e in trace["traceEvents"] if e.get("ph") == "i"]
    assert [m["name"] for m in marks] == ["step 1", "step 2"] and marks[0]["ts"] < marks[1]["ts"]


def test_measured_costs_are_the_median_durations_per_stage():
    sched = build("zb-h1", 2, 2)
    evs = [Event(0, "F", 0, 0, 0, 1), Event(0, "F", 1, 0, 1, 4), Event(1, "F", 0, 0, 1, 3), Event(1, "I", 0, 0, 3, 4),
           Event(1, "W", 0, 0, 4, 9), Event(1, "recv", 0, 0, 0.5, 1.0)]
    c = measured_costs(sched, evs)
    assert c.f == [2.0, 2.0] and c.b == [0.0, 1.0] and c.w == [0.0, 5.0] and c.c == 0.5
    # one stalled forward among three is not charged to every micro-batch of its stage (the mean would say 61)
    stalled = evs + [Event(0, "F", 0, 0, 10, 11), Event(0, "F", 1, 0, 11, 190)]
    assert measured_costs(sched, stalled).f[0] == 2.0


def test_train_cli_runs_a_pipeline_with_trace(tmp_path):
    import subprocess
    import sys

    metrics = tmp_path / "m.jsonl"
    cmd = [sys.executable, "-m", "shardwise", "train", "--model", "tiny", "--pp", "2", "--schedule", "zb-h1",
           "--microbatches", "4", "--steps", "2", "--global-batch", "4", "--seq-len", "16", "--no-progress",
           "--metrics-file", str(metrics), "--trace", str(tmp_path / "trace")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "bubble measured" in out.stdout
    assert len(metrics.read_text().splitlines()) == 2
    assert (tmp_path / "trace" / "timeline.png").exists() and (tmp_path / "trace" / "trace.json").exists()



def test_a_traced_run_with_data_parallelism_records_every_replicas_pipeline(tmp_path):
    """dp 2 x pp 2: the trace holds all four ranks on one time axis (it held replica 0's two, and said nothing of the
    others), each with every step's forwards and backwards of its own micro-batches."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "shardwise", "train", "--model", "tiny", "--pp", "2", "--dp", "2", "--microbatches", "2",
           "--steps", "2", "--global-batch", "8", "--seq-len", "16", "--no-progress", "--trace", str(tmp_path / "t")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    trace = json.loads((tmp_path / "t" / "trace.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert sorted(names.values()) == ["pipeline rank 0 (rank 0)", "pipeline rank 0 (rank 1)",
                                      "pipeline rank 1 (rank 2)", "pipeline rank 1 (rank 3)"], names
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["cat"] in ("F", "B")]
    assert all(sum(e["pid"] == pid for e in spans) == 2 * 2 * 2 for pid in names)  # steps x (F + B) x micro-batches
