"""Measure the machine this runs on, with the real backend and world size, as a cluster profile.

    profile = calibrate(CalibrateConfig(world=2, backend="gloo", model=load_model("tiny")))
    Path("profile.toml").write_text(profile.to_toml())    # then: plan/estimate --cluster profile.toml

W ranks (one thread each; spawned here, or the ranks torchrun started) measure at the same time, so
they contend for cores and memory as training ranks do. Every figure is the median of `repeats`
timed repeats after `warmup` untimed ones, each repeat starting at a barrier (timer.py); the model and every
per-call cost compared with it run in three rounds spread over the calibration:

  matmul       every GEMM of the model's linear layers and LM head at micro_batch x seq_len tokens,
               forward and both backward GEMMs; rate = total FLOPs / total time, each GEMM weighted
               by how often one step runs it (fp32 on CPU, bf16 on GPU).
  model        the runtime's own model (up to 4 layers and the LM head), forward + backward, at
               micro-batches 1-4 x micro_batch: time = overhead + FLOPs / rate + the element-wise passes
               the planner times on its own (Theil-Sen fit). The rate covers the rest of what a layer runs;
               the overhead is the fixed cost of op dispatch and kernel launches that dominates small
               models, split by where it is paid: the embedding (first stage) and the norm, head and loss
               (last stage), each timed alone, and the rest per layer.
  copy         one large tensor copy; bandwidth = 2 x bytes / time (read + write).
  collectives  all_reduce, all_gather, reduce_scatter, broadcast, send_recv at each size over all W ranks
               (send_recv: rank 2i -> 2i+1); a repeat lasts as long as its slowest rank.

profile.py turns the figures into the cluster TOML: [measured] in the format planner/comm.py reads,
[cluster] keys fitted from it so the planner's alpha-beta fallback agrees with the tables.
"""

import os
from dataclasses import replace

from shardwise.calibrate.config import (COLLECTIVES, CalibrateConfig, check_config, gemm_shapes, human, parse_size,
                                        rank_steps)
from shardwise.calibrate.profile import Profile, fit_alpha_beta, tp_call_in_step

__all__ = ["COLLECTIVES", "CalibrateConfig", "Profile", "calibrate", "check_config", "fit_alpha_beta", "gemm_shapes",
           "human", "parse_size", "rank_steps"]


def calibrate(cfg: CalibrateConfig, report=lambda label: None) -> Profile | None:
    """Measure with cfg.world ranks (under torchrun: its world): the Profile on rank 0, None elsewhere.
    Ranks start through `launch.run_ranks`; a failed rank raises `launch.JobFailed`."""
    from shardwise.launch import run_ranks, under_torchrun

    cfg = cfg.resolved()
    if under_torchrun():
        cfg = replace(cfg, world=int(os.environ["WORLD_SIZE"]))
    from shardwise.contention import OtherCpu

    with OtherCpu(enabled=not under_torchrun()) as other:  # under torchrun the other ranks are not our children
        out = run_ranks(_measure, cfg, world=cfg.world, backend=cfg.backend, timeout_s=cfg.timeout_s, report=report,
                        what="calibration")[0]
    if out is None:
        return None
    profile = Profile(**out, other_cpu_cores=other.cores)
    profile.tp_call_s = tp_call_in_step(profile, cfg.model, cfg.micro_batch, cfg.seq_len)
    profile.tp_sp_call_s = tp_call_in_step(profile, cfg.model, cfg.micro_batch, cfg.seq_len, sp=True)
    return profile


def _measure(cfg: CalibrateConfig):
    import torch.distributed as dist

    from shardwise.calibrate.measure import measure_rank
    from shardwise.launch import progress

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    return measure_rank(cfg, rank, world, progress)
