"""Input and output paths, checked before any long work starts.

A file path that names a folder, a folder path that names a file, a place nobody may write: each is one
UsageError line naming the flag and the fix, raised before a process starts or a measurement runs, so a
result is never computed and then lost at the moment it is written. The checks really write (a folder is
created, a probe file is opened and removed): permission bits do not tell root, or a read-only mount, the truth.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
from pathlib import Path

from shardwise.errors import UsageError


def _make_folder(folder: Path, flag: str, shown) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except FileExistsError:
        raise UsageError(f"{flag} {shown}: a file stands where a folder must be — pick another path") from None
    except OSError as exc:
        what = "cannot create its folder" if not folder.is_dir() else f"cannot write in {folder}"
        raise UsageError(f"{flag} {shown}: {what} ({exc.strerror or exc}) — pick a writable path") from None


def output_path(example: str):
    """An argparse type for a file to write: a path that ends in a separator names a folder, which argparse's Path
    would lose (Path("trace/") is "trace") and the command then write a file by that name."""
    import argparse

    def parse(text: str) -> Path:
        if text.endswith(("/", os.sep)):
            raise argparse.ArgumentTypeError(f"{text} is a folder — give a file path, e.g. {Path(text) / example}")
        return Path(text)
    return parse


def output_file(path, flag: str, example: str = "out", replaced: bool = False) -> None:
    """`path` can be written as a file: not a folder, its folder exists (created now if missing), and the
    file can be opened for writing (an existing one is left as it is). `example` names a file for the hint.
    An existing path that is not a regular file is refused — a named pipe would block the probe (and the command's
    write) until something reads it — except a character device such as /dev/null, written through, unless the
    command `replaced` the path by renaming a finished file onto it (which would put a file where the device was)."""
    if path is None:
        return
    text = str(path)
    file = Path(text)
    if file.is_dir() or text.endswith(("/", os.sep)):
        raise UsageError(f"{flag} {text} is a folder — give a file path, e.g. {file / example}")
    if file.exists() and not file.is_file() and (replaced or not file.is_char_device()):
        what = ("a named pipe" if file.is_fifo() else "a socket" if file.is_socket() else "a device")
        raise UsageError(f"{flag} {text} is {what}, not a regular file — give a file path, e.g. "
                         f"{file.parent / example}")
    _make_folder(file.parent, flag, text)
    existed = file.exists()
    try:
        with open(file, "a"):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {text}: cannot write this file ({exc.strerror or exc}) — pick another path") from None
    if not existed:  # (under torchrun every rank checks the same path: another may have removed its probe already)
        file.unlink(missing_ok=True)


def distinct_outputs(outputs: dict, inputs: dict | None = None) -> None:
    """No output path (by flag) is another output's, an input file's, or inside an input folder (one read whole, as
    a --data folder is: see folder_files for the folders read in part): writing it would destroy what the command
    reads or writes beside it. One UsageError naming both flags; None paths, and inputs that are no path (a preset's
    name), are skipped."""
    def where(path) -> Path:
        return Path(os.path.realpath(str(path)))  # writing through a link writes its target

    read = {where(p): f for f, p in (inputs or {}).items() if p is not None and Path(str(p)).exists()}
    taken = dict(read)
    for flag, path in outputs.items():
        if path is None:
            continue
        out = where(path)
        same = taken.get(out)
        inside = next((f for p, f in read.items() if p.is_dir() and p in out.parents), None)
        if same or inside:
            other = same or inside
            what = "the file" if same else "a file inside the folder"
            role = "reads" if other in (inputs or {}) else "also writes"
            raise UsageError(f"{flag} {path} is {what} {other} names, which the command {role}: writing it would "
                             f"destroy that — give {flag} another path")
        taken[out] = flag


def folder_files(flag: str, path) -> dict:
    """An input of `flag` for distinct_outputs: a folder the command reads only some files of (a model folder's
    config.json, weights and tokenizer) as each file in it, so that a new file written beside them is allowed and an
    existing one is not overwritten; anything else as itself."""
    folder = Path(str(path)) if path is not None else None
    if folder is None or not folder.is_dir():
        return {flag: path}
    return {f"{flag} {folder} ({file.name})": file for file in sorted(folder.iterdir()) if file.is_file()}


def output_dir(path, flag: str) -> None:
    """`path` is a folder we can write in (created now if missing)."""
    if path is None:
        return
    folder = Path(str(path))
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{flag} {path} is a file — give a folder (it is created if missing)")
    _make_folder(folder, flag, path)


def shown(path) -> str:
    """A recorded absolute path as a user reads it: relative to the working directory when it lies under it."""
    p = Path(path)
    try:
        return str(p.relative_to(Path.cwd())) if p.is_absolute() else str(p)
    except ValueError:
        return str(p)


def file_sha256(path) -> str:
    """A file's SHA-256 (hex), read in 4 MiB blocks: checkpoint manifests and the token cache's key."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def what_stands(path) -> str | None:
    """What stands at an input `path` that is neither a regular file nor a folder (links followed), in an error
    message's words — "a named pipe", "a socket", "a device", "a symlink loop", "a link to nothing (TARGET)" — or
    None: a file, a folder, or nothing at all (the caller says "not found" in its own words). Only stat is called,
    never open: opening a named pipe to read blocks until something writes it."""
    text = os.fspath(path)
    try:
        mode = os.stat(text).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
        if os.path.islink(text):
            try:
                return f"a link to nothing ({os.readlink(text)})"
            except OSError:
                return "a link to nothing"
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return "a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"


def special_fix(what: str) -> str:
    """The fix for an input that is `what` (what_stands's words)."""
    if what == "a symlink loop":
        return "the link leads back to itself: point it at the real file (ln -sfn FILE LINK), or give the file itself"
    if what.startswith("a link to nothing"):
        return "its target is gone: fix the link, or give the file itself"
    return "shardwise reads its inputs from regular files: save the content to a file and give that path"


def refuse_special(path, named: str, more: str = "") -> None:
    """One UsageError line if `path` is a named pipe, a socket, a device, a symlink loop or a link to nothing (see
    what_stands): "`named` is not a regular file: it is … — the fix[; `more`]". `named` is how the caller names
    the input (--data PATH, model config 'PATH'); `more` adds the caller's other choices (or a preset ...)."""
    what = what_stands(path)
    if what:
        raise UsageError(f"{named} is not a regular file: it is {what} — {special_fix(what)}{more}")


def input_file(path, flag: str, fix: str) -> Path:
    """`path` is an existing file (not a folder): else one UsageError line naming the flag and `fix`."""
    file = Path(str(path))
    if file.is_dir():
        raise UsageError(f"{flag} {path} is a folder — {fix}")
    if not file.is_file():
        what = what_stands(file)
        if what:
            raise UsageError(f"{flag} {path}: not a regular file but {what} — {special_fix(what)}")
        raise UsageError(f"{flag} {path}: no such file — {fix}")
    return file
