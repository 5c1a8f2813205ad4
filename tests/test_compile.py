"""--compile: the blocks (and loss) under torch.compile, Inductor's fused element-wise kernels (planner/kernels.py
ELEMENTWISE "compiled", step_time.LOSS_BYTES "compiled")."""

import json

from shardwise.cli import main
from shardwise.planner import estimate, kernels
from shardwise.planner.layer_time import layer_cost
from shardwise.planner.job import make_job
from shardwise.specs import Layout, load_cluster, load_model

H100 = load_cluster("dgx-h100-80gb")
ARGS = ["--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8",
        "--seq-len", "8192"]


def test_compile_is_refused_in_one_line_by_stacks_that_cannot_use_it(capsys):
    # Megatron-Core's norms, SwiGLU and rotary are already fused kernels; this project's runtime has no compile option.
    for framework, reason in (("megatron-core", "fused kernels"), ("shardwise", "no torch.compile")):
        code = main(["estimate", *ARGS, "--micro-batch", "1", "--framework", framework, "--compile"])
        err = capsys.readouterr().err
        assert code == 2 and reason in err and "--compile" in err and len(err.strip().splitlines()) == 1
    assert main(["plan", *ARGS, "--framework", "nemo", "--compile"]) == 2
    assert main(["explain", *ARGS, "--framework", "deepspeed", "--compile"]) == 2


def test_estimate_json_says_whether_the_model_is_compiled(capsys):
    for flags, compiled in (([], False), (["--compile"], True)):
        assert main(["estimate", *ARGS, "--micro-batch", "1", "--framework", "torchtitan", "--json", *flags]) == 0
        assert json.loads(capsys.readouterr().out)["compile"] is compiled
    assert main(["plan", *ARGS, "--framework", "torchtitan", "--compile", "--json", "--top", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["best"]["compile"] is True


def test_torchaos_float8_is_compiled_unless_told_not_to(capsys):
    # torchtitan's float8 docs call compile.enable "required for competitive performance", and every published torchtitan
    # Float8 run compiled: --precision fp8 on torchtitan compiles unless --no-compile says otherwise, and says so. BF16
    # stays eager by default; --fused-norms (a preset's fused RMSNorm, eager) keeps FP8 eager too; Transformer Engine's
    # FP8 stacks refuse --compile and are never compiled behind the user's back.
    def run(*flags):
        assert main(["estimate", *ARGS, "--micro-batch", "1", "--json", *flags]) == 0
        out = json.loads(capsys.readouterr().out)
        return out["compile"], out["step_time_s"], " ".join(out["assumptions"].get("implied", []))

    fp8 = ("--framework", "torchtitan", "--precision", "fp8")
    implied, told, eager = run(*fp8), run(*fp8, "--compile"), run(*fp8, "--no-compile")
    assert implied[0] and "--compile not given" in implied[2] and implied[1] == told[1]
    assert "--compile not given" not in told[2] and not eager[0] and eager[1] > implied[1]
    assert not run("--framework", "torchtitan")[0] and not run(*fp8, "--fused-norms")[0]
    assert not run("--framework", "megatron-core", "--precision", "fp8")[0]
    assert main(["plan", *ARGS, "--framework", "torchtitan", "--precision", "fp8", "--json", "--top", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best"]["compile"] is True and "--no-compile" in out["compile_note"]


def test_compiled_element_wise_bytes_follow_inductors_fusion_rule():
    # Llama 3 8B, one token, one GPU, BF16 activations (2 B), forward. Compiled, counting each fused chain's reads and
    # writes once: norm1 reads x, writes its output (2 + 2 = 4 B per hidden element); the first residual add with norm2
    # reads x and the attention output, writes h and norm2's output (4 + 4 = 8); the last residual add reads two and
    # writes one (6): 18 B x 4096. silu(gate) * up reads two, writes one: 6 B x 14336. Rotary reads and writes Q and K:
    # 4 B x (4096 + 1024). Total 73,728 + 86,016 + 20,480 = 180,224 B.
    # Eager (torchtitan without compile): RMSNorm's composite FP32 ops 36 B each, residual adds 6 each: 84 x 4096;
    # silu then the product: 10 x 14336; rotary on complex FP32 views: 20 x 5120. 344,064 + 143,360 + 102,400 = 589,824 B.
    tokens = 1 << 20  # enough tokens that the traffic, not the kernel launches, sets the time
    rate = kernels.hbm_rate(H100)
    for mode, per_token in (("compiled", 180_224), (False, 589_824)):
        fwd, bwd = kernels.elementwise_time(H100, tokens, 4096, 14336, 4096, 1024, 1, False, True, True, 2, mode)
        assert abs(fwd * rate / tokens - per_token) < 1e-6 * per_token
        assert abs(bwd - 2 * fwd) < 1e-12


def test_compile_shortens_a_small_models_step_but_not_its_gemms_or_attention():
    model = load_model("llama3-8b")
    eager = make_job(model, H100, 8, 4096, "torchtitan")
    compiled = make_job(model, H100, 8, 4096, "torchtitan", compile=True)
    layout = Layout(dp=8, zero=3, micro_batch=1)
    a, b = layer_cost(eager, layout), layer_cost(compiled, layout)
    assert b.bwd_w == a.bwd_w and b.attn_fwd == a.attn_fwd  # weight-gradient GEMMs and the attention core as before
    # the forward drops by exactly the element-wise difference
    tokens, h, f = 4096, model.hidden, model.ffn_hidden
    el = [kernels.elementwise_time(H100, tokens, h, f, model.q_dim, model.kv_dim, 1, False, True, True, 2, mode, "llama")
          for mode in (False, "compiled")]
    assert abs((a.fwd - b.fwd) - (el[0][0] - el[1][0])) < 1e-9
    assert estimate(compiled, layout).step_time < estimate(eager, layout).step_time


def test_a_release_that_compiled_its_blocks_only_keeps_the_eager_losss_memory(capsys):
    # torchtitan until 2025-04 compiled the blocks and left the cross-entropy eager: --no-compile-loss. The eager loss
    # keeps its FP32 log-probabilities and, at the start of the backward, their gradients beside them (12 B per logit
    # element against the compiled loss's fused kernel): more memory on the last stage, and a slower loss.
    out = {}
    for flags in ([], ["--no-compile-loss"]):
        assert main(["estimate", *ARGS, "--micro-batch", "1", "--framework", "torchtitan", "--compile", "--json",
                     *flags]) == 0
        out[tuple(flags)] = json.loads(capsys.readouterr().out)
    compiled, eager = out[()], out[("--no-compile-loss",)]
    assert compiled["assumptions"]["loss"] == "compiled" and eager["assumptions"]["loss"] == "eager"
    # Llama 3 8B's 128,256 logits x 8,192 tokens: at least the FP32 log-probabilities (4 B an element) more
    assert eager["memory_gib_per_gpu"] - compiled["memory_gib_per_gpu"] > 4 * 128256 * 8192 / 2**30
    assert eager["step_time_s"] > compiled["step_time_s"]


def test_a_presets_fused_norms_are_priced_as_a_fused_kernel(capsys):
    # torchtitan's 2024 presets ran norm_type fused_rmsnorm (a Triton kernel) in an otherwise eager model: the
    # norms' composite FP32 ops (reads and writes, and the FP32 input, 1/rms and output kept) become one kernel.
    out = {}
    for flags in ([], ["--fused-norms"]):
        assert main(["estimate", *ARGS, "--micro-batch", "1", "--framework", "torchtitan", "--json", *flags]) == 0
        out[tuple(flags)] = json.loads(capsys.readouterr().out)
    eager, fused = out[()], out[("--fused-norms",)]
    assert fused["step_time_s"] < eager["step_time_s"] and fused["memory_gib_per_gpu"] < eager["memory_gib_per_gpu"]


def test_loss_and_norm_flags_that_cannot_apply_are_refused_in_one_line(capsys):
    cases = ((["--framework", "torchtitan", "--no-compile-loss"], "add --compile"),
             (["--framework", "torchtitan", "--compile-loss"], "add --compile"),
             (["--framework", "composer", "--compile", "--compile-loss"], "not the loss"),
             (["--framework", "megatron-core", "--fused-norms"], "already runs its norms"),
             (["--framework", "torchtitan", "--compile", "--fused-norms"], "Inductor fuses the norms"),
             (["--framework", "shardwise", "--fused-norms"], "PyTorch ops"))
    for flags, reason in cases:
        code = main(["estimate", *ARGS, "--micro-batch", "1", *flags])
        err = capsys.readouterr().err
        assert code == 2 and reason in err and len(err.strip().splitlines()) == 1, (flags, err)
    assert main(["plan", *ARGS, "--framework", "megatron-core", "--fused-norms"]) == 2
    assert main(["explain", *ARGS, "--framework", "torchtitan", "--no-compile-loss"]) == 2


def test_transformer_engines_attention_backend_is_a_flag(capsys):
    # NVIDIA's Nemotron-4 340B benchmark exports NVTE_FUSED_ATTN=0, so Transformer Engine runs flash-attn's
    # FlashAttention-2 where it would pick cuDNN's fused attention on Hopper: --attention-backend flash, as
    # Megatron-Core's --attention-backend names it. The kernel is what moves, nothing else.
    out = {}
    for backend in ("auto", "fused", "flash"):
        assert main(["estimate", *ARGS, "--micro-batch", "1", "--framework", "nemo", "--json",
                     "--attention-backend", backend]) == 0
        out[backend] = json.loads(capsys.readouterr().out)
    assert out["auto"]["assumptions"]["attention"] == out["fused"]["assumptions"]["attention"] == "cudnn"
    assert out["flash"]["assumptions"]["attention"] == "fa2"
    assert out["auto"]["step_time_s"] == out["fused"]["step_time_s"] != out["flash"]["step_time_s"]
    assert out["auto"]["time_breakdown_s"]["dp_comm"] == out["flash"]["time_breakdown_s"]["dp_comm"]
    a100 = [a if a != "dgx-h100-80gb" else "dgx-a100-80gb" for a in ARGS]
    cases = ((["--framework", "torchtitan", "--attention-backend", "flash"], "does not run it"),
             (["--framework", "nemo", "--attention-backend", "flash", "--no-flash-attention"], "asks for none"),
             (["--framework", "megatron-core", "--attention-backend", "fused"], "Hopper only"))
    for i, (flags, reason) in enumerate(cases):
        code = main(["estimate", *(a100 if i == 2 else ARGS), "--micro-batch", "1", *flags])
        err = capsys.readouterr().err
        assert code == 2 and reason in err and len(err.strip().splitlines()) == 1, (flags, err)
