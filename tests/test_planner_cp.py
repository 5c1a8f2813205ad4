"""Context parallelism in the planner: cp in estimate and plan (the contract's JSON fields), what splitting the
sequence saves (activations) and costs (K/V traffic, hidden by the attention or not, inside a node or across),
the frameworks that cannot do it, and the published 128K-token Llama 3 405B run (tp 8, cp 16, pp 16, dp 8)."""

from __future__ import annotations

import json

import pytest

from shardwise.cli import main
from shardwise.planner import estimate
from shardwise.planner.job import make_job
from shardwise.planner.search import SearchSpace, search
from shardwise.planner.layer_time import layer_cost
from shardwise.specs import Layout, load_cluster, load_model

H100 = load_cluster("dgx-h100-80gb")
ESTIMATE = ["estimate", "--model", "llama3.1-70b", "--cluster", "dgx-h100-80gb", "--global-batch", "16",
            "--seq-len", "32768", "--micro-batch", "1", "--json"]


def test_estimate_json_carries_cp_and_counts_its_gpus(capsys):
    assert main(ESTIMATE + ["--gpus", "64", "--tp", "8", "--pp", "2", "--cp", "4", "--cp-mode", "allgather",
                            "--sequence-parallel", "--recompute", "full"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["cp"], d["cp_mode"], d["dp"]) == (4, "allgather", 1)  # 64 = dp 1 x tp 8 x pp 2 x cp 4
    assert d["time_breakdown_s"]["cp_comm"] > 0
    assert d["step_time_s"] == pytest.approx(sum(d["time_breakdown_s"].values()), rel=1e-4)


def test_plan_at_128k_splits_the_sequence_and_says_why(capsys):
    assert main(["plan", "--model", "llama3.1-70b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "8",
                 "--seq-len", "131072", "--top", "3", "--json", "--explain"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all("cp" in c and "cp_mode" in c for c in out["candidates"])
    best = out["best"]
    assert best["cp"] > 1 and best["dp"] * best["tp"] * best["pp"] * best["cp"] == 64
    why = next(p for p in out["explanation"] if p.startswith("CP = "))
    assert "it does not fit" in why and "K/V" in why and "chunks i and 2·cp−1−i" in why


def _job(seq=131072, batch=8, framework="megatron-core"):
    return make_job(load_model("llama3.1-70b"), H100, batch, seq, framework)


def test_splitting_the_sequence_divides_the_activations():
    job = _job()
    base = Layout(dp=1, tp=8, pp=4, micro_batch=1, sequence_parallel=True, zero=1, recompute="full")
    # the saved activations divide by cp; beside them, the running layer's K/V buffers (memory.cp_buffer_bytes)
    from shardwise.planner.memory import cp_buffer_bytes

    act = {cp: estimate(job, base.with_(cp=cp)).memory_bytes["activations"] - cp_buffer_bytes(job, base.with_(cp=cp))
           for cp in (1, 2, 4)}
    assert act[2] == pytest.approx(act[1] / 2, rel=1e-9) and act[4] == pytest.approx(act[1] / 4, rel=1e-9)


def test_ring_hides_its_hops_behind_the_attention_until_the_sequence_gets_short():
    """A hop carries the tokens per rank, the block it hides behind grows with their square: at 128K the ring is
    hidden inside a node; the same cp on a 1K sequence exposes it; all-gather is always in the open."""
    lay = Layout(dp=1, tp=2, pp=1, micro_batch=1, sequence_parallel=True, cp=4)  # cp x tp = 8: one node
    long, short = layer_cost(_job(131072), lay), layer_cost(_job(1024), lay)
    assert long.cp_fwd < 0.01 * long.attn_fwd  # hidden (what remains is latency-sized)
    assert short.cp_fwd > 0 and short.cp_fwd / short.attn_fwd > 10 * long.cp_fwd / long.attn_fwd
    gathered = layer_cost(_job(131072), lay.with_(cp_mode="allgather"))
    assert gathered.cp_fwd > long.cp_fwd


def test_a_ring_that_leaves_the_node_moves_at_the_networks_pace():
    inside = Layout(dp=1, tp=2, micro_batch=1, sequence_parallel=True, cp=4)  # cp x tp = 8 = a node
    across = inside.with_(tp=4)  # cp x tp = 16: some hop crosses nodes
    job = _job(16384)
    exposed = {name: (lambda c: c.cp_fwd + c.cp_bwd)(layer_cost(job, lay)) for name, lay in (("in", inside), ("out", across))}
    assert exposed["out"] > 2 * exposed["in"] > 0  # at least the last dK/dV hop home is in the open


@pytest.mark.parametrize("argv, expected", [
    (["--gpus", "64", "--tp", "8", "--cp", "3"], "does not divide 64 GPUs"),
    (["--gpus", "48", "--tp", "8", "--cp", "3", "--seq-len", "32768"], "not divisible by 6"),
    (["--gpus", "16", "--tp", "8", "--cp", "2", "--framework", "deepspeed"], "deepspeed has no ring context parallelism"),
    (["--gpus", "16", "--tp", "8", "--cp", "2", "--framework", "llama3", "--cp-mode", "ring"],
     "llama3 has no ring context parallelism"),
    # Megatron-Core's context parallelism lives in Transformer Engine's attention (its own asserts cp == 1)
    (["--gpus", "16", "--tp", "8", "--cp", "2", "--no-flash-attention", "--framework", "megatron-core"],
     "only in its fused attention kernel"),
    (["--gpus", "16", "--tp", "8", "--cp", "2", "--no-flash-attention", "--framework", "nemo"], "drop --no-flash-attention"),
])
def test_bad_cp_input_is_one_line_exit_2(argv, expected, capsys):
    args = [a for a in ESTIMATE if a not in ("--seq-len", "32768")] + (["--seq-len", "32768"] if "--seq-len" not in argv else [])
    assert main(args + argv) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err


# Llama 3 405B's long-context stage (Llama Team 2024, Table 4): 16,384 H100s, tp 8, cp 16, pp 16, dp 8, 128K-token
# sequences, 16M tokens per batch (128 sequences), 380 TFLOP/s per GPU = 38 % BF16 MFU. Scored under the `llama3`
# framework profile (the stack the paper describes: FSDP with ZeRO-2 semantics, all-gather CP, FlashAttention-2).
LLAMA3_MFU = 0.38


def test_llama3_405b_128k_published_layout_fits_and_matches_its_mfu():
    job = make_job(load_model("llama3.1-405b"), H100, 128, 131072, "llama3")
    published = search(job, 16384, SearchSpace(tp=(8,), pp=(16,), cp=(16,))).ranked
    assert published, "the published split must fit"
    pub = next(e for e in published if e.layout.dp == 8)
    assert pub.fits and abs(pub.mfu / LLAMA3_MFU - 1) <= 0.15, (pub.layout, pub.mfu)
    best = search(job, 16384).ranked[0]
    assert pub.step_time / best.step_time - 1 <= 0.15, (best.layout, best.step_time, pub.step_time)


def test_an_unnamed_cp_mode_is_the_one_the_framework_runs(capsys):
    """Named, a mode the stack lacks is refused (above); unnamed, the stack's own mode is used and said."""
    args = [a for a in ESTIMATE if a not in ("--seq-len", "32768")] + ["--seq-len", "32768"]
    assert main(args + ["--gpus", "16", "--tp", "8", "--cp", "2", "--framework", "llama3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cp_mode"] == "allgather"
    assert any("allgather context parallelism" in why for why in data["assumptions"]["implied"])
    assert main(args + ["--gpus", "16", "--tp", "8", "--cp", "2", "--json"]) == 0  # megatron-core runs ring
    assert json.loads(capsys.readouterr().out)["cp_mode"] == "ring"


def test_unnamed_zero_and_recompute_are_the_fastest_pair_that_fits(capsys):
    """Llama 3 405B's 128K split with neither --zero nor --recompute: every stage from the stack's default up and
    every recompute policy, named one by one, is slower or does not fit than what estimate picks by itself."""
    argv = ["estimate", "--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--gpus", "16384", "--global-batch",
            "128", "--seq-len", "131072", "--tp", "8", "--cp", "16", "--pp", "16", "--vpp", "7", "--micro-batch", "1",
            "--sequence-parallel", "--framework", "llama3", "--json"]
    assert main(argv) == 0
    picked = json.loads(capsys.readouterr().out)
    assert picked["fits"]
    for zero in (0, 1, 2, 3):
        for recompute in ("none", "selective", "full"):
            if main(argv + ["--zero", str(zero), "--recompute", recompute]) != 0:
                capsys.readouterr()
                continue
            other = json.loads(capsys.readouterr().out)
            assert not other["fits"] or other["step_time_s"] >= picked["step_time_s"], (zero, recompute)


def test_plan_without_fused_attention_never_splits_the_sequence_where_the_stack_cannot():
    """Megatron-Core under --no-flash-attention (its unfused DotProductAttention): no cp > 1 in the search, and --cp 2
    is one line naming why; the stack's fused attention searches it as usual."""
    job = make_job(load_model("llama3.1-8b"), H100, 16, 32768, "megatron-core", flash_attention=False)
    assert {e.layout.cp for e in search(job, 64).ranked} == {1}
    assert max(e.layout.cp for e in search(make_job(load_model("llama3.1-8b"), H100, 16, 32768, "megatron-core"), 64).ranked) > 1
    argv = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch", "16",
            "--seq-len", "8192", "--tp", "8", "--cp", "2", "--no-flash-attention", "--framework", "megatron-core"]
    assert main(argv) == 2


@pytest.mark.parametrize("framework", ["composer", "lit-gpt", "flash-attn"])
def test_a_data_parallel_only_stack_with_more_gpus_than_sequences_is_told_so(framework, capsys):
    """A stack without TP or PP takes one sequence per GPU at least: the message names the global batch, not a
    pipeline schedule it does not have."""
    assert main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "32",
                 "--seq-len", "8192", "--framework", framework, "--schedules", "1f1b"]) == 2
    err = capsys.readouterr().err.strip()
    assert "global batch 32 is not divisible" in err and "schedule" not in err and "\n" not in err


def test_all_gather_cp_beyond_the_timed_ranks_matches_every_rank_timed():
    # Past kernels.CP_RANKS_TIMED ranks the all-gather scheme times that many evenly spaced ranks (both ends among them)
    # instead of each: the slowest of them is the slowest of all, to a part in a thousand, at 128 and 1,024 ranks.
    from shardwise.planner import kernels
    from shardwise.specs import load_cluster
    cluster = load_cluster("dgx-h100-80gb")
    for cp in (128, 1024):
        sampled = kernels.cp_attention_time(cluster, "fa2", 1, 8192 * cp, cp, "chunks", 8, 128)
        old, kernels.CP_RANKS_TIMED = kernels.CP_RANKS_TIMED, cp
        try:
            every = kernels.cp_attention_time(cluster, "fa2", 1, 8192 * cp, cp, "chunks", 8, 128)
        finally:
            kernels.CP_RANKS_TIMED = old
        assert all(abs(a / b - 1) < 1e-3 for a, b in zip(sampled, every)), (cp, sampled, every)


def test_estimate_without_a_cp_mode_says_it_took_the_stacks_default():
    """A context-parallel layout named without --cp-mode runs ring (the command line's default; Megatron-Core's
    --cp-comm-type p2p), and the output says so and that plan weighs both; named, the mode is kept."""
    import contextlib
    import io

    def answer(*argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main([str(a) for a in argv]) == 0
        return json.loads(out.getvalue())

    common = ["--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", 16, "--global-batch", 16, "--seq-len",
              32768, "--framework", "megatron-core", "--tp", 1, "--pp", 1, "--cp", 4, "--json"]
    est = answer("estimate", *common)
    assert est["cp_mode"] == "ring"
    assert any(i.startswith("ring context parallelism (--cp-mode not given: megatron-core runs")
               and "plan weighs both" in i for i in est["assumptions"]["implied"])
    gathered = answer("estimate", *common, "--cp-mode", "allgather")
    assert gathered["cp_mode"] == "allgather"
    assert not any("context parallelism (--cp-mode not given" in i for i in gathered["assumptions"]["implied"])
