"""`shardwise estimate`: memory and step time of one layout."""

from __future__ import annotations

from shardwise.commands.common import (add_cluster_args, add_job_args, add_layout_args, add_model_arg,
                                       add_software_args, dp_from_gpus, job_fields, job_from_args, layout_from_args,
                                       note_fields, notes, print_json, under_framework)
from shardwise.errors import DoesNotFit, InputError, UsageError
from shardwise.units import GIB, count, need_of, seconds


def register(subparsers, name, help):
    p = subparsers.add_parser(name, help=help, description=help)
    add_model_arg(p)
    add_cluster_args(p)
    add_job_args(p)
    add_layout_args(p, unnamed=True)
    add_software_args(p)
    p.add_argument("--dp", type=int, default=None,
                   help="data-parallel degree (optional: it follows from --gpus / (tp*pp*cp); given, it must agree)")
    p.add_argument("--dp-shard", type=int, default=None,
                   help="hybrid sharding (HSDP: FSDP HYBRID_SHARD, torchtitan data_parallel_shard_degree): ZeRO-3 "
                        "shards over groups of this many dp ranks and all-reduces gradients across the groups; it must "
                        "divide dp and implies --zero 3 (--zero 1 under internevo, whose optimizer it shards over such "
                        "groups: its zero1 size) (default: one group of all dp ranks)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    return under_framework(args, _run)


def _run(args) -> int:
    from shardwise.planner import estimate
    from shardwise.planner.estimate import check_runs, release_note, split_note
    from shardwise.planner.fit_options import fit_options
    from shardwise.planner.frameworks import get
    from shardwise.planner.overlap import fp8_gathered
    from shardwise.planner.step_time import host_bound_note

    job = job_from_args(args)
    if args.recompute_layers is not None and args.recompute is None:  # recomputing whole layers is full recompute
        args.recompute = "full"
    if args.dp_shard is not None and args.dp_shard < 1:  # 0 is the layout's "one group of all dp", not a size
        raise InputError(f"--dp-shard must be at least 1, got {args.dp_shard} (leave it out for one shard group of "
                         f"every dp rank)")
    args.dp_shard = args.dp_shard or 0
    if args.dp_shard and args.zero is None:  # shard groups: ZeRO-3's (HSDP), or ZeRO-1's where the stack has them
        args.zero = 1 if get(job.framework).zero1_shard_group else 3
    named, unused = _idle_flags(args, job)
    args.vpp = 1 if args.vpp is None else args.vpp
    args.sequence_parallel = bool(args.sequence_parallel)
    args.zero = 0 if args.zero is None else args.zero
    args.recompute = "none" if args.recompute is None else args.recompute
    dp = dp_from_gpus(args.gpus, args.tp, args.pp, args.cp)
    if args.dp is not None and args.dp != dp:
        raise UsageError(f"--dp {args.dp} disagrees with --gpus {args.gpus} / (tp*pp*cp = {args.gpus // dp}) = {dp} — "
                         "give --gpus as dp*tp*pp*cp, or leave --dp out")
    if args.micro_batch is None:
        asked, layout, implied = _unnamed_micro_batch(args, job, dp, named)
    else:
        asked, layout, implied = _completed(args, job, dp, named)
    if hint := _interleaved_hint(args, job, dp, named, layout):
        implied = [f"{i}; {hint}" if i.startswith(f"{layout.schedule} ({job.framework}'s default pipeline schedule")
                   else i for i in implied]
    filled = list(implied)  # the knobs the stack's defaults set, said under the text table
    implied = [*implied, *notes(args), *unused]  # the numbers are one stack's, compiled or not: say so where the user named neither
    check_runs(job, layout)
    if host_note := host_bound_note(job, layout):
        implied = [*implied, host_note]
    if uneven := split_note(job, layout):
        implied = [*implied, uneven]
    if later := release_note(job, layout):
        implied = [*implied, later]
    idle_gather = ("--fp8-params: torchao's float8 all-gather runs only where FSDP shards the weights over "
                   "data-parallel ranks (ZeRO-2/3 with more than one data-parallel shard); this layout gathers none, "
                   "so it changes nothing here") if job.fp8_all_gather and not fp8_gathered(job, layout) else ""
    if idle_gather:  # asked for where torchtitan would not turn it on
        implied = [*implied, idle_gather]
    est = estimate(job, layout, implied)
    options = [] if est.fits else fit_options(job, layout, asked, frozenset(named))
    if args.micro_batch is None:  # each option at the micro-batch chosen here, as `estimate` answers it with both flags
        options = [o | {"change": f"{o['change']} --micro-batch {layout.micro_batch}"}
                   if not o["change"].startswith("--micro-batch") else o for o in options]
    if est.memory_per_gpu > est.gpu_memory_bytes and getattr(args, "fallback_if_unfit", False):
        raise DoesNotFit(_unheld(job, est, options))  # the default stack's GPU-memory miss: the fallback is tried
    if getattr(args, "framework_fallback", False):  # priced under the fallback stack, which the flag alone might not pick
        options = [o | {"change": f"{o['change']} --framework {job.framework}"} for o in options]
    if args.json:
        record = est.to_dict()
        record["assumptions"].setdefault("implied", [])  # always there: empty where nothing was filled in
        # the notes also as plan's and explain's JSON carry them (framework_note, ...), beside assumptions.implied
        print_json(record | ({} if est.fits else {"fit_options": options}) | job_fields(args, job) | note_fields(args))
        return 0
    from shardwise.console import Console, print_wrapped

    from shardwise.commands.common import breakdown_table, layout_table

    console = Console()
    console.print(layout_table([est], title=f"{job.model.name} on {args.gpus} x {job.cluster.name}", width=console.width))
    console.print(breakdown_table(est, width=console.width))
    if est.offload:
        print_wrapped(console, f"host: {est.host_held()} hold the offloaded states (--offload {est.offload})")
    if not est.fits:
        print_wrapped(console, _does_not_fit(est, options))
    print_wrapped(console, _assumed(job, est))
    for item in filled:
        print_wrapped(console, f"filled in: {item}")
    for note in [*notes(args), *unused]:  # the stack and torch.compile where the user named neither; unused flags
        print_wrapped(console, f"note: {note}")
    if idle_gather:
        print_wrapped(console, f"note: {idle_gather}")
    if host_note:
        console.print(f"[yellow]note: {host_note}[/]", highlight=False)
    for note in (uneven, later):
        if note:
            print_wrapped(console, f"note: {note}")
    return 0


def _unheld(job, est, options: list[dict]) -> str:
    """Why the default stack cannot hold the layout, for the fallback's note: its memory against the GPU's, and the
    fastest of its fit_options, the change that keeps it on that stack, if any."""
    need, have = need_of(est.memory_per_gpu, est.gpu_memory_bytes)
    why = f"the layout needs {need} of its {have} GiB per GPU"
    if not options:
        return why
    best = min(options, key=lambda o: o["step_time_s"])
    return (f"{why}; under {job.framework}, {_change_text(best)} fits ({best['memory_gib_per_gpu']:.1f} GiB, step "
            f"{seconds(best['step_time_s'])})")


def _change_text(option: dict) -> str:
    """A fit option's flags as the user types them, and those of the command it needs taken out."""
    return option["change"] + "".join(f" (drop {flag})" for flag in option["dropped"])


def _idle_flags(args, job) -> tuple[set[str], list[str]]:
    """The layout knobs the command line named, and a note for each flag that changes nothing here (common.idle_knobs),
    with the knob set back to what plan reports (a sequence beyond a learned position table: common.model_note);
    interleaving named with one chunk a rank on a stack that runs that as plain 1F1B (Framework.one_chunk_runs_1f1b)."""
    from shardwise.commands.common import idle_knobs
    from shardwise.planner.frameworks import get

    split = args.tp * args.pp * args.cp  # dp where the GPUs divide (else dp_from_gpus says why, in one line)
    dp = args.gpus // split if split > 0 and args.gpus % split == 0 else None
    idle = idle_knobs(args.tp, args.pp, args.cp, schedule=args.schedule, vpp=args.vpp,
                      sequence_parallel=args.sequence_parallel, cp_mode=args.cp_mode,
                      tp_comm_overlap=getattr(args, "tp_comm_overlap", None), dp=dp, zero=args.zero,
                      dp_shard=args.dp_shard)
    if "zero" in idle:
        args.zero = 0
    if "dp_shard" in idle:
        args.dp_shard = 0
    if "schedule" in idle:
        _check_schedule_named(args.schedule, job)
        args.schedule = None
    if "cp_mode" in idle:  # the layout as plan reports one without cp
        args.cp_mode = None
    fw = get(job.framework)
    if (args.pp > 1 and args.schedule == "interleaved-1f1b" and args.vpp == 1 and fw.one_chunk_runs_1f1b
            and "interleaved-1f1b" in fw.schedules):  # a stack without interleaving refuses it (check_runs)
        args.schedule = None  # filled in as the stack's plain 1F1B, said
        idle["schedule"] = (f"--schedule interleaved-1f1b --vpp 1 runs as plain 1F1B on {fw.name} (one model chunk a "
                            f"rank runs its non-interleaved schedule, as Megatron-LM sets a virtual pipeline of 1 to "
                            f"None): priced as --schedule 1f1b")
    named = {k for k in ("zero", "recompute", "cp_mode", "sequence_parallel", "vpp", "schedule") if getattr(args, k) is not None}
    return named, list(idle.values())


def _check_schedule_named(schedule: str, job) -> None:
    """A schedule named at --pp 1 changes nothing, but one the stack never runs is refused as at --pp 2 (and as plan's
    --schedules refuses it): the command line names a stack that cannot run what it was asked for. A stack with no
    pipeline at all runs no schedule: the note says the flag changes nothing, as plan's does."""
    from shardwise.planner.frameworks import check, get
    from shardwise.specs import Layout

    fw = get(job.framework)
    if fw.schedules and schedule not in fw.schedules:  # a stack without pipelines: said to change nothing, as plan says
        check(fw, Layout(dp=1, tp=1, pp=2, micro_batch=1, schedule=schedule))  # its refusal of that schedule at pp 2


def _completed(args, job, dp: int, named: set[str]):
    """The layout the command line gives, checked, and as the job's stack runs it (complete_layout): (as asked — what
    fit_options changes one flag of —, completed, what the stack's defaults filled in)."""
    from shardwise.planner.estimate import complete_layout
    from shardwise.planner.frameworks import get
    from shardwise.specs import check_sequence_split, validate_layout

    fw = get(job.framework)
    layout = layout_from_args(args, dp)
    etp = fw.default_etp(job.model, layout) if args.etp is None else args.etp  # (layout_from_args: etp 1 unnamed)
    layout = layout.with_(etp=etp)
    validate_layout(layout, job.model, job.train.global_batch, args.gpus, seq_len=job.train.seq_len,
                    edge_chunks=fw.edge_chunks, split_rule=fw.stage_split)
    completed, implied = complete_layout(job, layout, named)
    if args.etp is None and etp > 1:
        implied = [*implied, f"etp {etp} ({fw.name} splits each expert over the dense layers' tp unless told: "
                             f"Megatron-Core's --expert-tensor-parallel-size default; --etp not given)"]
    elif args.etp is None and fw.expert_tp_follows_tp and job.model.is_moe and layout.tp > 1:
        implied = [*implied, f"etp 1 (ep x tp = {layout.ep * layout.tp} does not fold over the dp x tp x cp = "
                             f"{layout.dp * layout.tp * layout.cp} ranks, or tp does not divide the expert FFN: "
                             f"{fw.name} needs --etp 1 said there; --etp not given)"]
    if completed.sequence_parallel and not layout.sequence_parallel:  # implied: the sequence must split over tp too
        try:
            check_sequence_split(completed, job.model, job.train.seq_len)
        except UsageError as exc:
            raise UsageError(f"{implied[0]}: {exc}") from None
    return layout, completed, implied


def _unnamed_micro_batch(args, job, dp: int, named: set[str]):
    """--micro-batch not given: of the micro-batches dividing each replica's share of the batch (each completed as
    the stack runs it), the fastest that fits, else the one needing the least memory. A micro-batch the layout cannot
    take is skipped; if none can, the smallest one's error is the answer."""
    from shardwise.planner import estimate
    from shardwise.planner.estimate import check_runs
    from shardwise.planner.frameworks import get
    from shardwise.planner.search import SearchSpace, micro_batches

    whole = job.train.global_batch % dp == 0  # else the batch splits over no dp: micro-batch 1 says why, in one line
    share = job.train.global_batch // dp
    tried, first_error = [], None
    # as plan scores them: the divisors of the share, or the whole share on a stack that does not accumulate
    for m in micro_batches(job, get(job.framework), dp, args.pp, SearchSpace()) if whole else [1]:
        args.micro_batch = m
        try:
            asked, completed, implied = _completed(args, job, dp, named)
            check_runs(job, completed)
        except UsageError as exc:
            first_error = first_error or exc
            continue
        tried.append((estimate(job, completed), asked, completed, implied))
    if not tried:
        args.micro_batch = None
        raise first_error
    fits = [t for t in tried if t[0].fits]
    est, asked, completed, implied = (min(fits, key=lambda t: t[0].step_time) if fits
                                      else min(tried, key=lambda t: t[0].memory_per_gpu))
    rule = "the fastest that fits" if fits else "the closest to fitting: none fits"
    args.micro_batch = None  # still unnamed: fit_options says the micro-batch beside each change
    return asked, completed, [*implied, f"micro-batch {completed.micro_batch} ({rule}, of the {len(tried)} the stack "
                                        f"can run with each replica's {count(share, 'sequence')}; --micro-batch not "
                                        f"given)"]


# How much faster interleaving must be before the stack's default plain 1F1B is said to leave it on the table.
INTERLEAVED_HINT = 0.05


def _interleaved_hint(args, job, dp: int, named: set[str], layout) -> str:
    """Where the stack runs plain 1F1B unless told to interleave (Megatron-LM without
    --num-layers-per-virtual-pipeline-stage, torchtitan's default schedule) and the same command with
    --schedule interleaved-1f1b answers a layout that fits and is INTERLEAVED_HINT faster: what that answer is (its depth,
    and the knobs this command left to be filled in), for the "default pipeline schedule" line; else "". Computed as
    that command computes it, so the flag gives these numbers."""
    from shardwise.planner.estimate import check_runs, estimate
    from shardwise.planner.frameworks import get

    fw = get(job.framework)
    if (layout.pp == 1 or layout.schedule != "1f1b" or {"schedule", "vpp"} & named or fw.interleave_unnamed
            or "interleaved-1f1b" not in fw.schedules):
        return ""
    now = estimate(job, layout)
    if not now.fits:
        return ""
    given = (args.schedule, args.micro_batch)
    args.schedule = "interleaved-1f1b"
    try:
        answer = (_unnamed_micro_batch if given[1] is None else _completed)(args, job, dp, named | {"schedule"})[1]
        check_runs(job, answer)
    except UsageError:  # the stack cannot interleave this layout (e.g. micro-batches not a multiple of pp)
        return ""
    finally:
        args.schedule, args.micro_batch = given
    then = estimate(job, answer)
    if not then.fits or then.step_time > now.step_time * (1 - INTERLEAVED_HINT):
        return ""
    knobs = [f"{answer.vpp} virtual stages per rank"]
    knobs += [f"micro-batch {answer.micro_batch}"] * (given[1] is None)
    knobs += [f"ZeRO-{answer.zero}"] * ("zero" not in named) + [answer.recompute_phrase()] * ("recompute" not in named)
    return (f"--schedule interleaved-1f1b would take {then.step_time:.3g} s against {now.step_time:.3g} s "
            f"({', '.join(knobs)})")


def _assumed(job, est) -> str:
    """One line of what the numbers assume about the software: the stack, its attention, gradient reduction (as this
    layout's is priced), TP overlap and precision (all of it, and more, in --json's assumptions)."""
    from shardwise.planner.overlap import grad_reduce_behind

    a, behind = est.assumptions, grad_reduce_behind(job, est.layout)
    reduced = ("no gradient reduction (one data-parallel replica)" if behind is None else
               f"gradients reduced in {a['gradient_reduce_dtype']} {'behind' if behind else 'after'} the backward")
    offloaded = f", in CPU memory: {a['offload']['states']}" if "offload" in a else ""
    return (f"assumes: {est.framework}{' compiled' if est.compile else ''}, attention {a['attention']}, {reduced}, "
            f"TP comm overlap {'on' if a['tp_comm_overlap'] else 'off'}, {a['gemm_dtype'].split(' (')[0]} matmuls"
            f"{offloaded}")


def _does_not_fit(est, options: list[dict]) -> str:
    if est.memory_per_gpu <= est.gpu_memory_bytes:  # the GPUs hold it: the host's memory is what --offload overfills
        return (f"does not fit the host: the offloaded states need {est.host_bytes / GIB:,.0f} GiB of CPU memory a "
                f"node, and a node has {est.host_capacity / GIB:,.0f} GiB — more GPUs (smaller shards), "
                f"{'--offload optimizer, ' if est.offload == 'params' else ''}or a cluster file with more host_memory_gib")
    need, have = need_of(est.memory_per_gpu, est.gpu_memory_bytes)
    head = f"does not fit: {need} of {have} GiB per GPU"
    if not options:
        return (f"{head}; no single change of recompute, ZeRO stage, sequence parallelism, compile or micro-batch fits "
                "it: more GPUs, or another split")
    return head + "; it fits with " + "; or ".join(
        f"{_change_text(o)} ({o['memory_gib']:.1f} GiB, step {seconds(o['step_time_s'])}"
        + (f"; the stack's defaults then fill in {' '.join(o['filled_in'])}" if o["filled_in"] else "") + ")"
        for o in options)
