"""What commands write: output folders created before any work (an impossible path is one line, exit 2); --json."""

import re

import pytest

from shardwise.cli import COMMANDS, build_parser, main


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


NARROW = [
    ["plan", "--model", "llama-65b", "--cluster", "dgx-a100-80gb", "--gpus", "64", "--global-batch", "1024",
     "--seq-len", "2048", "--top", "5"],
    # millions of tokens a second and a long layout: the numbers must not fold
    ["plan", "--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--gpus", "16384", "--global-batch", "8192",
     "--seq-len", "8192", "--framework", "shardwise", "--top", "3"],
    ["estimate", "--model", "tiny-moe", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch", "16",
     "--seq-len", "64", "--ep", "2", "--etp", "2", "--tp", "2", "--pp", "2", "--cp", "2", "--vpp", "2", "--micro-batch", "1"],
    ["explain", "--model", "tiny", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8", "--seq-len", "64"],
    # layouts too long for 80 columns beside the numbers (an outside review saw "5.95 s" and "19.6 %" folded)
    ["plan", "--model", "deepseek-v3", "--cluster", "dgx-h100-80gb", "--gpus", "1048576", "--global-batch", "1048576",
     "--seq-len", "4096", "--tp", "1,2,4,8", "--pp", "1,2,4,8,16", "--max-vpp", "2", "--micro-batch", "1,2", "--ep", "8,16"],
    ["simulate", "--compare", "--pp", "4", "--microbatches", "8", "--costs", "0.01,0.02,0.01"],
]


@pytest.mark.parametrize("argv", NARROW, ids=[a[0] for a in NARROW])
def test_tables_stay_whole_when_piped_at_80_columns(argv, monkeypatch, capsys):
    """A pipe or an 80-column terminal: no line wider, no cell cut short ("dp4·…"), small times in ms or µs."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out, out
    assert "0.00 s" not in out and "0.0000" not in out, out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    rows = [row for row in rows if len(row) > 1 and row[1].startswith("dp")]  # a layout table's rows
    assert all(row[-1].endswith("%") for row in rows), out  # each whole on its line
    assert not [line for line in out.splitlines() if re.fullmatch(r"[\d,]+", line.strip())], out  # no number's
    # end folded onto a line of its own (a 16,384-GPU plan's 2,169,782 tokens/s did)


def test_validate_table_stays_whole_at_80_columns():
    from rich.console import Console

    from shardwise.commands.validate import _print

    layouts, summary = _validate_records(2e7)
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    _print(console, dict(model="tiny", world=2, backend="gloo", cluster="calibrated", global_batch=8, seq_len=64,
                         layouts=layouts, summary=summary), None)
    out = console.export_text()
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out, out
    assert "4 ms" in out and "i-1f1b" in out and "sel-rc" in out, out  # units; short words, explained in the caption


def _validate_records(predicted_memory: float) -> tuple[list[dict], dict]:
    """Three layouts' records and a summary as validate --json gives them, for its table."""
    names = ["dp2 tp1 pp1 mb1", "dp1 tp1 pp2 mb1 interleaved-1f1b v2 zero1 selective recompute", "dp1 tp2 pp1 mb1 sp"]
    layouts = [dict(name=n, predicted_step_time_s=0.004 * (i + 1), measured_step_time_s=0.005 * (i + 1), noisy=False,
                    step_time_spread=0.1, predicted_memory_bytes=predicted_memory, measured_memory_bytes=2.1e7)
               for i, n in enumerate(names)]
    summary = dict(median_abs_error=0.2, p90_abs_error=0.2, spearman=1.0, kendall_tau=1.0, top1_regret=0.0,
                   best_in_top3=True, memory_median_abs_error=0.05, memory_p90_abs_error=0.05, noisy_layouts=0)
    return layouts, summary


def _cells_whole(table, width: int, text: set[str]) -> str:
    """The table printed in `width` columns; each cell outside the `text` columns whole on one line of it."""
    import os

    from rich.console import Console
    from rich.text import Text

    console = Console(width=width, record=True, file=open(os.devnull, "w"))
    console.print(table)
    out = console.export_text()
    lines = out.splitlines()
    assert max(map(len, lines)) <= width and "…" not in out, out
    for column in table.columns:
        if str(column.header) in text:
            continue
        for cell in column.cells:
            plain = Text.from_markup(cell).plain
            assert any(re.search(rf"(?<!\S){re.escape(plain)}(?!\S)", line) for line in lines), (column.header, plain, out)
    return out


@pytest.fixture(scope="module")
def llama_plan():
    from shardwise.planner import Job
    from shardwise.planner.search import search
    from shardwise.specs import TrainSpec, load_cluster, load_model

    return search(Job(load_model("llama2-7b"), load_cluster("dgx-a100-80gb"), TrainSpec(64, 4096)), 16).ranked[:10]


@pytest.mark.parametrize("width", [40, 50, 60, 69])
def test_tables_below_70_columns_fold_words_never_numbers(width, llama_plan):
    """Below 70 columns (`COLUMNS=60 shardwise plan ...`) the layout, schedule and recompute fold and every number
    stays whole on its line ("1.24M" and "84.8" were split over two); where the numbers alone do not fit, the least
    telling columns are left out and the caption names them. The same for estimate's breakdown and validate's table."""
    from shardwise.commands.common import breakdown_table, layout_table
    from shardwise.commands.validate import _print

    table = layout_table(llama_plan, "llama2-7b on 16 GPUs", width=width)
    _cells_whole(table, width, {"layout", "sched", "rc"})
    headers = [str(c.header) for c in table.columns]
    assert {"layout", "GiB", "fits", "tok/s", "MFU"} <= set(headers)
    if width >= 60:
        assert len(headers) == 11  # every column: the layout folds instead
    else:
        assert "left out to fit" in table.caption and "SP" in table.caption
    in_millions = any(str(cell).endswith("M") for cell in table.columns[headers.index("tok/s")].cells)
    assert ("M: million" in (table.caption or "")) == in_millions  # explained where a figure uses it (helper-226)
    _cells_whole(breakdown_table(llama_plan[0], width=width), width, {"memory", "time"})

    from rich.console import Console

    layouts, summary = _validate_records(2.25e7)
    import os

    console = Console(width=width, record=True, file=open(os.devnull, "w"))
    _print(console, dict(model="tiny", world=2, backend="gloo", cluster="calibrated", global_batch=8, seq_len=64,
                         layouts=layouts, summary=summary), None)
    out = console.export_text()
    assert max(map(len, out.splitlines())) <= width and "…" not in out, out
    for figure in ("4 ms", "5 ms", "-20%", "+7.1%"):  # a time, its error, the memory error: each whole on a line
        assert any(figure in line for line in out.splitlines()), (figure, out)


def _leaf_parsers(parser, path=()):
    """(command path, parser) of every command a user can run, sub-actions (`checkpoint inspect`) included."""
    import argparse

    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for sub in subs:
        for name, child in sub.choices.items():
            yield from _leaf_parsers(child, path + (name,))


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_json(command):
    """Every command a user runs — and each action of one with actions (`checkpoint inspect`) — offers --json."""
    leaves = [(path, p) for path, p in _leaf_parsers(build_parser([command])) if path[:1] == (command,)]
    assert leaves, command
    for path, p in leaves:
        assert "--json" in {s for a in p._actions for s in a.option_strings}, " ".join(path)


def test_an_unknown_flag_points_to_its_commands_help(capsys):
    # argparse's top parser reports a subcommand's leftover flags: the line names that command's --help
    assert main(["simulate", "--pp", "2", "--microbatches", "4", "--cp", "2"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --cp 2 — see `shardwise simulate --help`" in err and err.count("\n") == 1
    assert main(["bogus"]) == 2 and "see `shardwise --help`" in capsys.readouterr().err


def test_the_demo_says_which_way_its_prediction_is_off():
    # "error +44%" read as "predicted faster" beside the published tables' sign; in words it cannot be misread
    from shardwise.commands.demo import _off

    assert _off(0.144, 0.100) == "44% longer than measured"
    assert _off(0.090, 0.100) == "10% shorter than measured"
    assert _off(0.1001, 0.100) == "as measured"


def test_the_demo_says_a_busy_machine_was_measured(monkeypatch):
    import shardwise.calibrate as cal
    from rich.console import Console

    from shardwise.commands.demo import _calibrate
    from shardwise.specs import load_cluster, load_model

    class Profile:
        other_cpu_cores = 1.5

        def to_cluster(self):
            return load_cluster("dgx-h100-80gb")

    monkeypatch.setattr(cal, "calibrate", lambda cfg, progress: Profile())
    console, aside = Console(record=True, width=200), Console(record=True, width=200)
    _calibrate(console, load_model("tiny"), 4, aside)  # under --json, `aside` is stderr's: stdout is the JSON
    assert "other processes kept 1.5 of this machine's" in aside.export_text()
    assert "other processes" not in console.export_text()
    Profile.other_cpu_cores = 0.01
    console = Console(record=True, width=200)
    _calibrate(console, load_model("tiny"), 4, console)
    assert "other processes" not in console.export_text()


def test_under_torchrun_only_rank_0_says_a_failure_or_an_interrupt(monkeypatch, capsys):
    # every rank of a torchrun job runs the command: each printed the failure, and under --json its own object
    import shardwise.launch as launch
    from shardwise.commands.common import print_failure_json
    from shardwise.errors import JobFailed

    def failed(cfg):
        raise JobFailed("training diverged at step 4 (grad norm nan): stopped there")

    monkeypatch.setattr(launch, "launch", failed)
    argv = ["train", "--model", "tiny", "--steps", "2", "--seq-len", "16", "--global-batch", "2", "--no-progress",
            "--json"]
    for rank, said in (("1", False), ("0", True)):
        monkeypatch.setenv("RANK", rank)
        assert main(argv) == 1
        out, err = capsys.readouterr()
        assert bool(out) == said and ("training diverged" in err) == said, (rank, out, err)
        print_failure_json(build_parser(["train"]).parse_args(argv), "interrupted by SIGTERM — stopped", 143)
        assert bool(capsys.readouterr().out) == said


PLAN = ["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "64",
        "--seq-len", "4096"]


def _shell(argv, env=None, **kwargs):
    """The command as a shell runs it (cli.main's own stream handling applies only there)."""
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "shardwise", *argv], env={**os.environ, **(env or {})},
                          timeout=300, **kwargs)


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"}, {"PYTHONIOENCODING": "latin-1"}, {"COLUMNS": "0"},
                                 {"COLUMNS": "1"}])
def test_the_table_prints_in_any_locale_and_width(env):
    """The table's ·, — and µ under a stream that cannot encode them become ?, and a width too narrow to hold a table
    is ignored: the table is printed (COLUMNS=0 printed nothing, 1 a column of characters), no traceback."""
    out = _shell(PLAN, env=env, capture_output=True)
    text = out.stdout.decode("latin-1")
    assert out.returncode == 0 and out.stderr == b"", out.stderr.decode("latin-1")
    assert "dp8" in text and any(len(line) >= 40 for line in text.splitlines()), text[:500]


def test_output_that_cannot_be_written_is_one_line_or_nothing():
    """stdout closed (`>&-`): nothing to say, exit 0; a full disk (`> /dev/full`): one line, exit 1; a reader gone
    before the table is written (`| head -0`): exit 0, as with --json (rich alone exits 1, which fails a script
    under `set -o pipefail`)."""
    import os
    import subprocess

    closed = _shell(PLAN, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1))
    assert closed.returncode == 0 and closed.stderr == b"", closed.stderr
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            out = _shell(PLAN, stdout=full, stderr=subprocess.PIPE)
        err = out.stderr.decode()
        assert out.returncode == 1 and err.count("\n") == 1 and "cannot write the output" in err, err
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        gone = _shell(PLAN, stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert gone.returncode == 0 and b"Traceback" not in gone.stderr, gone.stderr


def test_training_goes_on_when_its_reader_goes():
    """`shardwise train ... | true`: the progress display goes quiet and the run finishes, exit 0 (rich's own
    console ended it with exit 1)."""
    import os
    import subprocess

    read, write = os.pipe()
    os.close(read)
    try:
        out = _shell(["train", "--model", "tiny", "--steps", "2", "--global-batch", "4", "--seq-len", "16"],
                     stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert out.returncode == 0 and b"Traceback" not in out.stderr, out.stderr


def test_version_is_the_installed_packages(capsys):
    from importlib.metadata import version

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"shardwise {version('shardwise')}"


def test_a_version_that_cannot_be_written_is_no_traceback():
    """`--version > /dev/full` or `--version | true` (unbuffered, as PYTHONUNBUFFERED makes it): exit 0 and nothing on
    stderr, as argparse's own version action answers (the lazy lookup first wrote with print: a traceback, exit 1)."""
    import os
    import subprocess

    unbuffered = {"PYTHONUNBUFFERED": "1"}
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            out = _shell(["--version"], env=unbuffered, stdout=full, stderr=subprocess.PIPE)
        assert out.returncode == 0 and out.stderr == b"", out.stderr
    read, write = os.pipe()
    os.close(read)
    try:
        gone = _shell(["--version"], env=unbuffered, stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert gone.returncode == 0 and gone.stderr == b"", gone.stderr


def test_the_summary_names_the_steps_a_resumed_run_trained():
    # a resume that trained one step said "(steps 4-4)" (an outside check)
    from shardwise.specs import Layout, load_model
    from shardwise.train import TrainConfig, summary

    cfg = TrainConfig(load_model("tiny"), Layout(), steps=6, global_batch=2, seq_len=16)
    rec = [{"step": s, "loss": 5.0, "step_time_s": 0.1} for s in (4, 5, 6)]
    assert "trained 1 step (step 4):" in summary(rec[:1], cfg)
    assert "trained 3 steps (steps 4-6):" in summary(rec, cfg)
    assert summary([dict(rec[0], step=1)], cfg).startswith("trained 1 step: ")


def test_tokenizing_into_a_pipe_writes_no_blank_lines(tmp_path):
    # the tokenizer's progress bar, drawn on a pipe, left an empty line at the top of stdout (an outside check)
    import os
    import subprocess
    import sys

    (tmp_path / "a.txt").write_text("some words to tokenize for a test of the output.\n" * 200)
    env = dict(os.environ, SHARDWISE_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-m", "shardwise", "train", "--model", "tiny", "--data", str(tmp_path / "a.txt"),
                          "--steps", "2", "--global-batch", "2", "--seq-len", "16"], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert out.startswith("tiny "), out[:80]


def test_the_training_bar_keeps_its_step_counter_whole_at_80_columns():
    """A log file or an 80-column terminal: the bar gives way, the 'done/total' counter does not ('1000/10…')."""
    import io
    from types import SimpleNamespace

    from rich.console import Console as RichConsole

    from shardwise.specs import Layout
    from shardwise.train import progress_bar

    cfg = SimpleNamespace(layout=Layout(dp=2), spec=SimpleNamespace(name="tiny"), steps=1000)
    bar = progress_bar(cfg, enabled=True, start=999)
    update = bar.__enter__()
    try:
        update({"loss": 1.7909, "tokens_per_s": 53529.0, "step_time_s": 0.00956})
        buf = io.StringIO()
        RichConsole(file=buf, width=80).print(bar.progress.make_tasks_table(bar.progress.tasks))
    finally:
        bar.__exit__(None, None, None)
    assert "1000/1000" in buf.getvalue() and "…" not in buf.getvalue(), buf.getvalue()


def test_a_layout_too_long_for_its_column_breaks_between_its_parts():
    # rich folded "dp32768·tp2·pp16·ep8·v2·mb1" as "...·mb" above "1" in an 80-column plan (a number on a line alone)
    from shardwise.console import break_after

    layout = "dp65536·hsdp8·tp1·pp16·ep16·v2·mb1"
    for room in (8, 12, 24, 30):
        lines = break_after(layout, "·", room).split("\n")
        assert "".join(lines) == layout and all(len(line) <= room for line in lines)
        assert all(line.endswith("·") for line in lines[:-1]) and len(lines) > 1
    assert break_after(layout, "·", len(layout)) == layout
