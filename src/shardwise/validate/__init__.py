"""Predicted vs measured: train a sweep of real layouts for a few steps and score the planner.

    result = validate(ValidateConfig(model=load_model("tiny"), cluster=load_cluster("profile.toml"), world=2))
    result["summary"]  # median_abs_error, p90_abs_error, spearman, kendall_tau, top1_regret, best_in_top3

All layouts run in one world of `world` ranks (one thread each). Each is built once (its own runtime and
optimizer, from the same seed; its split's mesh, whose process groups every mesh of the sweep shares:
measure.mesh_split) and warmed up; then `repeats` rounds each run every layout
for `steps` timed steps, in a new random order per round (the same on every rank), so slow drifts of
a shared machine spread over all layouts instead of biasing one. The steps run through `train`'s own
loop (train.TrainLoop) after a barrier, each timed as the loop times it and as long as its slowest
rank; a layout's time is the median of its steps. A layout whose
spread (interquartile range / median) exceeds NOISY runs one more round; if still noisy it is flagged.

Memory, per rank after one more (untimed) step: parameters, gradients and optimizer states as
allocated, plus the peak of the bytes autograd saves for backward (parameters excluded) — against
the planner's weights + gradients + optimizer + activations + logits of its worst rank (its
workspace and fragmentation allowances are GPU-allocator terms, not compared here).

config.py: options and layouts; measure.py: what each rank runs; stats.py: the summary; plot.py: the picture.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from shardwise.specs import Layout
from shardwise.validate.config import ValidateConfig, check_layout, default_layouts, describe, parse_layout
from shardwise.validate.measure import NOISY, run_rank
from shardwise.validate.plot import plot
from shardwise.validate.stats import kendall_tau, quantile, spearman, spread, summarize

__all__ = ["ValidateConfig", "check_layout", "default_layouts", "describe", "kendall_tau", "parse_layout", "plot",
           "predict", "quantile", "spearman", "spread", "summarize", "validate"]


def planner_job(cfg: ValidateConfig):
    """The planner's view of the runtime (planner.job.runtime_job) on this validation's cluster."""
    from shardwise.planner.job import runtime_job

    return runtime_job(cfg.model, cfg.cluster, cfg.global_batch, cfg.seq_len, gpu=cfg.backend == "nccl")


def predict(cfg: ValidateConfig, layout: Layout) -> dict:
    from shardwise.planner import estimate
    from shardwise.planner.memory import counted_memory

    job = planner_job(cfg)
    est = estimate(job, layout)
    return {"step_time_s": est.step_time, "memory": counted_memory(job, layout), "total_bytes": est.memory_per_gpu}


# The calls validate times again beside its sweep: (the ratio's name, the call's workload, what it runs beside in
# every repeat, the calibration's [measured] points and their indices for the same two). The name is the class of
# calibrated times it rescales (calibrate.profile.SPEED_CLASS).
CALLS = (("calls", "both", "layer", "sync_points", 1, 0),   # an all-reduce after a layer, beyond the layer
         ("p2p", "p2p", "layer", "sync_points", 3, 0),      # a send/recv after a layer
         ("exchange", "exchange", "layer", "sync_points", 5, 0),  # the pipeline executor's exchange after a layer
         ("fsdp", "sharded", "plain", "fsdp_points", 1, 0))  # a layer under ZeRO-3, beyond it plain


def _ratio(now, then):
    return now / then if now and then and now > 0 and then > 0 else None


def machine_speed(cfg: ValidateConfig, reference_s: dict) -> dict:
    """calibrate's reference workloads timed during the sweep (measure._reference, after every layout) beside the
    calibration's own figures for them, and their ratios (> 1: the machine ran slower than when it was calibrated):
    the model's forward + backward at one sequence (`speed_ratio`: its compute) and each call of CALLS beyond what
    it runs beside, the median of the repeats' paired differences (`call_speed_ratio`, `p2p_speed_ratio`,
    `exchange_speed_ratio`, `fsdp_speed_ratio`). The calibration's figures only where it timed the same workloads (same model, one
    sequence of seq_len)."""
    refs = reference_s.get("reference", [])
    now = statistics.median(refs) if refs else None
    m = cfg.cluster.measured or {}
    same = bool(m.get("model_points")) and m.get("model") == cfg.model.name and m.get("tokens") == cfg.seq_len
    then = m["model_points"][0][1] if same else None
    one = m.get("one_sequence_points") or []  # the model at one sequence, timed whatever micro-batch was calibrated
    if then is None and m.get("model") == cfg.model.name and len(one) == 2 and one[0] == cfg.seq_len:
        then = one[1]
    out = {"reference_s": now, "calibration_reference_s": then, "speed_ratio": _ratio(now, then)}
    # the host's floor (a GPU's calibration): the model at a handful of tokens, where the GPU waits on the host
    host = reference_s.get("host", [])
    host_now = statistics.median(host) if host else None
    host_then = m["host_floor_points"][0] if host and m.get("model") == cfg.model.name else None
    out.update(host_reference_s=host_now, calibration_host_reference_s=host_then,
               host_speed_ratio=_ratio(host_now, host_then))
    for name, call, beside, points, i, j in CALLS:
        pairs = [b - a for a, b in zip(reference_s.get(beside, []), reference_s.get(call, []))]
        call_now = statistics.median(pairs) if pairs else None
        cal = m.get(points) or []
        call_then = cal[i] - cal[j] if same and len(cal) > max(i, j) else None
        prefix = _prefix(name)
        out.update({f"{prefix}_s": call_now, f"calibration_{prefix}_s": call_then,
                    f"{prefix}_speed_ratio": _ratio(call_now, call_then)})
    return out


def _prefix(name: str) -> str:
    """The key prefix of a CALLS class in machine_speed's output ("calls" -> call_s, call_speed_ratio)."""
    return "call" if name == "calls" else name


def speed_ratios_of(speed: dict) -> dict:
    """machine_speed's ratios as calibrate.profile.speed_ratios takes them, each class of CALLS by its own key (a class
    the sweep did not time again from its FALLBACK); {} without a compute ratio."""
    from shardwise.calibrate.profile import speed_ratios

    return speed_ratios({"compute": speed.get("speed_ratio"), "host": speed.get("host_speed_ratio"),
                         **{name: speed.get(f"{_prefix(name)}_speed_ratio") for name, *_ in CALLS}})


def drift_corrected(cfg: ValidateConfig, speed: dict) -> ValidateConfig | None:
    """This validation on its calibration as the machine ran during the sweep (calibrate.profile.at_speed): its
    compute times x `speed_ratio`, each kind of call x its own ratio (a call the calibration has no figure for,
    e.g. from an older calibrate, by calibrate.profile.FALLBACK); None without a speed ratio (a datasheet cluster,
    another workload)."""
    from shardwise.calibrate.profile import at_speed

    ratios = speed_ratios_of(speed)
    return replace(cfg, cluster=at_speed(cfg.cluster, ratios)) if ratios else None


def validate(cfg: ValidateConfig, report=lambda label: None) -> dict | None:
    """Run the sweep; the report dict on rank 0 (None on other torchrun ranks)."""
    from shardwise.contention import OtherCpu, machine_cores
    from shardwise.launch import run_ranks, under_torchrun

    if not cfg.layouts:
        cfg = replace(cfg, layouts=tuple(default_layouts(cfg.model, cfg.world, cfg.global_batch, cfg.seq_len, cfg.backend)))
    with OtherCpu(enabled=not under_torchrun()) as other:  # under torchrun the other ranks are not our children
        out = run_ranks(run_rank, cfg, world=cfg.world, backend=cfg.backend, timeout_s=cfg.timeout_s, report=report,
                        what="validation")[0]
    if out is None:
        return None
    runs = out["layouts"]
    layouts = []
    for lay, run in zip(cfg.layouts, runs):
        pred = predict(cfg, lay)
        layouts.append({
            "name": describe(lay), **lay.record(),
            "predicted_step_time_s": pred["step_time_s"], "measured_step_time_s": statistics.median(run["times"]),
            "step_time_spread": spread(run["times"]), "noisy": spread(run["times"]) > NOISY,
            "timed_steps": len(run["times"]),
            "predicted_memory_bytes": sum(pred["memory"].values()), "measured_memory_bytes": run["memory_total"],
            "predicted_memory": pred["memory"], "measured_memory": run["memory"],
        })
        if run["allocator_peak"]:  # GPU: torch.cuda.max_memory_allocated over a step vs the planner's total
            layouts[-1].update(measured_allocator_peak_bytes=run["allocator_peak"],
                               predicted_total_bytes=pred["total_bytes"])
    measured = [x["measured_step_time_s"] for x in layouts]
    summary = summarize([x["predicted_step_time_s"] for x in layouts], measured)
    speed = machine_speed(cfg, out["reference_s"])
    now = drift_corrected(cfg, speed)
    if now is not None:  # the same planner on the same calibration, at the machine's speed during the sweep
        for x, lay in zip(layouts, cfg.layouts):
            x["drift_corrected_step_time_s"] = predict(now, lay)["step_time_s"]
        summary["drift_corrected"] = summarize([x["drift_corrected_step_time_s"] for x in layouts], measured)
    mem_errors = [abs(x["predicted_memory_bytes"] - x["measured_memory_bytes"]) / x["measured_memory_bytes"] for x in layouts]
    summary.update(memory_median_abs_error=statistics.median(mem_errors), memory_p90_abs_error=quantile(mem_errors, 0.9),
                   noisy_layouts=sum(x["noisy"] for x in layouts))
    calibrated = {k: cfg.cluster.measured[k] for k in ("matmul_tflops", "model_tflops", "layer_overhead_s", "step_overhead_s")
                  if k in (cfg.cluster.measured or {})}
    return {"model": cfg.model.name, "world": cfg.world, "backend": cfg.backend, "cluster": cfg.cluster.name,
            "calibration": calibrated,
            # Other processes' CPU use during the sweep and during the calibration (contention.py): a timing
            # taken beside busy neighbours is theirs as much as this machine's.
            "machine": {"cores": machine_cores(), "other_cpu_cores": other.cores, "gloo_loop_threads": out["gloo_loop_threads"],
                        "calibration_other_cpu_cores": (cfg.cluster.measured or {}).get("other_cpu_cores"),
                        "calibration_gloo_loop_threads": (cfg.cluster.measured or {}).get("gloo_loop_threads"),
                        **speed},
            "global_batch": cfg.global_batch, "seq_len": cfg.seq_len, "steps": cfg.steps, "repeats": cfg.repeats,
            "layouts": layouts, "summary": summary}
