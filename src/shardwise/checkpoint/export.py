"""Read a checkpoint without any process group: what is in it, and the whole model as one safetensors file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from shardwise.checkpoint.store import resolve
from shardwise.errors import UsageError


def summary(path) -> dict:
    """What `shardwise checkpoint inspect` shows: the validated manifest, condensed."""
    from shardwise.checkpoint import validate

    ckpt = resolve(path)
    m = validate(ckpt)
    groups = {}
    for key, info in m["tensors"].items():
        kind = key.split(".", 1)[0]
        n = 1
        for d in info["shape"]:
            n *= d
        g = groups.setdefault(kind, {"tensors": 0, "elements": 0})
        g["tensors"] += 1
        g["elements"] += n
    return {"checkpoint": str(ckpt), "step": m["step"], "steps": m["run"].get("steps"), "layout": m["layout"],
            "world_size": m["world_size"], "model": m["model"], "run": m["run"], "saved_at": m.get("saved_at"),
            "files": len(m["files"]), "bytes": m["bytes"], "groups": groups, "tensors": m["tensors"],
            "data": m.get("data", {}), "validation": m.get("validation"), "tokenizer": m.get("tokenizer"),
            "model_given": m.get("model_given"), "init": m.get("init")}


def load_tensors(path, prefix: str = "model.") -> tuple[dict[str, torch.Tensor], dict]:
    """Every tensor under `prefix` at its full logical shape (no process group), and the manifest."""
    from shardwise.checkpoint import validate

    ckpt = resolve(path)
    manifest = validate(ckpt)
    keys = [k for k in manifest["tensors"] if k.startswith(prefix)]
    if not keys:
        raise UsageError(f"{ckpt}: no tensors named {prefix}* in this checkpoint")
    return {k[len(prefix):]: v for k, v in read_tensors(ckpt, manifest, keys).items()}, manifest


def read_tensors(ckpt: Path, manifest: dict, keys) -> dict[str, torch.Tensor]:
    """The full logical tensors `keys` of a validated checkpoint (no process group): DCP reads each from the
    shards that hold its pieces, so a caller can read a model a few tensors at a time."""
    import torch.distributed.checkpoint as dcp

    from shardwise.checkpoint import _quiet
    from shardwise.checkpoint.store import SafeReader

    wanted = {}
    for key in keys:
        info = manifest["tensors"][key]
        dtype = getattr(torch, str(info.get("dtype")), None)
        if not isinstance(dtype, torch.dtype):
            raise UsageError(f"{ckpt / 'manifest.json'}: tensor {key} has unknown dtype {info.get('dtype')!r}")
        wanted[key] = torch.empty(info["shape"], dtype=dtype)
    with _quiet():
        dcp.load(wanted, storage_reader=SafeReader(ckpt), no_dist=True)
    return wanted


def _earlier_export(file: Path) -> bool:
    """Whether `file` is a .safetensors that export_safetensors wrote (its metadata says so): the one kind of file --to
    may replace; anything else (a model's own weights, a text) is the user's."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), "pt") as f:
            return "shardwise_step" in (f.metadata() or {})
    except Exception:  # not a safetensors file at all (safetensors raises its own error types)
        return False


def export_safetensors(path, out) -> dict:
    """The model's parameters (full, unpadded, layout-free names) as one .safetensors file."""
    from safetensors.torch import save_file

    from shardwise.paths import distinct_outputs, output_file

    output_file(out, "--to", "model.safetensors", replaced=True)  # before reading gigabytes; renamed onto at the end
    distinct_outputs({"--to": out}, {"the checkpoint": path})  # never written over what it reads
    if Path(out).is_file() and not _earlier_export(Path(out)):
        raise UsageError(f"--to {out} exists and is not a model this command exported — give a new file path "
                         "(an earlier export is replaced)")
    tensors, manifest = load_tensors(path)
    out = Path(out)
    meta = {"format": "pt", "shardwise_step": str(manifest["step"]), "shardwise_model": json.dumps(manifest["model"])}
    partial = out.with_name(f".{out.name}.partial")  # an interrupted export leaves no truncated file under the name
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(partial), metadata=meta)
    os.replace(partial, out)
    return {"file": str(out), "tensors": len(tensors), "parameters": sum(t.numel() for t in tensors.values()),
            "bytes": out.stat().st_size, "step": manifest["step"]}
