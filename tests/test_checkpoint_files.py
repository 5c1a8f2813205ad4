"""Checkpoint files: what is in them, and what happens when they are wrong.

Damaged or foreign checkpoints (truncated shard, missing shard, random bytes, a different model, a different
run, a pickle that would run code) are refused by `train --resume`, `checkpoint inspect` and `checkpoint export`
with one line naming the file and exit 2, before any process group exists, and every file is left as it was.
Single process, in this process: a tiny model, a few steps.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil

import pytest
import torch
import torch.distributed as dist

from shardwise.paths import file_sha256
from shardwise.cli import main

ARGS = ["--model", "tiny", "--steps", "4", "--global-batch", "4", "--seq-len", "16", "--seed", "2", "--no-progress"]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A complete two-step checkpoint of a four-step run."""
    root = tmp_path_factory.mktemp("good") / "ckpt"
    assert main(["train", *ARGS, "--checkpoint-dir", str(root), "--stop-after", "2"]) == 0
    return root


def _copy(good, tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(good, root)
    return root, root / "step_000002"


def _snapshot(root) -> dict:
    return {str(p): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def _rehash(ckpt, name):
    """Make the manifest agree with a replaced file, as a forger would."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"][name] = {"bytes": (ckpt / name).stat().st_size, "sha256": file_sha256(ckpt / name)}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _truncate(ckpt):
    data = (ckpt / "__0_0.distcp").read_bytes()
    (ckpt / "__0_0.distcp").write_bytes(data[: len(data) // 2])
    return "__0_0.distcp", "truncated"


def _missing(ckpt):
    (ckpt / "__0_0.distcp").unlink()
    return "__0_0.distcp", "missing"


def _random_shard(ckpt):
    size = (ckpt / "__0_0.distcp").stat().st_size
    (ckpt / "__0_0.distcp").write_bytes(os.urandom(size))
    return "__0_0.distcp", "corrupted"


def _random_index(ckpt):
    (ckpt / ".metadata").write_bytes(os.urandom(4096))
    _rehash(ckpt, ".metadata")
    return ".metadata", "not a DCP checkpoint index"


def _persistent_id_index(ckpt):
    # a pickle whose unpickling fails with a message of two lines (what random bytes drew now and then)
    (ckpt / ".metadata").write_bytes(b"\x80\x04K\x01Q.")
    _rehash(ckpt, ".metadata")
    return ".metadata", "not a DCP checkpoint index (UnpicklingError: A load persistent id instruction"


def _random_manifest(ckpt):
    (ckpt / "manifest.json").write_bytes(os.urandom(300))
    return "manifest.json", "not valid JSON"


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def _code_in_index(ckpt):
    (ckpt / ".metadata").write_bytes(pickle.dumps(_Exploit()))
    _rehash(ckpt, ".metadata")
    return ".metadata", "refusing to load"


def _edit_manifest(change):
    def damage(ckpt):
        manifest = json.loads((ckpt / "manifest.json").read_text())
        problem = change(manifest)
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
        return "manifest.json", problem
    return damage


DAMAGE = {"truncated": _truncate, "missing-shard": _missing, "random-shard": _random_shard,
          "random-index": _random_index, "persistent-id-index": _persistent_id_index,
          "random-manifest": _random_manifest, "code-in-index": _code_in_index,
          "dp-zero": _edit_manifest(lambda m: m["layout"].update(dp=0) or "'layout.dp' is 0, but must be 1 or more"),
          "negative-step": _edit_manifest(lambda m: m.update(step=-3) or "'step' is -3"),
          "no-model-name": _edit_manifest(lambda m: m["model"].pop("name") and "'model.name' is None"),
          "hf-config-list": _edit_manifest(lambda m: m.update(hf_config=[1]) or "'hf_config' is [1]")}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("command", ["resume", "inspect", "export"])
def test_damaged_checkpoint_is_one_line_exit_2_and_untouched(damage, command, good, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root, ckpt = _copy(good, tmp_path)
    name, problem = DAMAGE[damage](ckpt)
    before = _snapshot(root)
    argv = {"resume": ["train", *ARGS, "--checkpoint-dir", str(root), "--resume"],
            "inspect": ["checkpoint", "inspect", str(root)],
            "export": ["checkpoint", "export", str(root), "--to", str(tmp_path / "m.safetensors")]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"shardwise: error: {ckpt / name}: ") and problem in err and "\n" not in err, err
    assert _snapshot(root) == before
    assert not dist.is_initialized()
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "m.safetensors").exists()


@pytest.mark.parametrize("argv, expected", [
    (["--model", "tiny-gpt2"], "written for model 'tiny', not 'tiny-gpt2'"),
    (["--seed", "3"], "that run used --seed 2 (now 3) — resume with the same settings"),
    (["--steps", "6"], "that run used --steps 4 (now 6)"),
    (["--stop-after", "1"], "--stop-after 1, but"),
])
def test_resume_refuses_another_model_or_run(argv, expected, good, tmp_path, capsys):
    root, _ = _copy(good, tmp_path)
    before = _snapshot(root)
    args = [a for a in ARGS]
    for flag, value in zip(argv[::2], argv[1::2]):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    assert main(["train", *args, "--checkpoint-dir", str(root), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err, err
    assert _snapshot(root) == before


def test_resume_names_the_model_folder_it_was_trained_with(good, tmp_path, capsys):
    """Two folders both named 'llama' (the name is the folder's): the refusal says another model of that name and
    suggests the --model the checkpoint was trained with, its path, not a preset that does not exist."""
    import json

    root, _ = _copy(good, tmp_path)
    trained, other = tmp_path / "a" / "llama", tmp_path / "b" / "llama"
    for folder, layers in ((trained, 2), (other, 3)):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({
            "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": layers,
            "num_attention_heads": 4, "vocab_size": 256, "max_position_embeddings": 64}))
    manifest = next(root.glob("step_*/manifest.json"))
    m = json.loads(manifest.read_text())
    m["model"]["name"], m["model_given"] = "llama", str(trained)
    manifest.write_text(json.dumps(m))
    args = [a for a in ARGS]
    args[args.index("--model") + 1] = str(other)
    assert main(["train", *args, "--init", "random", "--checkpoint-dir", str(root), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "written for another model named 'llama'" in err and f"use --model {trained} or" in err, err


def test_a_resume_without_model_trains_the_model_its_checkpoint_trained(tmp_path, capsys):
    # it read --model as tiny and refused "written for model 'tiny-gpt2', not 'tiny'" (helper-228)
    root = tmp_path / "ckpt"
    args = [a if a != "tiny" else "tiny-gpt2" for a in ARGS]
    assert main(["train", *args, "--checkpoint-dir", str(root), "--stop-after", "2"]) == 0
    capsys.readouterr()
    unnamed = [a for i, a in enumerate(ARGS) if a != "--model" and (i == 0 or ARGS[i - 1] != "--model")]
    assert main(["train", *unnamed, "--checkpoint-dir", str(root), "--resume"]) == 0
    out = capsys.readouterr()
    assert "--model tiny-gpt2, the one its checkpoint trained" in out.err + out.out
    assert (root / "step_000004").is_dir()


def test_a_resume_without_model_of_a_hub_id_resumes(tmp_path, capsys):
    # --model openai-community/gpt2 reads the gpt2 preset: its resume was refused as "not there any more" (helper-233)
    root = tmp_path / "ckpt"
    args = ["--model", "openai-community/gpt2", "--steps", "2", "--global-batch", "1", "--seq-len", "16", "--no-progress"]
    assert main(["train", *args, "--checkpoint-dir", str(root), "--stop-after", "1"]) == 0
    assert main(["train", *args[2:], "--checkpoint-dir", str(root), "--resume"]) == 0, capsys.readouterr().err


def test_a_resume_without_model_whose_model_folder_moved_says_so(tmp_path, capsys):
    # it said "--model /…/m: not found", a flag the user had not given (helper-231)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 256, "max_position_embeddings": 64}))
    root = tmp_path / "ckpt"
    args = [a if a != "tiny" else str(folder) for a in ARGS]
    assert main(["train", *args, "--checkpoint-dir", str(root), "--stop-after", "2"]) == 0
    folder.rename(tmp_path / "moved")
    capsys.readouterr()
    unnamed = [a for i, a in enumerate(ARGS) if a != "--model" and (i == 0 or ARGS[i - 1] != "--model")]
    assert main(["train", *unnamed, "--checkpoint-dir", str(root), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"was trained with --model {folder}, which is not there any more — pass --model" in err and "\n" not in err


@pytest.mark.parametrize("argv, expected", [
    (["--save-every", "2"], "--save-every needs --checkpoint-dir"),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--checkpoint-dir", "{empty}", "--resume"], "holds no complete checkpoint — drop --resume"),
    (["--checkpoint-dir", "{good}"], "already holds checkpoints of a run (newest step_000002) — add --resume"),
    (["--checkpoint-dir", "{empty}", "--stop-after", "9"], "--stop-after must be between 1 and --steps (4)"),
    (["--checkpoint-dir", "{empty}", "--save-every", "0"], "--save-every must be at least 1"),
    (["--checkpoint-dir", "{empty}", "--keep", "0"], "--keep must be at least 1"),
    (["--checkpoint-dir", "{empty}", "--max-restarts", "1"], "--max-restarts restarts the ranks of a multi-process job"),
    (["--max-restarts", "1", "--dp", "2"], "--max-restarts needs --checkpoint-dir"),
    (["--max-restarts", "-1", "--dp", "2"], "--max-restarts must be at least 0"),  # the value first: no folder fixes it
    (["--save-every", "0"], "--save-every must be at least 1"),
])
def test_checkpoint_flags(argv, expected, good, tmp_path, capsys):
    argv = [a.format(empty=tmp_path / "empty", good=good) for a in argv]
    assert main(["train", *ARGS, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shardwise: error: ") and expected in err and "\n" not in err, err


def test_finished_run_has_nothing_to_resume(tmp_path, capsys):
    root = tmp_path / "ckpt"
    assert main(["train", *ARGS, "--checkpoint-dir", str(root)]) == 0
    assert [p.name for p in root.iterdir()] == ["step_000004"]  # no --save-every: the last step only
    assert main(["train", *ARGS, "--checkpoint-dir", str(root), "--resume"]) == 2
    assert "is the end of the run (step 4 of 4)" in capsys.readouterr().err


def test_inspect_and_export(good, tmp_path, capsys):
    from safetensors.torch import load_file

    assert main(["checkpoint", "inspect", str(good), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["step"] == 2 and info["steps"] == 4 and info["layout"]["dp"] == 1 and info["model"]["name"] == "tiny"
    assert info["groups"]["model"]["elements"] == 180_800  # the tiny preset's parameters, as ModelSpec counts them
    assert info["groups"]["optim"]["tensors"] == 3 * info["groups"]["model"]["tensors"]
    assert main(["checkpoint", "--json", "inspect", str(good)]) == 0  # --json before the action, too
    assert json.loads(capsys.readouterr().out) == info
    assert main(["checkpoint", "inspect", str(good / "step_000002"), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "dp1·tp1·pp1" in out and "model.tok_embeddings.weight" in out and "256×64" in out
    assert main(["checkpoint", "export", str(good), "--to", str(tmp_path / "m.safetensors")]) == 0
    tensors = load_file(tmp_path / "m.safetensors")
    assert tensors["tok_embeddings.weight"].shape == (256, 64) and sum(t.numel() for t in tensors.values()) == 180_800
    # the exported weights are step 2's: resuming to step 4 from the same checkpoint starts from them
    from shardwise.checkpoint.export import load_tensors

    same, _ = load_tensors(good)
    assert all(torch.equal(same[k], v) for k, v in tensors.items())


def test_keep_k_and_crash_leftovers(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "step_000001.tmp").mkdir()  # a save that crashed
    assert main(["train", *ARGS, "--checkpoint-dir", str(root), "--save-every", "1", "--keep", "2"]) == 0
    assert sorted(p.name for p in root.iterdir()) == ["step_000003", "step_000004"]


def test_export_never_writes_into_the_checkpoint_it_reads(good, tmp_path, capsys):
    """--to inside the checkpoint folder (over one of its shards, say) is refused before anything is written."""
    root, ckpt = _copy(good, tmp_path)
    before = _snapshot(root)
    for fmt, to in (("safetensors", ckpt / "__0_0.distcp"), ("hf", ckpt / "hf")):
        assert main(["checkpoint", "export", str(root), "--format", fmt, "--to", str(to)]) == 2
        err = capsys.readouterr().err
        assert "inside the folder the checkpoint names" in err and err.count("\n") == 1
    assert _snapshot(root) == before


def test_export_replaces_an_earlier_export_and_nothing_else(good, tmp_path, capsys):
    """--to an existing file that is not an export of this command (a model's own weights, a text) is refused, as
    --format hf refuses a folder that is not empty; an earlier export is replaced."""
    theirs = tmp_path / "model.safetensors"
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, str(theirs))  # another tool's weights
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for path in (theirs, notes):
        before = path.read_bytes()
        assert main(["checkpoint", "export", str(good), "--to", str(path)]) == 2
        err = capsys.readouterr().err
        assert "exists and is not a model this command exported" in err and err.count("\n") == 1
        assert path.read_bytes() == before
    mine = tmp_path / "mine.safetensors"
    assert main(["checkpoint", "export", str(good), "--to", str(mine)]) == 0
    assert main(["checkpoint", "export", str(good), "--to", str(mine)]) == 0  # an earlier export: replaced


def test_a_tied_export_loads_as_the_docs_say(tmp_path):
    # docs/checkpoints.md and the README: a tied LM head is stored once, as the embedding; strict=False then tie()
    # gives the trained model (a plain load_state_dict misses output.weight, which an outside check hit)
    from safetensors.torch import load_file

    from shardwise.checkpoint.export import load_tensors
    from shardwise.model import Transformer
    from shardwise.specs import load_model

    root = tmp_path / "ckpt"
    assert main(["train", "--model", "tiny-gpt2", "--steps", "1", "--global-batch", "2", "--seq-len", "16",
                 "--no-progress", "--checkpoint-dir", str(root)]) == 0
    assert main(["checkpoint", "export", str(root), "--to", str(tmp_path / "m.safetensors")]) == 0
    model = Transformer(load_model("tiny-gpt2"))
    missing, _ = model.load_state_dict(load_file(tmp_path / "m.safetensors"), strict=False)
    assert missing == ["output.weight"]
    model.tie()
    trained, _ = load_tensors(root)  # the checkpoint's own tensors
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in trained.items())
    assert torch.equal(state["output.weight"], trained["tok_embeddings.weight"])  # the head is the trained embedding
    assert not torch.equal(trained["tok_embeddings.weight"], Transformer(load_model("tiny-gpt2")).tok_embeddings.weight)


def test_export_never_puts_a_file_where_a_device_or_pipe_was(good, tmp_path, capsys):
    """The export is renamed onto --to when finished: onto a device (a link to /dev/null here, so a fault could only
    ever replace the link) it would put a regular file where the device was, so --to must be a regular file or new;
    a named pipe is refused too, before anything blocks on it."""
    null, pipe = tmp_path / "null", tmp_path / "pipe"
    null.symlink_to(os.devnull)
    os.mkfifo(pipe)
    for to, what in ((null, "a device"), (pipe, "a named pipe")):
        assert main(["checkpoint", "export", str(good), "--to", str(to)]) == 2
        err = capsys.readouterr().err
        assert f"is {what}, not a regular file" in err and err.count("\n") == 1, err
    assert null.is_symlink() and null.is_char_device() and pipe.is_fifo()


def test_a_damaged_index_leaves_nothing_on_stderr_as_its_bytes_are_freed(tmp_path, monkeypatch):
    """Random bytes that read as a large pickled bytearray (these seeds' 4 KiB) make the unpickler export a buffer of
    a bytearray it then frees: CPython prints "deallocated bytearray object has exported buffers" through
    sys.excepthook when that happens, a second stderr line after the one-line refusal (seen once in a suite run)."""
    import gc
    import random
    import sys

    from shardwise.checkpoint.store import read_index
    from shardwise.errors import UsageError

    printed = []
    monkeypatch.setattr(sys, "excepthook", lambda *exc: printed.append(exc[1]))
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: printed.append(unraisable.exc_value))
    for seed in (454, 622, 1546, 1851, 2743, 3163, 3561, 4242, 4311, 5022, 5954, 6659, 6853, 7006, 7270, 7785, 7964,
                 8628, 9368, 9837, 9859, 10649, 10935, 11006, 12236):
        (tmp_path / ".metadata").write_bytes(random.Random(seed).randbytes(4096))
        with pytest.raises(UsageError, match="not a DCP checkpoint index"):
            read_index(tmp_path)
    gc.collect()
    assert not printed, printed


def test_a_resume_appends_only_to_its_own_runs_metrics_file(tmp_path, capsys):
    """A resumed run keeps its metrics file's records up to its step and appends: to a file another run wrote since
    (the same --metrics-file given to a second run), or one that is not train's records, that would mix two runs or
    fail inside a rank. Refused in one line, the file untouched; the run's own file resumes, every record its run's."""
    metrics = tmp_path / "m.jsonl"
    run = ["train", *ARGS, "--metrics-file", str(metrics), "--save-every", "2", "--stop-after", "2"]
    assert main([*run, "--checkpoint-dir", str(tmp_path / "a")]) == 0
    own = metrics.read_text()
    assert main([*run, "--checkpoint-dir", str(tmp_path / "b")]) == 0  # another run, the same metrics file
    other = metrics.read_text()
    capsys.readouterr()
    resume = [*run[:-2], "--checkpoint-dir", str(tmp_path / "a"), "--resume"]
    for text, said in ((other, "holds the records of another run"), ("not json\n", "line 1 is not a record")):
        metrics.write_text(text)
        assert main(resume) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
        assert metrics.read_text() == text
    metrics.write_text(own)
    assert main(resume) == 0
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4] and len({r["run"] for r in records}) == 1
    assert records[0]["run"] != json.loads(other.splitlines()[0])["run"]


def test_inspects_resume_line_keeps_validating_and_finds_the_data_from_elsewhere(tmp_path, monkeypatch, capsys):
    """A run started with relative --data and with --val-data --eval-every: the printed resume named the data as typed
    (wrong from any other folder) and left validation out (the resumed run would stop validating)."""
    import shlex
    from pathlib import Path

    import shardwise

    texts = Path(shardwise.__file__).parent / "data"
    (tmp_path / "run").mkdir()
    shutil.copy(texts / "lincoln.txt", tmp_path / "run" / "train.txt")
    shutil.copy(texts / "declaration_of_independence.txt", tmp_path / "run" / "val.txt")
    monkeypatch.chdir(tmp_path / "run")
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    base = [*[a for a in ARGS if a != "--no-progress"], "--no-progress", "--data", "train.txt", "--val-data", "val.txt",
            "--eval-every", "2", "--data-cache", str(tmp_path / "cache")]
    assert main(["train", *base, "--checkpoint-dir", str(ck), "--stop-after", "2", "--metrics-file", str(metrics)]) == 0
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setenv("COLUMNS", "1000")
    capsys.readouterr()
    assert main(["checkpoint", "inspect", str(ck)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "shardwise train" in ln)
    argv = shlex.split(line[line.index("shardwise train"):].split(" (with any")[0].strip(" │"))[1:]
    assert argv[argv.index("--data") + 1] == str(tmp_path / "run" / "train.txt")
    assert argv[argv.index("--val-data") + 1] == str(tmp_path / "run" / "val.txt")
    assert argv[argv.index("--eval-every") + 1] == "2"
    assert main(argv + ["--data-cache", str(tmp_path / "cache"), "--metrics-file", str(metrics)]) == 0
    records = [json.loads(ln) for ln in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4] and "val_loss" in records[-1]


def test_a_checkpoint_of_a_version_without_a_newer_model_field_resumes(good, tmp_path, capsys):
    """A manifest written before a ModelSpec field existed (attn_softcap, 2026-12-07) resumes: the missing field reads
    as its default, what that version built. One that states another value is still another model."""
    root, _ = _copy(good, tmp_path)
    manifest = next(root.glob("step_*/manifest.json"))
    m = json.loads(manifest.read_text())
    del m["model"]["attn_softcap"]
    manifest.write_text(json.dumps(m))
    assert main(["train", *ARGS, "--checkpoint-dir", str(root), "--resume"]) == 0, capsys.readouterr().err
    root, _ = _copy(good, tmp_path / "again")
    manifest = next(root.glob("step_*/manifest.json"))
    m = json.loads(manifest.read_text())
    m["model"]["attn_softcap"] = 30.0
    manifest.write_text(json.dumps(m))
    assert main(["train", *ARGS, "--checkpoint-dir", str(root), "--resume"]) == 2
    assert "attn_softcap 30.0 vs 0.0" in capsys.readouterr().err
