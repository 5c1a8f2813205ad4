"""`shardwise plan`: rank every dp x tp x pp x cp layout and say why the winner wins."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from shardwise.paths import output_path

from shardwise.commands.common import (add_cluster_args, add_job_args, add_model_arg, add_search_args,
                                       add_software_args, job_fields, job_from_args, note_fields, print_json,
                                       space_from_args, winner_note)


def add_plan_args(p) -> None:
    """What a plan is computed from: model, cluster, job, software, search space (plan, explain, report)."""
    add_model_arg(p)
    add_cluster_args(p)
    add_job_args(p)
    add_software_args(p)
    add_search_args(p)


def register(subparsers, name, help):
    p = subparsers.add_parser(name, help=help, description=help)
    add_plan_args(p)
    p.add_argument("--top", type=int, default=10, help="how many layouts to show (default 10)")
    p.add_argument("--json", action="store_true",
                   help='print {"best": {...}, "candidates": [...], "scored": variants checked, "fit": those that fit, '
                        '"job": the inputs as read, and notes such as "framework_note" where one applies}')
    p.add_argument("--explain", action="store_true", help="also explain the decision in plain words")
    p.add_argument("--all-variants", action="store_true",
                   help="list every scored variant that fits (micro-batch, vpp, schedule, ZeRO, recompute) instead of "
                        "the best one of each dp x tp x pp x cp split; a heavier ZeRO stage or recompute policy is not "
                        "scored where a lighter one fits the same layout, as it is never faster")
    from shardwise.emit import TARGETS

    g = p.add_argument_group("outputs")
    g.add_argument("--emit", choices=TARGETS, default=None,
                   help="write a layout as a launch configuration for this stack: Megatron-LM arguments (bash), "
                        "torchtitan TOML or DeepSpeed JSON; the table then holds only layouts that stack can run, "
                        "scored with its framework profile (with --framework naming another stack: ranked as that "
                        "one runs it, keeping only the layouts the target's own profile holds in memory)")
    g.add_argument("--out", type=output_path("launch-file"), default=None, metavar="PATH", help="where --emit writes")
    g.add_argument("--rank", type=int, default=None, metavar="N",
                   help="which row of the table --emit writes (default 1, the winner)")
    g.add_argument("--html", type=Path, default=None, metavar="PATH",
                   help="also write the report page: one self-contained HTML file (as `shardwise report`)")
    p.set_defaults(func=run)


def plan(args):
    """(job, search result) under the named framework, or the default's (commands.common.under_framework), or
    UsageError when nothing fits."""
    from shardwise.commands.common import under_framework

    return under_framework(args, _plan)


def _plan(args):
    from shardwise.errors import UsageError
    from shardwise.planner.search import nothing_fits_message, schedules_refusal, search

    if getattr(args, "top", 1) < 1:  # plan and explain show --top rows; report shows them all
        raise UsageError(f"--top must be at least 1, got {args.top}")
    job = job_from_args(args)
    space = replace(space_from_args(args), emit=getattr(args, "emit", None) or "")
    if refusal := schedules_refusal(job, space):
        raise UsageError(refusal)
    from shardwise.console import SearchProgress

    with SearchProgress() as progress:
        result = search(job, args.gpus, space, progress=progress)
    if not result.ranked:
        raise UsageError(nothing_fits_message(job, args.gpus, result, space))
    args.winner_note = winner_note(args, job, result.ranked[0].layout)
    return job, result


def _split_words(job) -> str:
    return "dp x tp x pp x cp" + (" x ep" if job.model.is_moe else "")


def best_per_split(ranked):
    """The fastest layout of each dp x tp x pp x cp (x ep) split, in rank order."""
    seen, out = set(), []
    for e in ranked:
        if e.layout.split not in seen:
            seen.add(e.layout.split)
            out.append(e)
    return out


def check_outputs(args) -> None:
    """--emit/--out/--rank/--html make sense together and can be written: checked before the search."""
    from shardwise.commands.common import check_html_name, prepare_output
    from shardwise.errors import UsageError

    if args.emit and args.out is None:
        example = {"megatron": "megatron.sh", "torchtitan": "job.toml", "deepspeed": "ds.json"}.get(args.emit, "out")
        raise UsageError(f"--emit {args.emit} needs --out PATH (the file to write) — add e.g. --out {example}")
    if args.out is not None and not args.emit:
        raise UsageError("--out is where --emit writes — add --emit megatron|torchtitan|deepspeed "
                         "(the report page goes to --html PATH)")
    if args.rank is not None and not args.emit:
        raise UsageError("--rank picks the layout --emit writes — add --emit megatron|torchtitan|deepspeed")
    if args.rank is not None and args.rank < 1:
        raise UsageError(f"--rank must be at least 1 (the winner), got {args.rank}")
    if args.emit and getattr(args, "framework", None) is None and hasattr(args, "framework"):
        from shardwise.emit import FRAMEWORK

        args.framework = FRAMEWORK[args.emit]  # score with the target's own framework profile
    if args.out is not None and args.html is not None and args.out.resolve() == args.html.resolve():
        raise UsageError(f"--out and --html both name {args.out}: the report page would overwrite the {args.emit} "
                         f"file — give them different paths")
    from shardwise.paths import distinct_outputs, folder_files

    reads = folder_files("--model", args.model) | {"--cluster": args.cluster}
    distinct_outputs({"--out": args.out, "--html": args.html}, reads)  # never over the config it plans from
    check_html_name(args.html, "--html")  # (before its folder is made: prepare_output below)
    from shardwise.emit import OUT_EXAMPLE

    prepare_output(args.out, "--out", OUT_EXAMPLE.get(args.emit, "out"))
    prepare_output(args.html, "--html", "report.html")


def emit(args, job, rows) -> dict:
    """Write row --rank of the table for --emit; what was written, for the report and --json."""
    from shardwise.emit import TITLE, Target, emitter, render
    from shardwise.errors import UsageError

    rank = args.rank or 1
    if rank > len(rows):
        raise UsageError(f"--rank {rank}: the table has {len(rows)} layouts {TITLE[args.emit]} can run — pick 1 to {len(rows)}")
    target = Target(job=job, estimate=rows[rank - 1], gpus=args.gpus, rank=rank)
    try:
        args.out.write_text(render(args.emit, target))
    except OSError as exc:  # a full disk, /dev/full: checked writable, yet the write failed
        raise UsageError(f"--out {args.out}: cannot write it ({exc.strerror or exc}) — pick another path") from None
    return {"target": args.emit, "title": TITLE[args.emit], "path": str(args.out), "rank": rank,
            "framework": target.framework, "launch": emitter(args.emit).launch(target, args.out),
            "layout": target.estimate.to_dict()}


def write_html(path, job, gpus, result, emitted=None) -> dict:
    """The report page for a plan; its path and size."""
    from shardwise.report import page, plan_page, write

    html = page(plan=plan_page(job, gpus, result, emitted=emitted))
    write(path, html)
    return {"path": str(path), "bytes": len(html.encode())}


def _fitting_under_target(args, job, ranked: list) -> list:
    """A plan ranked for another stack than the one --emit writes for (--framework megatron-core --emit torchtitan):
    only the layouts the target's own release can run and hold in memory, as its profile prices them — the file runs
    under that stack, whose memory may differ (torchtitan's eager layers keep more than megatron-core's fused ones)."""
    import copy

    from shardwise.emit import FRAMEWORK, TITLE
    from shardwise.errors import UsageError
    from shardwise.planner.estimate import estimate
    from shardwise.units import GIB
    from shardwise.planner.frameworks import get

    own = FRAMEWORK[args.emit]
    if job.framework == own or not ranked:
        return ranked
    target = copy.copy(args)  # the same flags under the target's stack (its defaults where a flag was not given)
    target.framework = own
    theirs, stack = job_from_args(target), get(own)
    kept = [e for e in ranked if stack.refusal(e.layout, job.model.num_layers, e.num_microbatches) is None
            and estimate(theirs, e.layout).fits]
    if not kept:
        first = estimate(theirs, ranked[0].layout)
        named = TITLE[args.emit] + (f" ({own})" if own != TITLE[args.emit] else "")
        raise UsageError(f"no layout ranked as {job.framework} runs it fits under {named}: the fastest, "
                         f"{ranked[0].layout.describe()}, needs {first.memory_per_gpu / GIB:.1f} of {first.gpu_memory_bytes / GIB:.1f} "
                         f"GiB per GPU there — drop --framework to rank as {TITLE[args.emit]} runs it")
    return kept


def run(args) -> int:
    outputs = hasattr(args, "emit")
    if outputs:
        check_outputs(args)
    job, result = plan(args)
    if outputs and args.emit:
        from dataclasses import replace

        from shardwise.emit import expressible

        result = replace(result, ranked=_fitting_under_target(args, job, expressible(args.emit, job, result.ranked, args.gpus)))
    rows = result.ranked if args.all_variants else best_per_split(result.ranked)
    top = rows[: args.top]
    emitted = emit(args, job, rows) if outputs and args.emit else None
    html = write_html(args.html, job, args.gpus, result, emitted) if outputs and args.html else None
    if args.json:
        out = {"best": top[0].to_dict(), "candidates": [e.to_dict() for e in top], "scored": result.scored,
               "fit": len(result.ranked)} | job_fields(args, job)
        if args.explain:
            from shardwise.planner.explain import explain
            out["explanation"] = explain(job, args.gpus, result)
        if emitted:
            out["emitted"] = emitted
        if html:
            out["html"] = html
        if result.thinned:
            out["thinned"] = result.thinned
        print_json(out | note_fields(args))  # --framework or --compile not given: which stack, compiled or not, and why
        return 0
    from shardwise.console import Console, print_wrapped

    from shardwise.commands.common import layout_table, notes, print_explanation

    console = Console()
    only = f"; layouts {emitted['title']} can run" if emitted else ""
    console.print(layout_table(top, title=f"{job.model.name} on {args.gpus} x {job.cluster.name}, "
                                         f"batch {job.train.global_batch} x {job.train.seq_len} tokens "
                                         f"({len(result.ranked)} of {result.scored} scored layouts fit"
                                         f"{'' if args.all_variants else '; best of each ' + _split_words(job) + ' split'}{only})",
                               width=console.width))
    if result.thinned:
        print_wrapped(console, f"note: {result.thinned}")
    for note in notes(args):
        print_wrapped(console, f"note: {note}")
    from shardwise.planner.explain import explain, summary

    paragraphs = explain(job, args.gpus, result) if args.explain else summary(job, args.gpus, result)
    print_explanation(console, paragraphs, "Why the winner wins")
    if emitted:
        from shardwise.emit import FRAMEWORK

        own = FRAMEWORK[emitted["target"]]
        ranked = "" if emitted["framework"] == own else (
            f", ranked as {emitted['framework']} runs it (without --framework, as {emitted['title']} does: {own})")
        console.print(f"wrote {emitted['path']}: {emitted['title']} configuration of layout #{emitted['rank']} "
                      f"({rows[emitted['rank'] - 1].layout.describe()}){ranked}. Start it with:", highlight=False)
        console.print(f"  {emitted['launch']}", highlight=False, soft_wrap=True)
    if html:
        console.print(f"wrote {html['path']} ({html['bytes'] / 1e6:.2f} MB): open it in a browser", highlight=False)
    return 0
