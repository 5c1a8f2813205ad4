"""Real data: your tokenizer, your corpus, tokenized once into a memory-mapped token file.

    tokenizer.py    the byte tokenizer (built-in corpus) or a Hugging Face tokenizer.json (`tokenizers`)
    sources.py      documents from text files, JSON lines and Parquet
    token_file.py   tokenize once into DIR/<key>.bin (uint16/uint32, like nanoGPT and Megatron), keyed by
                    the data's and the tokenizer's hashes, with a progress bar; reused while both are unchanged
    batches.py      fixed-length sequences of that file, in a seeded order, the same global batch for
                    every layout; the position is saved in checkpoints
"""

from __future__ import annotations



import os
from dataclasses import replace
from pathlib import Path

from shardwise.errors import UsageError


def choose_tokenizer(tokenizer: str | None, model: str | None, data):
    """--tokenizer, else the --model folder's own tokenizer.json (for --data; a --model config.json's folder too, where
    one sits beside it), else bytes, said in a note where --data of a --model folder or config.json is tokenized so (a
    preset's vocabulary is bytes or any)."""
    from shardwise.console import note
    from shardwise.corpus.tokenizer import BYTE_TOKENIZER, FILE, load_tokenizer

    if tokenizer:
        return load_tokenizer(tokenizer)
    if data and model:
        folder = Path(model) if Path(model).is_dir() else Path(model).parent if Path(model).is_file() else None
        if folder is not None and (folder / FILE).is_file():
            return load_tokenizer(folder)
    if data and model and Path(model).exists() and os.environ.get("RANK", "0") == "0":  # a model of its own: said once
        note(f"--data is tokenized as bytes (256 ids and end-of-text 0): no --tokenizer given and no {FILE} beside "
             f"--model {model} — give --tokenizer for its Hugging Face {FILE}")
    return BYTE_TOKENIZER


def prepare_run(cfg, *, data=None, val_data=None, tokenizer: str | None = None, model: str | None = None,
                field: str = "text", cache: str | None = None, progress: bool = False):
    """cfg with its data: --data and --val-data tokenized (or found in the cache) and checked against the model
    and the global batch. Every problem is one UsageError naming the file, before any process starts."""
    from shardwise.corpus.batches import check_size
    from shardwise.corpus.token_file import prepare
    from shardwise.corpus.tokenizer import check_vocab

    if tokenizer and not data:  # the built-in corpus is bytes, and --val-data is tokenized as the training data is
        raise UsageError("--tokenizer tokenizes --data — give --data PATH... (the built-in corpus, and --val-data "
                         "beside it, use bytes)")
    if cfg.eval_every is not None and not val_data:
        raise UsageError("--eval-every needs --val-data PATH... (the text to evaluate on)")
    for flag, value in (("--eval-every", cfg.eval_every), ("--eval-batches", cfg.eval_batches)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if field != "text":  # --data-field given: it names a field of JSON-lines or Parquet records, which plain text has not
        from shardwise.corpus.sources import expand

        paths = [*(data or []), *(val_data or [])]
        sources = [*expand(data or [], "--data"), *expand(val_data or [], "--val-data")]  # each named by its flag
        if paths and all(src.kind == "text" for src in sources):
            raise UsageError(f"--data-field {field} names a field of JSON-lines or Parquet records, and "
                             f"{', '.join(paths)} {'is' if len(paths) == 1 else 'are'} plain text — drop --data-field")
    tok = choose_tokenizer(tokenizer, model, data)  # --val-data alone: the built-in corpus's bytes, as it trains on
    check_vocab(tok, cfg.spec.vocab_size, cfg.spec.name)
    out = {}
    for key, paths, flag in (("data", data, "--data"), ("val_data", val_data, "--val-data")):
        if paths:
            tf = prepare(paths, tok, field, cache, progress, flag)
            check_size(tf, cfg.seq_len, cfg.global_batch, flag)
            out[key] = tf
    if "data" in out and "val_data" in out:
        _note_shared_files(out["data"], out["val_data"])
    return replace(cfg, **out) if out else cfg


def _note_shared_files(data, val_data) -> None:
    """A file both trained on and validated on: the validation loss then measures text the model trained on. Said
    (one note, rank 0), not refused: a smoke test may mean it."""
    import os

    from shardwise.console import note

    trained = {os.path.realpath(s) for s in data.sources}
    both = [s for s in val_data.sources if os.path.realpath(s) in trained]
    if both and os.environ.get("RANK", "0") == "0":
        more = f" and {len(both) - 1} more" if len(both) > 1 else ""
        note(f"--val-data {both[0]}{more} is also in --data: the validation loss measures text the run trains on")
