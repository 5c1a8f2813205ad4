"""Bad input that earlier reviews found still open (helper-224): each is one line on stderr naming the problem and
the fix, exit 2, before any process group starts — never a traceback, never a hang, never a misleading word.

- a named pipe or a symlink loop given as --data, --model, --cluster, --tokenizer (or --validate) was "not found" / "unknown
  cluster" / "not a model folder"; a pipe inside a --data folder was left out of the corpus unsaid;
- `checkpoint inspect --json` showed the manifest's dp_shard 0, where train/validate/estimate --json report the
  shard group's dp ranks (Layout.record); the manifest keeps its 0 and still resumes;
- a model folder's safetensors file with a damaged header was a traceback, and one with bytes past its last tensor
  passed the header check and failed in the ranks;
- a .parquet --data file pyarrow cannot read said so without a fix, and a damaged page was a traceback.
"""

from __future__ import annotations

import json
import os
import struct
import sys

import pytest

from shardwise.cli import main

JOB = ["--gpus", "8", "--global-batch", "8", "--seq-len", "64"]
TRAIN = ["--steps", "1", "--global-batch", "2", "--seq-len", "16", "--no-progress"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("shardwise: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _special(kind, path):
    if kind == "fifo":
        os.mkfifo(path)
    else:  # two links that lead to each other
        other = path.with_name(path.name + ".other")
        other.symlink_to(path)
        path.symlink_to(other)
    return path


WORDS = {"fifo": "a named pipe", "loop": "a symlink loop"}


# --------------------------------------------------------------------------- 1. pipes and symlink loops


@pytest.mark.parametrize("kind", ["fifo", "loop"])
@pytest.mark.parametrize("flag, name", [("--model", "mymodel"), ("--model", "config.json"), ("--cluster", "mycluster"),
                                        ("--cluster", "mine.toml")])
def test_a_pipe_or_a_symlink_loop_as_model_or_cluster_is_named_as_such(flag, name, kind, tmp_path, capsys):
    path = _special(kind, tmp_path / name)
    args = ["estimate", "--model", "tiny", "--cluster", "dgx-h100-80gb", *JOB]
    args[args.index(flag) + 1] = str(path)
    assert main(args) == 2
    err = one_line(capsys)
    assert f"{flag} {path} is not a regular file: it is {WORDS[kind]}" in err and "not found" not in err, err


@pytest.mark.parametrize("kind", ["fifo", "loop"])
@pytest.mark.parametrize("name", ["corpus", "corpus.txt", "corpus.jsonl"])
def test_a_pipe_or_a_symlink_loop_as_data_is_named_as_such(name, kind, tmp_path, capsys):
    path = _special(kind, tmp_path / name)
    assert main(["train", "--model", "tiny", "--data", str(path), *TRAIN, "--data-cache", str(tmp_path / "cache")]) == 2
    err = one_line(capsys)
    assert f"--data {path} is not a regular file: it is {WORDS[kind]}" in err and "not found" not in err, err


@pytest.mark.parametrize("kind", ["fifo", "loop"])
@pytest.mark.parametrize("inside", [False, True], ids=["given", "in-a-folder"])
def test_a_pipe_or_a_symlink_loop_as_tokenizer_is_named_as_such(inside, kind, tmp_path, capsys):
    # it said "no tokenizer.json there", which the user's file seemingly is
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world\n")
    folder = tmp_path / "tok"
    folder.mkdir()
    path = _special(kind, folder / "tokenizer.json" if inside else tmp_path / "tokenizer.json")
    given = folder if inside else path
    assert main(["train", "--model", "tiny", "--data", str(corpus), "--tokenizer", str(given), *TRAIN,
                 "--data-cache", str(tmp_path / "cache")]) == 2
    err = one_line(capsys)
    assert f"--tokenizer {given}" in err and f"is not a regular file: it is {WORDS[kind]}" in err, err


@pytest.mark.parametrize("kind", ["fifo", "loop"])
def test_a_pipe_or_a_symlink_loop_in_a_data_folder_is_refused_not_left_out(kind, tmp_path):
    from shardwise.corpus.sources import expand
    from shardwise.errors import UsageError

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("some text\n")
    _special(kind, tmp_path / "data" / "b.txt")
    with pytest.raises(UsageError, match=f"b.txt is {WORDS[kind]}"):
        expand([str(tmp_path / "data")])


def test_a_symlink_loop_as_report_validate_is_named_as_such(tmp_path, capsys):
    path = _special("loop", tmp_path / "result.json")
    assert main(["report", "--validate", str(path), "--out", str(tmp_path / "r.html")]) == 2
    assert "a symlink loop" in one_line(capsys)


# --------------------------------------------------------------------------- 2, 3. a run's checkpoint, an HF folder


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A one-rank run stopped after step 1 of 2 (its train --json summary), and its model as an HF folder."""
    root = tmp_path_factory.mktemp("run")
    args = ["train", "--model", "tiny", "--steps", "2", "--global-batch", "2", "--seq-len", "16", "--no-progress",
            "--checkpoint-dir", str(root / "ckpt"), "--save-every", "1"]
    assert main([*args, "--stop-after", "1"]) == 0
    assert main(["checkpoint", "export", str(root / "ckpt"), "--format", "hf", "--to", str(root / "hf")]) == 0
    return root, args


def test_inspect_json_reports_dp_shard_as_train_does_and_the_checkpoint_still_resumes(run, tmp_path, capsys):
    import shutil

    root, args = run
    ckpt = tmp_path / "ckpt"
    shutil.copytree(root / "ckpt", ckpt)
    args = [a if a != str(root / "ckpt") else str(ckpt) for a in args]
    capsys.readouterr()
    assert main(["checkpoint", "inspect", str(ckpt), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["layout"]
    manifest = json.loads((ckpt / "step_000001" / "manifest.json").read_text())["layout"]
    assert manifest["dp_shard"] == 0  # the manifest as written: what older and newer shardwise read back
    assert main([*args, "--resume", "--json"]) == 0  # the resume reads the manifest's layout
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["first_step"] == 2
    assert shown["dp_shard"] == summary["layout"]["dp_shard"] == 1, (shown, summary["layout"])
    assert main(["checkpoint", "--json", "inspect", str(ckpt)]) == 0  # --json before the action: the same
    assert json.loads(capsys.readouterr().out)["layout"]["dp_shard"] == 1


def _weights(folder):
    return next(folder.glob("*.safetensors"))


def _header_file(file, header: bytes):
    file.write_bytes(struct.pack("<Q", len(header)) + header + bytes(64))


@pytest.mark.parametrize("damage", ["bytes-past-the-end", "header-a-list", "entry-a-number", "entry-without-offsets",
                                   "span-not-the-shape"])
def test_a_damaged_safetensors_file_is_one_line_before_any_rank_starts(damage, run, tmp_path, capsys):
    import shutil

    folder = tmp_path / "hf"
    shutil.copytree(run[0] / "hf", folder)
    file = _weights(folder)
    if damage == "bytes-past-the-end":  # passes the truncation check; safetensors refuses it in every rank
        with open(file, "ab") as f:
            f.write(b"left over")
    elif damage == "header-a-list":
        _header_file(file, b"[]")
    elif damage == "entry-a-number":
        _header_file(file, b'{"a": 1}')
    elif damage == "entry-without-offsets":
        _header_file(file, b'{"a": {"dtype": "F32", "shape": [1]}}')
    else:  # the last tensor's span 4 bytes short of what its shape needs: the header check passed it, the ranks not
        data = file.read_bytes()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
        header[last]["data_offsets"][1] -= 4
        text = json.dumps(header, separators=(",", ":")).encode().ljust(n)  # the same header length: the tensors' bytes stay where they were
        assert len(text) == n
        file.write_bytes(data[:8] + text + data[8 + n:])
    assert main(["train", "--model", str(folder), "--init", "pretrained", *TRAIN]) == 2
    err = one_line(capsys)
    assert f"{file}:" in err and "download it again" in err and "rank" not in err, err


# --------------------------------------------------------------------------- 4. unreadable Parquet


def _parquet(tmp_path, kind):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": [f"document {i} " * 20 for i in range(5000)]}), good, compression="snappy")
    data = bytearray(good.read_bytes())
    path = tmp_path / f"{kind}.parquet"
    if kind == "cut-short":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "text":
        path.write_text("this is text, not parquet\n" * 10)
    else:  # a damaged data page under a footer that reads
        for i in range(1000, len(data) // 2, 7):
            data[i] = 0xFF
        path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("kind, fix", [("cut-short", "write it again"), ("text", "give it a .txt or .jsonl name"),
                                       ("damaged-page", "write it again")])
def test_an_unreadable_parquet_file_says_the_fix(kind, fix, tmp_path, capsys):
    path = _parquet(tmp_path, kind)
    assert main(["train", "--model", "tiny", "--data", str(path), *TRAIN, "--data-cache", str(tmp_path / "cache")]) == 2
    err = one_line(capsys)
    assert f"{path}: not a" in err and "Parquet file" in err and fix in err, err


def test_parquet_without_pyarrow_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1" + bytes(16) + b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as where pyarrow is not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    assert main(["train", "--model", "tiny", "--data", str(path), *TRAIN, "--data-cache", str(tmp_path / "cache")]) == 2
    assert "pip install" in one_line(capsys)


@pytest.mark.parametrize("kind", ["fifo", "loop"])
@pytest.mark.parametrize("member", ["config.json", "model.safetensors", "a listed shard"])
def test_a_pipe_or_a_symlink_loop_inside_a_model_folder_is_named_as_such(member, kind, run, tmp_path, capsys):
    """Was "no config.json in this folder", "weights in model.safetensors, which shardwise does not read", or "missing
    — download it again"."""
    import shutil

    folder = tmp_path / "hf"
    shutil.copytree(run[0] / "hf", folder)
    if member == "a listed shard":
        path = _weights(folder)
    else:
        path = folder / member
        if member == "model.safetensors":
            _weights(folder).unlink()
            (folder / "model.safetensors.index.json").unlink()
    path.unlink(missing_ok=True)
    _special(kind, path)
    assert main(["train", "--model", str(folder), *TRAIN]) == 2
    err = one_line(capsys)
    assert f"is not a regular file: it is {WORDS[kind]}" in err and path.name in err, err
