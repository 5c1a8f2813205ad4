"""What the calls between and around the layers cost: collectives by size, a pipeline's exchanges and its hand-offs,
FSDP's gathers, context parallelism's exchanges and tensor parallelism's calls."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from shardwise.calibrate.compute import pipeline_dtype, runtime_optimizer
from shardwise.calibrate.config import COLLECTIVES, MODEL_LAYERS, human
from shardwise.calibrate.timer import (NOISY, SYNC_ROUNDS, Timer, autocast_for, element_size, in_rounds, paired,
                                       reference, spread)
from shardwise.parallel.sharded import Sharded


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
    profile; validate times "layer", "both", "p2p" and "exchange" again beside its sweep (the calls' speed now).
    The layer and the all-reduce move the compute dtype's activation (bf16 on a GPU, as tensor parallelism's calls
    do); the send/recv, the exchange and the stage's input and gradient are in the dtype the pipeline executor sends
    (compute.pipeline_dtype: fp32). On a CPU both are fp32: one tensor."""
    from shardwise.model import Transformer
    from shardwise.parallel.pipeline import BatchP2P

    spec = t.cfg.model
    model = Transformer(spec, seed=0, layer_ids=range(1), first=False, last=False, device=t.device)
    rope = (model.rope_cos, model.rope_sin) if spec.family == "llama" else None
    x = torch.randn(t.cfg.micro_batch, t.cfg.seq_len, spec.hidden, device=t.device, dtype=t.dtype)
    act = torch.ones_like(x)
    sent = pipeline_dtype()  # what a pipeline stage receives and sends (its input, its output's gradient)
    pipe = act if act.dtype == sent else torch.ones_like(act, dtype=sent)
    stage_x = x if x.dtype == sent else x.to(sent)

    def layer():
        with autocast_for(t):  # the layer's weights are fp32, as a training job's are; on a GPU x is bf16
            model.layers["0"](x, rope)

    def both():
        layer()
        dist.all_reduce(act)

    peer = t.rank ^ 1  # the pairs of the send_recv table; an odd last rank only keeps time

    def send_recv():
        if peer < t.world:
            (dist.send if t.rank % 2 == 0 else dist.recv)(pipe, peer)

    def layer_send_recv():
        layer()
        send_recv()

    p2p = BatchP2P()

    def exchange():
        if peer < t.world:  # the executor's exchange: its buffer, both messages posted, each waited for
            for work in p2p.post([(pipe, peer, 0)], [(torch.empty_like(pipe), peer, 0)], None):
                work.wait()

    chunk = Transformer(spec, seed=0, layer_ids=range(STAGE_LAYERS), first=False, last=False, device=t.device)

    def stage():
        inp = stage_x.clone().requires_grad_(True)
        with autocast_for(t):
            y = chunk(inp, None)
        torch.autograd.backward(y, pipe)

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
    out["p2p_bytes"] = act.numel() * pipeline_dtype().itemsize  # call_workloads' pipeline messages, act's shape
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
    "zero1 update": the plain one's under ZeRO-1, "ddp": as the runtime wraps it in DDP, under no_sync}, the sharded
    chunk). measure_fsdp times them for the profile; validate times "plain" and "sharded" again beside its sweep (FSDP's calls' speed now)."""
    from shardwise.parallel import GlobalGradNorm, grad_sync, parallelize
    from shardwise.specs import Layout

    spec = t.cfg.model
    mesh = t.mesh()

    def layer():
        return _plain_layer(spec)

    model = layer().to(t.device)
    plain = Sharded(model, model)
    sharded = parallelize(layer(), mesh, Layout(dp=t.world, zero=3), t.device)
    replicated = parallelize(layer(), mesh, Layout(dp=t.world), t.device)
    x = torch.randint(0, spec.vocab_size, (t.cfg.micro_batch, t.cfg.seq_len), device=t.device)

    def step(chunk):
        with autocast_for(t):  # the training loop's precision (BF16 autocast on a GPU)
            loss = chunk.module(x, x)
        loss.backward()

    updates = {"plain": (GlobalGradNorm([plain], None), runtime_optimizer(t, plain, None)),
               "sharded": (GlobalGradNorm([sharded], mesh), runtime_optimizer(t, sharded, mesh)),
               # ZeRO-1: the plain parameters, each rank's AdamW over its partition, then every tensor broadcast
               "zero1": (GlobalGradNorm([plain], None), runtime_optimizer(t, plain, mesh, zero=1))}

    def update(name):
        norm, opt = updates[name]
        norm.clip_(1.0, t.device)
        opt.step()

    def ddp_step():
        with grad_sync(replicated, enabled=False):  # a step's micro-batches before its last: wrapper and hooks only
            step(replicated)

    return {"plain": lambda: step(plain), "sharded": lambda: step(sharded), "plain update": lambda: update("plain"),
            "sharded update": lambda: update("sharded"), "zero1 update": lambda: update("zero1"),
            "ddp": ddp_step}, sharded


def _plain_layer(spec, device="cpu"):
    """One layer with the embedding and head, as fsdp_workloads times it (on `device`: "meta" for its shapes alone)."""
    from shardwise.model import Transformer

    return Transformer(spec, seed=0, layer_ids=range(1), device=device)


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
    under its no_sync, against plain: what DDP's wrapper and per-parameter hooks cost per micro-batch.
    out["zero1_call_s"]: the update as the runtime runs it under ZeRO-1 (torch's ZeroRedundancyOptimizer: each
    rank's AdamW over its partition, then one broadcast per parameter tensor from its owner, issued back to back)
    against the plain update, less the broadcast table's time for each tensor, per tensor: what each of those
    broadcasts costs beyond its table time (the owners alternating, the queue of asynchronous calls). The partition's
    smaller AdamW is left in it (a few percent of it on the tiny model)."""
    if t.world == 1:
        out["fsdp_call_s"] = out["ddp_microbatch_s"] = out["zero1_call_s"] = 0.0
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
    esize = next(sharded.parameters()).dtype.itemsize  # FSDP moves the FP32 parameters (no mixed-precision policy)
    layer_bytes = spec.params_per_layer() * esize
    root = (spec.num_params() - spec.num_layers * spec.params_per_layer()) * esize
    tables = out["tables"]
    wire = sum(interpolate(tables[kind], nbytes) for kind, nbytes in
               (("all_gather", layer_bytes), ("all_gather", layer_bytes), ("reduce_scatter", layer_bytes),
                ("all_gather", root), ("reduce_scatter", root)))
    out["fsdp_call_s"] = max((sharded_s - plain_s - wire) / 5, 0.0)
    zero1_u = plain_u + paired(reps, "zero1 update", "plain update")
    tensors = [p.numel() * p.element_size() for p in _plain_layer(spec, "meta").parameters()]  # as "plain" holds them
    broadcasts = sum(interpolate(tables["broadcast"], nbytes) for nbytes in tensors)
    out["zero1_call_s"] = max((zero1_u - plain_u - broadcasts) / len(tensors), 0.0)
    out["fsdp_points"] = [plain_s, sharded_s, plain_u, sharded_u, ddp_s, zero1_u]


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
            with autocast_for(t):
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
    out["cp_block_bytes"] = 2 * b * local * spec.kv_dim * element_size(t.dtype)


def cp_attention_flops(spec, batch: int, seq: int, cp: int) -> float:
    """Weighted attention FLOPs (forward + backward, as planner/layer_time._calibrated_layer weighs them: 4 x tokens x
    keys x width, at FLASH_EFFICIENCY of the rate, backward twice) a context-parallel layer's seq / cp local queries
    run against the whole sequence, beyond a plain layer whose queries attend their own seq / cp tokens."""
    from shardwise.planner.layer_time import FLASH_EFFICIENCY

    local = seq // cp
    return 3 * 4 * batch * local * (seq - local) * spec.attention_width / FLASH_EFFICIENCY


def message_numel(nbytes: int, element_size: int, world: int) -> int:
    """Elements of a buffer of about `nbytes`, divisible by the world (all_gather/reduce_scatter chunks)."""
    return max(world, nbytes // element_size // world * world)


def collective(t: Timer, kind: str, nbytes: int):
    """(bytes as planner/comm.py counts them, a function that runs one `kind` of that size)."""
    esize = element_size(t.dtype)
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
            with autocast_for(t):
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
