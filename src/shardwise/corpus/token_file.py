"""Tokenize a corpus once into a memory-mapped token file, and reuse it while neither data nor tokenizer changes.

    CACHE/<key>.bin    every document's tokens followed by the end-of-text token, back to back, as raw
                       uint16 (vocabularies up to 65,536) or uint32: nanoGPT's train.bin, Megatron's .bin
    CACHE/<key>.json   what it holds: token and document counts, dtype, sources, tokenizer; written last,
                       so a file without it is never used
key = sha256(format, tokenizer file hash, end-of-text id, --data-field, each file's kind and content hash).
The .bin is written to a temporary name and renamed; a lock file makes concurrent jobs (torchrun starts
every rank through this) tokenize once while the others wait for the result.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from shardwise.corpus.sources import Source, expand, pieces
from shardwise.paths import file_sha256
from shardwise.corpus.tokenizer import BYTES, TokenizerSpec, encoder
from shardwise.errors import UsageError

FORMAT = 1
BATCH_BYTES = 4 << 20  # text handed to the tokenizer at once: parallel encoding, bounded memory


@dataclass(frozen=True)
class TokenFile:
    path: str  # the .bin
    dtype: str
    tokens: int
    documents: int
    key: str
    sources: tuple[str, ...]
    tokenizer: str  # "bytes" or the tokenizer.json
    eos_id: int
    given: tuple[str, ...] = ()  # the --data arguments as given (files or folders), for a resume line
    field: str = "text"  # --data-field: the records' field read (JSON lines, Parquet)
    tokenizer_sha256: str = ""  # the tokenizer's hash (TokenizerSpec.sha256): a checkpoint records what it trained with

    def describe(self) -> str:
        first = self.sources[0] + (f" and {len(self.sources) - 1} more" if len(self.sources) > 1 else "")
        return first


def cache_dir(given: str | None = None) -> tuple[Path, str]:
    """The token cache's folder, and what set it (for a message about it): --data-cache, else $SHARDWISE_CACHE, else
    the user's cache folder."""
    if given:
        return Path(given), "--data-cache"
    if os.environ.get("SHARDWISE_CACHE"):
        return Path(os.environ["SHARDWISE_CACHE"]) / "tokens", "$SHARDWISE_CACHE (the token cache's folder)"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "shardwise" / "tokens", "the token cache's folder (set --data-cache)"


def check_cache_outside(cache: str | None, reads: dict) -> None:
    """The token cache lies in none of the folders read whole as data (`reads`: {"--data PATH": PATH}): the next run
    on that folder would read the cache's KEY.bin as text and refuse its KEY.json. A hidden folder is exempt: the
    scan skips it (sources._folder_files). One UsageError naming what set the cache's folder."""
    root, _ = cache_dir(cache)
    real = Path(os.path.realpath(root))
    for flag, path in reads.items():
        folder = Path(os.path.realpath(path))
        if folder.is_dir() and (real == folder or folder in real.parents) and \
                not any(part.startswith(".") for part in real.relative_to(folder).parts):
            what, fix = _cache_named(cache, root)
            raise UsageError(f"{what} lies inside the folder {flag} reads: the next run on it would read the cache's "
                             f"files as data — {fix}")


def _cache_named(cache: str | None, root: Path) -> tuple[str, str]:
    """(the cache's folder as the user set it, the fix that moves it)."""
    fix = "give --data-cache a folder outside it"
    if cache:
        return f"--data-cache {cache}", fix
    if os.environ.get("SHARDWISE_CACHE"):
        return f"the token cache {root} ($SHARDWISE_CACHE/tokens)", "set SHARDWISE_CACHE elsewhere, or " + fix
    return f"the token cache {root} (the default, under $XDG_CACHE_HOME or ~/.cache)", fix


def data_key(sources: list[Source], tok: TokenizerSpec, field: str) -> str:
    desc = {"format": FORMAT, "tokenizer": tok.sha256, "eos": tok.eos_id, "dtype": tok.dtype,
            "field": field, "files": [[s.kind, file_sha256(s.path)] for s in sources]}
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:32]


@contextmanager
def _locked(path: Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _cached(meta: Path) -> TokenFile | None:
    """The cache entry `meta` describes, if its token file is whole. The tokens are the file beside it (KEY.bin by
    KEY.json), wherever the entry was written from: a path recorded relative to another run's working directory, or
    a cache folder copied elsewhere, must not read another folder's file."""
    try:
        info = json.loads(meta.read_text())
        tf = TokenFile(**{**info, "sources": tuple(info["sources"])})
    except (OSError, ValueError, TypeError):
        return None
    bin_ = meta.with_suffix(".bin").resolve()
    if not bin_.is_file() or bin_.stat().st_size != tf.tokens * np.dtype(tf.dtype).itemsize:
        return None
    return replace(tf, path=str(bin_))


def prepare(paths, tok: TokenizerSpec, field: str = "text", cache: str | None = None, progress: bool = False,
            flag: str = "--data") -> TokenFile:
    """The token file of `paths` under `tok`, tokenizing them if no cached one exists."""
    sources = expand(paths, flag, say_repeats=True)
    from shardwise.paths import output_dir

    root, what = cache_dir(cache)
    output_dir(root, what)
    key = data_key(sources, tok, field)
    meta = root / f"{key}.json"
    tf = _cached(meta)
    if tf is None:
        with _locked(root / f"{key}.lock"):
            tf = _cached(meta) or _tokenize(sources, tok, field, root / f"{key}.bin", meta, key, progress)
    # The cache is keyed by the files' contents: a hit may have been tokenized from copies under other names (the
    # corpus and the tokenizer alike), so the run names (and records) the files it was given.
    tf = replace(tf, sources=tuple(str(s.path) for s in sources), tokenizer=tok.path, given=tuple(map(str, paths)),
                 field=field, tokenizer_sha256=tok.sha256)
    if tf.documents == 0 or tf.tokens == 0:
        raise UsageError(f"{flag} {tf.describe()}: no text — the corpus is empty; give files that hold text")
    return tf


class _Writer:
    """Encodes pieces in batches and appends their tokens, with the end-of-text token after each document."""

    def __init__(self, sink, tok: TokenizerSpec):
        self.sink, self.encode, self.dtype = sink, encoder(tok), np.dtype(tok.dtype)
        self.eos = np.array([tok.eos_id], dtype=self.dtype)
        self.texts, self.ends, self.size = [], [], 0
        self.in_document = False  # the current document has tokens (an empty one gets no end-of-text token)
        self.tokens = self.documents = 0

    def add(self, text: str, end: bool) -> None:
        self.texts.append(text)
        self.ends.append(end)
        self.size += len(text)
        if self.size >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        parts = []
        for ids, end in zip(self.encode(self.texts) if self.texts else [], self.ends):
            if len(ids):
                parts.append(ids.astype(self.dtype, copy=False))
                self.in_document = True
            if end and self.in_document:
                parts.append(self.eos)
                self.documents += 1
            self.in_document &= not end
        if parts:
            block = np.concatenate(parts)
            self.sink.write(block.tobytes())
            self.tokens += len(block)
        self.texts, self.ends, self.size = [], [], 0


def _tokenize(sources: list[Source], tok: TokenizerSpec, field: str, out: Path, meta: Path, key: str,
              progress: bool) -> TokenFile:
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    try:
        with _progress(sources, progress) as advance, open(tmp, "wb") as sink:
            writer = _Writer(sink, tok)
            for src in sources:
                for text, end, consumed in pieces(src, field):
                    if tok.path == BYTES and "\x00" in text:  # it would read as a document's end
                        raise UsageError(f"{src.path}: holds a NUL character (\\x00), the byte tokenizer's end-of-text "
                                         f"token — remove it from the data, or tokenize with --tokenizer")
                    writer.add(text, end)
                    advance(consumed)
            writer.flush()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    tf = TokenFile(str(out.resolve()), tok.dtype, writer.tokens, writer.documents, key, tuple(s.path for s in sources),
                   tok.path, tok.eos_id)
    tmp_meta = meta.with_name(f"{meta.name}.tmp-{os.getpid()}")
    tmp_meta.write_text(json.dumps(asdict(tf), indent=1))
    os.replace(tmp_meta, meta)
    return tf


@contextmanager
def _progress(sources: list[Source], enabled: bool):
    """A rich progress bar over the corpus bytes (rank 0, unless --no-progress or --json)."""
    if not enabled:
        yield lambda n: None
        return
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    from shardwise.console import Console

    console = Console(keep_going=True)
    with Progress(TextColumn(f"tokenizing {len(sources)} file{'s' if len(sources) > 1 else ''}"), BarColumn(),
                  DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(), transient=True, console=console,
                  disable=not console.is_terminal) as bar:  # a pipe or a log: nothing to redraw (it left a blank line)
        task = bar.add_task("tokenize", total=sum(s.bytes for s in sources))
        yield lambda n: bar.advance(task, n)
