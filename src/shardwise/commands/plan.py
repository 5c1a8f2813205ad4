"""`shardwise plan`: rank every dp x tp x pp layout and say why the winner wins."""

from __future__ import annotations

from shardwise.commands.common import (add_cluster_args, add_job_args, add_model_arg, add_search_args,
                                       add_software_args, job_from_args, print_json, space_from_args)


def register(subparsers, name, help):
    p = subparsers.add_parser(name, help=help, description=help)
    add_model_arg(p)
    add_cluster_args(p)
    add_job_args(p)
    add_software_args(p)
    add_search_args(p)
    p.add_argument("--top", type=int, default=10, help="how many layouts to show (default 10)")
    p.add_argument("--json", action="store_true", help='print {"best": {...}, "candidates": [...]}')
    p.add_argument("--explain", action="store_true", help="also explain the decision in plain words")
    p.add_argument("--all-variants", action="store_true",
                   help="list every fitting variant (micro-batch, vpp, schedule, ZeRO, recompute) instead of the "
                        "best one of each dp x tp x pp split")
    p.set_defaults(func=run)


def plan(args):
    """(job, search result), or UsageError when nothing fits."""
    from shardwise.errors import UsageError
    from shardwise.planner.search import nothing_fits_message, search

    if args.top < 1:
        raise UsageError(f"--top must be at least 1, got {args.top}")
    job = job_from_args(args)
    space = space_from_args(args)
    result = search(job, args.gpus, space)
    if not result.ranked:
        raise UsageError(nothing_fits_message(job, args.gpus, result, space))
    return job, result


def best_per_split(ranked):
    """The fastest layout of each dp x tp x pp split, in rank order."""
    seen, out = set(), []
    for e in ranked:
        key = (e.layout.dp, e.layout.tp, e.layout.pp)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def run(args) -> int:
    job, result = plan(args)
    top = (result.ranked if args.all_variants else best_per_split(result.ranked))[: args.top]
    if args.json:
        out = {"best": top[0].to_dict(), "candidates": [e.to_dict() for e in top]}
        if args.explain:
            from shardwise.planner.explain import explain
            out["explanation"] = explain(job, args.gpus, result)
        print_json(out)
        return 0
    from rich.console import Console

    from shardwise.commands.common import layout_table, print_explanation

    console = Console()
    console.print(layout_table(top, title=f"{job.model.name} on {args.gpus} x {job.cluster.name}, "
                                         f"batch {job.train.global_batch} x {job.train.seq_len} tokens "
                                         f"({len(result.ranked)} of {result.scored} scored layouts fit"
                                         f"{'' if args.all_variants else '; best of each dp x tp x pp split'})"))
    from shardwise.planner.explain import explain, summary

    paragraphs = explain(job, args.gpus, result) if args.explain else summary(job, args.gpus, result)
    print_explanation(console, paragraphs, "Why the winner wins")
    return 0
