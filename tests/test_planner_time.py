"""Step-time model: collectives, FLOPs (PaLM), pipeline closed form, calibrated tables, estimate never crashes."""

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.planner import Job, estimate
from shardwise.planner.comm import LINK_EFFICIENCY, collective_time, interpolate
from shardwise.planner.step_time import matmul_params_per_layer, model_flops_per_step, stage_cost, step_time
from shardwise.schedules.closed_forms import pipeline_makespan
from shardwise.specs import Layout, TrainSpec, load_cluster, load_model, validate_layout

A100 = load_cluster("dgx-a100-80gb")


def test_ring_all_reduce_alpha_beta_by_hand():
    bw = 300e9 * LINK_EFFICIENCY
    t = collective_time(A100, "all_reduce", 1e9, 8)
    assert t == pytest.approx(2 * 7 * 5e-6 + 2 * 7 / 8 * 1e9 / bw)
    assert collective_time(A100, "all_gather", 1e9, 8) == pytest.approx(7 * 5e-6 + 7 / 8 * 1e9 / bw)
    assert collective_time(A100, "all_reduce", 1e9, 1) == 0.0


def test_a_group_wider_than_a_node_uses_the_network():
    intra = collective_time(A100, "all_reduce", 1e9, 8, stride=1)
    # 16 consecutive ranks: 8 per node drive the node's 8 NICs (one NCCL ring each): 8 x 25 GB/s
    inter = collective_time(A100, "all_reduce", 1e9, 16, stride=1)
    assert inter == pytest.approx(2 * 15 * 10e-6 + 2 * 15 / 16 * 1e9 / (200e9 * LINK_EFFICIENCY))
    assert inter > intra
    # one member per node (stride 8, e.g. DP with tp=8): a single NIC's 25 GB/s
    one_nic = collective_time(A100, "all_reduce", 1e9, 4, stride=8)
    assert one_nic == pytest.approx(2 * 3 * 10e-6 + 2 * 3 / 4 * 1e9 / (25e9 * LINK_EFFICIENCY))
    # DP groups are tp ranks apart: 4 ranks at stride 4 span two nodes
    assert collective_time(A100, "all_reduce", 1e9, 4, stride=4) > collective_time(A100, "all_reduce", 1e9, 4, stride=2)


def test_measured_tables_are_preferred_and_interpolated_log_log():
    table = [[1e6, 1e-4], [1e8, 1e-2]]  # slope 1 in log-log
    assert interpolate(table, 1e7) == pytest.approx(1e-3)
    assert interpolate(table, 1e5) == pytest.approx(1e-4)  # below the table: the smallest time
    assert interpolate(table, 2e8) == pytest.approx(2e-2)  # beyond: linear in bytes
    cal = dataclasses.replace(A100, measured={"all_reduce": table, "matmul_tflops": 200.0})
    assert collective_time(cal, "all_reduce", 1e7, 8) == pytest.approx(1e-3)
    # no table for all_gather: alpha-beta
    assert collective_time(cal, "all_gather", 1e9, 8) == collective_time(A100, "all_gather", 1e9, 8)
    job = Job(load_model("tiny"), cal, TrainSpec(8, 64))
    from shardwise.planner.step_time import achievable_flops
    assert achievable_flops(job) == 200e12


def test_model_flops_are_palm_6n_plus_attention():
    m = load_model("llama3-8b")
    job = Job(m, A100, TrainSpec(4, 2048))
    n = m.num_layers * matmul_params_per_layer(m) + m.hidden * m.vocab_size
    assert model_flops_per_step(job) == (6 * n + 12 * m.num_layers * m.q_dim * 2048) * 2048 * 4


def test_recompute_adds_hardware_flops_not_model_flops():
    job = Job(load_model("llama2-7b"), A100, TrainSpec(8, 2048))
    base = estimate(job, Layout(dp=8))
    full = estimate(job, Layout(dp=8, recompute="full"))
    assert base.model_flops == full.model_flops and base.hfu == pytest.approx(base.mfu)
    m = job.model
    per_layer_fwd = 2 * 2048 * matmul_params_per_layer(m) + 4 * 2048 * 2048 * m.q_dim
    assert full.hardware_flops - full.model_flops == pytest.approx(per_layer_fwd * m.num_layers * 8)
    assert full.hfu > full.mfu and full.step_time > base.step_time


def test_pipeline_uses_the_closed_form():
    job = Job(load_model("llama2-7b"), A100, TrainSpec(64, 2048))
    lay = Layout(dp=2, tp=1, pp=4, micro_batch=1, schedule="1f1b")
    t = step_time(job, lay)
    c = stage_cost(job, lay, 0)
    c_last = stage_cost(job, lay, 3)
    slow = max(c, c_last, key=lambda x: x.f + x.b + x.w)
    m = 32
    assert t["pipeline_bubble"] == pytest.approx(pipeline_makespan("1f1b", 4, m, 1, slow.f, slow.b, slow.w) - m * (slow.f + slow.b + slow.w))
    zb = step_time(job, lay.with_(schedule="zb-h1"))
    assert zb["pipeline_bubble"] < t["pipeline_bubble"]


def test_tp_across_nodes_costs_more():
    job = Job(load_model("llama2-70b"), A100, TrainSpec(16, 2048))
    inside = step_time(job, Layout(dp=2, tp=8, micro_batch=1, sequence_parallel=True))["tp_comm"]
    across = step_time(job, Layout(dp=1, tp=16, micro_batch=1, sequence_parallel=True))["tp_comm"]
    assert across > 4 * inside


def test_estimate_json_has_the_contract_fields():
    job = Job(load_model("llama3-8b"), load_cluster("dgx-h100-80gb"), TrainSpec(64, 4096))
    d = estimate(job, Layout(dp=2, tp=2, pp=2, vpp=2, schedule="interleaved-1f1b", zero=1)).to_dict()
    for key in ("tp", "pp", "dp", "vpp", "micro_batch", "num_microbatches", "zero", "recompute", "sequence_parallel",
                "schedule", "fits", "memory_gib_per_gpu", "memory_breakdown_gib", "step_time_s", "time_breakdown_s",
                "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu"):
        assert key in d
    assert d["step_time_s"] == pytest.approx(sum(d["time_breakdown_s"].values()), rel=1e-4)
    assert d["memory_gib_per_gpu"] == pytest.approx(sum(d["memory_breakdown_gib"].values()), abs=0.01)
    assert d["tokens_per_s"] == pytest.approx(64 * 4096 / d["step_time_s"], rel=1e-4)


@settings(max_examples=80, deadline=None)
@given(model=st.sampled_from(["tiny", "tiny-gpt2", "gpt2", "llama2-13b", "llama3-70b", "llama3.1-405b"]),
       cluster=st.sampled_from(["dgx-a100-40gb", "dgx-h100-80gb", "dgx-h200"]),
       tp=st.sampled_from([1, 2, 4, 8, 16]), pp=st.sampled_from([1, 2, 3, 4, 8]), dp=st.sampled_from([1, 2, 3, 8]),
       mb=st.sampled_from([1, 2, 4]), vpp=st.sampled_from([1, 2, 3]), zero=st.sampled_from([0, 1, 2, 3]),
       recompute=st.sampled_from(["none", "selective", "full"]), sp=st.booleans(),
       schedule=st.sampled_from(["naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1"]),
       seq=st.sampled_from([1, 64, 2048]), flash=st.booleans(), overlap=st.booleans())
def test_estimate_never_crashes_on_valid_input(model, cluster, tp, pp, dp, mb, vpp, zero, recompute, sp, schedule,
                                              seq, flash, overlap):
    from shardwise.errors import UsageError
    spec = load_model(model)
    batch = dp * mb * pp * 2
    lay = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, vpp=vpp, zero=zero, recompute=recompute,
                 sequence_parallel=sp, schedule=schedule)
    try:
        validate_layout(lay, spec, batch, dp * tp * pp)
    except UsageError:
        return
    e = estimate(Job(spec, load_cluster(cluster), TrainSpec(batch, seq), flash_attention=flash, tp_comm_overlap=overlap), lay)
    d = e.to_dict()
    assert e.step_time > 0 and e.memory_per_gpu > 0 and 0 < e.mfu <= e.hfu < 1
    assert all(math.isfinite(v) and v >= 0 for v in d["time_breakdown_s"].values())


# ------------------------------------------------------------------ calibrated per-call costs (counted, not fitted)

def _tiny_job(**measured):
    cluster = dataclasses.replace(A100, measured=measured)
    return Job(load_model("tiny"), cluster, TrainSpec(8, 64), flash_attention=True)


def _delta(key: str, lay: Layout, **measured) -> float:
    """What the calibrated costs in `measured` add to `key` (comm_overlap, when given, holds for both)."""
    base = {k: v for k, v in measured.items() if k == "comm_overlap"}
    return step_time(_tiny_job(**measured), lay)[key] - step_time(_tiny_job(**base), lay)[key]


def test_every_tensor_parallel_call_pays_the_sync_cost():
    # tiny: 4 layers x (2 all-reduces forward + 2 backward) + embedding, LM head and loss = 19 calls per
    # micro-batch, 8 micro-batches. Sequence parallelism: twice the calls, but a block's gather follows
    # the previous scatter with only a norm between, so each of the 4 x 4 pairs synchronises once; the
    # backward gathers again the saved sequence shard of q/k/v's and gate/up's input (4 x 2 calls), and
    # the edges are 6 calls (embedding scatter and its gather, head gather, scatter and re-gather, loss) = 30.
    x = 1e-3
    assert _delta("tp_comm", Layout(tp=2), sync_overhead_s=x) == pytest.approx(8 * 19 * x)
    assert _delta("tp_comm", Layout(tp=2, sequence_parallel=True), sync_overhead_s=x) == pytest.approx(8 * 30 * x)
    # once per step: the gradient norm over tp (and SP's partial norm gradients)
    assert _delta("step_comm", Layout(tp=2), sync_overhead_s=x) == pytest.approx(x)
    assert _delta("step_comm", Layout(tp=2, sequence_parallel=True), sync_overhead_s=x) == pytest.approx(2 * x)


def test_fsdp_calls_are_counted_per_unit():
    # dp2, 4 micro-batches per rank; 4 layer units + 1 root. ZeRO-3: per micro-batch 5 gathers in
    # forward, 4 in backward (the root stays gathered), 5 reduce-scatters = 14. ZeRO-2: per micro-batch
    # 5 gathers (kept until backward) and 5 reduce-scatters (gradients stay sharded) = 10.
    y = 1e-3
    assert _delta("dp_comm", Layout(dp=2, zero=3), fsdp_call_s=y, comm_overlap=0.0) == pytest.approx(4 * 14 * y)
    assert _delta("dp_comm", Layout(dp=2, zero=2), fsdp_call_s=y, comm_overlap=0.0) == pytest.approx(4 * 10 * y)
    # ZeRO-0: one all-reduce
    assert _delta("dp_comm", Layout(dp=2), sync_overhead_s=y, comm_overlap=0.0) == pytest.approx(y)


def test_checkpointed_layers_pay_the_checkpoint_cost():
    z = 1e-3
    for policy in ("selective", "full"):  # 4 layers x 8 micro-batches
        assert _delta("recompute", Layout(recompute=policy), checkpoint_overhead_s=z) == pytest.approx(32 * z)


def test_pipeline_receives_each_pay_the_sync_cost():
    from shardwise.planner.step_time import pipeline_receives

    assert pipeline_receives(Layout(pp=2), 8) == 8  # rank 0 the gradients, rank 1 the activations
    assert pipeline_receives(Layout(pp=4), 8) == 16  # a middle rank receives both
    assert pipeline_receives(Layout(pp=2, vpp=2, schedule="interleaved-1f1b"), 8) == 24  # 3 of its 4 chunk edges
    assert pipeline_receives(Layout(), 8) == 0
    x = 1e-3
    assert _delta("pp_p2p", Layout(pp=2, schedule="gpipe"), sync_overhead_s=x) == pytest.approx(8 * x)


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2"])
def test_parameter_tensors_are_the_runtimes(name):
    from shardwise.model import Transformer
    from shardwise.planner.memory import Job
    from shardwise.planner.step_time import param_tensors

    spec = load_model(name)
    job = Job(spec, load_cluster("dgx-h100-80gb"), TrainSpec(8, 64))
    assert param_tensors(job, Layout(), 0) == len(list(Transformer(spec).parameters()))
    lay = Layout(pp=2)
    first = Transformer(spec, layer_ids=range(2), last=False)
    last = Transformer(spec, layer_ids=range(2, 4), first=False)
    assert [param_tensors(job, lay, r) for r in (0, 1)] == [len(list(m.parameters())) for m in (first, last)]


def test_ddp_wraps_every_micro_batch():
    # dp2: 4 micro-batches per rank under DDP; pipelines and FSDP do not use DDP.
    w = 1e-3
    assert _delta("compute", Layout(dp=2), ddp_microbatch_s=w) == pytest.approx(4 * w)
    assert _delta("compute", Layout(dp=2, zero=1), ddp_microbatch_s=w) == pytest.approx(4 * w)
    for lay in (Layout(dp=2, zero=3), Layout(pp=2), Layout(tp=2)):
        assert _delta("compute", lay, ddp_microbatch_s=w) == 0
