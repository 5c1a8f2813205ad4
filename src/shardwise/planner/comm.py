"""Time of one collective: a calibrated table when the cluster has one, else alpha-beta with ring factors.

Alpha-beta (Hockney; ring algorithms as NCCL runs them, Thakur et al. 2005), n ranks, B bytes per rank:
  all-reduce       2 (n-1) alpha + 2 (n-1)/n * B / beta
  all-gather       (n-1) alpha   + (n-1)/n * B / beta        (B = the gathered, full size)
  reduce-scatter   (n-1) alpha   + (n-1)/n * B / beta        (B = the full input size)
  broadcast        (n-1) alpha   + B / beta                  (pipelined ring)
  send-recv        alpha + B / beta
beta is the link's one-direction bandwidth per GPU times LINK_EFFICIENCY (NCCL bus bandwidth
reaches ~80 % of the datasheet on NVLink and InfiniBand). Across nodes a group with k members per
node uses k NICs per node in parallel (NCCL: one ring per NIC), see `link`.

Calibrated format (ClusterSpec.measured, written by `shardwise calibrate`, read here):
  {"matmul_tflops": float,                               # achieved dense bf16 matmul TFLOP/s per GPU
   "all_reduce":     [[bytes, seconds], ...],            # measured at the calibrated world size
   "all_gather": [...], "reduce_scatter": [...], "broadcast": [...], "send_recv": [...],
   "world_size": int,                                    # the group size the tables hold for
   "model_tflops": float, "layer_overhead_s": float,     # optional: the model's own layers (step_time.py)
   "step_overhead_s": float,                             # optional: fixed cost of clipping + optimizer per step
   "sync_overhead_s": float,                             # optional: a collective between compute, beyond the table
   "checkpoint_overhead_s": float,                       # optional: a checkpointed layer, beyond its recompute
   "fsdp_call_s": float,                                 # optional: one FSDP collective in a step, beyond the table
   "fsdp_tensor_s": float,                               # optional: clipping + AdamW per FSDP-sharded tensor
   "comm_overlap": float,                                # optional: share of DP traffic hidden behind compute
   "p2p_sync_s": float,                                  # optional: a blocking receive after compute, beyond the table
   "ddp_microbatch_s": float}                            # optional: DDP's wrapper and hooks per micro-batch
Points are interpolated log-log (power law between neighbours) and extrapolated linearly in bytes
beyond the largest point; a collective without a table, or over a group of another size than the
table's "world_size" (when given), falls back to alpha-beta.
"""

from __future__ import annotations

import bisect
import math

from shardwise.specs import ClusterSpec

LINK_EFFICIENCY = 0.8

_STEPS = {"all_reduce": (2.0, 2.0), "all_gather": (1.0, 1.0), "reduce_scatter": (1.0, 1.0)}


def link(cluster: ClusterSpec, group_size: int, stride: int) -> tuple[float, float]:
    """(bandwidth, latency) for a ring over `group_size` ranks `stride` apart.

    Inside one node: NVLink. Across nodes, NCCL runs one ring per NIC, so a group with k members
    on each node drives k NICs per node: k x the per-GPU network bandwidth (what nccl-tests'
    bus bandwidth shows), never more than NVLink.
    """
    if group_size * stride <= cluster.gpus_per_node:
        return cluster.intra_node_bandwidth * LINK_EFFICIENCY, cluster.intra_node_latency
    per_node = max(1, min(group_size, cluster.gpus_per_node // stride))
    bw = min(cluster.intra_node_bandwidth, per_node * cluster.inter_node_bandwidth)
    return bw * LINK_EFFICIENCY, cluster.inter_node_latency


def interpolate(points: list, nbytes: float) -> float:
    """Seconds at `nbytes` from sorted (bytes, seconds) points, log-log between neighbours."""
    pts = sorted((float(b), float(t)) for b, t in points)
    xs = [b for b, _ in pts]
    if nbytes <= xs[0]:
        return pts[0][1]
    i = bisect.bisect_left(xs, nbytes)
    if i >= len(pts):
        (b0, t0), (b1, t1) = pts[-2] if len(pts) > 1 else pts[-1], pts[-1]
        rate = (t1 - t0) / (b1 - b0) if b1 > b0 else t1 / b1
        return t1 + (nbytes - b1) * rate
    (b0, t0), (b1, t1) = pts[i - 1], pts[i]
    k = math.log(t1 / t0) / math.log(b1 / b0) if t0 > 0 and t1 > 0 and b1 > b0 else 0.0
    return t0 * (nbytes / b0) ** k


def collective_time(cluster: ClusterSpec, kind: str, nbytes: float, group_size: int, stride: int = 1) -> float:
    """Seconds for one `kind` (all_reduce, all_gather, reduce_scatter, broadcast, send_recv) of `nbytes`."""
    if group_size <= 1 and kind != "send_recv" or nbytes <= 0:
        return 0.0
    table = cluster.measured.get(kind) if cluster.measured else None
    # A table holds for the group size it was measured at (send_recv: always a pair).
    if table and (kind == "send_recv" or cluster.measured.get("world_size", group_size) == group_size):
        return interpolate(table, nbytes)
    bw, lat = link(cluster, group_size, stride)
    if kind == "send_recv":
        return lat + nbytes / bw
    if kind == "broadcast":
        return (group_size - 1) * lat + nbytes / bw
    steps, volume = _STEPS[kind]
    n = group_size
    return steps * (n - 1) * lat + volume * (n - 1) / n * nbytes / bw


def sync_time(cluster: ClusterSpec) -> float:
    """What one synchronising call (a collective or a blocking receive issued between compute) costs
    beyond its back-to-back time: the ranks arrive apart, the first blocks and must be woken. Measured
    by `shardwise calibrate` (`sync_overhead_s`); 0 for datasheet clusters, whose alpha-beta latency
    already stands for a call on an otherwise idle GPU."""
    return float((cluster.measured or {}).get("sync_overhead_s", 0.0))


def p2p_sync_time(cluster: ClusterSpec) -> float:
    """The same for a blocking point-to-point receive after compute (`p2p_sync_s`, else `sync_overhead_s`)."""
    measured = cluster.measured or {}
    return float(measured.get("p2p_sync_s", measured.get("sync_overhead_s", 0.0)))
