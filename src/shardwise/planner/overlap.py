"""Data-parallel communication as a schedule: a collective is hidden only by the compute that really
runs beside it, as the framework issues it (planner/frameworks.py).

* Buckets behind a backward (DDP, Megatron's overlap_grad_reduce, DeepSpeed's overlap_comm): gradients
  become ready evenly over the backward; each bucket is reduced once full, one at a time. The last
  bucket starts only when the backward ends, and the stream cannot send faster than it is fed:
  exposed = max(last bucket, total - window x (1 - last bucket's share)).
* The same for the updated weights gathered behind the next step's first forward (Megatron's
  overlap_param_gather).
* Per-micro-batch reductions (DeepSpeed ZeRO-2, FSDP reduce-scatter): the reduction of micro-batch k
  runs behind micro-batch k+1; only what exceeds a micro-batch's compute piles up, plus the last tail.
* FSDP / ZeRO-3 gathers with one unit of prefetch: the gather of layer i+1 runs during layer i's
  compute; a layer waits for max(0, gather - compute); the first unit's gather is never hidden. In the
  backward the gathers and the reduce-scatters share the link.
* Without overlap (Megatron 2021, DeepSpeed ZeRO-0/1 at the accumulation boundary, a gloo cluster whose
  calibration measured comm_overlap = 0): every call is exposed.
Each call also pays the calibrated synchronisation cost of a calibrated cluster (0 on datasheet ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from shardwise.planner.comm import collective_time, one_node, overlaps, sync_time, zero1_call_time
from shardwise.planner.frameworks import Framework
from shardwise.planner.frameworks import get as get_framework
from shardwise.planner.kernels import KERNEL_LAUNCH_S, hbm_rate
from shardwise.planner.offload import GRAD_COPY_BYTES, copies_per_unit, unit_copy_time
from shardwise.specs import ModelSpec


@dataclass(frozen=True)
class Window:
    """The compute of one pipeline rank that data-parallel traffic can hide behind (seconds)."""

    forward: float  # one micro-batch's forward through the rank's layers
    backward: float  # one micro-batch's backward (input + weight gradients)
    layer_forward: float  # one layer, one micro-batch
    layer_backward: float
    layers: int
    microbatches: int


# A collective hidden behind compute is not free: its kernels take SMs and HBM bandwidth from the kernels beside
# it, which run slower while it lasts. Lee et al. 2025 ("Characterizing Compute-Communication Overlap in
# GPU-Accelerated Distributed Deep Learning", arXiv 2507.03114) measured GPT and Llama layers on A100 and H100
# overlapped with their collectives: the compute slowed by 18.9 % on average (40 % at most) against running
# alone. Every overlapped second of communication costs OVERLAP_SLOWDOWN seconds of compute.
OVERLAP_SLOWDOWN = 0.189


def interference(comm: float, exposed: float) -> float:
    """What the compute beside a collective loses while the hidden part of it runs."""
    return OVERLAP_SLOWDOWN * max(0.0, comm - exposed)


def hidden(comm: float, window: float, nbytes: float, bucket_bytes: float) -> float:
    """Exposed seconds of `comm` of bucketed traffic fed evenly during `window` seconds of compute (with the
    slowdown its hidden part causes to that compute)."""
    if comm <= 0:
        return 0.0
    last = min(1.0, bucket_bytes / nbytes) if nbytes > 0 else 1.0
    exposed = max(comm * last, comm - window * (1 - last))
    return exposed + interference(comm, exposed)


def per_microbatch(comm: float, win: Window, nbytes: float, bucket_bytes: float) -> float:
    """Exposed seconds of a reduction issued in every micro-batch's backward, hidden behind the next one."""
    per_mb = win.forward + win.backward
    behind = max(0.0, comm - per_mb)
    return (win.microbatches - 1) * (behind + interference(comm, behind)) + hidden(comm, win.backward, nbytes,
                                                                                   bucket_bytes)


def param_gather_bytes(job, fw: Framework) -> int:
    """Bytes per parameter element the stack all-gathers: its gather dtype, or the weights as stored when they are
    narrower — FP8 parameters (NeMo `fp8_params`, Transformer Engine's `fp8_model_init`: the distributed optimizer
    casts its updated FP32 shard to FP8 and gathers FP8 weights; Megatron-Core `--fp8-param-gather`)."""
    return min(fw.param_gather_bytes, job.train.weight_bytes)


def fp8_gathered(job, layout) -> bool:
    """Whether torchao's float8 all-gather runs (Job.fp8_all_gather): only where FSDP shards over data-parallel ranks.
    torchtitan turns it on only with `parallel_dims.dp_shard_enabled` (components/quantization/float8.py): a
    dp_shard degree above 1, context-parallel ranks not counted; ZeRO-0 is DDP, which gathers nothing."""
    return job.fp8_all_gather and layout.zero >= 2 and layout.dp_shard_size > 1


def grad_reduce_behind(job, layout, experts: bool = False) -> bool | None:
    """Whether this layout's gradient reduction runs behind the backward as dp_exposed prices it (None: one
    data-parallel replica, nothing reduced): the stack overlaps it, on a backend that overlaps at all, and for ZeRO-1
    by whole-gradient all-reduce only where that stack overlaps that too; not where the stack reduces ZeRO 0/1
    gradients after a pipeline's schedule, or split experts' after the backward (`experts`: their reduction)."""
    if layout.dp * layout.cp <= 1:
        return None
    fw = get_framework(job.framework)
    if layout.zero < 2 and ((layout.pp > 1 and fw.pipeline_reduce_after_schedule)
                            or (experts and fw.expert_reduce_after_backward)):
        return False
    allreduce_zero1 = layout.zero == 1 and fw.zero1 == "allreduce"
    return fw.overlap_grad_reduce and overlaps(job.cluster) and (fw.zero1_reduce_overlapped or not allreduce_zero1)


def dp_exposed(job, layout, fw: Framework, params: float, layer_params: float, tensors: int, win: Window,
               fp8_layer: float = 0.0, experts: bool = False) -> tuple[float, float]:
    """(after-backward, before-forward) exposed data-parallel seconds of one step on one pipeline rank:
    what delays the end of its last backward's reduction, and what delays its next forward. `fp8_layer`: elements of
    each layer unit gathered in FP8 (torchao's float8 all-gather, fp8_gathered: the layer's dense weights, not the
    routed experts, which are no Float8Linear); the rest at param_gather_bytes."""
    d = layout.dp * layout.cp
    if d <= 1:
        return 0.0, 0.0
    c, stride, m = job.cluster, layout.tp, win.microbatches
    sync = sync_time(c)
    overlap = overlaps(c)  # a blocking backend (gloo) hides nothing
    behind = grad_reduce_behind(job, layout, experts)  # the reduction runs beside the backward
    gb, pb = fw.grad_reduce_bytes, param_gather_bytes(job, fw)
    chunks = layout.vpp if layout.pp > 1 else 1

    def call(kind: str, elements: float, nbytes_per: float, extra: float = sync) -> float:
        return collective_time(c, kind, nbytes_per * elements, d, stride) + extra

    broadcast = fw.zero1 == "broadcast" or job.zero1_broadcast_per_tensor
    reduce_copies = fw.reduce_copy_bytes * params / hbm_rate(c)  # the HBM passes around a whole all-reduce
    gather_copies = list_copy_time(job, fw, pb * params, launches=0)  # into a list (its few calls' launches not counted)
    if layout.zero == 0 or (layout.zero == 1 and broadcast):
        reduce = chunks * call("all_reduce", params / chunks, gb) + reduce_copies
        after = hidden(reduce, win.backward, gb * params, fw.bucket_bytes) if behind else reduce
        if layout.zero == 1:  # torch ZeroRedundancyOptimizer: every tensor broadcast by its owner after the step
            after += tensors * (collective_time(c, "broadcast", pb * params / tensors, d, stride) + zero1_call_time(c))
        return after, 0.0
    if layout.zero == 1 and fw.zero1 == "owner_broadcast":  # InternEvo: all-reduce over dp, owners broadcast in group
        reduce = chunks * call("all_reduce", params / chunks, gb) + reduce_copies
        after = hidden(reduce, win.backward, gb * params, fw.bucket_bytes) if behind else reduce
        group = layout.shard_group  # the zero1 group: dp_shard ranks (x cp), or every dp rank
        owners = min(tensors, group)  # whole tensors dealt to the group's ranks: one flat buffer per owner
        return after + owners * collective_time(c, "broadcast", pb * params / owners, group, stride), 0.0
    if layout.zero == 1 and fw.zero1 == "allreduce":  # whole gradients all-reduced, the updated partitions gathered
        reduce = call("all_reduce", params, gb) + reduce_copies
        after = hidden(reduce, win.backward, gb * params, fw.bucket_bytes) if behind else reduce
        return after + call("all_gather", params, pb) + gather_copies, 0.0
    if layout.zero == 1:
        rs, ag = call("reduce_scatter", params, gb), call("all_gather", params, pb)
        after = hidden(rs, win.backward, gb * params, fw.bucket_bytes) if behind else rs
        before = hidden(ag, win.forward, pb * params, fw.bucket_bytes) if fw.overlap_param_gather and overlap else ag
        return after, before
    if layout.zero == 2 and fw.zero2_reduce_every_microbatch:  # reduce in every backward, gather after the step
        rs, ag = call("reduce_scatter", params, gb), call("all_gather", params, pb)
        after = per_microbatch(rs, win, gb * params, fw.bucket_bytes) if behind else m * rs
        if fw.overlap_param_gather and overlap:  # Megatron's updated weights gathered behind the next forward
            return after, hidden(ag, win.forward, pb * params, fw.bucket_bytes)
        return after + ag, 0.0
    return fsdp_exposed(job, layout, fw, params, layer_params, win, overlap, fp8_layer), 0.0


def fsdp_exposed(job, layout, fw: Framework, params: float, layer_params: float, win: Window, overlap: bool,
                 fp8_layer: float = 0.0) -> float:
    """FSDP units (each layer, plus a root unit per model chunk: embedding, final norm, head): ZeRO-3
    gathers each unit in every micro-batch's forward and each layer again in its backward; FSDP's
    ZeRO-2 keeps them from forward to backward, gathering once per micro-batch. Reduce-scatter per unit,
    every micro-batch (ZeRO-3, or when the framework does) or only in the last one."""
    m, layers = win.microbatches, win.layers
    chunks = layout.vpp if layout.pp > 1 else 1
    root = max(params - layers * layer_params, 0.0) / chunks
    fp8_layer = min(fp8_layer, layer_params)
    calls = _unit_calls(job, layout, fw, layer_params, root, fp8_layer)
    passes = _fsdp_passes(layout, fw, m)
    reduced = layers * calls.reduce + chunks * calls.root_reduce  # every unit's reduction, once
    after = reduced if passes.deferred else 0.0
    unit = layers * layer_params + chunks * root
    layer_gathers = (passes.forwards + m * passes.regathers) * layers
    copies = fsdp_copy_time(job, fw, passes.forwards * chunks * root + layer_gathers * (layer_params - fp8_layer),
                            (passes.reducing + (1 if passes.deferred else 0)) * unit, m * unit, layout.shard_group,
                            fp8_gathered=layer_gathers * fp8_layer)
    if not overlap or not fw.prefetch:
        gathers = (passes.forwards * (layers * calls.gather + chunks * calls.root_gather)
                   + m * layers * calls.gather * passes.regathers)
        return gathers + passes.reducing * reduced + after + copies
    return _prefetched(job, layout, calls, passes, win, chunks) + after + copies


class _UnitCalls(NamedTuple):
    """Seconds of the calls on one FSDP unit, each with its per-call cost."""

    gather: float  # a layer's all-gather
    scatter: float  # a layer's reduce-scatter
    replica: float  # HSDP: a layer's all-reduce across the replicas after it
    reduce: float  # a layer's whole reduction, one call after the other (scatter + replica)
    root_gather: float  # a chunk's root unit (0 without one)
    root_reduce: float


def _unit_calls(job, layout, fw: Framework, layer_params: float, root: float, fp8_layer: float = 0.0) -> _UnitCalls:
    c, stride = job.cluster, layout.tp
    d = layout.shard_group  # HSDP gathers and reduce-scatters inside its shard group
    fsdp = float((c.measured or {}).get("fsdp_call_s", sync_time(c)))
    gb, pb = fw.grad_reduce_bytes, param_gather_bytes(job, fw)
    if fw.gather_per_tensor:
        g, rs, ar = _per_tensor_calls(job, layout, fw, fsdp)
    else:  # FSDP: one flat all-gather and reduce-scatter per unit
        g = collective_time(c, "all_gather", pb * (layer_params - fp8_layer) + fp8_layer, d, stride) + fsdp
        rs = collective_time(c, "reduce_scatter", gb * layer_params, d, stride) + fsdp
        ar = replica_all_reduce(job, layout, gb * layer_params, fsdp)
    # --offload: this GPU's shard copied in from the host before each gather (in the dtype it is kept in: the FP32
    # master where that is the shard), its reduced gradient shard copied out (FP32) after each reduce-scatter
    kept = 4 if fw.weight_shard_is_master else job.train.weight_bytes
    shard_in, grad_out = copies_per_unit(fw, job.offload, layout.zero_in_effect)
    copy_in = lambda n: unit_copy_time(c, kept * n / d, shard_in)
    copy_out = lambda n: unit_copy_time(c, GRAD_COPY_BYTES * n / d, grad_out)
    g, rs = g + copy_in(layer_params), rs + copy_out(layer_params)
    g_root = collective_time(c, "all_gather", pb * root, d, stride) + fsdp + copy_in(root) if root else 0.0
    r_root = (collective_time(c, "reduce_scatter", gb * root, d, stride) + fsdp + copy_out(root)
              + replica_all_reduce(job, layout, gb * root, fsdp)) if root else 0.0
    return _UnitCalls(g, rs, ar, rs + ar, g_root, r_root)


def _per_tensor_calls(job, layout, fw: Framework, fsdp: float) -> tuple[float, float, float]:
    """DeepSpeed ZeRO-3: one all-gather (and reduce-scatter) per parameter tensor of a layer."""
    c, stride, d = job.cluster, layout.tp, layout.shard_group
    gb, pb = fw.grad_reduce_bytes, param_gather_bytes(job, fw)
    tensors = layer_tensors(job.model, layout.tp)
    # Each list collective copies its d entries (list_copy_time); the 2021 gather first fills the whole gathered
    # buffer with zeros (_allgather_param: torch.zeros, one write).
    copy = lambda nbytes: list_copy_time(job, fw, nbytes, launches=d)
    fill = (lambda nbytes: nbytes / hbm_rate(c)) if fw.list_collectives else (lambda nbytes: 0.0)
    g = sum(collective_time(c, "all_gather", pb * n, d, stride) + fsdp + copy(pb * n) + fill(pb * n) for n in tensors)
    rs = sum(collective_time(c, "reduce_scatter", gb * n, d, stride) + fsdp + copy(gb * n) for n in tensors)
    ar = sum(replica_all_reduce(job, layout, gb * n, fsdp) for n in tensors)
    return g, rs, ar


class _Passes(NamedTuple):
    """How often one step runs a unit's calls."""

    forwards: int  # micro-batches whose forward gathers
    regathers: int  # a layer's gathers in each backward
    reducing: int  # backwards that reduce-scatter
    deferred: bool  # one reduction after the whole schedule instead, waited for


def _fsdp_passes(layout, fw: Framework, m: int) -> _Passes:
    # DeepSpeed's per-parameter fetches also run again for the recomputed forward of a checkpointed layer.
    regathers = (2 if fw.gather_per_tensor and layout.recompute == "full" else 1) if layout.zero >= 3 else 0
    # torch.distributed.pipelining (Framework.pipeline_fsdp_once): the units stay gathered from the first
    # forward to the last backward and reduce-scatter once after the schedule, waited for.
    deferred = fw.fsdp_once_per_step(layout)
    # Under no_sync() (Framework.fsdp_no_sync) only the last micro-batch's backward reduce-scatters.
    every = (layout.zero >= 3 or fw.fsdp_reduce_every_microbatch) and not fw.fsdp_no_sync
    return _Passes(forwards=1 if deferred else m, regathers=regathers, reducing=0 if deferred else (m if every else 1),
                   deferred=deferred)


def _prefetched(job, layout, calls: _UnitCalls, passes: _Passes, win: Window, chunks: int) -> float:
    """Exposed seconds of the gathers and reductions with one unit of prefetch, before the deferred reduction."""
    layers, g = win.layers, calls.gather
    # Forward: the root and the first layer's gathers are exposed, the rest prefetched one layer ahead.
    wait = max(0.0, g - win.layer_forward)
    fwd = chunks * calls.root_gather + g + max(layers - 1, 0) * (wait + interference(g, wait))
    # Backward: per layer the link carries its re-gather (ZeRO-3) and, when reducing, the layer's
    # reduce-scatter (and HSDP's all-reduce: beside them on the network when the shard group is one node's,
    # NVLink's traffic); the last layer's reduction and the root's run after the compute.
    apart = one_node(job.cluster, layout.shard_group, layout.tp)

    def bwd(reduce: bool) -> float:
        load = g * passes.regathers + (calls.reduce if reduce else 0.0)
        if reduce and apart:
            load = max(g * passes.regathers + calls.scatter, calls.replica)
        tail = (calls.reduce + chunks * calls.root_reduce) if reduce else 0.0
        behind = max(0.0, load - win.layer_backward)
        return max(layers - 1, 0) * (behind + interference(load, behind)) + tail
    m = win.microbatches
    return passes.forwards * fwd + passes.reducing * bwd(True) + (m - passes.reducing) * bwd(False)


def list_copy_time(job, fw: Framework, nbytes: float, launches: int) -> float:
    """Seconds of PyTorch's copies around a collective on a list of per-rank tensors (torch.distributed.all_gather(
    list, t), reduce_scatter(t, list)): ProcessGroupNCCL::allgather / reduce_scatter copy each entry out of (or into)
    the flat buffer NCCL works on, the whole `nbytes` read and written, in `launches` copy kernels (one per rank and
    call). 0 where the stack's collectives work on flat buffers (Framework.list_collectives)."""
    if not fw.list_collectives:
        return 0.0
    return launches * KERNEL_LAUNCH_S + 2 * nbytes / hbm_rate(job.cluster)


def fsdp_copy_time(job, fw: Framework, gathered: float, reduced: float, backwards: float, shard: int,
                   fp8_gathered: float = 0.0) -> float:
    """Seconds of the HBM passes PyTorch FSDP's own kernels make over the units, beside NCCL's: per element gathered,
    per gradient element reduced and per element of a unit's backward, in the step (Framework.torch_fsdp); `shard`
    ranks share a unit, and the passes over a rank's own shard move 1/shard of the unit. `fp8_gathered`: elements
    gathered in FP8 (Job.fp8_all_gather), the same passes at one byte: torchao's fsdp_pre_all_gather casts the FP32
    shard to FP8 with the step's precomputed scale (read 4, write 1) in place of FSDP's BF16 cast.
      FSDP1 (torch 2.0-2.3, _flat_param.py, _runtime_utils.py):
        before each gather, the local FP32 shard cast to the BF16 gather input (pre_unshard ->
          _use_low_precision_shard: read 4, write 2 per local element; nothing when the shard is BF16 already); the
          gather lands in the flat parameter itself;
        in every backward, the unit's gradient assembled into the flat gradient: the parameters are views of the flat
          parameter made under autograd (_use_unsharded_views, torch.split + view), so autograd's
          split_with_sizes_backward concatenates their gradients (at::cat: read and write the compute dtype);
        per reduction, the flat gradient cast to the reduce dtype when it differs (read the compute dtype, write the
          reduce dtype), then divided in place by the predivide factor (default_hooks.reduce_scatter_hook; > 1 from 2
          ranks on: read and write).
      FSDP2 (fully_shard, _fsdp_collectives.py):
        before each gather, the FP32 shard cast to BF16 (FSDPParam.all_gather_inputs: read 4, write 2; not when it is
          BF16 already) and copied into the gather input (foreach_all_gather's _foreach_copy_: read and write 2); after it,
          foreach_all_gather_copy_out copies the gathered buffer out into each parameter (read and write 2);
        per reduction, foreach_reduce_scatter_copy_in copies every gradient into the reduce-scatter input in the
          reduce dtype; NCCL's ReduceOp.AVG divides (_get_gradient_divide_factors): no division kernel.
    Counted in full. FSDP2's run on the compute stream's path: the copy-out on the compute stream itself
    (wait_for_unshard), the copy-in on the reduce-scatter stream, which the compute stream waits for
    (current_stream.wait_event(copy_in_event)) before the next layer's backward; FSDP1's autograd concatenation runs
    on the compute stream. FSDP1's casts and division run on its pre-unshard and post-backward streams, which the
    compute stream does not wait for (record_stream): there they take HBM and SMs from the layers beside them, and
    counting them in full is an upper bound."""
    if not fw.torch_fsdp:
        return 0.0
    p, r = param_gather_bytes(job, fw), fw.grad_reduce_bytes
    # The shard is what the optimizer updates (TrainSpec.master_bytes); casting it to the gather dtype reads it and
    # writes the gather dtype.
    master = job.train.master_bytes
    cast = master + p if master != p else 0
    if fw.torch_fsdp == 1:
        per_gathered, per_backward, per_reduced = cast / shard, 2 * p, (p + r if r != p else 0) + 2 * r
    else:
        per_gathered, per_backward, per_reduced = 2 * p + (cast + 2 * p) / shard, 0, p + r
    # torchao's FP8 gather (FSDP2 only): the copy-out of the gathered buffer; the shard's cast and copy-in, one byte
    per_fp8 = 2 + (master + 1 + 2) / shard if fw.torch_fsdp == 2 else per_gathered
    return (per_gathered * gathered + per_fp8 * fp8_gathered + per_backward * backwards
            + per_reduced * reduced) / hbm_rate(job.cluster)


def replica_all_reduce(job, layout, nbytes: float, call: float) -> float:
    """HSDP: after a unit's reduce-scatter inside its shard group, its gradient shard (nbytes / shard group) is
    all-reduced across the replicas (the same shard on every dp_shard-th rank: stride tp x shard group), one more
    call (torch FSDP1 _runtime_utils._reduce_grad: reduce_scatter_tensor over the shard group, then all_reduce over
    the inter-node group on its own stream, "Stream to run HSDP's all-reduce as async"; FSDP2 foreach_reduce:
    reduce-scatter, then all-reduce over the replicate mesh dimension)."""
    if layout.replicas <= 1:
        return 0.0
    shard = nbytes / layout.shard_group
    return collective_time(job.cluster, "all_reduce", shard, layout.replicas, layout.tp * layout.shard_group) + call


def layer_tensors(model: ModelSpec, tp: int) -> list[float]:
    """Elements of each parameter tensor of a layer on one GPU, as a Hugging Face-style model holds them
    (Q, K, V, output projection, the MLP's two or three matrices, biases, the norms' weights and biases)."""
    h, f, q, kv = model.hidden, model.ffn_hidden, model.q_dim, model.kv_dim
    mats = [h * q / tp, h * kv / tp, h * kv / tp, q / tp * h] + [h * f / tp] * (3 if model.gated_mlp else 2)
    out = mats + [h] * (model.layer_norms * model.norm_vectors)  # norm weights (and LayerNorm biases)
    if model.attention_bias:
        out += [q / tp, kv / tp, kv / tp, h]
    if model.ffn_bias:
        out += [f / tp, h] if not model.gated_mlp else [f / tp, f / tp, h]
    return out
