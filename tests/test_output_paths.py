"""A command never writes over what it reads or over another of its own outputs, and a malformed input beside it
is one line: the overwrites and tracebacks an outside fuzz of report, simulate, calibrate, train and checkpoint found."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from shardwise.cli import build_parser, main
from shardwise.commands.train import config_from
from test_report import validate_result

NCCL = Path(__file__).parent / "data" / "nccl_tests"


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("shardwise: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_report_refuses_to_write_over_its_validate_result(tmp_path, capsys):
    run = tmp_path / "run.json"
    run.write_text(json.dumps(validate_result()))
    before = run.read_text()
    assert main(["report", "--validate", str(run), "--out", str(run)]) == 2
    assert "--out" in one_line(capsys) and run.read_text() == before


@pytest.mark.parametrize("field, value", [("predicted_memory_bytes", [1]), ("measured_step_time_s", float("nan")),
                                          ("measured_step_time_s", "fast"), ("measured_step_time_s", None),
                                          ("measured_step_time_s", -1), ("predicted_step_time_s", True)])
def test_report_refuses_a_validate_figure_that_is_not_a_positive_number(field, value, tmp_path, capsys):
    result = validate_result()
    result["layouts"][2][field] = value
    run = tmp_path / "run.json"
    run.write_text(json.dumps(result))  # NaN is written as JSON's NaN, which Python's reader takes
    assert main(["report", "--validate", str(run), "--out", str(tmp_path / "r.html")]) == 2
    assert f"{field} is" in one_line(capsys) and not (tmp_path / "r.html").exists()


def test_simulate_refuses_one_file_for_its_picture_and_its_trace(tmp_path, capsys):
    same = tmp_path / "same.svg"
    assert main(["simulate", "--pp", "4", "--microbatches", "8", "--out", str(same), "--trace", str(same)]) == 2
    assert "--trace" in one_line(capsys) and not same.exists()


def test_calibrate_refuses_to_write_its_cluster_file_over_a_log_it_reads(tmp_path, capsys):
    log = tmp_path / "log.txt"
    shutil.copy(NCCL / "awsefaeks-p4d_all_reduce_2x8.txt", log)
    before = log.read_text()
    argv = ["calibrate", "--nccl-tests", f"all_reduce@2x8={log}", "--cluster", "aws-p4d", "--out", str(log)]
    assert main(argv) == 2
    assert "--nccl-tests" in one_line(capsys) and log.read_text() == before


def test_train_refuses_a_metrics_file_over_its_data_before_starting(tmp_path, capsys):
    data = tmp_path / "t.txt"
    data.write_text("some text to train on\n" * 50)
    assert main(["train", "--model", "tiny", "--steps", "1", "--data", str(data), "--metrics-file", str(data)]) == 2
    assert "--metrics-file" in one_line(capsys) and data.read_text().startswith("some text")


@pytest.mark.parametrize("out_flag, inside", [("--metrics-file", "a.txt"), ("--metrics-file", "m.jsonl"),
                                               ("--trace", ""), ("--trace", "trace"), ("--checkpoint-dir", "ck")])
def test_train_refuses_an_output_inside_a_data_folder_it_reads(out_flag, inside, tmp_path, capsys):
    """A --data folder is read whole: a metrics file over one of its texts, or a trace or checkpoint written among
    them (the next run would read the pictures as text), destroys the corpus."""
    data = tmp_path / "texts"
    data.mkdir()
    (data / "a.txt").write_text("some text to train on\n" * 50)
    target = data / inside if inside else data
    argv = ["train", "--model", "tiny", "--steps", "1", "--data", str(data), out_flag, str(target)]
    assert main(argv) == 2
    err = one_line(capsys)
    assert out_flag in err and "--data" in err
    assert sorted(p.name for p in data.iterdir()) == ["a.txt"] and (data / "a.txt").read_text().startswith("some text")


def test_train_refuses_a_metrics_file_inside_the_model_folder_it_reads(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                                   "num_hidden_layers": 2, "num_attention_heads": 4,
                                                   "num_key_value_heads": 4, "vocab_size": 256}))
    weights = model / "model.safetensors"
    weights.write_bytes(b"not really weights, but the user's file")
    assert main(["train", "--model", str(model), "--steps", "1", "--metrics-file", str(weights)]) == 2
    assert "--model" in one_line(capsys) and weights.read_bytes().startswith(b"not really")


def _layout(argv, capsys):
    argv = ["train", "--model", "tiny", *argv]
    layout = config_from(build_parser(argv).parse_args(argv)).layout
    return layout, capsys.readouterr().err


def test_train_records_the_layout_that_runs_and_says_what_changes_nothing(capsys, tmp_path):
    lay, err = _layout(["--sequence-parallel", "--schedule", "zb-h1", "--cp-mode", "allgather"], capsys)
    assert (lay.sequence_parallel, lay.schedule, lay.cp_mode) == (False, "1f1b", "ring")
    for said in ("--schedule zb-h1 changes nothing at --pp 1", "--sequence-parallel changes nothing at --tp 1",
                 "--cp-mode allgather changes nothing at --cp 1"):
        assert said in err
    # the same knobs set by a --plan are said as the plan's keys, not as flags nobody typed
    import json

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"best": {"dp": 1, "tp": 1, "pp": 1, "sequence_parallel": True, "cp_mode": "allgather"}}))
    lay, err = _layout(["--plan", str(plan)], capsys)
    assert (lay.sequence_parallel, lay.cp_mode) == (False, "ring")
    assert "the plan's sequence_parallel changes nothing at --tp 1" in err and "the plan's cp_mode allgather" in err
    assert "--sequence-parallel" not in err and "--cp-mode" not in err
    lay, err = _layout(["--pp", "2", "--schedule", "interleaved-1f1b", "--global-batch", "8"], capsys)
    assert (lay.vpp, lay.schedule) == (2, "interleaved-1f1b") and "2 virtual stages per rank" in err
    argv = ["train", "--model", "tiny", "--pp", "2", "--schedule", "interleaved-1f1b", "--vpp", "1"]
    assert main(argv) == 2
    assert "interleaves nothing" in one_line(capsys)


@pytest.mark.parametrize("job, shown", [({"seq_len": 64.5}, "64.5"), ({"global_batch": "x"}, '"x"'),
                                        ({"global_batch": True}, "true")])
def test_a_plan_files_job_values_are_checked_not_replaced(job, shown, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"best": {"dp": 1, "tp": 1, "pp": 1}, "job": job}))
    assert main(["train", "--model", "tiny", "--steps", "1", "--plan", str(plan)]) == 2
    assert f"is {shown}, not a whole number" in one_line(capsys)


def test_a_cached_corpus_is_named_by_the_files_given(tmp_path, capsys):
    """The token cache is keyed by content: an empty file cached under one name is reported under the name given."""
    for name in ("first.txt", "second.txt"):
        (tmp_path / name).write_text("")
        argv = ["train", "--model", "tiny", "--steps", "1", "--data", str(tmp_path / name),
                "--data-cache", str(tmp_path / "cache")]
        assert main(argv) == 2
        err = one_line(capsys)
        assert f"{tmp_path / name}: no text" in err


@pytest.mark.parametrize("argv, said", [
    (["calibrate", "--nccl-tests", str(NCCL / "awsefaeks-p4d_all_reduce_2x8.txt"), "--cluster", "aws-p4d", "--world", "7"],
     "--world sets how this machine is measured, and --nccl-tests reads logs instead"),
    (["calibrate", "--sizes", "0"], "--sizes '0' must be between 1 byte"),
    (["calibrate", "--copy-size", "0"], "--copy-size '0' must be between 1 byte"),
    (["validate", "--layouts", ""], "--layouts: an empty layout"),
    (["demo", "--steps", "0"], "--steps must be at least 3, got 0"),
    (["demo", "--no-train", "--world", "1000"], "--world sets the local run, which --no-train skips"),
    (["demo", "--no-train", "--steps", "5"], "--steps sets the local run, which --no-train skips — drop it"),  # only what was given
    (["simulate", "--pp", "2", "--microbatches", "4", "--costs", "1e308,1,1"], "each from 0 to 1e12"),
    # a report page is named .html, as a browser opens it (it was written into a .txt, exit 0); no folder made first
    (["report", "--model", "tiny", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8", "--seq-len",
      "64", "--out", "sub/r.txt"], "--out sub/r.txt: the report page's name must end in .html"),
    (["plan", "--model", "tiny", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8", "--seq-len",
      "64", "--html", "sub/x.txt"], "--html sub/x.txt: the report page's name must end in .html"),
])
def test_flags_that_would_be_ignored_or_misnamed_are_one_line(argv, said, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert said in one_line(capsys)
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written


def test_resume_from_a_step_folder_names_the_runs_folder(tmp_path, capsys):
    step = tmp_path / "run" / "step_000002"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text("{}")
    assert main(["train", "--model", "tiny", "--steps", "4", "--checkpoint-dir", str(step), "--resume"]) == 2
    assert f"--checkpoint-dir {tmp_path / 'run'}" in one_line(capsys)


def test_a_refused_train_creates_no_folder(tmp_path, capsys):
    """The checkpoint flags are checked before --checkpoint-dir (or any other output folder) is created."""
    ckpt = tmp_path / "runs" / "a" / "b"
    assert main(["train", "--model", "tiny", "--steps", "1", "--checkpoint-dir", str(ckpt), "--keep", "0",
                 "--metrics-file", str(tmp_path / "m" / "metrics.jsonl")]) == 2
    assert "--keep must be at least 1" in one_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_data_field_for_plain_text_is_refused(tmp_path, capsys):
    data = tmp_path / "t.txt"
    data.write_text("some text to train on\n" * 50)
    assert main(["train", "--model", "tiny", "--steps", "1", "--data", str(data), "--data-field", "body"]) == 2
    assert "is plain text — drop --data-field" in one_line(capsys)


def test_an_output_path_that_is_a_named_pipe_is_one_line_not_a_hang(tmp_path, capsys):
    """Opening a pipe nobody reads blocks: every output flag refuses one at once (an alarm turns a block into a
    failure here); a character device such as /dev/null is still written through."""
    import os
    import signal

    for name in ("pipe.svg", "pipe.json", "pipe.jsonl"):
        os.mkfifo(tmp_path / name)
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("blocked on the pipe"))
    signal.alarm(20)
    try:
        for argv in (["simulate", "--pp", "4", "--microbatches", "8", "--out", str(tmp_path / "pipe.svg")],
                     ["simulate", "--pp", "4", "--microbatches", "8", "--trace", str(tmp_path / "pipe.json")],
                     ["train", "--model", "tiny", "--steps", "1", "--metrics-file", str(tmp_path / "pipe.jsonl")]):
            assert main(argv) == 2
            assert "is a named pipe, not a regular file" in one_line(capsys)
    finally:
        signal.alarm(0)
    null = tmp_path / "null.svg"
    null.symlink_to(os.devnull)
    assert main(["simulate", "--pp", "4", "--microbatches", "8", "--out", str(null)]) == 0
    assert null.is_char_device()


def test_a_timeout_torch_would_round_to_zero_and_an_interleaving_of_one_chunk_are_one_line(capsys):
    """Found by outside reviews: --timeout 1e-9, and then 0.001 (which the refusal of 1e-9 suggested), passed the
    checks and failed at the ranks' rendezvous ("timed out after 1ms"); simulate drew interleaved 1F1B with one chunk
    a rank, which train refuses."""
    for short in ("1e-9", "0.001"):
        assert main(["train", "--model", "tiny", "--dp", "2", "--steps", "1", "--timeout", short]) == 2
        assert "too short for the ranks to meet" in one_line(capsys)
    assert main(["simulate", "--pp", "4", "--microbatches", "8", "--schedule", "interleaved-1f1b", "--vpp", "1"]) == 2
    assert "interleaves nothing" in one_line(capsys)


@pytest.mark.parametrize("how", ["--data-cache", "--val-data", "SHARDWISE_CACHE"])
def test_train_refuses_a_token_cache_inside_a_data_folder_it_reads(how, tmp_path, capsys, monkeypatch):
    """The token cache written among the data (--data-cache, or $SHARDWISE_CACHE's default) was accepted, and its
    KEY.json then broke the next run on that folder: it is one line now, before anything is written."""
    data = tmp_path / "texts"
    data.mkdir()
    (data / "a.txt").write_text("some text to train on\n" * 200)
    flag = "--val-data" if how == "--val-data" else "--data"
    argv = ["train", "--model", "tiny", "--steps", "1", "--global-batch", "4", "--seq-len", "32", "--no-progress",
            flag, str(data)]
    if how == "SHARDWISE_CACHE":
        monkeypatch.setenv("SHARDWISE_CACHE", str(data))
    else:
        argv += ["--data-cache", str(data / "cache")]
    assert main(argv) == 2
    err = one_line(capsys)
    assert f"inside the folder {flag} {data} reads" in err and ("SHARDWISE_CACHE" in err) == (how == "SHARDWISE_CACHE")
    assert [p.name for p in data.iterdir()] == ["a.txt"]


def test_a_new_run_says_it_writes_over_an_earlier_runs_metrics_and_refuses_another_file(tmp_path, capsys):
    """A resume refuses to mix two runs in one metrics file; a new run wrote over an earlier one's without a word, and
    over any file at all. Now: a note naming the records it replaces; a file that holds none of train's, refused."""
    from shardwise.cli import main

    metrics = tmp_path / "m.jsonl"
    run = ["train", "--model", "tiny", "--steps", "2", "--global-batch", "4", "--seq-len", "16", "--no-progress",
           "--metrics-file", str(metrics)]
    assert main(run) == 0
    capsys.readouterr()
    assert main(run) == 0
    assert f"--metrics-file {metrics} held 2 records of run " in capsys.readouterr().err
    other = tmp_path / "notes.txt"
    other.write_text("my notes\n")
    assert main([*run[:-1], str(other)]) == 2
    assert "is a file of something else" in capsys.readouterr().err and other.read_text() == "my notes\n"


@pytest.mark.parametrize("argv", [
    ["simulate", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--trace", "{d}/"],
    ["simulate", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--out", "{d}/"],
    ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "64", "--seq-len",
     "4096", "--emit", "torchtitan", "--out", "{d}/"],
])
def test_an_output_named_as_a_folder_is_refused_not_written_as_a_file(argv, tmp_path, capsys):
    """'trace/' means a folder (as `train --trace trace/` takes one): argparse's Path dropped the slash and the command
    wrote a file named 'trace'."""
    from shardwise.cli import main

    folder = tmp_path / "newdir"
    assert main([a.replace("{d}", str(folder)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "is a folder — give a file path" in err and len(err.strip().splitlines()) == 1
    assert not folder.exists()


def test_a_file_both_trained_and_validated_on_is_said(tmp_path, capsys):
    """The validation loss of a file --data also trains on measures training text: said in one note, not refused."""
    import shutil

    import shardwise
    from shardwise.cli import main

    texts = Path(shardwise.__file__).parent / "data"
    for name in ("lincoln.txt", "declaration_of_independence.txt"):
        shutil.copy(texts / name, tmp_path / name)
    base = ["train", "--model", "tiny", "--steps", "1", "--global-batch", "4", "--seq-len", "16", "--no-progress",
            "--data-cache", str(tmp_path / "cache"), "--data", str(tmp_path / "lincoln.txt")]
    assert main([*base, str(tmp_path / "declaration_of_independence.txt"), "--val-data",
                 str(tmp_path / "declaration_of_independence.txt")]) == 0
    assert "is also in --data: the validation loss measures text the run trains on" in capsys.readouterr().err
    assert main([*base, "--val-data", str(tmp_path / "declaration_of_independence.txt")]) == 0
    assert "is also in --data" not in capsys.readouterr().err


LONG = "x" * 256  # one name past the 255 bytes Linux file systems take (ENAMETOOLONG)
JOB = ["--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "16", "--seq-len", "128"]


@pytest.mark.parametrize("argv", [
    ["estimate", "--model", LONG, *JOB],
    ["plan", "--model", "llama3-8b", *JOB[:1], f"{LONG}.toml", *JOB[2:]],
    ["report", "--model", "llama3-8b", *JOB, "--out", f"{LONG}.html"],
    ["plan", "--model", "llama3-8b", *JOB, "--emit", "megatron", "--out", f"{LONG}/run.sh"],
    ["simulate", "--pp", "2", "--microbatches", "4", "--trace", f"{LONG}.json"],
], ids=["model", "cluster", "report-out", "emit-out", "simulate-trace"])
def test_a_path_with_a_name_too_long_is_one_line_and_exit_2(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert "255" in one_line(capsys)


def test_an_input_that_is_a_pipe_is_said_to_be_one(tmp_path, capsys):
    fifo = tmp_path / "result.json"
    os.mkfifo(fifo)
    assert main(["report", "--model", "llama3-8b", *JOB, "--validate", str(fifo), "--out", str(tmp_path / "r.html")]) == 2
    assert "not a regular file" in one_line(capsys)


def test_a_path_too_long_overall_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    deep = "/".join(["a" * 250] * 20) + "/config.json"  # each name fits; the whole path does not (PATH_MAX)
    assert main(["estimate", "--model", deep, *JOB]) == 2
    err = one_line(capsys)
    assert "this path is" in err and "a name in this path" not in err


@pytest.mark.parametrize("kind", ["fifo", "loop"])
def test_calibrate_refuses_an_nccl_tests_log_that_is_no_file(kind, tmp_path, capsys):
    """A named pipe hung calibrate --nccl-tests (it read it, waiting for a writer); a symlink loop was a traceback."""
    log = tmp_path / "nccl.log"
    if kind == "fifo":
        os.mkfifo(log)
    else:
        (tmp_path / "other.log").symlink_to(log)
        log.symlink_to(tmp_path / "other.log")
    assert main(["calibrate", "--cluster", "dgx-h100-80gb", "--nccl-tests", str(log),
                 "--out", str(tmp_path / "c.toml")]) == 2
    assert "--nccl-tests" in one_line(capsys)


@pytest.mark.parametrize("argv", [["train", "--model", "tiny", "--checkpoint-dir", ""], ["train", "--model", "tiny", "--trace="],
                                  ["calibrate", "--sizes", ""], ["checkpoint", "export", "x", "--max-shard-size", ""]],
                         ids=["checkpoint-dir", "trace=", "sizes", "max-shard-size"])
def test_a_flag_given_an_empty_value_is_refused(argv, capsys):
    """An empty value (a script's unset variable) had read as the flag unset (no checkpoint written) or as '.'."""
    assert main(argv) == 2
    flag = next(a.rstrip("=") for a in argv if a.startswith("--") and (a.endswith("=") or argv[argv.index(a) + 1:][:1] == [""]))
    assert f"{flag} is given an empty value" in one_line(capsys)
