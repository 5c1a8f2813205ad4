"""`shardwise train`: train a model with a dp x tp x pp (x cp) layout on torch.distributed.

On one machine it starts the dp*tp*pp*cp processes itself; under `torchrun --nnodes N ...` every process
runs one rank. `--plan plan.json` takes the layout from `shardwise plan --json` (its "best" entry)
or from `shardwise estimate --json`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from shardwise.commands.common import add_layout_args
from shardwise.errors import UsageError

LAYOUT_KEYS = {"dp": int, "tp": int, "pp": int, "micro_batch": int, "vpp": int, "zero": int,
               "recompute": str, "recompute_layers": int, "sequence_parallel": bool, "schedule": str, "cp": int, "cp_mode": str, "ep": int, "etp": int}


def register(subparsers, name, help):
    p = subparsers.add_parser(name, help=help, description=help,
                              epilog="example: shardwise train --model tiny --dp 2 --tp 2 --steps 50 --metrics-file m.jsonl")
    p.add_argument("--model", default=None,
                   help="model preset (e.g. tiny, tiny-gpt2), a Hugging Face config.json, or a Hugging Face model folder "
                        "(config.json + safetensors: its weights are loaded); default: with --resume, the model its checkpoint "
                        "trained; else the --plan's preset, else tiny")
    p.add_argument("--init", default=None, choices=["pretrained", "random"],
                   help="pretrained: the --model folder's weights (the default when it has them); random: seeded "
                        "initialisation, ignoring them")
    p.add_argument("--dp", type=int, default=None, help="data-parallel degree (default 1)")
    add_layout_args(p)
    p.set_defaults(tp=None, pp=None, zero=None, micro_batch=None, vpp=None, recompute=None, recompute_layers=None,
                   sequence_parallel=None,
                   ep=None, etp=None, cp=None, cp_mode=None)
    p.add_argument("--microbatches", type=int, default=None,
                   help="micro-batches per step and dp rank (instead of --micro-batch; default: one without a pipeline, one "
                        "sequence each with one: global batch / dp of them)")
    p.add_argument("--plan", default=None, help="take the layout from `shardwise plan --json` / `estimate --json` output")
    p.add_argument("--steps", type=int, default=50, help="optimizer steps (default 50)")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per step, the same for every layout (default: the --plan's, else 8)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the --plan's, else 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and of the data order (default 0)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of AdamW (default 1e-3)")
    p.add_argument("--warmup-steps", type=int, default=None, help="linear warm-up steps before the cosine decay (default 10%% of --steps)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay on weight matrices (default 0.1)")
    p.add_argument("--grad-clip", type=float, default=1.0, help="clip the global gradient norm to this (default 1.0)")
    p.add_argument("--metrics-file", default=None, help="write one JSON object per step (step, loss, step_time_s, tokens_per_s, lr, grad_norm)")
    p.add_argument("--backend", default=None, choices=["gloo", "nccl"], help="default: nccl with GPUs, else gloo")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any collective may wait before the job fails (default 300)")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="pipeline runs: write DIR/trace.json (Perfetto) and DIR/timeline.png/.svg (measured vs simulated)")
    p.add_argument("--no-memory-check", action="store_true",
                   help="start even if the planner predicts the job needs more memory than this machine has")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (the resumed, saved and summary lines are still printed)")
    p.add_argument("--json", action="store_true",
                   help='print {"records": [...], "summary": {...}} (and "trace" with --trace) at the end instead of '
                        'the progress bar and messages; the summary compares the measured memory of the first step '
                        'with the planner\'s prediction')
    dg = p.add_argument_group("data", "your corpus, tokenized once into a cached memory-mapped token file")
    dg.add_argument("--data", nargs="+", default=None, metavar="PATH",
                    help="text files, JSON lines (.jsonl) or Parquet (.parquet) files, or folders of them "
                         "(default: the built-in corpus, byte tokens)")
    dg.add_argument("--data-field", default=None, metavar="NAME", help="the JSON-lines field or Parquet column with the text (default text)")
    dg.add_argument("--tokenizer", default=None, metavar="PATH|DIR",
                    help="a Hugging Face tokenizer.json, or a folder holding one (default: the --model folder's, else bytes)")
    dg.add_argument("--val-data", nargs="+", default=None, metavar="PATH", help="validation text: loss and perplexity in the metrics")
    dg.add_argument("--eval-every", type=int, default=None, metavar="N", help="evaluate every N steps (and after the last; default: after the last)")
    dg.add_argument("--eval-batches", type=int, default=None, metavar="K", help="global batches of --val-data per evaluation, at most (default 4)")
    dg.add_argument("--data-cache", default=None, metavar="DIR",
                    help="where tokenized corpora are kept (default $SHARDWISE_CACHE/tokens or ~/.cache/shardwise/tokens)")
    ck = p.add_argument_group("checkpoints", "layout-free checkpoints: resume under any dp x tp x pp x cp x ep, ZeRO stage, schedule or recompute")
    ck.add_argument("--checkpoint-dir", default=None, metavar="DIR", help="write checkpoints to DIR/step_NNNNNN (and resume from there)")
    ck.add_argument("--save-every", type=int, default=None, metavar="N",
                    help="save every N steps (default: only after the last step of this invocation)")
    ck.add_argument("--keep", type=int, default=None, metavar="K", help="keep the newest K checkpoints (default 3)")
    ck.add_argument("--stop-after", type=int, default=None, metavar="K",
                    help="end this invocation after step K with a checkpoint; --steps still sets the whole run's schedule")
    ck.add_argument("--resume", action="store_true",
                    help="continue from the newest complete checkpoint in --checkpoint-dir, under this invocation's layout")
    ck.add_argument("--max-restarts", type=int, default=0, metavar="R",
                    help="if a rank dies, restart the job up to R times; it resumes from the newest checkpoint (default 0)")
    p.set_defaults(func=run)


def _plan_file(path: str):
    """The parsed JSON of a plan file (checked to exist and parse: one line otherwise)."""
    file = Path(path)
    if file.is_dir():
        raise UsageError(f"--plan {path} is a folder — give the file `shardwise plan ... --json > plan.json` wrote")
    if not file.is_file():
        raise UsageError(f"plan file '{path}' not found — write one with `shardwise plan ... --json > {path}`")
    from shardwise.specs import read_json_file

    return read_json_file(file, path, "write it with `shardwise plan ... --json`")


def apply_plan_job(args, spec, data=None) -> None:
    """--global-batch and --seq-len from the plan's own job (`plan`/`estimate --json` echo it) where the command names
    neither, else train's defaults (8 and 64); a value that contradicts the plan's is an error, and so is a plan made
    for another model (its parameter count, which a copy of the same config keeps whatever its file is called).
    `data`: the plan file's JSON (read once by config_from)."""
    data = data if isinstance(data, dict) else {}
    job = data.get("job") if isinstance(data.get("job"), dict) else {}
    planned = data.get("best", data).get("total_params") if isinstance(data.get("best", data), dict) else None
    if isinstance(planned, int) and planned != spec.num_params():
        given = "" if not getattr(args, "model_defaulted", False) else " (--model not given)"
        raise UsageError(f"{args.plan} is a plan for {job.get('model', 'another model')} ({planned:,} parameters), and "
                         f"--model {args.model}{given} has {spec.num_params():,} — add --model with the preset, "
                         f"config.json or folder the plan was made for, or plan again for this model")
    for key, default in (("global_batch", 8), ("seq_len", 64)):
        given, planned = getattr(args, key), job.get(key)
        if planned is not None and (not isinstance(planned, int) or isinstance(planned, bool) or planned < 1):
            raise UsageError(f"{args.plan}: job.{key} is {json.dumps(planned)}, not a whole number of 1 or more — "
                             f"write the plan again with `shardwise plan ... --json`, or drop its job")
        if given is not None and planned is not None and given != planned:
            raise UsageError(f"--{key.replace('_', '-')} {given} contradicts {key}={planned} in {args.plan} — drop "
                             f"one of them")
        setattr(args, key, given if given is not None else planned if isinstance(planned, int) else default)


def read_plan(path: str, data=None) -> dict:
    """The layout keys of a plan file (or of its JSON `data`, read already): its "best" object, or a bare layout
    object, each value of the type and range a layout takes (said as the plan's key, not as a flag)."""
    data = _plan_file(path) if data is None else data
    layout = data.get("best", data) if isinstance(data, dict) else None
    if not isinstance(layout, dict) or not {"dp", "tp", "pp"} <= layout.keys():
        raise UsageError(f"{path}: no layout found (need a \"best\" object or keys dp, tp, pp) — write it with `shardwise plan ... --json`")
    out = {}
    for key, kind in LAYOUT_KEYS.items():
        if key in layout and layout[key] is not None:  # null: the default (recompute_layers: every layer)
            value = layout[key]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise UsageError(f"{path}: '{key}' must be {kind.__name__}, got {value!r}")
            allowed, least = _plan_values(key)
            if allowed is not None and value not in allowed or least is not None and value < least:
                what = f"one of {', '.join(map(str, allowed))}" if allowed else f"at least {least}"
                raise UsageError(f"{path}: '{key}' is {value!r}, which no layout has (it must be {what}) — write the "
                                 f"plan again with `shardwise plan ... --json`")
            out[key] = value
    if layout.get("dp_shard", layout["dp"]) != layout["dp"]:
        raise UsageError(f"{path}: dp_shard {layout['dp_shard']} of dp {layout['dp']} is hybrid sharding (HSDP), which "
                         f"shardwise's runtime does not run — plan with --framework shardwise")
    return out


def _plan_values(key: str) -> tuple[tuple | None, int | None]:
    """(the values a plan's `key` may take where they are a list, the least it may be where it is a count)."""
    from shardwise.specs import CP_MODES, RECOMPUTE, SCHEDULES, ZERO_STAGES

    listed = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "cp_mode": CP_MODES, "zero": ZERO_STAGES}
    if key in listed or LAYOUT_KEYS[key] is not int:
        return listed.get(key), None
    return None, 0 if key == "recompute_layers" else 1


def layout_from(args, plan_data=None):
    """The layout from --plan (its JSON `plan_data`, read already, or its file) and/or the flags; a flag that
    contradicts the plan is an error."""
    from shardwise.specs import Layout, default_schedule

    flags = {k: getattr(args, k) for k in LAYOUT_KEYS if getattr(args, k) is not None}
    values = {}
    if args.plan:
        values = read_plan(args.plan, plan_data)
        for key, value in flags.items():
            if key in values and values[key] != value:
                raise UsageError(f"--{key.replace('_', '-')} {value} contradicts {key}={values[key]} in {args.plan} — drop one of them")
    values = {**values, **flags}
    values.setdefault("schedule", default_schedule(values.get("vpp", 1)))
    _idle_knobs(values, named=set(flags))
    if "recompute_layers" in values:  # recomputing whole layers is full recompute
        values.setdefault("recompute", "full")
    dp, pp = values.get("dp", 1), values.get("pp", 1)
    if args.microbatches is not None:  # the layout itself is checked once, by launch.check
        if "micro_batch" in flags:
            raise UsageError("give --micro-batch or --microbatches, not both")
        if args.microbatches < 1:
            raise UsageError(f"--microbatches must be at least 1, got {args.microbatches}")
        if dp < 1 or args.global_batch % (dp * args.microbatches):
            raise UsageError(f"--microbatches {args.microbatches} does not divide the {args.global_batch // max(dp, 1)} "
                             f"sequences per dp rank (global batch {args.global_batch}, dp {dp}) — pick a divisor")
        implied = args.global_batch // (dp * args.microbatches)
        if values.get("micro_batch", implied) != implied:
            raise UsageError(f"--microbatches {args.microbatches} means micro-batch {implied}, which contradicts "
                             f"micro_batch={values['micro_batch']} in {args.plan} — drop one of them")
        values["micro_batch"] = implied
    elif "micro_batch" not in values:
        # Without a pipeline one micro-batch per step is fastest; a pipeline needs several.
        values["micro_batch"] = max(1, args.global_batch // max(dp, 1)) if pp == 1 else 1
    return Layout(**values)


def _idle_knobs(values: dict, named: set[str]) -> None:
    """A knob that changes nothing in this layout is set back to what runs and said (on stderr), as estimate says
    it, so the run's recorded layout is the one that ran (commands.common.settle_idle_knobs); a knob the --plan set,
    not a flag, is said as the plan's key."""
    from shardwise.commands.common import settle_idle_knobs
    from shardwise.console import note

    def said(key: str, text: str) -> str:
        return text if key in named else text.replace(f"--{key.replace('_', '-')}", f"the plan's {key}", 1)

    for text in settle_idle_knobs(values, vpp_named="vpp" in named, said=said):
        note(text)


# A flag that only means something beside another: (flag, attribute, what it needs, attributes of the partner).
NEEDS = (("--keep", "keep", "--checkpoint-dir DIR (the checkpoints it keeps)", ("checkpoint_dir",)),
         ("--eval-batches", "eval_batches", "--val-data PATH... (the text it evaluates on)", ("val_data",)),
         ("--data-field", "data_field", "--data or --val-data (the JSON-lines or Parquet files it reads)",
          ("data", "val_data")))


def _check_partners(args) -> None:
    for flag, attr, needs, partners in NEEDS:
        if getattr(args, attr) is not None and not any(getattr(args, p) for p in partners):
            raise UsageError(f"{flag} needs {needs}")


def config_from(args):
    _default_model(args)
    _check_partners(args)
    from shardwise.hf.load import model_source
    from shardwise.launch import resolve_backend
    from shardwise.specs import load_model
    from shardwise.train import TrainConfig

    spec = load_model(args.model)
    plan = _plan_file(args.plan) if args.plan else None  # read once: the job's batch and sequence, then its layout
    apply_plan_job(args, spec, plan)
    weights, hf_config = model_source(args.model, args.init, spec)
    if weights is None and hf_config is not None and args.init is None and not args.resume \
            and os.environ.get("RANK", "0") == "0":
        from shardwise.console import note

        note(f"{args.model} holds no weights: training starts from a seeded initialisation (--init random says so; "
             f"--init pretrained refuses a folder without weights)")
    return TrainConfig(spec=spec, layout=layout_from(args, plan), steps=args.steps,
                       global_batch=args.global_batch, seq_len=args.seq_len, seed=args.seed, lr=args.lr,
                       warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
                       backend=resolve_backend(args.backend), timeout_s=args.timeout,
                       metrics_file=args.metrics_file, trace_dir=args.trace, progress=not (args.no_progress or args.json),
                       messages=not args.json, json_output=args.json, measure_memory=args.json,
                       memory_check=not args.no_memory_check,
                       checkpoint_dir=args.checkpoint_dir, save_every=args.save_every, keep=3 if args.keep is None else args.keep,
                       stop_after=args.stop_after, resume=args.resume, max_restarts=args.max_restarts,
                       weights=weights, hf_config=hf_config, model_given=_given(args.model), init=args.init,
                       eval_every=args.eval_every,
                       eval_batches=4 if args.eval_batches is None else args.eval_batches)


def run(args) -> int:
    from shardwise import fork_server
    from shardwise.console import held_notes

    with held_notes() as notes:  # said once every check has passed: a refusal is one line
        _default_model(args)
        _distinct_paths(args)
        with fork_server.early(_ranks_asked(args)):  # its ranks' server imports torch while this process does
            return _run(args, notes)


def _ranks_asked(args) -> int:
    """dp x tp x pp x cp as the flags and the plan file ask, read before anything is checked (1 where unsure: the
    checks then say what is wrong)."""
    try:
        values = read_plan(args.plan) if args.plan else {}
    except UsageError:
        return 1
    from shardwise.specs import Layout

    values.update({key: getattr(args, key) for key in ("dp", "tp", "pp", "cp") if getattr(args, key) is not None})
    return Layout(**{key: max(values.get(key, 1), 0) for key in ("dp", "tp", "pp", "cp")}).world_size


def _run(args, notes) -> int:
    from shardwise.launch import JobFailed, check, launch

    from shardwise.corpus import prepare_run

    cfg = config_from(args)
    check(cfg, checkpoints=False)  # every flag, before the data is tokenized (which can take long)
    resumed = _check_checkpoint_folder(cfg)
    if not cfg.resume and cfg.metrics_file and os.path.isfile(cfg.metrics_file) and os.path.getsize(cfg.metrics_file):
        _note_overwritten(cfg.metrics_file)
    # Then the data (tokenized once, then cached): a resume checks it is the run's data.
    cfg = prepare_run(cfg, data=args.data, val_data=args.val_data, tokenizer=args.tokenizer, model=args.model,
                      field=args.data_field or "text", cache=args.data_cache,
                      progress=cfg.progress and os.environ.get("RANK", "0") == "0")
    _check_resumed_data(cfg, resumed)
    cfg = _named_run(cfg)
    notes.release()
    _note_vocab_padding(cfg)
    rank0 = os.environ.get("RANK", "0") == "0"  # under torchrun every rank runs this command: rank 0 speaks
    try:
        out = launch(cfg)
    except JobFailed as exc:
        if rank0:
            print(f"shardwise: error: {exc}", file=sys.stderr)
        from shardwise.commands.common import print_failure_json

        print_failure_json(args, str(exc), 1)  # stdout stays parseable under --json
        return 1
    if out is not None:
        import json

        print(json.dumps(out), flush=True)
    return 0


def _check_checkpoint_folder(cfg):
    """checkpoint.check before the data is tokenized (which can take long): a folder of another run without --resume,
    other settings, a finished run, a damaged checkpoint are said first; whether the data is the run's needs the
    tokenized data's key (_check_resumed_data). Returns the checkpoint resumed from, or None."""
    from shardwise.checkpoint import check, resume_path

    check(cfg, data=False)
    return resume_path(cfg) if cfg.checkpoint_dir and Path(cfg.checkpoint_dir).is_dir() else None


def _check_resumed_data(cfg, latest) -> None:
    """A resume trains on the data its run trained on (the tokenized key; every other setting was checked before)."""
    if latest is not None:  # (checkpoint.check's comparison of the run's settings, the data's key among them)
        from shardwise.checkpoint import check_same_run
        from shardwise.checkpoint.store import read_manifest

        check_same_run(latest, read_manifest(latest), cfg)


def _named_run(cfg):
    """The run's name (checkpoint.run_id), and a resumed run's metrics file checked to be its own before it is
    appended to (train.metrics_records)."""
    from dataclasses import replace

    from shardwise.checkpoint import run_id
    from shardwise.train import metrics_records

    cfg = replace(cfg, run_id=run_id(cfg))
    if cfg.resume and cfg.metrics_file and os.path.isfile(cfg.metrics_file):
        metrics_records(cfg.metrics_file, cfg.run_id)
    return cfg


def _note_overwritten(path: str) -> None:
    """A new run writes its metrics file afresh: an earlier run's records there are said to go, never dropped without a
    word; a file that holds no records of train's is refused (a mistyped path over another file)."""
    from shardwise.console import note
    from shardwise.train import metrics_records

    try:
        earlier = metrics_records(path)
    except UsageError:
        raise UsageError(f"--metrics-file {path} is a file of something else (not shardwise train's records), which "
                         f"this run would write over — give a new path") from None
    runs = sorted({str(r["run"]) for r in earlier if r.get("run")})
    whose = f" of run {', '.join(runs)}" if runs else " of an earlier run"
    note(f"--metrics-file {path} held {len(earlier)} records{whose}: this run writes over them (give another path to "
         f"keep them)")


def _default_model(args) -> None:
    """--model not given: the --plan's model where it is a preset (a plan echoes the model's name, which for a config
    file is not a path to load again), else tiny; `args.model_defaulted` says so for the plan's model check."""
    from shardwise.specs import model_presets

    if getattr(args, "model_defaulted", None) is None:  # (run resolves it before config_from, which does it again)
        args.model_defaulted = args.model is None
    if args.model is None and (resumed := _resumed_model(args)):
        args.model = resumed
        if os.environ.get("RANK", "0") == "0":
            from shardwise.console import note

            note(f"--model {resumed}, the one its checkpoint trained (--model not given)")
    if args.model is None:
        data = _plan_file(args.plan) if args.plan else None
        job = data.get("job") if isinstance(data, dict) and isinstance(data.get("job"), dict) else {}
        planned = job.get("model") in model_presets()
        args.model = job["model"] if planned else "tiny"
        if planned and os.environ.get("RANK", "0") == "0":
            from shardwise.console import note

            note(f"--model {args.model}, the plan's (the preset of that name: give --model for a folder or "
                 f"config.json it was planned from)")


def _resumed_model(args) -> str | None:
    """--resume without --model: the --model the newest checkpoint in --checkpoint-dir was trained with (its manifest's
    model_given: a preset's name or a folder's absolute path), where there is one; None otherwise (tiny, or the plan's,
    as before; a damaged manifest is said by the resume itself)."""
    if not args.resume or not args.checkpoint_dir or args.plan:
        return None
    from shardwise.checkpoint.store import newest, read_manifest
    from shardwise.model_spec import HUB_PRESETS
    from shardwise.specs import model_presets

    try:
        latest = newest(Path(args.checkpoint_dir))
        given = (read_manifest(latest).get("model_given") or None) if latest else None
    except (UsageError, OSError):
        return None
    preset = HUB_PRESETS.get(given.lower(), given) if given else given  # a hub id reads its preset
    if given and preset not in model_presets() and not Path(given).exists():  # the folder it trained has moved
        raise UsageError(f"--resume without --model: {latest} was trained with --model {given}, which is not there "
                         f"any more — pass --model with where that model is now")
    return given


def _distinct_paths(args) -> None:
    """The files train writes are none of the files it reads (--plan, --data, --val-data, --tokenizer, --model) and lie
    inside none of the --data folders it reads whole: a metrics file over the corpus, or a trace written among the
    data, would destroy them; nor does the token cache (--data-cache or its default). In a model folder only its files
    are kept from being overwritten."""
    from shardwise.paths import distinct_outputs, folder_files

    reads = {"--plan": args.plan} | folder_files("--tokenizer", args.tokenizer) | folder_files("--model", args.model)
    reads |= {f"--data {p}": p for p in args.data or []} | {f"--val-data {p}": p for p in args.val_data or []}
    distinct_outputs({"--metrics-file": args.metrics_file, "--trace": args.trace, "--checkpoint-dir": args.checkpoint_dir},
                     reads)
    if args.data or args.val_data:  # (the built-in corpus alone uses no cache)
        from shardwise.corpus.token_file import check_cache_outside

        check_cache_outside(args.data_cache, {k: v for k, v in reads.items() if k.startswith(("--data ", "--val-data "))})


def _given(model: str) -> str:
    """--model as a resume can name it from any directory: a file or folder by its absolute path, a preset by name."""
    from pathlib import Path

    return str(Path(model).resolve()) if Path(model).exists() else model


def _note_vocab_padding(cfg) -> None:
    from shardwise.parallel.tensor_parallel import padded_vocab

    vocab, tp = cfg.spec.vocab_size, cfg.layout.tp
    if vocab % tp and os.environ.get("RANK", "0") == "0":
        from shardwise.console import note

        note(f"vocabulary {vocab} padded to {padded_vocab(vocab, tp)} rows for tp={tp} (as Megatron does); padded "
             "logits are masked, so training equals the unpadded model")
