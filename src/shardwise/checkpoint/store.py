"""Checkpoint directories on disk: atomic publication, the manifest, validation, a safe metadata reader.

    DIR/
      step_000005/          a complete checkpoint: published by one directory rename
        manifest.json       step, the layout that wrote it, model, run settings, tensors, every file's size + sha256
        .metadata           DCP's index of the shards (a pickle: read only by SafeReader, after its hash checked out)
        __0_0.distcp ...    each rank's shards, written in parallel by DCP's FileSystemWriter
      step_000010.tmp/      being written, or left by a crash: never read, removed by the next save

A directory without ".tmp" exists only after every rank's shards, the DCP index and the manifest are on
disk (fsynced), so a crash while saving can never leave a checkpoint that looks complete.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import re
import shutil
import sys
from pathlib import Path

from torch.distributed.checkpoint import FileSystemReader

from shardwise.errors import UsageError
from shardwise.paths import file_sha256

MANIFEST = "manifest.json"
FORMAT, VERSION = "shardwise-checkpoint", 1
_STEP = re.compile(r"^step_(\d{6,})$")
_TMP = re.compile(r"^step_(\d{6,})\.tmp$")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def tmp_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}.tmp"


def complete(root) -> list[tuple[int, Path]]:
    """(step, directory) of every published checkpoint under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP.match(p.name))]
    return sorted((s, p) for s, p in found if (p / MANIFEST).exists())


def newest(root) -> Path | None:
    found = complete(root)
    return found[-1][1] if found else None


def resolve(path) -> Path:
    """A checkpoint directory given either itself or the --checkpoint-dir above it (then its newest)."""
    path = Path(path)
    if (path / MANIFEST).exists() or _STEP.match(path.name):
        return path
    latest = newest(path)
    if latest is None:
        what = "does not exist" if not path.exists() else "holds no complete checkpoint (step_NNNNNN/ with a manifest.json)"
        raise UsageError(f"{path} {what} — point at a --checkpoint-dir written by `shardwise train --checkpoint-dir`")
    return latest


def describe_files(directory: Path, names) -> dict[str, dict]:
    return {n: {"bytes": (directory / n).stat().st_size, "sha256": file_sha256(directory / n)} for n in sorted(names)}


# --------------------------------------------------------------------------- publish (rank 0)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path, manifest: dict) -> None:
    """Write the manifest into the finished temporary directory, then make it visible with one rename."""
    part = tmp / (MANIFEST + ".part")
    with open(part, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    part.rename(tmp / MANIFEST)
    _fsync_dir(tmp)
    if final.exists():  # the same step of the same run, written again (a restart that re-did it)
        shutil.rmtree(final)
    tmp.rename(final)
    _fsync_dir(final.parent)


def prune(root: Path, keep: int, step: int) -> list[Path]:
    """Keep the newest `keep` complete checkpoints; drop directories that crashed saves left behind."""
    removed = [p for _, p in complete(root)[:-keep]]
    removed += [p for p in Path(root).iterdir() if (m := _TMP.match(p.name)) and int(m.group(1)) <= step]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


# --------------------------------------------------------------------------- validation (read only)


def _bad(file: Path, problem: str, fix: str | None = None) -> UsageError:
    ckpt = file.parent
    fix = fix or f"the checkpoint is damaged; move {ckpt} away to resume from the one before it"
    return UsageError(f"{file}: {problem} — {fix}")


def read_manifest(ckpt: Path) -> dict:
    file = Path(ckpt) / MANIFEST
    if not file.is_file():
        raise _bad(file, "missing, so this is not a complete shardwise checkpoint",
                   "point at a step_NNNNNN directory written by `shardwise train --checkpoint-dir`")
    try:
        manifest = json.loads(file.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(file, f"not valid JSON ({type(exc).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _bad(file, f"not a {FORMAT} manifest", "point at a directory written by `shardwise train --checkpoint-dir`")
    if manifest.get("version") != VERSION:
        raise _bad(file, f"format version {manifest.get('version')!r}, this shardwise reads version {VERSION}",
                   "use the shardwise version that wrote it")
    for key, kind in (("step", int), ("files", dict), ("tensors", dict), ("model", dict), ("layout", dict), ("run", dict)):
        if not isinstance(manifest.get(key), kind):
            raise _bad(file, f"'{key}' is missing or not a {kind.__name__}")
    _check_values(file, manifest)
    return manifest


def _whole(value, low: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _check_values(file: Path, manifest: dict) -> None:
    """The values a resume, inspect and export rely on are in range (a hand-edited manifest is refused, not shown)."""
    from shardwise.specs import RECOMPUTE, SCHEDULES, ZERO_STAGES

    step, lay, model, run = manifest["step"], manifest["layout"], manifest["model"], manifest["run"]
    checks = [("step", _whole(step), "a step of 1 or more"),
              ("world_size", _whole(manifest.get("world_size")), "a whole number of ranks, 1 or more")]
    checks += [(f"layout.{k}", _whole(lay.get(k, 1)), "1 or more") for k in ("dp", "tp", "pp", "micro_batch", "vpp")]
    checks += [("layout.zero", lay.get("zero", 0) in ZERO_STAGES and not isinstance(lay.get("zero", 0), bool), "0, 1, 2 or 3"),
               ("layout.schedule", lay.get("schedule", "1f1b") in SCHEDULES, "a schedule name"),
               ("layout.recompute", lay.get("recompute", "none") in RECOMPUTE, ", ".join(RECOMPUTE)),
               ("layout.sequence_parallel", isinstance(lay.get("sequence_parallel", False), bool), "true or false")]
    checks += [(f"model.{k}", _whole(model.get(k)), "1 or more") for k in ("num_layers", "hidden", "vocab_size")]
    checks += [(f"model.{k}", isinstance(model.get(k), str), "a string") for k in ("name", "family")]
    checks += [(f"run.{k}", _whole(run.get(k)), "1 or more") for k in ("steps", "global_batch", "seq_len")]
    checks += [("run.seed", _whole(run.get("seed"), 0), "0 or more"),
               ("run.steps", _whole(run.get("steps")) and _whole(step) and run["steps"] >= step, f"at least the step ({step})")]
    checks += [(f"run.{k}", isinstance(run.get(k), (int, float)) and not isinstance(run.get(k), bool), "a number")
               for k in ("lr", "weight_decay", "grad_clip", "warmup_steps")]
    checks += [("hf_config", isinstance(manifest.get("hf_config", {}), dict | None), "an object (the model's config.json)")]
    checks += [(f"tensors.{k}", isinstance(t, dict) and isinstance(t.get("shape"), list)
                and all(_whole(d, 0) for d in t["shape"]), "a shape of whole numbers")
               for k, t in manifest["tensors"].items()]
    for key, ok, what in checks:
        if not ok:
            head, _, tail = key.partition(".")
            value = manifest.get(head) if not tail else (manifest[head].get(tail) if isinstance(manifest[head], dict) else None)
            raise _bad(file, f"'{key}' is {value!r}, but must be {what}")
    if _STEP.match(file.parent.name) and int(_STEP.match(file.parent.name).group(1)) != step:
        raise _bad(file, f"says step {step}, but the folder is {file.parent.name}")


def verify_files(ckpt: Path, manifest: dict, hashes: bool = True) -> None:
    """Every file the manifest lists is present, whole and (hashes=True) byte-identical to what was written."""
    ckpt = Path(ckpt)
    if ".metadata" not in manifest["files"]:
        raise _bad(ckpt / MANIFEST, "lists no DCP index (.metadata)")
    for name, info in manifest["files"].items():
        file = ckpt / name
        if Path(name).name != name or not isinstance(info, dict):
            raise _bad(ckpt / MANIFEST, f"bad file entry {name!r}")
        if not file.is_file():
            raise _bad(file, "missing (a shard of this checkpoint was deleted or never copied)")
        size = file.stat().st_size
        if size != info.get("bytes"):
            raise _bad(file, f"{size} bytes but the manifest says {info.get('bytes')} (truncated or overwritten)")
        if hashes and file_sha256(file) != info.get("sha256"):
            raise _bad(file, "content differs from the sha256 in manifest.json (corrupted)")


# --------------------------------------------------------------------------- DCP's index without arbitrary pickles

_DCP_CLASSES = {("torch.distributed.checkpoint.metadata", n) for n in (
    "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
    "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
    ("pathlib._local", "PosixPath"), ("pathlib._local", "WindowsPath")}


class _IndexUnpickler(pickle.Unpickler):
    """Builds only DCP's metadata classes, torch.Size and dtypes; any other global is refused, not imported."""

    def find_class(self, module, name):
        import torch

        if (module, name) in _DCP_CLASSES or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def read_index(ckpt: Path):
    """DCP's Metadata from `.metadata`, through the allow-list unpickler; UsageError if it is anything else."""
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    file = Path(ckpt) / ".metadata"
    problem, hooks = None, (sys.unraisablehook, sys.excepthook)
    # A malformed pickle can leave half-built objects that complain on stderr as they are freed (CPython's
    # bytearray_dealloc prints "deallocated bytearray object has exported buffers" through sys.excepthook): quiet
    # while they go, so the refusal stays one line.
    sys.unraisablehook, sys.excepthook = (lambda unraisable: None), (lambda *exc: None)
    try:
        try:
            with open(file, "rb") as f:
                metadata = _IndexUnpickler(f).load()
        except FileNotFoundError:
            raise _bad(file, "missing") from None
        except Exception as exc:  # noqa: BLE001 — whatever the bytes are, the answer is "not a DCP index"
            problem = f"not a DCP checkpoint index ({type(exc).__name__}: {' '.join(str(exc).split())[:80]})"
        else:
            if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict) \
                    or not isinstance(metadata.storage_data, dict):
                problem, metadata = "not a DCP checkpoint index", None
        if problem:  # what the failed load built, freed now, while its complaints are quiet
            gc.collect()
    finally:
        sys.unraisablehook, sys.excepthook = hooks
    if problem:
        raise _bad(file, problem) from None
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file reader, except that the index goes through `read_index` (tensors it already reads with
    torch.load(weights_only=True))."""

    def read_metadata(self, *args, **kwargs):
        metadata = read_index(Path(self.path))
        metadata.storage_meta.load_id = self.load_id
        return metadata
