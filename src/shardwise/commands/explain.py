"""`shardwise explain`: the planner's decision in the seed article's terms, with numbers."""

from __future__ import annotations

from shardwise.commands.plan import register as _register_plan


def register(subparsers, name, help):
    _register_plan(subparsers, name, help, outputs=False)
    parser = subparsers.choices[name]
    parser.set_defaults(func=run)
    for action in parser._actions:  # plan's flags, but explain prints its own JSON
        if action.dest == "json":
            action.help = 'print {"best": {...}, "explanation": ["paragraph", ...]}'


def run(args) -> int:
    from rich.console import Console

    from shardwise.commands.common import print_explanation, print_json
    from shardwise.commands.plan import plan
    from shardwise.planner.explain import explain

    job, result = plan(args)
    paragraphs = explain(job, args.gpus, result)
    if args.json:
        print_json({"best": result.ranked[0].to_dict(), "explanation": paragraphs})
        return 0
    print_explanation(Console(), paragraphs, f"Where to split {job.model.name} on {args.gpus} x {job.cluster.name}")
    return 0
