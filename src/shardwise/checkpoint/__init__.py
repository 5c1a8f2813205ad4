"""Checkpoints that survive layout changes and failures.

    save(rt, dir)        every rank writes its own shards of the layout-free state (DCP), then rank 0
                         publishes DIR/step_NNNNNN atomically and keeps the newest K
    restore(rt, ckpt)    every rank reads its slices for ITS layout: resharding is a property of the format
    check(cfg)           everything about --checkpoint-dir / --resume, before any process starts

State: parameters and AdamW moments under full-model names and logical shapes (state.py), the step (the
LR schedule and the data position are functions of it: lr_at(step), data.global_batch(seed, step)) and the
RNG state. The run's settings are in the manifest, so a resume can refuse to continue a different run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from shardwise.checkpoint import state, store
from shardwise.checkpoint.store import MANIFEST, SafeReader, read_manifest, resolve, verify_files
from shardwise.errors import UsageError

# The settings that make two invocations one run: a resume must use the same ones.
RUN_KEYS = ("steps", "global_batch", "seq_len", "seed", "lr", "min_lr_ratio", "warmup_steps", "weight_decay", "grad_clip")


def run_settings(cfg) -> dict:
    out = {k: getattr(cfg, k) for k in RUN_KEYS}
    out["warmup_steps"] = cfg.warmup
    out["data"] = cfg.data.key if cfg.data is not None else None  # the tokenized --data (None: built-in corpus)
    return out


def restart_count() -> int:
    """How many times torchrun's agent has restarted this job (0 on the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def _dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _dist() else 0


@contextmanager
def _quiet():
    """DCP warns that it runs in one process when torch.distributed is not initialised: that is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier() -> None:
    if _dist():
        dist.barrier()


# --------------------------------------------------------------------------- save


def due(cfg, step: int, last: int) -> bool:
    """Save after every --save-every steps and after the last step of this invocation."""
    if not cfg.checkpoint_dir:
        return False
    return step == last or bool(cfg.save_every) and step % cfg.save_every == 0


def save(rt, root) -> Path:
    """Write rt's state as DIR/step_NNNNNN. Collective: every rank of the job calls it. Returns the directory."""
    root, step, rank = Path(root), rt.step, _rank()
    tmp, final = store.tmp_dir(root, step), store.step_dir(root, step)
    start = time.perf_counter()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # a save of this step that crashed earlier
            shutil.rmtree(tmp)
    _barrier()
    with _quiet():
        metadata = dcp.save(state.collect(rt), storage_writer=dcp.FileSystemWriter(tmp, thread_count=1), no_dist=not _dist())
    _test_die_while_saving(step)
    # Every rank hashes the shard files it wrote, in parallel; rank 0 lists them all in the manifest.
    mine = store.describe_files(tmp, [p.name for p in tmp.glob(f"__{rank}_*.distcp")])
    files = [mine]
    if _dist():
        files = [None] * dist.get_world_size()
        dist.all_gather_object(files, mine)
    if rank == 0:
        listed = {n: info for f in files for n, info in f.items()} | store.describe_files(tmp, [".metadata"])
        referenced = {s.relative_path for s in metadata.storage_data.values()}
        if not referenced <= listed.keys():
            raise RuntimeError(f"checkpoint {tmp}: DCP wrote {sorted(referenced - listed.keys())} that no rank reported")
        store.publish(tmp, final, _manifest(rt, metadata, listed, time.perf_counter() - start))
        store.prune(root, rt.cfg.keep, step)
    _barrier()
    return final


def _manifest(rt, metadata, files: dict, seconds: float) -> dict:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    cfg = rt.cfg
    tensors = {k: {"shape": list(m.size), "dtype": str(m.properties.dtype).removeprefix("torch.")}
               for k, m in sorted(metadata.state_dict_metadata.items()) if isinstance(m, TensorStorageMetadata)}
    return {"format": store.FORMAT, "version": store.VERSION, "step": rt.step,
            "layout": cfg.layout.to_dict(), "world_size": cfg.layout.world_size, "model": asdict(cfg.spec),
            "run": run_settings(cfg), "run_id": cfg.run_id, "data_position": rt.data.state(rt.step), **_sources(cfg),
            "tensors": tensors, "files": files, "bytes": sum(f["bytes"] for f in files.values()),
            "save_seconds": round(seconds, 3), "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "torch": torch.__version__}


def _sources(cfg) -> dict:
    """Where the weights and data came from: `checkpoint export --format hf` writes the model folder's config
    back and copies the tokenizer; a resume checks it trains on the same data."""
    out = {"hf_config": cfg.hf_config, "model_given": cfg.model_given, "init": cfg.init}
    if cfg.data is not None:
        # "given" as typed (relative to where the run started), "given_absolute" for a resume line from anywhere
        out["data"] = {"files": list(cfg.data.sources), "tokens": cfg.data.tokens, "key": cfg.data.key,
                       "given": list(cfg.data.given), "given_absolute": [os.path.abspath(g) for g in cfg.data.given],
                       "field": cfg.data.field}
        out["tokenizer"] = cfg.data.tokenizer
        out["tokenizer_sha256"] = cfg.data.tokenizer_sha256  # export copies it only while it is still this file
    if getattr(cfg, "val_data", None) is not None:  # what a resume line must pass again to go on validating
        out["validation"] = {"given_absolute": [os.path.abspath(g) for g in cfg.val_data.given],
                             "eval_every": cfg.eval_every}
    return out


def _test_die_while_saving(step: int) -> None:
    """Fault injection for the tests: rank 0 is SIGKILLed after every shard is written, before publishing."""
    if os.environ.get("SHARDWISE_TEST_KILL_IN_SAVE") == str(step) and _rank() == 0 and restart_count() == 0:
        os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------- load


def restore(rt, ckpt) -> dict:
    """Load checkpoint `ckpt` into rt under rt's own layout. Collective. Returns the manifest."""
    ckpt = Path(ckpt)
    manifest = read_manifest(ckpt)
    verify_files(ckpt, manifest, hashes=False)  # the launcher checked the hashes; here: nothing changed size since
    reader = SafeReader(ckpt)
    wanted, finish = state.targets(rt)
    _check_keys(ckpt, reader.read_metadata().state_dict_metadata, wanted)
    with _quiet():
        dcp.load(wanted, storage_reader=reader, no_dist=not _dist())
    finish()
    rt.data.restore(manifest.get("data_position") or {}, rt.step)
    return manifest


def _check_keys(ckpt: Path, saved: dict, wanted: dict) -> None:
    """Every tensor this rank needs is in the checkpoint with its logical shape."""
    for key, t in wanted.items():
        have = saved.get(key)
        if have is None:
            raise UsageError(f"{ckpt / '.metadata'}: no tensor '{key}' — the checkpoint was written for another model")
        if key != "rng.cpu" and tuple(have.size) != tuple(t.shape):
            raise UsageError(f"{ckpt / '.metadata'}: '{key}' has shape {tuple(have.size)}, this model needs {tuple(t.shape)}")


def resume_path(cfg) -> Path | None:
    """The checkpoint this invocation starts from: the newest complete one when resuming (--resume, or a
    restart by torchrun's agent), else None."""
    if cfg.checkpoint_dir and (cfg.resume or restart_count() > 0):
        return store.newest(cfg.checkpoint_dir)
    return None


# --------------------------------------------------------------------------- before any process starts


def check(cfg, data: bool = True) -> None:
    """Every problem with the checkpoint options, as one UsageError, before any process group exists; `data` False:
    all but whether the run trains on the checkpoint's data (before the data is tokenized: check_same_run)."""
    if check_flags(cfg):
        root = Path(cfg.checkpoint_dir)
        _check_contents(cfg, root, store.newest(root), data)


def run_id(cfg) -> str:
    """The run's name: a resumed run's is its checkpoint's (none where an older release wrote it), a new run's new."""
    import uuid

    if cfg.resume and cfg.checkpoint_dir and (latest := store.newest(Path(cfg.checkpoint_dir))) is not None:
        return str(read_manifest(latest).get("run_id") or "")
    return uuid.uuid4().hex[:12]


def check_flags(cfg) -> bool:
    """The checkpoint flags alone (no folder read, nothing created): one UsageError for the first problem; whether
    checkpoints are on (--checkpoint-dir given). A value no folder makes right is named first."""
    for flag, value, low in (("--save-every", cfg.save_every, 1), ("--keep", cfg.keep, 1),
                             ("--max-restarts", cfg.max_restarts, 0)):
        if value is not None and value < low:
            raise UsageError(f"{flag} must be at least {low}, got {value}")
    if not cfg.checkpoint_dir:
        for flag, value in (("--save-every", cfg.save_every), ("--stop-after", cfg.stop_after), ("--resume", cfg.resume or None),
                            ("--max-restarts", cfg.max_restarts or None)):
            if value is not None:
                raise UsageError(f"{flag} needs --checkpoint-dir DIR (where checkpoints are written and resumed from)")
        return False
    root = Path(cfg.checkpoint_dir)
    if root.exists() and not root.is_dir():
        raise UsageError(f"--checkpoint-dir {root} is a file — give a directory")
    if cfg.stop_after is not None and not 1 <= cfg.stop_after <= cfg.steps:
        raise UsageError(f"--stop-after must be between 1 and --steps ({cfg.steps}), got {cfg.stop_after}")
    if cfg.max_restarts and cfg.layout.world_size == 1:
        raise UsageError("--max-restarts restarts the ranks of a multi-process job, and dp*tp*pp = 1 runs in this process — "
                         "drop it, or resume by hand with --resume")
    return True


def _check_contents(cfg, root: Path, latest, data: bool = True) -> None:
    if latest is None:
        if cfg.resume:
            inside = (Path(root) / store.MANIFEST).is_file()  # a step_NNNNNN folder given: its run's is the parent
            fix = f"give the run's folder, --checkpoint-dir {Path(root).parent}" if inside else "drop --resume to start the run"
            raise UsageError(f"--resume: {root} holds no complete checkpoint — {fix}")
        return
    if not (cfg.resume or restart_count() > 0):
        raise UsageError(f"{root} already holds checkpoints of a run (newest {latest.name}) — add --resume to continue it, "
                         f"or use an empty --checkpoint-dir for a new run")
    manifest = validate(latest, cfg.spec)
    check_same_run(latest, manifest, cfg, data)
    if cfg.stop_after is not None and cfg.stop_after <= manifest["step"]:
        raise UsageError(f"--stop-after {cfg.stop_after}, but {latest} is already at step {manifest['step']} — "
                         f"pick a later step")


def validate(ckpt: Path, spec=None) -> dict:
    """Manifest, every file's size and hash, DCP's index (safely) and, given a spec, that it is this model's.
    Reads only. Returns the manifest."""
    manifest = read_manifest(ckpt)
    verify_files(ckpt, manifest)
    saved = store.read_index(ckpt).state_dict_metadata
    listed = {k: tuple(v.get("shape", ())) for k, v in manifest["tensors"].items() if isinstance(v, dict)}
    if {k: tuple(v.size) for k, v in saved.items() if hasattr(v, "size")} != listed:
        raise UsageError(f"{Path(ckpt) / '.metadata'}: its tensors differ from those in {MANIFEST} — the checkpoint is "
                         f"damaged; move {ckpt} away to resume from the one before it")
    if spec is not None:
        _check_model(ckpt, manifest, spec)
    return manifest


def _field_defaults(cls) -> dict:
    """A dataclass's field defaults as a manifest stores them (JSON: tuples as lists)."""
    from dataclasses import MISSING, fields

    values = {f.name: f.default if f.default is not MISSING else f.default_factory()
              for f in fields(cls) if f.default is not MISSING or f.default_factory is not MISSING}
    return json.loads(json.dumps(values))


def _check_model(ckpt: Path, manifest: dict, spec) -> None:
    mine, theirs = json.loads(json.dumps(asdict(spec))), manifest["model"]  # as the manifest stored it (tuples: lists)
    theirs = _field_defaults(type(spec)) | theirs  # a field the writing version had not yet: its default, what it built
    diff = [k for k in mine if k != "name" and mine[k] != theirs.get(k)]
    if diff:
        import shlex

        what = ", ".join(f"{k} {theirs.get(k)} vs {mine[k]}" for k in diff[:3])
        name = theirs.get("name")
        which = f"another model named '{name}'" if name == spec.name else f"model '{name}', not '{spec.name}'"
        given = manifest.get("model_given") or name  # the --model it was trained with (a folder's path, not its name)
        raise UsageError(f"{Path(ckpt) / MANIFEST}: written for {which} ({what}) — use --model {shlex.quote(given)} or "
                         f"another --checkpoint-dir")


def check_same_run(ckpt: Path, manifest: dict, cfg, data: bool = True) -> None:
    """`cfg` continues the run of checkpoint `ckpt`: its data (unless `data` is False: not tokenized yet), its
    settings, and steps left to train."""
    theirs, mine = manifest["run"], run_settings(cfg)
    if data and theirs.get("data") != mine["data"]:
        files = manifest.get("data", {}).get("files", [])
        if not files:
            raise UsageError(f"{ckpt}: that run trained on the built-in corpus — resume it without --data")
        more = f" and {len(files) - 2} more" if len(files) > 2 else ""
        tok = f" tokenized with {manifest['tokenizer']}" if manifest.get("tokenizer") else ""
        field = manifest["data"].get("field", "text")
        if cfg.data is not None and (list(cfg.data.sources), cfg.data.field, cfg.data.tokenizer) == \
                (files, field, manifest.get("tokenizer")):  # the same names: what they hold changed
            what = "tokenizer" if manifest.get("tokenizer_sha256") not in (None, cfg.data.tokenizer_sha256) else "files"
            raise UsageError(f"{ckpt}: that run trained on {', '.join(files[:2])}{more}{tok}, and the {what} "
                             f"changed since (the data tokenizes differently now) — restore the {what} it trained on, "
                             f"or start a new run in another --checkpoint-dir")
        field = f" (field {field})" if field != "text" else ""
        raise UsageError(f"{ckpt}: that run trained on {', '.join(files[:2])}{more}{field}{tok} — resume with the same "
                         f"--data, --data-field and --tokenizer (`shardwise checkpoint inspect {ckpt.parent}` prints them)")
    diff = [k for k in RUN_KEYS if theirs.get(k) != mine[k]]
    if diff:
        what = ", ".join(f"--{k.replace('_', '-')} {theirs.get(k)} (now {mine[k]})" for k in diff)
        raise UsageError(f"{ckpt}: that run used {what} — resume with the same settings (the layout may change)")
    if manifest["step"] >= cfg.steps and restart_count() == 0:
        raise UsageError(f"{ckpt} is the end of the run (step {manifest['step']} of {cfg.steps}) — nothing left to train")


__all__ = ["save", "restore", "due", "check", "validate", "resume_path", "resolve", "restart_count"]
