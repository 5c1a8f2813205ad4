"""The planner on mixtures of experts: the contract (estimate --ep --json, plan --json layouts with ep, Mixtral-key
config files), what splitting the experts buys and costs, FLOPs by active parameters."""

from __future__ import annotations

import dataclasses
import json

import pytest

from shardwise.cli import main
from shardwise.planner import estimate
from shardwise.planner.job import make_job
from shardwise.planner.memory import rank_expert_params, rank_params
from shardwise.planner.moe import all_to_all_time
from shardwise.planner.step_time import attention_flops_per_step, model_flops_per_step
from shardwise.specs import Layout, load_cluster, load_model

H100 = load_cluster("dgx-h100-80gb")
JOB = ["--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "256", "--seq-len", "4096"]


def _mixtral_file(tmp_path) -> str:
    cfg = {k: v for k, v in load_model("mixtral-8x7b").to_hf_config().items()
           if k not in ("mlp_only_layers", "decoder_sparse_step", "scoring_func", "routed_scaling_factor")}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_estimate_json_carries_ep_and_parameter_counts(tmp_path, capsys):
    path = _mixtral_file(tmp_path)
    assert main(["estimate", "--model", path, *JOB, "--pp", "4", "--micro-batch", "1", "--ep", "8", "--zero", "1",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    spec = load_model("mixtral-8x7b")
    assert out["ep"] == 8 and out["etp"] == 1
    assert out["total_params"] == spec.num_params() == 46_702_792_704
    assert out["active_params"] == spec.active_params() and out["active_params"] < out["total_params"] / 3
    assert out["time_breakdown_s"]["ep_comm"] > 0
    assert "active parameters" in out["assumptions"]["mfu_convention"]
    # the two constants taken from published MoE runs are stated with the prediction (planner/moe.py)
    assert out["assumptions"]["moe_layer_fixed_cost_s"] > 0 and out["assumptions"]["moe_layer_host_time_s"] > 0


def test_plan_json_layouts_carry_ep_and_the_search_tries_them(tmp_path, capsys):
    assert main(["plan", "--model", _mixtral_file(tmp_path), *JOB, "--pp", "1,2", "--tp", "1,2", "--micro-batch", "1",
                 "--json", "--top", "50"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all("ep" in c for c in [out["best"]] + out["candidates"])
    assert len({c["ep"] for c in out["candidates"]}) >= 3  # each dp x tp x pp x ep split: ep is searched
    assert out["best"]["ep"] > 1  # at pp <= 2 the experts' states must be split over ep to fit 80 GB


def test_train_reads_ep_from_a_plan_file(tmp_path, capsys):
    from shardwise.commands.train import read_plan

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"best": {"dp": 4, "tp": 1, "pp": 1, "ep": 4, "etp": 1}}))
    assert read_plan(str(plan))["ep"] == 4


@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_expert_parameters_divide_by_ep_and_the_rest_does_not(ep):
    job = make_job(load_model("mixtral-8x7b"), H100, 256, 4096)
    base, split = Layout(dp=16, pp=4, micro_batch=1), Layout(dp=16, pp=4, micro_batch=1, ep=ep)
    assert rank_expert_params(job, split, 0) * ep == pytest.approx(rank_expert_params(job, base, 0))
    dense = rank_params(job, base, 0) - rank_expert_params(job, base, 0)
    assert rank_params(job, split, 0) - rank_expert_params(job, split, 0) == pytest.approx(dense)


def test_flops_count_active_parameters_only():
    """Twice the experts at the same top-k: the same FLOPs but the router's (MFU by active parameters), twice the
    expert memory."""
    spec = load_model("mixtral-8x7b")
    wide = dataclasses.replace(spec, num_experts=16)
    a, b = (make_job(m, H100, 256, 4096) for m in (spec, wide))
    router = 6 * spec.num_layers * 8 * spec.hidden * 256 * 4096  # 8 more router rows per layer, 6 FLOPs each per token
    assert model_flops_per_step(b) - model_flops_per_step(a) == pytest.approx(router)
    lay = Layout(dp=16, pp=4, micro_batch=1, ep=8, zero=1)
    assert rank_expert_params(b, lay, 0) == pytest.approx(2 * rank_expert_params(a, lay, 0))
    dense_equivalent = model_flops_per_step(make_job(dataclasses.replace(spec, num_experts=0, moe_layers=()), H100, 256, 4096))
    assert model_flops_per_step(a) > dense_equivalent  # two experts per token, plus the router


def test_all_to_all_across_nodes_costs_more_than_inside_and_imbalance_is_paid():
    nbytes = 64e6
    inside, across = all_to_all_time(H100, nbytes, 8, 1), all_to_all_time(H100, nbytes, 16, 1)
    assert across > 3 * inside  # the NIC (50 GB/s) instead of NVLink (~370 GB/s as NCCL counts it)
    job = make_job(load_model("mixtral-8x7b"), H100, 256, 4096)
    lay = Layout(dp=16, pp=4, micro_batch=1, ep=8, zero=1)
    even, skewed = estimate(job, lay), estimate(dataclasses.replace(job, capacity_factor=1.5), lay)
    assert skewed.time_s["ep_comm"] == pytest.approx(1.5 * even.time_s["ep_comm"], rel=0.05)
    assert skewed.step_time > even.step_time and skewed.memory_bytes["activations"] > even.memory_bytes["activations"]


def test_explain_says_why_experts_are_split(capsys):
    assert main(["explain", "--model", "mixtral-8x7b", *JOB, "--pp", "1,2", "--tp", "1,2", "--micro-batch", "1"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "EP = " in text and "all-to-all" in text and "with every expert on every GPU (ep = 1)" in text
    # the parameters it says FLOPs and MFU count: model_flops_per_step's, less the attention cores', per token / 6
    job = make_job(load_model("mixtral-8x7b"), H100, 256, 4096)
    counted = (model_flops_per_step(job) - attention_flops_per_step(job)) / (6 * 256 * 4096)
    said = float(text.split("FLOPs and MFU count the ")[1].split(" B")[0]) * 1e9
    assert said == pytest.approx(counted, abs=0.05e9) and said < load_model("mixtral-8x7b").active_params() - 0.1e9


def test_mla_attention_is_counted_not_trained():
    """DeepSeek-V3 plans (MLA and 256 experts counted exactly); its per-GPU states shrink with ep."""
    job = make_job(load_model("deepseek-v3"), H100, 4096, 4096)
    lay = Layout(dp=64, pp=16, micro_batch=1, zero=1, recompute="full")
    few, many = estimate(job, lay.with_(ep=8)), estimate(job, lay.with_(ep=64))
    assert many.memory_per_gpu < few.memory_per_gpu
    assert few.to_dict()["total_params"] == 671_026_404_352


def test_mla_attention_core_flops_by_hand():
    """DeepSeek-V3's attention core, per token and layer, counted by hand from its config (128 heads, Q·Kᵀ over
    qk_nope 128 + qk_rope 64 = 192, P·V over v_head_dim 128): forward 2·s·192 + 2·s·128 FLOPs per head, backward
    twice that, so 6·s·(192 + 128)·128 = 245,760·s per token and layer (PaLM's 12·s·q_dim with q_dim's 192 and 128
    in place of one head dim; Megatron-Core's MLA branch halves it for the causal mask). Doubling s from 4096 to
    8192 adds that much per token at s = 4096 over the 61 layers, and the parameter FLOPs not at all."""
    spec = load_model("deepseek-v3")
    per_token = [model_flops_per_step(make_job(spec, H100, 8, s)) / (8 * s) for s in (4096, 8192)]
    assert per_token[1] - per_token[0] == pytest.approx(61 * 245_760 * 4096)


def test_permutation_traffic_is_counted_by_hand():
    """Per routed token, forward: the permute reads and writes k rows, the unpermute reads k and writes one
    (Mixtral: k = 2, so 7 rows of h bf16 elements); backward reads the k outputs once more (9 rows)."""
    from shardwise.planner.kernels import hbm_rate
    from shardwise.planner.moe import permute_time
    spec = load_model("mixtral-8x7b")
    row = spec.hidden * 2
    f, b = permute_time(H100, spec, 4096, Layout(), 2)
    assert f == pytest.approx(4096 * 7 * row / hbm_rate(H100))
    assert b == pytest.approx(4096 * 9 * row / hbm_rate(H100))
    f2, _ = permute_time(H100, spec, 4096, Layout(tp=2, dp=1), 2)  # each tp rank routes half the tokens
    assert f2 == pytest.approx(f / 2)
    fc, _ = permute_time(H100, spec, 4096, Layout(), 2, capacity=1.5)  # 3 rows per token: 3 + 3 + 3 + 1
    assert fc == pytest.approx(4096 * 10 * row / hbm_rate(H100))


def test_ranks_a_token_reaches_random_or_contiguous():
    """k distinct experts at random reach k of E single-expert ranks; NeMo AutoModel's fake balanced gate gives
    token t the experts tk .. tk+k-1, inside one rank when a rank holds a multiple of k experts."""
    from shardwise.planner.moe import units_hit
    mixtral = load_model("mixtral-8x7b")  # E = 8, k = 2
    assert units_hit(mixtral, 8) == pytest.approx(2.0)
    assert units_hit(mixtral, 4, "contiguous") == pytest.approx(1.0)
    assert units_hit(mixtral, 8, "contiguous") == pytest.approx(2.0)
    assert units_hit(mixtral, 2) == pytest.approx(2 * (1 - 6 / 28))  # P(both of 2 draws in the other 4 of 8) = 6/28
    v3 = load_model("deepseek-v3")  # E = 256, k = 8
    assert units_hit(v3, 16, "contiguous") == pytest.approx(1.0)  # 16 experts per rank, 8 consecutive: one rank


def test_ep_overlap_hides_all_to_alls_only_behind_compute():
    from shardwise.planner.moe import ep_overlap_exposed, paired_share
    assert ep_overlap_exposed(1, 1, 1, 1, 1, 0.0) == 0.0
    assert ep_overlap_exposed(0, 0, 0, 0, 0, 1.0) == pytest.approx(4.0)  # nothing to hide behind: all four exposed
    assert ep_overlap_exposed(10, 10, 10, 10, 10, 1.0) < 1.0  # ample compute: only the slowdown of the compute beside it
    # Megatron-Core's warm-up forwards on the first pipeline rank (schedules.py): p - 1 for 1F1B,
    # 2 (p - 1) + (v - 1) p chunks interleaved; with no pipeline the first forward and the last backward run alone.
    assert paired_share(Layout(), 8) == pytest.approx(7 / 8)
    assert paired_share(Layout(pp=4, dp=1), 8) == pytest.approx(5 / 8)
    assert paired_share(Layout(pp=4, dp=1, vpp=2, schedule="interleaved-1f1b"), 8) == pytest.approx(6 / 16)


def test_named_recompute_modules_recompute_only_what_they_name():
    """Megatron's --recompute-modules: core_attn alone is its default selective recompute; layernorm and moe_act
    recompute element-wise passes only (no attention core, whose cost grows with the sequence) and keep less."""
    base = make_job(load_model("qwen3-30b-a3b"), H100, 64, 16384, "megatron-core")
    lay = Layout(dp=8, tp=2, pp=1, micro_batch=1, ep=8, zero=1, recompute="selective", sequence_parallel=True)
    plain = estimate(base, lay)
    core = estimate(dataclasses.replace(base, recompute_modules=("core_attn",)), lay)
    assert core.time_s["recompute"] == pytest.approx(plain.time_s["recompute"])
    assert core.memory_bytes["activations"] == pytest.approx(plain.memory_bytes["activations"])
    light = estimate(dataclasses.replace(base, recompute_modules=("layernorm", "moe_act"), moe_recompute="act"), lay)
    none = estimate(base, lay.with_(recompute="none"))
    assert 0 < light.time_s["recompute"] < 0.1 * plain.time_s["recompute"]
    assert light.memory_bytes["activations"] < none.memory_bytes["activations"]


def test_fp8_experts_cast_their_routed_rows():
    """Under FP8 a MoE layer's experts quantize the k rows each token is routed to (not one FFN row): Mixtral at
    4096 tokens, top-2 — 8192 rows into FC1 (h = 4096) and FC2 (f_e = 14336); backward FC2's (h) and FC1's
    (2 f_e) output gradients."""
    from shardwise.planner.moe import fp8_cast_elements
    inputs, grads = fp8_cast_elements(load_model("mixtral-8x7b"), 4096, Layout())
    assert inputs == [8192 * 4096, 8192 * 14336] and grads == [8192 * 4096, 8192 * 2 * 14336]
    _, etp_grads = fp8_cast_elements(load_model("mixtral-8x7b"), 4096, Layout(tp=2, dp=1, ep=1, etp=2))
    assert etp_grads == [8192 * 4096, 8192 * 2 * 7168]  # each etp rank: all its tp group's rows (gathered), half of 2 f_e


def test_one_pipeline_schedule_per_local_batch_pays_the_bubble_each_time():
    """NeMo AutoModel runs schedule.step per local batch: four runs of 8 micro-batches fill and drain the
    pipeline four times where one run of 32 does it once; the work is the same."""
    job = make_job(load_model("mixtral-8x7b"), H100, 512, 4096)
    lay = Layout(dp=16, pp=4, micro_batch=1, ep=8, zero=1)
    one, four = estimate(job, lay), estimate(dataclasses.replace(job, schedule_runs=4), lay)
    assert four.time_s["compute"] == pytest.approx(one.time_s["compute"])
    assert four.time_s["pipeline_bubble"] == pytest.approx(4 * one.time_s["pipeline_bubble"], rel=0.01)


def test_experts_issued_one_gemm_per_stream_share_fewer_waves():
    """Transformer Engine's GroupedLinear on Hopper runs one cuBLAS GEMM per expert over 4 streams: 16 expert GEMMs of
    512 x 1536 x 2048 (48 tiles of 128 x 128 each on 132 SMs) run as 4 rounds of 4 concurrent GEMMs, 2 waves
    each (192 tiles), 8 in all, where one grouped kernel packs their 768 tiles into 6 waves: 4/3 the time. A GEMM
    that fills the SMs alone costs the same either way."""
    from shardwise.planner.moe import expert_gemm_time
    streamed, grouped = expert_gemm_time(H100, 512, 1536, 2048, 16, 4), expert_gemm_time(H100, 512, 1536, 2048, 16, 0)
    assert streamed / grouped == pytest.approx(8 / 6)
    big = (expert_gemm_time(H100, 8192, 4096, 7168, 4, 4), expert_gemm_time(H100, 8192, 4096, 7168, 4, 0))
    assert big[0] == pytest.approx(big[1])
    # one expert after another on one stream (DeepSpeed's and shardwise's Experts.forward): slower still
    from shardwise.planner.kernels import gemm_time
    one = expert_gemm_time(H100, 512, 1536, 2048, 16, 1)
    assert one == pytest.approx(16 * gemm_time(H100, 512, 1536, 2048)) and one > streamed


def test_a_small_moe_layer_pass_takes_the_host_time_at_least():
    # A MoE layer's pass waits for the host that issues it (moe.MOE_LAYER_HOST_S): halving a big micro-batch halves
    # the layer's time, but once the GPU's work per pass is below the host's, fewer tokens buy nothing.
    from shardwise.planner import moe
    from shardwise.planner.layer_time import layer_cost, paced

    job = make_job(load_model("qwen3-30b-a3b"), H100, 256, 4096, "megatron-core")

    def per_pass(mb, tp):  # as a pipeline rank runs it (the floor applied), at one GPU's pace
        lay = Layout(dp=8 // tp, tp=tp, micro_batch=mb, ep=8, sequence_parallel=tp > 1)
        lc = paced(layer_cost(job, lay, moe_layer=True), 1.0, 1.0)
        return lc.fwd + lc.bwd_in + lc.bwd_w + lc.tp_fwd + lc.tp_bwd + lc.ep_fwd + lc.ep_bwd

    for mb in (8, 4):  # 32K and 16K tokens a GPU: GPU-bound, about linear
        assert per_pass(mb, 1) > 1.8 * per_pass(mb // 2, 1) > 1.8 * moe.MOE_LAYER_HOST_S
    for tp in (1, 2, 4, 8):  # 4,096 tokens a GPU down to 512: the host's time, whatever the GPU's
        assert per_pass(1, tp) == pytest.approx(moe.MOE_LAYER_HOST_S)


def test_hiding_the_all_to_alls_or_a_faster_link_never_slows_a_moe_step():
    # Megatron-Core's EP overlap hides a pair of passes' all-to-alls, never exposing more than alone; where a MoE
    # layer's passes wait for the host, the floor bounds each kind of pass (paired, and the warm-up / cool-down ones
    # alone) after the slowest GPU's pace, which moves the GPU's work, not the host's. It had priced the floor against
    # the paired all-to-alls, then added the lone ones' back and scaled the floor by the straggler factor (a step 9 %
    # slower with --ep-comm-overlap); and a DTensor plan's kept gathers left the pass under the floor (halving NVLink
    # gave a faster step).
    for fw, tp, pp, mb, ep in (("nemo", 2, 4, 1, 8), ("megatron-core", 2, 4, 1, 4), ("nemo", 1, 2, 2, 8),
                               ("megatron-core", 4, 1, 1, 8)):
        job = make_job(load_model("qwen3-30b-a3b"), H100, 64, 4096, fw)
        lay = Layout(dp=8, tp=tp, pp=pp, micro_batch=mb, ep=ep, sequence_parallel=tp > 1, zero=1)
        alone, hidden = estimate(job, lay), estimate(dataclasses.replace(job, ep_comm_overlap=True), lay)
        assert hidden.step_time <= alone.step_time * (1 + 1e-9), (fw, tp, pp, mb, ep)
    half = dataclasses.replace(H100, intra_node_bandwidth=H100.intra_node_bandwidth / 2)
    for fw in ("torchtitan", "nemo"):
        lay = Layout(dp=4, tp=4, pp=2, micro_batch=2, ep=4, sequence_parallel=True, zero=2 if fw == "torchtitan" else 1)
        steps = [estimate(make_job(load_model("qwen1.5-moe-a2.7b"), c, 64, 4096, fw), lay).step_time for c in (H100, half)]
        assert steps[1] >= steps[0] * (1 - 1e-9), fw


def test_expert_and_dense_reductions_share_the_window_by_link_time():
    """Equal bytes of dense and expert gradients, the dense ones reduced inside one node (8 ranks, NVLink 4: 450 GB/s
    a direction on the H100 datasheet), the experts' across 8 nodes (one 400 Gb/s NIC a GPU: 50 GB/s): the experts
    hold the links about 9 times as long, so they hide behind about 9/10 of the compute beside them — not the half
    their bytes would give (NCCL reaches a different share of each link's peak: more than 0.8)."""
    from shardwise.planner.step_time import _expert_link_share
    job = make_job(load_model("mixtral-8x7b"), H100, 512, 4096, "megatron-core")
    assert _expert_link_share(job, Layout(dp=8, tp=1, ep=8), 1e9, 1e9, 8, 8) > 0.8


@pytest.mark.parametrize("framework", ["megatron-2021", "llama3", "lit-gpt", "flash-attn"])
def test_a_stack_without_moe_layers_refuses_a_moe_model_in_one_line(framework, capsys):
    """Megatron-LM 2021, Meta's Llama stacks, Lit-GPT as TinyLlama ran it, flash-attn's trainer (and others,
    Framework.expert_parallel) have no mixture-of-experts layers: a MoE model is one line and exit 2 under them, with
    or without --ep, in estimate, plan and explain alike (their routing and dispatch would be no code of theirs)."""
    for command, extra in (("estimate", ["--micro-batch", "1"]), ("estimate", ["--micro-batch", "1", "--ep", "8"]),
                           ("plan", []), ("plan", ["--ep", "8"]), ("explain", [])):
        code = main([command, "--model", "mixtral-8x7b", *JOB, *extra, "--framework", framework])
        err = capsys.readouterr().err
        assert code == 2 and f"{framework} has no mixture-of-experts layers" in err and err.count("\n") == 1, err
    assert main(["estimate", "--model", "llama3-8b", *JOB, "--micro-batch", "1", "--framework", framework]) == 0  # dense


def test_fp8_runs_the_routed_experts_in_fp8_only_where_the_stack_does():
    # torchtitan's quantize.linear.float8 swaps nn.Linear for Float8Linear and its GroupedExperts hold plain
    # parameters; DeepSpeed-MoE's experts are no Transformer Engine module either: their routed experts run BF16
    # grouped GEMMs (at the FP8 job's in-situ share) and cast nothing, where Megatron-Core's TEGroupedLinear runs them
    # in FP8. Mixtral 8x7B, whose experts are nearly all of a layer's GEMM time: FP8 buys a Megatron-Core step a lot,
    # the other two nothing (a few percent less: their BF16 experts run at the FP8 job's in-situ share).
    model, layout = load_model("mixtral-8x7b"), Layout(dp=64, ep=8, zero=1, recompute="full")
    gain = {}
    for framework in ("torchtitan", "deepspeed-2024", "megatron-core"):
        lay = layout.with_(zero=3) if framework == "torchtitan" else layout
        bf16, fp8 = (estimate(make_job(model, H100, 256, 4096, framework, precision=p), lay) for p in ("bf16", "fp8"))
        assert bf16.fits and fp8.fits, framework
        gain[framework] = bf16.step_time / fp8.step_time
    assert 0.95 < gain["torchtitan"] < 1.02 and 0.95 < gain["deepspeed-2024"] < 1.02, gain
    assert gain["megatron-core"] > 1.25, gain
    job = make_job(model, H100, 256, 4096, "torchtitan", precision="fp8")
    assert "routed experts and router bf16" in estimate(job, layout.with_(zero=3)).assumptions["gemm_dtype"]
    # Transformer Engine also keeps an FP8 copy and its transpose of every local expert's weights between micro-batches:
    # one local expert per layer (ep 8, 3 x 4096 x 14336) and the attention's 42M, 32 layers, 2 B each: 13 GiB
    te = {p: estimate(make_job(model, H100, 256, 4096, "megatron-core", precision=p), layout) for p in ("bf16", "fp8")}
    copies = (te["fp8"].memory_bytes["weights"] - te["bf16"].memory_bytes["weights"]) / 2**30
    assert 12.0 < copies < 14.0, copies


def test_transformer_engine_casts_every_local_experts_weights_once_a_step():
    # Transformer Engine casts each local expert's weights to FP8 once per step (the k a token uses are not the ones
    # it holds): Mixtral's 8 experts on one GPU, 2 at ep = 4, 1 at ep = 8, so going from ep = 8 to 1 adds seven
    # experts' casts and from 8 to 4 one. torchao's experts stay BF16, so ep changes nothing there.
    from shardwise.planner.layer_time import fp8_weight_cast

    model = load_model("mixtral-8x7b")
    te = make_job(model, H100, 256, 4096, "megatron-core", precision="fp8")
    ao = make_job(model, H100, 256, 4096, "torchtitan", precision="fp8")
    cast = {(name, ep): fp8_weight_cast(job, Layout(dp=8, ep=ep), model.num_layers)
            for name, job in (("te", te), ("ao", ao)) for ep in (1, 4, 8)}
    one_expert = cast["te", 4] - cast["te", 8]
    assert one_expert > 0 and cast["te", 1] - cast["te", 8] == pytest.approx(7 * one_expert)
    assert cast["ao", 1] == cast["ao", 8] < cast["te", 8]


def test_a_moe_step_bound_by_the_fitted_host_floor_says_so():
    # Mixtral 8x7B at tp 8 and one sequence a micro-batch: a MoE layer's GPU work per micro-batch is a few ms, under the
    # host time fitted on published MoE runs (moe.MOE_LAYER_HOST_S), which then sets the layer's time; the estimate
    # says so rather than booking it as compute without a word. At tp 1 the GPU work is longer: no note.
    from shardwise.planner.step_time import host_bound_note
    model = load_model("mixtral-8x7b")
    job = make_job(model, H100, 512, 4096, "megatron-core")
    narrow = Layout(dp=8, tp=8, ep=8, micro_batch=1, zero=1)
    assert "bound by the host" in host_bound_note(job, narrow)
    assert host_bound_note(job, Layout(dp=64, ep=8, micro_batch=1, zero=1, recompute="full")) == ""


def test_expert_tensor_parallelism_unnamed_is_the_stacks_own(capsys):
    # Megatron-Core's --expert-tensor-parallel-size defaults to --tensor-model-parallel-size (megatron/training/
    # arguments.py): megatron-core and nemo split each expert over the dense tp unless told; torchtitan keeps each
    # expert whole (expert_tensor_parallel_degree 1). Named, --etp is kept.
    argv = ["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "512",
            "--seq-len", "4096", "--tp", "4", "--ep", "8", "--micro-batch", "1", "--json"]

    def run(*extra):
        assert main([*argv, *extra]) == 0
        return json.loads(capsys.readouterr().out)

    mega = run("--framework", "megatron-core")
    assert mega["etp"] == 4 and any(n.startswith("etp 4 (") for n in mega["assumptions"]["implied"])
    assert run("--framework", "megatron-core", "--etp", "1")["etp"] == 1
    assert run("--framework", "torchtitan")["etp"] == 1
    # where ep x tp (64) does not fold over the dp x tp ranks (32 GPUs): etp 1, said
    folded = main(["estimate", *argv[1:5], "--gpus", "32", *argv[7:11], "--tp", "8", "--ep", "8", "--micro-batch", "1",
                   "--framework", "megatron-core", "--json"])
    assert folded == 0
    unfolded = json.loads(capsys.readouterr().out)
    assert unfolded["etp"] == 1 and any(n.startswith("etp 1 (ep x tp = 64 does not fold")
                                         for n in unfolded["assumptions"]["implied"])
    # plan ranks layouts as the stack splits them unasked: a megatron-core candidate with tp > 1 splits its experts
    # over tp wherever ep x tp folds over its dp x tp x cp ranks (elsewhere Megatron-Core needs --etp 1 said)
    assert main(["plan", *argv[1:11], "--framework", "megatron-core", "--json", "--top", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    split = [c for c in [out["best"], *out["candidates"]] if c["tp"] > 1]
    folds = [c for c in split if (c["dp"] * c["cp"]) % c["ep"] == 0]
    assert folds and all(c["etp"] == c["tp"] for c in folds) and all(c["etp"] == 1 for c in split if c not in folds)


def test_torchtitan_refuses_an_expert_split_other_than_the_dense_tp_or_none(capsys):
    # torchtitan's ParallelDims asserts etp == tp or etp == 1 ("Currently we only support ETP=TP or ETP=1"); an
    # outside check found --etp 4 at tp 2 priced as if it ran. Megatron-Core takes any etp that folds.
    argv = ["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch", "64",
            "--seq-len", "4096", "--tp", "2", "--ep", "2"]
    for etp, code in (("4", 2), ("2", 0), ("1", 0)):
        assert main([*argv, "--etp", etp, "--framework", "torchtitan"]) == code, etp
        err = capsys.readouterr().err
        assert (err.count("\n") == 1 and "use --etp 1 or --etp 2" in err) if code else not err
    assert main([*argv, "--etp", "4", "--framework", "megatron-core"]) == 0
    capsys.readouterr()


def test_one_shard_group_of_every_dp_rank_is_no_hybrid_sharding():
    # --dp-shard equal to dp is one shard group of all of them, which estimate --json reports as dp_shard = dp: given
    # back, it must price the same step (the experts' reduction once divided its ranks into zero replicas).
    model = load_model("mixtral-8x7b")
    job = make_job(model, H100, 256, 4096, "torchtitan")
    lay = Layout(dp=16, pp=4, micro_batch=1, vpp=8, schedule="interleaved-1f1b", zero=2, ep=8)
    assert estimate(job, lay.with_(dp_shard=16)).step_time == estimate(job, lay).step_time
    qwen = make_job(load_model("qwen3-30b-a3b"), H100, 128, 4096, "megatron-core")
    lay = Layout(dp=32, micro_batch=2, zero=3, ep=8)
    assert estimate(qwen, lay.with_(dp_shard=32)).step_time == estimate(qwen, lay).step_time


def test_a_last_stage_of_one_recomputed_moe_layer_keeps_no_negative_activations(tmp_path):
    # an 8-layer DeepSeek-V3 cut at pp 8, full recompute: the logits' overlap with the recompute transient was worked
    # out on the dense transient and took the MoE layer's activations below zero (helper-232: -0.0146 GiB)
    import json

    from shardwise.planner.job import make_job
    from shardwise.planner.memory import memory_breakdown
    from shardwise.specs import Layout, load_cluster, load_model

    config = json.loads((__import__("pathlib").Path(__file__).parents[1] / "src/shardwise/presets/models/deepseek-v3.json")
                        .read_text()) | {"num_hidden_layers": 8, "n_routed_experts": 16, "num_experts_per_tok": 2,
                                         "n_group": 1, "topk_group": 1}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    job = make_job(load_model(str(path)), load_cluster("dgx-a100-40gb"), 16, 8192, "megatron-core")
    rank, mem = memory_breakdown(job, Layout(pp=8, micro_batch=1, recompute="full"))
    assert rank == 7 and min(mem.values()) >= 0, (rank, mem)  # the last stage, whose logits hold the peak
    # beside the logits it keeps its one layer's checkpointed input, 8,192 tokens x 7,168 x 2 B (the recomputed MoE
    # layer's own working set, freed before the logits' peak, overlaps them: helper-233)
    assert mem["activations"] == pytest.approx(8192 * 7168 * 2, rel=0.01)
