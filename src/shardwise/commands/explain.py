"""`shardwise explain`: the planner's decision in the seed article's terms, with numbers."""

from __future__ import annotations

from shardwise.commands.plan import add_plan_args


def register(subparsers, name, help):
    p = subparsers.add_parser(name, help=help, description=help)
    add_plan_args(p)  # what a plan is computed from; explain prints the winner's reasons, not a table
    p.add_argument("--json", action="store_true", help='print {"best": {...}, "explanation": ["paragraph", ...], "job": the inputs as read, and notes}')
    p.set_defaults(func=run)


def run(args) -> int:
    from shardwise.console import Console, print_wrapped

    from shardwise.commands.common import job_fields, note_fields, notes, print_explanation, print_json
    from shardwise.commands.plan import plan
    from shardwise.planner.explain import explain

    job, result = plan(args)
    paragraphs = explain(job, args.gpus, result)
    if args.json:  # --framework or --compile not given: which stack the numbers are, compiled or not, and why
        print_json({"best": result.ranked[0].to_dict(), "explanation": paragraphs,
                    **note_fields(args), **job_fields(args, job)})
        return 0
    print_explanation(Console(), paragraphs, f"Where to split {job.model.name} on {args.gpus} x {job.cluster.name}")
    for note in notes(args):
        print_wrapped(Console(), f"note: {note}")
    return 0
