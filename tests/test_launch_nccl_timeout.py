"""How a launch names an NCCL collective past --timeout: torch's watchdog aborts the rank (SIGABRT, exit code -6)
from its own thread, with no Python error and so no error file. Synthetic failure records (torch elastic's
ProcessFailure: error_file, timestamp, exitcode, message, signal_name): no GPU needed."""

from __future__ import annotations

from types import SimpleNamespace

from shardwise.launch import describe_failures


def _aborted(exitcode: int = -6, timestamp: int = 1, error_file=None, message=None):
    names = {-6: "SIGABRT", -9: "SIGKILL", -15: "SIGTERM"}
    return SimpleNamespace(error_file=error_file, timestamp=timestamp, exitcode=exitcode, message=message or {},
                           signal_name=lambda: names.get(exitcode, "<N/A>"))


def test_an_nccl_watchdog_abort_names_the_timeout():
    said = describe_failures({1: _aborted()}, "training", hung=[], timeout_s=60, backend="nccl")
    assert said.startswith("training stopped: rank 1 ended first, aborted (exit code -6, SIGABRT) with no Python error")
    assert "NCCL's watchdog" in said and "--timeout 60 s" in said and "a collective probably exceeded it" in said
    assert "died" not in said


def test_a_rank_that_had_to_be_killed_is_named_as_the_one_waited_for():
    said = describe_failures({1: _aborted()}, "training", hung=[3], timeout_s=60, backend="nccl")
    assert said.startswith("training stopped: rank 3 stopped answering (hung or stopped): rank 1 ended first, aborted "
                           "(exit code -6, SIGABRT)"), said
    assert "--timeout 60 s" in said and "waited that long for rank 3" in said
    many = describe_failures({0: _aborted()}, "training", hung=[2, 1], timeout_s=5, backend="nccl")
    assert many.startswith("training stopped: ranks 1, 2 stopped answering") and "for ranks 1, 2" in many


def test_the_first_rank_that_ended_is_named_first():
    said = describe_failures({2: _aborted(timestamp=7), 0: _aborted(timestamp=3)}, "training", timeout_s=30,
                             backend="nccl")
    assert said.startswith("training stopped: rank 0 ended first")
    assert "then rank 2 died (exit code -6, SIGABRT)" in said


def test_other_deaths_and_gloo_keep_their_words(tmp_path):
    # gloo: a SIGABRT there is no watchdog's (FSDP's gloo work freed at shutdown aborts a process)
    assert describe_failures({1: _aborted()}, "training", timeout_s=60, backend="gloo") == \
        "training stopped: rank 1 died (exit code -6, SIGABRT) — the other ranks were stopped"
    assert describe_failures({1: _aborted()}, "training", timeout_s=60) == \
        "training stopped: rank 1 died (exit code -6, SIGABRT) — the other ranks were stopped"
    # NCCL, but killed (the OOM killer) or a Python error: not a timeout
    assert describe_failures({1: _aborted(-9)}, "training", timeout_s=60, backend="nccl") == \
        "training stopped: rank 1 died (exit code -9, SIGKILL) — the other ranks were stopped"
    error = tmp_path / "error.json"
    error.write_text("{}")
    raised = _aborted(1, error_file=str(error), message={"message": "ValueError: bad batch"})
    assert describe_failures({0: raised}, "training", timeout_s=60, backend="nccl") == \
        "training stopped: rank 0 failed: ValueError: bad batch — the other ranks were stopped"
