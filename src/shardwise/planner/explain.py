"""The planner's decision in the seed article's terms, with numbers.

Questions answered, in order: does the model fit one GPU (M_model vs M_GPU)? what forces TP and why
this degree (heads, node size, link)? why this PP degree and micro-batch count (bubble)? what DP
buys? what the runner-up costs?
"""

from __future__ import annotations

from dataclasses import replace

from shardwise.planner import published_check
from shardwise.planner.comm import one_node, placement
from shardwise.planner.estimate import GIB, Estimate, assumptions, checked_gpu, estimate
from shardwise.planner.frameworks import get as get_framework
from shardwise.planner.job import Job
from shardwise.planner.overlap import fp8_gathered
from shardwise.planner.search import SearchResult, tp_fits
from shardwise.planner.step_time import (HOST_FLOOR_KEYS, attention_flops_per_step, flop_params, host_bound_note,
                                         model_flops_per_step)
from shardwise.specs import TrainSpec, divisors
from shardwise.units import count, gib, params, seconds


def _knobs(e: Estimate) -> str:
    lay = e.layout
    parts = [lay.describe(), lay.schedule if lay.pp > 1 else "no pipeline", f"ZeRO-{lay.zero}",
             lay.recompute_phrase()]
    if lay.cp > 1:  # two layouts may differ by it alone (ring against all-gather attention)
        parts.append(f"{lay.cp_mode} CP")
    if lay.tp > 1:  # two layouts may differ by it alone
        parts.append("SP" if lay.sequence_parallel else "no SP")
    return ", ".join(parts)


def _split(lay) -> str:
    return (f"dp{lay.dp}·tp{lay.tp}·pp{lay.pp}" + (f"·cp{lay.cp}" if lay.cp > 1 else "")
            + (f"·ep{lay.ep}" if lay.ep > 1 else ""))


def _best_by(result: SearchResult, key) -> dict:
    best: dict = {}
    for e in result.ranked:  # fastest first
        best.setdefault(key(e.layout), e)
    return best


def _compare(best: dict, chosen: int, winner: Estimate, name: str) -> str:
    # the four fastest other degrees (the runner-up's among them), in degree order
    nearest = sorted(sorted((e.step_time, v) for v, e in best.items() if v != chosen)[:4], key=lambda x: x[1])
    others = [f"{name}={v}: {seconds(t)} (+{t / winner.step_time - 1:.1%})" for t, v in nearest]
    left = len(best) - 1 - len(nearest)
    if others:
        return "; ".join(others) + (f" ({left} slower degree{'s' * (left > 1)} left out)" if left > 0 else "")
    return f"no other {name} degree in the search both runs on this stack and fits (estimate --{name} N says why for one)"


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
        f"Fit: M_model = {f'{n / 1e9:.2f} B' if n >= 1e8 else f'{n / 1e6:.2f} M'} parameters x {train.bytes_per_param} B ({_dtype(train.weight_bytes)} weights "
        f"{train.weight_bytes}, {_dtype(train.grad_bytes)} gradients {train.grad_bytes}, {_optimizer_states(train)} "
        f"{train.optimizer_bytes}) = "
        f"{states / GIB:.{1 if states >= GIB else 4}f} GiB {'<=' if fits_one else '>'} M_GPU = {m_gpu / GIB:.3g} GiB. "
        + ("The model states fit one GPU before activations, logits and workspace, so plain data parallelism is "
           "possible where those fit beside them; any split below is chosen for speed or for activations."
           if fits_one else
           f"It does not fit one GPU: the model must be split (TP, PP) or its states sharded (ZeRO) over at least "
           f"{-(-states // m_gpu):.0f} GPUs' memory before activations.")
    )

    out += [tp_paragraph(job, gpus, result), pp_paragraph(job, result, gpus)]

    cp_text = cp_paragraph(job, result)
    if cp_text:
        out.append(cp_text)

    mem = win.memory_bytes
    out.append(
        f"{_dp_sentence(lay, train.global_batch, win.time_s['dp_comm'])} ZeRO-{lay.zero} leaves weights {mem['weights'] / GIB:.1f} GiB"
        f"{_weight_copies(job)}, gradients "
        f"{mem['gradients'] / GIB:.1f} GiB and optimizer states {mem['optimizer'] / GIB:.1f} GiB per GPU; activations "
        f"take {mem['activations'] / GIB:.1f} GiB ({lay.recompute_phrase()})"
        + "".join(f", {key} {mem[key] / GIB:.1f} GiB" for key in mem  # what else the total holds: logits, workspace
                  if key not in ("weights", "gradients", "optimizer", "activations") and mem[key])
        + f". Total {win.memory_per_gpu / GIB:.1f} of "
        f"{m_gpu / GIB:.3g} GiB on pipeline rank {win.worst_rank}."
        + (f" Offloaded (--offload {win.offload}): {win.host_held()}; the host side of the step costs "
           f"{seconds(win.time_s['offload'])}." if win.offload else "")
    )

    if model.is_moe:
        out.append(experts_paragraph(job, result))

    variants = [e for e in result.ranked if e.layout.split == lay.split]
    if len(variants) > 1:
        spread = variants[-1].step_time / win.step_time - 1
        near = sum(e.step_time / win.step_time - 1 < MODEL_ERROR for e in variants[1:])
        ties = (f"; {'it is' if near == 1 else f'{near} of them are'} within the model's error (±{MODEL_ERROR:.0%}) "
                f"of the winner, which the model cannot tell apart from it: a tie, not a win" if near else "")
        out.append(f"Variants of the same {_split(lay)} split (micro-batch, virtual stages, schedule, "
                   f"ZeRO, recompute): {len(variants)} fit, the slowest {spread:+.1%}; the closest is "
                   f"{_knobs(variants[1])} (+{variants[1].step_time / win.step_time - 1:.2%}){ties}.")
    out.append(framework_paragraph(job, gpus))
    gather = fp8_gather_note(job, win)
    if gather:
        out.append(gather)
    out += uncertainty(job, result)
    record = plausibility(job, win)
    if record:
        out.append(record)
    elif counted := _unmasked_attention(job, win):  # not above a record: said on its own
        out.append(f"MFU's count: {counted}")
    out.append(runner_up(result))
    if result.thinned:  # the figures above are of the narrowed space: the user may find better by naming a knob
        out.append(f"Search narrowed: {result.thinned}. The winner and each best step at other degrees above are of "
                   f"that narrower space.")
    return out


def tp_paragraph(job: Job, gpus: int, result: SearchResult) -> str:
    """The winner's TP degree: what tp must divide, where its collectives run, the best step at other degrees."""
    model, cluster, win = job.model, job.cluster, result.ranked[0]
    lay, fw = win.layout, get_framework(job.framework)
    if not fw.tensor_parallel:  # the heads rule and other degrees mean nothing to a stack without TP
        return f"TP = 1: {fw.name} has no tensor parallelism; every GPU runs whole layers."
    allowed = [t for t in divisors(gpus) if tp_fits(model, t, fw)]
    kv = (" (or a multiple of them: it replicates them)" if fw.replicates_kv_heads and model.num_kv_heads < model.num_heads
          else "")
    link = ("NVLink (inside one node)" if one_node(cluster, lay.tp) else
            f"the inter-node network (groups of {lay.tp} do not tile nodes of {cluster.gpus_per_node}: some span two)"
            if lay.tp <= cluster.gpus_per_node else "the inter-node network")
    tp_share = win.time_s["tp_comm"] / win.step_time
    by_tp = _best_by(result, lambda l: l.tp)
    inside = "" if any(t > 1 and cluster.gpus_per_node % t == 0 for t in allowed) else \
        " (none of the possible tp > 1 here does)" if max(allowed, default=1) > 1 else ""
    nodes = ("one GPU runs the job, so nothing crosses a link" if gpus == 1 else
             f"a node has {cluster.gpus_per_node} GPUs, so a tp that divides {cluster.gpus_per_node} keeps its per-layer "
             f"collectives on NVLink ({cluster.intra_node_bandwidth / 1e9:g} GB/s datasheet vs "
             f"{cluster.inter_node_bandwidth / 1e9:g} GB/s per GPU across nodes){inside}" if cluster.gpus_per_node > 1 else
             "a node has one GPU, so any tp > 1 runs its per-layer collectives over the network")
    traffic = (f"This layout's TP traffic runs on {link} and costs {seconds(win.time_s['tp_comm'])} ({tp_share:.0%} of "
               f"the step)" if lay.tp > 1 else "This layout has no TP traffic: every GPU runs whole layers")
    others = ("No other tp degree is possible here" if len(allowed) <= 1 else
              f"Best step at other degrees: {_compare(by_tp, lay.tp, win, 'tp')}")
    return (
        f"TP = {lay.tp}: tp must divide the {model.num_heads} attention heads and {model.num_kv_heads} KV heads{kv} "
        f"(possible here: {', '.join(map(str, allowed))}); {nodes}. {traffic}. {others}."
    )


def pp_paragraph(job: Job, result: SearchResult, gpus: int = 0) -> str:
    """The winner's pipeline: its layers per rank and bubble, or why there is none; the best step at other degrees."""
    model, win = job.model, result.ranked[0]
    lay, m, fw = win.layout, win.num_microbatches, get_framework(job.framework)
    by_pp = _best_by(result, lambda l: l.pp)
    if lay.pp > 1:
        bubble = win.time_s["pipeline_bubble"] / win.step_time
        return (
            f"PP = {lay.pp} ({lay.schedule}{f', {lay.vpp} virtual stages per rank' if lay.vpp > 1 else ''}): each rank holds "
            f"about {model.num_layers / lay.pp:.1f} of the {model.num_layers} layers; with {m} micro-batches of "
            f"{count(lay.micro_batch, 'sequence')} the bubble is {seconds(win.time_s['pipeline_bubble'])} ({bubble:.1%} of the step; "
            f"{_bubble_formula(lay, m)}, simulated with each rank's own costs). "
            f"Best step at other degrees: {_compare(by_pp, lay.pp, win, 'pp')}."
        )
    others = (f"{fw.name} has no pipeline parallelism." if not fw.schedules else
              "One GPU has no pipeline to split over." if gpus <= 1 else
              f"Best step with a pipeline: {_compare(by_pp, lay.pp, win, 'pp')}.")
    return (f"PP = 1: no pipeline, so no bubble; {count(m, 'micro-batch')} of {count(lay.micro_batch, 'sequence')} "
            f"{'accumulate' if m > 1 else 'makes the step: no accumulation of'} "
            f"gradients. {others}")


def _bubble_formula(lay, m: int) -> str:
    """The textbook idle share of a pipeline of uniform stages, for the winner's schedule: (p - 1) / (m + p - 1) for
    GPipe and 1F1B (Huang et al. 2019; idle over the whole step), (p - 1) / (v m) of the compute for interleaved 1F1B
    (Narayanan et al. 2021), ZB-H1 about a third of 1F1B's (Qi et al. 2023)."""
    p, v = lay.pp, lay.vpp
    if lay.schedule == "interleaved-1f1b":
        return f"uniform stages give (p - 1) / (v m) = {p - 1}/({v}·{m}) = {(p - 1) / (v * m):.1%} of the compute"
    share = (p - 1) / (m + p - 1)
    if lay.schedule == "zb-h1":
        return f"about a third of 1F1B's (p - 1) / (m + p - 1) = {p - 1}/{m + p - 1} = {share:.1%}"
    return f"uniform stages give (p - 1) / (m + p - 1) = {p - 1}/{m + p - 1} = {share:.1%}"


def _split_cost(job: Job, win: Estimate, by_cp: dict) -> str:
    """What the fastest layout that splits the sequence adds to the winner's step, by its largest term: the K/V
    traffic, or compute where the stack's CP blocks run slower than its attention kernel (shardwise's runtime: FP32
    math blocks, memory.cp_math_blocks)."""
    from shardwise.planner.memory import cp_math_blocks

    split = min((e for cp, e in by_cp.items() if cp > 1), key=lambda e: e.step_time)
    added = {k: split.time_s.get(k, 0.0) - win.time_s.get(k, 0.0) for k in TERM_NAMES}
    term = max(added, key=added.get)
    said = f"at cp={split.layout.cp} mostly {TERM_NAMES[term]} (+{seconds(added[term])})"
    if term in ("compute", "recompute") and cp_math_blocks(job):
        said += f", as {job.framework}'s CP blocks run the attention as FP32 math, not a fused kernel"
    return said


def cp_paragraph(job: Job, result: SearchResult) -> str:
    """Context parallelism in the article's terms: why the sequence had to be split (activations per GPU),
    what the split costs (K/V traffic, and whether the compute hides it), the cp x tp <= node rule of thumb.
    Empty when neither the winner nor any ranked layout splits the sequence."""
    from shardwise.planner.memory import cp_kv_blocks, local_seq, memory_breakdown, torch_dkv_ring
    from shardwise.planner.layer_time import layer_cost

    win, c, s = result.ranked[0], job.cluster, job.train.seq_len
    lay = win.layout
    by_cp = _best_by(result, lambda l: l.cp)
    if lay.cp == 1:
        if len(by_cp) == 1:
            return ""
        return (f"CP = 1: one sequence of {s:,} tokens fits each GPU's activations unsplit "
                f"({win.memory_bytes['activations'] / GIB:.1f} GiB), so splitting it only adds cost: "
                f"{_split_cost(job, win, by_cp)}. Best step with the sequence split: {_compare(by_cp, 1, win, 'cp')}.")
    plain, where = _unsplit(job, lay)
    unsplit = memory_breakdown(job, plain)[1]
    fits_unsplit = sum(unsplit.values()) <= c.gpu_memory_bytes
    held = f"one sequence of {s:,} tokens" if plain.micro_batch == 1 else \
        f"its micro-batch of {plain.micro_batch} sequences of {s:,} tokens"
    why = (f"unsplit, {held} would keep {unsplit['activations'] / GIB:.1f} GiB of activations on "
           f"each GPU {where} ({sum(unsplit.values()) / GIB:.1f} of {c.gpu_memory_gib:.3g} GiB in all"
           + ("" if fits_unsplit else ": it does not fit") + ")")
    tokens = local_seq(job, lay)
    lc = layer_cost(job, lay)
    block = cp_kv_blocks(job, lay, lay.micro_batch * tokens)[0]
    kv = f"{job.model.num_kv_heads} KV heads for {job.model.num_heads} query heads" if job.model.num_kv_heads < job.model.num_heads \
        else "as many KV heads as query heads"
    if lay.cp_mode == "ring":
        how = (f"ring: each layer passes K/V blocks of {block / 1e6:.1f} MB ({kv}) cp - 1 = {lay.cp - 1} hops forward and "
               f"again with dK/dV backward, each hop behind 1/cp of the layer's attention "
               f"({seconds(lc.attn_fwd / lay.cp)} forward): " + (
                   "every hop hidden, forward and backward" if not lc.cp_fwd and not lc.cp_bwd else
                   f"exposed {seconds(lc.cp_fwd) if lc.cp_fwd else 'nothing'} forward and "
                   f"{seconds(lc.cp_bwd) if lc.cp_bwd else 'nothing'} backward per layer and micro-batch"))
    else:
        back = ("gathers again and passes dK/dV around the ring backward (torch's context parallelism)"
                if torch_dkv_ring(job) else "gathers again and reduce-scatters dK/dV backward")
        how = (f"all-gather: each layer gathers all {lay.cp} K/V blocks of {block / 1e6:.1f} MB ({kv}) once forward, and "
               f"{back}, in the open: {seconds(lc.cp_fwd + lc.cp_bwd)} per layer "
               f"and micro-batch (Llama 3's choice: with GQA the gathered K/V are small next to Q)")
    span = lay.cp * lay.tp
    rule = (f"cp x tp = {span} <= {c.gpus_per_node} GPUs per node keeps this traffic on NVLink"
            if one_node(c, lay.cp, lay.tp) else
            f"cp x tp = {span} in groups that do not tile nodes of {c.gpus_per_node}: some K/V traffic crosses nodes at "
            f"{c.inter_node_bandwidth / 1e9:g} GB/s per GPU" if span <= c.gpus_per_node else
            f"cp x tp = {span} > {c.gpus_per_node} GPUs per node: the rule of thumb cp x tp <= node breaks, the K/V "
            f"traffic crosses nodes at {c.inter_node_bandwidth / 1e9:g} GB/s per GPU" +
            (" — affordable while each hop stays shorter than the attention it hides behind, which grows with the tokens "
             "per rank" if lay.cp_mode == "ring" else ", in the open"))
    share = win.time_s.get("cp_comm", 0.0) / win.step_time
    return (f"CP = {lay.cp} ({lay.cp_mode}): {why}. Split over {lay.cp} ranks, each GPU keeps {tokens:,} tokens of every "
            f"sequence — chunks i and 2·cp−1−i of 2·cp, so the causal mask gives every rank the same attention work — "
            f"and {win.memory_bytes['activations'] / GIB:.1f} GiB of activations; gradients are averaged over dp x cp. "
            f"The cost is K/V traffic, {how}; {rule}. In all it costs {seconds(win.time_s.get('cp_comm', 0.0))} "
            f"({share:.1%} of the step). Best step at other degrees: {_compare(by_cp, lay.cp, win, 'cp')}.")


def _unsplit(job: Job, lay) -> tuple:
    """The winner without its sequence split, and where that layout runs: on the same GPUs with the cp ranks as
    data-parallel ones (ZeRO shards over the same dp x cp group) where the batch and the stack allow it, else the
    same dp x tp x pp on the fewer GPUs it takes."""
    from shardwise.errors import UsageError
    from shardwise.planner.estimate import check_runs
    from shardwise.specs import validate_layout

    folded = lay.with_(cp=1, dp=lay.dp * lay.cp)
    try:  # the layout rules every stack has (the batch over dp, interleaving's micro-batch count), then the stack's
        validate_layout(folded, job.model, job.train.global_batch, seq_len=job.train.seq_len,
                        edge_chunks=get_framework(job.framework).edge_chunks)
        check_runs(job, folded)
        return folded, "of this layout with its cp ranks as data-parallel ones"
    except UsageError:
        pass
    plain = lay.with_(cp=1)
    return plain, f"of {_split(plain)} (this layout without its cp ranks, {plain.world_size:,} GPUs)"


def experts_paragraph(job: Job, result: SearchResult) -> str:
    """Why the experts are split the way they are: what ep buys in memory, what its all-to-all costs and where
    it runs, against the best step at the other ep degrees."""
    model, cluster, win = job.model, job.cluster, result.ranked[0]
    lay = win.layout
    ranks = lay.dp * lay.tp * lay.cp
    local = model.num_experts // lay.ep
    states = lambda e: sum(e.memory_bytes[k] for k in ("weights", "gradients", "optimizer"))  # noqa: E731
    whole = estimate(job, lay.with_(ep=1, etp=1))
    group = lay.ep * lay.etp
    where = ("inside one node (NVLink)" if one_node(cluster, group) else
             f"across {placement(cluster, group, 1)[1]} nodes (the network, {cluster.inter_node_bandwidth / 1e9:g} GB/s per GPU)")
    a2a = win.time_s.get("ep_comm", 0.0)
    by_ep = _best_by(result, lambda l: l.ep)
    copies = ranks // group
    replicas = ("each one held once, with no replica to average its gradients with" if copies == 1 else
                f"and {copies} replicas of each average their gradients")
    against = f", against {gib(states(whole))} with every expert on every GPU (ep = 1)" if group > 1 else ""
    price = ("With every expert on every GPU, tokens never leave their GPU: no all-to-all." if group == 1 else
             f"The price: per MoE layer and micro-batch, four all-to-alls (dispatch and combine, forward and backward) "
             f"of {model.experts_per_token} x {model.hidden} activations per token, over {group} ranks {where}: "
             f"{seconds(a2a)} ({a2a / win.step_time:.1%} of the step, router balance {job.capacity_factor:g}x assumed; "
             f"--capacity-factor).")
    return (
        f"EP = {lay.ep}: {model.num_experts} experts in each of {len(model.moe_layers)} MoE layers, {model.experts_per_token} "
        f"per token, so a token uses {params(model.active_params())} of the {params(model.num_params())} parameters "
        f"(FLOPs and MFU count the {params(flop_params(model))} of them its matrix multiplications use: the LM head's, not the "
        f"embedding lookup's). The experts fold over the {ranks} dp x tp{' x cp' if lay.cp > 1 else ''} "
        f"ranks of a stage: each GPU holds {count(local, 'expert')} per layer{f', 1/{lay.etp} of each' if lay.etp > 1 else ''}, "
        f"{replicas}. That leaves {gib(states(win))} of weights, gradients and optimizer states per GPU"
        f"{against}. {price} Best step at other degrees: {_compare(by_ep, lay.ep, win, 'ep')}."
    )


def runner_up(result: SearchResult) -> str:
    """The best layout of another dp x tp x pp split against the winner; a tie when within the model's error."""
    win = result.ranked[0]
    other = next((e for e in result.ranked if e.layout.split != win.layout.split), None)
    if other is None:
        return f"Only one dp x tp x pp x cp x ep split fits: {_knobs(win)}."
    gap = other.step_time / win.step_time - 1
    verdict = (f"within the model's error (±{MODEL_ERROR:.0%}): a tie, not a win — pick either"
               if gap < MODEL_ERROR else f"{gap:+.1%}")
    return (f"Runner-up split: {_knobs(other)} at {seconds(other.step_time)}/step ({verdict}), "
            f"{other.memory_per_gpu / GIB:.1f} GiB/GPU, MFU {other.mfu:.1%}. "
            f"Winner: {_knobs(win)} at {seconds(win.step_time)}/step, {win.tokens_per_s:,.0f} tokens/s, MFU {win.mfu:.1%}.")


def framework_paragraph(job: Job, gpus: int = 0) -> str:
    fw = get_framework(job.framework)
    a = assumptions(job)
    return (f"Framework {fw.name}: {fw.summary}. Assumed here: attention {a['attention']}, gradients reduced in "
            f"{a['gradient_reduce_dtype']}{' behind the backward' if a['grad_reduce_overlapped'] else ' after the backward'}, "
            f"TP comm overlap {'on' if a['tp_comm_overlap'] else 'off'}, {a['bytes_per_param']['weights']}+"
            f"{a['bytes_per_param']['gradients']}+{a['bytes_per_param']['optimizer']} bytes per parameter{_network(job, a, gpus)}. "
            f"It cannot run: {'; '.join(fw.cannot_run()) or 'nothing the search tries'}."
            + _offloaded(a) + _record(job))


def _offloaded(a: dict) -> str:
    """Under --offload: what the host holds and the rates its copies and CPU step are timed at."""
    if "offload" not in a:
        return ""
    o = a["offload"]
    cap = f", {o['host_memory_gib']:,.0f} GiB a node" if o["host_memory_gib"] else ""
    return (f" Offloaded (--offload): {o['states']}; copies at {o['host_link_gbs']:g} GB/s per GPU, the CPU step "
            f"through {o['host_memory_bandwidth_gbs']:g} GB/s of host memory{cap} (the `offload` term of the step).")


def _record(job: Job) -> str:
    """The stack's record against its published runs on this GPU (planner/published_check.py), where one is kept."""
    gpu = checked_gpu(job)
    if gpu:
        return " " + published_check.sentence(job.framework, gpu, job.model.is_moe)
    if job.cluster.measured:  # a calibrated machine: `shardwise validate` checks the planner on it
        return ""
    return (" No published run on this GPU is in shardwise's reference set (its runs are on A100 and H100 / H200 SXM): "
            "these figures are the model's, unchecked on it.")


def _network(job: Job, a: dict, gpus: int) -> str:
    """Across nodes: the network the collectives were timed on, and how to time them on yours."""
    net = a["network"]
    if gpus <= job.cluster.gpus_per_node or "inter_node_gbs_per_gpu" not in net:
        return ""
    fitted = net["rates"] != "datasheet"
    return (f", a network of {net['inter_node_gbs_per_gpu']:g} GB/s per GPU across nodes"
            + (f" + {net['net_step_extra_us']:g} us per crossing ({net['rates']})" if fitted else
               " (the datasheet's line rate; `shardwise calibrate --nccl-tests` fits yours)"))


def fp8_gather_note(job: Job, win: Estimate) -> str:
    """Under torchao's Float8 (torchtitan --precision fp8) without its float8 all-gather, what the winner would take
    with it (torchtitan's config leaves enable_fsdp_float8_all_gather off; its float8 docs recommend it with
    tensor-wise scaling), where FSDP shards the winner's weights; "" otherwise."""
    if job.precision != "fp8" or get_framework(job.framework).fp8 != "torchao" or job.fp8_all_gather:
        return ""
    gathered = replace(job, fp8_all_gather=True)
    if not fp8_gathered(gathered, win.layout):
        return ""
    faster = estimate(gathered, win.layout)
    return (f"FP8 gathers: with --fp8-params (torchao's float8 all-gather, torchtitan's "
            f"enable_fsdp_float8_all_gather = true and precompute_float8_dynamic_scale_for_fsdp = true) the winner "
            f"would take {seconds(faster.step_time)}/step ({faster.step_time / win.step_time - 1:+.1%}) and "
            f"{faster.memory_per_gpu / GIB:.1f} GiB per GPU: each layer's weights gathered and held in FP8.")


# The model's typical error: about the median |error| on published runs it was not fitted to (leave-one-source-out,
# benchmarks/published_runs.py: 6.1 %, 854 rows, 2026-12-05), above the median error of the ratio of two runs of one
# series that varies one knob (2.3 % over 1,072 pairs: what a ranking of two layouts risks), short of the errors of
# the stacks it models less well. Closer is a tie.
MODEL_ERROR = 0.06
# Layouts re-ranked under each what-if: the fastest ones, and the best of each of the fastest other splits — a what-if
# that slows one link favours another split (less tp under a slower NVLink), whose best may rank below dozens of the
# winner's own variants (micro-batch, virtual stages, ZeRO).
SENSITIVITY_TOP = 30
SENSITIVITY_SPLITS = 40
TERM_NAMES = {"compute": "compute", "host_wait": "the GPU waiting on its host (Python, op dispatch, kernel launches)",
              "recompute": "recompute", "tp_comm": "tensor-parallel traffic",
              "cp_comm": "context-parallel K/V traffic",
              "pp_p2p": "pipeline transfers", "pipeline_bubble": "the pipeline bubble",
              "dp_comm": "exposed data-parallel traffic", "step_comm": "per-step collectives", "optimizer": "the optimizer step",
              "ep_comm": "the experts' all-to-all traffic",
              "offload": "the offloaded optimizer's host copies and CPU step"}


# How much slower a GPU's host may run than when `calibrate` timed its floor: an H200's host moved 20 % within a minute
# and between a calibration and the run after it (docs/accuracy.md, "The H200 again: the host's floor").
HOST_SLOWER = 1.2
# A real fabric against its datasheet: 8 H100 nodes on 400G InfiniBand (nccl-tests issue 309), whose 4-node all-reduce
# log fits 43.867 of the 50 GB/s line rate per GPU and 18.31 us more per network crossing (`calibrate --nccl-tests`;
# tests/data/nccl_tests/, benchmarks/nccl_fit.py: the 8-node log then within 6.7 %). A measured network, not a dial.
MEASURED_FABRIC = {"line_rate_share": 43.867 / 50, "net_step_extra_s": 18.31e-6}


def _comm_links(job: Job, win: Estimate) -> dict[str, bool]:
    """The winner's communication terms that take time, each with whether its groups stay inside one node (NVLink)
    or cross the network: rank order pp, dp, cp, tp (tp fastest), experts over ep ranks etp apart."""
    c, lay, t = job.cluster, win.layout, win.time_s
    inside = {"tp_comm": one_node(c, lay.tp), "cp_comm": one_node(c, lay.cp, lay.tp),
              "dp_comm": one_node(c, lay.dp * lay.cp, lay.tp), "ep_comm": one_node(c, lay.ep, lay.etp),
              "pp_p2p": one_node(c, lay.pp, lay.dp * lay.cp * lay.tp)}
    return {term: inside[term] for term in inside if t.get(term, 0.0) > 0}


def _what_ifs(job: Job, win: Estimate) -> list[tuple[str, Job]]:
    """The uncertain inputs worth perturbing for this winner: the link of its largest communication term at half
    bandwidth (NVLink where that term's groups stay inside a node, else the network; none when nothing is exchanged),
    the GPU sustaining 15 % less of its benchmark rates (BF16 and FP8 alike), under --offload the host's link and
    memory at half their rates and, on a GPU calibrated with its host's floor, that host HOST_SLOWER times slower."""
    c, t = job.cluster, win.time_s
    links = _comm_links(job, win)
    out = []
    if links:
        term = max(links, key=lambda k: t[k])
        link = ("NVLink", replace(c, intra_node_bandwidth=c.intra_node_bandwidth / 2)) if links[term] else \
            ("the network", replace(c, inter_node_bandwidth=c.inter_node_bandwidth / 2))
        # the whole link halved (every transfer on it slows), named by the largest traffic it carries
        out.append((f"if {link[0]} ran at half its bandwidth (the link of {TERM_NAMES[term]}, the largest transfer "
                    f"term)", replace(job, cluster=link[1])))
    rates = {k: v * 0.85 for k, v in (c.measured or {}).items() if k in ("model_tflops", "matmul_tflops")}
    # the FP8 rate is the FP8 peak at the BF16 matmuls' share of theirs (kernels.fp8_rate): slowed with its own peak
    slower = replace(c, peak_flops=c.peak_flops * 0.85, mamf_tflops=(c.mamf_tflops or 0) * 0.85,
                     fp8_flops=c.fp8_flops * 0.85,
                     measured={**c.measured, **rates} if c.measured else c.measured)  # a calibration's own rates too
    out.append(("if the GPUs sustained 15 % less of their matmul and attention rates", replace(job, cluster=slower)))
    if win.layout.world_size > c.gpus_per_node and not c.measured and not c.network_fit:
        fabric = replace(c, inter_node_bandwidth=c.inter_node_bandwidth * MEASURED_FABRIC["line_rate_share"],
                         net_step_extra=MEASURED_FABRIC["net_step_extra_s"])
        out.append(("if the network between nodes reached 88 % of its line rate with 18 us more per crossing, as a "
                    "measured 400G InfiniBand cluster's does (nccl-tests logs)", replace(job, cluster=fabric)))
    if t.get("offload"):  # the host side of an offloaded optimizer: its link and memory at half their datasheet rates
        half = replace(c, host_link_bandwidth=c.host_link_bandwidth / 2, host_memory_bandwidth=c.host_memory_bandwidth / 2)
        out.append(("if the host's PCIe link and memory ran at half their rates (the offloaded optimizer's copies and "
                    "CPU step)", replace(job, cluster=half)))
    host = {k: v * HOST_SLOWER for k, v in (c.measured or {}).items() if k in HOST_FLOOR_KEYS}
    if host.get("host_layer_s"):
        out.append((f"if the host launched the GPU's work {HOST_SLOWER - 1:.0%} slower",
                    replace(job, cluster=replace(c, measured={**c.measured, **host}))))
    return out


def sensitivity_candidates(result: SearchResult) -> list[Estimate]:
    """The layouts each what-if re-ranks: the SENSITIVITY_TOP fastest, and the best of each of the SENSITIVITY_SPLITS
    fastest other splits."""
    fastest = list(_best_by(result, lambda l: l.split).values())[:SENSITIVITY_SPLITS]  # fastest first
    seen, out = set(), []
    for e in result.ranked[:SENSITIVITY_TOP] + fastest:
        if e.layout not in seen:
            seen.add(e.layout)
            out.append(e)
    return out


def what_if_rankings(job: Job, result: SearchResult) -> list[tuple[str, Job, Estimate, Estimate, Estimate | None]]:
    """For each what-if (_what_ifs): its words, the job it changes to, the fastest candidate under it
    (sensitivity_candidates), today's winner under it, and the fastest other split under it (None: no other)."""
    win, top, out = result.ranked[0], sensitivity_candidates(result), []
    for what, perturbed in _what_ifs(job, win):
        again = sorted((estimate(perturbed, e.layout) for e in top), key=lambda e: e.step_time)
        today = next(e for e in again if e.layout == win.layout)
        other = next((e for e in again if e.layout.split != again[0].layout.split), None)
        out.append((what, perturbed, again[0], today, other))
    return out


# Below this share of the compute term that moves with the GPU's matmul and attention rates, explain says how much
# does not: "compute" then names mostly fixed costs, which a faster GPU would not shorten.
SCALED_COMPUTE_SHARE = 0.75


def _unscaled_compute(job: Job, win: Estimate, rankings: list) -> str:
    """The part of the winner's compute term that does not move with the GPU's rates, where it is most of it: read
    off the GPU what-if (rates x 0.85 lengthen the rate-bound part by 1/0.85), so memory-bound kernels, per-kernel
    launch costs and a MoE layer's fixed overheads (moe.MOE_LAYER_OVERHEAD_S) are told apart from the matmuls."""
    slow = next((today for _, perturbed, _, today, _ in rankings if perturbed.cluster.peak_flops < job.cluster.peak_flops), None)
    compute = win.time_s.get("compute", 0.0)
    if slow is None or compute <= 0:
        return ""
    scaled = min(max((slow.time_s.get("compute", 0.0) - compute) * 0.85 / 0.15, 0.0), compute)
    if scaled >= SCALED_COMPUTE_SHARE * compute:
        return ""
    moe = ", a mixture of experts' fixed per-layer overheads" if job.model.is_moe else ""
    return (f", of which {seconds(compute - scaled)} does not move with the GPU's matmul and attention rates "
            f"(memory-bound kernels and per-kernel launch costs{moe})")


def uncertainty(job: Job, result: SearchResult) -> list[str]:
    """The term that dominates the winner's step, and whether the ranking survives each what-if."""
    win = result.ranked[0]
    t = win.time_s
    dominant = max(t, key=t.get)
    again = f" (and {seconds(t['recompute'])} more recomputing it)" if dominant == "compute" and t.get("recompute") else ""
    rankings = what_if_rankings(job, result)
    fixed = _unscaled_compute(job, win, rankings) if dominant == "compute" else ""
    out = [f"Dominant term: {TERM_NAMES.get(dominant, dominant)}, {seconds(t[dominant])} of the {seconds(win.step_time)} step "
           f"({t[dominant] / win.step_time:.0%}){again}{fixed}."]
    sentences = []
    for what, _, new, today, other in rankings:
        if new.layout == win.layout:
            gap = other.step_time / new.step_time - 1 if other is not None else None
            # a verdict inside the model's error is no verdict: the next split is named beside it
            tie = (f", {gap:.1%} ahead of {other.layout.describe()}: within the model's error (±{MODEL_ERROR:.0%})"
                   if gap is not None and gap < MODEL_ERROR else "")
            sentences.append(f"{what}, the winner would still be {_knobs(win)} ({seconds(new.step_time)}/step{tie})")
        else:
            close = today.step_time / new.step_time - 1
            same = ", the same split with other knobs" if new.layout.split == win.layout.split else ""
            # a flip inside the model's error is no verdict, as runner_up says of two splits
            tie = f", within the model's error (±{MODEL_ERROR:.0%}): either would do" if close < MODEL_ERROR else ""
            sentences.append(f"{what}, {_knobs(new)} would win ({seconds(new.step_time)}/step; today's winner "
                             f"{close:+.1%} behind it{same}{tie})")
    out.append("Sensitivity: " + "; ".join(sentences) + ".")
    host = host_bound_note(job, win.layout)
    return out + ([f"Host: {host[0].upper()}{host[1:]}."] if host else [])


# The best BF16 MFU published on each GPU generation (benchmarks/data/published_runs.csv, the rows' own MFU column;
# a utilisation that counts recomputed FLOPs left out), for models of at least this many parameters, on at least
# this many GPUs: a plan above the record of its scale needs a reason. Scale matters because MFU falls as a job
# grows (more exposed communication, fewer tokens per GPU), so a record set on 64 GPUs does not show that 2,048 can
# reach it; a plan on N GPUs answers to the best run on at least the largest floor <= N.
_KORTHIKANTI = "Korthikanti et al. 2022 (Megatron-LM, selective recompute + SP)"
_DGXC = "NVIDIA dgxc-benchmarking (NeMo)"
# From 512 GPUs the records are the same whatever the model's size (the large runs are large models).
_A100_AT_SCALE = ((512, 0.563, f"{_KORTHIKANTI}'s 1T on 512 A100 (56.3 %)"),
                  (2048, 0.542, f"{_KORTHIKANTI}'s 530B on 2,240 A100 (54.2 %)"),
                  (8192, 0.433, "MegaScale's Megatron-LM baseline, 175B on 8,192 A100 (Jiang et al. 2024, 43.3 %)"))
_LLAMA3_8K = (8192, 0.430, "Meta's Llama 3 405B on 8,192 H100 (the Llama 3 paper, 43 %)")
PUBLISHED_MFU_RECORD = {
    # Hagemann et al. 2023 (Aleph Alpha's layout sweep, arXiv 2311.05610; the authors' per-run sheets): MFU by PaLM's
    # count (6N + 12 L H Q T per token, attention not halved for the causal mask), the sheets' own column.
    "ampere": ((20e9, ((1, 0.620, "Hagemann et al. 2023's LLaMA 30B on 64 A100 (Aleph Alpha's Megatron-based "
                                  "stack, 62.0 % by PaLM's count)"), *_A100_AT_SCALE)),
               (0, ((1, 0.706, "Hagemann et al. 2023's LLaMA 13B on 64 A100 (Aleph Alpha's Megatron-based stack, "
                               "70.6 % by PaLM's count)"), *_A100_AT_SCALE))),
    "hopper": ((100e9, ((1, 0.5863, f"{_DGXC}'s Llama 3.1 405B on 32 H100 (NeMo 24.09, 58.63 %)"),
                        (512, 0.5816, f"{_DGXC}'s Nemotron-4 340B on 512 H100 (NeMo 25.02, 58.16 %)"),
                        (2048, 0.5763, f"{_DGXC}'s Nemotron-4 340B on 2,048 H100 (NeMo 25.02, 57.63 %)"),
                        _LLAMA3_8K)),
               (0, ((1, 0.6607, f"{_DGXC}'s Nemotron-4 15B on 16 H100 (NeMo 25.02, 66.07 %)"),
                    (512, 0.6485, f"{_DGXC}'s Nemotron-4 15B on 512 H100 (NeMo 25.02, 64.85 %)"),
                    (2048, 0.6321, f"{_DGXC}'s Nemotron-4 15B on 2,048 H100 (NeMo 25.02, 63.21 %)"),
                    _LLAMA3_8K))),
}


def published_record(job: Job, gpus: int) -> tuple[float, int, str, str]:
    """(MFU, GPU floor, who, size class) of the best published run on the job's GPU generation for a model of its
    size class on at least the largest record floor <= gpus; (1.0, 1, "", "") where no record applies. A mixture of
    experts is classed by the parameters its FLOPs count (flop_params: a token's experts), which its GEMMs' sizes and
    so its MFU follow, and held to the dense records (the reference set states no MoE run's MFU)."""
    # A datasheet cluster file that names no arch is timed with Ampere's kernel constants (kernels.py): held to Ampere's
    # records. A calibrated one (`calibrate`: its peak is its own measured rate, its arch unnamed) has no record.
    c = job.cluster
    by_size = PUBLISHED_MFU_RECORD.get(c.arch or ("" if c.measured else "ampere"), ())
    counted = flop_params(job.model) if job.model.num_experts else job.model.num_params()
    found = next(((i, size, t) for i, (size, t) in enumerate(by_size) if counted >= size), None)
    if found is None:
        return 1.0, 1, "", ""
    i, size, tiers = found
    above = by_size[i - 1][0] if i > 0 else 0
    kind = "FLOP-counted (a token's experts) " if job.model.num_experts else ""
    size_class = (f"{size / 1e9:g} B {kind}parameters or more" if size and not above else
                  f"under {above / 1e9:g} B {kind}parameters" if not size else
                  f"{size / 1e9:g}-{above / 1e9:g} B {kind}parameters")
    floor, mfu, who = next(((f, m, w) for f, m, w in reversed(tiers) if gpus >= f), (1, 1.0, ""))
    return mfu, floor, who, size_class


def plausibility(job: Job, win: Estimate) -> str:
    """A sentence when the winner's MFU is above the best ever published on its GPU generation for a model of
    its size at its scale, saying why this plan could beat it and what to check."""
    lay, t = win.layout, win.time_s
    mfu, floor, who, size_class = published_record(job, lay.world_size)
    if win.mfu <= mfu:
        return ""
    scale = f" on {floor:,} or more GPUs" if floor > 1 else ""
    def share(*keys) -> str:  # a term under 1 % of the step said as such, not as "0%"
        part = sum(t.get(k, 0.0) for k in keys) / win.step_time
        return f"{part:.0%}" if part >= 0.005 or part == 0 else "<1%"

    reasons = ([f"{share('recompute')} in {lay.recompute_phrase()}"] if lay.recompute != "none" else []) + \
        ([f"{share('tp_comm')} exposed TP traffic" + (" (inside NVLink)" if one_node(job.cluster, lay.tp) else "")]
         if lay.tp > 1 else []) + \
        [f"{share(k)} {TERM_NAMES[k]}" for k in ("cp_comm", "ep_comm") if t.get(k, 0.0) > 0] + \
        ([f"{share('pipeline_bubble', 'pp_p2p')} in the pipeline's bubble and transfers"] if lay.pp > 1 else []) + \
        [f"{share('dp_comm')} exposed DP traffic", f"{share('step_comm', 'optimizer')} in per-step collectives and "
         "the optimizer"] + ([f"{share('host_wait')} waiting on the host"] if "host_wait" in t else [])
    fp8 = (" Its matmuls run in FP8, at up to twice the BF16 peak this MFU is counted against, where the records are "
           "BF16 runs: an FP8 plan can pass them by that alone." if job.precision == "fp8" else "")
    dense = " (a dense run: no mixture-of-experts run's MFU is in the reference set)" if job.model.num_experts else ""
    return (f"Plausibility: MFU {win.mfu:.1%} is above the best published on this GPU generation for a model of "
            f"{size_class}{scale}, {who}{dense}.{fp8} This plan "
            f"spends {1 - t['compute'] / win.step_time:.0%} of its step outside the layers' compute ({', '.join(reasons)}); "
            f"its compute runs at the rates the kernel benchmarks and the published runs support "
            f"(in-situ efficiency {assumptions(job)['in_situ_efficiency']:.2f}). Treat the margin over {mfu:.1%} as "
            f"the part of the estimate to verify first: measure a few steps before committing to it."
            + (f" {counted[0].upper()}{counted[1:]}" if (counted := _unmasked_attention(job, win)) else ""))


def _unmasked_attention(job: Job, win: Estimate) -> str:
    """Where attention is a large share of the FLOPs MFU counts (long sequences): that PaLM's count takes it unmasked,
    twice what a causal kernel runs, so the MFU is above the GPU's own rate, and what it is with the masked half."""
    m, s = job.model, job.train.seq_len
    share = attention_flops_per_step(job) / model_flops_per_step(job)
    if share < 0.1:
        return ""
    # the global layers' part is the one counted unmasked; a windowed layer's count is its window's keys, about what runs
    halved = share * (1 - m.window_share(s)) * s / m.attended_keys(s)
    windows = " on its global layers (its windowed ones counted over the window)" if m.window_share(s) else ""
    return (f"at {s:,} tokens {share:.0%} of the FLOPs MFU counts are attention, which PaLM's count (the records' "
            f"too, at their shorter sequences) takes unmasked where a causal kernel runs half{windows}: counting only "
            f"what runs, this plan's MFU is {win.mfu * (1 - halved / 2):.1%}.")


def summary(job: Job, gpus: int, result: SearchResult) -> list[str]:
    """The short 'why' printed under `plan`'s table: where the winner's step goes, and the runner-up."""
    win = result.ranked[0]
    t = win.time_s
    share = {k: v / win.step_time for k, v in t.items()}
    line = (f"{_knobs(win)} ({job.framework}): {win.memory_per_gpu / GIB:.1f} of {job.cluster.gpu_memory_gib:.3g} GiB "
            f"per GPU; of its {seconds(win.step_time)} step, compute {share['compute'] + share['recompute']:.0%}, "
            f"TP traffic {share['tp_comm']:.1%}"
            + "".join(f", {name} {share[k]:.1%}" for k, name in (("cp_comm", "CP traffic"), ("ep_comm", "expert all-to-all"))
                      if share.get(k))
            + f", pipeline bubble + transfers {share['pipeline_bubble'] + share['pp_p2p']:.1%}, DP traffic {share['dp_comm']:.1%}"
            + (f", the GPU waiting on its host {share['host_wait']:.0%}" if "host_wait" in share else "")
            + (f", the offloaded optimizer on the host {share['offload']:.1%} ({win.host_held()})"
               if "offload" in share else "")
            # the optimizer's own kernels and the step's end (gradient norm, loss): the rest of the step
            + f", optimizer step {share.get('optimizer', 0.0) + share.get('step_comm', 0.0):.1%}"
            + f"; MFU {win.mfu:.1%}.")
    out = [line, runner_up(result)]
    record = plausibility(job, win)
    return out + ([record] if record else [])


def _dp_sentence(lay, batch: int, dp_comm: float) -> str:
    """What data parallelism does for the winner: each replica of tp x pp x cp GPUs takes 1/dp of the sequences (each
    GPU 1/world of the step's compute), and what its gradient reduction leaves exposed; with dp 1, that there is
    none (only context parallelism's ranks, if any, reduce)."""
    group = lay.tp * lay.pp * lay.cp
    each = f"each GPU does 1/{lay.dp * group} of the step's compute" if lay.dp * group > 1 else "one GPU does it all"
    if lay.dp == 1:
        reduced = (f"; the gradients are reduced over the {lay.cp} context-parallel ranks, exposed "
                   f"{seconds(dp_comm)}" if lay.cp > 1 else "; no gradient reduction")
        takes = "the one sequence" if batch == 1 else f"all {batch} sequences"
        return f"DP = 1: no data parallelism — one replica takes {takes} ({each}){reduced}."
    replica = f"{group} GPUs (tp x pp x cp)" if group > 1 else "one GPU"
    over = f" (over the {lay.dp * lay.cp} data- and context-parallel ranks)" if lay.cp > 1 else ""
    return (f"DP = {lay.dp}: {lay.dp} replicas of {replica} each take {batch // lay.dp} of the {batch} sequences "
            f"({each}); the exposed gradient traffic{over} costs {seconds(dp_comm)}.")


def _weight_copies(job: Job) -> str:
    """What the weights' GiB hold beyond the bytes per parameter the Fit line counts: Transformer Engine's FP8 copy of
    each linear's weight and its transpose (memory.fp8_weight_copy_bytes), where the stack keeps them."""
    from shardwise.planner.memory import fp8_saved, fp8_weight_copy_bytes

    if not fp8_saved(job):
        return ""
    kept = "its transposed FP8 copy" if job.train.weight_bytes == 1 else "their FP8 copy and its transpose"
    return f" (with {kept}, {fp8_weight_copy_bytes(job)} B a layer parameter, which Transformer Engine keeps)"


def _dtype(nbytes: int) -> str:
    """The dtype(s) of a model state kept in `nbytes` bytes a parameter (DeepSpeed's bf16 path keeps an FP32 and a
    BF16 copy of each gradient: 6)."""
    return {1: "fp8", 2: "bf16", 4: "fp32", 6: "fp32 + bf16"}.get(nbytes, f"{nbytes}-byte")


def _optimizer_states(train: TrainSpec) -> str:
    """What the optimizer's bytes a parameter hold: FP32 weights are their own master copy (shardwise: 8 B of FP32
    moments); 4 B beside 16-bit weights are BF16 moments and no master (NeMo AutoModel's bf16 states)."""
    if train.weight_bytes >= 4:
        return "fp32 Adam moments"
    if train.master_bytes != 4:
        return "bf16 Adam moments"
    # beyond the two FP32 moments: 4 B of FP32 master, or 2 B (NeMo's distributed Adam keeps the 16-bit remainder
    # beside the BF16 weight)
    return "fp32 master (its 16-bit remainder) + Adam moments" if train.optimizer_bytes - 8 == 2 else "fp32 master + Adam moments"
