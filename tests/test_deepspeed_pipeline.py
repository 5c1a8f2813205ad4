"""DeepSpeed's pipeline engine as the 2021-22 runs used it (the `deepspeed` profile): its lockstep TrainSchedule,
the PartitionedTensor it rebuilds after every transfer, and Megatron-DeepSpeed's eager GLU."""

from __future__ import annotations

import json

import pytest

from shardwise.planner import kernels
from shardwise.planner.comm import collective_time
from shardwise.planner.job import make_job
from shardwise.planner.step_time import pipe_regather_time, pipeline_costs, step_time
from shardwise.schedules import Costs, build, simulate
from shardwise.schedules.closed_forms import lockstep_transfers, pipeline_makespan
from shardwise.schedules.lockstep import simulate_lockstep, train_schedule_step
from shardwise.specs import Layout, ModelSpec, load_cluster

A100 = load_cluster("dgx-a100-80gb")
# MT-NLG 530B (Smith et al. 2022): 105 layers, hidden 20480, 128 heads, sequence 2048.
MTNLG = ModelSpec(name="mt-nlg", family="gpt2", hidden=20480, ffn_hidden=81920, num_layers=105, num_heads=128,
                  num_kv_heads=128, vocab_size=51200, head_dim=160, max_positions=2048, tie_embeddings=True)


def test_train_schedule_order_is_deepspeeds():
    # DeepSpeed's TrainSchedule for 2 stages and 3 micro-batches, step by step (runtime/pipe/schedule.py: an even stage
    # runs forwards at even steps, an odd one at odd steps; stage s's forward of micro-batch k at step 2k + s, its
    # backward of k at step 2k + 2p - 1 - s; anything else idles). By hand, None for an idle step:
    expected = {0: [(0, True), None, (1, True), (0, False), (2, True), (1, False), None, (2, False)],
                1: [None, (0, True), (0, False), (1, True), (1, False), (2, True), (2, False), None]}
    for stage, steps in expected.items():
        got = [train_schedule_step(2, stage, t) for t in range(2 * (3 + 2 - 1))]
        assert [x if 0 <= x[0] < 3 else None for x in got] == steps


def test_lockstep_simulation_by_hand():
    # p = 2, m = 1, forward 1, backward 2, transfer x. Step 0: stage 0 runs F0 (0 to 1). Step 1: stage 0 sends F0's
    # activation, stage 1 receives it (x, from 1), then F0 (1 + x to 2 + x). Step 2: stage 1 runs B0 (to 4 + x).
    # Step 3: stage 1 sends the gradient (from 4 + x, a transfer), stage 0 runs B0 (4 + 2x to 6 + 2x).
    x = 0.25
    sim = simulate_lockstep(2, 1, Costs(1.0, 2.0, 0.0, x))
    got = sorted((e.rank, e.kind, e.start, e.end) for e in sim.events)
    assert got == [(0, "B", 4 + 2 * x, 6 + 2 * x), (0, "F", 0.0, 1.0), (1, "B", 2 + x, 4 + x), (1, "F", 1 + x, 2 + x)]
    assert sim.makespan == 6 + 2 * x


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 12])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 17])
@pytest.mark.parametrize("f, b, w", [(1.0, 2.0, 0.0), (1.0, 3.0, 0.5), (2.0, 1.0, 0.0)])
def test_lockstep_transfers_match_a_simulation_of_trainschedule(p, m, f, b, w):
    x = 1e-3
    free, timed = (simulate_lockstep(p, m, Costs(f, b, w, c)) for c in (0.0, x))
    # Free transfers: the lockstep schedule is 1F1B (same fill, drain and steady state), rank by rank in 1F1B's order.
    assert free.makespan == pytest.approx(pipeline_makespan("1f1b", p, m, 1, f, b, w))
    assert (timed.makespan - free.makespan) / x == pytest.approx(lockstep_transfers(p, m))
    ours = build("1f1b", p, m, 1)
    for r in range(p):
        order = [(e.kind, e.microbatch) for e in sorted(timed.events, key=lambda e: e.start) if e.rank == r]
        assert order == [(a.kind, a.microbatch) for a in ours.ranks[r]]


def test_report_timeline_draws_deepspeeds_lockstep_span():
    # The report's timeline of a DeepSpeed pipeline is the lockstep schedule, so it ends where the step time's
    # pipeline terms do (the compute, the bubble and the 4m + 2p - 8 exposed transfers), not at plain 1F1B's. It runs
    # each stage at its own cost, which the closed form bounds from above (closed_forms.uneven_makespan).
    from shardwise.planner.estimate import estimate
    from shardwise.report.data import timeline

    lay = Layout(dp=8, tp=8, pp=35, micro_batch=1, zero=1, recompute="full")
    job = make_job(MTNLG, A100, 1920, 2048, "deepspeed", flash_attention=False)
    est = estimate(job, lay)
    t = est.time_s
    span = sum(t[k] for k in ("compute", "recompute", "tp_comm", "pp_p2p", "pipeline_bubble"))
    drawn = timeline(job, est)
    assert drawn["lockstep"] and span * 0.99 <= drawn["makespan_s"] <= span * (1 + 1e-6)
    per_stage = [drawn["duration_s"][k] for k in ("F", "B")]
    plain = simulate(build("1f1b", 35, 240, 1), Costs(per_stage[0], per_stage[1], 0.0, drawn["costs_s"]["transfer"]))
    assert plain.makespan < drawn["makespan_s"]


def test_deepspeed_pipeline_exposes_two_more_transfers_per_microbatch_than_megatron():
    # MT-NLG's layout (dp 8, tp 8, pp 35, micro-batch 1, batch 1920: m = 240). TrainSchedule carries
    # 4m + 2p - 8 = 1022 transfers; Megatron's 1F1B 2(p - 1 + m - 2 - (m - 2) // p) = 2(34 + 238 - 6) = 532.
    lay = Layout(dp=8, tp=8, pp=35, micro_batch=1, zero=1, recompute="full")
    ds, mg = (make_job(MTNLG, A100, 1920, 2048, fw, flash_attention=False) for fw in ("deepspeed", "megatron-2021"))
    c_ds, c_mg = pipeline_costs(ds, lay)[1], pipeline_costs(mg, lay)[1]
    # Each DeepSpeed transfer is two messages (the partition's meta, then its data): one latency more.
    assert c_ds > c_mg
    assert step_time(ds, lay)["pp_p2p"] == pytest.approx(1022 * c_ds)
    assert step_time(mg, lay)["pp_p2p"] == pytest.approx(532 * c_mg)


def test_partitioned_activations_are_gathered_again_after_every_transfer():
    # DeepSpeed (engine.py): the forward rebuilds its input, the backward its output and the received gradient,
    # each PartitionedTensor.full(): zeros (write the activation), copy of the local part, all_gather, clone (read
    # and write): 3 activation-sized passes beside the all-gather. Megatron 2021: gather_split_1d_tensor after each
    # receive, its list all-gather copying the result out (2 passes). MT-NLG: act = 2048 x 20480 x 2 B.
    act = 2048 * 20480 * 2
    ag = collective_time(A100, "all_gather", act, 8)
    lay = Layout(dp=8, tp=8, pp=35, micro_batch=1, zero=1, recompute="full")
    ds = make_job(MTNLG, A100, 1920, 2048, "deepspeed", flash_attention=False)
    full = ag + 3 * act / kernels.hbm_rate(A100)
    assert pipe_regather_time(ds, lay, 17, 2048) == pytest.approx((full, 2 * full))
    assert pipe_regather_time(ds, lay, 0, 2048) == pytest.approx((0.0, 2 * full))  # nothing comes in forward
    assert pipe_regather_time(ds, lay, 34, 2048) == pytest.approx((full, 0.0))  # the loss starts its backward
    # Megatron's interleaved schedule (v = 3): rank 0 receives the input of its 2nd and 3rd chunks, and a gradient
    # for all 3; the last rank the input of all 3 and a gradient for 2.
    mg = make_job(MTNLG, A100, 1920, 2048, "megatron-2021", flash_attention=False)
    v3 = Layout(dp=1, tp=8, pp=35, vpp=3, micro_batch=1, recompute="full", schedule="interleaved-1f1b")
    gather = ag + 2 * act / kernels.hbm_rate(A100)
    assert pipe_regather_time(mg, v3, 0, 2048) == pytest.approx((2 * gather, 3 * gather))
    assert pipe_regather_time(mg, v3, 34, 2048) == pytest.approx((3 * gather, 2 * gather))
    # Sequence parallelism sends the sequence-sharded tensor as it is; without TP nothing was split.
    assert pipe_regather_time(mg, v3.with_(sequence_parallel=True), 5, 2048) == (0.0, 0.0)
    assert pipe_regather_time(ds, lay.with_(tp=1, dp=64), 17, 2048) == (0.0, 0.0)


def test_megatron_deepspeed_runs_a_glu_as_eager_ops_after_the_bias():
    # GLM-130B's layer (hidden 12288, GeGLU FFN 32768, TP 4): FC1's output is 2 x 8192 per token and rank.
    # Megatron-DeepSpeed: bias add over both halves (read 2f + write 2f), GeLU on one (read f, write f), the
    # product (read 2f, write f): 9 elements of 2 B = 18 B per f; a fused kernel 3 elements = 6 B. Forward and a
    # backward twice as long: 3 x 12 B x f/tp per token more.
    glm = ModelSpec(name="glm", family="llama", hidden=12288, ffn_hidden=32768, num_layers=70, num_heads=96,
                    num_kv_heads=96, vocab_size=150528, head_dim=128, max_positions=2048, mlp="geglu")
    tokens, f_tp = 2048, 32768 // 4
    fused = kernels.elementwise_time(A100, tokens, 12288, 32768, 12288, 12288, 4, False, True, True, 2)
    eager = kernels.elementwise_time(A100, tokens, 12288, 32768, 12288, 12288, 4, False, True, True, 2,
                                     glu_bytes=18)
    extra = tokens * 12 * f_tp / kernels.hbm_rate(A100)
    assert eager[0] - fused[0] == pytest.approx(extra)
    assert eager[1] - fused[1] == pytest.approx(2 * extra)
    lay = Layout(dp=24, tp=4, pp=8, micro_batch=1, zero=1, recompute="full")
    ds = step_time(make_job(glm, A100, 4224, 2048, "deepspeed", flash_attention=False), lay)
    assert sum(ds.values()) > sum(step_time(make_job(glm, A100, 4224, 2048, "megatron-2021",
                                                     flash_attention=False), lay).values())


def test_simulate_under_a_lockstep_stack_runs_its_lockstep_schedule(capsys):
    """`simulate --framework deepspeed` draws 1F1B as DeepSpeed's engine runs it, as plan and report time it: 39.4 ms
    at p 4, m 8, F=B=W=1, transfers of 0.2, where 1F1B with its transfers overlapped takes 36.2 (it had printed the
    latter for the stack its help says it models). The closed forms of a pipeline too large to simulate agree."""
    from shardwise.cli import main

    argv = ["simulate", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--comm", "0.2", "--json"]
    assert main(argv + ["--framework", "deepspeed"]) == 0
    ds = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    expected = simulate_lockstep(4, 8, Costs(1.0, 1.0, 1.0, 0.2)).makespan
    assert ds["lockstep"] and ds["makespan"] == pytest.approx(expected) and expected > plain["makespan"] * 1.08
    assert not plain["lockstep"]
    big = ["simulate", "--schedule", "1f1b", "--pp", "8", "--microbatches", "4000", "--comm", "0.2", "--json",
           "--framework", "deepspeed"]
    assert main(big) == 0
    form = json.loads(capsys.readouterr().out)
    assert form["method"] == "closed form" and form["lockstep"]
    assert form["makespan"] == pytest.approx(pipeline_makespan("1f1b", 8, 4000, 1, 1, 1, 1, 0) + lockstep_transfers(8, 4000) * 0.2)
