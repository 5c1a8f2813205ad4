"""The planner's decision in the seed article's terms, with numbers.

Questions answered, in order: does the model fit one GPU (M_model vs M_GPU)? what forces TP and why
this degree (heads, node size, link)? why this PP degree and micro-batch count (bubble)? what DP
buys? what the runner-up costs?
"""

from __future__ import annotations

from shardwise.planner.estimate import GIB, Estimate
from shardwise.planner.memory import Job
from shardwise.planner.search import SearchResult
from shardwise.units import seconds


def _knobs(e: Estimate) -> str:
    lay = e.layout
    parts = [lay.describe(), lay.schedule if lay.pp > 1 else "no pipeline", f"ZeRO-{lay.zero}",
             f"{lay.recompute} recompute"]
    if lay.sequence_parallel:
        parts.append("SP")
    return ", ".join(parts)


def _best_by(result: SearchResult, key) -> dict:
    best: dict = {}
    for e in result.ranked:  # fastest first
        best.setdefault(key(e.layout), e)
    return best


def _compare(best: dict, chosen: int, winner: Estimate, name: str) -> str:
    others = []
    for value, e in sorted(best.items()):
        if value != chosen:
            others.append(f"{name}={value}: {seconds(e.step_time)} (+{e.step_time / winner.step_time - 1:.0%})")
    return "; ".join(others[:4]) if others else f"no other {name} degree fits"


def explain(job: Job, gpus: int, result: SearchResult) -> list[str]:
    """Paragraphs (one string each) explaining why the winner wins."""
    model, cluster, train = job.model, job.cluster, job.train
    win = result.ranked[0]
    lay = win.layout
    n = model.num_params()
    states = n * train.bytes_per_param
    m_gpu = cluster.gpu_memory_bytes
    out = []

    fits_one = states <= m_gpu
    out.append(
        f"Fit: M_model = {n / 1e9:.2f} B parameters x {train.bytes_per_param} B (bf16 weights {train.weight_bytes}, "
        f"fp32 gradients {train.grad_bytes}, fp32 master + Adam moments {train.optimizer_bytes}) = "
        f"{states / GIB:.1f} GiB {'<=' if fits_one else '>'} M_GPU = {m_gpu / GIB:.0f} GiB. "
        + ("The model states fit one GPU, so plain data parallelism is possible; any split below is chosen for speed or for activations."
           if fits_one else
           f"It does not fit one GPU: the model must be split (TP, PP) or its states sharded (ZeRO) over at least "
           f"{-(-states // m_gpu):.0f} GPUs' memory before activations.")
    )

    allowed = [t for t in (1, 2, 4, 8, 16, 32, 64) if model.num_heads % t == 0 and model.num_kv_heads % t == 0
               and gpus % t == 0]
    link = "NVLink (inside one node)" if lay.tp <= cluster.gpus_per_node else "the inter-node network"
    tp_share = win.time_s["tp_comm"] / win.step_time
    by_tp = _best_by(result, lambda l: l.tp)
    out.append(
        f"TP = {lay.tp}: tp must divide the {model.num_heads} attention heads and {model.num_kv_heads} KV heads "
        f"(possible here: {', '.join(map(str, allowed))}); a node has {cluster.gpus_per_node} GPUs, so tp <= "
        f"{cluster.gpus_per_node} keeps its per-layer collectives on NVLink "
        f"({cluster.intra_node_bandwidth / 1e9:.0f} GB/s vs {cluster.inter_node_bandwidth / 1e9:.0f} GB/s per GPU across nodes). "
        f"This layout's TP traffic runs on {link} and costs {seconds(win.time_s['tp_comm'])} ({tp_share:.0%} of the step). "
        f"Best step at other degrees: {_compare(by_tp, lay.tp, win, 'tp')}."
    )

    m = win.num_microbatches
    bubble = win.time_s["pipeline_bubble"] / win.step_time
    by_pp = _best_by(result, lambda l: l.pp)
    if lay.pp > 1:
        out.append(
            f"PP = {lay.pp} ({lay.schedule}{f', {lay.vpp} virtual stages per rank' if lay.vpp > 1 else ''}): each rank holds "
            f"about {model.num_layers / lay.pp:.1f} of the {model.num_layers} layers; with {m} micro-batches of "
            f"{lay.micro_batch} sequence(s) the bubble is {seconds(win.time_s['pipeline_bubble'])} ({bubble:.1%} of the step). "
            f"Best step at other degrees: {_compare(by_pp, lay.pp, win, 'pp')}."
        )
    else:
        out.append(
            f"PP = 1: no pipeline, so no bubble; {m} micro-batch(es) of {lay.micro_batch} sequence(s) accumulate "
            f"gradients. Best step with a pipeline: {_compare(by_pp, lay.pp, win, 'pp')}."
        )

    mem = win.memory_bytes
    out.append(
        f"DP = {lay.dp}: {lay.dp} replicas each take {train.global_batch // lay.dp} of the {train.global_batch} sequences, "
        f"so the step needs 1/{lay.dp} of the compute per GPU; the exposed gradient traffic costs "
        f"{seconds(win.time_s['dp_comm'])}. ZeRO-{lay.zero} leaves weights {mem['weights'] / GIB:.1f} GiB, gradients "
        f"{mem['gradients'] / GIB:.1f} GiB and optimizer states {mem['optimizer'] / GIB:.1f} GiB per GPU; activations "
        f"take {mem['activations'] / GIB:.1f} GiB ({lay.recompute} recompute). Total {win.memory_per_gpu / GIB:.1f} of "
        f"{m_gpu / GIB:.0f} GiB on pipeline rank {win.worst_rank}."
    )

    split = (lay.dp, lay.tp, lay.pp)
    other = next((e for e in result.ranked if (e.layout.dp, e.layout.tp, e.layout.pp) != split), None)
    variants = [e for e in result.ranked if (e.layout.dp, e.layout.tp, e.layout.pp) == split]
    if len(variants) > 1:
        spread = variants[-1].step_time / win.step_time - 1
        out.append(f"Variants of the same dp{lay.dp}·tp{lay.tp}·pp{lay.pp} split (micro-batch, virtual stages, schedule, "
                   f"ZeRO, recompute): {len(variants)} fit, the slowest {spread:+.0%}; the closest is "
                   f"{_knobs(variants[1])} (+{variants[1].step_time / win.step_time - 1:.2%}).")
    if other is not None:
        out.append(
            f"Runner-up split: {_knobs(other)} at {seconds(other.step_time)}/step ({other.step_time / win.step_time - 1:+.1%}), "
            f"{other.memory_per_gpu / GIB:.1f} GiB/GPU, MFU {other.mfu:.1%}. "
            f"Winner: {_knobs(win)} at {seconds(win.step_time)}/step, {win.tokens_per_s:,.0f} tokens/s, MFU {win.mfu:.1%}."
        )
    else:
        out.append(f"Only one dp x tp x pp split fits: {_knobs(win)}.")
    return out


def summary(job: Job, gpus: int, result: SearchResult) -> list[str]:
    """The short 'why' printed under `plan`'s table: where the winner's step goes, and the runner-up."""
    win = result.ranked[0]
    t = win.time_s
    share = {k: v / win.step_time for k, v in t.items()}
    line = (f"{_knobs(win)}: {win.memory_per_gpu / GIB:.1f} of {job.cluster.gpu_memory_gib:.0f} GiB per GPU; "
            f"of its {seconds(win.step_time)} step, compute {share['compute'] + share['recompute']:.0%}, "
            f"TP traffic {share['tp_comm']:.1%}, pipeline bubble + transfers "
            f"{share['pipeline_bubble'] + share['pp_p2p']:.1%}, DP traffic {share['dp_comm']:.1%}; MFU {win.mfu:.1%}.")
    return [line] + explain(job, gpus, result)[-1:]
