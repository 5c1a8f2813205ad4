"""`shardwise validate`: train a sweep of real layouts briefly; the planner's predictions against the measurements."""

from __future__ import annotations

import sys

from shardwise.commands.common import add_model_arg, print_json
from shardwise.errors import UsageError


PICTURES = (".png", ".svg", ".pdf")  # what --plot writes (matplotlib picks the format by the suffix)


def register(subparsers, name, help):
    p = subparsers.add_parser(name, help=help, description=help,
                              epilog="example: shardwise calibrate --world 2 --out profile.toml && "
                                     "shardwise validate --model tiny --world 2 --cluster profile.toml --plot accuracy.png")
    add_model_arg(p, default="tiny")
    p.add_argument("--world", type=int, default=2, help="ranks (processes); every layout uses all of them (default %(default)s)")
    p.add_argument("--layouts", nargs="+", default=None, metavar="LAYOUT",
                   help="layouts to run, e.g. dp2 tp2:sp pp2:gpipe pp2:interleaved-1f1b:v2 dp2:zero3:full dp2:mb2 "
                        "dp2:ep2 tp2:etp2 (default: every split with its ZeRO, recompute, schedule and micro-batch "
                        "variants, and a MoE model's expert splits)")
    p.add_argument("--cluster", default=None,
                   help="profile from `shardwise calibrate` at this --world (default: calibrate this machine first); "
                        "a datasheet cluster (dgx-h100-80gb) predicts its own GPUs, so only the ranking compares")
    p.add_argument("--global-batch", type=int, default=8, help="sequences per step, the same for every layout (default %(default)s)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default %(default)s)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per layout and round (default %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="rounds; each runs every layout once, in a new random order (default %(default)s)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per layout before the first round (default %(default)s)")
    p.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (GPU) (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, the data and the round order (default %(default)s)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any collective may wait before the run fails (default %(default)s)")
    p.add_argument("--plot", default=None, metavar="PNG", help="write the predicted-vs-measured picture here")
    p.add_argument("--json", action="store_true", help="print one JSON object (layouts and summary)")
    p.set_defaults(func=run)


def _config(args, cluster):
    from shardwise.specs import load_model
    from shardwise.validate import ValidateConfig, check_layout

    for flag, value in (("--world", args.world), ("--steps", args.steps), ("--repeats", args.repeats),
                        ("--global-batch", args.global_batch), ("--seq-len", args.seq_len)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be at least 0, got {args.warmup}")
    from shardwise.calibrate.config import MAX_REPEATS

    for flag, value in (("--steps", args.steps), ("--repeats", args.repeats), ("--warmup", args.warmup)):
        if value > MAX_REPEATS:
            raise UsageError(f"{flag} {value:,} is more than a comparison needs (at most {MAX_REPEATS:,})")
    if not 0 <= args.seed < 2**63:
        raise UsageError(f"--seed must be between 0 and 2^63 - 1, got {args.seed}")
    model = load_model(args.model)
    if any(not t.strip(": ") for t in args.layouts or []):
        raise UsageError("--layouts: an empty layout — give each like dp2, tp2:sp or pp2:gpipe (or leave --layouts out "
                         "for every split)")
    layouts = tuple(_settled(t, args.world) for t in args.layouts or [])
    for i, lay in enumerate(layouts):
        if lay in layouts[:i]:
            first = args.layouts[layouts.index(lay)]
            raise UsageError(f"--layouts {first} and {args.layouts[i]} are the same layout — give each layout once")
    for lay in layouts:
        check_layout(lay, model, args.world, args.global_batch, args.seq_len, args.backend)
    return ValidateConfig(model=model, cluster=cluster, world=args.world, layouts=layouts,
                          global_batch=args.global_batch, seq_len=args.seq_len, steps=args.steps,
                          repeats=args.repeats, warmup=args.warmup, backend=args.backend, seed=args.seed,
                          timeout_s=args.timeout)


def _check_sweep_memory(cfg, given: bool) -> None:
    """Every layout of the sweep stays built while the others train (validate.measure): all their states at once.
    `given`: the user named the layouts (else the default sweep's, which the fix names)."""
    from shardwise.preflight import check_sweep_memory
    from shardwise.train import TrainConfig
    from shardwise.validate.config import describe

    fewer = ("give fewer --layouts (each alone fits)" if given else
             f"name a few of the default sweep's layouts with --layouts ({', '.join(describe(l) for l in cfg.layouts)}; "
             f"each alone fits)")
    check_sweep_memory([TrainConfig(spec=cfg.model, layout=lay, steps=1, global_batch=cfg.global_batch,
                                    seq_len=cfg.seq_len, memory_check=False, backend=cfg.backend)
                        for lay in cfg.layouts],
                       fix=f"{fewer}, or a smaller --model, --global-batch or --seq-len")


def _settled(text: str, world: int):
    """A --layouts entry as it runs, as train runs the same flags: a knob that changes nothing there set back and said
    (so 'pp1:gpipe' and 'pp1' are one layout), interleaving without a depth at 2 chunks a rank, with a depth of 1
    refused."""
    from shardwise.commands.common import settle_idle_knobs
    from shardwise.specs import Layout
    from shardwise.validate.config import layout_fields

    fields = layout_fields(text, world)
    try:
        notes = settle_idle_knobs(fields, vpp_named="vpp" in fields)
    except UsageError as exc:
        raise UsageError(f"layout '{text}': {exc}") from None
    from shardwise.console import note

    for said in notes:
        note(f"layout '{text}': {said}")
    return Layout(**fields)


def _progress(console, what: str, total: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                   TimeElapsedColumn(), console=console, transient=True,
                   disable=not console.is_terminal)  # a pipe or a log: nothing to redraw
    return bar, bar.add_task("starting ranks", total=total)


def run(args) -> int:
    from shardwise import fork_server

    with fork_server.early(args.world):  # the ranks' server imports torch while the sweep is planned
        return _run(args)


def _run(args) -> int:
    from shardwise.console import Console

    from shardwise.contention import sweep_warnings

    from shardwise.calibrate import CalibrateConfig, calibrate, check_config, rank_steps
    from shardwise.launch import JobFailed
    from shardwise.model_spec import config_path
    from shardwise.specs import load_cluster, load_model
    from shardwise.validate import default_layouts, plot, validate

    cuda = _cuda_devices() if args.backend == "nccl" else 0
    cal = CalibrateConfig(model=load_model(args.model), model_source=config_path(args.model), world=args.world,
                          backend=args.backend, seq_len=args.seq_len, timeout_s=args.timeout)
    check_config(cal, cuda)  # world, backend and GPUs, before anything starts
    from shardwise.commands.common import prepare_output

    if args.plot is not None and not str(args.plot).lower().endswith(PICTURES):
        raise UsageError(f"--plot {args.plot}: the picture's name must end in {', '.join(PICTURES)} — e.g. accuracy.png")
    prepare_output(args.plot, "--plot", "accuracy.png")
    from shardwise.console import held_notes

    with held_notes():  # a layout's notes, once every layout has passed its checks: a refusal is one line
        cfg = _config(args, load_cluster(args.cluster) if args.cluster else None)
        if not cfg.layouts:
            from dataclasses import replace

            cfg = replace(cfg, layouts=tuple(default_layouts(cfg.model, cfg.world, cfg.global_batch, cfg.seq_len, cfg.backend)))
            if not cfg.layouts:  # say why the simplest one cannot run
                from shardwise.specs import Layout
                from shardwise.validate import check_layout

                check_layout(Layout(dp=args.world), cfg.model, args.world, args.global_batch, args.seq_len, cfg.backend)
                raise UsageError(f"no layout of {cfg.model.name} runs on {args.world} ranks with global batch "
                                 f"{args.global_batch} x {args.seq_len} tokens — give --layouts")
        measured = cfg.cluster.measured if cfg.cluster is not None else None
        calibrated_world = int(measured.get("world_size", args.world)) if measured else args.world
        if calibrated_world != args.world:
            raise UsageError(f"--cluster {args.cluster} was calibrated on {calibrated_world} ranks and this sweep runs "
                             f"{args.world}: its collectives and the ranks' sharing of the cores were measured at "
                             f"{calibrated_world} — calibrate at --world {args.world}, or leave --cluster out")
        _check_sweep_memory(cfg, given=bool(args.layouts))
        from shardwise.hf.load import has_weights

        if has_weights(args.model):  # a truncated or damaged file would go unnoticed too: say what is measured
            from shardwise.console import note

            note(f"the layouts run on seeded weights: {args.model}'s safetensors are not read (a step's time and memory "
                 f"do not depend on the weights' values; `train --model {args.model}` loads them)")
    err = Console(stderr=True, keep_going=True)  # progress only: the work goes on if its reader goes
    try:
        if cfg.cluster is None:
            bar, task = _progress(err, "calibrating", rank_steps(cal))
            with bar:
                profile = calibrate(cal, lambda label: bar.update(task, advance=1, description=label))
            from dataclasses import replace

            cfg = replace(cfg, cluster=profile.to_cluster())
        bar, task = _progress(err, "validating", len(cfg.layouts) * (cfg.repeats + 2))
        with bar:
            result = validate(cfg, lambda label: bar.update(task, advance=1, description=label))
    except JobFailed as exc:
        print(f"shardwise: error: {exc}", file=sys.stderr)
        return 1
    if result is None:  # another torchrun rank
        return 0
    if args.plot:
        plot(result, args.plot)
    if args.json:  # stdout stays the JSON; what made the figures noisy goes to stderr, as the table says it
        for warning in sweep_warnings(result):
            print(f"shardwise: warning: {warning}", file=sys.stderr)
        print_json(result)
        return 0
    _print(Console(), result, args.plot)
    return 0


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count()


# Narrow tables (a pipe, an 80-column terminal): the layout names' long words shortened, explained under the table.
SHORT_NAMES = {"interleaved-1f1b": "i-1f1b", "selective recompute": "sel-rc", "full recompute": "full-rc",
               "allgather": "ag"}


def _print(console, result: dict, picture: str | None) -> None:
    from rich import box
    from rich.table import Table

    from shardwise.commands.common import WIDE
    from shardwise.console import fit_table
    from shardwise.units import seconds
    from shardwise.validate.stats import rank_text

    narrow = console.width < WIDE
    title = (f"{result['model']} on {result['world']} ranks ({result['backend']}, {result['cluster']}): "
             f"predicted vs measured, global batch {result['global_batch']} x {result['seq_len']} tokens")
    if narrow:
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
                      caption="time and memory: predicted, measured, error; spread: of the measured steps; "
                              + "; ".join(f"{v}: {k}" for k, v in SHORT_NAMES.items()))
        headers = ("layout", "pred", "meas", "err", "spread", "pred MiB", "meas MiB", "err")
    else:
        table = Table(title=title)
        headers = ("layout", "predicted", "measured", "error", "spread", "pred MiB", "meas MiB", "mem error")
    for col in headers:
        table.add_column(col, justify="left" if col == "layout" else "right", no_wrap=col != "layout",
                         overflow="fold")
    mib = 2**20
    for x in sorted(result["layouts"], key=lambda x: x["measured_step_time_s"]):
        p, m = x["predicted_step_time_s"], x["measured_step_time_s"]
        pm, mm = x["predicted_memory_bytes"], x["measured_memory_bytes"]
        name = x["name"]
        for long, short in SHORT_NAMES.items() if narrow else ():
            name = name.replace(long, short)
        table.add_row(name, seconds(p), seconds(m), f"{(p - m) / m:+.0%}",
                      ("[yellow]" if x["noisy"] else "") + f"{x['step_time_spread']:.0%}", f"{pm / mib:.2f}",
                      f"{mm / mib:.2f}", f"{round((pm - mm) / mm, 3) + 0.0:+.1%}")  # + 0.0: no -0.0 %
    if narrow:  # the layout folds, no figure does; where the figures alone are too wide, the least telling go
        gone = fit_table(table, console.width, text=(0,), drop=(4, 5, 6))
        if gone:
            table.caption += f"; left out to fit {console.width} columns: {', '.join(gone)} (--json has every field)"
    console.print(table)
    s = result["summary"]
    console.print(f"step time: median |error| {s['median_abs_error']:.1%}, p90 {s['p90_abs_error']:.1%}; ranking: "
                  f"Spearman {rank_text(s['spearman'])}, Kendall tau {rank_text(s['kendall_tau'])}; planner's pick is "
                  f"{s['top1_regret']:.1%} slower than the measured best, which is "
                  f"{'' if s['best_in_top3'] else 'not '}in its top 3. Memory: median |error| "
                  f"{s['memory_median_abs_error']:.1%}, p90 {s['memory_p90_abs_error']:.1%}.", highlight=False)
    m = result.get("machine", {})
    now = s.get("drift_corrected")
    if now:
        from shardwise.validate import speed_ratios_of

        r = speed_ratios_of(m)
        console.print(f"at the machine's speed during the sweep (the calibration's own workloads timed again beside "
                      f"it: compute {r['compute']:.2f}x, collectives {r['calls']:.2f}x, send/recv {r['p2p']:.2f}x, "
                      f"pipeline exchange {r['exchange']:.2f}x, FSDP {r['fsdp']:.2f}x"
                      + (f", the GPU's host {r['host']:.2f}x" if m.get("host_speed_ratio") else "")
                      + f" the calibration's time): median |error| {now['median_abs_error']:.1%}, "
                      f"p90 {now['p90_abs_error']:.1%}, Kendall tau {rank_text(now['kendall_tau'])}, the pick "
                      f"{now['top1_regret']:.1%} slower than the best.", highlight=False)
    from shardwise.contention import sweep_warnings

    for warning in sweep_warnings(result):
        console.print(f"[yellow]{warning}[/]", highlight=False)
    if picture:
        console.print(f"wrote {picture}")
