"""`shardwise report`: one self-contained HTML page for a plan, a validate run, or both."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from shardwise.errors import UsageError

PLAN_FLAGS = ("--model", "--cluster", "--gpus", "--global-batch", "--seq-len")


def register(subparsers, name, help):
    from shardwise.commands.plan import add_plan_args

    p = subparsers.add_parser(
        name, help=help, description=help,
        epilog="examples: shardwise report --model llama-65b --cluster dgx-a100-80gb --gpus 64 --global-batch 1024 "
               "--seq-len 2048 --out report.html;  shardwise validate --json > run.json && "
               "shardwise report --validate run.json --out accuracy.html")
    add_plan_args(p)
    for action in p._actions:  # the plan's inputs, optional here: a report may show a validate run alone
        if action.option_strings and action.option_strings[0] in PLAN_FLAGS:
            action.required = False
    p.add_argument("--validate", type=Path, default=None, metavar="RESULT.json",
                   help="a `shardwise validate --json` result: adds predicted vs measured")
    p.add_argument("--out", type=Path, required=True, metavar="PATH", help="the HTML file to write")
    p.add_argument("--json", action="store_true", help='print {"path", "bytes", "layouts", "best", "validate", and with a plan "job": its inputs as read}')
    p.set_defaults(func=run)


def _validate_result(path: Path) -> dict:
    from shardwise.paths import input_file
    from shardwise.specs import read_json_file

    input_file(path, "--validate", "give the output of `shardwise validate --json`")
    data = read_json_file(path, f"--validate {path}", "give the output of `shardwise validate --json`")
    if not isinstance(data, dict) or not isinstance(data.get("layouts"), list) or not data["layouts"]:
        raise UsageError(f"--validate {path}: not a validate result (no 'layouts') — give the output of `shardwise validate --json`")
    need = ("name", "predicted_step_time_s", "measured_step_time_s", "predicted_memory_bytes", "measured_memory_bytes")
    for x in data["layouts"]:
        missing = [k for k in need if k not in x] if isinstance(x, dict) else list(need)
        if missing:
            raise UsageError(f"--validate {path}: a layout lacks {', '.join(missing)} — give the output of `shardwise validate --json`")
        if not isinstance(x["name"], str):
            raise UsageError(f"--validate {path}: a layout's name is {json.dumps(x['name'])}, not a string — give the "
                             f"output of `shardwise validate --json`")
        bad = [k for k in need[1:] if not _positive(x[k])]
        if bad:
            raise UsageError(f"--validate {path}: layout {json.dumps(x['name'])}'s {bad[0]} is {json.dumps(x[bad[0]])}, "
                             f"not a positive number — give the output of `shardwise validate --json`")
    summary = data.get("summary", {})
    if not isinstance(summary, dict) or any(isinstance(v, float) and not math.isfinite(v) for v in summary.values()):
        raise UsageError(f"--validate {path}: its summary is not an object of finite figures — give the output of "
                         f"`shardwise validate --json`")
    for key in ("machine", "calibration"):  # objects the page reads fields of
        if not isinstance(data.get(key, {}), dict):
            raise UsageError(f"--validate {path}: its '{key}' is {json.dumps(data[key])}, not an object — give the "
                             f"output of `shardwise validate --json`")
    if not isinstance(data.get("world", 1), int) or isinstance(data.get("world"), bool):
        raise UsageError(f"--validate {path}: its 'world' is {json.dumps(data['world'])}, not a whole number — give the "
                         f"output of `shardwise validate --json`")
    return data


def _positive(value) -> bool:
    """A measured or predicted figure: a finite number above 0 (JSON's NaN and Infinity, strings, lists are not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def run(args) -> int:
    from shardwise.commands.common import check_html_name, prepare_output, print_json
    from shardwise.report import page, plan_page, validate_page, write

    given = [f for f in PLAN_FLAGS if getattr(args, f[2:].replace("-", "_")) is not None]
    if given and len(given) < len(PLAN_FLAGS):
        missing = [f for f in PLAN_FLAGS if f not in given]
        raise UsageError(f"a plan needs {', '.join(missing)} too (or leave out {', '.join(given)} for a validate-only report)")
    if not given and args.validate is None:
        raise UsageError(f"nothing to report — give the plan's {', '.join(PLAN_FLAGS)} and/or --validate RESULT.json")
    from shardwise.paths import distinct_outputs

    check_html_name(args.out, "--out", existing=False)  # before its folder is made
    prepare_output(args.out, "--out", "report.html")
    validate = validate_page(_validate_result(args.validate)) if args.validate else None
    from shardwise.paths import folder_files

    reads = {"--validate": args.validate, "--cluster": getattr(args, "cluster", None)}  # (a bad --validate: named first)
    distinct_outputs({"--out": args.out}, reads | folder_files("--model", getattr(args, "model", None)))
    check_html_name(args.out, "--out")
    plan = best = None
    echo = {}
    if given:
        from shardwise.commands.common import job_fields
        from shardwise.commands.plan import plan as run_plan

        job, result = run_plan(args)
        plan = plan_page(job, args.gpus, result)
        best = result.ranked[0].to_dict()
        echo = job_fields(args, job)
        if validate and (validate["model"], validate["world"]) != (job.model.name, args.gpus):
            differ = (f"the validate run is {validate['model']} on {validate['world']} ranks and the plan "
                      f"{job.model.name} on {args.gpus} GPUs: the page's two parts describe different jobs")
            print(f"note: {differ}", file=sys.stderr)
            validate["warnings"] = [*(validate.get("warnings") or []), differ]  # said on the page too (helper-229)
    html = page(plan=plan, validate=validate)
    write(args.out, html)
    size = len(html.encode())
    if args.json:
        print_json({"path": str(args.out), "bytes": size, "layouts": plan["fit"] if plan else 0, "best": best,
                    "validate": validate["summary"] if validate else None} | echo)
        return 0
    what = [f"{plan['fit']:,} layouts" if plan else "", f"{len(validate['layouts'])} measured layouts" if validate else ""]
    print(f"wrote {args.out} ({size / 1e6:.2f} MB; {' and '.join(w for w in what if w)}): open it in a browser")
    return 0
