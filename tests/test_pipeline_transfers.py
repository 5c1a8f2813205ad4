"""Which pipeline transfer a step waits for: the pair of neighbouring stages it is charged at, charged whole also
where the stack sends it behind compute (planner/step_time.py pipeline_costs)."""
import pytest

from shardwise.planner.comm import collective_time
from shardwise.planner.job import make_job
from shardwise.planner.step_time import pipeline_costs
from shardwise.specs import Layout, ModelSpec, load_cluster

A100 = load_cluster("dgx-a100-80gb")  # 8 GPUs a node
# Zero Bubble PP's 14.6B model (Qi et al. 2023, Table 3): 46 layers, 40 heads, hidden 5120, sequence 1024.
ZB_14B = ModelSpec(name="zb-14.6b", family="gpt2", hidden=5120, ffn_hidden=20480, num_layers=46, num_heads=40,
                   num_kv_heads=40, vocab_size=32000, head_dim=128, max_positions=1024, tie_embeddings=False)
# One micro-batch's activation between stages, by hand: 1 sequence x 1024 tokens x 5120 x 2 bytes (dp 1, tp 1).
ACT = 1024 * 5120 * 2


def _transfer(framework: str, pp: int) -> float:
    job = make_job(ZB_14B, A100, 48, 1024, framework)
    return pipeline_costs(job, Layout(dp=1, tp=1, pp=pp, micro_batch=1))[1]


def test_a_pipeline_spanning_nodes_waits_for_the_pair_across_them():
    # pp 8 on one node: every neighbouring pair talks over NVLink (ranks 1 apart). pp 16 on two: stages 7 and 8
    # (and the interleaved wrap-around) are on different nodes; 1F1B's steady state waits for that pair's transfer.
    within = collective_time(A100, "send_recv", ACT, 2, 1)
    across = collective_time(A100, "send_recv", ACT, 2, A100.gpus_per_node)
    assert across > 2 * within  # one 200 Gb/s NIC a GPU against NVLink
    assert _transfer("megatron-core", pp=8) == pytest.approx(within)  # 46 layers: megatron-2021 cuts no 8 or 16 stages
    assert _transfer("megatron-core", pp=16) == pytest.approx(across)


def test_a_transfer_posted_behind_compute_still_delays_the_stage_that_waits_for_it():
    # Megatron-Core's interleaved 1F1B with --overlap-p2p-communication posts each receive ahead and waits on it
    # right before the forward that needs it (schedules.py forward_backward_pipelining_with_interleaving at
    # core_v0.11.0: recv_prev_wait_handle.wait()): the sender is never blocked, but the tensor still arrives a
    # transfer after its producer ends. That is the schedule simulator's rule (its sends are asynchronous), and its
    # makespan still carries every transfer a micro-batch makes through the p*v - 1 rank boundaries of the fill and
    # the drain. The planner's Llama 2 70B plan on 2,048 A100s: tp2, pp2, 41 one-layer chunks, 2 micro-batches.
    from shardwise.planner.step_time import step_time
    from shardwise.schedules import build
    from shardwise.schedules.simulate import Costs, simulate
    from shardwise.specs import load_model

    job = make_job(load_model("llama2-70b"), A100, 1024, 4096, "megatron-core")
    lay = Layout(dp=512, tp=2, pp=2, vpp=41, micro_batch=1, zero=2, recompute="none", sequence_parallel=True,
                 schedule="interleaved-1f1b")
    slow, c = pipeline_costs(job, lay)
    # One 2048 x 8192 BF16 activation (SP shards the sequence over tp 2) to the stage 1,024 ranks away, over its NIC.
    assert c == pytest.approx(collective_time(A100, "send_recv", 2048 * 8192 * 2, 2, A100.gpus_per_node))
    sched, cost = build("interleaved-1f1b", 2, 2, 41), dict(f=slow.f, b=slow.b, w=slow.w)
    chain = simulate(sched, Costs(**cost, c=c)).makespan - simulate(sched, Costs(**cost)).makespan
    assert chain == pytest.approx(2 * (2 * 41 - 1) * c, rel=0.02)
    assert step_time(job, lay)["pp_p2p"] == pytest.approx(chain, rel=0.02)


def test_estimate_json_keeps_the_overlap_flag_a_bool_and_names_the_schedules(capsys):
    # The JSON field `assumptions.pipeline_p2p_overlapped` has been a bool since the contract was set; a checker reads
    # it as one (the string "none" would read as true). Which schedules overlap is its own field.
    import json

    from shardwise.cli import main

    for framework, overlapped, schedules in (("megatron-core", True, ["interleaved-1f1b"]),
                                             ("megatron-2021", False, [])):
        assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-a100-80gb", "--gpus", "16", "--global-batch",
                     "32", "--seq-len", "2048", "--micro-batch", "1", "--pp", "2", "--framework", framework,
                     "--json"]) == 0
        notes = json.loads(capsys.readouterr().out)["assumptions"]
        assert notes["pipeline_p2p_overlapped"] is overlapped
        assert notes["pipeline_p2p_overlapped_schedules"] == schedules
