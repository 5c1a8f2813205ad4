"""What the report page shows, as one JSON-able dict: the ranked layouts, the winner's timeline, the
explanation and a validation run. Columnar and rounded to 5 significant digits, so thousands of
layouts stay small; the page draws everything from this dict."""

from __future__ import annotations

from shardwise.units import GIB

# Display names and colours (Okabe-Ito), in the order the bars stack. Keys the planner adds later get
# their own name and a grey; idle time (the bubble) is the light grey of the timeline's idle rows.
MEMORY_LABELS = {"weights": ("weights", "#0072B2"), "gradients": ("gradients", "#E69F00"),
                 "optimizer": ("optimizer states", "#009E73"), "activations": ("activations", "#CC79A7"),
                 "logits": ("logits", "#56B4E9"), "workspace": ("workspace + fragmentation", "#999999")}
TIME_LABELS = {"compute": ("compute", "#0072B2"), "host_wait": ("waiting on the host", "#7F7F7F"),
               "recompute": ("recompute", "#56B4E9"),
               "tp_comm": ("TP traffic", "#009E73"), "cp_comm": ("CP K/V traffic", "#882255"),
               "pp_p2p": ("PP p2p", "#CC79A7"),
               "pipeline_bubble": ("pipeline bubble", "#C9CED6"), "dp_comm": ("DP traffic", "#D55E00"),
               "step_comm": ("per-step collectives", "#F0E442"), "optimizer": ("optimizer step", "#332288"),
               "ep_comm": ("EP all-to-all", "#117733"),
               "offload": ("offloaded optimizer (host copies + CPU step)", "#AA4499")}
LAYOUT_COLUMNS = ("layout", "dp", "tp", "pp", "cp", "cp_mode", "ep", "vpp", "mb", "m", "zero", "recompute", "sp", "schedule",
                  "mem_gib", "step_s", "tokens_per_s", "mfu", "split_rank")


def _r(x: float) -> float:
    return float(f"{x:.5g}")


def _keys(dicts, preferred) -> list[str]:
    seen = list(preferred)
    for d in dicts:
        seen += [k for k in d if k not in seen]
    return [k for k in seen if any(k in d for d in dicts)]


def layouts(ranked) -> dict:
    """Every fitting layout in rank order, with its memory and step-time breakdowns."""
    mem_keys = _keys([e.memory_bytes for e in ranked[:1]], MEMORY_LABELS)
    time_keys = _keys([e.time_s for e in ranked], TIME_LABELS)  # every layout's: host_wait is only where it is > 0
    seen, rows, mem, time = set(), [], [], []
    for e in ranked:
        lay = e.layout
        split_rank = None if lay.split in seen else len(seen) + 1  # its row in `plan`'s table (best of each split)
        seen.add(lay.split)
        recompute = lay.recompute + (f":{lay.recompute_layers}" if lay.recompute_layers else "")  # full:N, as plan's
        rows.append([lay.describe(), lay.dp, lay.tp, lay.pp, lay.cp, lay.cp_mode if lay.cp > 1 else "-", lay.ep, lay.vpp,
                     lay.micro_batch, e.num_microbatches, lay.zero, recompute,
                     lay.sequence_parallel, lay.schedule if lay.pp > 1 else "-", _r(e.memory_per_gpu / GIB),
                     _r(e.step_time), round(e.tokens_per_s), round(round(100 * e.mfu, 1) / 100, 4), split_rank])  # as shown: rounded once
        mem.append([_r(e.memory_bytes.get(k, 0.0) / GIB) for k in mem_keys])
        time.append([_r(e.time_s.get(k, 0.0)) for k in time_keys])
    return {"columns": list(LAYOUT_COLUMNS), "rows": rows, "memory": mem, "time": time,
            "memory_keys": [[k, *MEMORY_LABELS.get(k, (k.replace("_", " "), "#666666"))] for k in mem_keys],
            "time_keys": [[k, *TIME_LABELS.get(k, (k.replace("_", " "), "#666666"))] for k in time_keys]}


def timeline(job, est) -> dict | None:
    """The winner's pipeline step: its schedule simulated with the per-stage costs the planner used (DeepSpeed's
    lockstep 1F1B as its engine runs it, every exchange blocking: schedules/lockstep.py)."""
    from shardwise.planner.frameworks import get as get_framework
    from shardwise.planner.job import per_rank_job
    from shardwise.planner.step_time import distinct_costs, pipeline_costs, rank_costs
    from shardwise.schedules import MAX_SIMULATED, Costs, action_count, build, simulate
    from shardwise.schedules.lockstep import simulate_lockstep
    from shardwise.timeline import COLORS, LABELS

    lay = est.layout
    if lay.pp == 1:
        return None
    actions = action_count(lay.schedule, lay.pp, est.num_microbatches, lay.vpp)
    if actions > MAX_SIMULATED:  # one by one they would take minutes and gigabytes, and no picture shows them
        passes = 3 if lay.schedule == "zb-h1" else 2  # forward, backward (and ZB-H1's weight pass)
        chunks = f" x {lay.vpp} chunks a stage" if lay.vpp > 1 else ""
        return {"omitted": f"The winner's {lay.schedule} pipeline has {actions:,} actions ({lay.pp} stages x "
                           f"{est.num_microbatches:,} micro-batches{chunks} x {passes} passes), more than the "
                           f"{MAX_SIMULATED:,} this page "
                           f"simulates one by one: its step time and bubble are in the table; `shardwise simulate` "
                           f"draws a smaller run of the same schedule."}
    job = per_rank_job(job, lay.tp)
    distinct = distinct_costs(job, lay)
    slow, c = pipeline_costs(job, lay, distinct)
    per_rank = rank_costs(job, lay, distinct)  # each rank at its own cost: the head's stage is slower
    costs = Costs([x.f for x in per_rank], [x.b for x in per_rank], [x.w for x in per_rank], c)
    lockstep = get_framework(job.framework).p2p_lockstep
    sim = (simulate_lockstep(lay.pp, est.num_microbatches, costs) if lockstep
           else simulate(build(lay.schedule, lay.pp, est.num_microbatches, lay.vpp), costs))
    kinds = sorted({e.kind for e in sim.events}, key="FBIW".index)
    ranks = []
    for r in range(lay.pp):
        evs = sorted((e for e in sim.events if e.rank == r), key=lambda e: e.start)
        gaps, end = [], 0.0
        for e in evs:  # mostly 0: the page rebuilds start = previous end + gap, end = start + duration
            # (unrounded: the page adds them up along the rank, and rounding errors would add up too)
            gaps.append(e.start - end if e.start - end > 1e-12 * sim.makespan else 0)
            end = e.end
        ranks.append({"kind": "".join(e.kind for e in evs), "mb": [e.microbatch for e in evs],
                      "chunk": [e.chunk for e in evs], "gap": gaps})
    # Duration of each kind on each virtual stage (stage = chunk * pp + rank), as the simulator charged it.
    stages = lay.pp * lay.vpp
    duration = {k: [costs.of(k, s, lay.pp, lay.vpp) for s in range(stages)] for k in kinds}
    return {"schedule": lay.schedule, "lockstep": lockstep, "pp": lay.pp, "vpp": lay.vpp, "m": est.num_microbatches,
            # the busiest rank's idle share, as the step time's pipeline_bubble counts it (cheaper ranks idle more)
            "makespan_s": sim.makespan, "bubble_fraction": min(sim.bubble_fraction_per_rank),
            "costs_s": {"f": slow.f, "b": slow.b, "w": slow.w, "transfer": c},
            "duration_s": duration, "ranks": ranks,
            "colors": {k: COLORS[k] for k in kinds}, "labels": {k: LABELS[k] for k in kinds}}


def plan_page(job, gpus: int, result, emitted: dict | None = None) -> dict:
    """The plan part of the page: `result` is the planner's search result (its ranked layouts, fastest first)."""
    from shardwise.emit import profile
    from shardwise.planner.explain import explain

    cluster, train = job.cluster, job.train
    win = result.ranked[0]
    t = job.train
    assumptions = [f"framework profile: {profile(job)}",
                   f"{t.weight_bytes} + {t.grad_bytes} + {t.optimizer_bytes} bytes per parameter (weights, gradients, "
                   f"optimizer states)",
                   "fused attention (FlashAttention)" if job.flash_attention else "materialised softmax (no fused attention)",
                   "TP communication overlapped" if job.tp_comm_overlap else "TP communication exposed",
                   (win.assumptions or {}).get("gemm_dtype", job.precision),
                   ("blocks and loss under torch.compile" if job.compile_loss else "blocks under torch.compile, loss eager")
                   if job.compile else "no torch.compile"]
    return {
        "model": job.model.name, "cluster": cluster.name, "gpus": gpus, "gpus_per_node": cluster.gpus_per_node,
        "global_batch": train.global_batch, "seq_len": train.seq_len, "params": job.model.num_params(),
        "gpu_memory_gib": _r(cluster.gpu_memory_gib), "scored": result.scored, "fit": len(result.ranked),
        "assumptions": assumptions, "explanation": explain(job, gpus, result), "layouts": layouts(result.ranked),
        "winner": {"describe": win.layout.describe(), **win.to_dict()},
        "timeline": timeline(job, win), "emitted": emitted,
    }


def validate_page(result: dict) -> dict:
    """The validate part: predicted vs measured per layout, and the summary."""
    rows = [{"name": x["name"], "predicted_s": x["predicted_step_time_s"], "measured_s": x["measured_step_time_s"],
             "predicted_mib": x["predicted_memory_bytes"] / 2**20, "measured_mib": x["measured_memory_bytes"] / 2**20,
             "noisy": bool(x.get("noisy", False)), "tp": x.get("tp", 1), "pp": x.get("pp", 1)}
            for x in result["layouts"]]
    from shardwise.contention import sweep_warnings

    summary = result.get("summary", {})
    return {"model": result.get("model"), "world": result.get("world"), "backend": result.get("backend"),
            "cluster": result.get("cluster"), "global_batch": result.get("global_batch"),
            "seq_len": result.get("seq_len"), "summary": summary, "layouts": rows,
            # what `validate` prints beside its table: the score at the machine's speed during the sweep, and what
            # made the figures less than a quiet machine's
            "drift_corrected": summary.get("drift_corrected"),
            "warnings": sweep_warnings(result) if "noisy_layouts" in summary else []}
