"""Mixture-of-experts terms of the planner (pure Python; formulas and sources in docs/planner.md).

Experts fold over the dense ranks of a pipeline stage (Megatron-Core's MoE parallel folding): ep groups of
ep * etp ranks (etp fastest, so an ep group spans tp, then dp), edp = dp * tp * cp / (ep * etp) replicas.
Per GPU of pipeline rank r:
  parameters   the dense part / tp, plus E * 3 h f_e / (ep * etp) per MoE layer it holds;
  states       the dense part ZeRO-sharded over dp * cp, the experts over edp (what the runtime does);
  activations  a MoE layer keeps, per token it routes (1/tp of its tokens), the router's probabilities,
               the top-k ids and weights, the integer orders of the dispatch, and per (token, expert)
               pair routed to it (k c of them, c the capacity factor) the dispatched row and the
               SwiGLU's tensors — the dispatch buffers are those rows (what shardwise.moe saves,
               tests/test_moe_memory.py);
  time         the experts' GEMMs (E/ep experts of k c routed / (E/ep) rows each, width f_e/etp),
               the router's GEMM, the shared expert's, and per layer two all-to-alls forward (dispatch,
               combine) and two backward, each moving k c h bytes per routed token, inside a node over
               NVLink and across nodes over the NICs at once; plus a fixed cost per layer pass and the host's time
               to issue one, below which a pass does not go (both fitted on published runs, below).
FLOPs and MFU count active parameters (top-k experts, router, shared expert): the convention of the
Mixtral, DeepSeek-V3 and Megatron-Core MoE reports.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

from shardwise import stage_split
from shardwise.planner.comm import NET_EFFICIENCY, collective_time, nvlink_bandwidth, placement, sync_time
from shardwise.planner import kernels
from shardwise.planner.kernels import hbm_rate
from shardwise.planner.overlap import interference
from shardwise.specs import ClusterSpec, Layout, ModelSpec

INDEX_BYTES = 8  # int64 indices autograd keeps (top-k ids, dispatch orders)
# Seconds a MoE layer costs per micro-batch beyond the kernels the planner times (forward + backward; charged
# 1/3 to the forward, 2/3 to the backward, and again with each recomputed forward): the router's top-k,
# score and auxiliary-loss kernels, the dispatcher's metadata (token counts per expert and rank, their
# gather over the ep group, sort indices) and their backward, each a small kernel that costs a launch, and
# the host synchronisation a dropless dispatch makes to size its buffers and splits (Megatron-Core's
# MoEAlltoAllTokenDispatcher syncs before the ep all-to-all; DeepEP's normal dispatch waits on the host for
# its receive counts), after which the GPU idles while the host issues the next kernels. Megatron-Core's own
# remedy is to capture exactly these parts in CUDA graphs (--cuda-graph-scope moe_router moe_preprocess;
# the Megatron-MoE ModelZoo's Qwen3-235B H100 script, best_practice/qwen3/run_h100_235b.sh, gets 320 TFLOP/s
# with them against its table's 276 without, at one layout). No datasheet gives this cost: with
# MOE_LAYER_HOST_S below it is taken from training runs, the pair fitted together on the published MoE runs
# (smallest median |log error|); benchmarks/published_runs.py refits them without each source and prints every
# source's error then.
MOE_LAYER_OVERHEAD_S = 1.4e-3
# Seconds the host takes to issue one MoE layer's forward and backward (1/3, 2/3): Python, the framework's modules
# and the kernel launches of a transformer layer with its router, dispatcher and per-expert GEMMs. The GPU runs a
# layer's kernels as fast as they come; where they take less than this, it waits for the host (a layer pass is
# never shorter). Only small layers reach it: few tokens per GPU (TP 4 over 4K-token micro-batches) or small
# experts. Fitted with MOE_LAYER_OVERHEAD_S on the published MoE runs; leave-one-source-out in
# benchmarks/published_runs.py.
MOE_LAYER_HOST_S = 9.5e-3


@lru_cache(maxsize=1 << 14)  # asked per rank for every layout the search scores: computed once per split
def _rank_layer_ids(model: ModelSpec, pp: int, vpp: int, rank: int, seq_len: int, rule: str = "balanced"
                    ) -> tuple[int, ...]:
    counts = stage_split.stage_layer_counts(model, pp * vpp, seq_len, rule)
    starts = list(itertools.accumulate(counts, initial=0))
    return tuple(i for c in range(vpp) for s in [c * pp + rank] for i in range(starts[s], starts[s] + counts[s]))


def rank_moe_layers(model: ModelSpec, layout: Layout, rank: int, seq_len: int, rule: str = "balanced") -> int:
    """MoE layers on pipeline rank `rank` under the stack's split `rule` (stage_split.RULES)."""
    if not model.is_moe:
        return 0
    return _rank_moe_layers(model, layout.pp, layout.vpp, rank, seq_len, rule)


@lru_cache(maxsize=1 << 14)
def _rank_moe_layers(model: ModelSpec, pp: int, vpp: int, rank: int, seq_len: int, rule: str) -> int:
    return sum(model.is_moe_layer(i) for i in _rank_layer_ids(model, pp, vpp, rank, seq_len, rule))


def expert_replicas(layout: Layout, cp: int, in_layer_units: bool = False) -> int:
    """edp: how many ranks of a stage hold the same expert shard. A stack whose unsplit experts (ep x etp = 1) ride in
    their layer's own data-parallel unit (Framework.experts_in_layer_units) shards them with the dense weights, over
    dp x cp: each tp rank holds them whole."""
    if in_layer_units and layout.ep * layout.etp == 1:
        return layout.dp * cp
    return layout.dp * layout.tp * cp // (layout.ep * layout.etp)


def experts_per_gpu(model: ModelSpec, layout: Layout, moe_layers: int) -> float:
    """Routed-expert parameters one GPU holds for `moe_layers` MoE layers."""
    return moe_layers * model.num_experts * model.expert_params() / (layout.ep * layout.etp)


def expert_states(weight_b: int, grad_b: int, optim_b: int, layout: Layout, cp: int, experts: float,
                  layer_experts: float, in_layer_units: bool = False, zero3_layers: int = 2) -> dict[str, float]:
    """Weights, gradients and optimizer states of this GPU's experts, ZeRO-sharded over their edp replicas
    as the runtime shards them (ZeRO-1: their own optimizer over edp; ZeRO-2/3: FSDP over edp, which keeps
    all of them (ZeRO-2) or `zero3_layers` layers' (ZeRO-3: Framework.zero3_expert_layers_gathered) gathered while
    in use)."""
    edp = expert_replicas(layout, cp, in_layer_units)
    zero = layout.zero if layout.dp * cp > 1 and edp > 1 else 0
    weights, grads, optim = weight_b * experts, grad_b * experts, optim_b * experts
    if zero >= 1:
        optim /= edp
    if zero >= 2:
        grads /= edp
        # in their layer's own unit (unsplit, in_layer_units) they are gathered with it: the dense layers' two
        layers = 2 if in_layer_units and layout.ep * layout.etp == 1 else zero3_layers
        gathered = experts if zero == 2 else min(layers * layer_experts, experts)
        weights = weight_b * (experts / edp + gathered)
    return {"weights": weights, "gradients": grads, "optimizer": optim}


def routed_activation_bytes(model: ModelSpec, tokens: float, layout: Layout, e: int, gated_tensors: int,
                            capacity: float = 1.0) -> float:
    """Bytes one MoE layer's routed path keeps for backward on one GPU, for `tokens` tokens of its micro-batch
    (before the tp split: each tp rank routes 1/tp of them). Router: fp32 probabilities (E) and, with
    renormalised top-k, the top-k values and their sum; top-k ids; the dispatch's gather and inverse orders
    (and under expert parallelism the regrouping's two), the combine's weights. Per (token, expert) pair
    received (k x capacity per routed token): the dispatched row (h wide; with etp every etp rank's rows)
    and the SwiGLU's f_e/etp-wide tensors; per pair sent, the expert output the combine weights."""
    k, E, h = model.experts_per_token, model.num_experts, model.hidden
    routed = tokens / layout.tp
    router = 4 * E + INDEX_BYTES * k + ((4 * k + 4) if model.norm_topk else 0) + (4 if model.router_scoring == "sigmoid" else 0)
    orders = INDEX_BYTES * k * (4 if layout.ep * layout.etp > 1 else 2)
    combine = 4 * k + k * e * h
    experts = capacity * k * e * (layout.etp * h + gated_tensors * model.moe_ffn_hidden)
    return routed * (router + orders + combine + experts)


def layer_activation_delta(model: ModelSpec, s: int, b: int, layout: Layout, e: int, gated_tensors: int,
                           capacity: float = 1.0) -> float:
    """What a MoE layer keeps beyond a dense layer of the same model (can be negative): its routed path and
    shared expert instead of the dense FFN's f-wide tensors; without sequence parallelism under tp, the
    routed tokens are a split copy of the FFN input (which only a shared expert keeps whole)."""
    tokens, tp = s * b, layout.tp
    delta = routed_activation_bytes(model, tokens, layout, e, gated_tensors, capacity)
    delta += tokens * e * gated_tensors * (model.shared_ffn_hidden - model.ffn_hidden) / tp
    if tp > 1 and not layout.sequence_parallel:
        delta += tokens * e * model.hidden / tp - (0 if model.shared_ffn_hidden else tokens * e * model.hidden)
    return delta


def all_to_all_time(cluster: ClusterSpec, nbytes: float, n: int, stride: int) -> float:
    """Seconds for each of n ranks (`stride` apart) to send `nbytes` spread evenly over the n of them:
    (n-1)/n leaves the rank, the part for ranks on other nodes over its NIC at NET_EFFICIENCY, the rest
    over NVLink at the same time (NCCL's all-to-all posts every pair at once); plus one hop's latency.
    A calibrated cluster without an all-to-all table: alpha-beta over its fitted link (collective_time's
    send_recv)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    out = nbytes * (n - 1) / n
    if cluster.measured:
        return collective_time(cluster, "send_recv", out, 2, stride)
    per_node, nodes = placement(cluster, n, stride)
    remote = nbytes * (n - per_node) / n
    local = out - remote
    nvlink = nvlink_bandwidth(cluster) if per_node > 1 else float("inf")
    # across nodes every pair crosses the network once, at once: one crossing's extra (a nccl-tests fit; 0 on presets)
    latency = cluster.inter_node_latency + cluster.net_step_extra if nodes > 1 else cluster.intra_node_latency
    return latency + max(local / nvlink if local else 0.0, remote / (cluster.inter_node_bandwidth * NET_EFFICIENCY))


def _none_of(pool: int, avoid: int, k: int) -> float:
    """P(k distinct experts drawn at random from `pool` miss `avoid` given ones): C(pool - avoid, k) / C(pool, k)."""
    if k > pool - avoid:
        return 0.0
    return math.comb(pool - avoid, k) / math.comb(pool, k)


def units_hit(model: ModelSpec, units: int, routing: str = "random") -> float:
    """Expected number of `units` (ep ranks, or the nodes of an ep group), each holding E/units consecutive
    experts, that hold at least one of a token's k experts.
      random      k distinct experts at random (a trained router's spread; Megatron-Core's
                  --moe-router-force-load-balancing draws random logits, megatron/core/transformer/moe/router.py),
                  within the top `router_topk_groups` of `router_groups` expert groups first when the router
                  is group-limited (DeepSeek-V3: 4 of 8 groups of 32 experts);
      contiguous  k consecutive experts, token t's being tk .. tk+k-1 mod E (NeMo AutoModel's FakeBalancedGate,
                  nemo_automodel/components/moe/layers.py, its benchmarks' routing): averaged over t."""
    E, k = model.num_experts, model.experts_per_token
    units = max(1, min(units, E))
    per = E // units
    if routing == "contiguous":
        starts = sorted({t * k % E for t in range(E)})
        return sum(len({(s + j) % E // per for j in range(k)}) for s in starts) / len(starts)
    G, g = model.router_groups, model.router_topk_groups
    if G > 1 and g < G and E % G == 0:
        size = E // G
        if size % per == 0:  # a unit inside one group: that group chosen, then none of its experts drawn
            missed = (1 - g / G) + g / G * _none_of(g * size, per, k)
        elif per % size == 0:  # a unit of m whole groups: j of them chosen, none of their experts drawn
            m = per // size
            missed = sum(math.comb(m, j) * math.comb(G - m, g - j) / math.comb(G, g) * _none_of(g * size, j * size, k)
                         for j in range(0, min(m, g) + 1))
        else:
            missed = _none_of(E, per, k)
    else:
        missed = _none_of(E, per, k)
    return units * (1 - missed)


def deepep_time(cluster: ClusterSpec, model: ModelSpec, routed: float, row_bytes: float, n: int, stride: int,
                routing: str = "random") -> float:
    """One dispatch (or combine) of DeepEP's normal kernels over an ep group of n ranks (deepseek-ai/DeepEP
    docs/legacy.md: "asymmetric-domain bandwidth forwarding" from the NVLink to the RDMA domain). A token goes
    once to each other node holding one of its k experts (to the GPU of the same local index, over its NIC),
    and once to each rank of a node holding one (over NVLink, from there or from the sender), not once per
    expert: RDMA bytes = routed x row x (nodes hit - own node), NVLink bytes = routed x row x the (rank, token)
    pairs not on the GPU the token landed on; both run at once. Which ranks and nodes: `units_hit`."""
    per_node, nodes = placement(cluster, n, stride)
    ranks_hit = units_hit(model, n, routing)
    nodes_hit = units_hit(model, nodes, routing) if nodes > 1 else 1.0
    rdma = routed * row_bytes * nodes_hit * (nodes - 1) / nodes  # the own node's share stays on NVLink
    nvlink = routed * row_bytes * ranks_hit * (per_node - 1) / per_node
    nv_bw = nvlink_bandwidth(cluster) if per_node > 1 else float("inf")
    latency = cluster.inter_node_latency + cluster.net_step_extra if nodes > 1 else cluster.intra_node_latency
    return latency + max(nvlink / nv_bw, rdma / (cluster.inter_node_bandwidth * NET_EFFICIENCY) if nodes > 1 else 0.0)


def dispatch_time(cluster: ClusterSpec, model: ModelSpec, tokens: float, layout: Layout, e: int,
                  capacity: float = 1.0, dispatcher: str = "alltoall", routing: str = "random",
                  stream: int | None = None) -> float:
    """One direction of one MoE layer's traffic (forward, or backward: the same bytes): dispatch and combine
    all-to-alls over ep (NCCL's all-to-all, k copies of a token's row; or DeepEP's node-deduplicated one);
    with etp the all-gather and reduce-scatter of the rows over etp; without sequence parallelism under tp
    the all-gather of the routed output over tp. Each of these calls also pays the calibrated synchronisation
    cost of a calibrated cluster (comm.sync_time, one all-reduce after a layer; 0 on datasheet ones); the dense TP
    calls pay comm.tp_sync_time instead (layer_time.tp_layer_comm). The exchange of the counts before the dispatch
    is count_exchange_time. `stream`: bytes per element of what enters and leaves the experts by the residual stream
    (the dispatched rows and their gradients, the gathered output; default `e`): FP32 in shardwise's runtime under
    autocast (its routing weights and norms are FP32: layer_time.tp_element_bytes), where the combine's rows are the
    experts' BF16 output."""
    stream = stream or e
    routed = tokens / layout.tp
    rows = routed * model.experts_per_token * capacity * model.hidden
    if dispatcher == "deepep":
        t = 2 * deepep_time(cluster, model, routed * capacity, model.hidden * e, layout.ep, layout.etp, routing)
    else:
        t = all_to_all_time(cluster, rows * stream, layout.ep, layout.etp) + all_to_all_time(cluster, rows * e, layout.ep,
                                                                                             layout.etp)
    calls = 2 if layout.ep > 1 else 0  # dispatch and combine
    if layout.etp > 1:
        t += (collective_time(cluster, "all_gather", layout.etp * rows * stream, layout.etp)
              + collective_time(cluster, "reduce_scatter", layout.etp * rows * e, layout.etp))
        calls += 2
    if layout.tp > 1 and not layout.sequence_parallel:
        t += collective_time(cluster, "all_gather", tokens * model.hidden * stream, layout.tp)
        calls += 1
    return t + calls * sync_time(cluster)


def aux_counts_time(cluster: ClusterSpec, model: ModelSpec, layout: Layout) -> float:
    """One MoE layer's forward: the load-balancing loss counts each expert's tokens over the whole sequence, so
    the ranks holding parts of it (tp, which routes 1/tp of the tokens on each rank, and cp) sum their counts in
    one small all-reduce (Megatron-Core's router _apply_aux_loss: tokens_per_expert over tp_cp_group;
    shardwise.moe.MoE.aux_loss: the counts and the token count over its seq_group). A synchronising call: its
    latency and, on a calibrated cluster, the synchronisation cost (comm.sync_time)."""
    group = layout.tp * layout.cp
    if not model.aux_loss_coef or group <= 1:
        return 0.0
    nbytes = 4 * (layout.micro_batch * model.num_experts + 1)
    return collective_time(cluster, "all_reduce", nbytes, group) + sync_time(cluster)


def count_exchange_time(cluster: ClusterSpec, model: ModelSpec, layout: Layout) -> float:
    """One MoE layer's forward under ep or etp on a calibrated cluster: before the dispatch the ranks exchange how
    many rows each sends each expert (shardwise.parallel.expert_parallel.ExpertDispatch: an all-to-all of the E
    counts over ep, an all-gather of the local experts' counts over etp), small synchronising calls. On datasheet
    clusters this exchange and the host synchronisation it makes are part of MOE_LAYER_OVERHEAD_S (the dispatcher's
    metadata, above), so it is counted there, not here."""
    t = 0.0
    if layout.ep > 1:
        t += all_to_all_time(cluster, 4 * model.num_experts, layout.ep, layout.etp) + sync_time(cluster)
    if layout.etp > 1:
        t += collective_time(cluster, "all_gather", 4 * model.num_experts / layout.ep * layout.etp, layout.etp) \
            + sync_time(cluster)
    return t


def layer_gemms(model: ModelSpec, tokens: int, layout: Layout, capacity: float = 1.0) -> list[tuple[float, float, float, int]]:
    """(M, N, K, count) of a MoE layer's FFN GEMMs on one GPU, forward: the router, the shared expert
    (column- and row-parallel over tp), and each local expert's gate/up and down GEMMs (E/ep of them, each
    on its share of the routed rows, width f_e/etp)."""
    h, tp = model.hidden, layout.tp
    routed = tokens / tp
    local = model.num_experts // layout.ep
    rows = layout.etp * routed * model.experts_per_token * capacity / local
    f = model.moe_ffn_hidden // layout.etp
    out = []
    if model.shared_ffn_hidden:  # first, where a dense layer's FFN GEMMs are (tp_layer_comm pairs them)
        out += [(tokens, 2 * model.shared_ffn_hidden // tp, h, 1), (tokens, h, model.shared_ffn_hidden // tp, 1)]
    return out + [(routed, model.num_experts, h, 1), (rows, 2 * f, h, local), (rows, h, f, local)]


def fp8_gemms(model: ModelSpec, experts: bool) -> list[bool]:
    """Which of layer_gemms' GEMMs run in FP8 under `--precision fp8`: the shared expert's, as every dense linear; the
    router's in BF16 (Megatron-Core's TopKRouter computes its logits in BF16 or FP32; torchtitan's router nn.Linear
    becomes a Float8Linear where the expert count is a multiple of 16, a GEMM of hidden x experts MACs a token whose
    precision moves no step); the routed experts' where the stack runs them in FP8 (`experts`: Framework.fp8_experts,
    Megatron-Core's TEGroupedLinear), not under torchao: torchtitan's `quantize.linear.float8` swaps nn.Linear for
    Float8Linear, and its GroupedExperts hold plain parameters (models/moe/moe.py), so they run BF16 grouped GEMMs
    unless its prototype `quantize.grouped_mm.float8` converter is named, which no profile does."""
    shared = [True, True] if model.shared_ffn_hidden else []
    return shared + [False] + [experts] * 2


def expert_gemm_time(cluster: ClusterSpec, m: float, n: float, k: float, count: int, streams: int,
                     out_bytes: float = 2, fp8: bool = False, precision: str = "bf16") -> float:
    """Seconds of `count` equal GEMMs of one layer's local experts as the stack issues them: one grouped kernel
    (`streams` 0: its tiles share the waves), or one GEMM per expert round-robin over `streams` streams, so
    only `streams` of them share the SMs at a time (Transformer Engine's GroupedLinear on Hopper:
    multi_stream_cublas_gemm over 4 compute streams; grouped_gemm's gmm on SM90: cuBLAS over 4 streams)."""
    if streams <= 0 or count <= streams:
        return kernels.gemm_time(cluster, m, n, k, batch=count, out_bytes=out_bytes, fp8=fp8, precision=precision)
    full, rest = divmod(count, streams)

    def batch_of(batch: int) -> float:
        return kernels.gemm_time(cluster, m, n, k, batch=batch, out_bytes=out_bytes, fp8=fp8, precision=precision)
    return full * batch_of(streams) + (batch_of(rest) if rest else 0.0)


def permute_time(cluster: ClusterSpec, model: ModelSpec, tokens: float, layout: Layout, e: int,
                 capacity: float = 1.0) -> tuple[float, float]:
    """(forward, backward) seconds of one MoE layer's token permutation at HBM bandwidth, for the tokens one GPU
    routes (1/tp of `tokens`): the permute gathers each routed token's row k x c times (reads and writes k c rows),
    the unpermute reads the k c expert outputs and writes their probability-weighted sum (Megatron-Core's
    moe_utils.permute / unpermute, fused or not: the same bytes). Backward mirrors both and reads the k c outputs
    once more for the probabilities' gradient."""
    routed, rows = tokens / layout.tp, model.experts_per_token * capacity
    fwd = routed * e * model.hidden * (3 * rows + 1) / hbm_rate(cluster)
    return fwd, fwd * (4 * rows + 1) / (3 * rows + 1)


def fp8_cast_elements(model: ModelSpec, tokens: float, layout: Layout, capacity: float = 1.0, experts: bool = True
                      ) -> tuple[list[float], list[float]]:
    """Elements a MoE layer's FP8 linears quantize on one GPU, (forward inputs, backward output gradients), one
    entry per tensor: the routed rows it receives (k c per routed token, 1/tp of the tokens) enter FC1 h wide —
    after the permutation, so no norm fuses their cast — and FC2 f_e/etp wide (times etp rows); backward casts
    FC2's output gradient (h) and FC1's (2 f_e/etp gated). The shared expert casts like a dense FFN of its width,
    its FC1 input included (a plain linear in Megatron-Core's SharedExpertMLP). The router stays in BF16/FP32.
    `experts` False: the routed experts run in BF16 (torchao: fp8_gemms), so only the shared expert casts."""
    routed = tokens / layout.tp * model.experts_per_token * capacity * layout.etp
    h, fe, gate = model.hidden, model.moe_ffn_hidden / layout.etp, 2 if model.gated_mlp else 1
    inputs, grads = ([routed * h, routed * fe], [routed * h, routed * gate * fe]) if experts else ([], [])
    if model.shared_ffn_hidden:
        fs = model.shared_ffn_hidden / layout.tp
        inputs += [tokens * h / layout.tp, tokens * fs]
        grads += [tokens * h, tokens * gate * fs]
    return inputs, grads


def active_ffn_width(model: ModelSpec, capacity: float = 1.0) -> float:
    """The f-wide elements per token a MoE layer's element-wise passes touch (for the element-wise model)."""
    return model.experts_per_token * capacity * model.moe_ffn_hidden + model.shared_ffn_hidden


def ep_overlap_exposed(pre_f: float, pre_b: float, mlp_f: float, mlp_b: float, mlp_w: float, a2a: float) -> float:
    """Seconds a pair of MoE layer passes — one micro-batch's forward beside another's backward — takes beyond
    their compute under Megatron-Core's EP all-to-all overlap (--overlap-moe-expert-parallel-comm
    --delay-wgrad-compute; megatron/core/models/common/model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run):
        comm stream:    combine_bwd      | dispatch_fwd -> dispatch_bwd       | combine_fwd
        compute stream: pre_dispatch_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd   | pre_dispatch_bwd
    in three windows, each as long as its longer stream, with the experts' forward after the forward dispatch and
    the backward dispatch after the experts' input gradients. `pre_*`: the layer's compute before the dispatch
    (attention, norms, router), `mlp_*`: the experts' (and shared expert's) forward, input and weight gradients,
    `a2a`: one dispatch or combine. The attention's weight gradients run after, beside nothing. The hidden
    part slows the compute beside it (overlap.interference)."""
    first = max(a2a, pre_f)
    dispatched = a2a  # the forward dispatch ends; the experts' input gradients end at mlp_b
    mlp_end = max(mlp_b + mlp_w, dispatched) + mlp_f
    second = max(mlp_end, max(dispatched, mlp_b) + a2a)
    third = max(a2a, pre_b)
    exposed = first + second + third - (pre_f + pre_b + mlp_f + mlp_b + mlp_w)
    return exposed + interference(4 * a2a, exposed)


def paired_share(layout: Layout, microbatches: int) -> float:
    """Share of a pipeline rank's MoE layer passes that run paired (a forward beside a backward) under the EP
    overlap: all but the warm-up forwards and the cool-down backwards of the first pipeline rank, which has the
    most (Megatron-Core's schedules: p - 1 warm-up micro-batches for 1F1B, 2 (p - 1) + (v - 1) p model chunks
    interleaved; with no pipeline the first forward and the last backward)."""
    chunks = microbatches * layout.vpp
    if layout.pp == 1:
        warmup = 1
    elif layout.vpp > 1:
        warmup = 2 * (layout.pp - 1) + (layout.vpp - 1) * layout.pp
    else:
        warmup = layout.pp - 1
    return max(0.0, 1 - min(warmup, chunks) / chunks)
