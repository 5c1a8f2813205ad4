"""A hand-written config.json reads as transformers reads it: the parameter count of what AutoModelForCausalLM builds
from it (defaults of left-out keys, bias keys an architecture ignores or reads, Nemotron's LayerNorm bias, MLA's
biases), and a malformed value of a key the planner prices is one line, not a silent default. Found by an outside
fuzz of 33 model types (2026-12-05)."""

from __future__ import annotations

import json

import pytest

from shardwise.cli import main
from shardwise.errors import UsageError
from shardwise.model_spec import model_from_hf_config
from test_hf_architectures import _transformers_count

SHAPE = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16,
         "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 4096}
MOE = {"mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
       "gpt_oss": {"num_local_experts": 8, "num_experts_per_tok": 2, "head_dim": 64},
       "qwen3_moe": {"num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 512, "head_dim": 128},
       "qwen2_moe": {"num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 512,
                     "shared_expert_intermediate_size": 2048}}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1,
               "moe_intermediate_size": 512, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
               "kv_lora_rank": 128, "q_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
               "v_head_dim": 64, **SHAPE}


def _config(model_type: str, **changes) -> dict:
    cfg = {"model_type": model_type, **SHAPE, **MOE.get(model_type, {})}
    if model_type == "nemotron":
        cfg["hidden_act"] = "relu2"
    cfg.update(changes)
    return {k: v for k, v in cfg.items() if v is not ...}  # ... removes a key


CASES = {
    # num_key_value_heads left out: each config class's own default, not the attention heads
    **{f"{t} without num_key_value_heads": _config(t, num_key_value_heads=...)
       for t in ("mistral", "mixtral", "gpt_oss", "starcoder2", "qwen3_moe", "qwen2_moe", "gemma2", "llama")},
    "qwen2 without num_key_value_heads": _config("qwen2", num_attention_heads=32, num_key_value_heads=...),
    # bias keys an architecture builds without, and the ones it reads
    **{f"{t} with attention_bias and mlp_bias": _config(t, attention_bias=True, mlp_bias=True)
       for t in ("mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2", "olmo", "olmo2", "llama",
                 "nemotron")},
    "nemotron": _config("nemotron"),  # LayerNorm1P: a LayerNorm with a bias
    # head_dim left out: the config class's default (Qwen3 128, Gemma 256, GPT-OSS 64), not hidden / heads
    **{f"{t} without head_dim": _config(t, head_dim=...) for t in ("qwen3", "gemma", "gemma2", "gpt_oss", "mistral")},
    "deepseek_v3 with attention_bias": {**DEEPSEEK_V3, "attention_bias": True},
}


@pytest.mark.parametrize("name", CASES)
def test_a_hand_written_config_counts_what_transformers_builds(name):
    cfg = CASES[name]
    assert model_from_hf_config(cfg, name, "test").num_params() == _transformers_count(cfg)


def test_mla_ignores_num_key_value_heads():
    """MLA's keys and values are per head: DeepSeek's num_key_value_heads changes neither the count, the memory nor
    which tensor-parallel degrees divide the model."""
    one, all_ = (model_from_hf_config({**DEEPSEEK_V3, "num_key_value_heads": kv}, "ds", "test") for kv in (1, 16))
    assert one == all_ and one.num_kv_heads == 16


def test_gpt_oss_without_an_expert_count_is_refused():
    with pytest.raises(UsageError, match="mixture of experts, but the config gives no expert count"):
        model_from_hf_config(_config("gpt_oss", num_local_experts=...), "oss", "test")


@pytest.mark.parametrize("key, value", [("sliding_window", "1024"), ("sliding_window", -1), ("sliding_window", 1.5),
                                        ("sliding_window", True), ("use_sliding_window", 64),
                                        ("num_nextn_predict_layers", -1), ("num_nextn_predict_layers", "64"),
                                        ("max_window_layers", -2)])
def test_a_malformed_window_or_mtp_key_is_one_line(key, value, tmp_path, capsys):
    cfg = _config("qwen2" if key in ("use_sliding_window", "max_window_layers") else "mistral", **{key: value})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    argv = ["estimate", "--model", str(path), "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8",
            "--seq-len", "8192", "--json"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert key in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("value", [0, 64, "silu"])
def test_gemmas_activation_must_be_a_gelu(value):
    with pytest.raises(UsageError, match="hidden_activation"):
        model_from_hf_config(_config("gemma2", hidden_activation=value), "g", "test")


def test_a_null_window_is_no_window_and_a_left_out_one_the_architectures_default():
    assert model_from_hf_config(_config("mistral", sliding_window=None), "m", "t").sliding_window == 0
    assert model_from_hf_config(_config("mistral"), "m", "t").sliding_window == 4096  # MistralConfig's


@pytest.mark.parametrize("flag, name", [("--model", "config.json"), ("--cluster", "mine.toml")])
def test_a_pipe_in_place_of_a_file_is_named_as_such(flag, name, tmp_path, capsys):
    import os

    fifo = tmp_path / name
    os.mkfifo(fifo)
    args = ["estimate", "--model", "tiny", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8",
            "--seq-len", "64"]
    args[args.index(flag) + 1] = str(fifo)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "is not a regular file" in err and err.count("\n") == 1


def test_a_left_out_max_position_embeddings_reads_as_the_config_class_default():
    # What the runtime refuses past and the long-sequence note quotes: transformers' default for the type, not
    # LlamaConfig's 2,048 (a Mistral config without the key is a 131,072-position model there).
    transformers = pytest.importorskip("transformers")
    for model_type in ("llama", "mistral", "mixtral", "gpt_oss", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gemma",
                       "gemma2", "deepseek_v3", "nemotron", "phi3", "starcoder2", "olmo", "olmo2"):
        cfg = _config(model_type, max_position_embeddings=...) if model_type != "deepseek_v3" else \
            {k: v for k, v in DEEPSEEK_V3.items() if k != "max_position_embeddings"}
        want = transformers.AutoConfig.for_model(model_type).max_position_embeddings
        assert model_from_hf_config(cfg, model_type, "test").max_positions == want, model_type
