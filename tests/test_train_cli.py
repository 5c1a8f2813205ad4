"""`shardwise train` end to end: bad input, the launcher, --plan, a dying rank, a hung rank, a killed launcher, two
torchrun "nodes"."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from shardwise.launch import free_port
from shardwise.cli import build_parser, main
from shardwise.commands.train import config_from
from shardwise.train import train

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _config(argv: list[str]):
    argv = ["train", *argv]
    return config_from(build_parser(argv).parse_args(argv))


def _reference_losses(argv: list[str]) -> list[float]:
    """The same job in this process: one rank, no torch.distributed, the CLI's own hyper-parameters."""
    cfg = _config(argv + ["--no-progress"])
    assert cfg.layout.world_size == 1
    return train(cfg).losses


def _metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _assert_same_losses(records, reference):
    assert [r["step"] for r in records] == list(range(1, len(reference) + 1))
    for r, ref in zip(records, reference):
        assert set(r) >= {"step", "loss", "step_time_s", "tokens_per_s", "lr", "grad_norm"}
        assert r["loss"] == pytest.approx(ref, rel=1e-5)
        assert r["step_time_s"] > 0 and r["tokens_per_s"] > 0


@pytest.mark.parametrize("argv, expected", [
    (["--model", "nope"], "unknown model 'nope'"),
    (["--tp", "4"], "does not divide the 2 KV heads"),
    (["--tp", "3"], "does not divide the 4 attention heads"),
    (["--model", "tiny-gpt2", "--tp", "8"], "does not divide the 4 attention heads"),
    (["--dp", "3"], "not divisible by dp=3"),
    (["--dp", "0"], "--dp must be at least 1"),
    (["--backend", "nccl"], "backend nccl needs CUDA GPUs"),
    (["--pp", "2", "--dp", "2", "--zero", "2", "--schedule", "zb-h1"], "zb-h1 splits each backward"),
    (["--trace", "/tmp/x"], "use it with --pp 2 or more"),
    (["--pp", "8"], "exceed the 4 layers"),
    (["--seq-len", "1000"], "exceeds the 256 positions"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--dp", "2", "--microbatches", "3"], "--microbatches 3 does not divide"),
    (["--micro-batch", "2", "--microbatches", "2"], "not both"),
    (["--tp", "2", "--sequence-parallel", "--seq-len", "63"], "--seq-len 63 is not divisible"),
    (["--plan", "/nonexistent/plan.json"], "plan file '/nonexistent/plan.json' not found"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_process_group(argv, expected, capsys):
    assert main(["train", *argv, "--steps" if "--steps" not in argv else "--seed", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shardwise: error: ") and expected in err and "\n" not in err
    assert not dist.is_initialized()


@pytest.mark.parametrize("content, expected", [
    ("not json", "malformed JSON"),
    ('{"candidates": []}', "no layout found"),
    ('{"best": {"dp": 2, "tp": "x", "pp": 1}}', "'tp' must be int"),
    ('{"best": {"dp": 2, "tp": 1, "pp": 1, "zero": 7}}', "'zero' is 7, which no layout has (it must be one of 0, 1, 2, 3)"),
    # a plan's values are said as the plan's keys (not as flags nobody typed), whatever the layout would ignore
    ('{"best": {"dp": 1, "tp": 1, "pp": 1, "schedule": "bogus"}}', "'schedule' is 'bogus', which no layout has"),
    ('{"best": {"dp": 1, "tp": 1, "pp": 1, "micro_batch": 0}}', "'micro_batch' is 0, which no layout has (it must be at least 1)"),
    ('{"best": {"dp": -1, "tp": 1, "pp": 1, "dp_shard": 2}}', "'dp' is -1, which no layout has"),
    ('{"best": {"dp": 1, "tp": 1, "pp": 1, "cp_mode": "bogus"}}', "'cp_mode' is 'bogus', which no layout has"),
])
def test_bad_plan_file(content, expected, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(content)
    assert main(["train", "--plan", str(plan)]) == 2
    assert expected in capsys.readouterr().err


def test_world_size_under_torchrun_must_match_the_layout(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(["train", "--dp", "2"]) == 2
    assert "torchrun started 3 processes but dp*tp*pp = 2*1*1 = 2" in capsys.readouterr().err
    assert not dist.is_initialized()


def test_plan_layout_and_flags(tmp_path, capsys):
    """The "best" entry of `shardwise plan --json` is read as is; a contradicting flag is an error."""
    assert main(["plan", "--model", "tiny", "--cluster", "dgx-a100-80gb", "--gpus", "4",
                 "--global-batch", "8", "--seq-len", "64", "--json"]) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(capsys.readouterr().out)
    best = json.loads(plan.read_text())["best"]
    layout = _config(["--plan", str(plan)]).layout
    assert (layout.dp, layout.tp, layout.pp, layout.micro_batch, layout.zero) == \
        (best["dp"], best["tp"], best["pp"], best["micro_batch"], best["zero"])
    bare = tmp_path / "layout.json"
    bare.write_text(json.dumps({"dp": 2, "tp": 2, "pp": 1, "sequence_parallel": True}))
    layout = _config(["--plan", str(bare), "--global-batch", "8"]).layout
    assert (layout.dp, layout.tp, layout.sequence_parallel, layout.micro_batch) == (2, 2, True, 4)
    assert main(["train", "--plan", str(bare), "--tp", "1"]) == 2
    assert "--tp 1 contradicts tp=2" in capsys.readouterr().err


def test_summary_reports_dp_shard_as_estimate_does(capsys):
    """train --json's layout says dp_shard as `estimate --json` does: the shard group's dp ranks (all of dp when not
    hybrid), not the Layout's 0, so the same layout reads the same in both and train --plan takes it back."""
    from shardwise.train import summary_dict

    cfg = _config(["--dp", "4", "--zero", "3", "--global-batch", "8"])
    assert cfg.layout.dp_shard == 0  # the dataclass's "not hybrid"
    layout = summary_dict([{"loss": 1.0, "step_time_s": 0.1}], cfg)["layout"]
    assert main(["estimate", "--model", "tiny", "--cluster", "dgx-a100-80gb", "--gpus", "4", "--dp", "4", "--tp", "1",
                 "--pp", "1", "--zero", "3", "--global-batch", "8", "--seq-len", "64", "--json"]) == 0
    estimated = json.loads(capsys.readouterr().out)
    assert layout["dp_shard"] == estimated["dp_shard"] == 4
    assert set(cfg.layout.to_dict()) <= set(layout)  # every field still there


def load_model_params(name: str) -> int:
    from shardwise.specs import load_model

    return load_model(name).num_params()


def test_a_plan_brings_its_own_batch_and_sequence(tmp_path, capsys):
    # the plan's `job` (plan --json echoes it) sets the global batch and sequence length train runs; a flag or model
    # that contradicts it is one line
    assert main(["plan", "--model", "tiny", "--cluster", "dgx-a100-80gb", "--gpus", "2", "--global-batch", "16",
                 "--seq-len", "128", "--framework", "shardwise", "--json"]) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(capsys.readouterr().out)
    cfg = _config(["--plan", str(plan)])
    assert (cfg.global_batch, cfg.seq_len) == (16, 128)
    assert (cfg.global_batch, cfg.seq_len) == (_config(["--plan", str(plan), "--global-batch", "16"]).global_batch, 128)
    for argv, words in ((["--global-batch", "8"], "--global-batch 8 contradicts global_batch=16"),
                        (["--model", "tiny-gpt2"], "is a plan for tiny .* parameters\\), and --model tiny-gpt2 has"),
                        (["--microbatches", "0"], "--microbatches must be at least 1")):
        assert main(["train", "--plan", str(plan), *argv]) == 2
        assert re.search(words, capsys.readouterr().err), argv
    assert (_config([]).global_batch, _config([]).seq_len) == (8, 64)  # no plan: train's own defaults
    # --model not given: the plan's preset; a plan for a model named by a file says to name it
    assert main(["plan", "--model", "tiny-gpt2", "--cluster", "dgx-a100-80gb", "--gpus", "2", "--global-batch", "16",
                 "--seq-len", "64", "--framework", "shardwise", "--json"]) == 0
    other = tmp_path / "other.json"
    other.write_text(capsys.readouterr().out)
    assert _config(["--plan", str(other)]).spec.num_params() == load_model_params("tiny-gpt2")
    other.write_text(other.read_text().replace('"model": "tiny-gpt2"', '"model": "my-config"'))
    assert main(["train", "--plan", str(other)]) == 2
    assert "--model tiny (--model not given) has" in capsys.readouterr().err
    # the same model from a file of another name is the plan's model (its parameters, not its name, say so)
    from shardwise.specs import load_model

    copy = tmp_path / "mine.json"
    copy.write_text(json.dumps(load_model("tiny").to_hf_config()))
    assert _config(["--plan", str(plan), "--model", str(copy)]).global_batch == 16


@pytest.mark.slow
def test_launcher_runs_a_plan_and_matches_one_process(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"best": {"dp": 2, "tp": 2, "pp": 1, "micro_batch": 2, "zero": 1,
                                         "sequence_parallel": True, "schedule": "1f1b", "recompute": "none"}}))
    args = ["--model", "tiny", "--steps", "3", "--global-batch", "8", "--seq-len", "32", "--seed", "7"]
    metrics = tmp_path / "m.jsonl"
    proc = subprocess.run([sys.executable, "-m", "shardwise", "train", "--plan", str(plan), *args,
                           "--metrics-file", str(metrics), "--timeout", "60"],
                          env=ENV, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "trained 3 steps" in proc.stdout
    _assert_same_losses(_metrics(metrics), _reference_losses(args))


@pytest.mark.parametrize("dp", [1, 2])
def test_a_diverged_run_stops_at_its_first_nan_step(dp, tmp_path):
    # a learning rate of 1e4 with clipping off: the gradient norm is nan at step 4. The run stopped there, one line,
    # exit 1, and the metrics file and --json stay strict JSON (they had carried bare NaN, which JSON does not have,
    # through to the last step, exit 0)
    metrics = tmp_path / "m.jsonl"
    proc = subprocess.run([sys.executable, "-m", "shardwise", "train", "--dp", str(dp), "--steps", "8", "--lr", "1e4",
                           "--grad-clip", "1e30", "--seq-len", "32", "--global-batch", "4", "--no-progress", "--json",
                           "--metrics-file", str(metrics)], env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert re.search(r"training diverged at step (\d+) \(grad norm nan\): stopped there", proc.stderr)
    step = int(re.search(r"at step (\d+)", proc.stderr).group(1))
    assert "JobFailed" not in proc.stderr and json.loads(proc.stdout)["exit_code"] == 1
    records = [json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in the metrics")) for line in
               metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, step))


@pytest.mark.slow
def test_a_dying_rank_stops_the_job_and_is_named(tmp_path):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "shardwise", "train", "--dp", "2", "--steps", "50", "--seq-len", "32",
                           "--no-progress", "--timeout", "60", "--json"],
                          env={**ENV, "SHARDWISE_TEST_KILL_RANK": "1", "SHARDWISE_TEST_KILL_AT_STEP": "2"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "shardwise: error: training stopped: rank 1 died (exit code 13)" in proc.stderr
    assert json.loads(proc.stdout)["error"].startswith("training stopped: rank 1 died")  # --json: stdout still parses
    assert time.monotonic() - start < 60  # the agent noticed; nobody waited for the collective timeout


@pytest.mark.slow
def test_a_hung_rank_is_named_and_the_job_ends_soon_after_the_timeout(tmp_path):
    """A rank that stops answering (here SIGSTOPped: no signal but SIGKILL reaches it) fails no collective itself:
    its peers time out after --timeout, and the job names it, not them. The launch then gives the stopped rank a few
    seconds, not torch's default 30, before SIGKILL."""
    stopped = tmp_path / "stopped"
    proc = subprocess.run([sys.executable, "-m", "shardwise", "train", "--pp", "2", "--microbatches", "4", "--steps",
                           "50", "--seq-len", "32", "--no-progress", "--timeout", "5"],
                          env={**ENV, "SHARDWISE_TEST_KILL_RANK": "1", "SHARDWISE_TEST_KILL_AT_STEP": "2",
                               "SHARDWISE_TEST_HANG": str(stopped)},
                          capture_output=True, text=True, timeout=120)
    ended = time.time()
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("shardwise: error: training stopped: rank 1 stopped answering (hung or stopped): rank 0 "
                          "waited --timeout 5 s for it and failed:"), err
    assert ".cc:" not in err  # gloo's source location is not the user's business
    assert ended - float(stopped.read_text()) < 28  # 5 s timeout + 2 x 3 s grace; torch's default grace alone is 30


@pytest.mark.slow
def test_ranks_end_when_their_launcher_is_killed_outright(tmp_path):
    """SIGKILL (or the OOM killer) gives the launcher no chance to stop its ranks, and their fork server stays up while
    they run: each rank watches the launcher and ends when it has gone, leaving nothing of the job behind."""
    import signal

    metrics = tmp_path / "m.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "shardwise", "train", "--dp", "2", "--steps", "100000", "--seq-len",
                             "32", "--no-progress", "--metrics-file", str(metrics)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def session() -> list[str]:
        return subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()

    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2) and time.monotonic() < deadline:
        time.sleep(0.5)  # training: both ranks are up
    assert metrics.exists(), "the job did not start"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while session() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = session()
    for pid in left:  # (clean up before failing)
        os.kill(int(pid), signal.SIGKILL)
    assert not left, f"still running after the launcher was killed: {left}"


@pytest.mark.slow
def test_two_torchrun_nodes_train_and_match(tmp_path):
    """Two torchrun agents (--nnodes 2, one rank each) meet at a loopback c10d rendezvous: dp=2 across "nodes"."""
    args = ["--model", "tiny-gpt2", "--steps", "3", "--global-batch", "4", "--seq-len", "32", "--seed", "5"]
    port, metrics = free_port(), tmp_path / "m.jsonl"
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--node-rank", str(n), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                               "--rdzv-id", "two-nodes", "--max-restarts", "0", "--local-addr", "127.0.0.1",
                               "-m", "shardwise", "train", "--dp", "2", *args, "--timeout", "60", "--no-progress",
                               "--metrics-file", str(metrics)],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for n in (0, 1)]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    _assert_same_losses(_metrics(metrics), _reference_losses(args))


def test_padding_a_vocabulary_is_announced(tmp_path, capsys):
    from shardwise.commands.train import _note_vocab_padding

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 259}))
    _note_vocab_padding(_config(["--model", str(config), "--tp", "2"]))
    assert "vocabulary 259 padded to 260 rows for tp=2" in capsys.readouterr().err
    _note_vocab_padding(_config(["--model", "tiny", "--tp", "2"]))
    assert capsys.readouterr().err == ""


def test_a_hybrid_sharded_plan_is_refused_by_the_runtime(tmp_path):
    # `estimate --dp-shard 8 --framework torchtitan --json` writes dp_shard 8 of dp 96: HSDP, which this project's
    # runtime does not run; training it as plain FSDP would be another layout than the one planned.
    from shardwise.commands.train import read_plan
    from shardwise.errors import UsageError

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"dp": 96, "tp": 1, "pp": 1, "zero": 3, "dp_shard": 8}))
    with pytest.raises(UsageError, match="hybrid sharding"):
        read_plan(str(plan))
    plan.write_text(json.dumps({"dp": 96, "tp": 1, "pp": 1, "zero": 3, "dp_shard": 96}))  # every plan's JSON: all of dp
    assert read_plan(str(plan))["dp"] == 96


def test_every_rank_may_check_the_same_output_file_at_once(tmp_path, monkeypatch):
    """Under torchrun every rank checks --metrics-file before training: two probing one path at once must not trip
    over each other's probe (one removed it first: a FileNotFoundError traceback, and the other rank waiting for it
    until its collective timeout)."""
    import builtins
    from pathlib import Path

    from shardwise import paths

    target, real_open = tmp_path / "m.jsonl", builtins.open

    def open_then_the_other_rank_cleans_up(path, *args, **kwargs):  # the other rank's probe removal lands in between
        handle = real_open(path, *args, **kwargs)
        Path(path).unlink()
        return handle

    monkeypatch.setattr(paths, "open", open_then_the_other_rank_cleans_up, raising=False)
    paths.output_file(target, "--metrics-file", "metrics.jsonl")  # no error
    assert not target.exists()


def test_a_hung_rank_is_named_only_when_it_had_to_be_killed(tmp_path):
    """torch elastic reports the first failed rank only: the ranks it does not report are not all hung. The hung ones
    are those still alive after SIGTERM (a rank waiting in a collective ends there), which the launch records."""
    from types import SimpleNamespace

    from shardwise.launch import describe_failures

    error = tmp_path / "error.json"
    error.write_text("{}")
    timeout = SimpleNamespace(error_file=str(error), timestamp=1, exitcode=1,
                              message={"message": "RuntimeError: [../gloo/unbound_buffer.cc:78] Timed out waiting "
                                                  "5000ms for recv operation to complete"})
    hung = describe_failures({2: timeout}, "training", hung=[3], timeout_s=5)
    assert hung.startswith("training stopped: rank 3 stopped answering (hung or stopped): rank 2 waited --timeout 5 s")
    assert "ranks 0" not in hung and ".cc:" not in hung
    plain = describe_failures({2: timeout}, "training", hung=[], timeout_s=5)
    assert plain.startswith("training stopped: rank 2 failed: RuntimeError: Timed out waiting")
    other = SimpleNamespace(error_file=str(error), timestamp=1, exitcode=1,
                            message={"message": "ValueError: --timeout must be positive"})  # no collective's timeout
    assert "stopped answering" not in describe_failures({0: other}, "training", hung=[1], timeout_s=5)
    # what else a silent peer makes a rank raise: gloo's connect timeout while the group forms, and the connection a
    # neighbour closed when its own timeout ended it (a ring's rank 0 raised that before rank 2's waiter timed out)
    for words in ("RuntimeError: Gloo connectFullMesh failed with [../pair.h:311] Connect timeout [none]",
                  "RuntimeError: Connection closed by peer [127.0.0.1]:14527"):
        peer = SimpleNamespace(error_file=str(error), timestamp=1, exitcode=1, message={"message": words})
        said = describe_failures({0: peer}, "training", hung=[2], timeout_s=5)
        assert said.startswith("training stopped: rank 2 stopped answering (hung or stopped): rank 0 waited"), said


def test_a_restart_names_the_rank_that_died_not_the_peer_it_left_waiting():
    # torch's process context reports the first dead process it polls: the peer that raised 'Connection closed by
    # peer' can come first. The restart message names the rank that vanished (exit code other than a Python error's).
    from types import SimpleNamespace

    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    from shardwise.launch import _failed_rank

    peer = ProcessRaisedException("Traceback ...\nRuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection "
                                  "closed by peer [127.0.0.1]:4128", 0, 100)
    procs = [SimpleNamespace(exitcode=1), SimpleNamespace(exitcode=-9)]
    assert _failed_rank(peer, procs) == "rank 1 died (exit code -9, SIGKILL)"
    alive = [SimpleNamespace(exitcode=1), SimpleNamespace(exitcode=None)]  # the peer hung: nothing else to name
    assert _failed_rank(peer, alive) == "rank 0 failed: RuntimeError: Connection closed by peer [127.0.0.1]:4128"
    own = ProcessRaisedException("Traceback ...\nValueError: bad batch", 2, 100)  # its own error: itself
    assert _failed_rank(own, procs + [SimpleNamespace(exitcode=1)]) == "rank 2 failed: ValueError: bad batch"
    gone = ProcessExitedException("exited", 1, 100, 13)
    assert _failed_rank(gone, procs) == "rank 1 died (exit code 13)"


def _finish_then_hang(rank, world, hang_rank):
    import time

    import torch.distributed as dist

    dist.barrier()
    if rank == hang_rank:
        time.sleep(600)  # past its last collective: no collective's timeout reaches it


def test_a_rank_that_hangs_after_its_last_collective_ends_the_job_and_is_named():
    # torch elastic waits for every rank without a limit: a rank stopped after train's last barrier held the job for
    # ever, after its success line. Once one rank has finished, the others get finish_s seconds.
    # (Without the limit the hung rank's 600 s sleep ends and the job succeeds: no JobFailed.)
    from shardwise.errors import JobFailed
    from shardwise.launch import _with_rank, run_ranks

    with pytest.raises(JobFailed) as exc:
        run_ranks(_with_rank, _finish_then_hang, 1, world=2, timeout_s=30, finish_s=2, what="training")
    assert str(exc.value).startswith("training stopped: rank 1 had not finished 2 s after the other ranks had")


def test_an_error_inside_a_one_rank_run_is_said_as_a_ranks_failure_in_one_line(monkeypatch, capsys):
    """World 1 runs in this process: an unexpected error inside training is 'training stopped: rank 0 failed: ...'
    (exit 1, stdout still one JSON object under --json), as at world 2 and more — before, a raw traceback."""
    import shardwise.train

    def fail(step):
        raise RuntimeError("an error no check foresaw")

    monkeypatch.setattr(shardwise.train, "_maybe_die", fail)
    assert main(["train", "--model", "tiny", "--steps", "2", "--json"]) == 1
    out, err = capsys.readouterr()
    assert err.strip() == "shardwise: error: training stopped: rank 0 failed: RuntimeError: an error no check foresaw"
    assert json.loads(out)["error"].endswith("an error no check foresaw")


@pytest.mark.parametrize("argv, refusal", [
    (["--model", "tiny", "--schedule", "gpipe", "--dp", "2", "--global-batch", "3"], "--global-batch 3 is not divisible"),
    (["--plan", "PLAN", "--steps", "0"], "--steps must be at least 1, got 0"),
])
def test_a_refused_run_is_one_line_without_the_notes_it_would_have_said(argv, refusal, tmp_path, capsys):
    """The notes about what would have run (a knob set back, the plan's model) wait for the checks: a refusal is one
    line. The same layout that passes says them."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"best": {"dp": 1, "tp": 1, "pp": 1}, "job": {"model": "tiny", "global_batch": 8, "seq_len": 64}}))
    argv = [str(plan) if a == "PLAN" else a for a in argv]
    assert main(["train", "--steps", "1", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"shardwise: error: {refusal}"), err


def test_the_notes_of_a_run_that_passes_its_checks_are_said(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"best": {"dp": 1, "tp": 1, "pp": 1}, "job": {"model": "tiny", "global_batch": 8, "seq_len": 64}}))
    assert main(["train", "--plan", str(plan), "--schedule", "gpipe", "--steps", "1", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "note: --model tiny, the plan's" in err and "note: --schedule gpipe changes nothing at --pp 1" in err


def test_a_tp_above_the_kv_heads_names_a_fix_train_has(tmp_path, capsys):
    """One KV head, tp 2: train's refusal names what train can change (its tp), not the planner's --framework
    megatron-2021, a flag train does not have (helper-204)."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 256,
                               "max_position_embeddings": 64}))
    assert main(["train", "--model", str(cfg), "--tp", "2", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not divide the 1 KV heads" in err[0] and "--framework" not in err[0], err


@pytest.mark.parametrize("extra, refusal", [
    ([], "already holds checkpoints of a run (newest step_000002) — add --resume"),
    (["--resume", "--seq-len", "16"], "that run used --seq-len 32 (now 16)"),
    (["--resume"], "is the end of the run (step 2 of 2)"),
])
def test_the_checkpoint_folder_is_checked_before_the_data_is_tokenized(extra, refusal, tmp_path, capsys, monkeypatch):
    """The checkpoint folder's checks had waited for the data to be tokenized (hours, on a large corpus) though only the
    data's own comparison needs it."""
    import shardwise.corpus
    from shardwise.errors import UsageError

    data = tmp_path / "a.txt"
    data.write_text("some text to train on\n" * 200)
    argv = ["train", "--model", "tiny", "--steps", "2", "--global-batch", "4", "--no-progress", "--data", str(data),
            "--data-cache", str(tmp_path / "cache"), "--checkpoint-dir", str(tmp_path / "ck")]
    assert main(argv + ["--seq-len", "32"]) == 0

    def tokenizing(*args, **kwargs):
        raise UsageError("the data was tokenized before the checkpoint folder was checked")

    monkeypatch.setattr(shardwise.corpus, "prepare_run", tokenizing)
    capsys.readouterr()
    assert main(argv + (extra if "--seq-len" in extra else extra + ["--seq-len", "32"])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and refusal in err[0], err


def test_the_docs_quote_the_refusal_of_a_rope_scaling_the_runtime_lacks(tmp_path, capsys):
    """docs/models-and-data.md quoted a message (and a fix, --init random) that the code no longer says."""
    from pathlib import Path

    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}}))
    assert main(["train", "--model", str(folder), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    said = err.removeprefix("shardwise: error: ").replace(str(folder), "my-llama")
    doc = (Path(__file__).parents[1] / "docs" / "models-and-data.md").read_text()
    assert err.startswith("shardwise: error: ") and "yarn" in said and f"`{said}`" in doc, said
