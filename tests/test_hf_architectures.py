"""The config.json of the architectures published training runs used (OPT, BLOOM, MPT, GPT-NeoX/Pythia, Falcon, GPT-J,
StarCoder, Mistral, Qwen2/3, Gemma 1/2/3, OLMo 1/2, Phi-3, Phi-3.5-MoE, StarCoder2, Kimi K2, GPT-OSS, Granite, Cohere,
StableLM, DeepSeek-MoE), read from their own keys: each
real config (trimmed to the keys that matter, Hub repo in the comment) gives the parameter count its authors publish or that
transformers builds, `estimate --model config.json --json` runs on it, `train` refuses it in one line, and a config
shardwise cannot count is one line and exit 2."""

from __future__ import annotations

import dataclasses
import json

import pytest

from shardwise.cli import main
from shardwise.errors import UsageError
from shardwise.specs import load_model, model_from_hf_config

# (config.json trimmed, parameters). The count is transformers' own (AutoModelForCausalLM.from_config on the meta
# device, transformers 5.24; test_counts_equal_what_transformers_builds recomputes it where transformers is
# installed), or the authors' where they publish an exact figure (said so).
ARCHITECTURES = {
    # bigscience/bloom. Model card: "176,247,271,424 parameters"
    "bloom-176b": ({"model_type": "bloom", "hidden_size": 14336, "n_head": 112, "n_layer": 70, "vocab_size": 250880,
                    "layer_norm_epsilon": 1e-05, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                    "apply_residual_connection_post_layernorm": False, "pretraining_tp": 4}, 176_247_271_424),
    # facebook/opt-66b's keys at metaseq's OPT-175B sizes (OPT paper Table 1: 96 layers, 96 heads, d_model 12288)
    "opt-175b": ({"model_type": "opt", "hidden_size": 12288, "ffn_dim": 49152, "num_hidden_layers": 96,
                  "num_attention_heads": 96, "vocab_size": 50272, "max_position_embeddings": 2048,
                  "word_embed_proj_dim": 12288, "do_layer_norm_before": True, "activation_function": "relu",
                  "dropout": 0.1, "attention_dropout": 0.0, "enable_bias": True}, 174_604_468_224),
    # mosaicml/mpt-7b. By hand: 32 x (12 x 4096^2 + 2 x 4096 norm weights, no biases) + 50432 x 4096 (tied) + 4096
    "mpt-7b": ({"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "expansion_ratio": 4,
                "max_seq_len": 2048, "vocab_size": 50432, "no_bias": True, "learned_pos_emb": True, "resid_pdrop": 0.0,
                "emb_pdrop": 0.0, "attn_config": {"alibi": True, "attn_type": "multihead_attention", "attn_pdrop": 0.0,
                                                  "qk_ln": False, "clip_qkv": None}}, 6_649_286_656),
    # mosaicml/mpt-30b (model card: 29.95B)
    "mpt-30b": ({"model_type": "mpt", "d_model": 7168, "n_heads": 64, "n_layers": 48, "expansion_ratio": 4,
                 "max_seq_len": 8192, "vocab_size": 50432, "no_bias": True,
                 "attn_config": {"alibi": True, "attn_type": "multihead_attention"}}, 29_957_200_896),
    # EleutherAI/gpt-neox-20b. Black et al. 2022 (GPT-NeoX-20B paper): 20,554,567,680 parameters
    "gpt-neox-20b": ({"model_type": "gpt_neox", "hidden_size": 6144, "intermediate_size": 24576,
                      "num_attention_heads": 64, "num_hidden_layers": 44, "vocab_size": 50432,
                      "max_position_embeddings": 2048, "rotary_pct": 0.25, "use_parallel_residual": True,
                      "tie_word_embeddings": False, "hidden_act": "gelu", "layer_norm_eps": 1e-05}, 20_554_567_680),
    # EleutherAI/pythia-12b. Biderman et al. 2023 (Pythia), Table 1: 11,846,072,320 parameters
    "pythia-12b": ({"model_type": "gpt_neox", "hidden_size": 5120, "intermediate_size": 20480,
                    "num_attention_heads": 40, "num_hidden_layers": 36, "vocab_size": 50688,
                    "max_position_embeddings": 2048, "rotary_pct": 0.25, "tie_word_embeddings": False}, 11_846_072_320),
    # tiiuae/falcon-40b
    "falcon-40b": ({"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128, "num_kv_heads": 8,
                    "num_hidden_layers": 60, "vocab_size": 65024, "new_decoder_architecture": True,
                    "parallel_attn": True, "bias": False, "alibi": False, "layer_norm_epsilon": 1e-05}, 41_303_293_952),
    # tiiuae/falcon-180B
    "falcon-180b": ({"model_type": "falcon", "hidden_size": 14848, "num_attention_heads": 232, "num_kv_heads": 8,
                     "num_hidden_layers": 80, "vocab_size": 65024, "new_decoder_architecture": True,
                     "parallel_attn": True, "bias": False, "alibi": False, "max_position_embeddings": 2048},
                    178_557_088_768),
    # tiiuae/falcon-7b: multi-query (one K/V head), one LayerNorm per block
    "falcon-7b": ({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
                   "vocab_size": 65024, "multi_query": True, "parallel_attn": True, "bias": False, "alibi": False},
                  6_921_720_704),
    # EleutherAI/gpt-j-6b (its card's 6,053,381,344 is mesh-transformer-jax's count; transformers' GPTJForCausalLM,
    # what the config describes, holds 6,050,882,784)
    "gpt-j-6b": ({"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28, "n_positions": 2048,
                  "rotary_dim": 64, "n_inner": None, "vocab_size": 50400, "activation_function": "gelu_new",
                  "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": False},
                 6_050_882_784),
    # bigcode/starcoder (model_type gpt_bigcode; model card: 15.5B)
    "starcoder": ({"model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48, "n_layer": 40, "n_inner": 24576,
                   "n_positions": 8192, "vocab_size": 49152, "multi_query": True,
                   "activation_function": "gelu_pytorch_tanh"}, 15_517_456_384),
    # mistralai/Mistral-7B-v0.1
    "mistral-7b": ({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
                    "max_position_embeddings": 32768, "sliding_window": 4096, "rope_theta": 10000.0,
                    "rms_norm_eps": 1e-05, "tie_word_embeddings": False}, 7_241_732_096),
    # Qwen/Qwen2-7B
    "qwen2-7b": ({"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
                  "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
                  "max_position_embeddings": 131072, "rope_theta": 1000000.0, "tie_word_embeddings": False},
                 7_615_616_512),
    # Qwen/Qwen2.5-0.5B: tied embeddings
    "qwen2.5-0.5b": ({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
                      "num_key_value_heads": 2, "num_hidden_layers": 24, "vocab_size": 151936,
                      "max_position_embeddings": 32768, "tie_word_embeddings": True}, 494_032_768),
    # Qwen/Qwen3-8B
    "qwen3-8b": ({"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
                  "head_dim": 128, "num_key_value_heads": 8, "num_hidden_layers": 36, "vocab_size": 151936,
                  "max_position_embeddings": 40960, "attention_bias": False, "tie_word_embeddings": False},
                 8_190_735_360),
    # google/gemma-7b (no tie_word_embeddings key: Gemma ties by default)
    "gemma-7b": ({"model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576, "num_attention_heads": 16,
                  "head_dim": 256, "num_key_value_heads": 16, "num_hidden_layers": 28, "vocab_size": 256000,
                  "max_position_embeddings": 8192, "hidden_act": "gelu", "rms_norm_eps": 1e-06}, 8_537_680_896),
    # google/gemma-2-9b
    "gemma-2-9b": ({"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
                    "num_attention_heads": 16, "head_dim": 256, "num_key_value_heads": 8, "num_hidden_layers": 42,
                    "vocab_size": 256000, "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh",
                    "sliding_window": 4096}, 9_241_705_984),
    # allenai/OLMo-7B-hf
    "olmo-7b": ({"model_type": "olmo", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                 "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 50304,
                 "max_position_embeddings": 2048, "attention_bias": False, "tie_word_embeddings": False}, 6_888_095_744),
    # allenai/OLMo-2-1124-7B
    "olmo2-7b": ({"model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                  "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 100352,
                  "max_position_embeddings": 4096, "rope_theta": 500000, "tie_word_embeddings": False}, 7_298_617_344),
    # microsoft/Phi-3-mini-4k-instruct
    "phi3-mini": ({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32,
                   "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32064,
                   "max_position_embeddings": 4096, "tie_word_embeddings": False}, 3_821_079_552),
    # bigcode/starcoder2-15b
    "starcoder2-15b": ({"model_type": "starcoder2", "hidden_size": 6144, "intermediate_size": 24576,
                        "num_attention_heads": 48, "num_key_value_heads": 4, "num_hidden_layers": 40,
                        "vocab_size": 49152, "max_position_embeddings": 16384, "use_bias": True,
                        "hidden_act": "gelu_pytorch_tanh", "norm_epsilon": 1e-05}, 15_655_899_136),
    # moonshotai/Kimi-K2-Base: DeepSeek-V3's architecture under model_type kimi_k2 (model card: 1T total, 32B active)
    "kimi-k2": ({"model_type": "kimi_k2", "hidden_size": 7168, "intermediate_size": 18432,
                 "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
                 "num_key_value_heads": 64, "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8,
                 "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
                 "norm_topk_prob": True, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid",
                 "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                 "v_head_dim": 128, "vocab_size": 163840, "max_position_embeddings": 131072, "rope_theta": 50000.0,
                 "tie_word_embeddings": False}, 1_026_408_209_408),
    # openai/gpt-oss-120b (model card: 117B parameters): biases on attention, experts and router, attention sinks
    "gpt-oss-120b": ({"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
                      "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 128,
                      "num_experts_per_tok": 4, "vocab_size": 201088, "max_position_embeddings": 131072,
                      "sliding_window": 128, "swiglu_limit": 7.0, "rope_theta": 150000, "attention_bias": True,
                      "tie_word_embeddings": False, "router_aux_loss_coef": 0.9,
                      "layer_types": ["sliding_attention", "full_attention"] * 18}, 116_829_156_672),
    # google/gemma-3-1b-it (model_type gemma3_text): QK-norm per head, no soft-caps (null), a 512-token window on 5 of
    # every 6 layers (sliding_window_pattern; no layer_types key)
    "gemma-3-1b": ({"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
                    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "num_hidden_layers": 26,
                    "vocab_size": 262144, "max_position_embeddings": 32768, "hidden_activation": "gelu_pytorch_tanh",
                    "query_pre_attn_scalar": 256, "attn_logit_softcapping": None, "final_logit_softcapping": None,
                    "sliding_window": 512, "sliding_window_pattern": 6, "rope_theta": 1000000,
                    "rope_local_base_freq": 10000, "rms_norm_eps": 1e-06, "attention_bias": False}, 999_885_952),
    # ibm-granite/granite-3.0-8b-base: Llama's blocks, four scalar multipliers (no parameters), tied
    "granite-3.0-8b": ({"model_type": "granite", "hidden_size": 4096, "intermediate_size": 12800,
                        "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
                        "vocab_size": 49155, "max_position_embeddings": 4096, "tie_word_embeddings": True,
                        "attention_bias": False, "mlp_bias": False, "embedding_multiplier": 12.0,
                        "logits_scaling": 16.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0078125,
                        "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 10000.0}, 8_170_848_256),
    # CohereForAI/c4ai-command-r-v01: a parallel block after one bias-free LayerNorm, tied head
    "command-r-35b": ({"model_type": "cohere", "hidden_size": 8192, "intermediate_size": 22528,
                       "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": 64,
                       "vocab_size": 256000, "max_position_embeddings": 8192, "logit_scale": 0.0625,
                       "use_qk_norm": False, "layer_norm_eps": 1e-05, "hidden_act": "silu",
                       "rope_theta": 8000000.0}, 34_980_831_232),
    # CohereForAI/aya-23-8B
    "aya-23-8b": ({"model_type": "cohere", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 256000,
                   "max_position_embeddings": 8192, "logit_scale": 0.0625, "use_qk_norm": False,
                   "attention_bias": False, "layer_norm_eps": 1e-05, "hidden_act": "silu", "rope_theta": 10000},
                  8_028_033_024),
    # CohereForAI/c4ai-command-r-plus: use_qk_norm, a LayerNorm weight per head on q and on k
    "command-r-plus": ({"model_type": "cohere", "hidden_size": 12288, "intermediate_size": 33792,
                        "num_hidden_layers": 64, "num_attention_heads": 96, "num_key_value_heads": 8,
                        "vocab_size": 256000, "max_position_embeddings": 8192, "logit_scale": 0.8333333333333334,
                        "use_qk_norm": True, "layer_norm_eps": 1e-05, "hidden_act": "silu",
                        "rope_theta": 75000000.0}, 103_810_674_688),
    # stabilityai/stablelm-3b-4e1t: LayerNorm with bias, rotary on a quarter of each head, untied
    "stablelm-3b": ({"model_type": "stablelm", "hidden_size": 2560, "intermediate_size": 6912,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                     "vocab_size": 50304, "max_position_embeddings": 4096, "partial_rotary_factor": 0.25,
                     "layer_norm_eps": 1e-05, "use_qkv_bias": False, "tie_word_embeddings": False,
                     "hidden_act": "silu", "rope_theta": 10000}, 2_795_443_200),
    # stabilityai/stablelm-2-1_6b: biases on q, k and v (use_qkv_bias)
    "stablelm-2-1.6b": ({"model_type": "stablelm", "hidden_size": 2048, "intermediate_size": 5632,
                         "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 32,
                         "vocab_size": 100352, "max_position_embeddings": 4096, "partial_rotary_factor": 0.25,
                         "use_qkv_bias": True, "tie_word_embeddings": False, "layer_norm_eps": 1e-05,
                         "hidden_act": "silu", "rope_theta": 10000}, 1_644_515_328),
    # stabilityai/stablelm-2-12b: per-head LayerNorms on q and k, attention and MLP in parallel after one LayerNorm
    "stablelm-2-12b": ({"model_type": "stablelm", "hidden_size": 5120, "intermediate_size": 13824,
                        "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
                        "vocab_size": 100352, "max_position_embeddings": 4096, "partial_rotary_factor": 0.25,
                        "use_qkv_bias": False, "qk_layernorm": True, "use_parallel_residual": True,
                        "tie_word_embeddings": False, "layer_norm_eps": 1e-05, "hidden_act": "silu",
                        "rope_theta": 10000}, 12_143_185_920),
    # microsoft/Phi-3.5-MoE-instruct (model card: 42B total, 6.6B active): LayerNorm with bias, attention and LM-head
    # biases
    "phi-3.5-moe": ({"model_type": "phimoe", "hidden_size": 4096, "intermediate_size": 6400, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 16,
                     "num_experts_per_tok": 2, "vocab_size": 32064, "max_position_embeddings": 131072,
                     "sliding_window": 131072, "attention_bias": True, "lm_head_bias": True,
                     "tie_word_embeddings": False, "hidden_act": "silu", "rms_norm_eps": 1e-05}, 41_873_153_344),
}
TRANSFORMERS_TYPE = {"kimi_k2": "deepseek_v3"}  # transformers builds Kimi K2 as DeepseekV3ForCausalLM

# Remote-code architectures (their modeling files ship with the checkpoints, not with transformers): the configs as
# published and the parameter counts of their safetensors indexes (total_size in bytes of bf16 / 2).
REMOTE_CODE = {
    # Qwen/Qwen-7B: 15,442,649,088 bytes; intermediate_size counts both SwiGLU input branches
    "qwen-7b": ({"model_type": "qwen", "hidden_size": 4096, "intermediate_size": 22016, "num_attention_heads": 32,
                 "num_hidden_layers": 32, "vocab_size": 151936, "kv_channels": 128, "seq_length": 8192,
                 "max_position_embeddings": 32768, "layer_norm_epsilon": 1e-6, "no_bias": True,
                 "tie_word_embeddings": False}, 7_721_324_544),
    # internlm/internlm2-7b: 15,475,417,088 bytes
    "internlm2-7b": ({"model_type": "internlm2", "hidden_size": 4096, "intermediate_size": 14336,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 92544,
                      "max_position_embeddings": 32768, "bias": False, "rope_theta": 1000000,
                      "tie_word_embeddings": False}, 7_737_708_544),
    # THUDM/chatglm2-6b (keys of its own): 6,243,584,000 parameters, two K/V groups, a bias on q/k/v only
    "chatglm2-6b": ({"model_type": "chatglm", "hidden_size": 4096, "ffn_hidden_size": 13696, "num_layers": 28,
                     "num_attention_heads": 32, "multi_query_attention": True, "multi_query_group_num": 2,
                     "kv_channels": 128, "padded_vocab_size": 65024, "seq_length": 32768, "add_bias_linear": False,
                     "add_qkv_bias": True, "rmsnorm": True, "layernorm_epsilon": 1e-5}, 6_243_584_000),
}


@pytest.mark.parametrize("name", REMOTE_CODE)
def test_remote_code_configs_give_the_published_parameter_count_and_plan(name, tmp_path, capsys):
    cfg, params = REMOTE_CODE[name]
    assert model_from_hf_config(cfg, name, "test").num_params() == params
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["estimate", "--model", str(path), "--cluster", "dgx-a100-80gb", "--gpus", "16", "--global-batch",
                 "64", "--seq-len", "2048", "--tp", "2", "--micro-batch", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_params"] == params


def test_baichuan_is_llama_with_its_q_k_v_fused():
    """Baichuan 2's W_pack holds q, k and v in one matrix: the count and the estimate of Llama's keys at its shapes
    (baichuan-inc/Baichuan2-7B-Base's config), its trained length read from model_max_length."""
    shapes = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
              "vocab_size": 125696, "tie_word_embeddings": False}
    baichuan = model_from_hf_config(shapes | {"model_type": "baichuan", "model_max_length": 4096}, "b", "test")
    llama = model_from_hf_config(shapes | {"model_type": "llama", "max_position_embeddings": 4096}, "b", "test")
    assert baichuan.num_params() == llama.num_params() and baichuan.max_positions == 4096


def test_internlm_v1_biases_q_k_v_and_o():
    """InternLM (v1) puts a bias on each of q, k, v and o unless its config says `bias` false: 4 x hidden a layer."""
    cfg = {"model_type": "internlm", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
           "num_hidden_layers": 32, "vocab_size": 103168, "max_position_embeddings": 2048}
    with_bias, without = (model_from_hf_config(c, "internlm", "test") for c in (cfg, cfg | {"bias": False}))
    assert with_bias.num_params() - without.num_params() == 32 * 4 * 4096


# deepseek-ai/deepseek-moe-16b-base (remote code, no transformers class): 64 routed experts of width 1408, 2 shared, the
# first layer dense. Its card: 16.4B parameters, 2.8B activated; by hand, layer 0 (4 x 2048^2 + 3 x 2048 x 10944
# + 2 norms) + 27 MoE layers (4 x 2048^2 + 64 x 3 x 2048 x 1408 + 3 x 2048 x 2816 + a 64 x 2048 router + 2 norms)
# + 2 x 102400 x 2048 + the final norm = 16,375,728,128
DEEPSEEK_MOE_16B = {"model_type": "deepseek", "hidden_size": 2048, "intermediate_size": 10944,
                    "moe_intermediate_size": 1408, "num_hidden_layers": 28, "num_attention_heads": 16,
                    "num_key_value_heads": 16, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
                    "first_k_dense_replace": 1, "moe_layer_freq": 1, "norm_topk_prob": False, "scoring_func": "softmax",
                    "vocab_size": 102400, "max_position_embeddings": 4096, "attention_bias": False,
                    "rms_norm_eps": 1e-06, "rope_theta": 10000, "tie_word_embeddings": False}


def test_deepseek_moe_v1_is_deepseek_v2s_moe_with_llama_attention():
    spec = model_from_hf_config(DEEPSEEK_MOE_16B, "deepseek-moe-16b", "test")
    assert spec.num_params() == 16_375_728_128 and spec.active_params() == 2_828_650_496
    assert spec.attention == "gqa" and spec.moe_layers == tuple(range(1, 28)) and spec.shared_ffn_hidden == 2 * 1408
    with pytest.raises(UsageError, match="leaves out 'moe_intermediate_size' .transformers would fill in 1407"):
        model_from_hf_config({k: v for k, v in DEEPSEEK_MOE_16B.items() if k != "moe_intermediate_size"}, "d", "test")


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_real_configs_give_the_published_parameter_count(name):
    cfg, params = ARCHITECTURES[name]
    assert model_from_hf_config(cfg, name, "test").num_params() == params


def _transformers_count(cfg: dict) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
    if cfg["model_type"] == "mpt":  # MptAttentionConfig types attn_pdrop as an integer
        kwargs["attn_config"] = {k: v for k, v in cfg["attn_config"].items() if k != "attn_pdrop"}
    config = transformers.AutoConfig.for_model(TRANSFORMERS_TYPE.get(cfg["model_type"], cfg["model_type"]), **kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_counts_equal_what_transformers_builds(name):
    cfg, _ = ARCHITECTURES[name]
    assert model_from_hf_config(cfg, name, "test").num_params() == _transformers_count(cfg)


def test_llama_attention_and_mlp_biases_are_counted():
    # LlamaConfig's attention_bias (q, k, v, o) and mlp_bias (gate, up, down), read by every Llama-keyed architecture
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
    plain = model_from_hf_config(cfg, "plain", "test").num_params()
    both = model_from_hf_config(cfg | {"attention_bias": True, "mlp_bias": True}, "b", "test").num_params()
    # per layer: q 64 + k 32 + v 32 + o 64, and gate 128 + up 128 + down 64
    assert both - plain == 2 * ((64 + 32 + 32 + 64) + (128 + 128 + 64))
    assert both == _transformers_count(cfg | {"attention_bias": True, "mlp_bias": True})


def test_falcons_first_key_spellings_read_as_the_later_ones():
    """Falcon's first configs (RWConfig, 2023, the checkpoints' remote-code configuration_RW.py) wrote n_head, n_layer
    and n_head_kv for num_attention_heads, num_hidden_layers and num_kv_heads: the same model either way."""
    later = ARCHITECTURES["falcon-40b"][0]
    renamed = {"num_attention_heads": "n_head", "num_hidden_layers": "n_layer", "num_kv_heads": "n_head_kv"}
    first = {renamed.get(k, k): v for k, v in later.items()}
    spec = model_from_hf_config(first, "falcon-40b", "test")
    assert spec.num_params() == ARCHITECTURES["falcon-40b"][1] and spec.num_kv_heads == 8 and spec.num_layers == 60


def test_what_each_architecture_holds():
    spec = {name: model_from_hf_config(cfg, name, "test") for name, (cfg, _) in ARCHITECTURES.items()}
    assert spec["starcoder"].num_kv_heads == 1 and spec["falcon-7b"].num_kv_heads == 1  # multi-query
    assert spec["falcon-40b"].num_kv_heads == 8 and spec["falcon-40b"].layer_norms == 2
    assert spec["bloom-176b"].ffn_hidden == 4 * 14336 and not spec["bloom-176b"].learned_positions
    assert spec["opt-175b"].mlp == "relu" and spec["opt-175b"].trains_with_dropout  # OPT: dropout 0.1
    assert not spec["mpt-7b"].trains_with_dropout and not spec["mpt-7b"].has_bias
    assert spec["gemma-7b"].gated_mlp and spec["gemma-7b"].head_dim == 256 and spec["gemma-7b"].tie_embeddings
    assert not spec["gpt-neox-20b"].tie_embeddings and spec["gpt-neox-20b"].rotary
    assert not spec["starcoder2-15b"].gated_mlp and spec["starcoder2-15b"].has_bias
    assert spec["kimi-k2"].attention == "mla" and spec["kimi-k2"].router_scoring == "sigmoid"
    assert spec["kimi-k2"].active_params() == 32_861_477_888  # the card's "32B activated"
    # Gemma 3: QK-norm over head_dim, no soft-caps, the window on 22 of 26 layers (the 6th, 12th, ... global)
    gemma3 = spec["gemma-3-1b"]
    assert gemma3.qk_norm == "head" and gemma3.layer_norms == 4 and gemma3.tie_embeddings
    assert (gemma3.attn_softcap, gemma3.final_softcap, gemma3.sliding_window, gemma3.window_layers) == (0, 0, 512, 22)
    assert spec["granite-3.0-8b"].tie_embeddings and not spec["granite-3.0-8b"].parallel_residual
    for name in ("command-r-35b", "command-r-plus", "stablelm-2-12b"):  # one norm before attention and MLP side by side
        assert spec[name].parallel_residual and spec[name].layer_norms == 1
    assert spec["command-r-35b"].norm_kind == "layernorm-nobias" and spec["command-r-35b"].tie_embeddings
    assert spec["command-r-plus"].qk_norm == "full" and spec["stablelm-2-12b"].qk_norm == "full"
    assert spec["stablelm-3b"].norm_kind == "layernorm" and not spec["stablelm-3b"].parallel_residual
    assert spec["stablelm-2-1.6b"].qkv_bias and not spec["stablelm-2-1.6b"].attention_bias
    phimoe = spec["phi-3.5-moe"]
    assert phimoe.norm_kind == "layernorm" and phimoe.attention_bias and phimoe.head_bias and not phimoe.ffn_bias
    assert phimoe.active_params() == 6_640_999_744  # the card's "6.6B active parameters"


ESTIMATE = ["--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "64", "--seq-len", "2048",
            "--micro-batch", "1", "--json"]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_estimate_runs_on_each_config_file(name, tmp_path, capsys):
    cfg, params = ARCHITECTURES[name]
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    assert main(["estimate", "--model", str(path), *ESTIMATE]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total_params"] == params and out["step_time_s"] > 0


TINY_BLOOM = {"model_type": "bloom", "hidden_size": 64, "n_head": 4, "n_layer": 2, "vocab_size": 128}


def test_train_refuses_an_architecture_it_does_not_build(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_BLOOM))
    assert main(["train", "--model", str(path), "--steps", "1", "--seq-len", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert "uses bloom's blocks, which shardwise's runtime does not implement" in err and "\n" not in err


TINY_LLAMA_KEYS = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}
TINY_QWEN_MOE = {"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 4, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
                 "num_experts_per_tok": 2, "vocab_size": 128, "shared_expert_intermediate_size": 64}


@pytest.mark.parametrize("cfg, fragment", [
    # facebook/opt-350m: project_in/project_out around a 1024-wide model, post-LayerNorm blocks
    ({"model_type": "opt", "hidden_size": 1024, "ffn_dim": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
      "vocab_size": 50272, "word_embed_proj_dim": 512, "do_layer_norm_before": False}, "word_embed_proj_dim 512"),
    ({"model_type": "mpt", "d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 128,
      "ffn_config": {"ffn_type": "mptglu"}}, "is not MPT's GELU MLP"),
    ({k: v for k, v in TINY_BLOOM.items() if k != "hidden_size"}, "missing key 'n_embed' (or 'hidden_size')"),
    ({"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 3, "num_hidden_layers": 2,
      "vocab_size": 128, "new_decoder_architecture": True}, "not a multiple of the 3 key/value heads"),
    ({"model_type": "gptj", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 128,
      "activation_function": "swish"}, "activation_function 'swish' is not an activation"),
    ({"model_type": "t5", "d_model": 64}, "model_type 't5' is not an architecture shardwise models"),
    # Gemma 3's multimodal wrapper: its language model is gemma3_text (the vision tower is not modelled)
    ({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}}, "supported: baichuan"),
    # the new types' own keys, malformed
    ({**TINY_LLAMA_KEYS, "model_type": "granite", "logits_scaling": "16"},
     "key 'logits_scaling' must be a positive number"),
    ({**TINY_LLAMA_KEYS, "model_type": "cohere", "use_qk_norm": "false"}, "'use_qk_norm' must be true or false"),
    ({**TINY_LLAMA_KEYS, "model_type": "cohere", "logit_scale": -1}, "key 'logit_scale' must be a positive number"),
    ({**TINY_LLAMA_KEYS, "model_type": "stablelm", "use_parallel_residual": 1},
     "'use_parallel_residual' must be true or false, got 1"),
    ({**TINY_LLAMA_KEYS, "model_type": "stablelm", "layer_norm_eps": "1e-5"},
     "key 'layer_norm_eps' must be a positive"),
    ({**TINY_LLAMA_KEYS, "model_type": "gemma3_text", "sliding_window": 16, "sliding_window_pattern": 0},
     "key 'sliding_window_pattern' must be a positive integer, got 0"),
    ({**TINY_LLAMA_KEYS, "model_type": "gemma3_text", "use_bidirectional_attention": True},
     "an encoder (EmbeddingGemma)"),
    ({**TINY_LLAMA_KEYS, "model_type": "phimoe", "num_local_experts": 4, "num_experts_per_tok": 2,
      "lm_head_bias": "yes"},
     "'lm_head_bias' must be true or false"),
    ({**TINY_LLAMA_KEYS, "model_type": "phimoe"},
     "model_type phimoe is a mixture of experts, but the config gives no expert"),
    # a MoE config whose expert keys place no expert, or routing groups that cannot be
    ({**TINY_QWEN_MOE, "mlp_only_layers": [-1, 9]}, "mlp_only_layers [-1, 9] are not layers of a 2-layer model"),
    ({**TINY_QWEN_MOE, "mlp_only_layers": [0, 1]}, "but no layer is a MoE layer"),
    ({**TINY_QWEN_MOE, "n_group": 3, "topk_group": 5}, "group-limited routing needs n_group dividing the 4 experts"),
    # values of the wrong JSON type, read as something else before
    ({**TINY_QWEN_MOE, "mlp_only_layers": [True, False]}, "must be a list of layer indices, got [true, false]"),
    ({**TINY_QWEN_MOE, "norm_topk_prob": "false"}, "'norm_topk_prob' must be true or false, got \"false\""),
    # a key the family's config must state, which a trimmed config leaves out: transformers would fill in the full
    # model's default (Qwen1.5-MoE's 1,408-wide experts, DeepSeek-V3's three dense layers), not what the file meant
    ({k: v for k, v in TINY_QWEN_MOE.items() if k != "moe_intermediate_size"},
     "leaves out 'moe_intermediate_size' (transformers would fill in 1408, qwen2_moe's default"),
    ({k: v for k, v in TINY_QWEN_MOE.items() if k != "shared_expert_intermediate_size"},
     "leaves out 'shared_expert_intermediate_size' (transformers would fill in 5632"),
    ({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
      "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
      "n_shared_experts": 1, "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
      "v_head_dim": 8, "vocab_size": 128}, "leaves out 'first_k_dense_replace' (transformers would fill in 3"),
    ({"model_type": "mpt", "d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 128, "attn_config": []},
     "'attn_config' must be an object, got []"),
    # Llama 3.1's scaling written as its name alone: it was dropped, and the rope_parameters beside it with it
    ({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 128, "vocab_size": 128, "rope_scaling": "llama3",
      "rope_parameters": {"rope_type": "llama3", "factor": 8.0}},
     "key 'rope_scaling' must be an object such as {\"rope_type\": \"llama3\""),
    # no model_type, Llama-like keys, but an encoder and a decoder (BART's): not read as a decoder-only Llama
    ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 128,
      "is_encoder_decoder": True, "encoder_layers": 2, "decoder_layers": 2}, "an encoder-decoder model"),
    ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 128,
      "encoder_layers": 2, "decoder_layers": 2}, "shardwise plans decoder-only transformers"),
    # no model_type, Llama's keys, but an encoder's head or BERT's token types: not read as a decoder
    ({"architectures": ["BertForMaskedLM"], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 128, "vocab_size": 128}, "an encoder model (architectures: BertForMaskedLM)"),
    ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 128,
      "type_vocab_size": 2}, "an encoder model (type_vocab_size"),
    # MLA without a latent rank (transformers' modules would have no width), read as plain attention before
    ({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
      "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
      "n_shared_experts": 1, "first_k_dense_replace": 1, "q_lora_rank": None, "kv_lora_rank": 0,
      "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "vocab_size": 128},
     "key 'kv_lora_rank' must be a positive integer, got 0"),
    ({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
      "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
      "n_shared_experts": 1, "first_k_dense_replace": 1, "q_lora_rank": 0, "kv_lora_rank": 16,
      "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "vocab_size": 128},
     "key 'q_lora_rank' must be a positive integer, got 0"),
    # a RoPE factor that is no number (written to a launch file as it stood)
    ({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 128, "vocab_size": 128, "rope_scaling": {"rope_type": "linear", "factor": "NaN"}},
     "RoPE scaling's 'factor' must be a finite number"),
    # nor a negative one (helper-232: accepted, and written to a launch file)
    ({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 128, "vocab_size": 128, "rope_scaling": {"rope_type": "linear", "factor": -2}},
     "RoPE scaling's 'factor' must be positive"),
])
def test_a_config_shardwise_cannot_count_is_one_line_and_exit_2(cfg, fragment, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["estimate", "--model", str(path), *ESTIMATE]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err


def test_llama_keyed_architectures_round_trip_through_to_hf_config(tmp_path):
    for name in ("mistral-7b", "qwen2-7b", "qwen3-8b", "gemma-2-9b", "olmo-7b", "olmo2-7b", "phi3-mini",
                 "gemma-3-1b", "granite-3.0-8b"):
        spec = model_from_hf_config(ARCHITECTURES[name][0], name, "test")
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(spec.to_hf_config()))
        assert load_model(str(path)) == spec, name
    capped = model_from_hf_config(ARCHITECTURES["gemma-3-1b"][0] | {"attn_logit_softcapping": 50.0,
                                                                     "final_logit_softcapping": 30.0}, "g3", "test")
    path = tmp_path / "g3.json"
    path.write_text(json.dumps(capped.to_hf_config()))
    assert (capped.attn_softcap, capped.final_softcap) == (50.0, 30.0) and load_model(str(path)) == capped
    # flags Llama's keys cannot write back (Command R+'s QK-norm, StableLM 2 12B's parallel block, Phi-3.5-MoE's head
    # bias) are refused, not dropped
    for name in ("command-r-plus", "stablelm-2-12b", "stablelm-2-1.6b", "phi-3.5-moe"):
        with pytest.raises(ValueError, match="no config.json writer"):
            model_from_hf_config(ARCHITECTURES[name][0], name, "test").to_hf_config()


def test_parallel_residual_is_read_and_written_with_gpt_neox_keys(tmp_path):
    # GPT-J's blocks are always parallel; GPT-NeoX's and Falcon's say it (use_parallel_residual, parallel_attn)
    for name in ("gpt-neox-20b", "pythia-12b", "falcon-40b", "gpt-j-6b"):
        assert model_from_hf_config(ARCHITECTURES[name][0], name, "test").parallel_residual
    sequential = ARCHITECTURES["pythia-12b"][0] | {"use_parallel_residual": False}
    assert not model_from_hf_config(sequential, "neox", "test").parallel_residual
    # GPT-2's keys cannot say it: a GPT-2-style spec with a parallel residual is written as GPT-NeoX's config
    gpt2 = load_model("gpt2")
    assert not gpt2.parallel_residual
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dataclasses.replace(gpt2, parallel_residual=True).to_hf_config()))
    assert load_model(str(path)).parallel_residual


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_plan_emit_refuses_an_architecture_its_arguments_cannot_spell(target, tmp_path, capsys):
    # Mistral-7B has Llama-3-8B's widths: a torchtitan llama3 "8B" flavor or Megatron's Llama arguments would train
    # another model (no sliding window, another vocabulary), so the emitters refuse rather than write them
    path = tmp_path / "config.json"
    path.write_text(json.dumps(ARCHITECTURES["mistral-7b"][0]))
    out = tmp_path / "x"
    argv = ["plan", "--model", str(path), "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "512",
            "--seq-len", "4096", "--emit", target, "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"--emit {target}: shardwise writes" in err and "not mistral's" in err and "\n" not in err
    assert not out.exists()


@pytest.mark.parametrize("changes, seq, said", [
    ({}, 8192, "4,096-token sliding window on every layer"),
    ({}, 4096, None),  # within the window: every query sees every earlier key, nothing to say
    ({"sliding_window": None}, 8192, None),  # Mistral v0.2 on: no window
    ({"layer_types": ["sliding_attention", "full_attention"] * 16}, 8192, "on 16 of its 32 layers"),
    ({"num_nextn_predict_layers": 1}, 4096, "1 multi-token-prediction module(s)"),
    ({"model_type": "llama"}, 8192, None),  # Llama's modelling code ignores a sliding_window key
    # Qwen2's config class: off unless use_sliding_window says true, then the layers from max_window_layers on
    ({"model_type": "qwen2"}, 8192, None),
    ({"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 28}, 8192, "on 4 of its 32 layers"),
    ({"model_type": "qwen2", "use_sliding_window": True, "layer_types": ["full_attention"] * 32}, 8192, None),
])
def test_what_a_config_says_the_planner_does_not_price_is_said(changes, seq, said, tmp_path, capsys):
    """A sliding window shorter than the sequence (how it is priced: tests/test_planner_windows.py) and DeepSeek's
    multi-token prediction (not counted) are notes of estimate, plan and explain, never silent."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(ARCHITECTURES["mistral-7b"][0] | changes))
    shape = ["--model", str(path), "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "64",
             "--seq-len", str(seq), "--json"]
    assert main(["estimate", *shape, "--tp", "8", "--micro-batch", "1"]) == 0
    implied = json.loads(capsys.readouterr().out)["assumptions"]["implied"]
    for command in ("plan", "explain"):
        assert main([command, *shape]) == 0
        note = json.loads(capsys.readouterr().out).get("model_note")
        assert (note is None) if said is None else (said in note and note in implied)
    assert said is None or sum(said in line for line in implied) == 1


def test_a_config_without_model_type_is_read_as_the_architecture_it_names():
    """No model_type: `architectures` names it. An architecture shardwise does not model is refused (Cohere 2's keys
    are Llama's, so they had read as Llama with its parallel block and interleaved windows dropped); one it models is
    read as that one, not by its keys alone (OLMo 2's QK-norm had been lost as Llama's, Granite is read as granite);
    without either, the keys decide, as before."""
    llama_keys = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}
    with pytest.raises(UsageError, match="architectures Cohere2ForCausalLM is not an architecture shardwise models"):
        model_from_hf_config({**llama_keys, "architectures": ["Cohere2ForCausalLM"]}, "c", "cohere2/config.json")
    granite = model_from_hf_config({**llama_keys, "architectures": ["GraniteForCausalLM"]}, "g", "granite/config.json")
    assert granite.model_type == "granite"
    named = model_from_hf_config({**llama_keys, "architectures": ["Olmo2ForCausalLM"]}, "o", "olmo2/config.json")
    typed = model_from_hf_config({**llama_keys, "model_type": "olmo2"}, "o", "olmo2/config.json")
    assert named == typed and named.model_type == "olmo2"
    assert named.num_params() != model_from_hf_config(llama_keys, "o", "plain/config.json").num_params()  # QK-norm
    assert model_from_hf_config({**llama_keys, "architectures": ["LlamaForCausalLM"]}, "l", "l").model_type == "llama"
