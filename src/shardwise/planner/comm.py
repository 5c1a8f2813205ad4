"""Time of one collective: NCCL's own cost model on a datasheet GPU cluster; a calibrated table, or
alpha-beta with ring factors, on a calibrated (e.g. CPU/gloo) cluster.

GPU clusters (no [measured] tables): the algorithm and protocol NCCL would pick, timed as NCCL's tuner
times them (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel and ncclTopoGetAlgoTime, commit
5067397): time = latency + bytes / algorithm bandwidth, minimised over
  algorithms  ring (every collective) and tree (all-reduce across nodes: latency grows with log2 nodes);
  protocols   LL (low latency, half the bandwidth), LL128 (92 %), Simple (full bandwidth, most latency).
Latency: a base per algorithm/protocol plus one hop latency per ring step, NVLink hops inside a node and
network hops between nodes (2 (nodes - 1) of the 2 (n - 1) steps of a ring all-reduce cross nodes).
Bandwidth: the bus bandwidth of the ring, then algorithm bandwidth = bus bandwidth x n / steps
(all-reduce 2 (n-1) steps, all-gather and reduce-scatter n - 1, broadcast n; tree: one half).
  inside a node: NVLink as NCCL counts it: 20 GB/s per link on Ampere (12 links = 240 of the 300 GB/s
    datasheet), 20.6 on Hopper (18 links = 371 of 450) (src/graph/topo.h SM80/SM90_NVLINK_BW);
  across nodes: a group with k members on each node holds k GPUs' shares of the node's NICs (the cluster's
    inter_node_bandwidth is per GPU: the node's NIC line rate over its GPUs), at NET_EFFICIENCY of the line
    rate, never more than NVLink. A ring over whole nodes thus runs at the node's line rate, whether it has one
    NIC per GPU (DGX) or one or two for all eight: NCCL's rings cross each node boundary once each, one ring
    (channel) per NIC, so a node's network carries the message size per ring crossing whatever its NIC count.
Sizes: all-gather's B is the gathered (full) size, reduce-scatter's the full input (NCCL's nBytes).
A cluster fitted to its own nccl-tests logs (calibrate/nccl_tests.py) adds net_step_extra per network crossing a
chunk makes (ring: nodes - 1, all-reduce 2 (nodes - 1); tree: 2 log2(nodes); send: one); 0 on datasheet presets.

Calibrated clusters (`shardwise calibrate`, ClusterSpec.measured): the tables, interpolated log-log,
extrapolated linearly in bytes; a collective without a table, or over a group of another size than the
table's "world_size", falls back to alpha-beta:
  all-reduce 2 (n-1) alpha + 2 (n-1)/n * B/beta; all-gather, reduce-scatter (n-1) alpha + (n-1)/n * B/beta;
  broadcast (n-1) alpha + B/beta; send-recv alpha + B/beta,
with beta = the fitted link bandwidth x LINK_EFFICIENCY (calibrate/profile.py inverts the same factor).
Calibrated format (written by `shardwise calibrate`):
  {"matmul_tflops": float, "all_reduce": [[bytes, seconds], ...], "all_gather": [...],
   "reduce_scatter": [...], "broadcast": [...], "send_recv": [...], "world_size": int,
   "model_tflops", "layer_overhead_s", "step_overhead_s", "sync_overhead_s", "checkpoint_overhead_s",
   "full_checkpoint_overhead_s", "fsdp_call_s", "fsdp_tensor_s", "comm_overlap", "p2p_sync_s", "pipeline_exchange_s", "ddp_microbatch_s": float}
(docs/planner.md says where step_time.py adds each).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from functools import lru_cache

from shardwise.specs import ClusterSpec

# Calibrated alpha-beta: the fitted bandwidth is divided by this when written (calibrate/profile.py).
LINK_EFFICIENCY = 0.8

# NCCL's usable NVLink bandwidth per link, GB/s (src/graph/topo.h), and the datasheet's per link and direction.
NCCL_NVLINK_GBS = {"ampere": 20.0, "hopper": 20.6}
NVLINK_LINK_GBS = 25.0
# Share of a NIC's line rate NCCL's rings reach across nodes: nccl-tests all_reduce between DGX A100
# nodes with 4 HDR NICs for 8 GPUs (100 GB/s of line rate per node) measure 85-96 GB/s bus bandwidth
# (NVIDIA/nccl-tests issue 119); sustained large-message figures sit around 92 %.
NET_EFFICIENCY = 0.92

# NCCL tuner constants (tuning.cc): microseconds, per protocol (LL, LL128, Simple).
PROTOCOLS = ("LL", "LL128", "Simple")
BASE_LATENCY = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
HOP_LATENCY = {("nvlink", "tree"): (0.6, 1.25, 4.0), ("nvlink", "ring"): (0.6, 1.9, 3.4),
               ("net", "tree"): (5.0, 8.5, 14.0), ("net", "ring"): (2.7, 4.0, 14.0)}
# LL's bandwidth cap, GB/s, by nodes (1, 2, more): Ampere and Hopper rows of llMaxBws.
LL_MAX_GBS = {"ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0)}
# Host overhead of a network step (getNetOverhead: 1 us, x3 for Simple) and the ring plateau factor of a
# multi-node Simple all-reduce on compute capability >= 8.0 (ncclTopoGetAlgoTime).
NET_OVERHEAD_US = 1.0
RING_PLATEAU = 1.4
# Tree all-reduce bandwidth correction for medium sizes, by log2(bytes / 64) (treeCorrectionFactor).
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv")


def placement(cluster: ClusterSpec, group_size: int, stride: int) -> tuple[int, int]:
    """(members per node, nodes) of the worst-placed group of `group_size` ranks `stride` apart (ranks fill nodes in
    order): the fewest members it has on one node (their NICs carry its ring across nodes) and the nodes it spans.
    Only the job's own groups count: the cluster's `num_gpus` is the job's GPU count where the command set it
    (`--gpus`; 0: a world that repeats the pattern whole)."""
    return _placement(cluster.gpus_per_node, group_size, max(stride, 1), cluster.num_gpus)


def one_node(cluster: ClusterSpec, group_size: int, stride: int = 1) -> bool:
    """Whether every group of `group_size` ranks `stride` apart stays inside one node (on NVLink)."""
    return placement(cluster, group_size, stride)[1] == 1


@lru_cache(maxsize=1 << 12)
def _placement(per_node: int, group_size: int, stride: int, world: int = 0) -> tuple[int, int]:
    span = group_size * stride  # the ranks one set of `stride` interleaved groups covers
    if 0 < world <= per_node:  # the whole job inside one node
        return group_size, 1
    if (per_node % span == 0 if span <= per_node else span % per_node == 0 and
            (per_node % stride == 0 or stride % per_node == 0)):  # groups that tile the nodes
        members = max(1, min(group_size, per_node // stride))
        return members, math.ceil(group_size / members)
    # Groups that do not tile the nodes (tp 6 on nodes of 8: ranks 6-11 hold 2 GPUs of one node and 4 of the next):
    # the worst group the job has, over one period of the layout at most, the fewest members on one node first.
    period = math.lcm(span, per_node)
    worst = (group_size, 1)
    for start in range(0, min(period, world) if world >= span else period, span):
        for offset in range(stride):
            counts = Counter((start + offset + i * stride) // per_node for i in range(group_size))
            worst = min(worst, (min(counts.values()), len(counts)), key=lambda w: (w[0], -w[1]))
    return worst


def nvlink_bandwidth(cluster: ClusterSpec) -> float:
    """Bytes/s of NCCL's bus bandwidth inside one node: NVLink as NCCL counts its links."""
    links = cluster.intra_node_bandwidth / (NVLINK_LINK_GBS * 1e9)
    return links * NCCL_NVLINK_GBS.get(cluster.arch, NVLINK_LINK_GBS * LINK_EFFICIENCY) * 1e9


def bus_bandwidth(cluster: ClusterSpec, group_size: int, stride: int) -> float:
    """Bytes/s of a ring's bus bandwidth over this group: NVLink as NCCL counts it inside one node;
    across nodes the share of the node's NICs its k members per node hold, at NET_EFFICIENCY, at most NVLink."""
    per_node, nodes = placement(cluster, group_size, stride)
    nvlink = nvlink_bandwidth(cluster)
    if nodes == 1:
        return nvlink
    return min(nvlink, per_node * cluster.inter_node_bandwidth * NET_EFFICIENCY)


def broadcast_hops(n: int, nodes: int, proto: str) -> float:
    """Microseconds of hop latency NCCL's tuner gives a ring broadcast (tuning.cc: ncclFuncBroadcast/ncclFuncReduce,
    ring only). Inside one node the channels replay one GPU order (search.cc's first pass, sameChannels) and the
    broadcast pays one NVLink hop. Across nodes each channel enters the node through its own NIC, so the channels'
    GPU orders differ (the search's second pass, sameChannels 0) and the tuner charges every one of the n steps a
    network hop ("Add some chunk latency, waiting for proper chunk modeling"): the ring's LL / LL128 hop, and for
    Simple the tree's (14 us; 28 in NCCL 2.14.3 of 2023). The chain runs through every rank of the group, so the
    latency grows with the ranks, not with the nodes."""
    p = PROTOCOLS.index(proto)
    if nodes == 1:
        return HOP_LATENCY[("nvlink", "ring")][p]
    return n * HOP_LATENCY[("net", "tree" if proto == "Simple" else "ring")][p]


@lru_cache(maxsize=1 << 16)
def nccl_time(cluster: ClusterSpec, kind: str, nbytes: float, group_size: int, stride: int = 1) -> float:
    """Seconds NCCL's tuner predicts for `kind` over this group, with the algorithm and protocol it picks."""
    n = group_size
    per_node, nodes = placement(cluster, n, stride)
    bus = bus_bandwidth(cluster, n, stride) / 1e9  # GB/s, NCCL's unit
    arch = cluster.arch if cluster.arch in LL_MAX_GBS else "ampere"
    ll_max = LL_MAX_GBS[arch][min(nodes, 3) - 1]
    # The cluster's own network beyond the tuner's constants, per crossing a chunk makes (0 on a datasheet cluster).
    extra = cluster.net_step_extra if nodes > 1 else 0.0
    if kind == "send_recv":
        hop = "nvlink" if nodes == 1 else "net"
        return (BASE_LATENCY["ring"][2] + HOP_LATENCY[(hop, "ring")][2]) * 1e-6 + extra + nbytes / (bus * 1e9)
    steps = {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1, "broadcast": n}[kind]
    inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if kind == "all_reduce" else nodes - 1)
    ring_extra = extra * inter_steps
    best = math.inf
    for p, proto in enumerate(PROTOCOLS):
        # Ring.
        bw = bus
        if proto == "LL":
            bw = min(ll_max, bw * 0.5)
        elif proto == "LL128":
            bw = bw * 0.92
        algbw = bw * n / steps
        intra = HOP_LATENCY[("nvlink", "ring")][p]
        if nodes > 1:
            intra = max(intra, NET_OVERHEAD_US * (3 if proto == "Simple" else 1))
        if kind == "broadcast":
            lat = BASE_LATENCY["ring"][p] + broadcast_hops(n, nodes, proto)
        else:
            lat = BASE_LATENCY["ring"][p] + (steps - inter_steps) * intra + inter_steps * HOP_LATENCY[("net", "ring")][p]
        if proto == "Simple" and nodes > 1 and kind == "all_reduce":
            lat *= RING_PLATEAU
        best = min(best, lat * 1e-6 + ring_extra + nbytes / (algbw * 1e9))
        # Tree: all-reduce across nodes only.
        if kind == "all_reduce" and nodes > 1:
            tbw = {"LL": min(bus / 3.8, ll_max), "LL128": bus * 120 / 128, "Simple": bus * 0.92}[proto] * 0.5
            log_size = int(math.log2(max(nbytes, 64) / 64))
            if log_size < len(TREE_CORRECTION[proto]):
                tbw *= TREE_CORRECTION[proto][log_size]
            net = HOP_LATENCY[("net", "tree")][p]
            tlat = BASE_LATENCY["tree"][p] + 2 * ((per_node - 1) * HOP_LATENCY[("nvlink", "tree")][p]
                                                  + math.log2(nodes) * net)
            best = min(best, tlat * 1e-6 + 2 * math.log2(nodes) * extra + nbytes / (tbw * 1e9))
    return best


def link(cluster: ClusterSpec, group_size: int, stride: int) -> tuple[float, float]:
    """(bandwidth, latency) of the calibrated alpha-beta fallback for a ring over this group."""
    per_node, nodes = placement(cluster, group_size, stride)
    if nodes == 1:
        return cluster.intra_node_bandwidth * LINK_EFFICIENCY, cluster.intra_node_latency
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
        if rate <= 0:  # the last two sizes' times fell (noise): beyond them, bytes cost at least the largest's own rate
            rate = t1 / b1
        return t1 + (nbytes - b1) * rate
    (b0, t0), (b1, t1) = pts[i - 1], pts[i]
    k = math.log(t1 / t0) / math.log(b1 / b0) if t0 > 0 and t1 > 0 and b1 > b0 else 0.0
    return t0 * (nbytes / b0) ** k


def alpha_beta_time(cluster: ClusterSpec, kind: str, nbytes: float, group_size: int, stride: int = 1) -> float:
    bw, lat = link(cluster, group_size, stride)
    if kind == "send_recv":
        return lat + nbytes / bw
    if kind == "broadcast":
        return (group_size - 1) * lat + nbytes / bw
    steps = 2.0 if kind == "all_reduce" else 1.0
    n = group_size
    return steps * (n - 1) * lat + steps * (n - 1) / n * nbytes / bw


def collective_time(cluster: ClusterSpec, kind: str, nbytes: float, group_size: int, stride: int = 1) -> float:
    """Seconds for one `kind` (all_reduce, all_gather, reduce_scatter, broadcast, send_recv) of `nbytes`."""
    if group_size <= 1 and kind != "send_recv" or nbytes <= 0:
        return 0.0
    if not cluster.measured:
        return nccl_time(cluster, kind, nbytes, max(group_size, 2), stride)
    table = cluster.measured.get(kind)
    # A table holds for the group size it was measured at (send_recv: always a pair).
    if table and (kind == "send_recv" or cluster.measured.get("world_size", group_size) == group_size):
        return interpolate(table, nbytes)
    return alpha_beta_time(cluster, kind, nbytes, group_size, stride)


def network_assumed(cluster: ClusterSpec) -> dict:
    """What the collectives are timed on (estimate --json assumptions.network): NCCL's tuner model on the cluster's
    rates, datasheet or fitted to its nccl-tests logs (the file's network_fit), or a calibration's own tables."""
    if cluster.measured:
        return {"model": f"shardwise calibrate's tables (world {cluster.measured.get('world_size', '?')}; "
                         f"alpha-beta for other group sizes)"}
    return {"model": "NCCL's tuner (ring/tree, LL/LL128/Simple)",
            "rates": f"fitted to {cluster.network_fit} logs" if cluster.network_fit else "datasheet",
            "nvlink_gbs": round(bus_bandwidth(cluster, 2, 1) / 1e9, 1),
            "inter_node_gbs_per_gpu": round(cluster.inter_node_bandwidth / 1e9, 3),
            "net_step_extra_us": round(cluster.net_step_extra * 1e6, 2)}


def overlaps(cluster: ClusterSpec) -> bool:
    """Whether the cluster's backend runs communication beside compute at all: not one `calibrate` measured blocking
    (comm_overlap 0: gloo on CPU), which hides nothing."""
    return float((cluster.measured or {}).get("comm_overlap", 1.0)) > 0


def sync_time(cluster: ClusterSpec) -> float:
    """What one synchronising call (a collective or a blocking receive issued between compute) costs
    beyond its back-to-back time: the ranks arrive apart, the first blocks and must be woken. Measured
    by `shardwise calibrate` (`sync_overhead_s`); 0 for datasheet clusters, whose NCCL latency already
    stands for a call on an otherwise idle GPU."""
    return float((cluster.measured or {}).get("sync_overhead_s", 0.0))


def zero1_call_time(cluster: ClusterSpec) -> float:
    """What each of torch ZeroRedundancyOptimizer's per-tensor broadcasts costs beyond its table time on a cluster
    calibrated by `shardwise calibrate` (`zero1_call_s`: owners alternating, the calls queued back to back); 0 for
    datasheet clusters, whose NCCL broadcasts the table model prices."""
    return float((cluster.measured or {}).get("zero1_call_s", 0.0))


def tp_sync_time(cluster: ClusterSpec, sequence_parallel: bool = False) -> float:
    """The same for a tensor-parallel layer's collective, where `calibrate` timed a TP forward + backward of its
    model (`tp_call_s`: each TP call in that step beyond its table time, the work around it included; under sequence
    parallelism `tp_sp_call_s`, the same from the model split with it, where calibrate timed that), else sync_time."""
    measured = cluster.measured or {}
    if sequence_parallel and "tp_sp_call_s" in measured:
        return float(measured["tp_sp_call_s"])
    return float(measured.get("tp_call_s", measured.get("sync_overhead_s", 0.0)))


def tp_call_time(cluster: ClusterSpec, kind: str, nbytes: float, group_size: int, sequence_parallel: bool = False) -> float:
    """One tensor-parallel collective: its time (collective_time) and the per-call charge (tp_sync_time), never below
    nothing: a calibrated charge may be negative, down to minus a table's time at the layer's activation
    (calibrate.profile.tp_call_in_step), which a smaller call (the loss's statistics) would otherwise overdraw."""
    return max(collective_time(cluster, kind, nbytes, group_size) + tp_sync_time(cluster, sequence_parallel), 0.0)


def p2p_sync_time(cluster: ClusterSpec) -> float:
    """The same for a blocking point-to-point receive after compute (`p2p_sync_s`, else `sync_overhead_s`)."""
    measured = cluster.measured or {}
    return float(measured.get("p2p_sync_s", measured.get("sync_overhead_s", 0.0)))
