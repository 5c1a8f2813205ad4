"""`shardwise checkpoint`: look inside a training checkpoint, or export its model (one safetensors file or a Hugging
Face folder).

    shardwise checkpoint inspect DIR [--json] [--tensors]
    shardwise checkpoint export DIR --to model.safetensors
    shardwise checkpoint export DIR --format hf --to FOLDER     (a Hugging Face model folder)

DIR is a --checkpoint-dir (its newest complete checkpoint is used) or one step_NNNNNN directory in it.
Both commands read only, and validate every file against the manifest first.
"""

from __future__ import annotations

from pathlib import Path

from shardwise.commands.common import print_json
from shardwise.units import count


def register(subparsers, name, help):
    p = subparsers.add_parser(name, help=help, description=help)
    # `checkpoint --json inspect DIR` as `checkpoint inspect DIR --json` (every command takes --json where a user puts it)
    p.add_argument("--json", action="store_true", dest="json_first", help="print as JSON (as ACTION's own --json)")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    ins = sub.add_parser("inspect", help="step, the layout that wrote it, model, run settings, tensors, sizes",
                         description="step, the layout that wrote it, model, run settings, tensors, sizes")
    ins.add_argument("path", metavar="DIR", help="a --checkpoint-dir (newest checkpoint) or one step_NNNNNN directory")
    ins.add_argument("--json", action="store_true", help="print everything as JSON")
    ins.add_argument("--tensors", action="store_true", help="list every tensor with its logical shape")
    ins.set_defaults(func=run_inspect)
    exp = sub.add_parser("export", help="write the model as one .safetensors file, or as a Hugging Face model folder",
                         description="write the model as one .safetensors file (full, unpadded tensors, layout-free names), "
                                     "or with --format hf as a Hugging Face model folder (config.json, sharded safetensors, index)",
                         epilog="load it anywhere: safetensors.torch.load_file('model.safetensors'), or "
                                "transformers.AutoModelForCausalLM.from_pretrained('FOLDER') after --format hf")
    exp.add_argument("path", metavar="DIR", help="a --checkpoint-dir (newest checkpoint) or one step_NNNNNN directory")
    exp.add_argument("--to", required=True, metavar="FILE|FOLDER",
                     help="output file (e.g. model.safetensors; an existing file only if an earlier export wrote it), "
                          "or a new folder with --format hf")
    exp.add_argument("--format", default="safetensors", choices=["safetensors", "hf"],
                     help="safetensors: one file under shardwise's names (default); hf: a folder transformers loads")
    exp.add_argument("--max-shard-size", default=None, metavar="SIZE", help="--format hf: the largest safetensors file (default 5GB)")
    exp.add_argument("--json", action="store_true", help="print what was written as JSON")
    exp.set_defaults(func=run_export)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def run_inspect(args) -> int:
    args.json = args.json or getattr(args, "json_first", False)
    from shardwise.console import Console
    from rich.table import Table

    from shardwise.checkpoint.export import summary

    info = summary(args.path)
    if args.json:
        if not args.tensors:
            info.pop("tensors")
        print_json({**info, "layout": _reported(info["layout"])})
        return 0
    lay, model, run = info["layout"], info["model"], info["run"]
    console = Console()
    table = Table(title=info["checkpoint"], show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    sched = f", {lay['schedule']}" + (f" v{lay['vpp']}" if lay["vpp"] > 1 else "") if lay["pp"] > 1 else ""
    table.add_row("step", f"{info['step']} of {info['steps']}")
    from shardwise.specs import Layout
    from shardwise.train import split

    table.add_row("written by", f"{split(Layout(**lay))} ({info['world_size']} ranks), ZeRO {lay['zero']}"
                  f"{', sequence parallel' if lay['sequence_parallel'] else ''}{sched}")
    params = info["groups"].get("model", {}).get("elements", 0)
    table.add_row("model", f"{model['name']} ({model['family']}, {model['num_layers']} layers, hidden {model['hidden']}, "
                  f"vocab {model['vocab_size']}), {params:,} parameters")
    table.add_row("run", f"global batch {run['global_batch']} x {run['seq_len']} tokens, seed {run['seed']}, lr {run['lr']}, "
                  f"warm-up {run['warmup_steps']}")
    for kind, g in sorted(info["groups"].items()):
        table.add_row(f"{kind}.*", f"{count(g['tensors'], 'tensor')}, {count(g['elements'], 'element')}")
    table.add_row("on disk", f"{_size(info['bytes'])} in {info['files']} files, saved {info['saved_at']}")
    parent = Path(info["checkpoint"]).parent
    given = info.get("model_given") or model["name"]  # older checkpoints: the model's name
    table.add_row("resume", f"{resume_command(info, given, parent)} (with any layout: --dp/--tp/--pp/--cp/--ep, ZeRO, schedule, recompute)")
    console.print(table)
    if args.tensors:
        t = Table("tensor", "shape", "dtype")
        for key, v in info["tensors"].items():
            t.add_row(key, "×".join(map(str, v["shape"])) or "scalar", v["dtype"])
        console.print(t)
    return 0


def _reported(lay: dict) -> dict:
    """The manifest's layout as `train --json`, `validate --json` and `estimate --json` report a layout
    (Layout.record): dp_shard the dp ranks of one shard group, not the 0 a manifest stores for "every dp rank". The
    manifest itself keeps its 0 (what a resume, and older shardwise, read back); fields this version does not know
    are shown as written."""
    from dataclasses import fields

    from shardwise.specs import Layout

    known = {f.name for f in fields(Layout)}
    return {**lay, "dp_shard": Layout(**{k: v for k, v in lay.items() if k in known}).dp_shard_size}


def resume_command(info: dict, model: str, parent) -> str:
    """The train command that resumes this checkpoint's run: its settings, and the corpus it trained on as it was
    given (a resume checks the data is the same), quoted for a shell."""
    import shlex

    from shardwise.corpus.tokenizer import BYTES
    from shardwise.paths import shown

    run = info["run"]
    argv = ["shardwise", "train", "--model", shown(model)] + (["--init", info["init"]] if info.get("init") else [])
    for key in ("steps", "global_batch", "seq_len", "seed", "lr", "warmup_steps", "weight_decay", "grad_clip"):
        if run.get(key) is not None:
            argv += [f"--{key.replace('_', '-')}", str(run[key])]
    data = info["data"]
    if data:  # older checkpoints recorded the files only, then the paths as given (relative to where the run started)
        argv += ["--data", *map(shown, data.get("given_absolute") or data.get("given") or data.get("files", []))]
        argv += ["--data-field", data["field"]] if data.get("field", "text") != "text" else []
        if info.get("tokenizer") not in (None, BYTES):  # bytes: what --data gets with no tokenizer named
            argv += ["--tokenizer", info["tokenizer"]]
    val = info.get("validation")
    if val:  # without them the resumed run would stop validating
        argv += ["--val-data", *map(shown, val["given_absolute"])]
        argv += ["--eval-every", str(val["eval_every"])] if val.get("eval_every") else []
    return shlex.join(argv + ["--checkpoint-dir", str(parent), "--resume"])


def run_export(args) -> int:
    args.json = args.json or getattr(args, "json_first", False)
    if args.format == "hf":
        return _export_hf(args)
    if args.max_shard_size is not None:
        from shardwise.errors import UsageError

        raise UsageError("--max-shard-size splits a --format hf folder's safetensors files; the default format writes "
                         "one file — add --format hf, or drop --max-shard-size")
    from shardwise.checkpoint.export import export_safetensors

    out = export_safetensors(args.path, args.to)
    if args.json:
        from shardwise.commands.common import print_json

        print_json(out)
        return 0
    print(f"wrote {out['file']}: {out['tensors']} tensors, {out['parameters']:,} parameters, {_size(out['bytes'])} "
          f"(step {out['step']})")
    return 0


def _export_hf(args) -> int:
    from shardwise.hf.save import export_hf

    out = export_hf(args.path, args.to, args.max_shard_size or "5GB")
    if args.json:
        print_json(out)
        return 0
    from shardwise.paths import shown

    extra = f", tokenizer from {shown(out['tokenizer'])}" if out["tokenizer"] else ""
    if out["tokenizer_changed"]:
        extra += (f"; not the tokenizer at {shown(out['tokenizer_changed'])}: it changed since the run (another "
                  f"sha256), so its ids are not the weights' — copy the one the run trained with by hand")
    if out["tokenizer_missing"]:
        extra += (f"; no tokenizer: the run's, {shown(out['tokenizer_missing'])}, is no longer there — copy the one the "
                  f"run trained with by hand")
    print(f"wrote {out['folder']}: config.json, {count(out['files'], 'safetensors file')} with index, {out['tensors']} tensors, "
          f"{out['parameters']:,} parameters, {_size(out['bytes'])} (step {out['step']}){extra}")
    return 0
