"""What one rank's compute costs: the GEMMs, a copy, the runtime's model forward + backward (the layer rate and its fixed
costs, recompute, the edges), the split backward and the training loop's own cost."""

from __future__ import annotations

import statistics

import torch

from shardwise import data
from shardwise.calibrate.config import MODEL_LAYERS, MODEL_ROUNDS, gemm_shapes
from shardwise.calibrate.timer import SYNC_ROUNDS, Timer, autocast_for, element_size, in_rounds, paired
from shardwise.parallel.sharded import Sharded


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
    src = torch.ones(t.cfg.copy_bytes // element_size(t.dtype), device=t.device, dtype=t.dtype)
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


def fit_model(xs: list[float], rows: list[list[float]], own: list[float], floor: float = 0.0,
              max_rate: float = 0.0) -> tuple[float, float]:
    """(intercept seconds, slope seconds per weighted FLOP) of time = intercept + slope x FLOPs, from repeats
    `rows` (each: the sizes' seconds, run side by side) less `own` (each size's seconds the planner times on its
    own, model_elementwise): a Theil-Sen line per repeat, the median intercept and slope. A non-positive slope
    (noise) leaves the whole time at the largest size as FLOPs. `floor` (a GPU's host floor for the whole measured
    model, host_floor): sizes within HOST_BOUND of it measured the host, not the device, and are left out
    (device_bound). `max_rate` (FLOP/s; with a floor): a host-bound fit's slope can read a rate no GEMM of the model
    reaches; it is held at that rate and the intercept fitted again under it."""
    keep = device_bound(floor, [statistics.median(row[i] for row in rows) for i in range(len(xs))])
    xs, own, rows = [xs[i] for i in keep], [own[i] for i in keep], [[row[i] for i in keep] for row in rows]
    fits = [fit_line(xs, [y - o for y, o in zip(row, own)]) for row in rows]
    overhead, slope = statistics.median(f[0] for f in fits), statistics.median(f[1] for f in fits)
    if floor and max_rate and 0 < slope < 1 / max_rate:
        slope = 1 / max_rate
        overhead = statistics.median(y - o - slope * x for row in rows for x, y, o in zip(xs, row, own))
    if slope <= 0:
        ys = [statistics.median(row[i] for row in rows) - own[i] for i in range(len(xs))]
        return 0.0, ys[-1] / xs[-1]
    return overhead, slope


# A GPU runs its kernels behind the host that launches them: a layer costs the larger of its host time (Python, op
# dispatch, launches) and its device time, where a CPU's synchronous ops add the two. A micro-batch of this many
# tokens leaves the GPU idle between kernels (gpt2 on an H200: 0.74 of 1.50 ms busy for the head alone, 1.7 of 17.5
# ms with 4 layers; docs/accuracy.md), so its time is the host's floor.
HOST_FLOOR_TOKENS = 16
HOST_FLOOR_DEVICES = ("cuda",)
# A size of the model fit measured the host rather than the device unless its time exceeds the floor by this much
# (gpt2 on the H200: 15.0 and 16.2 ms at 2,048 and 4,096 tokens beside a 17.5 ms floor, 28.4 at 8,192).
HOST_BOUND = 1.25


def device_bound(floor: float, times: list[float]) -> list[int]:
    """Indices of the sizes (in increasing size) whose `times` exceed HOST_BOUND x `floor`: all of them without a
    floor; the two largest where fewer than two do (a line needs two, and the largest sizes hold the most of the
    device: on the H200's gpt2 calibration at micro-batch 1, 10.2, 10.8, 13.1 and 16.5 ms beside a 10.7 ms floor, the
    two largest read 138 TFLOP/s as the micro-batch 2 calibrations did, all four 212)."""
    every = list(range(len(times)))
    if floor <= 0:
        return every
    keep = [i for i in every if times[i] > HOST_BOUND * floor]
    return keep if len(keep) >= 2 else every[-2:]


def measures_host_floor(t: Timer) -> bool:
    """Whether this rank's device runs its kernels behind the host (HOST_FLOOR_DEVICES)."""
    return t.device.type in HOST_FLOOR_DEVICES


def host_floor(reps: dict, layers: int) -> dict:
    """The host's seconds per micro-batch forward + backward, from the floor variants' times (measure_model's "floor
    model", edge_variants' "floor first" and "floor last"): per layer (the model less its edges, over its layers),
    for the embedding and for the final norm, head and loss. The planner's pipeline stage takes the larger of that
    and its device time (planner/step_time.host_floor_time)."""
    if "floor model" not in reps:
        return {}
    model, first, last = (statistics.median(reps[f"floor {k}"]) for k in ("model", "first", "last"))
    return {"host_layer_s": max(model - first - last, 0.0) / layers, "host_embedding_s": first,
            "host_head_s": last, "host_floor_points": [model, first, last]}


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

    spec = t.cfg.model
    layers = min(spec.num_layers, MODEL_LAYERS)
    model = Transformer(spec, seed=0, layer_ids=range(layers), device=t.device)
    batches = [t.cfg.micro_batch * k for k in (1, 2, 3, 4)]
    fns, alone = _model_variants(t, model, batches)
    reps: dict = {name: [] for name in fns}
    for r in range(MODEL_ROUNDS):
        for name, times in t.interleaved(fns, t.cfg.repeats, seed=r, barrier_each=t.world > 1).items():
            reps[name] += times
        yield f"model forward+backward, round {r + 1} of {MODEL_ROUNDS}"
    model.set_recompute("none")
    _fit_model(t, out, reps, layers, batches, alone)
    out["optimizer_params"] = sum(p.numel() for p in model.parameters())


def _model_variants(t: Timer, model, batches: list[int]) -> tuple[dict, str]:
    """measure_model's timed variants by name (forward + backward at each micro-batch, selective and full recompute, a
    bare training step, the pipeline's edge stages, validate's one-sequence reference, the host floor's model, rank 0
    alone), and the name of the one rank 0 runs alone."""
    spec, seq = t.cfg.model, t.cfg.seq_len
    amp = autocast_for(t)
    opt = runtime_optimizer(t, Sharded(model, model), None)

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

    inputs = {b: torch.randint(0, spec.vocab_size, (b, seq), device=t.device) for b in batches}

    def variant(b, mode):
        def run():
            model.set_recompute(mode if mode in ("selective", "full") else "none")
            train_step(b) if mode == "step" else step(inputs[b])
        return run

    fns = {f"{mode} {b}": variant(b, mode) for b, mode in [(b, "none") for b in batches] +
           [(batches[0], "selective"), (batches[0], "full"), (batches[0], "step")]}
    fns.update(edge_variants(t, batches[0], floor=measures_host_floor(t)))
    if batches[0] != 1:  # validate's reference workload, the model at one sequence, whatever the calibrated micro-batch
        one = torch.randint(0, spec.vocab_size, (1, seq), device=t.device)
        fns["one sequence"] = lambda: (model.set_recompute("none"), step(one))
    if measures_host_floor(t):  # the model where the device waits on the host (host_floor)
        ids = torch.randint(0, spec.vocab_size, (1, HOST_FLOOR_TOKENS), device=t.device)
        fns["floor model"] = lambda: (model.set_recompute("none"), step(ids))
    alone = f"alone {batches[0]}"  # rank 0 computes while the others wait at the next barrier
    # Without recompute, as the base it is compared with: the variants run in a new order every repeat and each sets
    # the model's recompute itself. Left as the previous one set it, about 2 alone runs in 7 recomputed (selective or
    # full) and the slowdown read 0.97-1.08 where the two timed apart read 1.10 (docs/accuracy.md).
    fns[alone] = variant(batches[0], "none") if t.rank == 0 else (lambda: None)
    return fns, alone


def _fit_model(t: Timer, out: dict, reps: dict, layers: int, batches: list[int], alone: str) -> None:
    """measure_model's results from its repeats (`reps`: seconds by variant name), into `out`."""
    from shardwise.planner.layer_time import FLASH_EFFICIENCY

    spec, seq = t.cfg.model, t.cfg.seq_len
    sizes = [f"none {b}" for b in batches]
    xs = [model_flops(spec, layers, b, seq) for b in batches]
    own = [model_elementwise(spec, layers, b, seq, element_size(t.dtype), out["copy_gbs"]) for b in batches]
    # One line per repeat (its four sizes ran side by side), the median of their intercepts and slopes.
    out.update(host_floor(reps, layers))
    floor = out["host_floor_points"][0] if "host_floor_points" in out else 0.0
    overhead, slope = fit_model(xs, [[reps[n][i] for n in sizes] for i in range(len(reps[sizes[0]]))], own, floor,
                                out.get("matmul_tflops", 0.0) * 1e12)
    ys = [statistics.median(reps[n]) for n in sizes]
    out["model_tflops"] = 1 / slope / 1e12
    out["edge_points"] = [statistics.median(reps[f"{edge} {batches[0]}"]) for edge in ("first", "last")]
    head_flops = 3 * 2 * batches[0] * seq * spec.hidden * spec.vocab_size  # the LM head's GEMMs, as model_flops counts them
    out.update(split_edges(overhead, slope, out["edge_points"], head_flops, layers))
    out["model_points"] = [[x, y] for x, y in zip(xs, ys)]
    # what validate times again to tell the machine's drift (validate.machine_speed): [seq_len, seconds]
    out["one_sequence_points"] = [seq, statistics.median(reps["one sequence"]) if "one sequence" in reps else ys[0]]
    # The reference workload (the smallest size) in each round — start, middle and end of the calibration:
    # a machine whose speed moves within minutes shows it here (Profile.reference_drift).
    n = len(reps[sizes[0]]) // MODEL_ROUNDS
    out["reference_rounds_s"] = [statistics.median(reps[sizes[0]][i * n:(i + 1) * n]) for i in range(MODEL_ROUNDS)]
    core = 4 * batches[0] * seq * seq * spec.q_dim / FLASH_EFFICIENCY * slope  # the recomputed attention core
    base, selective = sizes[0], f"selective {batches[0]}"
    out["checkpoint_overhead_s"] = max(paired(reps, selective, base) / layers - core, 0.0)
    full = f"full {batches[0]}"
    out["full_checkpoint_overhead_s"] = full_checkpoint_overhead(spec, layers, batches[0], seq, slope, out["layer_overhead_s"],
                                                                 element_size(t.dtype), out["copy_gbs"],
                                                                 paired(reps, full, base))
    out["checkpoint_points"] = [ys[0], statistics.median(reps[selective]), statistics.median(reps[full])]
    # The rest of a bare training step on the same model: batch, zero_grad, AdamW.
    out["optimizer_s"] = max(paired(reps, f"step {batches[0]}", base), 0.0)
    # Every rank computing at once against one alone (the machine's cores, memory and caches shared).
    out["alone_points"] = [ys[0], statistics.median(reps[alone])] if t.world > 1 else []
    out["concurrent_slowdown"] = max(statistics.median(x / y for x, y in zip(reps[base], reps[alone]) if y > 0), 1.0) \
        if t.world > 1 else 1.0

def full_checkpoint_overhead(spec, layers: int, batch: int, seq: int, slope: float, layer_overhead_s: float,
                             element_bytes: int, copy_gbs: float, full_minus_none: float) -> float:
    """What a layer checkpointed whole (full recompute) costs per micro-batch beyond the forward the planner recomputes
    — its forward FLOPs at the fitted rate (`slope` seconds per weighted FLOP), its forward element-wise passes and a
    third of its fixed cost — from the model measured with every layer checkpointed against without
    (`full_minus_none`, seconds, its `layers` layers at `batch` sequences): the non-reentrant checkpoint's saved-tensor
    hooks and bookkeeping, and whatever the recomputed forward runs beyond the planner's forward (on tiny 1.5 ms a
    layer against selective recompute's 0.7 ms). The planner's forward is the runtime's: torch's checkpoint stops early,
    before the dense layers' FC2 (step_time.recompute_terms takes that GEMM out at the planned model's own size), so it
    is taken out here too, at the fitted rate, in the whole model's share of dense layers (the planner's mean layer, as
    model_flops counts the layer's FLOPs)."""
    from shardwise.planner.layer_time import fc2_flops

    forward = (model_flops(spec, 1, batch, seq) - model_flops(spec, 0, batch, seq)) / 3 * slope \
        + model_elementwise(spec, 1, batch, seq, element_bytes, copy_gbs) / 3 + layer_overhead_s / 3
    dense = 1 - len(spec.moe_layers) / spec.num_layers
    return max(full_minus_none / layers - (forward - dense * fc2_flops(spec, batch * seq, 1) * slope), 0.0)


def edge_variants(t: Timer, batch: int, floor: bool = False) -> dict:
    """The two pipeline edges of the runtime's model, each alone, forward + backward of one micro-batch as a pipeline
    stage runs them: "first <batch>" the embedding (its output's gradient given), "last <batch>" the final norm, LM
    head and loss (its input a received activation that needs a gradient). `floor`: the same modules on
    HOST_FLOOR_TOKENS tokens too ("floor first", "floor last"; host_floor)."""
    from shardwise.model import Transformer

    spec = t.cfg.model
    first = Transformer(spec, seed=0, layer_ids=range(0), last=False, device=t.device)
    last = Transformer(spec, seed=0, layer_ids=range(0), first=False, device=t.device)

    def runs(batch: int, seq: int):
        ids = torch.randint(0, spec.vocab_size, (batch, seq), device=t.device)
        hidden = torch.randn(batch, seq, spec.hidden, device=t.device)
        grad = torch.ones(batch, seq, spec.hidden, device=t.device)

        def run_first():
            with autocast_for(t):
                out = first(ids)
            out.backward(grad.to(out.dtype))

        def run_last():
            x = hidden.clone().requires_grad_(True)
            with autocast_for(t):
                loss = last(x, ids)
            loss.backward()
        return run_first, run_last
    out = dict(zip((f"first {batch}", f"last {batch}"), runs(batch, t.cfg.seq_len)))
    if floor:
        out.update(zip(("floor first", "floor last"), runs(1, HOST_FLOOR_TOKENS)))
    return out


def pipeline_dtype() -> torch.dtype:
    """What the pipeline executor sends between stages and feeds a middle stage: its receive buffers' dtype
    (parallel.pipeline.PipelineExecutor.dtype, the fp32 residual stream, under autocast too). The planner's
    shardwise profile counts the same 4 bytes an element (p2p_bytes); the layers' own activations are `t.dtype`."""
    from shardwise.parallel.pipeline import PipelineExecutor

    return PipelineExecutor.dtype


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
    # the chunk's input and its output's gradient as the executor receives them (pipeline_dtype; bf16 layers within)
    x = torch.randn(t.cfg.micro_batch, t.cfg.seq_len, spec.hidden, device=t.device, dtype=pipeline_dtype())
    grad = torch.randn_like(x)
    params = [p for p in chunk.parameters() if p.requires_grad]

    def forward():
        inp = x.clone().requires_grad_(True)
        with autocast_for(t):
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
                       backend=t.cfg.backend, timeout_s=t.cfg.timeout_s, progress=False, autocast=t.cfg.dtype)


def runtime_optimizer(t: Timer, chunk, mesh, zero: int = 0):
    """The runtime's AdamW (train.build_optimizer: its groups, hyper-parameters and kernel) for `chunk` (also the
    optimizer comm.py's FSDP measurement steps); `zero` 1: as the runtime builds it under ZeRO-1 over every rank
    (torch's ZeroRedundancyOptimizer on the mesh's dp group)."""
    from shardwise.specs import Layout
    from shardwise.train import build_optimizer

    layout = Layout(dp=t.world, zero=zero) if zero else Layout()
    return build_optimizer([chunk], _train_config(t, layout, t.cfg.micro_batch), mesh)
