"""Enumerate every dp x tp x pp layout and its knobs, score the ones worth scoring, rank them.

Pruning (each rule removes only layouts another scored layout beats on both memory and time,
in this model — docs/planner.md explains each):
  * tp divides the attention heads, the KV heads and the FFN; pp*vpp <= layers; dp*micro_batch
    divides the global batch; interleaving needs m % pp == 0 (Megatron's rule).
  * sequence parallelism is only considered with tp > 1 (on and off: it stores and touches less,
    but its backward gathers each saved sequence shard again, one more all-gather per layer half).
  * ZeRO-0 only when dp == 1 (ZeRO-1 moves the same bytes with less memory and a shorter
    optimizer step); ZeRO stages beyond the first that fits are slower and not scored.
  * recompute: for each level the cheapest fitting ZeRO stage is scored; a level that needs an
    equal or higher stage than a cheaper level already scored is dominated.
  * memory is checked before time (memory is cheaper to compute).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from shardwise.errors import UsageError
from shardwise.planner.estimate import GIB, Estimate, estimate
from shardwise.planner.memory import FRAGMENTATION, WORKSPACE_BYTES, Job, memory_breakdown, total_bytes
from shardwise.specs import Layout, divisors

SEARCH_SCHEDULES = ("gpipe", "1f1b", "zb-h1")
RECOMPUTE_ORDER = ("none", "selective", "full")


@dataclass(frozen=True)
class SearchSpace:
    """Which knobs the search may turn (None: every valid value). The user narrows it from the CLI."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE_ORDER
    schedules: tuple[str, ...] = SEARCH_SCHEDULES + ("interleaved-1f1b",)
    max_vpp: int | None = None

    def zero_stages(self, dp: int) -> tuple[int, ...]:
        """ZeRO stages worth scoring: none matters without dp; ZeRO-0 only where ZeRO-1 is not allowed
        (it moves the same bytes with more memory and a longer optimizer step)."""
        if dp == 1:
            return (0,)
        allowed = tuple(z for z in (0, 1, 2, 3) if z in self.zero)
        return allowed[1:] if allowed[:2] == (0, 1) else allowed


@dataclass
class SearchResult:
    ranked: list[Estimate]  # fitting layouts, fastest first
    scored: int  # layouts whose memory was computed
    timed: int  # layouts whose step time was computed
    leanest: Estimate | None  # smallest memory per GPU seen (for "nothing fits")


def _schedules(pp: int, num_layers: int, m: int, space: SearchSpace = SearchSpace()):
    if pp == 1:
        yield "1f1b", 1
        return
    for s in SEARCH_SCHEDULES:
        if s in space.schedules:
            yield s, 1
    if m % pp == 0 and "interleaved-1f1b" in space.schedules:
        for v in range(2, min(num_layers // pp, space.max_vpp or num_layers) + 1):
            yield "interleaved-1f1b", v


def degrees(job: Job, gpus: int, space: SearchSpace = SearchSpace()):
    """(tp, pp, dp) triples that respect the model's shape, the global batch and the search space."""
    model, batch = job.model, job.train.global_batch
    for tp in divisors(gpus):
        if model.num_heads % tp or model.num_kv_heads % tp or model.ffn_hidden % tp:
            continue
        if space.tp is not None and tp not in space.tp:
            continue
        for pp in divisors(gpus // tp):
            dp = gpus // (tp * pp)
            if pp <= model.num_layers and batch % dp == 0 and (space.pp is None or pp in space.pp):
                yield tp, pp, dp


def search(job: Job, gpus: int, space: SearchSpace = SearchSpace()) -> SearchResult:
    if gpus < 1:
        raise UsageError(f"--gpus must be at least 1, got {gpus}")
    limit = job.cluster.gpu_memory_bytes
    ranked: list[Estimate] = []
    scored = timed = 0
    leanest: tuple[float, Layout] | None = None
    for tp, pp, dp in degrees(job, gpus, space):
        for mb in divisors(job.train.global_batch // dp):
            if space.micro_batch is not None and mb not in space.micro_batch:
                continue
            m = job.train.global_batch // (dp * mb)
            for (schedule, vpp), sp in itertools.product(_schedules(pp, job.model.num_layers, m, space), (True, False)[tp == 1:]):
                base = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, vpp=vpp, schedule=schedule, sequence_parallel=sp)
                best_zero = 4  # lowest ZeRO stage that fit with a cheaper recompute level
                for recompute in (r for r in RECOMPUTE_ORDER if r in space.recompute):
                    for zero in space.zero_stages(dp):
                        if zero >= best_zero:
                            break
                        layout = base.with_(zero=zero, recompute=recompute)
                        mem = total_bytes(memory_breakdown(job, layout)[1])
                        scored += 1
                        if leanest is None or mem < leanest[0]:
                            leanest = (mem, layout)
                        if mem <= limit:
                            ranked.append(estimate(job, layout))
                            timed += 1
                            best_zero = zero
                            break
    ranked.sort(key=lambda e: (e.step_time, e.memory_per_gpu))
    return SearchResult(ranked=ranked, scored=scored, timed=timed,
                        leanest=estimate(job, leanest[1]) if leanest else None)


def nothing_fits_message(job: Job, gpus: int, result: SearchResult, space: SearchSpace = SearchSpace()) -> str:
    """One line: what fits nowhere, by how much, and what would make it fit."""
    limit = job.cluster.gpu_memory_gib
    if result.leanest is None:
        return (f"no valid layout of {job.model.name} on {gpus} GPUs with global batch {job.train.global_batch} — "
                f"use a GPU count whose divisors match the {job.model.num_heads} heads and a global batch divisible by the data-parallel degree")
    lean = result.leanest
    need = lean.memory_per_gpu / GIB
    # Model states shard over every GPU at best (ZeRO-3 x TP x PP); what else the leanest layout
    # needs per GPU (activations, logits, workspace) does not shrink with more GPUs.
    states_total = job.model.num_params() * job.train.bytes_per_param
    other = lean.memory_bytes["activations"] + lean.memory_bytes["logits"]
    room = (job.cluster.gpu_memory_bytes - WORKSPACE_BYTES) / (1 + FRAGMENTATION) - other
    hint = ""
    if room > 0:
        want = math.ceil(states_total / room)
        per_node = job.cluster.gpus_per_node
        want = max(gpus + 1, per_node * math.ceil(want / per_node))
        hint = f"use about {want} GPUs, "
    if space != SearchSpace():
        hint = "widen the search (--tp, --pp, --zero, --recompute, ...), " + hint
    return (f"nothing fits: the leanest layout ({lean.layout.describe()}, ZeRO-{lean.layout.zero}, "
            f"{lean.layout.recompute} recompute) needs {need:.1f} GiB per GPU but a GPU has {limit:.0f} GiB — "
            f"{hint}a smaller global batch or sequence length, or a cluster with more memory per GPU")
