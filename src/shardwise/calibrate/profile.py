"""A calibration's figures as the cluster profile `plan`/`estimate --cluster` read (pure Python)."""

from __future__ import annotations

import datetime as _dt
import json
import socket
import statistics
from dataclasses import dataclass, field

from shardwise.planner.comm import LINK_EFFICIENCY, interpolate
from shardwise.planner.frameworks import CALIBRATED_STEP_OVERHEAD, get as get_framework
from shardwise.planner.step_time import HOST_FLOOR_KEYS
from shardwise.specs import cluster_from_toml, tp_call_credit

# (latency steps, bandwidth volume) per (n - 1) ring step, as planner/comm.py models them.
_RING = {"all_reduce": (2.0, 2.0), "all_gather": (1.0, 1.0), "reduce_scatter": (1.0, 1.0)}


@dataclass
class Profile:
    world: int
    backend: str
    device: str
    dtype: str
    model: str
    tokens: int
    memory_gib: float
    matmul_tflops: float
    gemms: list  # [[m, n, k, seconds], ...]
    copy_gbs: float
    model_tflops: float = 0.0  # the runtime's model forward+backward: weighted FLOPs / time beyond the overhead
    layer_overhead_s: float = 0.0  # fixed seconds per layer per micro-batch forward+backward
    embedding_overhead_s: float = 0.0  # the first stage's embedding per micro-batch (compute.split_edges)
    head_overhead_s: float = 0.0  # the last stage's norm, head and loss per micro-batch beyond the head's FLOPs
    edge_points: list = field(default_factory=list)  # [embedding, norm + head + loss] alone at the smallest micro-batch, s
    model_points: list = field(default_factory=list)  # [[weighted FLOPs, seconds], ...] behind the two above
    one_sequence_points: list = field(default_factory=list)  # [seq_len, seconds]: the model at one sequence (validate's reference)
    # On a GPU, the host's seconds per micro-batch forward + backward (compute.host_floor): per layer, embedding, head
    host_layer_s: float = 0.0
    host_embedding_s: float = 0.0
    host_head_s: float = 0.0
    host_floor_points: list = field(default_factory=list)  # [model, embedding, head] at HOST_FLOOR_TOKENS tokens, s
    optimizer_s: float = 0.0  # the rest of a bare one-micro-batch training step: batch, zero_grad, AdamW
    optimizer_params: int = 0
    checkpoint_overhead_s: float = 0.0  # a checkpointed layer per micro-batch, beyond what it recomputes
    full_checkpoint_overhead_s: float = 0.0  # a layer under full recompute per micro-batch, beyond its recomputed forward
    checkpoint_points: list = field(default_factory=list)  # [no recompute, selective, full] s at the smallest micro-batch
    # layer, + all-reduce, all-reduce, + send/recv, send/recv, + the pipeline executor's exchange, a pipeline stage,
    # + the exchange, a rank's turn of the layer and of the stage taken in turns with the exchange: s per call
    # (comm.measure_sync)
    sync_points: list = field(default_factory=list)
    sync_bytes: int = 0  # that all-reduce's message
    # the send/recv's, the exchange's and the stage's message: the pipeline executor's dtype (fp32, twice the bf16
    # all-reduce's on a GPU); 0 in profiles before 2026-12-07, which sent sync_bytes (p2p_message_bytes)
    p2p_bytes: int = 0
    action_scatter: float = 0.0  # one stage call's time: interquartile range / 1.349 / median (comm.action_scatter)
    fsdp_call_s: float = 0.0  # each FSDP collective in a step, beyond its table time
    fsdp_tensors: int = 0  # parameter tensors of the sharded layer behind fsdp_points
    ddp_microbatch_s: float = 0.0  # DDP's wrapper and hooks per micro-batch (no_sync), beyond a plain model
    zero1_call_s: float = 0.0  # each ZeRO-1 broadcast of a parameter tensor after the step, beyond its table time
    # [plain, fully_shard] forward + backward, their clip + AdamW, DDP's no_sync step, the plain one's ZeRO-1 update, s
    fsdp_points: list = field(default_factory=list)
    loop_points: list = field(default_factory=list)  # [bare, train's loop] data-parallel step over all ranks, seconds
    split_points: list = field(default_factory=list)  # [one backward, split I + W] of a middle chunk, seconds
    split_layers: int = 0  # layers of that chunk
    cp_points: list = field(default_factory=list)  # [plain, ring, all-gather] one layer on seq/world tokens, seconds
    cp_attention_s: float = 0.0  # the attention work the planner charges a cp layer beyond the plain one
    cp_block_bytes: int = 0  # one rank's K/V block behind cp_points
    tp_points: list = field(default_factory=list)  # [plain, tp = world, + SP] the model forward + backward, seconds
    tp_layers: int = 0  # layers of that model
    tp_call_s: float | None = None  # each TP collective in a TP step beyond its table time (tp_call_in_step)
    tp_sp_call_s: float | None = None  # the same under sequence parallelism (tp_call_in_step(..., sp=True))
    alone_points: list = field(default_factory=list)  # [every rank, one rank alone] the model at the smallest micro-batch, s
    concurrent_slowdown: float = 1.0  # median over repeats of every rank / one alone (>= 1)
    tables: dict = field(default_factory=dict)  # kind -> [[bytes, seconds], ...] as measured
    spread: dict = field(default_factory=dict)  # "kind@bytes" -> interquartile range / median
    repeats: int = 0
    reference_rounds_s: list = field(default_factory=list)  # the reference workload in each model round, seconds
    other_cpu_cores: float | None = None  # cores other processes kept busy meanwhile (contention.py; None: unknown)
    gloo_loop_threads: int | None = None  # rank 0's gloo event-loop threads (contention.py; None: unknown)

    def monotone_tables(self) -> dict:
        """A smaller message never takes longer than a larger one: each time is capped by the next
        larger size's (pulls down noise on the small sizes; what the planner reads)."""
        out = {}
        for kind, points in self.tables.items():
            pts = sorted(points)
            for i in range(len(pts) - 2, -1, -1):
                pts[i] = [pts[i][0], min(pts[i][1], pts[i + 1][1])]
            out[kind] = pts
        return out

    def link(self) -> tuple[float, float]:
        """(bandwidth GB/s as the [cluster] key means it, latency us), fitted so that comm.py's
        alpha-beta fallback reproduces the tables: the median over the collectives."""
        tables = {k: v for k, v in self.monotone_tables().items() if v}
        if self.world == 1 or not tables:
            return self.copy_gbs, 5.0  # one rank never communicates; keep the keys valid
        fits = [fit_alpha_beta(kind, points, self.world) for kind, points in tables.items()]
        beta = statistics.median(b for b, _ in fits)
        alpha = statistics.median(a for _, a in fits)
        return beta / LINK_EFFICIENCY / 1e9, alpha * 1e6

    def step_overhead_s(self) -> float:
        """What a training step runs around the layers (the batch, zero_grad, clipping, AdamW, the loss)
        beyond the planner's bandwidth term for the optimizer (the fixed per-tensor cost that dominates
        small models)."""
        # the runtime's own AdamW ran (the `shardwise` profile's traffic, as the planner prices it for that profile)
        per_param = get_framework("shardwise").optimizer_traffic
        bandwidth_term = per_param * self.optimizer_params / (self.copy_gbs * 1e9)
        return max(self.optimizer_s - bandwidth_term, 0.0)

    def train_step_overhead_s(self) -> float:
        """What `shardwise train`'s loop adds to a bare step of the same layout (dp = world): the global-norm
        clip, the LR schedule, the loss's all-reduce, the scalars read back, the metrics record. The planner's
        `shardwise` profile adds it to every step (planner/framework.py, CALIBRATED_STEP_OVERHEAD)."""
        if len(self.loop_points) < 2:
            return 0.0
        # less the gradient passes the planner prices by their bytes, as step_overhead_s takes out AdamW's: the clip over
        # every gradient of the loop's model (measure_model's, optimizer_params) and, with more than one rank, DDP's
        # in-place zeroing of its buckets (the bare step sets them to None)
        fw = get_framework("shardwise")
        passes = (fw.grad_pass_bytes + (fw.ddp_zero_bytes if self.world > 1 else 0)) * self.optimizer_params
        return max(self.loop_points[1] - self.loop_points[0] - passes / (self.copy_gbs * 1e9), 0.0)

    def split_backward_s(self) -> float:
        """What splitting a layer's backward into ZB-H1's input- and weight-gradient passes adds to it, per
        layer and micro-batch (the planner adds it to the W of every stage that splits)."""
        if len(self.split_points) < 2 or not self.split_layers:
            return 0.0
        return max(self.split_points[1] - self.split_points[0], 0.0) / self.split_layers

    def fsdp_tensor_s(self) -> float:
        """The runtime's clip + AdamW per FSDP-sharded (DTensor) parameter tensor, beyond a plain one; the
        norm's all-reduce that the sharded clip issues is the planner's per-step collective, taken out."""
        if len(self.fsdp_points) < 4 or not self.fsdp_tensors:
            return 0.0
        plain_u, sharded_u = self.fsdp_points[2], self.fsdp_points[3]
        norm = interpolate(self.monotone_tables()["all_reduce"], 4) + self.sync_overhead_s() if self.tables.get("all_reduce") else 0.0
        return max((sharded_u - plain_u - norm) / self.fsdp_tensors, 0.0)

    def p2p_message_bytes(self) -> int:
        """The pipeline messages' size in sync_points' send/recv, exchange and stage calls (measure_sync)."""
        return self.p2p_bytes or self.sync_bytes

    def _in_context(self, index: int, kind: str) -> float:
        """(layer + call) - layer - the table's time for that call: what the call costs between layers
        beyond what the planner reads from its table."""
        if len(self.sync_points) <= index or not self.tables.get(kind):
            return 0.0
        layer, both = self.sync_points[0], self.sync_points[index]
        size = self.p2p_message_bytes() if kind == "send_recv" else self.sync_bytes
        return max(both - layer - interpolate(self.monotone_tables()[kind], size), 0.0)

    def sync_overhead_s(self) -> float:
        """A collective issued between two layers, beyond its table time (measured on an all-reduce)."""
        return self._in_context(1, "all_reduce")

    def p2p_sync_s(self) -> float:
        """A blocking receive after a layer, beyond the send_recv table's time."""
        return self._in_context(3, "send_recv")

    def _exchange_line(self) -> tuple[float, float]:
        """(intercept s, slope) of the pipeline executor's exchange in context against the compute before it, through
        its two points: after a layer's forward (sync_points[5] - [0], after [0]) and after a pipeline stage's forward
        + backward ([7] - [6], after [6]). (0, 0) from a calibration that did not time them."""
        if len(self.sync_points) < 8:
            return 0.0, 0.0
        layer, after_layer = self.sync_points[0], self.sync_points[5] - self.sync_points[0]
        stage, after_stage = self.sync_points[6], self.sync_points[7] - self.sync_points[6]
        slope = max((after_stage - after_layer) / (stage - layer), 0.0) if stage > layer else 0.0
        return after_layer - slope * layer, slope

    def pipeline_exchange_s(self) -> float:
        """The pipeline executor's exchange (a send and a receive posted together, both waited for) beyond the
        send_recv table's time for its message and of the lockstep_spread share of the compute before it: the planner
        charges it to every exchange a rank waits on in the executor's program (planner/step_time._pipeline_spans)."""
        if len(self.sync_points) < 8 or not self.tables.get("send_recv"):
            return 0.0
        table = interpolate(self.monotone_tables()["send_recv"], self.p2p_message_bytes())
        return max(self._exchange_line()[0] - table, 0.0)

    def lockstep_spread(self) -> float:
        """Seconds a pipeline exchange costs per second of compute before it (_exchange_line's slope): the planner's
        program charges each waited exchange this share of the longer side's compute since its previous one."""
        return self._exchange_line()[1]

    def wait_penalty_points(self) -> list:
        """[[wait s, penalty s], ...]: what a pipeline rank's exchange costs beyond the lockstep one when the rank
        waited there for its neighbour's compute of that length, from the two handoffs (measure_sync): a rank's turn
        of the layer (sync_points[8]) against the layer + exchange in lockstep ([5]), after waiting a layer ([0]); of
        the stage ([9] against [7]), after waiting a stage ([6]). The rank that waited was woken and runs its next
        action slower (measured in the executor's records: 0.04-0.08 ms after exchanges under 0.2 ms, 0.13-0.28 ms
        after waits over 0.8 ms, docs/accuracy.md). The planner charges a waited exchange the line through (0, 0) and
        these points, the last one's beyond (schedules.p2p.wait_penalty). [] from a calibration that did not time them."""
        if len(self.sync_points) < 10:
            return []
        sp = self.sync_points
        return [[sp[0], max(sp[8] - sp[5], 0.0)], [sp[6], max(sp[9] - sp[7], 0.0)]]

    def handoff_points(self) -> list:
        """[[wait s, seconds], ...]: what a pipeline rank pays beyond the send_recv table's transfer once its message
        arrives, after waiting that long in an exchange for its neighbour's compute: a rank's turn of the two
        handoffs (measure_sync) beyond the compute of that turn — of the layer (sync_points[8] - [0]), after waiting a
        layer ([0]); of the stage ([9] - [6]), after waiting a stage ([6]). The neighbour, which arrived last, found
        its message posted and paid the transfer only. The planner charges a rank that waited long this, and the
        lockstep exchange only where the two arrive within the actions' scatter of each other (schedules.p2p.
        program_makespan). [] from a calibration that did not time them."""
        if len(self.sync_points) < 10 or not self.tables.get("send_recv"):
            return []
        sp, table = self.sync_points, interpolate(self.monotone_tables()["send_recv"], self.p2p_message_bytes())
        return [[sp[0], max(sp[8] - sp[0] - table, 0.0)], [sp[6], max(sp[9] - sp[6] - table, 0.0)]]

    def _cp_beyond(self, index: int, exchanges: float) -> float:
        """cp_points[index] - plain - the attention work and the `exchanges` (seconds) the planner already charges."""
        if len(self.cp_points) < 3:
            return 0.0
        return max(self.cp_points[index] - self.cp_points[0] - self.cp_attention_s - exchanges, 0.0)

    def cp_ring_step_s(self) -> float:
        """The ring attention's own work per layer, micro-batch and ring step (cp of them: the planner charges cp x it),
        beyond its exchanges as planner/layer_time.cp_layer_comm counts them on a machine that overlaps none: cp - 1
        K/V hops forward, cp - 1 and cp dK/dV hops backward, each the send_recv table's time + p2p_sync_s."""
        if not self.tables.get("send_recv"):
            return 0.0
        hop = interpolate(self.monotone_tables()["send_recv"], self.cp_block_bytes) + self.p2p_sync_s()
        return self._cp_beyond(1, (3 * self.world - 2) * hop) / self.world

    def cp_allgather_s(self) -> float:
        """The all-gather attention's own work per layer and micro-batch, beyond its collectives as
        planner/layer_time.cp_layer_comm counts them: the K/V all-gather forward and again backward, the dK/dV
        reduce-scatter, each at its table's time + sync_overhead_s."""
        if not (self.tables.get("all_gather") and self.tables.get("reduce_scatter")):
            return 0.0
        tables, nbytes = self.monotone_tables(), self.world * self.cp_block_bytes
        calls = 2 * interpolate(tables["all_gather"], nbytes) + interpolate(tables["reduce_scatter"], nbytes)
        return self._cp_beyond(2, calls + 3 * self.sync_overhead_s())

    def reference_drift(self) -> float:
        """Slowest / fastest round of the reference workload (the model's smallest micro-batch) over the
        calibration's start, middle and end: 1 on a machine whose speed held while it was measured."""
        rounds = [x for x in self.reference_rounds_s if x > 0]
        return max(rounds) / min(rounds) if rounds else 1.0

    def noisy(self, limit: float = 0.5) -> list[str]:
        return sorted(k for k, v in self.spread.items() if v > limit)

    def cluster_table(self) -> dict:
        bw, lat = self.link()
        return {
            "name": f"calibrated {self.device} x{self.world} ({self.backend})",
            "gpus_per_node": self.world, "num_gpus": self.world, "gpu_memory_gib": self.memory_gib,
            "peak_tflops": self.matmul_tflops, "hbm_bandwidth_gbs": self.copy_gbs,
            "intra_node_bandwidth_gbs": bw, "inter_node_bandwidth_gbs": bw,
            "intra_node_latency_us": lat, "inter_node_latency_us": lat,
        }

    def measured_table(self) -> dict:
        out = {"world_size": self.world, "backend": self.backend, "dtype": self.dtype, "model": self.model,
               "tokens": self.tokens, "matmul_tflops": self.matmul_tflops, "gemms": self.gemms,
               "model_tflops": self.model_tflops, "layer_overhead_s": self.layer_overhead_s,
               "embedding_overhead_s": self.embedding_overhead_s, "head_overhead_s": self.head_overhead_s,
               "edge_points": self.edge_points,
               "step_overhead_s": self.step_overhead_s(), "sync_overhead_s": self.sync_overhead_s(),
               "p2p_sync_s": self.p2p_sync_s(), "pipeline_exchange_s": self.pipeline_exchange_s(),
               "lockstep_spread": self.lockstep_spread(), "wait_penalty_points": self.wait_penalty_points(),
               "handoff_points": self.handoff_points(), "action_scatter": self.action_scatter,
               "sync_points": self.sync_points,
               "checkpoint_overhead_s": self.checkpoint_overhead_s,
               "full_checkpoint_overhead_s": self.full_checkpoint_overhead_s, "fsdp_call_s": self.fsdp_call_s,
               "fsdp_tensor_s": self.fsdp_tensor_s(), "ddp_microbatch_s": self.ddp_microbatch_s,
               "zero1_call_s": self.zero1_call_s,
               CALIBRATED_STEP_OVERHEAD: self.train_step_overhead_s(), "loop_points": self.loop_points,
               "fsdp_points": self.fsdp_points,
               "split_backward_s": self.split_backward_s(), "split_points": self.split_points,
               "cp_ring_step_s": self.cp_ring_step_s(), "cp_allgather_s": self.cp_allgather_s(),
               "cp_points": self.cp_points, "tp_points": self.tp_points,
               "concurrent_slowdown": self.concurrent_slowdown, "alone_points": self.alone_points,
               "model_points": self.model_points}
        if self.one_sequence_points:  # not read by the planner: validate's reference, whatever the micro-batch
            out["one_sequence_points"] = self.one_sequence_points
        if self.host_floor_points:  # a GPU's: the planner's stage takes max(host, device) (step_time.host_floor_time)
            out.update({k: getattr(self, k) for k in HOST_FLOOR_KEYS}, host_floor_points=self.host_floor_points)
        if self.tp_call_s is not None:  # else the planner charges TP calls sync_overhead_s
            out["tp_call_s"] = self.tp_call_s
        if self.tp_sp_call_s is not None:  # else SP's calls pay tp_call_s
            out["tp_sp_call_s"] = self.tp_sp_call_s
        if self.other_cpu_cores is not None:  # not read by the planner: validate compares it with its sweep's
            out["other_cpu_cores"] = self.other_cpu_cores
        if self.gloo_loop_threads is not None:  # not read by the planner: validate shows its sweep's beside it
            out["gloo_loop_threads"] = self.gloo_loop_threads
        if self.reference_rounds_s:  # not read by the planner: whether the machine held its speed meanwhile
            out["reference_rounds_s"] = self.reference_rounds_s
        if self.backend == "gloo":  # gloo on CPU: collectives block the compute thread, nothing hides behind it
            out["comm_overlap"] = 0.0
        out.update({k: v for k, v in self.monotone_tables().items() if v})
        return out

    def to_dict(self) -> dict:
        return {"cluster": self.cluster_table(), "measured": self.measured_table()}

    def to_cluster(self):
        return cluster_from_toml(self.to_dict(), name="calibrated", source="calibration")

    def to_toml(self) -> str:
        head = [f"# Measured by `shardwise calibrate` on {socket.gethostname()} at "
                f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC: world {self.world}, {self.backend}, "
                f"{self.dtype}, median of {self.repeats} repeats.",
                "# peak_tflops: the achieved matmul rate on the model's GEMMs, not a datasheet figure;",
                "# hbm_bandwidth_gbs: a large copy; link bandwidth and latency: fitted to the [measured] tables.",
                "# One machine: inter_node_* repeat intra_node_* (no network is crossed)."]
        return "\n".join(head) + "\n\n" + toml_table("cluster", self.cluster_table()) + "\n" + \
            toml_table("measured", self.measured_table())


# How each [measured] key of a profile moves with the machine's speed, for at_speed: by the speed of the ranks' own
# work ("compute": kernels, op dispatch, Python), or of one kind of call between ranks, as calibrate measured each
# in context ("calls": a collective after a layer, which the tables and every synchronising collective stand for;
# "p2p": a send/recv after a layer, for the send_recv table and the pipeline's wake-up; "exchange": the pipeline
# executor's exchange after a layer, for its cost beyond the table; "fsdp": a ZeRO-3 layer beyond a plain one, for
# FSDP's per-call cost), or of a GPU's host ("host": the model at a handful of tokens, where the GPU waits on it; a
# host and its GPU drift apart). The rest are not times the planner reads (ratios, counts, the points behind a figure,
# labels).
SPEED_CLASS = {
    **dict.fromkeys(HOST_FLOOR_KEYS, "host"),
    **dict.fromkeys(("layer_overhead_s", "embedding_overhead_s", "head_overhead_s", "step_overhead_s",
                     "checkpoint_overhead_s", "full_checkpoint_overhead_s", "fsdp_tensor_s", "ddp_microbatch_s", CALIBRATED_STEP_OVERHEAD,
                     "split_backward_s", "cp_ring_step_s", "cp_allgather_s"), "compute"),
    **dict.fromkeys(("sync_overhead_s", "tp_call_s", "tp_sp_call_s", "zero1_call_s", "all_reduce", "all_gather",
                     "reduce_scatter", "broadcast"), "calls"),
    **dict.fromkeys(("p2p_sync_s", "send_recv"), "p2p"),
    "pipeline_exchange_s": "exchange",
    **dict.fromkeys(("wait_penalty_points", "handoff_points"), "exchange"),  # [[wait, seconds], ...]: as a table's
    "fsdp_call_s": "fsdp",
}
COMPUTE_RATES = ("matmul_tflops", "model_tflops")  # FLOP/s: divided by the compute ratio
NOT_SECONDS = ("world_size", "backend", "dtype", "model", "tokens", "gemms", "edge_points", "sync_points", "loop_points",
               "split_points", "concurrent_slowdown", "alone_points", "model_points", "other_cpu_cores",
               "reference_rounds_s", "comm_overlap", "fsdp_points", "gloo_loop_threads", "cp_points", "tp_points",
               "lockstep_spread", "action_scatter", "host_floor_points", "one_sequence_points")  # (shares of the compute: they move with the compute itself)
# A kind of call not timed again stands in for by "calls", and "calls" by "compute".
FALLBACK = {"p2p": "calls", "exchange": "p2p", "fsdp": "calls", "calls": "compute", "host": "compute"}
RATIO_CLASSES = ("calls", "p2p", "exchange", "fsdp", "host")  # in FALLBACK's order: each one's fallback comes before it


def tp_call_in_step(profile: Profile, model, micro_batch: int, seq_len: int, sp: bool = False) -> float | None:
    """What each tensor-parallel collective costs in a TP step beyond its table time, from measure_tp's points: the
    per-call charge (planner/comm.tp_sync_time) at which the planner's (TP - plain) for the same model on this
    profile — its split GEMMs, element-wise passes and edges, every TP call at its table's time + this charge —
    equals the measured one. It holds what sync_overhead_s (one all-reduce after a layer) does not: the work around
    each call in the runtime's TP layer (its autograd functions and their copies, the vocabulary masks), and how the
    ranks arrive at calls that follow each other closely. None where the model did not split over the ranks.
    `sp`: the same for the split with sequence parallelism (tp_points[2]; its all-gathers and reduce-scatters),
    None where calibrate did not time it."""
    point = 2 if sp else 1
    if len(profile.tp_points) <= point or not profile.tp_layers:
        return None
    from dataclasses import replace

    from shardwise.planner.job import runtime_job
    from shardwise.planner.step_time import stage_cost
    from shardwise.specs import Layout

    spec = replace(model, num_layers=profile.tp_layers)
    # without a GPU's host floor: below it the planner's max(host, device) would hide the calls' charge
    base = replace(profile, tp_call_s=None, tp_sp_call_s=None, host_floor_points=[]).to_cluster()
    key = "tp_sp_call_s" if sp else "tp_call_s"

    def planned(call_s: float, tp: int) -> float:
        """The planner's forward + backward of one micro-batch at `tp`, each TP call charged `call_s`."""
        cluster = replace(base, measured={**base.measured, key: call_s})
        cost = stage_cost(runtime_job(spec, cluster, micro_batch, seq_len, gpu=profile.backend == "nccl"),
                          Layout(tp=tp, micro_batch=micro_batch, sequence_parallel=sp and tp > 1), 0)
        return cost.f + cost.b + cost.w

    step, free = 1e-3, planned(0.0, profile.world)
    at_zero = free - planned(0.0, 1)  # the planner's TP - plain, its TP calls free
    calls = (planned(step, profile.world) - free) / step  # TP calls it charges a micro-batch
    if calls <= 0:
        return None
    # Below 0 where the tables ran slow: a small collective timed back to back on a shared machine is bimodal (both
    # ranks on one core or not: 0.3 or 1.8 ms for one all-reduce of 16 KiB in two calibrations of tiny minutes
    # apart), its call in context is not. No call below nothing: at least minus the cheapest table at the layer's
    # activation.
    tables = profile.monotone_tables()  # sync_bytes: measure_sync's activation, the layer's at this micro-batch
    floor = min((interpolate(tables[k], profile.sync_bytes) for k in ("all_reduce", "all_gather", "reduce_scatter")
                 if tables.get(k)), default=0.0)
    # never past what the profile's loader allows (an activation beyond the largest --sizes extrapolates the tables)
    floor = min(floor, tp_call_credit(tables))
    return max((profile.tp_points[point] - profile.tp_points[0] - at_zero) / calls, -floor)


def speed_ratios(ratios: dict) -> dict:
    """Every class's ratio, a missing one (None) taken from its FALLBACK; {} without a compute ratio."""
    if not ratios.get("compute"):
        return {}
    out = {"compute": ratios["compute"]}
    for name in RATIO_CLASSES:
        out[name] = ratios.get(name) or out[FALLBACK[name]]
    return out


def at_speed(cluster, ratios: dict):
    """A calibrated cluster as the machine runs now: each time in [measured] x its class's ratio (SPEED_CLASS;
    tables row by row), the rates and the copy bandwidth divided by the compute ratio, the alpha-beta link fitted to
    the tables by the calls'. `ratios` = speed_ratios(...). validate's drift correction: each ratio is one of the
    calibration's own workloads timed again beside the sweep (validate.machine_speed); no constant is refitted."""
    from dataclasses import replace

    m = dict(cluster.measured)
    for key, kind in SPEED_CLASS.items():
        if isinstance(m.get(key), list):
            m[key] = [[size, seconds * ratios[kind]] for size, seconds in m[key]]
        elif key in m:
            m[key] = m[key] * ratios[kind]
    for key in ("wait_penalty_points", "handoff_points"):  # the waits are the neighbour's compute: they move with it
        if m.get(key):
            m[key] = [[wait * ratios["compute"], seconds] for wait, seconds in m[key]]
    for key in COMPUTE_RATES:
        if key in m:
            m[key] = m[key] / ratios["compute"]
    compute, calls = ratios["compute"], ratios["calls"]
    return replace(cluster, measured=m, peak_flops=cluster.peak_flops / compute,
                   hbm_bandwidth=cluster.hbm_bandwidth / compute,
                   intra_node_bandwidth=cluster.intra_node_bandwidth / calls,
                   inter_node_bandwidth=cluster.inter_node_bandwidth / calls,
                   intra_node_latency=cluster.intra_node_latency * calls,
                   inter_node_latency=cluster.inter_node_latency * calls)


def fit_alpha_beta(kind: str, points: list, world: int) -> tuple[float, float]:
    """(beta bytes/s, alpha s) of t = steps (n-1) alpha + volume (n-1)/n B / beta (send_recv: alpha + B / beta).

    beta: least-squares slope through the larger half of the sizes, where bandwidth dominates;
    alpha: the smallest size's time per latency step."""
    if kind in _RING:
        steps, volume = _RING[kind]
        latency_steps, factor = steps * (world - 1), volume * (world - 1) / world
    elif kind == "broadcast":  # pipelined ring: (n-1) alpha + B / beta
        latency_steps, factor = world - 1.0, 1.0
    else:  # send_recv: one message between two ranks
        latency_steps, factor = 1.0, 1.0
    pts = sorted(points)
    big = pts[len(pts) // 2:] if len(pts) >= 4 else pts[-2:]
    xs, ys = [factor * b for b, _ in big], [t for _, t in big]
    slope = 0.0
    if len(xs) >= 2:
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        den = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den > 0 else 0.0
    if slope <= 0:  # one point, or noise flattened the large sizes: the largest point's rate
        slope = ys[-1] / xs[-1]
    return 1.0 / slope, pts[0][1] / latency_steps


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):  # JSON's escapes are TOML's basic-string escapes; TOML also forbids a raw DEL
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    return "[" + ", ".join(_toml_value(x) for x in v) + "]"


def toml_table(name: str, table: dict) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in table.items())
