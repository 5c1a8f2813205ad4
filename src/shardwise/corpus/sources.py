"""Documents from files: plain text, JSON lines, Parquet.

- Text (any other extension): a file is one document. It is read in pieces of about 1 MB, each cut after
  a line break that has non-blank text on both sides, so memory stays small and `tokenizers` can encode
  the pieces in parallel. For byte-level BPE tokenizers (GPT-2, Llama 3, ...) such a cut gives the same
  tokens as encoding the file whole; tokenizers that prepend a space marker to their input (SentencePiece
  style, Llama 2) see one extra marker per piece.
- JSON lines (.jsonl, .ndjson): one document per line, from the `text` field or --data-field.
- Parquet (.parquet, needs pyarrow): one document per row of the `text` column or --data-field.
A folder stands for every file under it (sorted, hidden files skipped, links to folders followed).
A file named twice (a folder and a file in it) is read once, with a note.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from shardwise.errors import UsageError

PIECE = 1 << 20
JSONL = (".jsonl", ".ndjson")
PARQUET = (".parquet",)
BLANK = set(b" \t\r\n\f\v")
PYARROW_HINT = "pip install 'shardwise[parquet]' (or: pip install pyarrow)"


@dataclass(frozen=True)
class Source:
    path: str
    kind: str  # "text", "jsonl" or "parquet"
    bytes: int


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    return "jsonl" if suffix in JSONL else "parquet" if suffix in PARQUET else "text"


def expand(paths, flag: str = "--data", say_repeats: bool = False) -> list[Source]:
    """The files behind the given paths, checked: they exist, and Parquet can be read here. A file named twice (a
    folder and a file in it, or two links to one file) is read once, where it first comes: training it twice would
    weigh it double unasked; `say_repeats` says so in a note (the caller that tokenizes: expand runs more than once)."""
    named = [(f, given) for given in paths for f in _given_files(given, flag)]
    return [_source(f, flag, given) for f, given in _once(named, flag, say_repeats)]


def _given_files(given, flag: str) -> list[Path]:
    p = Path(given)
    if p.is_dir():
        files = _folder_files(p, flag, given)
        if not files:
            raise UsageError(f"{flag} {given}: the folder holds no files — the corpus is empty")
        return files
    if p.is_file():
        return [p]
    from shardwise.paths import refuse_special

    refuse_special(p, f"{flag} {given}")  # a named pipe (never opened: it would block), a symlink loop
    raise UsageError(f"{flag} {given}: not found — give text, .jsonl or .parquet files, or folders of them")


def _once(named: list[tuple[Path, str]], flag: str, say: bool) -> list[tuple[Path, str]]:
    """`named` without the files seen before under another path (by real path), in first-seen order."""
    import os

    first, out, repeats = {}, [], []
    for f, given in named:
        real = os.path.realpath(f)
        if real in first:
            repeats.append((first[real], f))
        else:
            first[real] = f
            out.append((f, given))
    if repeats and say and os.environ.get("RANK", "0") == "0":  # (under torchrun every rank expands: rank 0 speaks)
        from shardwise.console import note

        seen, again = repeats[0]
        alias = f" ({again} is the same file)" if str(again) != str(seen) else ""
        more = f"; so are {len(repeats) - 1} more files" if len(repeats) > 1 else ""
        note(f"{flag} names {seen} twice{alias} — it is read once{more}")
    return out


def _source(f: Path, flag: str, given) -> Source:
    if f.suffix.lower() == ".arrow":  # datasets' save_to_disk writes Arrow files beside state.json
        raise UsageError(f"{flag} {given}: {f.name} is an Arrow file (Hugging Face datasets' save_to_disk) — "
                         f"export it with dataset.to_parquet('train.parquet') or dataset.to_json('train.jsonl') "
                         f"and give that")
    _check_uncompressed(f, flag)
    if f.suffix.lower() == ".json":  # one JSON document (an array of records): as text, its brackets and keys
        raise UsageError(f"{flag} {f}: a .json file is one JSON document, which would train as raw text, "
                         f"brackets and keys included — write its records one per line as .jsonl "
                         f"(python -c \"import json; [print(json.dumps(r)) for r in json.load(open('{f.name}'))]\" "
                         f"> {f.stem}.jsonl)")
    kind = _kind(f)
    if kind == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise UsageError(f"{f}: reading Parquet needs pyarrow — {PYARROW_HINT}") from None
        _parquet_file(str(f))  # its footer, now: not after the files before it are tokenized
    return Source(str(f), kind, f.stat().st_size)


def _unreadable_parquet(path: str, exc: Exception) -> UsageError:
    """One line for a .parquet file pyarrow cannot read (not Parquet, truncated, a damaged page), with the fix."""
    name = Path(path).name
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
    again = (f"write it again (pandas: df.to_parquet('{name}'); datasets: ds.to_parquet('{name}')) or download it "
             f"again")
    try:
        with open(path, "rb") as f:
            parquet = f.read(4) == b"PAR1"  # what every Parquet file starts (and ends) with
    except OSError:
        parquet = True
    if not parquet:
        return UsageError(f"{path}: not a Parquet file ({detail}) — if it holds text or JSON lines, give it a .txt or "
                          f".jsonl name; if it was Parquet, {again}")
    return UsageError(f"{path}: not a readable Parquet file ({detail}) — it is damaged or cut short: {again}")


def _parquet_file(path: str):
    """pyarrow's ParquetFile of `path` (its footer read and checked), or one UsageError line with the fix."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError subclasses for damaged files
        raise _unreadable_parquet(path, exc) from None


# What a compressed file starts with: read as text, its bytes would be "not UTF-8", which is the wrong advice.
COMPRESSED = {b"\x1f\x8b": ("gzip", "gunzip"), b"\x28\xb5\x2f\xfd": ("zstd", "unzstd"), b"BZh": ("bzip2", "bunzip2"),
              b"\xfd7zXZ\x00": ("xz", "unxz")}


def _check_uncompressed(f: Path, flag: str) -> None:
    try:
        with open(f, "rb") as fh:
            head = fh.read(6)
    except OSError:
        return  # said where the file is read
    for magic, (name, tool) in COMPRESSED.items():
        if head.startswith(magic):
            raise UsageError(f"{flag} {f}: a {name}-compressed file — decompress it first ({tool} {f.name}) and give "
                             f"the text, .jsonl or .parquet it holds")


def _folder_files(folder: Path, flag: str, given) -> list[Path]:
    """The files under `folder` (hidden ones left out), every one of them: a subfolder it cannot list or a link to
    nothing is one line, where rglob would skip it and the corpus silently shrink. A link to a folder is followed (its
    files are the user's corpus as much as the folder's own), except one back to a folder it lies in (a cycle, whose
    files are listed already); a folder linked twice is listed twice, and expand reads its files once, with a note."""
    import os

    from shardwise.paths import what_stands

    def unreadable(err: OSError):
        raise UsageError(f"{flag} {given}: cannot list {err.filename} ({err.strerror}) — its files would be left out of "
                         f"the corpus; make it readable, or give the files you mean")

    files, above = [], {os.fspath(folder): {os.path.realpath(folder)}}  # each listed folder: the real folders it is in
    for root, dirs, names in os.walk(folder, onerror=unreadable, followlinks=True):
        dirs[:] = [d for d in sorted(dirs) if not d.startswith(".") and _not_a_cycle(root, d, above)]
        for name in sorted(n for n in names if not n.startswith(".")):
            f = Path(root) / name
            if f.is_symlink() and not f.exists() and what_stands(f) != "a symlink loop":
                raise UsageError(f"{flag} {given}: {f} is a link to nothing ({os.readlink(f)}) — fix or remove it")
            if f.is_file():
                files.append(f)
            elif what_stands(f):  # a named pipe, a symlink loop: it would be left out of the corpus unsaid
                raise UsageError(f"{flag} {given}: {f} is {what_stands(f)}, not a regular file — replace it with the "
                                 f"file it stands for, or move it out of the folder")
    return sorted(files)


def _not_a_cycle(root: str, name: str, above: dict) -> bool:
    """Whether subfolder `name` of `root` leads to none of the folders `root` lies in (then noted in `above`)."""
    import os

    sub, real = os.path.join(root, name), os.path.realpath(os.path.join(root, name))
    if real in above[root]:
        return False
    above[sub] = above[root] | {real}
    return True


def pieces(src: Source, field: str) -> Iterator[tuple[str, bool, int]]:
    """(text, ends a document, bytes of the file consumed) in file order."""
    if src.kind == "jsonl":
        return _jsonl(src.path, field)
    if src.kind == "parquet":
        return _parquet(src, field)
    return _text(src.path)


def _cut(buf: bytes, start: int) -> int:
    """Index just after the first line break at or after `start` with non-blank bytes on both sides; -1 if none."""
    i = buf.find(b"\n", max(start, 1))
    while i != -1 and i + 1 < len(buf):
        if buf[i - 1] not in BLANK and buf[i + 1] not in BLANK:
            return i + 1
        i = buf.find(b"\n", i + 1)
    return -1


def _decode(data: bytes, path: str, offset: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {offset + exc.start:,}) — convert it to UTF-8, or give .jsonl or "
                         f".parquet") from None


def _text(path: str) -> Iterator[tuple[str, bool, int]]:
    with open(path, "rb") as f:
        buf, offset, eof = b"", 0, False
        while not eof:
            block = f.read(PIECE)
            eof = not block
            buf += block
            while len(buf) > PIECE:
                cut = _cut(buf, PIECE)
                if cut == -1:
                    break
                yield _decode(buf[:cut], path, offset), False, cut
                offset += cut
                buf = buf[cut:]
        yield _decode(buf, path, offset), True, len(buf)


def _jsonl(path: str, field: str) -> Iterator[tuple[str, bool, int]]:
    with open(path, "rb") as f:
        offset = 0
        for n, line in enumerate(f, 1):
            offset, start = offset + len(line), offset
            if not line.strip():
                yield "", False, len(line)
                continue
            try:
                line.decode("utf-8")  # (json.loads would take UTF-16 too, and call any other encoding "not JSON")
            except UnicodeDecodeError as exc:
                raise UsageError(f"{path}:{n}: not UTF-8 text (byte {start + exc.start:,}) — JSON lines are UTF-8: "
                                 f"convert the file") from None
            try:
                obj = json.loads(line)
            except ValueError:
                raise UsageError(f"{path}:{n}: not valid JSON — each line of a JSON-lines file is one JSON object") from None
            text = obj.get(field) if isinstance(obj, dict) else None
            if isinstance(obj, dict) and field in obj and not isinstance(text, str):
                raise UsageError(f"{path}:{n}: field '{field}' holds {type(text).__name__} {json.dumps(text)[:40]}, not "
                                 f"text — name the field that holds the text with --data-field")
            if not isinstance(text, str):
                raise UsageError(f"{path}:{n}: no text field '{field}' — name the field that holds the text with --data-field")
            yield text, True, len(line)


def _batches(pf, path: str, field: str):
    """pf's `field` column in batches; a page pyarrow cannot decode (a damaged file whose footer reads) is one
    UsageError line, not a traceback from inside the tokenizer's loop."""
    import pyarrow as pa

    batches = pf.iter_batches(batch_size=1024, columns=[field])
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError, ValueError) as exc:  # ArrowInvalid is a ValueError, ArrowIOError an OSError
            raise _unreadable_parquet(path, exc) from None
        yield batch


def _parquet(src: Source, field: str) -> Iterator[tuple[str, bool, int]]:
    pf = _parquet_file(src.path)
    names = pf.schema_arrow.names
    if field not in names:
        raise UsageError(f"{src.path}: no column '{field}' (columns: {', '.join(names[:8])}) — name the text column with --data-field")
    rows = max(1, pf.metadata.num_rows)
    done = 0
    for batch in _batches(pf, src.path, field):
        texts = batch.column(0).to_pylist()
        for text in texts:
            if text is not None and not isinstance(text, str):
                raise UsageError(f"{src.path}: column '{field}' holds {type(text).__name__}, not text — name the text column "
                                 f"with --data-field")
            new = (done + 1) * src.bytes // rows - done * src.bytes // rows
            done += 1
            yield text or "", bool(text), new
