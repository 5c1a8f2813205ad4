"""The measurements one rank runs (inside its process group), with one timing discipline for all:
warm-up, a barrier before every timed repeat, the median of the repeats."""

from __future__ import annotations

import math
import os
import platform
import statistics
import time

import torch
import torch.distributed as dist

from shardwise import data, precision

from shardwise.calibrate.config import COLLECTIVES, MODEL_LAYERS, MODEL_ROUNDS, CalibrateConfig, gemm_shapes, human
from shardwise.parallel.sharded import Sharded

# Small operations run back to back in batches lasting at least this long, so that each repeat holds
# its share of the machine's scheduling hiccups (a rank descheduled for a 4 ms tick stalls a collective)
# as a training step of many such operations does; the median over repeats then drops only rare outliers.
MIN_REPEAT_S = 20e-3
MAX_INNER = 1000
# A measurement whose interquartile range exceeds this share of its median is measured once more
# (the quieter of the two is kept) and, if still noisy, flagged in the profile.
NOISY = 0.5
# Rounds of the in-context measurements (measure_sync, measure_fsdp), their variants alternating.
SYNC_ROUNDS = 5


class Timer:
    """This rank's device, dtype and timing discipline; reductions agree a figure across ranks."""

    def __init__(self, cfg: CalibrateConfig, rank: int, world: int, mesh=None):
        self.cfg, self.rank, self.world = cfg, rank, world
        cuda = cfg.device_type == "cuda"
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        self.dtype = precision.compute_dtype(self.device.type, cfg.dtype)
        self._mesh, self._tp_mesh = mesh, None

    def mesh(self):
        """The data-parallel mesh (dp = world) every measurement that needs one shares, built on first use
        (collective): one mesh, as a `train` job holds one. Each of its gloo groups keeps a thread that wakes 100 times
        a second, and the number of such threads changes how fast a CPU rank computes (validate.measure.mesh_split)."""
        if self._mesh is None:
            from shardwise.parallel import build_mesh

            self._mesh = build_mesh(1, self.world, 1, backend=self.cfg.backend, timeout_s=self.cfg.timeout_s)
        return self._mesh

    def tp_mesh(self):
        """The same ranks as one tensor-parallel group (tp = world), on the data-parallel mesh's groups: it adds no
        process group (no gloo thread) to the calibration, as validate's layouts share theirs."""
        if self._tp_mesh is None:
            from shardwise.parallel.mesh import moved

            self._tp_mesh = moved(self.mesh(), "dp", "tp")
        return self._tp_mesh

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def reduce(self, values: list[float], op: str) -> list[float]:
        """Element-wise 'max' or 'mean' over ranks (a collective's repeat lasts as long as its slowest rank)."""
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64 if self.device.type == "cpu" else torch.float32, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return [float(v) / (self.world if op == "mean" else 1) for v in t.cpu()]

    def times(self, fn) -> list[float]:
        """Seconds per call for each timed repeat; calls shorter than MIN_REPEAT_S run `inner` times a repeat."""
        for _ in range(self.cfg.warmup):
            fn()
        self.sync()
        self.barrier()
        t0 = time.perf_counter()
        fn()
        self.sync()
        once = time.perf_counter() - t0
        inner = int(self.reduce([min(MAX_INNER, math.ceil(MIN_REPEAT_S / max(once, 1e-9)))], "max")[0])
        out = []
        for _ in range(self.cfg.repeats):
            self.barrier()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            self.sync()
            out.append((time.perf_counter() - t0) / inner)
        return out

    def interleaved(self, fns: dict, repeats: int, seed: int = 0, barrier_each: bool = False) -> dict:
        """Seconds per call of each of `fns` in each of `repeats` repeats, as long as the slowest rank: every
        repeat starts at a barrier and runs every function (`inner` calls each, so each lasts about
        MIN_REPEAT_S) back to back, in a new order (the same on every rank). A busy moment of a shared
        machine then falls on all of them within ~0.1 s, so their differences and ratios, taken repeat by
        repeat (`paired`), hold even when the load moves their absolute times by 2x between repeats.
        `barrier_each`: a barrier before every function too (for a function that some ranks skip, so the
        others wait instead of running the next one beside it)."""
        import random

        names = list(fns)
        for name in names:
            for _ in range(max(self.cfg.warmup, 1)):
                fns[name]()
        self.sync()
        once = []
        for name in names:
            self.barrier()
            t0 = time.perf_counter()
            fns[name]()
            self.sync()
            once.append(time.perf_counter() - t0)
        # From the slowest rank's call (a function some ranks skip takes its length from the others).
        inner = [min(MAX_INNER, math.ceil(MIN_REPEAT_S / max(o, 1e-9))) for o in self.reduce(once, "max")]
        order, rows = random.Random(seed), []
        for _ in range(repeats):
            row = [0.0] * len(names)
            self.barrier()
            for i in order.sample(range(len(names)), len(names)):
                if barrier_each:
                    self.barrier()
                t0 = time.perf_counter()
                for _ in range(inner[i]):
                    fns[names[i]]()
                self.sync()
                row[i] = (time.perf_counter() - t0) / inner[i]
            rows.append(row)
        flat = self.reduce([x for row in rows for x in row], "max")
        return {name: flat[i::len(names)] for i, name in enumerate(names)}


def paired(reps: dict, a: str, b: str) -> float:
    """Median over repeats of reps[a] - reps[b] (measured side by side in each repeat: Timer.interleaved)."""
    return statistics.median(x - y for x, y in zip(reps[a], reps[b]))


def in_rounds(t: Timer, fns: dict, repeats: int, label: str, **kw):
    """Timer.interleaved over `fns` in MODEL_ROUNDS parts of about repeats / MODEL_ROUNDS repeats, yielding `label`
    after each: measure_rank runs one part in each of its rounds, beside the model's, so a per-call cost holds the
    same spread of the machine's load as the model's rate (measured in one stretch of a few seconds, a neighbour's
    burst moved a whole figure: p2p_sync_s 3.8 and 1.8 ms, fsdp_call_s 3.5 and 2.2 ms in two calibrations of one
    job). Returns every part's repeats pooled, each as Timer.interleaved gives them."""
    reps: dict = {name: [] for name in fns}
    for r in range(MODEL_ROUNDS):
        for name, times in t.interleaved(fns, repeats // MODEL_ROUNDS + (r < repeats % MODEL_ROUNDS), seed=r,
                                         **kw).items():
            reps[name] += times
        yield f"{label}, round {r + 1} of {MODEL_ROUNDS}"
    return reps


def spread(times: list[float]) -> float:
    """Interquartile range / median."""
    s = sorted(times)
    med = statistics.median(s)
    return (s[(3 * len(s)) // 4] - s[len(s) // 4]) / med if med > 0 else 0.0


def measure_matmul(t: Timer, out: dict):
    """out["matmul_tflops"]: the step's GEMM mix, FLOPs / time; out["gemms"]: [[m, n, k, seconds]]. Mean over ranks."""
    shapes = gemm_shapes(t.cfg.model, t.cfg.tokens)
    seconds = []
    for m, n, k, _ in shapes:
        a = torch.randn(m, k, device=t.device, dtype=t.dtype)
        b = torch.randn(k, n, device=t.device, dtype=t.dtype)
        c = torch.empty(m, n, device=t.device, dtype=t.dtype)
        seconds.append(statistics.median(t.times(lambda: torch.mm(a, b, out=c))))
        yield f"matmul {m}x{n}x{k}"
    seconds = t.reduce(seconds, "mean")
    flops = sum(2 * m * n * k * count for m, n, k, count in shapes)
    busy = sum(s * count for s, (*_, count) in zip(seconds, shapes))
    out["matmul_tflops"] = flops / busy / 1e12
    out["gemms"] = [[m, n, k, s] for (m, n, k, _), s in zip(shapes, seconds)]


def measure_copy(t: Timer, out: dict):
    """out["copy_gbs"]: read + write bytes per second of one large copy, mean over ranks."""
    src = torch.ones(t.cfg.copy_bytes // _element_size(t.dtype), device=t.device, dtype=t.dtype)
    dst = torch.empty_like(src)
    seconds = t.reduce([statistics.median(t.times(lambda: dst.copy_(src)))], "mean")[0]
    out["copy_gbs"] = 2 * src.numel() * src.element_size() / seconds / 1e9
    yield "memory copy"


def model_flops(model, layers: int, batch: int, seq: int) -> float:
    """Forward + backward FLOPs of one micro-batch through `layers` layers and the LM head, weighted as
    the planner times them (planner/step_time.py): GEMMs at the rate, the attention core at
    FLASH_EFFICIENCY of it. Fitting measured times against these makes the planner reproduce them."""
    from shardwise.planner.layer_time import FLASH_EFFICIENCY, matmul_params_per_layer

    tokens = batch * seq
    gemm = 2 * tokens * (layers * matmul_params_per_layer(model) + model.hidden * model.vocab_size)
    attention = 4 * tokens * seq * model.q_dim * layers / FLASH_EFFICIENCY
    return 3 * (gemm + attention)


def model_elementwise(model, layers: int, batch: int, seq: int, element_bytes: int, copy_gbs: float) -> float:
    """Seconds of the element-wise passes the planner times on their own in `layers` layers' forward + backward
    (planner/layer_time.calibrated_elementwise: once in forward, twice in backward) at the measured copy
    bandwidth. measure_model takes them out of its measured times before fitting the rate: left in, the rate
    and the overhead absorbed them and the planner added them again (for tiny 0.21 ms per micro-batch, 2-5 %
    of its forward + backward)."""
    from shardwise.planner.layer_time import calibrated_elementwise

    return 3 * layers * calibrated_elementwise(model, batch * seq, element_bytes, copy_gbs * 1e9)


def fit_model(xs: list[float], rows: list[list[float]], own: list[float]) -> tuple[float, float]:
    """(intercept seconds, slope seconds per weighted FLOP) of time = intercept + slope x FLOPs, from repeats
    `rows` (each: the sizes' seconds, run side by side) less `own` (each size's seconds the planner times on its
    own, model_elementwise): a Theil-Sen line per repeat, the median intercept and slope. A non-positive slope
    (noise) leaves the whole time at the largest size as FLOPs."""
    fits = [fit_line(xs, [y - o for y, o in zip(row, own)]) for row in rows]
    overhead, slope = statistics.median(f[0] for f in fits), statistics.median(f[1] for f in fits)
    if slope <= 0:
        ys = [statistics.median(row[i] for row in rows) - own[i] for i in range(len(xs))]
        return 0.0, ys[-1] / xs[-1]
    return overhead, slope


def split_edges(overhead: float, slope: float, edges: list[float], head_flops: float, layers: int) -> dict:
    """The fitted intercept (`overhead`, seconds per micro-batch of the whole measured model) split by where it is
    paid: the first pipeline stage's embedding (`edges[0]`, measured alone), the last stage's final norm, LM head
    and loss beyond the head's GEMM FLOPs at the fitted rate (`edges[1]` less `head_flops` x `slope`), and the rest
    per layer. The whole model's time is unchanged; a pipeline rank pays only its own edge (the last stage's was
    5-15x the first's on tiny and the GQA config: 0.7-1.5 ms against 0.1-0.2 ms)."""
    embedding = max(edges[0], 0.0)
    head = max(edges[1] - head_flops * slope, 0.0)
    return {"layer_overhead_s": max(overhead - embedding - head, 0.0) / layers,
            "embedding_overhead_s": embedding, "head_overhead_s": head}


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Theil-Sen (intercept, slope) of y = intercept + slope * x: the median of the pairwise slopes, then
    the median intercept — one disturbed point (a busy machine) cannot tilt it, unlike least squares."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    slope = statistics.median(slopes) if slopes else 0.0
    return statistics.median(y - slope * x for x, y in zip(xs, ys)), slope


def reference(t: Timer):
    """The reference workload: the runtime's model (at most MODEL_LAYERS layers and the LM head), forward +
    backward on micro_batch x seq_len tokens; returns the function that runs it once. measure_model times it as
    "none <micro_batch>" (Profile.reference_s); validate times it again between its rounds."""
    from shardwise.model import Transformer

    spec = t.cfg.model
    model = Transformer(spec, seed=0, layer_ids=range(min(spec.num_layers, MODEL_LAYERS)), device=t.device)
    x = torch.randint(0, spec.vocab_size, (t.cfg.micro_batch, t.cfg.seq_len), device=t.device)

    def run():
        with _amp(t):
            loss = model(x, x)
        loss.backward()
    return run


def _amp(t: Timer):
    """The training loop's autocast (shardwise.precision) where the timer measures in BF16 (a GPU): the runtime's
    weights stay fp32 and every measured forward runs under it, else a bf16 input meets fp32 norm weights."""
    return precision.autocast(t.device.type, t.cfg.dtype)


def measure_model(t: Timer, out: dict):
    """The runtime's own model, forward + backward, at micro-batches b, 2b, 3b, 4b of seq_len tokens:
    time = overhead + weighted FLOPs / rate + the element-wise passes the planner times on its own
    (model_elementwise, at measure_copy's bandwidth: measured before the fit). out["model_tflops"] = the rate
    (everything else a layer runs: GEMMs, attention, norms); out["layer_overhead_s"] = the fixed cost of a micro-batch
    (op dispatch, kernel launches) per layer; out["checkpoint_overhead_s"] = what a checkpointed layer
    costs beyond the work it recomputes (selective recompute at micro-batch b against none, less the
    planner's estimate of the recomputed attention core), out["full_checkpoint_overhead_s"] the same for full recompute
    (every layer checkpointed whole, less the forward the planner recomputes); out["optimizer_s"] = the rest of a bare training
    step of one micro-batch (the batch, zero_grad, the runtime's AdamW over its out["optimizer_params"]
    parameters; what train's loop adds to a bare step is measure_loop's). A model of at most MODEL_LAYERS layers (and
    the LM head) stands for the whole one. The six variants run side by side in every repeat
    (Timer.interleaved: MODEL_ROUNDS x repeats repeats, a new order each), each repeat as long as its
    slowest rank, as a synchronous training step is. The line is fitted repeat by repeat (its four sizes
    saw the same load) and the median intercept and slope are kept; the recompute and step costs are the
    median of their paired differences. Fitting the medians of separately timed sizes instead let a busy
    moment make a larger micro-batch look faster than a smaller one (27, 34, 26, 23 ms at load 13)."""
    from shardwise.model import Transformer
    from shardwise.planner.layer_time import FLASH_EFFICIENCY

    spec, seq = t.cfg.model, t.cfg.seq_len
    layers = min(spec.num_layers, MODEL_LAYERS)
    model = Transformer(spec, seed=0, layer_ids=range(layers), device=t.device)
    amp = _amp(t)

    opt = _optimizer(t, Sharded(model, model), None)

    def step(x):
        with amp:
            loss = model(x, x)
        loss.backward()

    def train_step(b):
        """A bare training step of the runtime: the batch, zero_grad, forward + backward, its AdamW."""
        opt.zero_grad(set_to_none=True)
        ((x, y),) = data.local_microbatches(0, 1, b, seq, 1, 0, b, t.device)
        with amp:
            loss = model(x, y)
        loss.backward()
        opt.step()

    batches = [t.cfg.micro_batch * k for k in (1, 2, 3, 4)]
    inputs = {b: torch.randint(0, spec.vocab_size, (b, seq), device=t.device) for b in batches}

    def variant(b, mode):
        def run():
            model.set_recompute(mode if mode in ("selective", "full") else "none")
            train_step(b) if mode == "step" else step(inputs[b])
        return run

    fns = {f"{mode} {b}": variant(b, mode) for b, mode in [(b, "none") for b in batches] +
           [(batches[0], "selective"), (batches[0], "full"), (batches[0], "step")]}
    fns.update(edge_variants(t, batches[0]))
    alone = f"alone {batches[0]}"  # rank 0 computes while the others wait at the next barrier
    # Without recompute, as the base it is compared with: the variants run in a new order every repeat and each sets
    # the model's recompute itself. Left as the previous one set it, about 2 alone runs in 7 recomputed (selective or
    # full) and the slowdown read 0.97-1.08 where the two timed apart read 1.10 (docs/accuracy.md).
    fns[alone] = variant(batches[0], "none") if t.rank == 0 else (lambda: None)
    reps: dict = {name: [] for name in fns}
    for r in range(MODEL_ROUNDS):
        for name, times in t.interleaved(fns, t.cfg.repeats, seed=r, barrier_each=t.world > 1).items():
            reps[name] += times
        yield f"model forward+backward, round {r + 1} of {MODEL_ROUNDS}"
    model.set_recompute("none")
    sizes = [f"none {b}" for b in batches]
    xs = [model_flops(spec, layers, b, seq) for b in batches]
    own = [model_elementwise(spec, layers, b, seq, _element_size(t.dtype), out["copy_gbs"]) for b in batches]
    # One line per repeat (its four sizes ran side by side), the median of their intercepts and slopes.
    overhead, slope = fit_model(xs, [[reps[n][i] for n in sizes] for i in range(len(reps[sizes[0]]))], own)
    ys = [statistics.median(reps[n]) for n in sizes]
    out["model_tflops"] = 1 / slope / 1e12
    out["edge_points"] = [statistics.median(reps[f"{edge} {batches[0]}"]) for edge in ("first", "last")]
    head_flops = 3 * 2 * batches[0] * seq * spec.hidden * spec.vocab_size  # the LM head's GEMMs, as model_flops counts them
    out.update(split_edges(overhead, slope, out["edge_points"], head_flops, layers))
    out["model_points"] = [[x, y] for x, y in zip(xs, ys)]
    # The reference workload (the smallest size) in each round — start, middle and end of the calibration:
    # a machine whose speed moves within minutes shows it here (Profile.reference_drift).
    n = len(reps[sizes[0]]) // MODEL_ROUNDS
    out["reference_rounds_s"] = [statistics.median(reps[sizes[0]][i * n:(i + 1) * n]) for i in range(MODEL_ROUNDS)]
    core = 4 * batches[0] * seq * seq * spec.q_dim / FLASH_EFFICIENCY * slope  # the recomputed attention core
    base, selective = sizes[0], f"selective {batches[0]}"
    out["checkpoint_overhead_s"] = max(paired(reps, selective, base) / layers - core, 0.0)
    full = f"full {batches[0]}"
    out["full_checkpoint_overhead_s"] = full_checkpoint_overhead(spec, layers, batches[0], seq, slope, out["layer_overhead_s"],
                                                                 _element_size(t.dtype), out["copy_gbs"],
                                                                 paired(reps, full, base))
    out["checkpoint_points"] = [ys[0], statistics.median(reps[selective]), statistics.median(reps[full])]
    # The rest of a bare training step on the same model: batch, zero_grad, AdamW.
    out["optimizer_s"] = max(paired(reps, f"step {batches[0]}", base), 0.0)
    # Every rank computing at once against one alone (the machine's cores, memory and caches shared).
    out["alone_points"] = [ys[0], statistics.median(reps[alone])] if t.world > 1 else []
    out["concurrent_slowdown"] = max(statistics.median(x / y for x, y in zip(reps[base], reps[alone]) if y > 0), 1.0) \
        if t.world > 1 else 1.0
    out["optimizer_params"] = sum(p.numel() for p in model.parameters())


def full_checkpoint_overhead(spec, layers: int, batch: int, seq: int, slope: float, layer_overhead_s: float,
                             element_bytes: int, copy_gbs: float, full_minus_none: float) -> float:
    """What a layer checkpointed whole (full recompute) costs per micro-batch beyond the forward the planner recomputes
    — its forward FLOPs at the fitted rate (`slope` seconds per weighted FLOP), its forward element-wise passes and a
    third of its fixed cost — from the model measured with every layer checkpointed against without
    (`full_minus_none`, seconds, its `layers` layers at `batch` sequences): the non-reentrant checkpoint's saved-tensor
    hooks and bookkeeping, and whatever the recomputed forward runs beyond the planner's forward (on tiny 1.5 ms a
    layer against selective recompute's 0.7 ms)."""
    forward = (model_flops(spec, 1, batch, seq) - model_flops(spec, 0, batch, seq)) / 3 * slope \
        + model_elementwise(spec, 1, batch, seq, element_bytes, copy_gbs) / 3 + layer_overhead_s / 3
    return max(full_minus_none / layers - forward, 0.0)


def edge_variants(t: Timer, batch: int) -> dict:
    """The two pipeline edges of the runtime's model, each alone, forward + backward of one micro-batch as a pipeline
    stage runs them: "first <batch>" the embedding (its output's gradient given), "last <batch>" the final norm, LM
    head and loss (its input a received activation that needs a gradient)."""
    from shardwise.model import Transformer

    spec, seq = t.cfg.model, t.cfg.seq_len
    first = Transformer(spec, seed=0, layer_ids=range(0), last=False, device=t.device)
    last = Transformer(spec, seed=0, layer_ids=range(0), first=False, device=t.device)
    ids = torch.randint(0, spec.vocab_size, (batch, seq), device=t.device)
    hidden = torch.randn(batch, seq, spec.hidden, device=t.device)
    grad = torch.ones(batch, seq, spec.hidden, device=t.device)

    def run_first():
        with _amp(t):
            out = first(ids)
        out.backward(grad.to(out.dtype))

    def run_last():
        x = hidden.clone().requires_grad_(True)
        with _amp(t):
            loss = last(x, ids)
        loss.backward()
    return {f"first {batch}": run_first, f"last {batch}": run_last}


def call_workloads(t: Timer) -> tuple[dict, torch.Tensor]:
    """The calls between layers (world > 1): ({"layer": one layer's forward, "both": the layer + an all-reduce of
    its activation (as tensor parallelism issues it), "alone": that all-reduce back to back, "p2p": the layer + a
    send/recv of it between rank pairs, "p2p alone": the send/recv back to back, "exchange": the layer + the pipeline
    executor's own exchange of it with the pair's other rank (parallel.pipeline.BatchP2P: a send and a receive posted
    together, both waited for, as every steady-state exchange of 1F1B and interleaved 1F1B is), "stage": a two-layer
    middle pipeline chunk's forward + backward as the executor runs F and B, "stage exchange": the stage + the same
    exchange, "layer handoff" and "stage handoff": the pair's two ranks taking turns — one runs the layer (the stage)
    while the other waits in the exchange, then the other runs it while the first waits — as a pipeline's ranks do
    where the schedule makes one wait for the other's action}, the activation). measure_sync times them for the
    profile; validate times "layer", "both", "p2p" and "exchange" again beside its sweep (the calls' speed now)."""
    from shardwise.model import Transformer
    from shardwise.parallel.pipeline import BatchP2P

    spec = t.cfg.model
    model = Transformer(spec, seed=0, layer_ids=range(1), first=False, last=False, device=t.device)
    rope = (model.rope_cos, model.rope_sin) if spec.family == "llama" else None
    x = torch.randn(t.cfg.micro_batch, t.cfg.seq_len, spec.hidden, device=t.device, dtype=t.dtype)
    act = torch.ones_like(x)

    def layer():
        with _amp(t):  # the layer's weights are fp32, as a training job's are; on a GPU x is bf16
            model.layers["0"](x, rope)

    def both():
        layer()
        dist.all_reduce(act)

    peer = t.rank ^ 1  # the pairs of the send_recv table; an odd last rank only keeps time

    def send_recv():
        if peer < t.world:
            (dist.send if t.rank % 2 == 0 else dist.recv)(act, peer)

    def layer_send_recv():
        layer()
        send_recv()

    p2p = BatchP2P()

    def exchange():
        if peer < t.world:  # the executor's exchange: its buffer, both messages posted, each waited for
            for work in p2p.post([(act, peer, 0)], [(torch.empty_like(act), peer, 0)], None):
                work.wait()

    chunk = Transformer(spec, seed=0, layer_ids=range(STAGE_LAYERS), first=False, last=False, device=t.device)

    def stage():
        inp = x.clone().requires_grad_(True)
        with _amp(t):
            y = chunk(inp, None)
        torch.autograd.backward(y, act)

    def handoff(compute):
        def run():  # rank 0 computes while rank 1 waits in the exchange, then the other way round
            if peer >= t.world:
                return
            if t.rank % 2 == 0:
                compute(), exchange(), exchange()
            else:
                exchange(), compute(), exchange()
        return run

    return {"layer": layer, "both": both, "alone": lambda: dist.all_reduce(act),
            "p2p": layer_send_recv, "p2p alone": send_recv, "exchange": lambda: (layer(), exchange()),
            "stage": stage, "stage exchange": lambda: (stage(), exchange()),
            "layer handoff": handoff(layer), "stage handoff": handoff(stage)}, act


STAGE_LAYERS = 2  # the pipeline stage behind measure_sync's second exchange (as measure_split_backward's chunk)


def measure_sync(t: Timer, out: dict):
    """out["sync_points"]: what a small all-reduce costs when it is issued between compute, against
    its back-to-back (table) time. Back to back, the ranks stay in lockstep; between compute they
    arrive apart and the first one blocks — on a shared machine it may be descheduled and must be woken
    (a 4 ms scheduler tick in the worst case), and its partner waits. The compute is one layer of the
    model's forward, the message one micro-batch's activation, as tensor parallelism issues them. Three
    loops, interleaved round by round so a busy moment hits all three: the layer alone, the layer +
    all-reduce, the all-reduce alone; each repeat is a mean over many calls (so it holds its share of
    the stalls), the median over repeats is kept. The same for a send/recv between rank pairs after the
    layer (a pipeline's blocking receive). Profile.sync_overhead_s: (layer + all-reduce) - layer - the
    table's time for that all-reduce (so table + it is the call in context: the back-to-back time of a
    small collective on a shared machine is bimodal, with both ranks on one core or not, and the planner
    reads the table); Profile.p2p_sync_s the same for the send/recv. The pipeline executor's two-way exchange is
    timed after two computes: a layer's forward (sync_points[5]) and a pipeline stage's forward + backward ([6] alone,
    [7] with the exchange), 5x longer. Each rank waits there for the other's compute *that time*, and the two ranks'
    times scatter (by ~20 % of a call on 2 shared cores), so an exchange costs more after a longer compute: on tiny
    0.39-0.42 ms after the layer, 0.69-0.76 ms after the stage (docs/accuracy.md). Profile.pipeline_exchange_s is the
    line's intercept beyond the table, Profile.lockstep_spread its slope (seconds of exchange per second of compute
    before it). Then the same two computes taken in turns ([8] the layer, [9] the stage: one rank's turn, half a call),
    each rank waiting in the exchange while the other computes, as a pipeline rank waits for its neighbour's action:
    the rank that waited runs slower once woken (its caches, its core's state; more after a longer wait), which the
    lockstep exchange, where neither waits long, does not see (Profile.wait_penalty_points). A barrier before each
    workload, as validate times them again (and as measure_model and measure_cp time theirs): the two sides of a ratio
    under one discipline."""
    if t.world == 1:
        return
    loops, act = call_workloads(t)
    reps = yield from in_rounds(t, loops, SYNC_ROUNDS * t.cfg.repeats, "calls between layers", barrier_each=True)
    layer_s = statistics.median(reps["layer"])
    # Each call in context: the layer's median plus the paired difference (call + layer) - layer.
    out["sync_points"] = [layer_s, layer_s + paired(reps, "both", "layer"), statistics.median(reps["alone"]),
                          layer_s + paired(reps, "p2p", "layer"), statistics.median(reps["p2p alone"]),
                          layer_s + paired(reps, "exchange", "layer"), statistics.median(reps["stage"]),
                          statistics.median(reps["stage"]) + paired(reps, "stage exchange", "stage")]
    # One rank's turn of each handoff (half a call), in context: the lockstep exchange after the same compute plus the
    # paired difference of the two, repeat by repeat.
    for handoff, lockstep, point in (("layer handoff", "exchange", 5), ("stage handoff", "stage exchange", 7)):
        turn = statistics.median(h / 2 - x for h, x in zip(reps[handoff], reps[lockstep]))
        out["sync_points"].append(out["sync_points"][point] + turn)
    out["sync_bytes"] = act.numel() * act.element_size()
    out["action_scatter"] = t.reduce([action_scatter(t, loops["stage"])], "mean")[0]
    yield "one stage call at a time"


SCATTER_CALLS = 40  # single calls of the stage behind Profile.action_scatter (~0.2 s on tiny)


def action_scatter(t: Timer, stage) -> float:
    """How much one pipeline action's time scatters about its median on this machine: SCATTER_CALLS calls of the
    stage workload, each timed alone while every rank runs its own (as pipeline ranks compute side by side), their
    interquartile range / 1.349 (a normal law's standard deviation) / median. The repeats of Timer.interleaved
    average many calls each, so they do not show it. The planner's exchange model uses it as the scale on which two
    ranks' arrivals at an exchange are told apart (schedules.p2p.exchange_paid): 0.02-0.22 in world-2 calibrations here, below
    the 0.2-0.55 the executor's own records show over a whole run, which holds the machine's drift too; the replays
    of those records fit alike anywhere in 0.05-0.5 (docs/accuracy.md, "Pipelines: who waits pays")."""
    times = []
    for _ in range(SCATTER_CALLS):
        t0 = time.perf_counter()
        stage()
        t.sync()
        times.append(time.perf_counter() - t0)
    return spread(times) / 1.349


def fsdp_workloads(t: Timer) -> tuple[dict, object]:
    """One layer with the embedding and head (world > 1): ({"plain": its forward + backward, "sharded": the same as
    the runtime shards it under ZeRO-3, "plain update" / "sharded update": the runtime's clip + AdamW on each,
    "ddp": as the runtime wraps it in DDP, under no_sync}, the sharded chunk). measure_fsdp times them for the
    profile; validate times "plain" and "sharded" again beside its sweep (FSDP's calls' speed now)."""
    from shardwise.model import Transformer
    from shardwise.parallel import GlobalGradNorm, grad_sync, parallelize
    from shardwise.specs import Layout

    spec = t.cfg.model
    mesh = t.mesh()

    def layer():
        return Transformer(spec, seed=0, layer_ids=range(1))

    model = layer().to(t.device)
    plain = Sharded(model, model)
    sharded = parallelize(layer(), mesh, Layout(dp=t.world, zero=3), t.device)
    replicated = parallelize(layer(), mesh, Layout(dp=t.world), t.device)
    x = torch.randint(0, spec.vocab_size, (t.cfg.micro_batch, t.cfg.seq_len), device=t.device)

    def step(chunk):
        chunk.module(x, x).backward()

    updates = {"plain": (GlobalGradNorm([plain], None), _optimizer(t, plain, None)),
               "sharded": (GlobalGradNorm([sharded], mesh), _optimizer(t, sharded, mesh))}

    def update(name):
        norm, opt = updates[name]
        norm.clip_(1.0, t.device)
        opt.step()

    def ddp_step():
        with grad_sync(replicated, enabled=False):  # a step's micro-batches before its last: wrapper and hooks only
            step(replicated)

    return {"plain": lambda: step(plain), "sharded": lambda: step(sharded), "plain update": lambda: update("plain"),
            "sharded update": lambda: update("sharded"), "ddp": ddp_step}, sharded


def measure_fsdp(t: Timer, out: dict):
    """out["fsdp_call_s"]: what each of FSDP's collectives costs in a training step beyond its table
    time: the synchronisation, and FSDP's own work around it (copying shards in and out of the flat
    buffer, registering the gathered parameters, its hooks). One layer with the embedding and head,
    forward + backward, plain and as the runtime shards it under ZeRO-3 (`parallelize`: the layer and
    the root — 5 collectives: the layer's all-gather in forward and backward and reduce-scatter, the
    root's all-gather and reduce-scatter), in interleaved rounds; the tables' time for those 5 is taken out.
    out["fsdp_points"][2:4]: the runtime's clip + AdamW over the plain and the sharded parameters (each a
    DTensor, whose every op pays a dispatch; Profile.fsdp_tensor_s takes the difference per tensor).
    out["ddp_microbatch_s"]: the same model as the runtime wraps it in DistributedDataParallel (ZeRO-0),
    under its no_sync, against plain: what DDP's wrapper and per-parameter hooks cost per micro-batch."""
    if t.world == 1:
        out["fsdp_call_s"] = out["ddp_microbatch_s"] = 0.0
        return
    from shardwise.planner.comm import interpolate

    spec = t.cfg.model
    fns, sharded = fsdp_workloads(t)
    reps = yield from in_rounds(t, fns, SYNC_ROUNDS * t.cfg.repeats, "FSDP and DDP layer against a plain one",
                                barrier_each=True)  # as validate times "plain" and "sharded" again (measure_sync)
    plain_s, plain_u = statistics.median(reps["plain"]), statistics.median(reps["plain update"])
    sharded_s, ddp_s = plain_s + paired(reps, "sharded", "plain"), plain_s + paired(reps, "ddp", "plain")
    sharded_u = plain_u + paired(reps, "sharded update", "plain update")
    out["ddp_microbatch_s"] = max(ddp_s - plain_s, 0.0)
    out["fsdp_tensors"] = len(list(sharded.parameters()))
    esize = _element_size(t.dtype)
    layer_bytes = spec.params_per_layer() * esize
    root = (spec.num_params() - spec.num_layers * spec.params_per_layer()) * esize
    tables = out["tables"]
    wire = sum(interpolate(tables[kind], nbytes) for kind, nbytes in
               (("all_gather", layer_bytes), ("all_gather", layer_bytes), ("reduce_scatter", layer_bytes),
                ("all_gather", root), ("reduce_scatter", root)))
    out["fsdp_call_s"] = max((sharded_s - plain_s - wire) / 5, 0.0)
    out["fsdp_points"] = [plain_s, sharded_s, plain_u, sharded_u, ddp_s]


def cp_workloads(t: Timer) -> dict:
    """One middle layer (its input from the layer before), forward + backward on this rank's seq_len / world tokens
    (world > 1, seq_len a multiple of 2 x world): "plain" with the plain causal attention over those tokens, "ring"
    and "allgather" as the runtime runs them under context parallelism over every rank (cp = world: shardwise.parallel.
    context_parallel, on the data-parallel mesh's group, so no new process group). {} where cp = world cannot split
    the sequence."""
    from shardwise.model import Transformer
    from shardwise.parallel import context_parallel

    spec, seq, cp = t.cfg.model, t.cfg.seq_len, t.world
    if cp < 2 or seq % (2 * cp):
        return {}
    group = t.mesh()["dp"]  # every rank, as a cp = world mesh's group

    def layer(mode):
        model = Transformer(spec, seed=0, layer_ids=range(1), first=False, last=False, device=t.device)
        return context_parallel(model, group, mode, seq) if mode else model

    x = torch.randn(t.cfg.micro_batch, seq // cp, spec.hidden, device=t.device, dtype=t.dtype)
    grad = torch.randn_like(x)

    def run(model):
        def step():
            inp = x.clone().requires_grad_(True)
            with _amp(t):
                y = model(inp, None)
            torch.autograd.backward(y, grad)
        return step
    return {"plain": run(layer(None)), "ring": run(layer("ring")), "allgather": run(layer("allgather"))}


def measure_cp(t: Timer, out: dict):
    """out["cp_points"] = [plain, ring, allgather]: seconds of one layer's forward + backward on seq_len / world tokens
    with the plain attention and with each context-parallel attention over every rank (cp_workloads), in SYNC_ROUNDS x
    repeats interleaved repeats (the ring's and the all-gather's from their paired differences with plain);
    out["cp_attention_s"]: what the planner already charges for the extra attention work of a context-parallel layer
    (its local queries attend the whole sequence, against the plain layer's local one: the attention FLOPs at the
    fitted rate, as planner/layer_time._calibrated_layer counts them, forward + backward); out["cp_block_bytes"]: one
    rank's K/V block. Profile.cp_ring_step_s and cp_allgather_s take from the difference what the planner counts
    (these and the exchanges at the tables): the rest is the attention's own work around its kernels — the ring's
    per-step slicing, online-softmax merges and buffers, the all-gather's reordering — measured (on 2 CPU cores, tiny:
    about 1.8 ms a layer beyond the plain one for the ring, 2.9 ms for the all-gather, ~1 ms of each beyond the
    exchanges; docs/accuracy.md)."""
    fns = cp_workloads(t)
    if not fns:
        out["cp_points"] = []
        return
    # A barrier before each variant: the plain layer never synchronises, so the ranks' skew over its ~20 ms of calls
    # would otherwise land in the first exchange of whichever context-parallel variant runs next (ring - plain read
    # 1.8-2.6 ms a layer that way on tiny, 1.7-2.2 ms with it, against 1.96 ms in a training step: docs/accuracy.md).
    reps = yield from in_rounds(t, fns, SYNC_ROUNDS * t.cfg.repeats, "context-parallel attention against a plain one",
                                barrier_each=True)
    plain_s = statistics.median(reps["plain"])
    out["cp_points"] = [plain_s, plain_s + paired(reps, "ring", "plain"), plain_s + paired(reps, "allgather", "plain")]
    spec, b, local = t.cfg.model, t.cfg.micro_batch, t.cfg.seq_len // t.world
    out["cp_attention_s"] = cp_attention_flops(spec, b, t.cfg.seq_len, t.world) / (out["model_tflops"] * 1e12)
    out["cp_block_bytes"] = 2 * b * local * spec.kv_dim * _element_size(t.dtype)


def cp_attention_flops(spec, batch: int, seq: int, cp: int) -> float:
    """Weighted attention FLOPs (forward + backward, as planner/layer_time._calibrated_layer weighs them: 4 x tokens x
    keys x width, at FLASH_EFFICIENCY of the rate, backward twice) a context-parallel layer's seq / cp local queries
    run against the whole sequence, beyond a plain layer whose queries attend their own seq / cp tokens."""
    from shardwise.planner.layer_time import FLASH_EFFICIENCY

    local = seq // cp
    return 3 * 4 * batch * local * (seq - local) * spec.attention_width / FLASH_EFFICIENCY


def measure_split_backward(t: Timer, out: dict):
    """out["split_points"] = [plain, split]: seconds of a two-layer middle pipeline chunk (input from the
    stage before, output to the next), forward + backward, with one backward as the executor runs B, and
    split as it runs ZB-H1's I then W (torch's stage_backward_input / stage_backward_weight, which walk
    the graph twice and rebuild its weight part in Python). Interleaved in SYNC_ROUNDS x repeats repeats.
    Profile.split_backward_s = (split - plain) per layer: what the planner adds to a split stage's W."""
    from shardwise.model import Transformer
    from shardwise.parallel.pipeline import _split_backward

    if _split_backward is None:  # older torch: the executor's fallback walks the graph twice as well
        out["split_points"] = []
        yield "pipeline chunk: no split backward in this torch"
        return
    spec, layers = t.cfg.model, 2
    chunk = Transformer(spec, seed=0, layer_ids=range(layers), first=False, last=False, device=t.device)
    x = torch.randn(t.cfg.micro_batch, t.cfg.seq_len, spec.hidden, device=t.device, dtype=t.dtype)
    grad = torch.randn_like(x)
    params = [p for p in chunk.parameters() if p.requires_grad]

    def forward():
        inp = x.clone().requires_grad_(True)
        with _amp(t):
            return inp, chunk(inp, None)

    def plain():
        torch.autograd.backward(forward()[1], grad)

    def split():
        inp, y = forward()
        _, groups = _split_backward.stage_backward_input([y], [grad], [inp], iter(params))
        _split_backward.stage_backward_weight(iter(params), groups)

    reps = yield from in_rounds(t, {"plain": plain, "split": split}, SYNC_ROUNDS * t.cfg.repeats,
                                "pipeline chunk: one backward against a split one")
    plain_s = statistics.median(reps["plain"])
    out["split_points"] = [plain_s, plain_s + paired(reps, "split", "plain")]
    out["split_layers"] = layers


def measure_loop(t: Timer, out: dict):
    """out["loop_points"] = [bare, loop]: seconds per step of the runtime's data-parallel step over all
    ranks (dp = world, one micro-batch of micro_batch x seq_len per rank, the model of measure_model)
    run bare — the batch, zero_grad, forward + backward (DDP), AdamW — and as `shardwise train`'s loop
    runs it (train.TrainLoop: also the global-norm clip, the LR schedule, the loss's all-reduce, the
    step's scalars read back, its record written to a metrics file on rank 0). The difference is what
    the loop adds to a bare step (Profile.train_step_overhead_s). Both on the same runtime, in
    SYNC_ROUNDS interleaved rounds; each repeat as long as its slowest rank."""
    import os
    from dataclasses import replace

    from shardwise.specs import Layout
    from shardwise.train import TrainLoop, build_runtime

    spec = replace(t.cfg.model, num_layers=min(t.cfg.model.num_layers, MODEL_LAYERS))
    b = t.cfg.micro_batch
    cfg = _train_config(t, Layout(dp=t.world, micro_batch=b), b * t.world, spec)
    rt = build_runtime(cfg, t.mesh() if t.world > 1 else None)
    with open(os.devnull, "w") as sink:
        loop = TrainLoop(rt, last=cfg.steps, sink=sink if t.rank == 0 else None)

        def bare():
            rt.step += 1
            mbs = rt.data.local_microbatches(rt.step, t.world, t.rank, b, rt.device)
            rt.optimizer.zero_grad(set_to_none=True)
            rt.forward_backward(rt.chunks, mbs)
            rt.optimizer.step()

        reps = yield from in_rounds(t, {"bare": bare, "loop": loop.step}, SYNC_ROUNDS * t.cfg.repeats,
                                    "train's loop against a bare step")
        loop.flush()
    bare_s = statistics.median(reps["bare"])
    out["loop_points"] = [bare_s, bare_s + paired(reps, "loop", "bare")]


def _train_config(t: Timer, layout, global_batch: int, spec=None):
    from shardwise.train import TrainConfig

    return TrainConfig(spec or t.cfg.model, layout, steps=10**6, global_batch=global_batch, seq_len=t.cfg.seq_len,
                       backend=t.cfg.backend, timeout_s=t.cfg.timeout_s, progress=False)


def _optimizer(t: Timer, chunk, mesh):
    """The runtime's AdamW (train.build_optimizer: its groups, hyper-parameters and kernel) for `chunk`."""
    from shardwise.specs import Layout
    from shardwise.train import build_optimizer

    return build_optimizer([chunk], _train_config(t, Layout(), t.cfg.micro_batch), mesh)


def message_numel(nbytes: int, element_size: int, world: int) -> int:
    """Elements of a buffer of about `nbytes`, divisible by the world (all_gather/reduce_scatter chunks)."""
    return max(world, nbytes // element_size // world * world)


def collective(t: Timer, kind: str, nbytes: int):
    """(bytes as planner/comm.py counts them, a function that runs one `kind` of that size)."""
    esize = _element_size(t.dtype)
    numel = message_numel(nbytes, esize, t.world)
    full = torch.ones(numel, device=t.device, dtype=t.dtype)
    chunk = torch.ones(numel // t.world, device=t.device, dtype=t.dtype)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    peer = t.rank ^ 1  # send_recv pairs (0, 1), (2, 3), ...; an odd last rank only keeps time
    fns = {"all_reduce": lambda: dist.all_reduce(full),
           "all_gather": lambda: gather(full, chunk),          # comm.py: bytes = the gathered size
           "reduce_scatter": lambda: scatter(chunk, full),     # comm.py: bytes = the full input
           "broadcast": lambda: dist.broadcast(full, src=0),   # comm.py: bytes = the tensor
           "send_recv": (lambda: None) if peer >= t.world else
                        (lambda: dist.send(full, dst=peer)) if t.rank % 2 == 0 else (lambda: dist.recv(full, src=peer))}
    return numel * esize, fns[kind]


def measure_collectives(t: Timer, out: dict):
    """out["tables"][kind] = [[bytes, seconds], ...]; out["spread"]["kind@bytes"] = IQR / median."""
    out["tables"], out["spread"] = {k: [] for k in COLLECTIVES}, {}
    if t.world == 1:
        return
    for kind in COLLECTIVES:
        for size in t.cfg.sizes:
            nbytes, fn = collective(t, kind, size)
            reps = t.reduce(t.times(fn), "max")
            if spread(reps) > NOISY:  # every rank sees the same reps, so all agree to measure again
                again = t.reduce(t.times(fn), "max")
                reps = min(reps, again, key=spread)
            out["tables"][kind].append([nbytes, statistics.median(reps)])
            out["spread"][f"{kind}@{nbytes}"] = spread(reps)
            yield f"{kind} {human(nbytes)}"


def tp_layout(t: Timer):
    """The tensor-parallel split measure_tp times (tp = world, one micro-batch), or None where the model's heads,
    KV heads or FFN do not split over this many ranks."""
    from shardwise.errors import UsageError
    from shardwise.specs import Layout, validate_layout

    layout = Layout(tp=t.world, micro_batch=t.cfg.micro_batch)
    try:
        validate_layout(layout, t.cfg.model, t.cfg.micro_batch, t.world, t.cfg.seq_len)
    except UsageError:
        return None
    from shardwise.preflight import runtime_kv_refusal

    return None if runtime_kv_refusal(t.cfg.model, t.world) else layout


def measure_tp(t: Timer, out: dict):
    """out["tp_points"] = [plain, tensor-parallel, and with sequence parallelism where the sequence splits]: seconds
    of the reference workload (the model of at most MODEL_LAYERS layers, embedding, LM head and loss, forward +
    backward on one micro-batch) as one rank runs it whole, and as the runtime splits it over every rank with tensor
    parallelism (`parallelize`, tp = world: the Megatron split of every block, the vocabulary-parallel embedding, head
    and loss), interleaved in SYNC_ROUNDS x repeats repeats, each as long as its slowest rank; out["tp_layers"] its
    layers. Profile.tp_call_s (calibrate.profile.tp_call_in_step) prices each TP call so that the planner's difference
    equals this one: the planner counts the GEMMs split over tp and each call at its table's time, and what is left is
    the work around the calls in the runtime's TP layer (the autograd functions around each collective, their copies,
    the vocabulary masks) and how the ranks meet at calls that follow each other closely, neither of which
    measure_sync's one all-reduce after a layer holds (docs/accuracy.md: tiny-moe's TP forward + backward took 5.1 ms
    more than its calls at sync_overhead_s and its split FLOPs). The same split with sequence parallelism prices SP's
    calls apart (Profile.tp_sp_call_s): it issues an all-gather and a reduce-scatter where plain TP issues one
    all-reduce, and the planner had charged them plain TP's price per call, twice the measured difference on tiny
    (docs/accuracy.md)."""
    layout = tp_layout(t) if t.world > 1 else None
    if layout is None:
        out["tp_points"], out["tp_layers"] = [], 0
        return
    from shardwise.model import Transformer
    from shardwise.parallel import parallelize

    spec = t.cfg.model
    layers = min(spec.num_layers, MODEL_LAYERS)
    x = torch.randint(0, spec.vocab_size, (t.cfg.micro_batch, t.cfg.seq_len), device=t.device)

    def split(lay):
        chunk = parallelize(Transformer(spec, seed=0, layer_ids=range(layers)), t.tp_mesh(), lay, t.device)

        def run():
            with _amp(t):
                loss = chunk.module(x, x)
            loss.backward()
        return run

    fns = {"plain": reference(t), "tp": split(layout)}
    if t.cfg.seq_len % t.world == 0:  # sequence parallelism splits the sequence over the TP ranks
        fns["sp"] = split(layout.with_(sequence_parallel=True))
    reps = yield from in_rounds(t, fns, SYNC_ROUNDS * t.cfg.repeats, "tensor-parallel model against a plain one",
                                barrier_each=True)
    plain_s = statistics.median(reps["plain"])
    out["tp_points"] = [plain_s] + [plain_s + paired(reps, k, "plain") for k in fns if k != "plain"]
    out["tp_layers"] = layers


def measure_rank(cfg: CalibrateConfig, rank: int, world: int, report=lambda label: None) -> dict | None:
    """Every measurement on this rank (in an initialised process group when world > 1), `report(label)`
    after each. Returns the Profile fields on rank 0, None elsewhere."""
    torch.manual_seed(rank)
    t = Timer(cfg, rank, world)
    if world > 1:  # from the first round on, the threads a `train` job of this world holds (Timer.mesh)
        t.mesh()
    out: dict = {}
    # The model and every measurement compared with it run in MODEL_ROUNDS rounds spread over the whole calibration
    # (first, middle, last third; each yields once a round, then computes its figures from all of them), so the rate
    # and the per-call costs hold the same mean load: on a shared machine the load moves within the minutes a
    # calibration takes, and the planner adds the two together. The one-off tables run after the first round.
    rounds = [measure_model(t, out), measure_sync(t, out), measure_fsdp(t, out), measure_split_backward(t, out),
              measure_loop(t, out), measure_cp(t, out), measure_tp(t, out)]
    for r in range(MODEL_ROUNDS):
        for steps in rounds:
            label = next(steps, None)  # None: nothing to measure at this world (or in this torch)
            if label:
                report(label)
        for steps in (measure_matmul(t, out), measure_copy(t, out), measure_collectives(t, out)) if r == 0 else ():
            for label in steps:
                report(label)
    for steps in rounds:  # their figures, from every round
        for label in steps:
            report(label)
    if rank != 0:
        return None
    from shardwise.contention import gloo_loop_threads

    return dict(out, world=world, backend=cfg.backend, device=_device_name(t.device), gloo_loop_threads=gloo_loop_threads(),
                dtype=str(t.dtype).removeprefix("torch."), model=cfg.model.name, tokens=cfg.tokens,
                memory_gib=_memory_gib(t.device, world), repeats=cfg.repeats)


def _element_size(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def _memory_gib(device, world: int) -> float:
    """GPU memory, or on CPU this rank's share of the host RAM."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**30
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / world / 2**30
