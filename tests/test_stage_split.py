"""One stage split (shardwise.stage_split) for the runtime, the planner and the simulator.

The rule is checked against an independent oracle (a linear-partition dynamic program over contiguous
cuts), and each consumer is checked to cut the model the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.specs import Layout, TrainSpec, load_cluster, load_model
from shardwise.stage_split import distinct_ranks, layer_costs, max_chunks, rank_layers, split_layers, stage_layer_counts


def _oracle_min_max(spec, stages: int, seq: int) -> float:
    """Minimal possible cost of the costliest stage over every contiguous cut (O(S L^2) DP)."""
    L = spec.num_layers
    layer, embed, head = layer_costs(spec, seq)

    def cost(a, b, s):
        return (b - a) * layer + (embed if s == 0 else 0.0) + (head if s == stages - 1 else 0.0)

    inf = float("inf")
    best = [[inf] * (L + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, L + 1):
            best[s][i] = min(max(best[s - 1][j], cost(j, i, s - 1)) for j in range(s - 1, i))
    return best[stages][L]


specs = st.builds(
    lambda layers, hidden, vocab: dataclasses.replace(load_model("tiny"), num_layers=layers, hidden=hidden,
                                                      vocab_size=vocab, ffn_hidden=2 * hidden, head_dim=hidden // 4),
    st.integers(1, 24), st.sampled_from([32, 64, 256, 1024]), st.sampled_from([256, 4096, 50257, 128256]))


@settings(max_examples=150, deadline=None)
@given(specs, st.data(), st.sampled_from([64, 2048]))
def test_split_minimises_the_costliest_stage_and_is_contiguous(spec, data, seq):
    stages = data.draw(st.integers(1, spec.num_layers))
    cut = split_layers(spec, stages, seq)
    assert [i for s in cut for i in s] == list(range(spec.num_layers)) and all(cut)
    layer, embed, head = layer_costs(spec, seq)
    costs = [len(s) * layer + (embed if i == 0 else 0) + (head if i == stages - 1 else 0) for i, s in enumerate(cut)]
    assert max(costs) == pytest.approx(_oracle_min_max(spec, stages, seq), rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 64), st.data())
def test_with_negligible_edge_costs_it_is_the_even_split_extras_late(layers, data):
    spec = dataclasses.replace(load_model("tiny"), num_layers=layers, vocab_size=1, hidden=1 << 12)
    stages = data.draw(st.integers(1, layers))
    counts = stage_layer_counts(spec, stages, 64)
    assert max(counts) - min(counts) <= 1
    assert list(counts[1:-1]) == sorted(counts[1:-1])  # between the edges, extra layers on the later stages


def test_a_heavy_head_takes_layers_off_the_last_stage():
    # Llama 3.1 405B on 16 stages: 7 layers beside the embedding and the head, 8 elsewhere (what Meta ran).
    assert stage_layer_counts(load_model("llama3.1-405b"), 16, 4096) == (7,) + (8,) * 14 + (7,)
    gpt2 = stage_layer_counts(load_model("gpt2"), 4, 2048)  # its head costs ~3.7 layers
    assert gpt2[-1] < min(gpt2[:-1])


def test_distinct_ranks_cover_every_kind_of_rank():
    spec = load_model("llama3.1-405b")
    ranks = distinct_ranks(spec, 16, 1, 4096)
    assert ranks == [0, 1, 15]
    kinds = {(r == 0, r == 15, rank_layers(spec, 16, 1, r, 4096)) for r in range(16)}
    assert kinds == {(r == 0, r == 15, rank_layers(spec, 16, 1, r, 4096)) for r in ranks}


def test_a_rank_holding_dense_layers_of_a_mixture_of_experts_is_a_kind_of_its_own():
    # DeepSeek-V3's first three layers are dense; at pp 16 x vpp 2 rank 2's first chunk holds one of them, its
    # chunk sizes equal to the ranks after it. It costs less and holds fewer parameters, so it is not their stand-in.
    from shardwise.stage_split import rank_kind_counts, rank_kinds

    spec = load_model("deepseek-v3")
    kinds = rank_kinds(spec, 16, 2, 4096)
    counts = stage_layer_counts(spec, 32, 4096)
    assert counts[2::16] == counts[3::16] and kinds[2] == 2 and kinds[3] == 3
    assert distinct_ranks(spec, 16, 2, 4096) == [0, 1, 2, 3, 15]
    assert dict(rank_kind_counts(spec, 16, 2, 4096)) == {0: 1, 1: 1, 2: 1, 3: 12, 15: 1}


@pytest.mark.parametrize("model,pp,vpp,seq", [("gpt2", 4, 1, 1024), ("gpt2", 4, 3, 1024), ("llama3-8b", 8, 2, 2048),
                                              ("tiny", 2, 2, 64), ("llama3.1-405b", 16, 1, 4096)])
def test_runtime_planner_and_simulator_cut_alike(model, pp, vpp, seq):
    """The runtime builds the layers the planner counts for it (the shardwise profile), and the simulator's
    per-stage costs follow them."""
    from shardwise.parallel.pipeline_step import build_stage_chunks
    from shardwise.planner.job import Job
    from shardwise.planner.memory import rank_layers as planner_layers
    from shardwise.schedules import model_costs

    spec = load_model(model)
    job = Job(spec, load_cluster("dgx-h100-80gb"), TrainSpec(pp * 4, seq), framework="shardwise")
    layout = Layout(pp=pp, vpp=vpp, schedule="interleaved-1f1b" if vpp > 1 else "1f1b")
    counts = stage_layer_counts(spec, pp * vpp, seq)
    for r in range(pp):
        assert planner_layers(job, layout, r) == sum(counts[r::pp])
    if spec.num_params() < 1e9:  # the runtime builds real modules: small models only
        for r in range(pp):
            chunks = build_stage_chunks(spec, pp, vpp, r, seed=0, seq_len=seq, device="meta")
            assert [len(c.layers) for c in chunks] == list(counts[r::pp])
    f = model_costs(spec, pp, vpp, seq, f=2.0).f  # per virtual stage, an average one costing 2 / vpp
    layer, embed, head = layer_costs(spec, seq)
    flops = [n * layer + (embed if s == 0 else 0) + (head if s == pp * vpp - 1 else 0) for s, n in enumerate(counts)]
    assert f == pytest.approx([2.0 / vpp * x / (sum(flops) / len(flops)) for x in flops])


def test_an_mla_layers_attention_cost_is_its_core_width():
    # DeepSeek-V3 (128 heads; Q·Kᵀ over qk_nope 128 + qk_rope 64 = 192, P·V over v_head_dim 128): the attention
    # core's forward FLOPs per token grow with the sequence by 2·192 + 2·128 per head, 4·s·160·128 in all, the width
    # MFU counts too (ModelSpec.attention_width), not q_dim's 192 for both products. From 4,096 to 8,192 tokens:
    # 4 · 4,096 · 20,480 = 335,544,320 FLOPs per token and layer; the parameter FLOPs do not change.
    spec = load_model("deepseek-v3")
    assert layer_costs(spec, 8192)[0] - layer_costs(spec, 4096)[0] == 335_544_320


# --------------------------------------------------------------------------- a chunk for the embedding, one for the loss


@pytest.mark.parametrize("model,seq,chunks", [("llama3.1-405b", 8192, (16, 32, 64, 128)), ("deepseek-v3", 4096, (21, 63)),
                                              ("llama2-70b", 4096, (41, 82))])
def test_counting_the_embedding_and_the_loss_as_a_layer_is_megatrons_uneven_split(model, seq, chunks):
    """Megatron-Core's --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split (core_v0.11.0,
    transformer_block.py get_num_layers_to_build): L + 2 slots, (L + 2) / S per chunk, the first and the last chunk one
    layer fewer. Llama 3.1 405B: 128 slots, so 16 stages of 8 (7 at the edges) ... 128 of 1 (0 at the edges: the
    Llama 3 paper's "the first model chunk on the first stage has only the embedding, and the last model chunk on
    the last stage has only output projection and loss calculation"); DeepSeek-V3's 61 layers: 63 slots, 21 chunks
    of 3 (2 at the edges); Llama 2 70B's 80: 82 slots, 41 chunks of 2 (1 at the edges)."""
    spec = load_model(model)
    for S in chunks:
        k = (spec.num_layers + 2) // S
        assert stage_layer_counts(spec, S, seq) == (k - 1,) + (k,) * (S - 2) + (k - 1,)


def test_llama3_ranks_hold_seven_or_eight_layers_on_sixteen_by_eight_chunks():
    # rank 0: the embedding-only chunk + 7 one-layer chunks; rank 15: 7 one-layer chunks + the loss-only chunk.
    spec = load_model("llama3.1-405b")
    assert [rank_layers(spec, 16, 8, r, 8192) for r in range(16)] == [7] + [8] * 14 + [7]
    assert distinct_ranks(spec, 16, 8, 8192) == [0, 1, 15]


def test_more_chunks_than_layers_only_where_the_stack_cuts_a_chunk_for_the_embedding_or_the_loss():
    from shardwise.errors import UsageError
    from shardwise.specs import validate_layout

    spec = load_model("llama3.1-405b")  # 126 layers
    assert max_chunks(126, False) == 126 and max_chunks(126, True) == 128
    lay = Layout(dp=64, tp=8, pp=16, vpp=8, schedule="interleaved-1f1b")
    validate_layout(lay, spec, 2048, edge_chunks=True)
    with pytest.raises(UsageError, match="128 model chunks exceed the 126 layers of"):
        validate_layout(lay, spec, 2048)  # shardwise's runtime builds a layer in every chunk
    with pytest.raises(UsageError, match="144 model chunks exceed the 126 layers plus a chunk for the embedding"):
        validate_layout(lay.with_(vpp=9), spec, 2048, edge_chunks=True)


def test_megatron_cuts_evenly_or_gives_the_embedding_and_the_loss_a_layers_slot():
    # Zero Bubble PP (Qi et al. 2023, Sec. 5.1, on Megatron-LM): "both the initial and final pipeline stages possess
    # one fewer transformer layer" — its 1.5B model, 22 layers on 8 stages: 2, 3 x 6, 2 ((22 + 2) / 8 = 3 slots a
    # stage). The cost-balanced cut of the same model (hidden 2304, vocabulary 51,200: the LM head costs 1.7 layers)
    # takes layers off the last stage instead. A split S divides: L / S each (Megatron's get_num_layers_to_build),
    # whatever the head costs (Llama 3 70B on 20 chunks: 4 each, where balancing would take one off the last).
    zb = dataclasses.replace(load_model("gpt2"), num_layers=22, hidden=2304, num_heads=24, num_kv_heads=24,
                             head_dim=96, ffn_hidden=4 * 2304, vocab_size=51200)
    assert stage_layer_counts(zb, 8, 1024, "megatron") == (2, 3, 3, 3, 3, 3, 3, 2)
    assert stage_layer_counts(zb, 8, 1024) != (2, 3, 3, 3, 3, 3, 3, 2)
    llama = load_model("llama3-70b")
    assert stage_layer_counts(llama, 20, 8192, "megatron") == (4,) * 20
    assert stage_layer_counts(llama, 20, 8192)[-1] < 4


def test_a_megatron_profile_estimates_megatrons_cut_and_shardwise_its_own():
    from shardwise.planner.job import Job
    from shardwise.planner.memory import rank_layers as planner_layers

    zb = dataclasses.replace(load_model("gpt2"), num_layers=22, hidden=2304, num_heads=24, num_kv_heads=24,
                             head_dim=96, ffn_hidden=4 * 2304, vocab_size=51200)
    layout = Layout(pp=8)
    for framework, last in (("megatron-core", 2), ("nemo", 2), ("shardwise", None)):
        job = Job(zb, load_cluster("dgx-a100-80gb"), TrainSpec(48, 1024), framework=framework)
        want = stage_layer_counts(zb, 8, 1024)[-1] if last is None else last
        assert planner_layers(job, layout, 7) == want, framework


def test_megatron_2021_runs_only_a_pipeline_that_cuts_the_layers_evenly():
    # Megatron-LM's ParallelTransformer of 2021 (megatron/model/transformer.py) builds num_layers // pp layers a stage,
    # asserting 'num_layers must be divisible by pipeline_model_parallel_size', and // vpp of those a chunk: Zero
    # Bubble's 22 layers on 8 stages (which megatron-core cuts 2, 3 x 6, 2) or 32 layers on 4 x 3 chunks cannot run
    # there; 32 on 4 x 2 chunks (4 layers each) can. One line, exit 2, naming the cut; the search skips such pipelines.
    from shardwise.cli import main
    from shardwise.planner.job import make_job
    from shardwise.planner.search import SearchSpace, search

    def estimate(*extra):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-a100-80gb", "--gpus", "24",
                         "--global-batch", "48", "--seq-len", "4096", "--micro-batch", "1", "--framework",
                         "megatron-2021", *extra])
        return code, err.getvalue()

    for extra, chunks in ((["--pp", "3"], 3), (["--pp", "4", "--schedule", "interleaved-1f1b", "--vpp", "3"], 12)):
        code, err = estimate(*extra)
        assert code == 2 and err.count("\n") == 1 and f"pp*vpp = {chunks} does not divide" in err, err
    assert estimate("--pp", "4", "--schedule", "interleaved-1f1b", "--vpp", "2") == (0, "")

    def ranked(framework):
        job = make_job(load_model("llama3-8b"), load_cluster("dgx-a100-80gb"), 48, 4096, framework)
        return search(job, 24, SearchSpace()).ranked

    assert ranked("megatron-2021") and all(32 % (e.layout.pp * e.layout.vpp) == 0 for e in ranked("megatron-2021"))
    assert any(32 % (e.layout.pp * e.layout.vpp) for e in ranked("megatron-core"))  # it names a layout: pp 3 runs


def test_a_megatron_core_cut_megatron_does_not_build_itself_is_said():
    """Megatron-Core builds L / S layers a chunk, or (L + 2) / S with the embedding and the loss a layer's slot
    (transformer_config.py raises on anything else); another cut runs through --pipeline-model-parallel-layout. estimate
    prices the balanced cut then and says so; where Megatron cuts by itself, or the stack cuts any way (torchtitan),
    nothing is said."""
    from shardwise.cli import main

    def implied(framework, pp, vpp):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["estimate", "--model", "llama2-13b", "--cluster", "dgx-h100-80gb", "--gpus", str(4 * pp),
                         "--global-batch", "128", "--seq-len", "4096", "--tp", "1", "--pp", str(pp), "--vpp", str(vpp),
                         "--micro-batch", "1", "--framework", framework, "--json"]) == 0
        return " ".join(__import__("json").loads(out.getvalue())["assumptions"]["implied"])

    said = implied("nemo", 4, 7)  # 40 layers on 28 chunks
    assert "28 model chunks do not divide the 40 layers" in said and "1 or 2 layers a chunk" in said, said
    assert "--pipeline-model-parallel-layout" in implied("megatron-core", 4, 3)  # 12 chunks: neither 40 nor 42
    # aleph-alpha cuts Megatron's way but has no layout flag to name (helper-231)
    said = implied("aleph-alpha", 9, 1)  # 9 chunks: neither 40 nor 42
    assert "do not divide the 40 layers" in said and "--pipeline-model-parallel-layout" not in said, said
    for framework, pp, vpp in (("nemo", 4, 5), ("megatron-core", 6, 1), ("torchtitan", 4, 7)):  # 40/20; 42/6; any cut
        assert "model chunks do not divide" not in implied(framework, pp, vpp), (framework, pp, vpp)


def test_megatron_2021_interleaves_only_pipelines_deeper_than_two():
    # Megatron-LM's arguments.py and parallel_state of 2021-23 assert 'pipeline-model-parallel size should be greater
    # than 2 with interleaved schedule'; NeMo's later recipes run pp 2 with virtual stages (the published Grok-1 and
    # Qwen3 30B rows: pp 2, vp 8 and 24), so megatron-core keeps it. One line, exit 2; the search skips pp 2 x v.
    from shardwise.cli import main
    from shardwise.planner.job import make_job
    from shardwise.planner.search import SearchSpace, search

    def estimate(framework):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "16",
                         "--global-batch", "64", "--seq-len", "4096", "--micro-batch", "1", "--tp", "2", "--pp", "2",
                         "--vpp", "4", "--framework", framework])
        return code, err.getvalue()

    code, err = estimate("megatron-2021")
    assert code == 2 and err.count("\n") == 1 and "needs pp >= 3" in err, err
    assert estimate("megatron-core") == (0, "")

    def interleaved_pps(framework):
        job = make_job(load_model("llama3-8b"), load_cluster("dgx-h100-80gb"), 64, 4096, framework)
        space = SearchSpace(pp=(2, 4))
        return {e.layout.pp for e in search(job, 16, space).ranked if e.layout.schedule == "interleaved-1f1b"}

    assert interleaved_pps("megatron-2021") == {4}
    assert interleaved_pps("megatron-core") == {2, 4}
    # plan asked for interleaving on pp 2 alone finds nothing there, and says why (it said only "micro-batches a
    # multiple of pp and pp*vpp at most the layers", both true here, and suggested gpipe, which megatron-2021 lacks)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch", "64",
                     "--seq-len", "4096", "--pp", "2", "--schedules", "interleaved-1f1b", "--framework", "megatron-2021"])
    err = err.getvalue()
    assert code == 2 and err.count("\n") == 1, err
    assert "pp of at least 3 on megatron-2021" in err and "dividing the 32 layers" in err and "gpipe" not in err, err


def test_internevo_cuts_no_chunk_without_a_layer_and_vpp_must_divide_the_layers():
    # InternEvo's partition_uniform (internlm/core/parallel/shard.py, 0607da81) asserts num_layers % num_chunks == 0 and
    # raises "Some nodes in Pipeline have no requests" for a stage with no layer: no chunk for the embedding or the
    # loss alone, which megatron-core's split (the profile it derives from) allows. One line, exit 2; plan skips them.
    from shardwise.cli import main
    from shardwise.planner.job import make_job
    from shardwise.planner.search import SearchSpace, search

    def estimate(framework, *layout):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(["estimate", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", "64",
                         "--global-batch", "512", "--seq-len", "2048", "--micro-batch", "1", *layout,
                         "--framework", framework])
        return code, err.getvalue()

    for layout, why in ((("--pp", "4", "--vpp", "3"), "vpp = 3 does not divide them"),
                        (("--pp", "2", "--vpp", "17"), "34 model chunks exceed the 32 layers of llama2-7b")):
        code, err = estimate("internevo", *layout)
        assert code == 2 and err.count("\n") == 1 and why in err, err
    assert estimate("megatron-core", "--pp", "2", "--vpp", "17") == (0, "")
    assert estimate("internevo", "--pp", "4", "--vpp", "2") == (0, "")
    job = make_job(load_model("llama2-7b"), load_cluster("dgx-a100-80gb"), 64, 2048, "internevo")
    space = SearchSpace(tp=(1,), pp=(4,), micro_batch=(1,), schedules=("interleaved-1f1b",))
    vpps = {e.layout.vpp for e in search(job, 16, space).ranked}
    assert vpps == {2, 4, 8}  # of 2..8 (32 layers over 4 ranks), those dividing 32


def test_plan_and_explain_say_when_their_winner_needs_a_named_cut():
    # plan's and explain's winner note carries estimate's sentence (helper-226: pp 4 x 9 chunks of llama3-70b's 80
    # layers won under megatron-core and nothing said that Megatron needs --pipeline-model-parallel-layout for it)
    import argparse

    from shardwise.commands.common import winner_note
    from shardwise.planner.job import make_job
    from shardwise.specs import Layout, load_cluster, load_model

    job = make_job(load_model("llama3-70b"), load_cluster("dgx-h100-80gb"), 512, 8192, "megatron-core")
    args = argparse.Namespace(emit=None)
    uneven = Layout(dp=32, tp=4, pp=4, vpp=9, schedule="interleaved-1f1b", micro_batch=1, sequence_parallel=True)
    assert "--pipeline-model-parallel-layout" in winner_note(args, job, uneven)
    assert "do not divide" not in winner_note(args, job, uneven.with_(vpp=5))  # 20 chunks of 4 layers: Megatron's own


def test_interleaving_named_with_one_chunk_is_what_the_stack_runs():
    """Megatron-Core turns a virtual pipeline of 1 into None (arguments.py) and runs plain 1F1B: estimate prices that
    and says so; torch's ScheduleInterleaved1F1B runs its interleaved code with one chunk (twice 1F1B's warm-up, more
    activations in flight), as torchtitan does, and so does Megatron-LM of 2021."""
    from shardwise.cli import main

    def estimate(framework, schedule, *vpp):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "16",
                         "--global-batch", "64", "--seq-len", "4096", "--tp", "2", "--pp", "4", "--micro-batch", "1",
                         "--recompute", "none", "--schedule", schedule, *vpp, "--framework", framework, "--json"]) == 0
        return __import__("json").loads(out.getvalue())

    one, plain = estimate("megatron-core", "interleaved-1f1b", "--vpp", "1"), estimate("megatron-core", "1f1b")
    assert one["step_time_s"] == plain["step_time_s"] and one["memory_gib_per_gpu"] == plain["memory_gib_per_gpu"]
    assert any("runs as plain 1F1B" in note for note in one["assumptions"]["implied"])
    one, plain = estimate("torchtitan", "interleaved-1f1b", "--vpp", "1"), estimate("torchtitan", "1f1b")
    assert one["memory_breakdown_gib"]["activations"] > plain["memory_breakdown_gib"]["activations"]
    # a stack built on Megatron-Core without interleaving still refuses it (helper-231: it had been let through)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch",
                     "64", "--seq-len", "4096", "--tp", "2", "--pp", "4", "--schedule", "interleaved-1f1b", "--vpp", "1",
                     "--framework", "aleph-alpha"]) == 2
    assert "no interleaved-1f1b pipeline schedule" in err.getvalue()
