"""`shardwise simulate`: run a pipeline schedule on paper — makespan, bubble, memory, timeline picture."""

from __future__ import annotations

import math

from shardwise.errors import UsageError
from shardwise.paths import output_path
from shardwise.schedules.simulate import MAX_SIMULATED, action_count
from shardwise.specs import PLANNED_SCHEDULES as COMPARE
from shardwise.specs import SCHEDULES, default_schedule

# Limits that keep every answer within seconds. Beyond MAX_SIMULATED actions, over all schedules of one command, the
# closed forms answer (exact for uniform costs: tests/test_simulate.py proves them equal to the simulator); a picture
# stays readable up to MAX_DRAWN.
MAX_DRAWN = 4_000  # actions in one --out picture
MAX_DRAWN_RANKS = 64  # rows of one --out picture
MAX_STAGES = 10_000  # pp * vpp: a stage holds at least one layer (specs.MAX_LAYERS)
MAX_MICROBATCHES = 2**32


def register(subparsers, name: str, help: str) -> None:
    p = subparsers.add_parser(name, help=help, description=help)
    p.add_argument("--schedule", choices=SCHEDULES, default=None,
                   help="pipeline schedule (default 1f1b; interleaved-1f1b with --vpp 2 or more)")
    p.add_argument("--pp", type=int, required=True, help="pipeline ranks")
    p.add_argument("--microbatches", type=int, required=True, help="micro-batches per step")
    p.add_argument("--vpp", type=int, default=None,
                   help="model chunks per rank (interleaved-1f1b only; default 2 for interleaved, else 1)")
    p.add_argument("--costs", default="1,1,1", metavar="F,B,W",
                   help="per micro-batch per stage, in ms: forward, backward for inputs, backward for weights (default 1,1,1)")
    p.add_argument("--comm", type=float, default=0.0, metavar="C", help="one point-to-point transfer, in ms (default 0)")
    p.add_argument("--model", default=None,
                   help="cut this model (preset or config.json) into stages as training does; --costs is then an average "
                        "stage and each stage costs its share of the FLOPs (the LM head's stage more). pp*vpp may exceed "
                        "the layers by two, a chunk holding only the embedding and one only the loss, as megatron-core, "
                        "nemo, torchtitan and Llama 3 cut")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence, with --model (default 2048)")
    from shardwise.commands.common import add_framework_arg

    add_framework_arg(p, help="the training stack whose pipeline runs the schedule (default: none, on paper — any "
                              "schedule, and --model cut by the runtime's cost-balanced split). Named, the schedules "
                              "it runs (--compare shows only those), the shallowest pipeline it interleaves and, with "
                              "--model, how it cuts the layers: Megatron's L/(pp*vpp) layers a chunk on megatron-2021, "
                              "megatron-core and nemo; a chunk for the embedding and one for the loss only where it "
                              "cuts them")
    p.add_argument("--compare", action="store_true", help="simulate GPipe, 1F1B, interleaved and ZB-H1 side by side")
    p.add_argument("--out", type=output_path("timeline.png"), default=None, help="draw the timeline to this .png or .svg")
    p.add_argument("--trace", type=output_path("trace.json"), default=None,
                   help="write a Chrome-trace JSON (open in ui.perfetto.dev)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def parse_costs(text: str) -> tuple[float, float, float]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or not all(math.isfinite(x) and 0 <= x <= 1e12 for x in values):
        raise UsageError(f"--costs must be three finite numbers F,B,W, each from 0 to 1e12 (e.g. 1,1,1), got '{text}'")
    if sum(values) <= 0:
        raise UsageError(f"--costs {text}: every pass costs nothing, so there is no step to simulate — make F, B or W "
                         f"positive (e.g. 1,1,1)")
    return values


def _check(args) -> None:
    if not (math.isfinite(args.comm) and 0 <= args.comm <= 1e12):
        raise UsageError(f"--comm must be non-negative and finite (ms), got {args.comm} — e.g. --comm 0.1, or leave it out "
                         f"for free transfers")
    for flag, value, top in (("--pp", args.pp, MAX_STAGES), ("--microbatches", args.microbatches, MAX_MICROBATCHES),
                             ("--vpp", args.vpp if args.vpp is not None else 1, MAX_STAGES)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
        if value > top:
            raise UsageError(f"{flag} must be at most {top:,}, got {value:,}")
    if args.pp * (args.vpp or 1) > MAX_STAGES:
        raise UsageError(f"pp*vpp = {args.pp * args.vpp:,} stages is above {MAX_STAGES:,} (a stage holds at least one "
                         f"layer) — lower --pp or --vpp")
    if args.out is not None and args.out.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"--out must end in .png or .svg, got '{args.out}' — name the picture timeline.png or timeline.svg")
    from shardwise.commands.common import prepare_output
    from shardwise.paths import distinct_outputs

    distinct_outputs({"--out": args.out, "--trace": args.trace}, {"--model": getattr(args, "model", None)})
    prepare_output(args.out, "--out", "timeline.png")
    prepare_output(args.trace, "--trace", "trace.json")
    if args.seq_len is not None and args.model is None:
        raise UsageError("--seq-len sets the stage costs of --model — add --model, or give the costs with --costs")
    if args.compare and args.schedule is not None:
        raise UsageError("--compare simulates gpipe, 1f1b, interleaved-1f1b and zb-h1 itself — drop --schedule")


def _framework(args):
    """The --framework profile (planner/frameworks.py), or None: on paper, for any stack."""
    if args.framework is None:
        return None
    from shardwise.planner.frameworks import get

    return get(args.framework)  # an unknown name: one line, exit 2


def _shapes(args, fw=None) -> list[tuple[str, int]]:
    """(schedule, vpp) pairs to simulate; under a --framework `fw`, only those its pipeline runs (with --model, on the
    model's layers): --compare leaves out the others, a named schedule it cannot run is refused in one line."""
    if args.compare:
        if args.vpp is not None and args.vpp < 2:
            raise UsageError(f"--compare needs --vpp of at least 2 for the interleaved panel, got {args.vpp}")
        shapes = [(s, (args.vpp or 2) if s == "interleaved-1f1b" else 1) for s in COMPARE]
        if args.pp == 1:  # one rank has nothing to interleave: the other panels
            if args.vpp is not None:
                raise UsageError(f"--vpp {args.vpp} sets the interleaved panel, which --pp 1 leaves out (one rank has "
                                 f"nothing to interleave) — drop --vpp, or use --pp 2 or more")
            shapes = [(s, v) for s, v in shapes if s != "interleaved-1f1b"]
        elif args.microbatches % args.pp:  # Megatron's interleaving takes whole groups of pp: the other panels
            if args.vpp is not None:
                raise UsageError(f"--vpp {args.vpp} sets the interleaved panel, which --microbatches "
                                 f"{args.microbatches} leaves out (not a multiple of --pp {args.pp}) — drop --vpp, or "
                                 f"give a multiple of {args.pp}")
            shapes = [(s, v) for s, v in shapes if s != "interleaved-1f1b"]
    else:
        from shardwise.specs import check_named_interleaving, check_pipeline_shape

        if args.schedule is None and args.pp == 1 and (args.vpp or 1) > 1:  # the flag given, not the schedule it implies
            raise UsageError(f"--vpp {args.vpp} interleaves model chunks over pipeline ranks, and --pp 1 has one — give "
                             f"--pp 2 or more, or drop --vpp")
        schedule = args.schedule or default_schedule(args.vpp or 1)  # --vpp 2+ alone interleaves, as estimate reads it
        if args.vpp is not None:  # as train refuses it
            check_named_interleaving(args.pp, args.vpp, schedule)
        shapes = [(schedule, args.vpp if args.vpp is not None else (2 if schedule == "interleaved-1f1b" else 1))]
        check_pipeline_shape(args.pp, shapes[0][1], schedule)  # before any framework's refusal
    if fw is None:
        return shapes
    from shardwise.planner.frameworks import check
    from shardwise.specs import Layout, load_model

    layers = load_model(args.model).num_layers if args.model is not None else None
    runs = [(name, v) for name, v in shapes
            if not fw.refusal(Layout(pp=args.pp, vpp=v, schedule=name), layers, pipeline_only=True)]
    if not runs:  # the reason of the first (the only one without --compare)
        name, v = shapes[0]
        check(fw, Layout(pp=args.pp, vpp=v, schedule=name), num_layers=layers)
    return runs


def _costs(args, v: int, f: float, b: float, w: float, fw=None):
    from shardwise.schedules.simulate import Costs, model_costs

    if args.model is None:
        return Costs(f, b, w, args.comm)
    from shardwise.specs import check_chunks, load_model

    spec = load_model(args.model)
    if args.seq_len is None:
        args.seq_len = 2048
    from shardwise.specs import TrainSpec

    if not 1 <= args.seq_len <= TrainSpec.MAX:  # the planner's bound on a sequence
        raise UsageError(f"--seq-len must be between 1 and {TrainSpec.MAX:,}, got {args.seq_len:,}")
    # On paper for any stack: up to a chunk holding only the embedding and one only the loss, as the stacks that cut
    # so run them (Framework.edge_chunks) and `plan` may recommend for them (Llama 3.1 405B on pp 16 x vpp 8); under a
    # --framework, as that stack cuts (Framework.edge_chunks, Framework.stage_split).
    check_chunks(args.pp, v, spec, edge_chunks=fw is None or fw.edge_chunks)
    return model_costs(spec, args.pp, v, args.seq_len, f, b, w, args.comm,
                       rule=fw.stage_split if fw is not None else "balanced")


def _deadlock_free(schedule) -> dict:
    """Whether the executor's messages for this schedule finish under buffered sends (NCCL's below its eager
    threshold) and under rendezvous sends with one FIFO per pair of ranks (NCCL's above it): checked message by message for a simulated
    schedule. A closed-form answer (too many actions to check one by one) reports what `p2p_program`
    guarantees for every schedule it accepts: it only ever returns a program that finishes under both
    (docs/pipeline.md, "Messages that cannot deadlock on NCCL")."""
    from shardwise.schedules import Schedule
    from shardwise.schedules.p2p import SEMANTICS, deadlock_free

    if not isinstance(schedule, Schedule):
        return {f"deadlock_free_{semantics}": True for semantics in SEMANTICS}
    return deadlock_free(schedule)


def _title(sim) -> str:
    s = sim.schedule
    return f"{s.name}  (p={s.p}, m={s.m}" + (f", v={s.v})" if s.v > 1 else ")")


def _scaled(events, to_seconds: float, rank_offset: int = 0):
    from dataclasses import replace

    return [replace(e, rank=e.rank + rank_offset, start=e.start * to_seconds, end=e.end * to_seconds) for e in events]


def run(args) -> int:
    from shardwise.schedules.generators import check_shape
    from shardwise.timeline import draw_timelines, write_chrome_trace

    _check(args)
    f, b, w = parse_costs(args.costs)
    fw = _framework(args)
    shapes = _shapes(args, fw)
    for name, v in shapes:
        check_shape(name, args.pp, args.microbatches, v)
    actions = sum(action_count(name, args.pp, args.microbatches, v) for name, v in shapes)
    if actions > MAX_SIMULATED:
        return _closed_form(args, shapes, actions, (f, b, w), fw)
    if args.out is not None and (actions > MAX_DRAWN * len(shapes) or args.pp > MAX_DRAWN_RANKS):
        raise UsageError(f"--out draws every action of every rank, and {args.pp} ranks with {actions:,} actions are too "
                         f"many to see — draw at most {MAX_DRAWN_RANKS} ranks and {MAX_DRAWN:,} actions per schedule "
                         f"(e.g. --pp 8 --microbatches 32), or write --trace for Perfetto")
    sims = [_simulated(name, args.pp, args.microbatches, v, _costs(args, v, f, b, w, fw), fw) for name, v in shapes]
    ms = 1e-3  # costs are in ms; pictures and traces take seconds
    if args.out is not None:
        panels = [(_title(s), _scaled(s.events + s.transfers, ms)) for s in sims]
        each = ("of an average stage (each in proportion to its FLOPs, "
                f"{args.model} cut {'/'.join(f'{n:g}' for n in sims[0].costs.held)} layers)" if args.model else "per stage")
        draw_timelines(panels, args.out, suptitle=f"costs per micro-batch {each}: F={f:g} B={b:g} W={w:g} ms, "
                                                  f"comm={args.comm:g} ms")
    if args.trace is not None:
        # One trace; with --compare each schedule's ranks get their own process ids.
        events = [e for i, s in enumerate(sims) for e in _scaled(s.events + s.transfers, ms, rank_offset=i * args.pp)]
        names = {i * args.pp + r: f"{s.schedule.name} rank {r}" for i, s in enumerate(sims) for r in range(args.pp)}
        write_chrome_trace(events, args.trace, names)
    if args.json:
        from shardwise.commands.common import print_json

        results = [s.to_dict() | _deadlock_free(s.schedule)
                   | {"costs_ms": {"f": f, "b": b, "w": w, "comm": args.comm}, "method": "simulated",
                      "lockstep": _lockstep(s.schedule.name, fw)} | _model_fields(args, s.costs, fw)
                   for s in sims]
        left = _left_out(args, shapes, fw)
        print_json(({"compare": results} | ({"left_out": left} if left else {})) if args.compare else results[0])
    else:
        _print_summary(sims, args, note="; ".join(filter(None, (_left_out(args, shapes, fw), _lockstep_note(shapes, fw)))) or None)
    return 0


def _model_fields(args, costs, fw) -> dict:
    """With --model: what was simulated — the model, sequence and stack, the layers each virtual stage holds (its cut)
    and each stage's costs (costs_ms holds an average stage's, which every stage scales by its FLOPs)."""
    if args.model is None:
        return {}
    stages = len(costs.held)
    per = {k: [round(float(x), 6) for x in getattr(costs, k)] if not isinstance(getattr(costs, k), (int, float))
           else [float(getattr(costs, k))] * stages for k in ("f", "b", "w")}
    return {"model": args.model, "seq_len": args.seq_len, "framework": fw.name if fw is not None else None,
            "stage_layers": [float(n) for n in costs.held], "stage_costs_ms": per}


def _lockstep(name: str, fw) -> bool:
    """Whether the stack runs this schedule as DeepSpeed's engine does (Framework.p2p_lockstep): 1F1B in lockstep
    steps, each exchange blocking both ends (schedules/lockstep.py), as the planner and the report time it."""
    return fw is not None and fw.p2p_lockstep and name == "1f1b"


def _lockstep_note(shapes, fw) -> str | None:
    if not any(_lockstep(name, fw) for name, _ in shapes):
        return None
    return (f"1f1b as {fw.name}'s engine runs it: lockstep steps, each stage exchanging with one neighbour, both ends "
            f"blocking, before it computes (schedules/lockstep.py), as plan and report time it")


def _simulated(name: str, p: int, m: int, v: int, costs, fw):
    from shardwise.schedules.generators import build
    from shardwise.schedules.lockstep import simulate_lockstep
    from shardwise.schedules.simulate import simulate

    return simulate_lockstep(p, m, costs) if _lockstep(name, fw) else simulate(build(name, p, m, v), costs)


def _left_out(args, shapes, fw) -> str | None:
    """What --compare left out and why: interleaving on one pipeline rank, or the schedules --framework does not run."""
    if not args.compare:
        return None
    one_rank = ["interleaved-1f1b"] if args.pp == 1 else []
    ungrouped = ["interleaved-1f1b"] if args.pp > 1 and args.microbatches % args.pp else []
    left = [name for name in COMPARE if name not in {n for n, _ in shapes} and name not in one_rank + ungrouped]
    said = [f"--framework {fw.name} runs no {', '.join(left)} here"] if left and fw is not None else []
    said += ["one pipeline rank (--pp 1) has nothing to interleave"] if one_rank else []
    said += [f"interleaved-1f1b takes micro-batches in groups of --pp ({args.microbatches} is not a multiple of "
             f"{args.pp})"] if ungrouped else []
    return "; ".join(said) + ": left out" if said else None


NARROW = 100  # below this many columns (a pipe, an 80-column terminal) the table drops its borders, so nothing is cut


def _print_summary(sims, args, note: str | None = None) -> None:
    from rich import box
    from shardwise.console import Console
    from rich.table import Table

    from shardwise.commands.common import SHORT
    from shardwise.units import seconds

    console = Console()
    narrow = console.width < NARROW
    held = getattr(sims[0].costs, "held", None) if args.model else None  # (closed forms: no --model)
    cut = f", {args.model} cut {'/'.join(f'{n:g}' for n in held)} layers (costs of an average stage)" if held else ""
    title = f"pipeline step, p={args.pp}, m={args.microbatches}, costs F,B,W={args.costs} ms, comm={args.comm:g} ms{cut}"
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1)) if narrow else Table(title=title)
    headers = ("schedule", "makespan", "bubble", "bubble/rank", "in flight/rank", "gloo/NCCL" if narrow else "deadlock-free")
    for col in headers:
        table.add_column(col, justify="left" if col == "schedule" else "right", no_wrap="/rank" not in col)
    shown = 2 if narrow and args.pp > 4 else 8  # narrow: every rank up to 4, else the first and the last
    for s in sims:
        name = (SHORT.get(s.schedule.name, s.schedule.name) if narrow else s.schedule.name) \
            + (f" v={s.schedule.v}" if s.schedule.v > 1 else "")
        free = _deadlock_free(s.schedule)
        table.add_row(name, seconds(s.makespan * 1e-3), f"{100 * s.bubble_fraction:.1f}%",
                      _row((f"{100 * x:.0f}%" for x in s.bubble_fraction_per_rank), shown, count=not narrow),
                      _row((f"{x:g}" for x in s.peak_inflight_per_rank), shown, count=not narrow),
                      " / ".join("yes" if ok else "[red]no[/]" for ok in free.values()))
    console.print(table)
    if note:
        console.print(note, highlight=False)
    free = "gloo/NCCL" if narrow else "deadlock-free"
    console.print(("i-1f1b: interleaved 1F1B; " if narrow else "") + "in flight/rank: peak activations held, in "
                  f"micro-batches of one whole stage; {free}: the executor's messages finish with buffered sends (NCCL "
                  "below its eager threshold) and with rendezvous sends, one FIFO per rank pair (NCCL above it)",
                  highlight=False)
    for label, path in (("timeline", args.out), ("trace", args.trace)):
        if path is not None:
            console.print(f"{label} written to {path}")


def _closed_form(args, shapes, actions: int, fbw, fw=None) -> int:
    """A pipeline too large to simulate action by action: the closed forms, where they are exact
    (uniform costs; and without transfers, or for naive, GPipe and 1F1B at any transfer time)."""
    from types import SimpleNamespace

    from shardwise.schedules import closed_forms as cf

    too_many = f"{actions:,} actions are more than the {MAX_SIMULATED:,} simulated one by one"
    if args.out is not None or args.trace is not None:
        raise UsageError(f"--out/--trace draw every action, and {too_many} — draw a smaller pipeline "
                         f"(e.g. --pp 8 --microbatches 32), or drop --out/--trace for the closed-form figures")
    if args.model is not None:
        raise UsageError(f"{too_many}, and the closed forms assume equal stages, which --model's are not — "
                         f"use fewer --pp/--microbatches, or drop --model")
    inexact = [n for n, _ in shapes if args.comm > 0 and n in ("interleaved-1f1b", "zb-h1")]
    if inexact:
        raise UsageError(f"{too_many}, and the closed form of {', '.join(inexact)} with --comm > 0 is only a lower "
                         f"bound — use --comm 0, or fewer --pp/--microbatches")
    p, m, (f, b, w), c = args.pp, args.microbatches, fbw, args.comm
    forms = []
    for name, v in shapes:
        span = (cf.pipeline_makespan(name, p, m, v, f, b, w, 0.0) + cf.lockstep_transfers(p, m) * c
                if _lockstep(name, fw) else cf.pipeline_makespan(name, p, m, v, f, b, w, c))
        bubble = 1.0 - m * (f + b + w) / span if span > 0 else 0.0  # every rank does the same work
        forms.append(SimpleNamespace(
            schedule=SimpleNamespace(name=name, p=p, m=m, v=v), makespan=span, bubble_fraction=bubble,
            bubble_fraction_per_rank=_per_rank(p, lambda r: bubble),
            peak_inflight_per_rank=_per_rank(p, lambda r: cf.peak_inflight_microbatches(name, p, m, v, r))))
    if args.json:
        from shardwise.commands.common import print_json

        results = [{"schedule": s.schedule.name, "pp": p, "microbatches": m, "vpp": s.schedule.v, "makespan": s.makespan,
                    "bubble_fraction": s.bubble_fraction, "bubble_fraction_per_rank": s.bubble_fraction_per_rank,
                    "peak_inflight_microbatches_per_rank": s.peak_inflight_per_rank,
                    **_deadlock_free(s.schedule), "costs_ms": {"f": f, "b": b, "w": w, "comm": c},
                    "method": "closed form", "lockstep": _lockstep(s.schedule.name, fw)} for s in forms]
        print_json({"compare": results} if args.compare else results[0])
    else:
        _print_summary(forms, args, note="; ".join(filter(None, (
            f"closed forms ({too_many}); equal to the simulator for uniform costs", _lockstep_note(shapes, fw)))))
    return 0


def _per_rank(p: int, value) -> list[float]:
    """One value per rank (values repeat across ranks, so a huge p is cheap)."""
    return [float(value(r)) for r in range(p)]


def _row(values, shown: int = 8, count: bool = True) -> str:
    """Per-rank values: all of them, or the first and last shown/2 (with how many are left out, if `count`)."""
    values = list(values)
    if len(values) <= shown:
        return " ".join(values)
    gap = f" … ({len(values) - shown} more) … " if count else " … "
    return " ".join(values[: shown // 2]) + gap + " ".join(values[-shown // 2:])
