"""A shardwise checkpoint as a Hugging Face model folder that `transformers` loads.

    DIR/config.json                          the original folder's config (trained from --model DIR) or the spec's
    DIR/model-0000k-of-0000n.safetensors     HF names and layouts (hf.mapping), fp32, at most --max-shard-size each
    DIR/model.safetensors.index.json         {"metadata": {"total_size"}, "weight_map": {name: file}}
    DIR/tokenizer.json (+ its config files)  when the run used one that still exists

The checkpoint is read one output shard at a time (DCP reads each tensor's pieces from every rank's file),
so exporting needs memory for one shard, not the whole model.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import fields
from pathlib import Path

from shardwise.errors import UsageError
from shardwise.hf.mapping import hf_config, hf_tensors
from shardwise.specs import ModelSpec

INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "B": 1}


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB' or a number of bytes (Hugging Face's max_shard_size)."""
    t = str(text).strip().upper()
    for unit in sorted(UNITS, key=len, reverse=True):
        if t.endswith(unit):
            number, scale = t[: -len(unit)], UNITS[unit]
            break
    else:
        number, scale = t, 1
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise UsageError(f"--max-shard-size {text!r}: give a size such as 5GB, 500MB or a number of bytes") from None
    if value < 1:
        raise UsageError(f"--max-shard-size must be positive, got {text!r}")
    return value


def spec_of(manifest: dict) -> ModelSpec:
    names = {f.name for f in fields(ModelSpec)}
    # JSON turned the spec's tuples into lists
    return ModelSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in manifest["model"].items() if k in names})


def _plan_shards(tensors: dict, limit: int) -> list[list[str]]:
    """HF tensor names grouped into files of at most `limit` bytes (a larger tensor gets a file of its own)."""
    shards, size = [[]], 0
    for name, (_, shape, _) in tensors.items():
        n = 4
        for d in shape:
            n *= d
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def _hf_tensor(ours: dict, members: list[str], conv1d: bool):
    """One HF tensor from our tensors: transposed for Conv1D, fused along the output features."""
    import torch

    if len(members) == 1 and "#" in members[0]:  # one expert of a stacked (experts, ...) tensor
        name, e = members[0].split("#")
        return ours[name][int(e)].contiguous()
    parts = [ours[m].t() if conv1d else ours[m] for m in members]
    return (torch.cat(parts, dim=1 if conv1d else 0) if len(parts) > 1 else parts[0]).contiguous()


def export_hf(path, out, max_shard_size: str = "5GB") -> dict:
    """Write checkpoint `path` (a --checkpoint-dir or one step directory) as a Hugging Face folder `out`."""
    from safetensors.torch import save_file

    from shardwise.checkpoint import validate
    from shardwise.checkpoint.export import read_tensors
    from shardwise.checkpoint.store import resolve

    from shardwise.paths import distinct_outputs, output_dir

    limit = parse_size(max_shard_size)
    ckpt = resolve(path)
    out = Path(out)
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"--to {out} exists and is not an empty folder — give a new folder for the Hugging Face model")
    distinct_outputs({"--to": out}, {"the checkpoint": path})
    manifest = validate(ckpt)
    spec = spec_of(manifest)
    try:
        tensors = hf_tensors(spec)
    except KeyError as exc:  # a model shape no transformers class of the table holds (mapping.table_key)
        raise UsageError(f"--format hf: {exc.args[0]} — export it with --format safetensors (shardwise's names)") from None
    output_dir(out, "--to")  # before reading gigabytes, once the model is known to have a Hugging Face form
    shards = _plan_shards(tensors, limit)
    weight_map, total = {}, 0
    for k, names in enumerate(shards, 1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        members = list(dict.fromkeys(m.split("#")[0] for n in names for m in tensors[n][0]))
        ours = {key.removeprefix("model."): t for key, t in read_tensors(ckpt, manifest, [f"model.{m}" for m in members]).items()}
        block = {n: _hf_tensor(ours, tensors[n][0], tensors[n][2]) for n in names}
        save_file(block, str(out / file), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in block.values())
        weight_map.update({n: file for n in names})
        del ours, block
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(hf_config(spec, manifest.get("hf_config")), indent=2) + "\n")
    used = manifest.get("tokenizer")
    copied, changed = _copy_tokenizer(used, out, manifest.get("tokenizer_sha256"))
    gone = used if used and used != "bytes" and not Path(used).is_file() else None  # removed since the run
    return {"folder": str(out), "files": len(shards), "tensors": len(tensors), "bytes": total,
            "parameters": total // 4, "step": manifest["step"], "tokenizer": copied, "tokenizer_changed": changed,
            "tokenizer_missing": gone}


def _copy_tokenizer(tokenizer: str | None, out: Path, sha256: str | None) -> tuple[str | None, str | None]:
    """(copied, changed): the run's tokenizer.json and its config files beside the weights, when the run used one
    that still exists and is still the file it trained with (its sha256, in checkpoints since it was recorded); else
    the path of one that changed since (left out: its token ids would not be the weights')."""
    if not tokenizer or not Path(tokenizer).is_file():
        return None, None
    src = Path(tokenizer)
    if sha256 and hashlib.sha256(src.read_bytes()).hexdigest() != sha256:
        return None, str(src)
    shutil.copyfile(src, out / "tokenizer.json")
    for name in TOKENIZER_FILES[1:]:
        if (src.parent / name).is_file():
            shutil.copyfile(src.parent / name, out / name)
    return str(src), None
