"""Memory model: Korthikanti et al. 2022 formulas by hand, model states by ZeRO stage, properties."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.planner.job import Job
from shardwise.planner.memory import (FRAGMENTATION, WORKSPACE_BYTES, checkpoint_bytes, layer_activation_terms,
                                      memory_breakdown, model_state_bytes, rank_layers, rank_memory, rank_params,
                                      stage_activation_bytes)
from shardwise.specs import Layout, ModelSpec, TrainSpec, load_cluster, load_model

# A GPT-3-like layer (the paper's setting: 4h FFN, multi-head attention, dropout), small numbers.
GPT = ModelSpec(name="gpt", family="gpt2", hidden=64, ffn_hidden=256, num_layers=8, num_heads=4, num_kv_heads=4,
                vocab_size=1000, head_dim=16, max_positions=128, tie_embeddings=True)
S, B, H, A = 128, 2, 64, 4


def total(tp=1, sp=False):
    linear, scores = layer_activation_terms(GPT, S, B, tp, sp)
    return linear + scores


def test_no_parallelism_is_sbh_34_plus_5as_over_h():
    # 128*2*64*(34 + 5*4*128/64) = 16384 * 74 = 1_212_416 bytes
    assert total() == S * B * H * (34 + 5 * A * S / H) == 1_212_416


@pytest.mark.parametrize("t", [1, 2, 4])
def test_tensor_parallel_is_sbh_10_plus_24_over_t_plus_5as_over_ht(t):
    assert total(tp=t) == pytest.approx(S * B * H * (10 + 24 / t + 5 * A * S / (H * t)))


@pytest.mark.parametrize("t", [2, 4])
def test_sequence_parallel_divides_everything_by_t(t):
    assert total(tp=t, sp=True) == pytest.approx(S * B * H / t * (34 + 5 * A * S / H))


def test_selective_recompute_with_sp_keeps_34_sbh_over_t():
    linear, _ = layer_activation_terms(GPT, S, B, 4, True)
    assert linear == pytest.approx(34 * S * B * H / 4)


def test_full_recompute_keeps_2sbh_per_layer():
    assert checkpoint_bytes(GPT, S, B, 1, False) == 2 * S * B * H
    assert checkpoint_bytes(GPT, S, B, 4, True) == 2 * S * B * H / 4


def test_gqa_and_swiglu_by_hand():
    # tiny: h 64, 4 heads of 16, 2 KV heads (kv_dim 32), ffn 128, SwiGLU, no dropout.
    tiny = load_model("tiny")
    linear, scores = layer_activation_terms(tiny, 10, 1, 1, False)
    # replicated 4*2*h = 512/token; Q,K 2*(64+32)=192, V 2*32=64, out-proj in 2*64=128; MLP 3*2*128 = 768
    assert linear == 10 * (512 + 192 + 64 + 128 + 768)
    assert scores == 4 * 10 * 10 * 2  # softmax output only, bf16


def _job(model="tiny", cluster="dgx-a100-80gb", batch=16, seq=64, **kw):
    return Job(load_model(model), load_cluster(cluster), TrainSpec(batch, seq), **kw)


def test_inflight_microbatches_follow_the_schedule():
    job = _job(batch=16)
    lay = Layout(dp=1, tp=1, pp=2, micro_batch=1)
    per_layer = sum(layer_activation_terms(job.model, 64, 1, 1, False))
    layers = 2  # 4 layers over 2 stages
    assert rank_memory(job, lay, 0)["activations"] == layers * 2 * per_layer  # 1F1B: p in flight
    assert rank_memory(job, lay.with_(schedule="gpipe"), 0)["activations"] == layers * 16 * per_layer  # GPipe: m
    assert rank_memory(job, lay.with_(schedule="zb-h1"), 0)["activations"] == layers * 2 * per_layer
    inter = lay.with_(schedule="interleaved-1f1b", vpp=2)  # p(1 + (p-1)/(pv)) = 2.5 stage-micro-batches
    assert rank_memory(job, inter, 0)["activations"] == pytest.approx(layers * 2.5 * per_layer)


def test_uneven_stages_and_embedding_on_first_head_on_last():
    m = load_model("llama3.1-405b")
    lay = Layout(tp=8, pp=16)
    job = Job(m, load_cluster("dgx-h100-80gb"), TrainSpec(64, 4096))
    # The runtime's cut (stage_split): 7 layers beside the embedding and beside the LM head, 8 elsewhere.
    assert [rank_layers(job, lay, r) for r in range(16)] == [7] + [8] * 14 + [7]
    # Matrices and the vocabulary (128256 rows: tp 8 divides it) split over tp; the two RMSNorms of each
    # layer and the final one replicated on every tp rank, as the runtime keeps them.
    norms, h = 2 * m.hidden, m.hidden
    assert rank_params(job, lay, 0) == 7 * ((m.params_per_layer() - norms) / 8 + norms) + m.vocab_size * h / 8
    assert rank_params(job, lay, 15) == 7 * ((m.params_per_layer() - norms) / 8 + norms) + m.vocab_size * h / 8 + h
    assert rank_memory(job, lay.with_(dp=1), 15)["logits"] == 4096 * m.vocab_size / 8 * 6
    assert rank_memory(job, lay.with_(dp=1), 0)["logits"] == 0


def test_zero_stages_by_hand():
    job = _job()
    P = 1000.0
    s0 = model_state_bytes(job, Layout(dp=4, zero=0), P)
    assert (s0["weights"], s0["gradients"], s0["optimizer"]) == (2000, 4000, 12000)
    s1 = model_state_bytes(job, Layout(dp=4, zero=1), P)
    assert (s1["gradients"], s1["optimizer"]) == (4000, 3000)
    s2 = model_state_bytes(job, Layout(dp=4, zero=2), P)
    assert (s2["gradients"], s2["optimizer"]) == (1000, 3000)
    # Megatron FSDP's ZeRO-2 (optim_grads) never shards the model weights: whole, with no BF16 shard beside them
    assert s2["weights"] == 2 * P
    own = model_state_bytes(replace(job, framework="shardwise"), Layout(dp=4, zero=2), P)
    assert own["weights"] == 2 * (P / 4 + P)  # FSDP's own shard in the weights' dtype, and every unit gathered beside it
    layer = job.model.params_per_layer()
    P = 10 * layer + 5000.0  # ten layers and a root unit of 5000 parameters
    s3 = model_state_bytes(job, Layout(dp=4, zero=3), P, layers=10)
    assert s3["weights"] == pytest.approx(2 * (P / 4 + 5000 + 2 * layer))  # shard + root + current and prefetched layer


def test_workspace_allowance_is_stated():
    job = _job()
    mem = rank_memory(job, Layout(), 0)
    rest = sum(v for k, v in mem.items() if k != "workspace")
    assert mem["workspace"] == pytest.approx(WORKSPACE_BYTES + FRAGMENTATION * rest)


def test_expandable_segments_leave_only_the_workspace():
    # torchtitan's launcher runs PyTorch's allocator with expandable segments (run_train.sh): free memory goes back by
    # the 2 MiB page, so nothing beyond the 1 GiB workspace; Megatron-LM's default caching allocator keeps the 5 %.
    from shardwise.planner.job import make_job
    model, cluster, lay = load_model("tiny"), load_cluster("dgx-a100-80gb"), Layout(dp=2, zero=2)
    titan = rank_memory(make_job(model, cluster, 8, 64, "torchtitan"), lay, 0)
    assert titan["workspace"] == WORKSPACE_BYTES
    mega = rank_memory(make_job(model, cluster, 8, 64, "megatron-core"), lay, 0)
    assert mega["workspace"] == pytest.approx(WORKSPACE_BYTES + 0.05 * sum(v for k, v in mega.items() if k != "workspace"))


# ------------------------------------------------------------------ properties (hypothesis)

MODELS = ["tiny", "tiny-gpt2", "llama2-7b", "llama3-8b", "gpt3-175b"]


def _worst(job, lay):
    return sum(memory_breakdown(job, lay)[1].values())


def _states(job, lay):
    return max(sum(v for k, v in rank_memory(job, lay, r).items() if k in ("weights", "gradients", "optimizer"))
               for r in {0, lay.pp - 1})


knobs = st.fixed_dictionaries({
    "model": st.sampled_from(MODELS), "dp": st.sampled_from([1, 2, 4]), "pp": st.sampled_from([1, 2, 4]),
    "mb": st.sampled_from([1, 2]), "zero": st.sampled_from([0, 1, 2, 3]),
    "recompute": st.sampled_from(["none", "selective", "full"]), "sp": st.booleans(),
    "schedule": st.sampled_from(["gpipe", "1f1b", "zb-h1"]), "flash": st.booleans(),
})


def _make(k, tp=1, **over):
    job = _job(k["model"], batch=16, seq=128, flash_attention=k["flash"])
    lay = Layout(dp=k["dp"], tp=tp, pp=k["pp"], micro_batch=k["mb"], zero=k["zero"], recompute=k["recompute"],
                 sequence_parallel=k["sp"] and tp > 1, schedule=k["schedule"]).with_(**over)
    return job, lay


@settings(max_examples=60, deadline=None)
@given(knobs)
def test_memory_never_rises_with_tp(k):
    job, _ = _make(k)
    tps = [t for t in (1, 2, 4) if job.model.num_kv_heads % t == 0]
    mems = []
    for t in tps:
        _, lay = _make(k, tp=t, sequence_parallel=k["sp"] and t > 1)
        mems.append(_worst(job, lay))
    # SP can only switch on once tp > 1, which lowers memory further
    assert all(b <= a * (1 + 1e-12) for a, b in zip(mems, mems[1:]))


@settings(max_examples=60, deadline=None)
@given(knobs)
def test_memory_never_rises_with_zero_stage(k):
    job, lay = _make(k)
    mems = [_worst(job, lay.with_(zero=z)) for z in (0, 1, 2, 3)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(mems[:3], mems[1:3]))
    # ZeRO-3 keeps a shard of the weights beside the layers it gathers, where Megatron FSDP's ZeRO-2 keeps them whole
    # and no shard: a chunk of two layers or fewer is all gathered, so ZeRO-3 may hold that shard (1/dp of the
    # weights) more, never beyond it
    assert mems[3] <= mems[2] * (1 + 1 / lay.dp) * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(knobs)
def test_model_states_never_rise_with_pp(k):
    job, lay = _make(k)
    states = [_states(job, lay.with_(pp=p)) for p in (1, 2, 4)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(states, states[1:]))


@settings(max_examples=60, deadline=None)
@given(knobs)
def test_more_recompute_never_raises_memory(k):
    job, lay = _make(k)
    mems = [_worst(job, lay.with_(recompute=r)) for r in ("none", "selective", "full")]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(mems, mems[1:]))


def test_stage_activations_full_recompute_is_checkpoints_plus_one_layer():
    job = _job()
    lay = Layout(recompute="full", micro_batch=2)
    ck = checkpoint_bytes(job.model, 64, 2, 1, False)
    linear, scores = layer_activation_terms(job.model, 64, 2, 1, False)
    assert not job.flash_attention and scores > 0  # a materialised softmax: the recomputed layer holds its scores too
    assert stage_activation_bytes(job, lay, 4, 1) == 3 * ck + linear + scores


def test_non_gated_mlp_without_dropout_nemotron_style():
    # Nemotron-4: Llama-style blocks, a two-matrix squared-ReLU MLP, no dropout. Per token (e = 2): norm inputs and
    # QKV/FC1 inputs 4*2*64 = 512, Q K V and the projection input 2*(64+64+64+64) = 512, the MLP's two f-wide tensors
    # 2*2*256 = 1024: 2048 B; GPT's recipe adds two 1-byte dropout masks of h (128 B) and the scores' terms.
    nemotron = ModelSpec(name="n", family="llama", hidden=64, ffn_hidden=256, num_layers=8, num_heads=4, num_kv_heads=4,
                         vocab_size=1000, head_dim=16, mlp="squared-relu")
    assert not nemotron.gated_mlp and not nemotron.trains_with_dropout
    assert nemotron.dense_ffn_params() == 2 * 64 * 256
    assert layer_activation_terms(nemotron, 8, 1, 1, False) == (8 * 2048, 4 * 8 * 8 * 2)
    gpt_linear, _ = layer_activation_terms(GPT, 8, 1, 1, False)
    assert gpt_linear == 8 * (2048 + 128)


def test_torchtitan_selective_keeps_every_other_matmul_output():
    # torchtitan's op-level checkpointing, Llama block h 64, q 64, kv 32, f 128, 4 heads, e = 2, per token: the block
    # input 128 + wq, wv, w1, w2 outputs 2*(64+32+128+64) = 576 + the attention output 128 + its fp32 LSE 16 = 848 B.
    from shardwise.planner.memory import op_sac_bytes
    llama = ModelSpec(name="l", family="llama", hidden=64, ffn_hidden=128, num_layers=4, num_heads=4, num_kv_heads=2,
                      vocab_size=1000, head_dim=16)
    assert op_sac_bytes(llama, 16, 2, 1, False) == 16 * 2 * 848
    job = Job(llama, load_cluster("dgx-a100-80gb"), TrainSpec(8, 16), flash_attention=True, selective="op")
    lay = Layout(dp=1, tp=1, pp=1, micro_batch=2, recompute="selective")
    mega = Job(llama, job.cluster, job.train, flash_attention=True)
    # less than Megatron's selective (everything but the attention core) and more than full (the block input)
    assert stage_activation_bytes(job, lay.with_(recompute="full"), 4, 1) < stage_activation_bytes(job, lay, 4, 1) \
        < stage_activation_bytes(mega, lay, 4, 1)


def test_fp8_linears_keep_their_inputs_in_one_byte():
    # Transformer Engine's FP8 linears keep the FP8 copy they multiplied: per token (the Nemotron-style layer above,
    # e = 2) norm inputs 2*2*64 = 256 and QKV/FC1 inputs 2*1*64 = 128; Q K V O 512 and the projection's FP8 input 64;
    # the activation's input 2*256 and FC2's FP8 input 256: 1,728 B instead of 2,048.
    nemotron = ModelSpec(name="n", family="llama", hidden=64, ffn_hidden=256, num_layers=8, num_heads=4, num_kv_heads=4,
                         vocab_size=1000, head_dim=16, mlp="squared-relu")
    assert layer_activation_terms(nemotron, 8, 1, 1, False, fp8=True)[0] == 8 * 1728


def test_fsdp_under_a_pipeline_holds_the_gradients_of_the_chunks_its_schedule_reached():
    # torchtitan's FSDP2 under torch.distributed.pipelining accumulates unsharded FP32 gradients, created at each
    # unit's first backward. tiny (4 layers) on pp 2, v 2: one layer per chunk; rank 1's warm-up is (v - 1) * p = 2
    # forwards. With m = 2 micro-batches (4 chunk-micro-batches > 2) the steady state runs 2 backwards, both of the
    # last chunk: 1 of 2 chunks' gradients at the peak, 4 B x half the rank's parameters. With m = 4 (8 - 2 = 6
    # backwards, 2 chunks reached) all of them.
    from shardwise.planner.job import make_job
    job = make_job(load_model("tiny"), load_cluster("dgx-a100-80gb"), 8, 64, "torchtitan")
    lay = Layout(dp=2, pp=2, vpp=2, schedule="interleaved-1f1b", micro_batch=2, zero=2)
    params = rank_params(job, lay, 1)
    assert rank_memory(job, lay, 1)["gradients"] == pytest.approx(4 * params / 2)
    assert rank_memory(job, lay.with_(micro_batch=1), 1)["gradients"] == pytest.approx(4 * params)


def _mlp_saved_f_wide(forward) -> int:
    """f-wide tensors autograd keeps for backward when `forward` runs a gated MLP of width f on 8 tokens (shardwise's own
    saved-tensor counter, the one `validate` measures with: parameters and their views are not counted)."""
    import torch
    from torch import nn
    from shardwise.validate.saved_bytes import SavedBytes
    torch.manual_seed(0)
    h, f, tokens = 16, 48, 8
    w1, w3 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
    w13 = nn.Linear(h, 2 * f, bias=False)
    w2 = nn.Linear(f, h, bias=False)
    x = torch.randn(tokens, h, requires_grad=True)
    counter = SavedBytes([w1, w3, w13, w2])
    with counter.hooks(0):
        forward(x, w1, w3, w13, w2)
    saved = counter.held[0] - x.numel() * x.element_size()  # the block's input, kept by the first linear(s)
    assert saved % (tokens * f * 4) == 0
    return saved // (tokens * f * 4)


def test_gated_mlp_tensors_each_profile_counts_are_what_autograd_keeps():
    # What a stack's SwiGLU keeps decides its activation memory (f is 3.5 h for Llama): counted here from autograd
    # itself, not from the planner. torchtitan's FeedForward, w2(F.silu(w1(x)) * w3(x)), and nanotron's GLUActivation,
    # silu(gate) * up on a split of one fused gate_up GEMM, eager: 4 (the product's backward keeps silu(gate) too).
    # Megatron's fused swiglu (an autograd.Function keeping only its input, the fused GEMM's output, 2f) before FC2
    # (its input, f): 3.
    import torch
    import torch.nn.functional as F
    from shardwise.planner.frameworks import get
    from shardwise.planner.job import make_job

    class MegatronSwiGLU(torch.autograd.Function):  # megatron/core/fusions/fused_bias_swiglu.py SwiGLUFunction's saves
        @staticmethod
        def forward(ctx, y):
            ctx.save_for_backward(y)
            gate, up = y.chunk(2, -1)
            return F.silu(gate) * up

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            with torch.enable_grad():
                y = y.detach().requires_grad_()
                gate, up = y.chunk(2, -1)
                (F.silu(gate) * up).backward(grad)
            return y.grad

    def glu_activation(merged):  # nanotron's GLUActivation.forward
        gate, up = torch.split(merged, merged.shape[-1] // 2, dim=-1)
        return F.silu(gate) * up

    torchtitan = _mlp_saved_f_wide(lambda x, w1, w3, w13, w2: w2(F.silu(w1(x)) * w3(x)))
    nanotron = _mlp_saved_f_wide(lambda x, w1, w3, w13, w2: w2(glu_activation(w13(x))))
    megatron = _mlp_saved_f_wide(lambda x, w1, w3, w13, w2: w2(MegatronSwiGLU.apply(w13(x))))
    assert (torchtitan, nanotron, megatron) == (4, 4, 3)
    assert get("torchtitan").glu_tensors == torchtitan and get("nanotron").glu_tensors == nanotron
    assert get("fms-fsdp").glu_tensors == 4  # foundation-model-stack's GatedLinearUnit, eager: a(w1(x)) * wg(x)
    assert get("lit-gpt").glu_tensors == 2  # xformers' fused SwiGLU keeps x, x1, x2 (xformers/ops/swiglu_op.py)
    assert get("megatron-core").glu_tensors == get("nemo").glu_tensors == megatron
    llama = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100-80gb")
    eager, compiled = (make_job(llama, cluster, 64, 4096, "torchtitan", compile=c).saved.gated_mlp_tensors for c in (False, True))
    assert (eager, compiled) == (4, 2)
    assert make_job(llama, cluster, 64, 4096, "megatron-core").saved.gated_mlp_tensors == 3
    # and the estimate says what it counted
    from shardwise.planner.estimate import estimate
    layout = Layout(dp=8, tp=1, pp=1, micro_batch=1, zero=3)
    notes = estimate(make_job(llama, cluster, 64, 4096, "torchtitan"), layout).assumptions
    assert notes["loss"] == "eager" and notes["kept_for_backward"] == {
        "gated_mlp_tensors": 4, "norm_fp32_copies": True, "loss_bytes_per_logit": 12}


def test_eager_rmsnorm_keeps_what_autograd_keeps():
    # torchtitan's RMSNorm as eager PyTorch (models/norms.py, 2024: `self._norm(x.float()).type_as(x) * self.weight`,
    # `_norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`), on BF16 activations: what autograd keeps per
    # token, counted with validate's counter, is what the planner charges a torchtitan norm (its FP32 input, 1/rms, the
    # BF16 normalised output), and a compiled or fused stack's norm keeps its input only (Korthikanti et al.'s e·h).
    import torch
    from torch import nn
    from shardwise.planner.job import make_job
    from shardwise.planner.memory import norm_bytes
    from shardwise.validate.saved_bytes import SavedBytes
    h, tokens = 32, 8
    weight = nn.Parameter(torch.ones(h, dtype=torch.bfloat16))
    x = torch.randn(tokens, h, dtype=torch.bfloat16, requires_grad=True)
    counter = SavedBytes([])
    with counter.hooks(0):
        xf = x.float()
        normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x)
        normed * weight
    llama = replace(load_model("llama3-8b"), hidden=h)
    cluster = load_cluster("dgx-h100-80gb")
    eager = make_job(llama, cluster, 8, 128, "torchtitan").saved
    assert counter.held[0] / tokens == norm_bytes(llama, 2, eager) == 4 * h + 2 * h + 4
    for fused in (make_job(llama, cluster, 8, 128, "torchtitan", compile=True).saved,
                  make_job(llama, cluster, 8, 128, "megatron-core").saved):
        assert norm_bytes(llama, 2, fused) == 2 * h


def test_a_recomputed_layer_and_the_logits_are_not_held_at_once():
    # The loss's backward frees its micro-batch's logits before the first layer is recomputed, so the last stage's peak
    # holds the larger of the two. Megatron-LM 2021 (materialised softmax, dropout; logits 2 + 4 B an element), pp 1:
    from shardwise.planner.job import make_job
    cluster = load_cluster("dgx-a100-80gb")
    # GPT-3 175B, s 2048, b 1: 96 checkpoints of 2 s b h = 4,831,838,208 B, and the recomputed layer's (34 - 2) s b h +
    # 5 a s^2 b = 805,306,368 + 2,013,265,920 = 2,818,572,288 B, above the logits' 2048 x 50,257 x 6 = 617,558,016 B.
    gpt3 = rank_memory(make_job(load_model("gpt3-175b"), cluster, 8, 2048, "megatron-2021"),
                       Layout(dp=8, micro_batch=1, recompute="full"), 0)
    assert gpt3["activations"] + gpt3["logits"] == 4_831_838_208 + 2_818_572_288
    # GPT-2 small, s 1024: 12 checkpoints of 2 s b h = 18,874,368 B; the recomputed layer's 32 x 786,432 + 5 x 12 x
    # 1024^2 = 88,080,384 B is below the logits' 1024 x 50,257 x 6 = 308,779,008 B.
    gpt2 = rank_memory(make_job(load_model("gpt2"), cluster, 8, 1024, "megatron-2021"),
                       Layout(dp=8, micro_batch=1, recompute="full"), 0)
    assert gpt2["activations"] + gpt2["logits"] == 18_874_368 + 308_779_008


@pytest.mark.parametrize("name", sorted(__import__("shardwise.planner.frameworks", fromlist=["FRAMEWORKS"]).FRAMEWORKS))
def test_zero_2_never_holds_more_than_zero_1_under_any_stack(name):
    # Sharding the gradients too can only take memory away, under a pipeline and with context parallelism as well
    # (an FSDP2 stack's parameter shard is the optimizer's FP32 master, not a BF16 copy beside it).
    from shardwise.planner.frameworks import get
    from shardwise.planner.job import make_job
    fw, model = get(name), load_model("llama3-8b")
    job = make_job(model, load_cluster("dgx-h100-80gb"), 32, 4096, name)
    for pp in (1, 2, 4):
        for cp in (1, 2):
            lay = Layout(dp=4, tp=2, pp=pp, cp=cp, micro_batch=1)
            one, two = lay.with_(zero=1), lay.with_(zero=2)
            if fw.refusal(one, model.num_layers, 8) or fw.refusal(two, model.num_layers, 8):
                continue
            assert _worst(job, two) <= _worst(job, one) * (1 + 1e-9), (pp, cp)


def test_deepspeed_zero_3_gathers_one_submodule_at_a_time():
    # DeepSpeed's ZeRO-3 gathers each linear by its own hook and keeps at most stage3_max_live_parameters (1e9 by
    # default) gathered; FSDP gathers a layer and prefetches the next. GPT-3 175B over 128 ranks, tp 1: a layer is
    # 12 h^2 = 1.81e9 parameters, its largest linear (FC1, 4 h^2 = 6.04e8) and the embedding (50,257 x 12,288 = 6.18e8)
    # below the cap, so DeepSpeed holds 1e9 gathered (2e9 B) beside its own 2-byte shard of the 1.75e11 parameters.
    from shardwise.planner.job import make_job
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb")
    lay = Layout(dp=128, micro_batch=1, zero=3, recompute="full")
    ds = rank_memory(make_job(model, cluster, 128, 1024, "deepspeed"), lay, 0)
    params = rank_params(make_job(model, cluster, 128, 1024, "deepspeed"), lay, 0)
    assert ds["weights"] == pytest.approx(2 * 1e9 + 2 * params / 128)
    titan = rank_memory(make_job(model, cluster, 128, 1024, "torchtitan"), lay, 0)
    assert titan["weights"] > 2 * 2 * 12 * 12288**2  # two whole layers and the root


def test_zb_h1_keeps_the_logits_through_a_recomputed_layer():
    # ZB-H1's input-gradient pass keeps its micro-batch's graph, the logits with it, until the weight pass
    # (torch's stage_backward_input), so on the last rank a recomputed layer's working set adds to the logits; only the
    # loss's scratch has gone. Under 1F1B the same layout holds the larger of the two (GPT-3 175B: the recomputed layer's
    # working set is above its logits and their scratch, so the overlap is all of those).
    from shardwise.planner.job import make_job
    from shardwise.planner.memory import last_stage_bytes, logits_overlap, loss_transient_bytes
    job = make_job(load_model("gpt3-175b"), load_cluster("dgx-a100-80gb"), 16, 2048, "shardwise")
    lay = Layout(dp=1, tp=8, pp=2, micro_batch=1, recompute="full")
    zb, one = logits_overlap(job, lay.with_(schedule="zb-h1"), 1), logits_overlap(job, lay, 1)
    assert one == last_stage_bytes(job, lay) + loss_transient_bytes(job, lay)
    assert zb == loss_transient_bytes(job, lay) < one
    assert logits_overlap(job, lay, 0) == 0.0  # the first rank has no logits
