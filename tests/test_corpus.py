"""Real data in one process: what the token file holds, the cache, the layout-free batches, bad input."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import shardwise
from hf_models import make_tokenizer, shipped_texts, write_corpus
from shardwise.cli import main
from shardwise.corpus import token_file
from shardwise.corpus.batches import CorpusBatches
from shardwise.corpus.token_file import prepare
from shardwise.corpus.tokenizer import load_tokenizer

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return {"tokenizer": make_tokenizer(root / "tok"), "corpus": write_corpus(root / "data"), "cache": str(root / "cache"),
            "root": root}


def _tokens(tf) -> list[int]:
    return np.fromfile(tf.path, dtype=tf.dtype).tolist()


def _expected(tok_file, documents) -> list[int]:
    tok = tokenizers.Tokenizer.from_file(str(tok_file))
    eos = tok.token_to_id("<|endoftext|>")
    return [t for d in documents if d for t in tok.encode(d, add_special_tokens=False).ids + [eos]]


@pytest.mark.parametrize("kind", ["text", "jsonl", "parquet"])
def test_token_file_is_each_document_then_end_of_text(env, kind):
    corpus = env["corpus"]
    if kind not in corpus:
        pytest.skip("pyarrow is not installed (the [parquet] extra)")
    field = "body" if kind == "jsonl" else "text"
    tf = prepare([corpus[kind]], load_tokenizer(env["tokenizer"]), field, env["cache"])
    if kind == "text":
        docs = [p.read_text(encoding="utf-8") for p in sorted(corpus["text"].iterdir())]
    elif kind == "jsonl":
        docs = [json.loads(line)["body"] for line in corpus["jsonl"].read_text(encoding="utf-8").splitlines()]
    else:
        import pyarrow.parquet as pq

        docs = pq.read_table(corpus["parquet"]).column("text").to_pylist()
    assert tf.dtype == "uint16" and tf.documents == len(docs)
    assert _tokens(tf) == _expected(env["tokenizer"], docs)


def test_a_long_file_read_in_pieces_has_the_whole_file_tokens(env, tmp_path, monkeypatch):
    """A file is encoded in pieces (here 16 KB, 1 MB in use) cut between lines: for byte-level BPE, the same tokens."""
    from shardwise.corpus import sources

    monkeypatch.setattr(sources, "PIECE", 16 << 10)
    text = "\n".join(p.read_text(encoding="utf-8") for p in shipped_texts()) * 3
    assert len(text.encode()) > 8 * sources.PIECE
    (tmp_path / "long.txt").write_text(text, encoding="utf-8")
    tf = prepare([tmp_path / "long.txt"], load_tokenizer(env["tokenizer"]), cache=env["cache"])
    assert tf.documents == 1 and _tokens(tf) == _expected(env["tokenizer"], [text])


def test_the_cache_is_reused_and_keyed_by_data_and_tokenizer(env, tmp_path, monkeypatch):
    tok = load_tokenizer(env["tokenizer"])
    (tmp_path / "a.txt").write_text("one document " * 50)
    first = prepare([tmp_path / "a.txt"], tok, cache=env["cache"])
    monkeypatch.setattr(token_file, "_tokenize", lambda *a, **k: pytest.fail("tokenized again"))
    assert prepare([tmp_path / "a.txt"], tok, cache=env["cache"]) == first
    monkeypatch.undo()
    (tmp_path / "a.txt").write_text("another document " * 50)
    second = prepare([tmp_path / "a.txt"], tok, cache=env["cache"])
    from shardwise.corpus.tokenizer import BYTE_TOKENIZER

    third = prepare([tmp_path / "a.txt"], BYTE_TOKENIZER, cache=env["cache"])
    assert len({first.key, second.key, third.key}) == 3
    assert third.dtype == "uint16" and _tokens(third) == list(("another document " * 50).encode()) + [0]


def test_a_cache_filled_from_another_directory_or_copied_reads_its_own_tokens(env, tmp_path, monkeypatch):
    # the token file's path was recorded relative to the filling run's working directory: a run elsewhere missed the
    # cache and tokenized again, and a copied cache folder went on reading the original's tokens
    import shutil

    from shardwise.corpus.tokenizer import BYTE_TOKENIZER

    (tmp_path / "a.txt").write_text("one document " * 50)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    first = prepare([tmp_path / "a.txt"], BYTE_TOKENIZER, cache="cache")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(token_file, "_tokenize", lambda *a, **k: pytest.fail("tokenized again"))
    hit = prepare([tmp_path / "a.txt"], BYTE_TOKENIZER, cache=str(tmp_path / "here" / "cache"))
    assert hit.path == first.path == str((tmp_path / "here" / "cache" / f"{first.key}.bin").resolve())
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tmp_path / "here" / "cache", tmp_path / "copy")
    copied = prepare([tmp_path / "a.txt"], BYTE_TOKENIZER, cache=str(tmp_path / "copy"))
    assert copied.path == str((tmp_path / "copy" / f"{first.key}.bin").resolve())
    with open(copied.path, "r+b") as f:  # a damaged copy is the copy's miss, not a silent read of the original
        f.truncate(10)
    again = prepare([tmp_path / "a.txt"], BYTE_TOKENIZER, cache=str(tmp_path / "copy"))
    assert again.path == copied.path and _tokens(again) == _tokens(first)


def test_a_cache_hit_records_the_runs_own_files_and_tokenizer(env, tmp_path):
    """The cache is keyed by contents: a hit made from copies elsewhere names this run's corpus and tokenizer, so a
    checkpoint's export copies the tokenizer this run read, not the one that first filled the cache."""
    import shutil

    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
        (folder / "a.txt").write_text("one document " * 50)
        shutil.copy(env["tokenizer"], folder / "tokenizer.json")
    one = prepare([first / "a.txt"], load_tokenizer(first / "tokenizer.json"), cache=env["cache"])
    two = prepare([second / "a.txt"], load_tokenizer(second / "tokenizer.json"), cache=env["cache"])
    assert two.key == one.key and two.path == one.path  # the same cached tokens
    assert two.sources == (str(second / "a.txt"),) and two.tokenizer == str((second / "tokenizer.json").resolve())


def test_global_batches_do_not_depend_on_the_layout_and_resume_anywhere(env):
    """Every dp split of a step's batch is the same global batch, over epoch boundaries, and a position
    restored under another dp continues with the same next batch."""
    tf = prepare([env["corpus"]["jsonl"]], load_tokenizer(env["tokenizer"]), "body", env["cache"])
    B, S = 8, 128
    ref = CorpusBatches(tf, seed=5, global_batch=B, seq_len=S)
    steps = ref.sequences.count // B + 3  # the run crosses an epoch
    reference = [torch.cat([x for x, _ in ref.local_microbatches(s, 1, 0, B, "cpu")]) for s in range(1, steps + 1)]
    assert not torch.equal(reference[0], reference[1])
    for dp in (2, 4):
        ranks = [CorpusBatches(tf, seed=5, global_batch=B, seq_len=S) for _ in range(dp)]
        for s in range(1, steps + 1):
            got = torch.cat([x for r, b in enumerate(ranks) for x, _ in b.local_microbatches(s, dp, r, 1, "cpu")])
            assert torch.equal(got, reference[s - 1]), (dp, s)
    saved = CorpusBatches(tf, seed=5, global_batch=B, seq_len=S)
    for s in range(1, 6):
        saved.local_microbatches(s, 1, 0, B, "cpu")
    state = json.loads(json.dumps(saved.state(5)))
    assert state["sequences"] == 5 * B and state["tokens"] == 5 * B * S and state["next_step"] == 6
    resumed = [CorpusBatches(tf, seed=5, global_batch=B, seq_len=S) for _ in range(4)]
    for b in resumed:
        b.restore(state, 5)
    nxt = torch.cat([x for r, b in enumerate(resumed) for x, _ in b.local_microbatches(6, 4, r, 2, "cpu")])
    assert torch.equal(nxt, reference[5])
    other_seed = CorpusBatches(tf, seed=6, global_batch=B, seq_len=S)
    assert not torch.equal(torch.cat([x for x, _ in other_seed.local_microbatches(1, 1, 0, B, "cpu")]), reference[0])


def test_train_reports_validation_loss_and_perplexity(env, tmp_path):
    corpus = env["corpus"]
    args = ["train", "--model", "tiny", "--steps", "4", "--global-batch", "4", "--seq-len", "32", "--no-progress",
            "--data", str(corpus["text"]), "--val-data", str(corpus["jsonl"]), "--data-field", "body",
            "--eval-every", "2", "--eval-batches", "2", "--data-cache", env["cache"], "--metrics-file", str(tmp_path / "m.jsonl")]
    assert main(args) == 0
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        assert r["val_perplexity"] == pytest.approx(np.exp(r["val_loss"]))
    assert evals[1]["val_loss"] < evals[0]["val_loss"] < np.log(256) + 0.5


def _one_line_error(capsys, argv, *needles):
    assert main(["train", "--model", "tiny", "--steps", "1", "--global-batch", "4", "--seq-len", "32", "--no-progress",
                 *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and all(n in err for n in needles), err


def test_bad_data_is_one_line_naming_the_file(env, tmp_path, capsys, monkeypatch):
    cache = ["--data-cache", env["cache"]]
    (tmp_path / "empty.txt").write_text("")
    _one_line_error(capsys, ["--data", str(tmp_path / "empty.txt"), *cache], "empty.txt", "corpus is empty")
    (tmp_path / "short.txt").write_text("too short for a batch of four sequences of 32 tokens " * 2)
    _one_line_error(capsys, ["--data", str(tmp_path / "short.txt"), *cache], "short.txt", "fewer than one global batch of 4")
    _one_line_error(capsys, ["--data", str(tmp_path / "nope.txt")], "nope.txt: not found")
    _one_line_error(capsys, ["--data", str(env["corpus"]["text"]), "--tokenizer", str(env["tokenizer"]), *cache],
                    str(env["tokenizer"]), "vocabulary of 384 tokens exceeds the 256 of tiny")
    saved = tmp_path / "saved"  # datasets' save_to_disk: Arrow files, which read as "not UTF-8 text" before
    saved.mkdir()
    for name in ("data-00000-of-00001.arrow", "state.json", "dataset_info.json"):
        (saved / name).write_bytes(b"\xff\xff\xff\xff")
    _one_line_error(capsys, ["--data", str(saved)], "data-00000-of-00001.arrow is an Arrow file", "to_parquet")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    _one_line_error(capsys, ["--data", str(tmp_path / "bad.jsonl"), *cache], "bad.jsonl:2: not valid JSON")
    _one_line_error(capsys, ["--data", str(env["corpus"]["jsonl"]), *cache], "paragraphs.jsonl:1: no text field 'text'",
                    "--data-field")
    (tmp_path / "nul.txt").write_bytes(b"abc\x00def " * 100)  # NUL is the byte tokenizer's end-of-text token
    _one_line_error(capsys, ["--data", str(tmp_path / "nul.txt"), *cache], "nul.txt: holds a NUL character",
                    "--tokenizer")
    (tmp_path / "number.jsonl").write_text('{"text": 5}\n')  # the field is there: it holds no text
    _one_line_error(capsys, ["--data", str(tmp_path / "number.jsonl"), *cache], "number.jsonl:1: field 'text' holds int 5, not text")
    # the token cache's folder set by $SHARDWISE_CACHE is named as that, not as --data-cache nobody gave
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SHARDWISE_CACHE", str(tmp_path / "a-file"))
    _one_line_error(capsys, ["--data", str(tmp_path / "number.jsonl")], "$SHARDWISE_CACHE (the token cache's folder)")
    monkeypatch.delenv("SHARDWISE_CACHE")
    if "parquet" in env["corpus"]:
        _one_line_error(capsys, ["--data", str(env["corpus"]["parquet"]), "--data-field", "body", *cache],
                        "paragraphs.parquet: no column 'body'")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    _one_line_error(capsys, ["--data", str(tmp_path / "x.parquet")], "x.parquet: reading Parquet needs pyarrow",
                    "pip install")
    _one_line_error(capsys, ["--eval-every", "2"], "--eval-every needs --val-data")
    _one_line_error(capsys, ["--tokenizer", str(env["tokenizer"])], "--tokenizer tokenizes --data")
    (tmp_path / "t.json").write_text("{not json")
    _one_line_error(capsys, ["--data", str(tmp_path / "short.txt"), "--tokenizer", str(tmp_path / "t.json")], "t.json",
                    "not a tokenizer.json")


def test_resume_continues_with_the_next_batch_and_refuses_other_data(env, tmp_path, capsys, monkeypatch):
    """Through the CLI: stop after step 2, resume to step 4 = the uninterrupted run; other data is refused."""
    base = ["train", "--model", "tiny", "--steps", "4", "--global-batch", "4", "--seq-len", "32", "--no-progress",
            "--data", str(env["corpus"]["jsonl"]), "--data-field", "body", "--data-cache", env["cache"]]
    assert main(base + ["--metrics-file", str(tmp_path / "straight.jsonl")]) == 0
    ck = ["--checkpoint-dir", str(tmp_path / "ck"), "--metrics-file", str(tmp_path / "split.jsonl")]
    assert main(base + ck + ["--stop-after", "2"]) == 0
    manifest = json.loads(next((tmp_path / "ck").glob("step_*/manifest.json")).read_text())
    assert manifest["data_position"]["sequences"] == 2 * 4 and manifest["data"]["files"] == [str(env["corpus"]["jsonl"])]
    # other data is refused (asked of the unfinished run: a finished one is said to be finished first)
    other = [a if a != str(env["corpus"]["jsonl"]) else str(env["corpus"]["text"]) for a in base]
    capsys.readouterr()
    assert main([a for a in other if a not in ("--data-field", "body")] + ck + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert f"that run trained on {env['corpus']['jsonl']}" in err and "tokenized as None" not in err
    built_in = [a for a in base if a not in ("--data", str(env["corpus"]["jsonl"]), "--data-field", "body")]
    assert main(built_in + ck + ["--resume"]) == 2  # the built-in corpus is other data too
    assert "that run trained on" in capsys.readouterr().err
    assert main(base + ck + ["--resume"]) == 0
    read = lambda f: [json.loads(line)["loss"] for line in (tmp_path / f).read_text().splitlines()]  # noqa: E731
    assert read("split.jsonl") == read("straight.jsonl")
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "1000")  # the table's resume line on one line
    assert main(["checkpoint", "inspect", str(tmp_path / "ck")]) == 0  # its resume line names the data
    out = capsys.readouterr().out
    assert f"--data {env['corpus']['jsonl']} --data-field body --checkpoint-dir" in out  # bytes: no --tokenizer
    # the printed command resumes the run (the field is part of what the data is)
    import shlex

    line = next(ln for ln in out.splitlines() if "shardwise train" in ln)
    argv = shlex.split(line[line.index("shardwise train"):].split(" (with any")[0].strip(" │"))[1:]
    assert argv[:3] == ["train", "--model", "tiny"]
    assert main(argv + ["--data-cache", env["cache"], "--no-progress", "--steps", "4"]) == 2  # 4 of 4: nothing left
    assert "is the end of the run" in capsys.readouterr().err


def test_inspects_resume_line_names_the_model_as_given_and_the_expert_split(tmp_path, monkeypatch, capsys):
    # a run started from a config file (and with its experts over 2 ranks): the printed resume named the file's stem,
    # "--model moe", which is no preset, and "written by" left the experts' split out
    import shlex

    config = tmp_path / "moe.json"
    config.write_text((Path(shardwise.__file__).parent / "presets" / "models" / "tiny-moe.json").read_text())
    ck = tmp_path / "ck"
    monkeypatch.chdir(tmp_path)  # the run names its model relative to where it ran; inspect runs from elsewhere
    base = ["train", "--model", "moe.json", "--steps", "2", "--global-batch", "4", "--seq-len", "16", "--no-progress",
            "--checkpoint-dir", str(ck)]
    assert main(base + ["--dp", "2", "--ep", "2", "--stop-after", "1"]) == 0
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setenv("COLUMNS", "1000")
    capsys.readouterr()
    assert main(["checkpoint", "inspect", str(ck)]) == 0
    out = capsys.readouterr().out
    assert "dp2·tp1·pp1·ep2 (2 ranks)" in out
    line = next(ln for ln in out.splitlines() if "shardwise train" in ln)
    argv = shlex.split(line[line.index("shardwise train"):].split(" (with any")[0].strip(" │"))[1:]
    assert argv[:3] == ["train", "--model", str(config)]
    assert main(argv + ["--no-progress"]) == 0  # the printed command resumes (on one process) and finishes


def test_export_leaves_out_a_tokenizer_that_changed_since_the_run(env, tmp_path, capsys):
    """The checkpoint records the tokenizer's sha256: an export copies the tokenizer while it is the file the run
    trained with, and leaves out (and says so) one edited or retrained since — its ids would not be the weights'."""
    tok = tmp_path / "tok" / "tokenizer.json"
    tok.parent.mkdir()
    shutil.copy(env["tokenizer"], tok)
    config = tmp_path / "m.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                  "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 512,
                                  "max_position_embeddings": 64}))
    ck = tmp_path / "ck"
    assert main(["train", "--model", str(config), "--steps", "1", "--global-batch", "2", "--seq-len", "16",
                 "--no-progress", "--data", str(env["corpus"]["text"]), "--tokenizer", str(tok), "--data-cache",
                 env["cache"], "--checkpoint-dir", str(ck)]) == 0
    assert main(["checkpoint", "export", str(ck), "--format", "hf", "--to", str(tmp_path / "same")]) == 0
    assert (tmp_path / "same" / "tokenizer.json").read_bytes() == tok.read_bytes()
    tok.write_text(tok.read_text() + "\n")  # another file at the same path
    capsys.readouterr()
    assert main(["checkpoint", "export", str(ck), "--format", "hf", "--to", str(tmp_path / "changed")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert not (tmp_path / "changed" / "tokenizer.json").exists()
    assert "it changed since the run (another sha256)" in out and "tokenizer from" not in out, out
    tok.unlink()  # removed since the run: said too (it was left out without a word)
    assert main(["checkpoint", "export", str(ck), "--format", "hf", "--to", str(tmp_path / "gone")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert not (tmp_path / "gone" / "tokenizer.json").exists() and "is no longer there" in out, out
    assert main(["checkpoint", "export", str(ck), "--format", "hf", "--to", str(tmp_path / "gone2"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer_missing"] == str(tok)


@pytest.mark.parametrize("dp", [1, 2])
def test_a_damaged_cache_entry_of_the_right_size_names_its_file_in_one_line(dp, tmp_path, capsys):
    """A token cache entry whose bytes changed after it was written (its size still right, so it is taken): the
    first batch that reads a token the model has no row for names the file and how to recover, in one line, at
    world 1 as at world 2 — before, an embedding's IndexError (a traceback at world 1)."""
    (tmp_path / "a.txt").write_text("one document of plain words " * 200)
    argv = ["train", "--model", "tiny", "--steps", "1", "--dp", str(dp), "--data", str(tmp_path / "a.txt"),
            "--data-cache", str(tmp_path / "cache")]
    assert main(argv) == 0
    capsys.readouterr()
    (entry,) = (tmp_path / "cache").glob("*.bin")
    entry.write_bytes(b"\xff" * entry.stat().st_size)
    assert main(argv) == (2 if dp == 1 else 1)  # a refusal in this process; a rank's failure at world 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    said = "token file" if dp == 1 else "training stopped: rank [01] failed: token file"  # both read a batch
    assert len(err) == 1 and re.match(f"shardwise: error: {said}", err[0]), err
    assert str(entry) in err[0] and "outside the model's vocabulary" in err[0] and "delete it" in err[0]


def test_a_resume_whose_data_files_changed_says_so_not_to_give_the_same_data(tmp_path, capsys):
    """Resumed with the same --data whose contents changed since: the fix is the files, not the flags (it had said
    'resume with the same --data', which the user had given). Another file still gets that advice."""
    (tmp_path / "a.txt").write_text("one document of plain words " * 200)
    (tmp_path / "b.txt").write_text("another document of other words " * 200)
    run = ["train", "--model", "tiny", "--data-cache", str(tmp_path / "cache"), "--checkpoint-dir", str(tmp_path / "ck"),
           "--no-progress"]
    assert main([*run, "--steps", "2", "--stop-after", "1", "--data", str(tmp_path / "a.txt")]) == 0
    (tmp_path / "a.txt").write_text("the same name, other words " * 200)
    capsys.readouterr()
    for data, said in (("a.txt", "and the files changed since (the data tokenizes differently now) — restore the files"),
                       ("b.txt", "resume with the same --data, --data-field and --tokenizer")):
        assert main([*run, "--steps", "2", "--resume", "--data", str(tmp_path / data)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err


def test_validation_beside_the_built_in_corpus_is_tokenized_as_it_trains(env, tmp_path, capsys):
    """--val-data without --data: the run trains on the built-in corpus's bytes, so its validation text is tokenized
    with bytes too (a model folder's own BPE tokenizer.json had been used, measuring ids it never trained on); a
    --tokenizer beside --val-data alone is refused, as it tokenizes --data only."""
    folder = tmp_path / "model"
    folder.mkdir()
    from shardwise.specs import load_model

    (folder / "config.json").write_text(json.dumps(load_model("tiny").to_hf_config()))
    shutil.copy(env["tokenizer"], folder / "tokenizer.json")
    text = tmp_path / "val.txt"
    text.write_text("plain words to validate on, " * 400)
    cache = tmp_path / "cache"
    assert main(["train", "--model", str(folder), "--steps", "1", "--val-data", str(text), "--data-cache", str(cache),
                 "--global-batch", "4", "--seq-len", "32", "--no-progress"]) == 0
    (meta,) = cache.glob("*.json")
    assert json.loads(meta.read_text())["tokenizer"] == "bytes"
    assert json.loads(meta.read_text())["tokens"] == len(text.read_bytes()) + 1  # one per byte, then end-of-text
    capsys.readouterr()
    _one_line_error(capsys, ["--val-data", str(text), "--tokenizer", str(env["tokenizer"])],
                    "--tokenizer tokenizes --data", "--val-data beside it, use bytes")


def test_files_a_folder_scan_cannot_see_are_named_not_dropped(tmp_path, capsys, monkeypatch):
    """A --data folder's subfolder this user cannot list, or a link to nothing, had been skipped by the scan (the
    corpus silently shrank); each is one line now. A file this user may not read is one line (it was a traceback)."""
    import os

    data = tmp_path / "d"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("plain words " * 400)
    (data / "sub" / "b.txt").write_text("more words " * 400)
    (data / "c.txt").symlink_to(tmp_path / "nowhere.txt")
    _one_line_error(capsys, ["--data", str(data)], f"{data / 'c.txt'} is a link to nothing")
    (data / "c.txt").unlink()
    scandir = os.scandir

    def refusing(path="."):  # root lists any folder: as one who may not
        if str(path).endswith("sub"):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    _one_line_error(capsys, ["--data", str(data)], f"cannot list {data / 'sub'} (Permission denied)")
    monkeypatch.setattr(os, "scandir", scandir)
    from shardwise import paths

    def unreadable(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(paths, "file_sha256", unreadable)
    monkeypatch.setattr(token_file, "file_sha256", unreadable)
    _one_line_error(capsys, ["--data", str(data / "a.txt"), "--data-cache", str(tmp_path / "cache")],
                    f"{data / 'a.txt'}: Permission denied — this user cannot open it")


def test_a_json_lines_file_in_another_encoding_says_so_with_the_byte(tmp_path, capsys):
    """A latin-1 byte in a .jsonl line is named as not UTF-8, at its byte offset in the file (it read "not valid
    JSON", and the docs promise the offset)."""
    (tmp_path / "l1.jsonl").write_bytes(b'{"text": "first line"}\n{"text": "caf\xe9 au lait"}\n')
    _one_line_error(capsys, ["--data", str(tmp_path / "l1.jsonl")], "l1.jsonl:2: not UTF-8 text (byte 36)")


def test_a_compressed_corpus_says_to_decompress_it(tmp_path, capsys):
    """A .jsonl.gz read as text had been called 'not UTF-8 — convert it to UTF-8', the wrong fix."""
    import gzip

    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(b'{"text": "hello world"}\n' * 50))
    _one_line_error(capsys, ["--data", str(tmp_path / "c.jsonl.gz")], "a gzip-compressed file — decompress it first")


def test_a_json_document_is_refused_rather_than_trained_as_raw_text(tmp_path, capsys):
    """data.json, an array of records, had trained as raw text, brackets and keys included (helper-204)."""
    (tmp_path / "data.json").write_text(json.dumps([{"text": "a document " * 50}] * 20))
    _one_line_error(capsys, ["--data", str(tmp_path / "data.json")], "a .json file is one JSON document",
                    "write its records one per line as .jsonl")


def test_a_missing_validation_path_is_named_by_its_own_flag_beside_a_data_field(tmp_path, capsys):
    (tmp_path / "d.jsonl").write_text('{"body": "words of text"}\n' * 200)
    _one_line_error(capsys, ["--data", str(tmp_path / "d.jsonl"), "--data-field", "body", "--val-data",
                             str(tmp_path / "none.jsonl")], f"--val-data {tmp_path / 'none.jsonl'}: not found")


def test_a_linked_subfolder_of_a_data_folder_is_read_once_and_a_link_back_up_ends(tmp_path):
    """A link to a folder inside a --data folder had been skipped (os.walk without followlinks): the corpus silently
    shrank, and a folder of links only was 'empty'. Its files are read now, in path order; a link back to a folder
    it lies in is not followed again (a cycle)."""
    from shardwise.corpus.tokenizer import BYTE_TOKENIZER

    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "b.txt").write_text("linked words " * 300)
    data = tmp_path / "d"
    data.mkdir()
    (data / "a.txt").write_text("own words " * 300)
    (data / "more").symlink_to(texts)
    (texts / "up").symlink_to(data)  # d/more/up is d again: a cycle
    tf = prepare([str(data)], BYTE_TOKENIZER, cache=str(tmp_path / "cache"))
    assert list(tf.sources) == [str(data / "a.txt"), str(data / "more" / "b.txt")]
    assert tf.documents == 2 and tf.tokens == len("own words " * 300) + len("linked words " * 300) + 2
    (texts / "up").unlink()
    only = tmp_path / "only"
    only.mkdir()
    (only / "more").symlink_to(texts)
    assert list(prepare([str(only)], BYTE_TOKENIZER, cache=str(tmp_path / "cache")).sources) == [
        str(only / "more" / "b.txt")]


def test_a_file_named_twice_is_read_once_with_one_note(tmp_path, capsys):
    """A folder and a file in it (--data texts texts/a.txt) had trained a.txt twice without a word."""
    from shardwise.corpus.tokenizer import BYTE_TOKENIZER

    data = tmp_path / "texts"
    data.mkdir()
    (data / "a.txt").write_text("first words " * 300)
    (data / "b.txt").write_text("second words " * 300)
    tf = prepare([str(data), str(data / "a.txt")], BYTE_TOKENIZER, cache=str(tmp_path / "cache"))
    assert list(tf.sources) == [str(data / "a.txt"), str(data / "b.txt")] and tf.documents == 2
    capsys.readouterr()
    assert main(["train", "--model", "tiny", "--steps", "1", "--global-batch", "4", "--seq-len", "32", "--no-progress",
                 "--data", str(data), str(data / "a.txt"), "--data-cache", str(tmp_path / "cache")]) == 0
    notes = [ln for ln in capsys.readouterr().err.splitlines() if "twice" in ln]
    assert notes == [f"note: --data names {data / 'a.txt'} twice — it is read once"]


def test_a_model_config_files_folder_lends_its_tokenizer_and_bytes_are_said(tmp_path, capsys):
    # --model DIR/config.json with DIR/tokenizer.json beside it tokenized --data as bytes, unsaid (helper-228)
    from hf_models import make_model

    from shardwise.corpus import choose_tokenizer
    from shardwise.corpus.tokenizer import BYTES

    folder = tmp_path / "llama"
    make_model(folder, "llama", tokenizer=True)
    data = [str(tmp_path / "a.txt")]
    assert choose_tokenizer(None, str(folder / "config.json"), data).path == str((folder / "tokenizer.json").resolve())
    assert "tokenized as bytes" not in capsys.readouterr().err
    (folder / "tokenizer.json").unlink()
    assert choose_tokenizer(None, str(folder / "config.json"), data).path == BYTES
    assert "--data is tokenized as bytes" in capsys.readouterr().err
    assert choose_tokenizer(None, "tiny", data).path == BYTES  # a preset: nothing to say
    assert capsys.readouterr().err == ""
