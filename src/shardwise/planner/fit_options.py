"""What would make a layout that does not fit fit: one knob changed at a time — a recompute policy, a higher ZeRO stage,
sequence parallelism, torch.compile on a stack that compiles, CPU offload on a stack that offloads, a smaller
micro-batch — each as the job's framework runs
it, with the memory and step time it would have. `estimate` prints them beside "does not fit" (and `--json` carries
them as `fit_options`), so the user sees the fix and its cost instead of a bare no."""

from __future__ import annotations

from dataclasses import replace

from shardwise.errors import UsageError
from shardwise.planner.estimate import Estimate, check_runs, complete_layout, estimate
from shardwise.planner.frameworks import get as get_framework
from shardwise.planner.job import Job, compiled
from shardwise.planner.offload import host_stated
from shardwise.specs import RECOMPUTE, Layout, check_sequence_split, validate_layout
from shardwise.units import GIB


def fit_options(job: Job, layout: Layout, asked: Layout | None = None, named: frozenset[str] = frozenset()) -> list[dict]:
    """The single-knob changes of `layout` (which does not fit) that fit, fastest first: {"change": the command-line
    flag and its value, "memory_gib", "step_time_s", "filled_in", "dropped": flags of the command it needs removed}. Empty when none does (more GPUs, or another split, is the way).
    Each is what `estimate` answers with that flag added to the same command: the layout as given (`asked`, before
    estimate.complete_layout filled in what `named` leaves out), the flag's knob named, the rest filled in again."""
    fw, asked = get_framework(job.framework), asked or layout
    later = RECOMPUTE[RECOMPUTE.index(layout.recompute) + 1:]
    tries = [(f"--recompute {r}", "recompute", asked.with_(recompute=r, recompute_layers=None))
             for r in later if r in fw.recompute]
    if layout.dp * layout.cp > 1:
        tries += [(f"--zero {z}", "zero", asked.with_(zero=z)) for z in fw.zero_stages if z > layout.zero]
    if layout.tp > 1 and not layout.sequence_parallel:
        tries.append(("--sequence-parallel", "sequence_parallel", asked.with_(sequence_parallel=True)))
    runs = [(change, job, lay, named | {knob}) for change, knob, lay in tries]
    # a compiled loss and blocks keep less; Inductor fuses the norms itself, so a --fused-norms release's job is
    # compiled without them (the command line refuses the two together: the option says to drop it)
    dropped = {"--compile": ["--fused-norms"]} if job.fused_norms else {}
    if fw.compiles and not job.compile and not fw.compile_refusal():
        runs.append(("--compile", compiled(replace(job, fused_norms=False)), asked, named))
    for kind in fw.offload if host_stated(job.cluster) and not job.offload else ():  # the states to the host's memory
        runs.append((f"--offload {kind}", replace(job, offload=kind), asked, named))
    out = [_option(change, est, layout, dropped.get(change, [])) for change, est in
           ((c, _fitting(j, lay, knobs)) for c, j, lay, knobs in runs) if est is not None]
    smaller = next((est for est in (_fitting(job, asked.with_(micro_batch=mb), named)  # the largest that fits
                                    for mb in range(layout.micro_batch - 1, 0, -1)) if est is not None), None)
    if smaller is not None:
        out.append(_option(f"--micro-batch {smaller.layout.micro_batch}", smaller, layout))
    return sorted(out, key=lambda o: o["step_time_s"])


# The knobs estimate fills in when the command leaves them out, as flags: what a change's new fill-in also moved.
_FILLED = (("schedule", lambda v: f"--schedule {v}"), ("vpp", lambda v: f"--vpp {v}"),
           ("micro_batch", lambda v: f"--micro-batch {v}"), ("zero", lambda v: f"--zero {v}"),
           ("recompute", lambda v: f"--recompute {v}"),
           ("sequence_parallel", lambda v: "--sequence-parallel" if v else "--no-sequence-parallel"))


def filled_in(before: Layout, after: Layout, change: str) -> list[str]:
    """The flags beside `change` on which `after` differs from `before` (the stack's defaults filled in again, e.g. an
    interleaved schedule once recompute frees the memory for it); a schedule only where there is a pipeline."""
    out = []
    for field, flag in _FILLED:
        value = getattr(after, field)
        if value != getattr(before, field) and not change.startswith(flag(value).split()[0]) \
                and (after.pp > 1 or field not in ("schedule", "vpp")):
            out.append(flag(value))
    return out


def _fitting(job: Job, layout: Layout, named: frozenset[str]) -> Estimate | None:
    """The estimate `estimate` gives for `layout` with `named` knobs as given and the rest filled in, if the job's
    framework runs it and it fits, else None."""
    fw = get_framework(job.framework)
    try:  # the checks `estimate` runs on a layout given on the command line
        validate_layout(layout, job.model, job.train.global_batch, seq_len=job.train.seq_len,
                        edge_chunks=fw.edge_chunks, split_rule=fw.stage_split)
        layout = complete_layout(job, layout, named)[0]
        check_sequence_split(layout, job.model, job.train.seq_len)
        check_runs(job, layout)
    except UsageError:
        return None
    est = estimate(job, layout)
    return est if est.fits else None


def _option(change: str, est: Estimate, before: Layout, dropped: list[str] = ()) -> dict:
    """One fit option as `estimate` reports it; `dropped`: the command's flags the change needs taken out."""
    memory = round(est.memory_per_gpu / GIB, 3)  # as estimate --json reports it (both names: the second is estimate's)
    return {"change": change, "memory_gib": memory, "memory_gib_per_gpu": memory, "step_time_s": round(est.step_time, 6),
            "filled_in": filled_in(before, est.layout, change), "dropped": list(dropped)}
