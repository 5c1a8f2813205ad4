"""Read a Hugging Face model folder into shardwise's model, under any layout.

    folder = inspect_folder(path, spec)   # before any process starts: config, every shard, every shape
    parallelize(Transformer(spec, device="meta"), mesh, layout, device, weights=loader(folder))
                                          # in each rank: load_into(chunk, folder, device) after TP/CP

The model is built on the meta device (shapes only) and sliced for its layout there; `load_into` then
gives each parameter this rank's rows or columns, from `safe_open(...).get_slice` on the memory-mapped
files. No rank allocates or reads a tensor it does not hold:
- a whole fp32 tensor on CPU stays a copy-on-write view of the mapped file (as transformers' from_pretrained
  keeps it): its pages are read when the parameter is first used and become the process's own when first
  written (the first optimizer step). With no data-parallel replica (nothing will broadcast, gather or shard
  the parameters) that includes GPT-2's Conv1D weights, kept in their (in, out) layout and seen transposed
  (y = x @ W, Conv1D's own product), and q, k, v as column ranges of the mapped c_attn: a GPT-2 load reads
  nothing, as from_pretrained. (Those columns are not dense; `make_optimizer` copies them dense, because
  torch's fused AdamW walks a parameter's memory as if it were.)
- anything else (a tensor-parallel slice, a Conv1D weight or c_attn part with replicas, bf16/fp16 files, a
  GPU) is copied into a new contiguous fp32 tensor (FSDP refuses strided parameters, and gloo reads a tensor
  from the start of its storage, so a slice must not stay a view), through
  one mapping per tensor closed right after, so the file pages a copy touches are released tensor by tensor:
  a rank's peak memory is its own shard plus at most one HF tensor's pages (benchmarks/hf_load.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shardwise.errors import UsageError
from shardwise.hf.mapping import BASE_PREFIX, IGNORED, hf_tensors, source, table_key
from shardwise.model_spec import rope_scaling
from shardwise.paths import refuse_special
from shardwise.specs import ModelSpec

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
MAX_HEADER = 100 * 2**20  # safetensors' own limit


@dataclass(frozen=True)
class HFFolder:
    """A checked model folder: where each HF tensor this model needs is (file, name in that file)."""

    path: str
    config: dict
    where: dict[str, tuple[str, str, str]]  # our HF name -> (file, name stored in the file, safetensors dtype)
    shapes: dict[str, tuple[int, ...]]  # our HF name -> its shape


# --------------------------------------------------------------------------- the folder, checked whole


def has_weights(path) -> bool:
    p = Path(path)
    return p.is_dir() and ((p / SINGLE).is_file() or (p / INDEX).is_file())


def read_config(path) -> dict:
    from shardwise.specs import read_json_file

    folder = Path(path)
    if not (folder / CONFIG).is_file():
        raise UsageError(f"{folder}: no {CONFIG} — a Hugging Face model folder needs config.json beside its weights")
    return read_json_file(folder / CONFIG, str(folder / CONFIG), "fix the file or download the model again")


def check_config(cfg: dict, source_name: str) -> None:
    """What shardwise's model cannot compute exactly, refused rather than loaded into different numbers.
    (specs.load_model already refused a model_type other than llama and gpt2.)"""
    problems = []
    if cfg.get("model_type", "gpt2" if "n_embd" in cfg else "llama") != "gpt2":  # llama and mixtral
        kind = "llama"
        scaling = dict(rope_scaling(cfg))  # Llama 3.1's the model runs (model.llama3_inv_freq)
        if scaling.get("rope_type", "llama3") != "llama3":
            problems.append(f"rope_scaling {scaling}")
        for key in ("attention_bias", "mlp_bias"):
            if cfg.get(key):
                problems.append(f"{key} true")
        if cfg.get("hidden_act", "silu") != "silu":
            problems.append(f"hidden_act {cfg['hidden_act']}")
    else:
        kind = "gpt2"
        if cfg.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            problems.append(f"activation_function {cfg['activation_function']}")
        for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if cfg.get(key):
                problems.append(f"{key} true")
        if cfg.get("scale_attn_weights") is False:
            problems.append("scale_attn_weights false")
    if problems:
        raise UsageError(f"{source_name}: {', '.join(problems)} is not supported by shardwise's {kind} model — "
                         f"the logits would differ; train with --init random or use another model")


def read_header(file: Path) -> dict:
    """A safetensors header, checked against the file's size: {name: {dtype, shape, data_offsets}}."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 0 or n > min(MAX_HEADER, size - 8):
            raise UsageError(f"{file}: truncated or not a safetensors file ({size} bytes) — download it again")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise UsageError(f"{file}: damaged safetensors header — download it again") from None
    if not isinstance(header, dict):
        raise UsageError(f"{file}: damaged safetensors header (not a table of tensors) — download it again")
    header.pop("__metadata__", None)
    for name, t in header.items():
        if not _entry_ok(t):
            raise UsageError(f"{file}: damaged safetensors header (tensor '{name}': {json.dumps(t)[:80]}) — download it again")
    end = max((t["data_offsets"][1] for t in header.values()), default=0)
    if end > size - 8 - n:
        raise UsageError(f"{file}: truncated — it holds {size - 8 - n:,} bytes of tensor data and its header needs {end:,}; "
                         f"download it again")
    _opens(file)
    return header


def _entry_ok(t) -> bool:
    """A header entry as safetensors writes one: {dtype, shape: [n >= 0, ...], data_offsets: [start, stop]}, its span
    the bytes its shape needs (for the dtypes shardwise reads; safetensors' own check, _opens, covers the others)."""
    if not (isinstance(t, dict) and isinstance(t.get("dtype"), str) and isinstance(t.get("shape"), list)
            and isinstance(t.get("data_offsets"), list) and len(t["data_offsets"]) == 2):
        return False
    whole = [x for x in (*t["shape"], *t["data_offsets"]) if isinstance(x, int) and not isinstance(x, bool) and x >= 0]
    if len(whole) != len(t["shape"]) + 2:
        return False
    start, stop = t["data_offsets"]
    n = DTYPES.get(t["dtype"])
    for d in t["shape"]:
        n = n * d if n is not None else None
    return start <= stop and (n is None or stop - start == n)


def _opens(file: Path) -> None:
    """safetensors itself reads the header as each rank will (it also wants the tensors to cover the file exactly: a
    file with bytes past its last tensor, or a gap, is refused there): its refusal here, before any process starts,
    rather than a rank's traceback. It maps the file and reads no tensor."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt"):
            pass
    except Exception as exc:  # safetensors' SafetensorError derives from Exception only
        if isinstance(exc, OSError):
            raise UsageError(f"{file}: cannot read it ({exc.strerror or exc}) — check the file and its permissions") from None
        raise UsageError(f"{file}: not a whole safetensors file (safetensors: {str(exc).splitlines()[0][:120]}) — "
                         f"download it again") from None


def _files(folder: Path) -> dict[str, list[str] | None]:
    """{file: the tensors the index puts there (None: no index)}; a missing shard is an error. A folder holding both
    model.safetensors and an index is read from model.safetensors, as transformers' from_pretrained reads it
    (modeling_utils: SAFE_WEIGHTS_NAME before SAFE_WEIGHTS_INDEX_NAME), so both load the same weights."""
    if (folder / SINGLE).is_file():
        return {SINGLE: None}
    if (folder / INDEX).is_file():
        from shardwise.specs import read_json_file

        index = read_json_file(folder / INDEX, str(folder / INDEX), "download the model again")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise UsageError(f"{folder / INDEX}: no weight_map — download the model again")
        files: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            files.setdefault(str(file), []).append(name)
        for file in files:
            refuse_special(folder / file, f"{folder / file}, which {INDEX} lists,")
            if not (folder / file).is_file():
                raise UsageError(f"{folder / file}: missing — {INDEX} lists this shard; download it again")
        return files
    found = ", ".join(sorted(p.name for p in folder.glob("*.bin"))) or "none"
    raise UsageError(f"{folder}: no {SINGLE} or {INDEX} (other weight files: {found}) — shardwise reads safetensors; "
                     f"convert with transformers' save_pretrained(..., safe_serialization=True) or use --init random")


def inspect_folder(path, spec: ModelSpec) -> HFFolder:
    """Everything about a model folder that can be wrong, as one UsageError naming the file, before any
    process starts: config, missing or truncated shards, shapes that differ from the config."""
    folder = Path(path)
    config = read_config(folder)
    check_config(config, str(folder / CONFIG))
    try:
        table_key(spec)
    except KeyError as exc:
        raise UsageError(f"{folder / CONFIG}: {exc.args[0]} — train it with --init random") from None
    stored: dict[str, tuple[str, dict]] = {}
    for file, listed in _files(folder).items():
        header = read_header(folder / file)
        for name in listed or ():
            if name not in header:
                raise UsageError(f"{folder / file}: has no tensor '{name}', which {INDEX} puts there — download it again")
        for name, info in header.items():
            stored[name] = (file, info)
    wanted = hf_tensors(spec)
    prefix = BASE_PREFIX[spec.family]
    where = {}
    for name, (_, shape, _) in wanted.items():
        actual = name if name in stored else name.removeprefix(prefix)
        if actual not in stored:
            raise UsageError(f"{folder}: no tensor '{name}' in its safetensors — {CONFIG} describes a model with it "
                             f"({spec.num_layers} layers); the config does not match the weights")
        file, info = stored[actual]
        if tuple(info["shape"]) != shape:
            raise UsageError(f"{folder / file}: '{actual}' has shape {tuple(info['shape'])}, but {CONFIG} implies {shape} — "
                             f"the config does not describe these weights")
        if info["dtype"] not in DTYPES:
            raise UsageError(f"{folder / file}: '{actual}' is {info['dtype']} — shardwise loads F32, F16, BF16 and F64 weights")
        where[name] = (file, actual, info["dtype"])
    used = {actual for _, actual, _ in where.values()}
    tied_head = {"lm_head.weight"} if spec.tie_embeddings else set()
    extra = sorted(n for n in stored if n not in used and n not in tied_head and not IGNORED.search(n))
    if extra:
        file = stored[extra[0]][0]
        raise UsageError(f"{folder / file}: holds '{extra[0]}'{f' and {len(extra) - 1} more' if len(extra) > 1 else ''}, "
                         f"which shardwise's {spec.family} model has no place for — the config does not describe these weights")
    return HFFolder(str(folder), config, where, {name: shape for name, (_, shape, _) in wanted.items()})


# --------------------------------------------------------------------------- each rank: its slices


def _region(shape, shard, tp_rank: int) -> list[tuple[int, int]]:
    """The rows/columns of the logical tensor this rank's local tensor holds ([start, stop) per dim);
    a padded vocabulary's extra rows are outside the logical tensor."""
    region = [(0, n) for n in shape]
    if shard is not None:
        start = tp_rank * shape[shard.dim]
        region[shard.dim] = (start, start + max(0, min(shape[shard.dim], shard.full - start)))
    return region


def read_local(folder: HFFolder, spec: ModelSpec, name: str, shape, shard, tp_rank: int, device="cpu", mapped=None,
               strided: bool = False):
    """This rank's local tensor of parameter `name` (fp32, zero padding), from the mapped file. `mapped`: open
    files ({file: safe_open handle}) to take copy-on-write views from (they stay mapped while a view lives).
    `strided` (CPU): nothing will broadcast, gather or shard the parameter, so it may be any view: GPT-2's Conv1D
    weights keep their (in, out) layout, seen transposed (y = x @ W, as Conv1D computes it), and q, k and v are
    column ranges of the mapped c_attn (not dense: `make_optimizer` makes them dense before a fused AdamW)."""
    import torch
    from safetensors import safe_open

    src = source(spec, name)
    region = _region(shape, shard, tp_rank)
    theirs = list(reversed(region)) if src.conv1d else list(region)
    out_dim = len(theirs) - 1 if src.conv1d else 0
    a, b = theirs[out_dim]
    theirs[out_dim] = (a + src.offset, b + src.offset)
    padded = any(b - a < n for (a, b), n in zip(region, shape))
    if any(b <= a for a, b in theirs):  # only padding rows here
        return torch.zeros(shape, dtype=torch.float32, device=device)
    file, stored, dtype = folder.where[src.name]
    select = tuple(slice(a, b) for a, b in theirs)
    keep = strided and shard is None  # views of any layout: Conv1D's (in, out) seen transposed, parts of c_attn
    if mapped is not None and shard is None and dtype == "F32" and torch.device(device).type == "cpu":
        if file not in mapped:
            mapped[file] = safe_open(Path(folder.path) / file, framework="pt")
        piece = mapped[file].get_tensor(stored)[select]
        view = piece.t() if src.conv1d else piece
        # with replicas, only a contiguous tensor at the start of its storage: gloo sends from there, FSDP
        # refuses strided parameters
        if keep or (view.is_contiguous() and view.storage_offset() == 0):
            return view
    # One mapping per tensor: closing it releases the pages this copy touched.
    with safe_open(Path(folder.path) / file, framework="pt") as f:
        piece = f.get_slice(stored)[select]
        if keep and src.conv1d:  # a bf16/fp16 file, upcast in Conv1D's layout (no transpose)
            return piece.to(device, torch.float32, copy=True, memory_format=torch.contiguous_format).t()
        local = (torch.zeros if padded else torch.empty)(shape, dtype=torch.float32, device=device)
        view = local
        for d, (a, b) in enumerate(region):
            view = view.narrow(d, 0, b - a)
        view.copy_(piece.t() if src.conv1d else piece)
        del piece
    return local


def read_experts(folder: HFFolder, spec: ModelSpec, name: str, shape, placement, device="cpu"):
    """This rank's experts of stacked tensor `name` (E/ep of them, the etp slice of each), one HF tensor per
    expert (`placement`: the chunk's ExpertPlacement; None: every expert whole)."""
    import torch
    from safetensors import safe_open

    src = source(spec, name)
    ep_rank, etp_rank = (placement.rank("ep"), placement.rank("etp")) if placement is not None else (0, 0)
    local = torch.empty(shape, dtype=torch.float32, device=device)
    width = shape[2] if name.endswith("w2") else shape[1]  # the expert's FFN width on this rank
    cols = slice(etp_rank * width, (etp_rank + 1) * width)
    for j in range(shape[0]):
        file, stored, _ = folder.where[src.name.format(e=ep_rank * shape[0] + j)]
        with safe_open(Path(folder.path) / file, framework="pt") as f:
            piece = f.get_slice(stored)[:, cols] if name.endswith("w2") else f.get_slice(stored)[cols]
            local[j].copy_(piece)
    return local


def load_into(chunk, folder: HFFolder, device, replicated: bool = True) -> None:
    """Give every parameter of `chunk` (a `Sharded` model built on meta, sliced by tensor_parallel) this
    rank's values, then move it to `device`. `replicated`: data parallelism (DDP, ZeRO, FSDP) will broadcast,
    gather or shard the parameters, so each must be a contiguous tensor at the start of its own storage."""
    import torch
    import torch.distributed as dist
    from torch import nn

    model = chunk.model
    tp_rank = dist.get_rank(chunk.tp_group) if chunk.tp_group is not None else 0
    mapped = {}
    for name, p in list(model.named_parameters()):
        parent, _, leaf = name.rpartition(".")
        if ".experts." in name:
            value = read_experts(folder, model.spec, name, tuple(p.shape), chunk.experts, device)
        else:
            value = read_local(folder, model.spec, name, tuple(p.shape), chunk.tp_shards.get(name), tp_rank, device, mapped,
                               strided=not replicated and torch.device(device).type == "cpu")
        setattr(model.get_submodule(parent), leaf, nn.Parameter(value))
    for handle in mapped.values():
        handle.__exit__(None, None, None)  # the views keep their mapping
    model.tie()
    model.to(device)  # the RoPE tables


def loader(folder: HFFolder | None):
    """`parallelize(..., weights=loader(folder))`: the function that fills a chunk built on meta (None:
    no folder, the weights come from the seed)."""
    return None if folder is None else _Loader(folder)


@dataclass(frozen=True)
class _Loader:
    folder: HFFolder

    def __call__(self, chunk, device, replicated: bool = True) -> None:
        load_into(chunk, self.folder, device, replicated)


def model_source(model: str, init: str | None, spec: ModelSpec) -> tuple[HFFolder | None, dict | None]:
    """What `train --model M [--init I]` starts from: (the checked folder to load, or None for the seeded init;
    the folder's config.json, or None for a preset or a bare config file)."""
    folder = Path(model)
    if not folder.is_dir():
        if init == "pretrained":
            raise UsageError(f"--init pretrained needs a Hugging Face model folder with weights, and --model {model} is "
                             f"{'a config file' if folder.is_file() else 'a preset'} — give the folder, or drop --init")
        return None, None
    from shardwise.preflight import check_runtime_blocks

    # a folder of a model the runtime cannot build says that first, whatever --init, naming the config.json
    check_runtime_blocks(spec, str(folder / CONFIG))
    for name in (SINGLE, INDEX):  # a pipe (never opened: it would block) or a symlink loop, not "no weights"
        refuse_special(folder / name, f"--model {model}: its {name}")
    config = read_config(folder)
    if init is None and not has_weights(folder):
        other = other_weights(folder)
        if other:  # weights it cannot read: never a silent random start
            raise UsageError(f"{folder}: weights in {', '.join(other)}, which shardwise does not read (no {SINGLE} or "
                             f"{INDEX}) — convert with transformers' save_pretrained(..., safe_serialization=True), or "
                             f"give --init random to train from a seeded initialisation")
    if init == "random" or (init is None and not has_weights(folder)):
        return None, config
    return inspect_folder(folder, spec), config


# Weight files of other formats a model folder may hold, which `train` cannot start from: PyTorch pickles as
# transformers and Meta's releases name them, TensorFlow and Flax weights, safetensors under other names. A Trainer's
# own files beside them (training_args.bin, optimizer.pt, rng_state.pth, ...) are not weights.
OTHER_WEIGHTS = ("pytorch_model*.bin", "model*.bin", "model*.pt", "model*.pth", "consolidated*.pt", "consolidated*.pth",
                 "*.ckpt", "tf_model*.h5", "flax_model*.msgpack", "*.safetensors")


def other_weights(folder: Path) -> list[str]:
    """The weight files of a folder that has neither SINGLE nor INDEX (has_weights is false): what it holds instead."""
    return sorted({p.name for pattern in OTHER_WEIGHTS for p in folder.glob(pattern)})
