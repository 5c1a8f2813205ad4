"""`shardwise demo`: the product in a few minutes, on any machine.

1. Plan the seed article's example — a 65B Llama on 64 A100-80GB — and explain the choice.
2. Measure this machine (`calibrate`, 4 CPU processes), plan a tiny Llama on those 4 processes.
3. Really train the planner's pick on 4 processes and print predicted vs measured step time.
"""

from __future__ import annotations

ARTICLE = dict(model="llama-65b", cluster="dgx-a100-80gb", gpus=64, global_batch=1024, seq_len=2048)
LOCAL = dict(model="tiny", global_batch=16, seq_len=64)
WORLD, STEPS = 4, 30  # the local run's processes and steps, unless told


def register(subparsers, name, help):
    p = subparsers.add_parser(name, help=help, description=help)
    p.add_argument("--world", type=int, default=None, help=f"CPU processes for the local part (default {WORLD})")
    p.add_argument("--steps", type=int, default=None, help=f"training steps of the local run (default {STEPS})")
    p.add_argument("--no-train", action="store_true", help="only plan (skip calibrating and training)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from shardwise.errors import UsageError

    given = [flag for flag, value in (("--world", args.world), ("--steps", args.steps)) if value is not None]
    if args.no_train and given:  # given at all, its default value included
        them = "it" if len(given) == 1 else "them"
        raise UsageError(f"{' and '.join(given)} set{'s' if len(given) == 1 else ''} the local run, which --no-train "
                         f"skips — drop {them}, or drop --no-train")
    args.world = WORLD if args.world is None else args.world
    args.steps = STEPS if args.steps is None else args.steps
    if args.world < 1:
        raise UsageError(f"--world must be at least 1, got {args.world}")
    if args.steps < 3:  # the demo trains a few steps to show the loss falling
        raise UsageError(f"--steps must be at least 3, got {args.steps}")
    if not args.no_train:
        from shardwise.preflight import check_cores

        check_cores(args.world)  # the local part runs --world CPU processes
    from shardwise import fork_server

    with fork_server.early(0 if args.no_train else args.world):  # the ranks' server imports torch during the article
        return _run(args)


def _run(args) -> int:
    from shardwise.console import Console

    console = Console(quiet=args.json)
    console.width = max(console.width, 120)  # the layout tables need the room, even in a narrow pipe
    out = {"article": article(console)}
    if not args.no_train:
        from shardwise.launch import JobFailed

        try:
            # under --json stdout is the JSON alone: the calibration's progress and a busy-machine note go to stderr
            aside = Console(stderr=True) if args.json else console
            out["local"] = local(console, args.world, args.steps, progress=not args.json, aside=aside)
        except JobFailed as exc:
            import sys

            print(f"shardwise: error: {exc}", file=sys.stderr)
            return 1
    if args.json:
        from shardwise.commands.common import print_json

        print_json(out)
    return 0


def _plan(job, gpus: int):
    from shardwise.errors import UsageError
    from shardwise.planner.search import nothing_fits_message, search

    result = search(job, gpus)
    if not result.ranked:
        raise UsageError(nothing_fits_message(job, gpus, result))
    return result


def _off(predicted: float, measured: float) -> str:
    """How far the predicted step is from the measured one, in words: a signed percentage alone reads either way."""
    gap = predicted / measured - 1
    return f"{abs(gap):.0%} {'longer' if gap > 0 else 'shorter'} than measured" if abs(gap) >= 0.005 else "as measured"


def article(console) -> dict:
    """Part 1: the article's question, answered with numbers."""
    from shardwise.commands.common import layout_table, print_explanation
    from shardwise.commands.plan import best_per_split
    from shardwise.planner.explain import explain
    from shardwise.planner.frameworks import DEFAULT_FRAMEWORK, default_note
    from shardwise.planner.job import make_job
    from shardwise.specs import load_cluster, load_model

    a = ARTICLE
    # the stack `shardwise plan` assumes when --framework is not given, so the demo answers as the README's plan does
    job = make_job(load_model(a["model"]), load_cluster(a["cluster"]), a["global_batch"], a["seq_len"],
                   DEFAULT_FRAMEWORK)
    console.rule(f"1. Where to split {a['model']} on {a['gpus']} x A100-80GB?")
    result = _plan(job, a["gpus"])
    top = best_per_split(result.ranked)[:5]
    console.print(layout_table(top, title=f"{a['model']}, batch {a['global_batch']} x {a['seq_len']} tokens "
                                          f"({len(result.ranked)} of {result.scored} layouts fit)"))
    console.print(f"note: {default_note()}")
    print_explanation(console, explain(job, a["gpus"], result), "Why")
    return {"best": top[0].to_dict()}


def local(console, world: int, steps: int, progress: bool = True, aside=None) -> dict:
    """Parts 2 and 3: measure this machine, plan the tiny model on it, train the pick; `aside`, the console of the
    calibration's progress and notes (default: `console`)."""
    from shardwise.specs import load_model

    spec = load_model(LOCAL["model"])
    console.rule(f"2. Measure this machine ({world} CPU processes) and plan {spec.name} on it")
    cluster = _calibrate(console, spec, world, aside or console)
    est = _pick(console, spec, cluster, world)
    console.rule(f"3. Train {spec.name} with {est.layout.describe()} on {world} processes")
    measured = _train(est.layout, spec, steps, progress)
    predicted = est.step_time
    console.print(f"step time: predicted [bold]{predicted * 1e3:.1f} ms[/], measured [bold]{measured * 1e3:.1f} ms[/] "
                  f"(median of steps 3..{steps}; the prediction {_off(predicted, measured)})")
    console.print("Check the planner on more layouts: [bold]shardwise validate --model tiny --world 2[/]")
    return {"layout": est.to_dict(), "predicted_step_time_s": predicted, "measured_step_time_s": measured}


def _calibrate(console, spec, world: int, aside):
    from rich.progress import BarColumn, Progress, TextColumn

    from shardwise.calibrate import CalibrateConfig, calibrate, rank_steps

    cfg = CalibrateConfig(model=spec, world=world, repeats=5, warmup=2, seq_len=LOCAL["seq_len"],
                          sizes=tuple(2**k for k in range(10, 23, 3))).resolved()
    with Progress(TextColumn("calibrating"), BarColumn(), TextColumn("{task.description}"),
                  console=aside, transient=True, disable=not aside.is_terminal) as bar:
        task = bar.add_task("starting ranks", total=rank_steps(cfg))
        profile = calibrate(cfg, lambda label: bar.update(task, advance=1, description=label))
    cluster = profile.to_cluster()
    console.print(f"this machine: {cluster.peak_flops / 1e9:.0f} GFLOP/s per process for {spec.name}'s matmuls, "
                  f"links {cluster.intra_node_bandwidth / 1e9:.2f} GB/s + {cluster.intra_node_latency * 1e6:.0f} µs")
    from shardwise.contention import neighbours_note

    busy = neighbours_note("the measurement", profile.other_cpu_cores)
    if busy:  # the prediction below is only as good as a quiet machine's measurement
        aside.print(f"[yellow]note: {busy} — the prediction below may be far off; run the demo on a quiet machine[/]",
                    highlight=False)
    return cluster


def _pick(console, spec, cluster, world: int):
    """The planner's best layout that the runtime can run here."""
    from shardwise.commands.common import layout_table
    from shardwise.commands.plan import best_per_split
    from shardwise.errors import UsageError
    from shardwise.launch import check
    from shardwise.train import TrainConfig
    from shardwise.validate import ValidateConfig
    from shardwise.validate import planner_job

    job = planner_job(ValidateConfig(model=spec, cluster=cluster, world=world, global_batch=LOCAL["global_batch"],
                                     seq_len=LOCAL["seq_len"]))
    result = _plan(job, world)
    runnable = []
    for est in result.ranked:
        try:
            check(TrainConfig(spec, est.layout, steps=1, global_batch=LOCAL["global_batch"], seq_len=LOCAL["seq_len"]))
        except UsageError:
            continue
        runnable.append(est)
    if not runnable:
        raise UsageError(f"no layout of {spec.name} on {world} processes can run here — try --world 2")
    console.print(layout_table(best_per_split(runnable)[:5], title=f"{spec.name} on {world} CPU processes, "
                                                                  f"batch {LOCAL['global_batch']} x {LOCAL['seq_len']}"))
    return runnable[0]


def _train(layout, spec, steps: int, progress: bool) -> float:
    """Median step time (seconds) of a real run, skipping the first two steps (warm-up)."""
    import json
    import tempfile
    from pathlib import Path
    from statistics import median

    from shardwise.launch import launch, resolve_backend
    from shardwise.train import TrainConfig

    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cfg = TrainConfig(spec, layout, steps=steps, global_batch=LOCAL["global_batch"], seq_len=LOCAL["seq_len"],
                          backend=resolve_backend("gloo"), metrics_file=str(metrics), progress=progress)
        launch(cfg)
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return median(r["step_time_s"] for r in records[2:])
