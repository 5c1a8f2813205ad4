"""Enumerate every dp x tp x pp x cp layout and its knobs, score the ones worth scoring, rank them.

Pruning (each rule removes only layouts another scored layout beats on both memory and time,
in this model — docs/planner.md explains each):
  * tp divides the attention heads, the KV heads and the FFN; pp*vpp <= layers (+ 2 where the stack gives
    the embedding and the loss a chunk each: stage_split.max_chunks); dp*micro_batch
    divides the global batch; interleaving needs m % pp == 0 (Megatron's rule).
  * sequence parallelism is only considered with tp > 1, on and off as the framework allows (it
    stores and touches less, but its backward gathers each saved sequence shard again, one more
    all-gather per column-parallel group).
  * ZeRO-0 only when dp == 1, unless the framework's ZeRO-1 is not a reduce-scatter + all-gather
    (ZeRO-1 then moves the same bytes as ZeRO-0 with less memory and a shorter optimizer step).
    Every ZeRO stage that fits is scored: a higher stage is not always slower (DeepSpeed's ZeRO-2
    gathers the updated weights after the step, exposed; its ZeRO-3 gathers hide behind compute).
  * recompute: a costlier level at the same ZeRO stage is never faster (the compute it adds is at
    least the exposed communication it could hide), so a level is scored only at ZeRO stages below
    the lowest one a cheaper level fits at (higher stages fit with the cheaper level too). Where full
    recompute fits, and so none did not, it is scored with the fewest layers per chunk recomputed that
    fit (--recompute-layers: recomputing fewer is faster, by the same rule). Full recompute of only some
    layers lies between none and full: on a stack that runs it, it is scored at every stage below the
    lowest one that fits without recompute, FSDP's ZeRO-3 beside its ZeRO-2 (the memory a higher stage
    frees buys fewer recomputed layers).
  * context parallelism: cp divides the GPUs left by tp and pp and cuts the sequence into 2*cp equal
    zig-zag chunks; by default only cp that leave every rank at least MIN_CP_TOKENS tokens of each
    sequence: below that a sequence is short enough to split the batch instead (DP), and a ring hop
    (proportional to the tokens per rank) stops hiding behind its block's attention (proportional to
    their square) as soon as it crosses a node — shorter shards are scored when --cp asks for them.
    Ring or all-gather: the two store the same bytes and compute the same blocks, so only the one with
    less exposed K/V traffic is scored.
  * layouts the job's framework cannot run (frameworks.Framework.refusal) are skipped.
  * memory is checked before time (memory is cheaper to compute).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Callable

from shardwise.errors import InputError, UsageError
from shardwise.forked import map_pieces, worker_count
from shardwise.planner.estimate import GIB, Estimate, estimate, fewest_recomputed, stack_refusal
from shardwise.planner.frameworks import get as get_framework
from shardwise.planner.job import Job, compiled, unfused_fix
from shardwise.planner.memory import fits_memory, memory_breakdown, total_bytes
from shardwise.specs import PLANNED_SCHEDULES, RECOMPUTE, Layout, divisors, splits_over_tp
from shardwise.stage_split import max_chunks

SEARCH_SCHEDULES = tuple(s for s in PLANNED_SCHEDULES if s != "interleaved-1f1b")  # one chunk per rank
RECOMPUTE_ORDER = RECOMPUTE
# Limits that keep every answer within seconds (each is refused in one line, with the fix, before any work):
MAX_GPUS = 2**20  # more GPUs than any cluster built
PRUNE_MICRO_BATCHES = True  # skip micro-batches above one whose leanest layout did not fit (tested: same ranking)
MOE_COST = 3  # a mixture-of-experts layout costs 2-3 times a dense one to score (per-layer expert terms)
MAX_CANDIDATES = 6_000  # split x micro-batch x schedule x vpp x SP combinations one search scores (0.1-0.2 ms each)
MIN_CP_TOKENS = 4096  # tokens of each sequence per rank, for cp searched by default (see above)


@dataclass(frozen=True)
class SearchSpace:
    """Which knobs the search may turn (None: every valid value). The user narrows it from the CLI."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    # ZeRO stages, recompute policies and sequence parallelism (None: what the stack runs, for_stack)
    zero: tuple[int, ...] | None = None
    recompute: tuple[str, ...] | None = None
    sequence_parallel: tuple[bool, ...] | None = None
    schedules: tuple[str, ...] = PLANNED_SCHEDULES
    max_vpp: int | None = None
    # Only virtual-stage counts that split each rank's layers evenly (Megatron's classic rule, num_layers %
    # (pp * vpp) == 0): the search turns this on itself when the full space exceeds MAX_CANDIDATES.
    even_vpp: bool = False
    cp: tuple[int, ...] | None = None  # None: 1 and every cp that leaves MIN_CP_TOKENS tokens per rank
    cp_modes: tuple[str, ...] = ("ring", "allgather")
    ep: tuple[int, ...] | None = None  # expert-parallel degrees (MoE models)
    # the launch file the plan is for (--emit): a layout its target cannot express fits no purpose, so the GPU count
    # "nothing fits" suggests is one where a layout it can express fits (emit.problem)
    emit: str = ""

    def narrowed(self) -> bool:
        """Whether the user restricted any knob (the order of a list does not matter)."""
        full = SearchSpace()
        return (self.tp is not None or self.pp is not None or self.micro_batch is not None or self.max_vpp is not None
                or self.cp is not None or set(self.cp_modes) != set(full.cp_modes)
                or self.ep is not None
                or (self.zero is not None and set(self.zero) != {0, 1, 2, 3})
                or (self.recompute is not None and set(self.recompute) != set(RECOMPUTE_ORDER))
                or self.sequence_parallel is not None or set(self.schedules) != set(full.schedules))

    def for_stack(self, fw) -> SearchSpace:
        """The knobs left open filled in for the stack: every option it runs, or, for a stack searched as its own
        defaults (Framework.search_as_unnamed: megatron-2021, whose ZeRO-1, selective recompute and sequence
        parallelism were a later release's opt-in flags), what estimate fills in when they are not named."""
        own = fw.search_as_unnamed
        zero = self.zero or (fw.unnamed_zero if own and fw.unnamed_zero else (0, 1, 2, 3))
        recompute = self.recompute or tuple(r for r in RECOMPUTE_ORDER
                                            if not (own and fw.unnamed_recompute) or r in fw.unnamed_recompute)
        return replace(self, zero=zero, recompute=recompute, sequence_parallel=self.sequence_parallel_for(fw))

    def sequence_parallel_for(self, fw) -> tuple[bool, ...] | None:
        """for_stack's sequence parallelism alone (None: whatever the stack runs), without building a space."""
        return self.sequence_parallel or ((False,) if fw.search_as_unnamed and not fw.unnamed_sequence_parallel
                                          else None)

    def zero_stages(self, dp: int, framework=None) -> tuple[int, ...]:
        """ZeRO stages worth scoring: none matters without dp; those the framework runs; ZeRO-0 only where
        ZeRO-1 is not allowed or is not a reduce-scatter + all-gather (which moves the same bytes as ZeRO-0's
        all-reduce with less memory and a shorter optimizer step)."""
        if dp == 1:
            return (0,)
        runs = framework.zero_stages if framework is not None else (0, 1, 2, 3)
        allowed = tuple(z for z in (0, 1, 2, 3) if z in self.zero and z in runs)
        reduce_scatter = framework is None or framework.zero1 == "reduce_scatter"
        return allowed[1:] if allowed[:2] == (0, 1) and reduce_scatter else allowed


@dataclass
class SearchResult:
    ranked: list[Estimate]  # fitting layouts, fastest first
    scored: int  # layouts whose memory was computed
    timed: int  # layouts whose step time was computed
    leanest: Estimate | None  # smallest memory per GPU seen (for "nothing fits")
    refused: str = ""  # why the framework refused the first layout it could not run (for "nothing fits")
    thinned: str = ""  # how the search narrowed a space too large to score in full (printed under the table)


def _schedules(pp: int, num_layers: int, m: int, space: SearchSpace, fw):
    """(schedule, vpp) pairs worth scoring for a pp-stage pipeline of m micro-batches under stack `fw`: the
    space's schedules; interleaving where m is a multiple of pp and the stack interleaves this deep a pipeline
    (Framework.min_interleaved_pp), at each depth `_vpps` allows. The schedules the stack lacks are left out where it
    runs one of the space's (their refusals would hide the reason its own schedules cannot run: "nothing fits" names
    the first), else yielded so that their refusal names them."""
    if pp == 1:
        yield "1f1b", 1
        return
    runs_one = any(s in fw.schedules for s in space.schedules)
    wanted = [s for s in space.schedules if s in fw.schedules or not runs_one]
    for s in SEARCH_SCHEDULES:
        if s in wanted:
            yield s, 1
    if m % pp == 0 and "interleaved-1f1b" in wanted and pp >= fw.min_interleaved_pp:
        for v in _vpps(num_layers, pp, space, fw):
            yield "interleaved-1f1b", v


def _vpps(num_layers: int, pp: int, space: SearchSpace, fw) -> range | list[int]:
    """Virtual stages per rank worth trying: 2 up to the layers per rank, or where the stack gives the embedding and
    the loss a chunk's slot each (Framework.edge_chunks) up to those slots per rank (and --max-vpp). Even: every
    chunk the same layers, or the same slots."""
    most = max_chunks(num_layers, fw.edge_chunks)
    vpps = range(2, min(most // pp, space.max_vpp or most) + 1)
    if fw.even_stages_only:  # a stack that cuts equal chunks only, whatever --all-variants says
        return [v for v in vpps if num_layers % (pp * v) == 0]
    if fw.vpp_divides_layers:  # a stack that deals the layers to its chunks in equal runs
        vpps = [v for v in vpps if num_layers % v == 0]
    if not space.even_vpp:
        return vpps
    return [v for v in vpps if num_layers % (pp * v) == 0 or (fw.edge_chunks and most % (pp * v) == 0)]
def cp_allowed(job: Job, cp: int, space: SearchSpace = SearchSpace()) -> bool:
    """Whether the search tries context-parallel degree `cp` (1 unless --cp excludes it; see MIN_CP_TOKENS)."""
    s = job.train.seq_len
    if cp == 1:
        return space.cp is None or 1 in space.cp
    fw = get_framework(job.framework)
    if s % (2 * cp) or not any(m in fw.context_parallel for m in space.cp_modes):
        return False
    if fw.attention_refusal(Layout(cp=cp), job.flash_attention):
        return False
    return cp in space.cp if space.cp is not None else s // cp >= MIN_CP_TOKENS


def expert_degrees(job: Job, dp: int, tp: int, space: SearchSpace = SearchSpace(), cp: int = 1) -> list[int]:
    """The ep values worth scoring for a dp x tp split: divisors of the experts that fold over dp*tp*cp ranks
    (each layout then splits its experts as the stack does unasked: Framework.default_etp). [1] for a dense model."""
    model = job.model
    if not model.is_moe or not get_framework(job.framework).expert_parallel:
        return [1]
    ranks = dp * tp * cp
    return [e for e in divisors(model.num_experts) if ranks % e == 0 and (space.ep is None or e in space.ep)]


def tp_fits(model, tp: int, fw) -> bool:
    """tp divides the heads, the KV heads (or the stack replicates them: Framework.kv_refusal), the dense FFN (where
    a layer has one) and a shared expert."""
    dense = len(model.moe_layers) < model.num_layers
    return not (model.num_heads % tp or fw.kv_refusal(model.num_kv_heads, tp) or (dense and model.ffn_hidden % tp)
                or model.shared_ffn_hidden % tp)


def degrees(job: Job, gpus: int, space: SearchSpace = SearchSpace()):
    """(tp, pp, dp, cp) that respect the model's shape, the sequence, the global batch, the search space and a
    framework without tensor or pipeline parallelism (tp or pp 1 only)."""
    model, batch, fw = job.model, job.train.global_batch, get_framework(job.framework)
    most = max_chunks(model.num_layers, fw.edge_chunks)  # stages, as estimate allows them (specs.check_chunks)
    for tp in divisors(gpus):
        if not tp_fits(model, tp, fw) or (tp > 1 and not fw.tensor_parallel):
            continue
        if space.tp is not None and tp not in space.tp:
            continue
        for pp in divisors(gpus // tp):
            if pp > most or (space.pp is not None and pp not in space.pp) or (pp > 1 and not fw.schedules):
                continue
            if pp > 1 and not fw.cuts(model.num_layers, pp):  # a stack that cuts equal stages only
                continue
            for cp in divisors(gpus // (tp * pp)):
                dp = gpus // (tp * pp * cp)
                if batch % dp == 0 and cp_allowed(job, cp, space):
                    yield tp, pp, dp, cp


def cp_modes_to_score(job: Job, layout: Layout, space: SearchSpace = SearchSpace()) -> list[str]:
    """The context-parallel modes a cp > 1 layout is scored in: those the stack runs and the space allows, each a
    candidate of its own (ring and all-gather differ in exposed K/V traffic, in the attention kernel's blocks and in
    the K/V they hold: no one term picks the faster that fits); a cp 1 layout keeps its own."""
    if layout.cp == 1:
        return [layout.cp_mode]
    return [m for m in space.cp_modes if m in get_framework(job.framework).context_parallel] or list(space.cp_modes)[:1]


def _sp_options(job: Job, fw, tp: int, cp: int, space: SearchSpace = SearchSpace()) -> tuple[bool, ...]:
    """Sequence parallelism off and/or on, as the framework allows and the space asks; on only where tp divides each
    rank's tokens."""
    if tp == 1:  # no sequence to shard: none where the space asks for sequence parallelism only
        return () if space.sequence_parallel == (True,) else (False,)
    asked = space.sequence_parallel_for(fw)
    sps = (True,) if _sp_required(job, fw) or (fw.sequence_parallel == "default" and asked is None) else \
        {"never": (False,)}.get(fw.sequence_parallel, (True, False))
    sps = tuple(sp for sp in sps if asked is None or sp in asked or _sp_required(job, fw))
    return tuple(sp for sp in sps if not sp or splits_over_tp(job.train.seq_len, tp, cp))  # none where SP is a must but cannot split


def _sp_required(job: Job, fw) -> str:
    """Why every tp > 1 layout of this job runs sequence parallelism ('' when it need not): the stack always does, or
    TP comm overlap runs on sequence-parallel activations (estimate.complete_layout implies SP for both)."""
    if fw.sequence_parallel == "always":
        return f"--framework {fw.name} always shards the sequence with TP"
    return f"{fw.name}'s TP comm overlap runs on sequence-parallel activations" if job.tp_comm_overlap else ""


def count_candidates(job: Job, gpus: int, space: SearchSpace = SearchSpace()) -> int:
    """How many (split, micro-batch, schedule, vpp, SP) combinations `search` would score, counted without
    scoring (the framework's schedules and SP rule included)."""
    fw = get_framework(job.framework)
    return sum(_split_candidates(job, fw, space, *split) for split in degrees(job, gpus, space))


def _split_candidates(job: Job, fw, space: SearchSpace, tp: int, pp: int, dp: int, cp: int) -> int:
    """count_candidates of one dp x tp x pp x cp split."""
    batch, layers, total = job.train.global_batch, job.model.num_layers, 0
    if fw.trains_fp32(Layout(dp=dp, tp=tp, pp=pp, cp=cp)):  # every layout of the split refused
        return 0
    sp_variants = len(_sp_options(job, fw, tp, cp, space))
    for mb in micro_batches(job, fw, dp, pp, space):
        m = batch // (dp * mb)
        shapes = 1 if pp == 1 else sum(s in fw.schedules for s, _ in _schedules(pp, layers, m, space, fw))
        total += shapes * sp_variants * len(expert_degrees(job, dp, tp, space, cp))
    return total


def micro_batches(job: Job, fw, dp: int, pp: int, space: SearchSpace) -> list[int]:
    """The micro-batches (sequences) `search` scores on a dp-way split, ascending: the divisors of a rank's sequences
    that --micro-batch allows; all of them at once, one micro-batch a step, on a stack without gradient accumulation
    outside a pipeline (Framework.accumulates)."""
    per_rank = job.train.global_batch // dp
    sizes = divisors(per_rank) if fw.accumulates or pp > 1 else [per_rank]
    return [mb for mb in sizes if space.micro_batch is None or mb in space.micro_batch]


def check_gpus(gpus: int, command: str) -> None:
    """--gpus between 1 and MAX_GPUS, or one UsageError line; `command` (plan, estimate) is what the fix tells to do."""
    if gpus < 1:
        raise InputError(f"--gpus must be at least 1, got {gpus}")
    if gpus > MAX_GPUS:
        raise UsageError(f"--gpus {gpus:,} is above {MAX_GPUS:,}, the most shardwise plans for — {command} a part of "
                         f"the cluster (layouts repeat across identical parts)")


def schedules_refusal(job: Job, space: SearchSpace) -> str:
    """For a command line that narrowed --schedules to ones the job's stack runs none of: why, in one line ("" otherwise).
    `search` itself would answer with pipeline-free layouts only, not what was asked for."""
    fw = get_framework(job.framework)  # (a stack without pipelines runs pp 1 whatever the schedules: nothing to narrow)
    if set(space.schedules) == set(SearchSpace().schedules) or not fw.schedules \
            or any(k in fw.schedules for k in space.schedules):
        return ""
    return (f"--schedules {','.join(space.schedules)}: --framework {fw.name} runs none of them (it runs "
            f"{', '.join(fw.schedules)}) — add one of those, or pick another --framework")


def _no_data_parallelism(space: SearchSpace, gpus: int) -> bool:
    """Whether every split the space allows runs without data or context parallelism (tp x pp = the GPUs, cp 1):
    ZeRO shards over nothing, and every stack runs such a layout as ZeRO-0."""
    if set(space.cp or (1,)) != {1} and gpus > 1:
        return False
    return all(t * p == gpus for t in space.tp or divisors(gpus) for p in space.pp or divisors(gpus)
               if gpus % (t * p) == 0)


def check_search(job: Job, gpus: int, space: SearchSpace = SearchSpace()) -> tuple[SearchSpace, str]:
    """The space to score and, when it had to be narrowed to fit MAX_CANDIDATES, how; UsageError for a search
    that is impossible or too large even then, before any scoring."""
    check_gpus(gpus, "plan")
    space = space.for_stack(get_framework(job.framework))
    for flag, values in (("--ep", space.ep), ("--tp", space.tp), ("--pp", space.pp), ("--micro-batch", space.micro_batch), ("--cp", space.cp)):
        if values is not None and min(values) < 1:
            raise InputError(f"{flag} values must be at least 1, got {','.join(map(str, values))}")
    if space.ep is not None and any(e > 1 for e in space.ep) and not job.model.is_moe:
        raise UsageError(f"--ep {','.join(map(str, space.ep))}: expert parallelism splits experts, but {job.model.name} "
                         f"has no experts — drop --ep or plan a mixture-of-experts model")
    if space.ep is not None and any(e > 1 for e in space.ep) and not get_framework(job.framework).expert_parallel:
        raise UsageError(f"--ep {','.join(map(str, space.ep))}: {job.framework} has no expert parallelism — drop --ep "
                         f"or pick a --framework that runs it (megatron-core, nemo, torchtitan, deepspeed)")
    bad = [z for z in space.zero if z not in (0, 1, 2, 3)]
    if bad or not space.zero:
        raise UsageError(f"--zero {','.join(map(str, space.zero))}: ZeRO stages are 0, 1, 2 and 3 — pick from those")
    runs = get_framework(job.framework).zero_stages
    # else only layouts without data parallelism would be left, named ZeRO-0 — unless those are all the job has, where
    # every stack runs ZeRO-0's step whatever stage is named (estimate says so; plan's winner_note too)
    if not set(space.zero) & set(runs) and not _no_data_parallelism(space, gpus):
        raise UsageError(f"--zero {','.join(map(str, space.zero))}: {job.framework} has no "
                         f"{' or '.join(f'ZeRO-{z}' for z in space.zero)} (it runs ZeRO {', '.join(map(str, runs))}) — "
                         f"pick from those or another --framework")
    if space.max_vpp is not None and space.max_vpp < 1:
        raise InputError(f"--max-vpp must be at least 1, got {space.max_vpp}")
    required = _sp_required(job, get_framework(job.framework))
    if space.sequence_parallel == (False,) and required and any(t > 1 for t in (space.tp or divisors(gpus))):
        # as estimate refuses it (planner/framework.py), not a filter the stack would quietly ignore
        fix = ("add --no-tp-comm-overlap" if job.tp_comm_overlap and get_framework(job.framework).sequence_parallel
               != "always" else "pick a --framework with plain TP (megatron-core)")
        raise UsageError(f"--no-sequence-parallel: {required} — drop --no-sequence-parallel, allow only --tp 1, or "
                         f"{fix}")
    n = count_candidates(job, gpus, space)
    if n == 0:
        raise UsageError(no_layout_message(job, gpus, space))
    most = MAX_CANDIDATES // (MOE_COST if job.model.is_moe else 1)
    if n <= most:
        return space, ""
    # Narrower and narrower, each step keeping what large runs use: even virtual stages (Megatron's classic
    # rule), at most 4 of them, micro-batches of 1-8 sequences, experts spread over 8 GPUs or more, then fewer
    # micro-batch sizes and virtual stages, then power-of-two tp and pp. A step that would leave no layout (60 experts
    # on a power-of-two cluster fold over no ep >= 8) is passed over. Knobs the user narrowed stay theirs.
    mbs = space.micro_batch or (1, 2, 4, 8)
    steps = [("virtual-stage counts that split the layers evenly", dict(even_vpp=True)),
             ("at most 4 of them", dict(max_vpp=min(space.max_vpp or 4, 4))),
             ("micro-batches of 1, 2, 4 or 8 sequences", dict(micro_batch=mbs))]
    if job.model.is_moe and space.ep is None:  # large MoE runs spread their experts over 8 GPUs or more
        steps.append(("expert parallelism of 8 or more",
                      dict(ep=tuple(e for e in divisors(job.model.num_experts) if e >= 8))))
    steps.append(("at most 2 virtual stages" if space.micro_batch else "micro-batches of 1 or 2 and at most 2 virtual stages",
                  dict(micro_batch=space.micro_batch or (1, 2), max_vpp=min(space.max_vpp or 2, 2))))
    if space.tp is None and space.pp is None:
        steps.append(("tp of 1-8 and pp of 1-16, powers of two", dict(tp=(1, 2, 4, 8), pp=(1, 2, 4, 8, 16))))
    narrower, taken = space, []
    for text, change in steps:
        trial = replace(narrower, **change)
        if trial == narrower:  # a knob the user narrowed already
            continue
        k = count_candidates(job, gpus, trial)
        if k == 0:
            continue
        narrower, taken = trial, taken + [text]
        if k <= most:
            return narrower, (f"{n:,} candidate layouts are more than the {most:,} searched in one go, so only "
                              f"{'; '.join(taken)} were searched ({k:,} candidates, each scored at its ZeRO stages and "
                              f"recompute policies); --tp/--pp/--max-vpp/--micro-batch narrow it your way")
    raise UsageError(f"this search spans {n:,} candidate layouts, more than the {most:,} shardwise searches in one go — "
                     f"narrow it, e.g. {_narrowing_example(job, gpus, space, most)}")


def _narrowing_example(job: Job, gpus: int, space: SearchSpace, most: int) -> str:
    """Flags that bring this search within `most` layouts (the first of a ladder of narrower ones that does, else
    the narrowest), with expert-parallel degrees this MoE job can run (8 and 16 where it can)."""
    ladder = [dict(tp=(1, 2, 4, 8), pp=(1, 2, 4, 8, 16), max_vpp=4, micro_batch=(1, 2, 4)),
              dict(tp=(1, 2, 4, 8), pp=(1, 2, 4, 8, 16), max_vpp=2, micro_batch=(1, 2)),
              dict(tp=(1, 2, 4, 8), pp=(1, 2, 4, 8), max_vpp=2, micro_batch=(1,)),
              dict(tp=(1, 2, 4, 8), pp=(1, 2, 4, 8), max_vpp=1, micro_batch=(1,))]
    if job.model.is_moe and space.ep is None:
        eps = sorted({e for tp, _, dp, cp in degrees(job, gpus, space) for e in expert_degrees(job, dp, tp, space, cp)
                      if e > 1})
        pick = tuple(e for e in eps if e in (8, 16)) or tuple(eps[-2:])
        ladder = [step | dict(ep=pick) for step in ladder] + ([dict(ladder[-1], ep=pick[-1:])] if pick else [])
    for step in ladder:
        if 0 < count_candidates(job, gpus, replace(space, **step)) <= most:
            break
    flags = {"tp": "--tp", "pp": "--pp", "max_vpp": "--max-vpp", "micro_batch": "--micro-batch", "ep": "--ep"}
    return " ".join(f"{flags[k]} {','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in step.items()
                    if v != ())


def no_layout_message(job: Job, gpus: int, space: SearchSpace = SearchSpace()) -> str:
    """Why no dp x tp x pp split exists for this job and search space: the first knob with no valid value."""
    model, batch = job.model, job.train.global_batch
    tps = [t for t in divisors(gpus) if tp_fits(model, t, get_framework(job.framework))]
    if space.tp is not None:
        if not [t for t in tps if t in space.tp]:
            return (f"--tp {','.join(map(str, space.tp))}: tp must divide the {gpus} GPUs, the {model.num_heads} attention heads, "
                    f"{model.num_kv_heads} KV heads and FFN size {model.ffn_hidden} of {model.name} — possible: "
                    f"{', '.join(map(str, tps))}")
        tps = [t for t in tps if t in space.tp]
    fw = get_framework(job.framework)
    if not fw.tensor_parallel and 1 not in tps:
        return f"--framework {fw.name} has no tensor parallelism — allow tp 1, or pick another --framework"
    tps = [t for t in tps if t == 1 or fw.tensor_parallel]
    most = max_chunks(model.num_layers, fw.edge_chunks)  # stages, as estimate allows them (specs.check_chunks)
    pairs = [(t, p) for t in tps for p in divisors(gpus // t) if p <= most and fw.cuts(model.num_layers, p)]
    if space.pp is not None:
        allowed = sorted({p for _, p in pairs})
        pairs = [(t, p) for t, p in pairs if p in space.pp]
        if not pairs:
            cut = (f"divide the {model.num_layers} layers of {model.name} ({fw.name} cuts equal stages only)"
                   if fw.even_stages_only else f"be at most the {model.num_layers} layers of {model.name}"
                   + (" + 2 (the embedding's and the loss's own stages)" if fw.edge_chunks else ""))
            return (f"--pp {','.join(map(str, space.pp))}: pp must divide the GPUs left by tp and {cut} — possible "
                    f"here: {', '.join(map(str, allowed))}")
    if not fw.schedules and all(p > 1 for _, p in pairs):
        return f"--framework {fw.name} has no pipeline parallelism — allow pp 1, or pick another --framework"
    pairs = [(t, p) for t, p in pairs if p == 1 or fw.schedules]  # what the stack can split: its dp follows
    # the cp degrees the user listed leave their own dp (a cp that divides nothing is named below); a cp the stack or
    # the sequence cannot run leaves none, and is the first cause where every one is such
    cps = [c for c in space.cp or (1,) if cp_allowed(job, c, space)]
    if not cps:
        return _cp_or_schedule_cause(job, gpus, space, pairs) or (
            f"--cp {','.join(map(str, space.cp))}: none of these context-parallel degrees runs here — drop --cp")
    dps = sorted({gpus // (t * p * c) for t, p in pairs for c in cps if (gpus // (t * p)) % c == 0})
    if dps and not any(batch % dp == 0 for dp in dps):
        per = "tp*pp*cp" if space.cp else "tp*pp"
        return (f"global batch {batch} is not divisible by any data-parallel degree dp = gpus/({per}) possible here "
                f"({', '.join(map(str, dps[:8]))}{', ...' if len(dps) > 8 else ''}) — use a global batch that is a multiple "
                f"of {dps[0]}, or another GPU count")
    per_rank = sorted({batch // dp for dp in dps if batch % dp == 0})
    if space.micro_batch is not None and per_rank and not any(n % mb == 0 for n in per_rank for mb in space.micro_batch):
        return (f"--micro-batch {','.join(map(str, space.micro_batch))}: a micro-batch must divide the sequences each "
                f"data-parallel rank takes ({', '.join(map(str, per_rank[:8]))}{', ...' if len(per_rank) > 8 else ''}) — pick a divisor")
    if space.micro_batch is not None and per_rank and not fw.accumulates and not set(per_rank) & set(space.micro_batch):
        return (f"--micro-batch {','.join(map(str, space.micro_batch))}: --framework {fw.name} runs one micro-batch per "
                f"optimizer step (no gradient accumulation), so a micro-batch is all the sequences a data-parallel rank "
                f"takes ({', '.join(map(str, per_rank[:8]))}{', ...' if len(per_rank) > 8 else ''}) — pick one of those")
    if model.is_moe and space.ep is not None:
        splits = list(degrees(job, gpus, space))
        if splits and not any(expert_degrees(job, dp, tp, space, cp) for tp, _, dp, cp in splits):
            every = replace(space, ep=None)
            possible = sorted({e for tp, _, dp, cp in splits for e in expert_degrees(job, dp, tp, every, cp)})
            return (f"--ep {','.join(map(str, space.ep))}: ep must divide the {model.num_experts} experts of {model.name} "
                    f"and the dp*tp*cp ranks of a split — possible here: {', '.join(map(str, possible))}")
    splits = list(degrees(job, gpus, space))
    if splits and all(fw.trains_fp32(Layout(dp=d, tp=t, pp=p, cp=c)) for t, p, d, c in splits):
        widen = "widen the search (--tp, --pp, --cp, ...), " if space.narrowed() else ""
        return f"--framework {fw.name} cannot run any layout the search allows: {fw.amp_refusal()} — {widen}or pick another --framework"
    cause = _cp_or_schedule_cause(job, gpus, space, pairs)
    if cause:
        return cause
    cut = (f"pp*vpp dividing the {model.num_layers} layers ({fw.name} cuts equal chunks only)" if fw.even_stages_only
           else f"pp*vpp at most the {model.num_layers} layers{' + 2' if fw.edge_chunks else ''}")
    deep = f", and pp of at least {fw.min_interleaved_pp} on {fw.name}" if fw.min_interleaved_pp > 2 else ""
    others = " or ".join(s for s in SEARCH_SCHEDULES if s in fw.schedules and s not in space.schedules) or "1f1b"
    if space.max_vpp == 1:  # the searched depths start at 2 (search.py: one chunk a rank interleaves nothing)
        return (f"no schedule in --schedules {','.join(space.schedules)} can run these pipelines: --max-vpp 1 leaves "
                f"interleaved-1f1b one model chunk a rank, which interleaves nothing — raise --max-vpp or add {others}")
    return (f"no schedule in --schedules {','.join(space.schedules)} can run these pipelines (interleaved-1f1b needs the "
            f"micro-batch count to be a multiple of pp, {cut}{deep}) — add {others}")


def _cp_or_schedule_cause(job: Job, gpus: int, space: SearchSpace, pairs) -> str:
    """No split left because of --cp (it must divide the GPUs left by tp*pp and cut each sequence into 2*cp equal
    chunks, in a context-parallel mode the framework runs) or because the framework runs none of --schedules."""
    fw, seq = get_framework(job.framework), job.train.seq_len
    if space.cp is not None and not any(c == 1 for c in space.cp):
        if not any(m in fw.context_parallel for m in space.cp_modes):
            runs = " and ".join(fw.context_parallel) or "no context parallelism"
            return (f"--cp {','.join(map(str, space.cp))}: --framework {fw.name} runs {runs} (--cp-modes "
                    f"{','.join(space.cp_modes)}) — drop --cp, or pick another --framework")
        no_cp = fw.attention_refusal(Layout(cp=2), job.flash_attention, unfused_fix(job))
        if no_cp:
            return f"--cp {','.join(map(str, space.cp))}: {no_cp}"
        possible = sorted({c for t, p in pairs for c in divisors(gpus // (t * p))
                           if c > 1 and seq % (2 * c) == 0 and job.train.global_batch % (gpus // (t * p * c)) == 0})
        if not any(c in possible for c in space.cp):
            return (f"--cp {','.join(map(str, space.cp))}: cp must divide the GPUs left by tp*pp ({gpus} GPUs), cut each "
                    f"sequence into 2*cp equal chunks (--seq-len {seq}) and leave a dp that divides the global batch — "
                    f"possible here: {', '.join(map(str, [1, *possible]))}")
    tps = ', '.join(sorted({str(t) for t, _ in pairs}, key=int))
    if space.sequence_parallel == (True,) and not any(_sp_options(job, fw, t, 1, space) for t, _ in pairs):
        if fw.sequence_parallel == "never":
            return (f"--sequence-parallel: --framework {fw.name} has no sequence parallelism — drop --sequence-parallel, "
                    f"or pick a --framework that runs it")
        if all(t == 1 for t, _ in pairs):
            return "--sequence-parallel shards the sequence over tp ranks, but --tp allows only 1 — allow a tp above 1"
        return (f"--sequence-parallel: it splits each sequence over tp, but --seq-len {seq} is not divisible by tp "
                f"{', '.join(sorted({str(t) for t, _ in pairs if t > 1}, key=int))} — use a multiple of tp, or drop "
                f"--sequence-parallel")
    if all(t > 1 and not _sp_options(job, fw, t, 1) for t, _ in pairs):
        return (f"{_sp_required(job, fw)}, which splits each sequence over tp, but --seq-len {seq} is not divisible by "
                f"tp {tps} — use a multiple of tp, or allow tp 1")
    if all(t > 1 for t, _ in pairs) and not fw.tensor_parallel:
        return f"--framework {fw.name} has no tensor parallelism — allow tp 1, or pick another --framework"
    if all(p > 1 for _, p in pairs) and not fw.schedules:
        return f"--framework {fw.name} has no pipeline parallelism — allow pp 1, or pick another --framework"
    if all(p > 1 for _, p in pairs) and not any(s in fw.schedules for s in space.schedules):
        return (f"--schedules {','.join(space.schedules)}: --framework {fw.name} runs none of them (it runs "
                f"{', '.join(fw.schedules)}) — add one of those, or pick another --framework")
    return ""


def node_shard_groups(job: Job, layout: Layout, fw) -> Layout | None:
    """The HSDP twin of a ZeRO-3 layout on a stack that runs it: one shard group per node (its dp ranks), replicated
    across nodes; None where that is the layout itself or not a layout."""
    group = job.cluster.gpus_per_node // (layout.tp * layout.cp)
    # (a group of one rank, dp_shard x cp, shards nothing: that is DDP, not HSDP)
    if layout.zero != 3 or not fw.hybrid_shard or group < 1 or group * layout.cp < 2 or layout.dp <= group \
            or layout.dp % group:
        return None
    return layout.with_(dp_shard=group)


class _FitChecks:
    """Whether the layouts of one base (split, micro-batch, schedule, SP, ep) fit, each checked once. Under selective
    recompute of the attention core alone (Megatron's), a layout without recompute holds the same bytes plus the
    attention scores (memory.stage_activation_bytes; nothing else in a rank's breakdown depends on the policy, and
    every later sum rounds monotonically), so where the selective twin does not fit, neither does it: that twin is
    checked first, and its answer kept for the selective pass, which checks it next."""

    def __init__(self, job: Job, fw, space: SearchSpace):
        self.job, self.known = job, {}
        self.bounded = ("selective" in space.recompute and "selective" in fw.recompute and job.selective != "op"
                        and not job.recompute_modules)

    def __call__(self, layout: Layout) -> bool:
        key = (layout.zero, layout.recompute)
        if key not in self.known:
            if layout.recompute == "none" and self.bounded and not self(layout.with_(recompute="selective")):
                self.known[key] = False
            else:
                self.known[key] = fits_memory(self.job, layout)
        return self.known[key]


def search(job: Job, gpus: int, space: SearchSpace = SearchSpace(), workers: int | None = None,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Every layout the job's framework can run (frameworks.py), scored as the module docstring says; over
    `workers` processes (None: as many as pay, forked.worker_count), with the same result as one. `progress(taken,
    total)`: told as the dp x tp x pp x cp splits are taken (forked.map_pieces' on_piece)."""
    space, thinned = check_search(job, gpus, space)
    fw = get_framework(job.framework)
    splits = list(degrees(job, gpus, space))
    costs = [_split_candidates(job, fw, space, *split) for split in splits]
    n = worker_count(workers, sum(costs), PARALLEL_CANDIDATES)
    tally = _Tally(job, fw, space)
    for parts in _tallies(tally, splits, costs, n, progress):
        tally.absorb(parts)
    return tally.result(thinned)


# A search this large is split over processes (forked.map_pieces): each process scores one split at a time, the
# costliest left (by its count of candidate base layouts), and sends back what each found; the parent absorbs them in
# split order — ranked, counted and refused exactly as one process would. Below it, a fork costs more than it saves (a
# candidate base layout takes ~1.5 ms to score on one core); 405B on 16,384 H100s is 934 (torchtitan) to 1,382
# (megatron-core).
PARALLEL_CANDIDATES = 400


def _tallies(tally: "_Tally", splits: list, costs: list[int], n: int,
             progress: Callable[[int, int], None] | None = None) -> list[tuple]:
    """What each split found (tally.run per split), in split order, over n processes."""
    return map_pieces(lambda split: tally.run([split]), splits, costs, n, progress)


class _Tally:
    """What one search has found so far: the ranked estimates, its counts, the first refusal, the leanest layout."""

    def __init__(self, job: Job, fw, space: SearchSpace):
        self.job, self.fw, self.space = job, fw, space
        self.ranked: list[Estimate] = []
        self.scored = self.timed = 0
        self.refused = ""
        self.leanest: tuple[float, Layout] | None = None  # of the layouts that fit (any is leaner than one that does not)
        self.unfit: list[Layout] = []  # checked and too large, in order: the leanest of them is named when nothing fits
        # Full recompute of only some layers lies between none and full: scored where full fits and none did not.
        self.partly = {"none", "full"} <= set(space.recompute) and bool(fw.partial_recompute)

    def run(self, splits: list) -> tuple:
        """Score these (tp, pp, dp, cp) splits from a fresh start; what they found (absorb's parts)."""
        for tp, pp, dp, cp in splits:
            _search_split(self, tp, pp, dp, cp)
        parts = (self.ranked, self.scored, self.timed, self.refused, self.leanest, self.unfit)
        self.ranked, self.scored, self.timed, self.refused, self.leanest, self.unfit = [], 0, 0, "", None, []
        return parts

    def absorb(self, parts: tuple) -> None:
        """Add what a later run of splits found, as if this tally had scored them itself, in order."""
        ranked, scored, timed, refused, leanest, unfit = parts
        self.ranked += ranked
        self.scored += scored
        self.timed += timed
        self.refuse(refused)
        if leanest is not None and (self.leanest is None or leanest[0] < self.leanest[0]):
            self.leanest = leanest
        self.unfit += unfit

    def refuse(self, why: str | None) -> None:
        self.refused = self.refused or why or ""  # the first reason is the one reported

    def score(self, layout: Layout, fits: _FitChecks) -> bool:
        """Check one layout's memory; time it, and its node-sharded twin, when it fits. Whether it fit."""
        job = self.job
        self.scored += 1
        if not fits(layout):
            self.unfit.append(layout)
            return False
        mem = total_bytes(memory_breakdown(job, layout)[1])
        if self.leanest is None or mem < self.leanest[0]:
            self.leanest = (mem, layout)
        # none did not fit here; fewer recomputed layers may, and are faster (as a cheaper level)
        partial = fewest_recomputed(job, layout) if layout.recompute == "full" and self.partly else None
        self._time(partial or layout)
        hybrid = node_shard_groups(job, layout, self.fw)
        self.scored += hybrid is not None
        if hybrid and fits_memory(job, hybrid):
            self._time(hybrid)
        return True

    def _time(self, layout: Layout) -> None:
        self.ranked.append(estimate(self.job, layout))
        self.timed += 1

    def result(self, thinned: str) -> SearchResult:
        job, leanest = self.job, self.leanest
        if leanest is None and self.unfit:  # nothing fits: the first of the smallest, as if every breakdown were compared
            leanest = min(((total_bytes(memory_breakdown(job, lay)[1]), lay) for lay in self.unfit), key=lambda x: x[0])
        self.ranked.sort(key=lambda e: (e.step_time, e.memory_per_gpu))
        return SearchResult(ranked=self.ranked, scored=self.scored, timed=self.timed,
                            leanest=estimate(job, leanest[1]) if leanest else None, refused=self.refused,
                            thinned=thinned)


def _search_split(tally: _Tally, tp: int, pp: int, dp: int, cp: int) -> None:
    """Every micro-batch, schedule, SP and ep of one dp x tp x pp x cp split."""
    job, space = tally.job, tally.space
    too_big = set()  # (schedule, vpp, SP, ep) whose leanest layout did not fit at a smaller micro-batch
    for mb in micro_batches(job, tally.fw, dp, pp, space):  # ascending
        m = job.train.global_batch // (dp * mb)
        if m == 1 and tally.fw.fsdp_no_sync:  # one micro-batch a step: no unsharded gradients held across them
            too_big.clear()
        for (schedule, vpp), sp, ep in itertools.product(_schedules(pp, job.model.num_layers, m, space, tally.fw),
                                                         _sp_options(job, tally.fw, tp, cp, space),
                                                         expert_degrees(job, dp, tp, space, cp)):
            # Memory never shrinks as the micro-batch grows (activations: mb x micro-batches in flight, which
            # is mb x min(p, m) or the whole B/dp; logits: mb): what did not fit at a smaller one is skipped. Except
            # under FSDP's no_sync(), whose unsharded gradients go once a step is one micro-batch (cleared above).
            if PRUNE_MICRO_BATCHES and (schedule, vpp, sp, ep) in too_big:
                continue
            base = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, vpp=vpp, schedule=schedule, sequence_parallel=sp, cp=cp,
                          ep=ep)
            base = base.with_(etp=tally.fw.default_etp(job.model, base))  # as the stack splits the experts unasked
            tried = [_search_base(tally, base.with_(cp_mode=mode), m)
                     for mode in cp_modes_to_score(job, base, space)]
            measured, fitted = any(t[0] for t in tried), any(t[1] for t in tried)
            if measured and not fitted:
                too_big.add((schedule, vpp, sp, ep))


def _search_base(tally: _Tally, base: Layout, m: int) -> tuple[bool, bool]:
    """Every recompute level and ZeRO stage of one base layout worth scoring (the module docstring's recompute rule):
    (whether any was checked for memory, whether any fit)."""
    fw, space = tally.fw, tally.space
    fits = _FitChecks(tally.job, fw, space)
    stages = space.zero_stages(base.dp * base.cp, fw)  # ZeRO shards over dp x cp
    if not stages and base.dp * base.cp > 1 and space.zero:  # only stages the framework cannot run: say which
        tally.refuse(fw.refusal(base.with_(zero=space.zero[0]), tally.job.model.num_layers))
    measured = fitted = False
    best_zero = 4  # lowest ZeRO stage that fit with a cheaper recompute level
    without = 4  # the same, without recompute: full recompute of only some layers lies between none and full (score)
    for recompute in (r for r in RECOMPUTE_ORDER if r in space.recompute):
        lowest = None
        # partial full recompute can undercut selective: it answers only to the stages where no recompute fit
        partial = recompute == "full" and tally.partly
        limit = without if partial else best_zero
        for zero in stages:
            if zero >= limit:
                break
            layout = base.with_(zero=zero, recompute=recompute)
            why = stack_refusal(tally.job, layout)
            if why:
                tally.refuse(why)
                continue
            measured = True
            if not tally.score(layout, fits):
                continue
            fitted = True
            lowest = zero if lowest is None else lowest
            if not fw.gather_per_tensor and (zero == 2 or zero == 1 and m > 1) and not partial:
                # FSDP's ZeRO-3 is its ZeRO-2 plus a re-gather per layer in backward; past the
                # distributed optimizer (ZeRO-1: one reduce-scatter and one all-gather a step),
                # FSDP's ZeRO-2 gathers and reduce-scatters every micro-batch: never faster (at the same recompute;
                # under partial full recompute the memory a higher stage frees buys fewer recomputed layers)
                break
        if lowest is not None:
            best_zero = min(best_zero, lowest)
            without = lowest if recompute == "none" else without
    return measured, fitted


def _emit_refusal(target: str, job: Job, layout: Layout) -> str | None:
    """Why the --emit target cannot express `layout` (shardwise.emit.problem), or None (no target)."""
    if not target:
        return None
    from shardwise.emit import problem  # (emit reads the planner's records: imported where a target is named)

    return problem(target, job, layout)


EMIT_COUNTS_TRIED = 256  # GPU counts above the asked one tried for a fit under an --emit target's limits


def fitting_gpu_count(job: Job, gpus: int, space: SearchSpace = SearchSpace(), limit: int = MAX_GPUS) -> int | None:
    """About the smallest GPU count above `gpus` that the layout rules can use (whole nodes, a tp dividing the heads,
    a dp dividing the global batch) and at which a lean layout of the search space fits (`_lean_fits`); None where
    no count up to `limit` does (a stack that cannot shard its weights over dp: more GPUs never shrink them below
    what its largest tp x pp leaves)."""
    counts = [n for n in usable_gpu_counts(job) if gpus < n <= limit]
    if space.emit:  # a target's limits (no TP beside DeepSpeed's pipeline) leave the largest count's extreme split out:
        # fitting is no longer monotone there, so the nearest counts are tried in turn
        return next((n for n in counts[:EMIT_COUNTS_TRIED] if _lean_fits(job, n, space)), None)
    if not counts or not _lean_fits(job, counts[-1], space):
        return None
    lo, hi = 0, len(counts) - 1  # more GPUs shard the states further: bisect for the first count that fits
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _lean_fits(job, counts[mid], space) else (mid + 1, hi)
    return counts[lo]


def usable_gpu_counts(job: Job) -> list[int]:
    """Every GPU count `degrees` yields a split for (tp x pp x cp x dp), ascending: whole nodes above one node."""
    model, fw, per_node = job.model, get_framework(job.framework), job.cluster.gpus_per_node
    tps = [t for t in divisors(model.num_heads) if tp_fits(model, t, fw) and (t == 1 or fw.tensor_parallel)]
    pps = [p for p in range(1, max_chunks(model.num_layers, fw.edge_chunks) + 1)
           if p == 1 or (fw.schedules and fw.cuts(model.num_layers, p))]
    cps = [c for c in divisors(job.train.seq_len) if cp_allowed(job, c)]
    counts = {t * p * c * d for t, p, c in itertools.product(tps, pps, cps) for d in divisors(job.train.global_batch)}
    return sorted(n for n in counts if n <= per_node or n % per_node == 0)


def _lean_fits(job: Job, gpus: int, space: SearchSpace) -> bool:
    """Whether some split of the search space over `gpus` GPUs fits at its leanest: the smallest micro-batch the
    search would score (a stack without gradient accumulation takes a rank's whole share at once), the highest ZeRO
    stage the stack runs on that split (a pipeline may cap it: Framework.max_zero_with_pp) and the most recompute
    the search would try, each sequence-parallel option, the experts spread over the widest expert-parallel degree."""
    fw = get_framework(job.framework)
    stack = space.for_stack(fw)
    recomputes = [r for r in reversed(RECOMPUTE_ORDER) if r in stack.recompute and r in fw.recompute]
    for tp, pp, dp, cp in degrees(job, gpus, space):
        mb = min(micro_batches(job, fw, dp, pp, stack), default=None)
        if mb is None:
            continue
        ep = max(expert_degrees(job, dp, tp, stack, cp), default=1)  # the experts spread their widest
        for recompute, sp in itertools.product(recomputes, _sp_options(job, fw, tp, cp, stack)):
            for zero in sorted(stack.zero_stages(dp * cp, fw), reverse=True) or [0]:
                layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch=mb, zero=zero, recompute=recompute,
                                sequence_parallel=sp, ep=ep)
                layout = layout.with_(etp=fw.default_etp(job.model, layout),
                                      cp_mode=cp_modes_to_score(job, layout, stack)[0])
                if stack_refusal(job, layout) or _emit_refusal(space.emit, job, layout):
                    continue
                if fits_memory(job, layout):
                    return True
                break  # the highest ZeRO stage the stack runs here is its leanest
    return False


def nothing_fits_message(job: Job, gpus: int, result: SearchResult, space: SearchSpace = SearchSpace()) -> str:
    """One line: what fits nowhere, by how much, and what would make it fit."""
    limit = job.cluster.gpu_memory_gib
    widen = "widen the search (--tp, --pp, --zero, --recompute, ...), " if space.narrowed() else ""
    if result.leanest is None and result.refused:
        return (f"--framework {job.framework} cannot run any layout the search allows: {result.refused.split(' — ')[0]} — "
                f"{widen}or pick another --framework")
    if result.leanest is None:
        return no_layout_message(job, gpus, space)
    lean = result.leanest
    need = lean.memory_per_gpu / GIB
    if need <= limit and job.offload:  # the GPUs hold it: what --offload puts on the hosts overfills them
        return (f"nothing fits: the leanest layout ({lean.layout.describe()}, ZeRO-{lean.layout.zero}) fits the GPUs "
                f"but its offloaded states need {lean.host_bytes / GIB:,.0f} GiB of CPU memory a node, and a node has "
                f"{lean.host_capacity / GIB:,.0f} GiB — more GPUs (smaller shards), "
                f"{'--offload optimizer, ' if job.offload == 'params' else ''}or a cluster file with more host_memory_gib")
    want = fitting_gpu_count(job, gpus, space)
    fixes = [widen.removesuffix(", ")] if widen else []
    fw = get_framework(job.framework)
    fixes += [f"--zero {z}" for z in [_zero_that_fits(job, lean.layout, fw)] if z is not None]
    fixes += [f"use about {want} GPUs"] if want else []
    if 3 not in fw.zero_stages and job.train.global_batch > 1:
        fixes.append("a framework that shards the weights (--framework torchtitan or deepspeed: ZeRO-3)")
    if fw.compiles and not job.compile and not fw.compile_refusal() and estimate(compiled(job), lean.layout).fits:
        fixes.append("--compile (the leanest layout fits compiled: its loss and blocks keep less)")
    # where the weights, gradients and optimizer states alone overfill a GPU, fewer tokens would not make it fit
    states = sum(lean.memory_bytes.get(k, 0.0) for k in ("weights", "gradients", "optimizer")) / GIB
    fixes += ["a smaller global batch or sequence length"] if states <= limit else []
    fixes.append("a cluster with more memory per GPU")
    return (f"nothing fits: the leanest layout ({lean.layout.describe()}, ZeRO-{lean.layout.zero}, "
            f"{lean.layout.recompute_phrase()}) needs {need:.1f} GiB per GPU but a GPU has {limit:.3g} GiB — "
            f"to make it fit: {either(fixes)}")


def _zero_that_fits(job: Job, layout: Layout, fw) -> int | None:
    """The lowest ZeRO stage above the leanest layout's that the stack runs on it and that makes it fit (a stage its
    search leaves out unless named: megatron-2021's distributed optimizer), or None."""
    if layout.dp * layout.cp == 1:  # nothing to shard over
        return None
    for zero in sorted(z for z in fw.zero_stages if z > layout.zero):
        bigger = layout.with_(zero=zero)
        if not stack_refusal(job, bigger) and estimate(job, bigger).fits:
            return zero
    return None


def either(options: list[str]) -> str:
    """'a, b, or c' (one option alone as it is)."""
    return options[0] if len(options) == 1 else f"{', '.join(options[:-1])}, or {options[-1]}"
