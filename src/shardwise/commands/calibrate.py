"""`shardwise calibrate`: measure this machine and write a cluster profile for `plan`/`estimate --cluster`."""

from __future__ import annotations

import shlex
from pathlib import Path

from shardwise.commands.common import print_json


# What measuring this machine reads, and its defaults: none of it applies to --nccl-tests' logs.
MEASURE_DEFAULTS = {"world": 2, "backend": "gloo", "sizes": None, "micro_batch": 1, "seq_len": 64, "repeats": 10,
                    "warmup": 3, "copy_size": None, "timeout": 120.0, "model": "tiny"}


def register(subparsers, name, help):
    p = subparsers.add_parser(name, help=help, description=help)
    # The measuring flags default to None, filled from MEASURE_DEFAULTS when this machine is measured: --nccl-tests
    # refuses any of them given, its default value included.
    d = MEASURE_DEFAULTS
    p.add_argument("--world", type=int, default=None,
                   help=f"ranks to measure with (spawned here; under torchrun its world; default {d['world']})")
    p.add_argument("--backend", default=None, help=f"gloo (CPU, fp32) or nccl (GPU, bf16) (default {d['backend']})")
    p.add_argument("--sizes", nargs="+", default=None, metavar="SIZE",
                   help="collective message sizes, e.g. 1K 64K 1M 16M (default 1 KiB..16 MiB on CPU, ..1 GiB on GPU)")
    p.add_argument("--model", default=None,
                   help=f"model preset (e.g. llama3-8b, tiny) or path to a Hugging Face config.json (default {d['model']})")
    p.add_argument("--micro-batch", type=int, default=None,
                   help=f"sequences per micro-batch (sets the GEMM shapes; default {d['micro_batch']})")
    p.add_argument("--seq-len", type=int, default=None,
                   help=f"tokens per sequence (sets the GEMM shapes; default {d['seq_len']}, as train)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"timed repeats per measurement (the median is kept; default {d['repeats']})")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"untimed repeats before each measurement (default {d['warmup']})")
    p.add_argument("--copy-size", default=None, help="bytes of the memory-bandwidth copy (default 64M on CPU, 2G on GPU)")
    p.add_argument("--timeout", type=float, default=None,
                   help=f"seconds any collective may take before the run fails (default {d['timeout']:g})")
    p.add_argument("--nccl-tests", nargs="+", default=None, metavar="LOG",
                   help="instead of measuring here: fit --cluster's network to these nccl-tests logs "
                        "(all_reduce_perf, all_gather_perf, ... output; [KIND[@NODESxGPUS]=]PATH where the log "
                        "does not say) and write that cluster file; no ranks start")
    p.add_argument("--cluster", default=None,
                   help="with --nccl-tests: the cluster the logs ran on (a preset or a cluster .toml), whose "
                        "other numbers the written file keeps")
    p.add_argument("--out", default=None,
                   help="where to write the cluster profile (TOML; default profile.toml, with --nccl-tests cluster.toml)")
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")
    p.set_defaults(func=run)


def _config(args):
    from shardwise.calibrate import CalibrateConfig, parse_size
    from shardwise.model_spec import config_path
    from shardwise.specs import load_model

    sizes = tuple(parse_size(s, "--sizes") for arg in (args.sizes or []) for s in arg.split(",") if s)
    return CalibrateConfig(model=load_model(args.model), model_source=config_path(args.model), world=args.world,
                           backend=args.backend, sizes=sizes, repeats=args.repeats,
                           warmup=args.warmup, micro_batch=args.micro_batch,
                           seq_len=args.seq_len, copy_bytes=parse_size(args.copy_size, "--copy-size") if args.copy_size else 0,
                           timeout_s=args.timeout)


def run(args) -> int:
    if args.nccl_tests is not None or args.cluster is not None:
        return _from_nccl_tests(args)
    for key, default in MEASURE_DEFAULTS.items():  # what this machine is measured with, where not given
        if getattr(args, key) is None:
            setattr(args, key, default)
    from shardwise import fork_server

    with fork_server.early(args.world):  # the ranks' server imports torch while this process does
        return _measure_here(args)


def _measure_here(args) -> int:
    import sys

    args.out = args.out or "profile.toml"
    from shardwise.calibrate import calibrate, check_config, rank_steps
    from shardwise.launch import JobFailed, under_torchrun

    cfg = _config(args)
    check_config(cfg, _cuda_devices() if args.backend == "nccl" else 0)  # before torch starts any rank
    from shardwise.commands.common import prepare_output

    prepare_output(args.out, "--out", "profile.toml")

    from shardwise.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True, keep_going=True)  # progress only: the work goes on if its reader goes
    total = rank_steps(cfg.resolved())
    columns = (TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
               TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True,
                  disable=not err.is_terminal or (under_torchrun() and _rank() != 0)) as bar:
        task = bar.add_task("starting ranks", total=total)
        try:
            profile = calibrate(cfg, lambda label: bar.update(task, advance=1, description=label))
        except JobFailed as exc:
            print(f"shardwise: error: {exc}", file=sys.stderr)
            return 1
    if profile is None:  # another torchrun rank: rank 0 reports
        return 0
    Path(args.out).write_text(profile.to_toml())
    if args.json:
        print_json(profile.to_dict())
        for warning in warnings(profile):  # stdout stays one JSON object
            print(f"shardwise: warning: {warning}", file=sys.stderr)
        return 0
    _print(Console(), profile, args.out, args.model)
    return 0


def _from_nccl_tests(args) -> int:
    """`--nccl-tests`: the logs read, the network fitted, the cluster file written, the fit shown."""
    from shardwise.calibrate.nccl_tests import check_gpus, cluster_file, fit, read_log
    from shardwise.commands.common import prepare_output
    from shardwise.errors import UsageError
    from shardwise.specs import cluster_from_toml, cluster_toml

    if not args.nccl_tests or not args.cluster:  # first: without both, the measuring flags may be what was meant
        raise UsageError("--nccl-tests and --cluster go together: the logs, and the cluster they ran on "
                         "(e.g. --nccl-tests all_reduce_perf.log --cluster dgx-h100-80gb)")
    measuring = [f"--{k.replace('_', '-')}" for k in MEASURE_DEFAULTS if getattr(args, k, None) is not None]
    if measuring:
        one = len(measuring) == 1
        raise UsageError(f"{', '.join(measuring)} set{'s' if one else ''} how this machine is measured, and "
                         f"--nccl-tests reads logs instead — drop {'it' if one else 'them'}, or calibrate without "
                         f"--nccl-tests")
    from shardwise.calibrate.nccl_tests import parse_arg
    from shardwise.paths import distinct_outputs, input_file

    args.out = args.out or "cluster.toml"
    distinct_outputs({"--out": args.out}, {"--cluster": args.cluster,
                                           **{f"--nccl-tests {arg}": parse_arg(arg)[0] for arg in args.nccl_tests}})
    for arg in args.nccl_tests:  # a regular file: a named pipe would block the read below until something writes it
        input_file(parse_arg(arg)[0], "--nccl-tests", "give an nccl-tests log file (all_reduce_perf ... > log)")
    data, name, source = cluster_toml(args.cluster)
    base = cluster_from_toml(data, name=name, source=source)
    paths = [Path(parse_arg(arg)[0]).resolve() for arg in args.nccl_tests]
    for i, path in enumerate(paths):  # one log given twice would count twice in the fit
        if path in paths[:i]:
            raise UsageError(f"--nccl-tests {args.nccl_tests[i]}: the same file as {args.nccl_tests[paths.index(path)]} "
                             f"— give each log once")
    logs = [read_log(arg) for arg in args.nccl_tests]
    check_gpus(base, logs, args.cluster)
    result = fit(base, logs)
    prepare_output(args.out, "--out", "cluster.toml")
    command = "shardwise calibrate " + " ".join(shlex.quote(a) for a in
                                                ("--nccl-tests", *args.nccl_tests, "--cluster", args.cluster))
    Path(args.out).write_text(cluster_file(result, data.get("cluster", data), command))
    if args.json:
        print_json({"out": args.out, "cluster": args.cluster, "fitted": result.fitted, "at_bound": result.at_bound(),
                    "logs": result.rows()})
        return 0
    _print_fit(result, args.out)
    return 0


def _print_fit(result, out: str) -> None:
    from shardwise.console import Console
    from rich.table import Table

    from shardwise.calibrate.nccl_tests import MAX_EXTRA_US

    table = Table(title="the planner's collective times against the logs: median |error| over sizes >= 64 KiB, "
                        "before (the base's datasheet network) and after the fit")
    for column in ("log", "kind", "ranks / nodes", "busbw GB/s", "before", "after", ">= 64 MiB", "max"):
        text = column in ("log", "kind")  # names fold onto a second line in a narrow terminal rather than lose their end
        table.add_column(column, justify="left" if text else "right", overflow="fold" if text else "ellipsis")
    for r in result.rows():
        big = r["median_abs_error_64mib_up"]
        table.add_row(Path(r["log"]).name, r["kind"], f"{r['ranks']}/{r['nodes']}", f"{r['largest_busbw_gbs']:,.0f}",
                      f"{100 * r['median_abs_error_before']:.1f} %", f"{100 * r['median_abs_error']:.1f} %",
                      "—" if big is None else f"{100 * big:.1f} %", f"{100 * r['max_abs_error']:.1f} %")
    console = Console()
    console.print(table)
    for source in result.left_out:
        console.print(f"[yellow]{source}: more bus bandwidth than a ring can move (its NICs' line rate across nodes, "
                      f"NVLink's on one node) — an all-reduce reduced inside the switches (NVLink SHARP, SHARP) or a "
                      f"tree over two nodes, which the model does not time: reported, not fitted; the planner's "
                      f"all-reduces there are conservative[/]", highlight=False)
    fitted = ", ".join(f"{k} = {v:g}" for k, v in result.fitted.items())
    before = ", ".join(f"{k} = {v:g}" for k, v in result.before().items())
    console.print(f"fitted: {fitted} (before: {before})", highlight=False)
    if result.at_bound():
        console.print(f"[yellow]{', '.join(result.at_bound())} ended on the bound of its search (line rate: the "
                      f"base's NICs; 1 % of them; {MAX_EXTRA_US:g} us per crossing): the logs ask for more than the model allows "
                      f"there — check the --cluster they ran on and the logs themselves[/]", highlight=False)
    console.print(f"wrote {out} — use it: shardwise plan --model ... --cluster {shlex.quote(out)} --gpus ... "
                  f"--global-batch ... --seq-len ...", highlight=False)


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count()


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


def _print(console, profile, out: str, model: str | None = None) -> None:
    """The profile as a table, its warnings, and the plan command that uses it (`model` as the user named it)."""
    from rich.table import Table

    from shardwise.calibrate import COLLECTIVES, human

    c = profile.cluster_table()
    console.print(f"[b]{c['name']}[/] ({profile.model} at {profile.tokens} tokens per micro-batch, {profile.dtype}), "
                  f"per rank: GEMMs {profile.matmul_tflops * 1e3:,.1f} GFLOP/s; model layers "
                  f"{profile.model_tflops * 1e3:,.1f} GFLOP/s + {profile.layer_overhead_s * 1e3:,.2f} ms per layer "
                  f"and micro-batch; memory copy {profile.copy_gbs:,.1f} GB/s; link "
                  f"{c['intra_node_bandwidth_gbs']:,.2f} GB/s + {c['intra_node_latency_us']:,.0f} us", highlight=False)
    if profile.host_floor_points:
        console.print(f"host floor (the GPU waits on the host below it): {profile.host_layer_s * 1e3:,.2f} ms per layer "
                      f"and micro-batch, {profile.host_head_s * 1e3:,.2f} ms for the head and loss; a pipeline stage "
                      f"costs the larger of its host's and its GPU's time", highlight=False)
    if profile.world > 1:
        table = Table(title=f"collective time (ms) at world {profile.world}, median of {profile.repeats}")
        table.add_column("bytes", justify="right")
        for kind in COLLECTIVES:
            table.add_column(kind, justify="right")
        tables = profile.monotone_tables()  # what the planner reads
        for i, (nbytes, _) in enumerate(tables["all_reduce"]):
            table.add_row(human(nbytes), *(f"{tables[k][i][1] * 1e3:.3f}" for k in COLLECTIVES))
        console.print(table)
    for warning in warnings(profile):
        console.print(f"[yellow]{warning}[/]", highlight=False)
    console.print(f"wrote {out} — use it: {plan_hint(model or profile.model, out, profile.world)}", highlight=False)


def warnings(profile) -> list[str]:
    """What makes the profile's numbers doubtful (shown under the table; on stderr with --json)."""
    from shardwise.contention import SPEED_TOLERANCE, neighbours_note

    out = []
    note = neighbours_note("the calibration", profile.other_cpu_cores)
    if note:
        out.append(f"{note} — calibrate on a quiet machine: the planner takes these times as the machine's own")
    drift = profile.reference_drift()
    if drift > 1 + SPEED_TOLERANCE:
        out.append(f"the machine's speed moved while it was measured: the model's smallest micro-batch took "
                   f"{drift:.2f}x as long in its slowest round as in its fastest "
                   f"({', '.join(f'{1e3 * x:.2f}' for x in profile.reference_rounds_s)} ms at the start, middle and "
                   f"end) — calibrate again when the machine is steady")
    noisy = profile.noisy()
    if noisy:
        out.append(f"noisy (interquartile range > 50 % of the median): {', '.join(noisy)} — rerun on a quiet machine "
                   f"or with more --repeats")
    return out


def plan_hint(model: str, out, world: int) -> str:
    """The plan command that uses a profile just written: the model as the user named it (a config path, not the
    name its profile records, which may be a preset's)."""
    return (f"shardwise plan --model {shlex.quote(str(model))} --cluster {shlex.quote(str(out))} --gpus {world} "
            f"--global-batch ... --seq-len ...")
