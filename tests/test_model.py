"""The runtime's model is the planner's model: same parameter count, same numbers as Hugging Face."""

import pytest
import torch

from shardwise.model import Transformer, num_parameters
from shardwise.specs import load_model, model_from_hf_config


@pytest.mark.parametrize("preset", ["tiny", "tiny-gpt2"])
def test_parameter_count_matches_spec(preset):
    spec = load_model(preset)
    assert num_parameters(Transformer(spec)) == spec.num_params()


def test_untied_llama_and_gqa_count():
    spec = model_from_hf_config({"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 3,
                                 "num_attention_heads": 6, "num_key_value_heads": 3, "vocab_size": 300,
                                 "tie_word_embeddings": True}, "t", "test")
    model = Transformer(spec)
    assert model.output.weight is model.tok_embeddings.weight
    assert num_parameters(model) == spec.num_params()


def test_same_seed_same_weights_different_seed_different():
    spec = load_model("tiny")
    a, b, c = Transformer(spec, seed=3), Transformer(spec, seed=3), Transformer(spec, seed=4)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if "norm" not in name:
            assert not torch.equal(pa, pc), name


def test_pipeline_stage_holds_the_same_weights_and_composes():
    """A stage is the same class with parts removed; chaining two stages is the full model."""
    spec = load_model("tiny-gpt2")
    full = Transformer(spec, seed=5)
    first = Transformer(spec, seed=5, layer_ids=[0, 1], last=False)
    second = Transformer(spec, seed=5, layer_ids=[2, 3], first=False)
    stage_params = dict(first.named_parameters()) | dict(second.named_parameters())
    for name, p in full.named_parameters():
        assert torch.equal(p, stage_params[name]), name
    tokens = torch.randint(0, 256, (2, 12))
    torch.testing.assert_close(second(first(tokens), tokens), full(tokens, tokens), rtol=0, atol=0)


def _copy_into_hf_llama(model, hf):
    sd = {"model.embed_tokens.weight": model.tok_embeddings.weight, "model.norm.weight": model.norm.weight,
          "lm_head.weight": model.output.weight}
    names = {"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
             "attention.wo": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
             "feed_forward.w2": "mlp.down_proj", "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    for name, p in model.layers.named_parameters():
        i, rest = name.split(".", 1)
        mod, leaf = rest.rsplit(".", 1)
        sd[f"model.layers.{i}.{names[mod]}.{leaf}"] = p
    hf.load_state_dict({k: v.detach() for k, v in sd.items()}, strict=False)


def _copy_into_hf_gpt2(model, hf):
    sd = {"transformer.wte.weight": model.tok_embeddings.weight, "transformer.wpe.weight": model.pos_embeddings.weight,
          "transformer.ln_f.weight": model.norm.weight, "transformer.ln_f.bias": model.norm.bias}
    for i, block in model.layers.items():
        a, f, pre = block.attention, block.feed_forward, f"transformer.h.{i}."
        sd[pre + "attn.c_attn.weight"] = torch.cat([a.wq.weight, a.wk.weight, a.wv.weight]).t()  # Conv1D is (in, out)
        sd[pre + "attn.c_attn.bias"] = torch.cat([a.wq.bias, a.wk.bias, a.wv.bias])
        sd[pre + "attn.c_proj.weight"], sd[pre + "attn.c_proj.bias"] = a.wo.weight.t(), a.wo.bias
        sd[pre + "mlp.c_fc.weight"], sd[pre + "mlp.c_fc.bias"] = f.w1.weight.t(), f.w1.bias
        sd[pre + "mlp.c_proj.weight"], sd[pre + "mlp.c_proj.bias"] = f.w2.weight.t(), f.w2.bias
        for ours, theirs in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
            norm = getattr(block, ours)
            sd[pre + f"{theirs}.weight"], sd[pre + f"{theirs}.bias"] = norm.weight, norm.bias
    hf.load_state_dict({k: v.detach().contiguous() for k, v in sd.items()}, strict=False)


@pytest.mark.parametrize("preset", ["tiny", "tiny-gpt2"])
def test_logits_equal_hugging_face(preset):
    transformers = pytest.importorskip("transformers")  # only this test needs it
    spec = load_model(preset)
    model = Transformer(spec, seed=11).eval()
    config = transformers.AutoConfig.for_model(**spec.to_hf_config())
    config._attn_implementation = "eager"
    if spec.family == "gpt2":
        config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
        hf = transformers.GPT2LMHeadModel(config).eval()
        _copy_into_hf_gpt2(model, hf)
    else:
        hf = transformers.LlamaForCausalLM(config).eval()
        _copy_into_hf_llama(model, hf)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=1e-4, atol=1e-5)
        assert model(tokens, tokens).item() == pytest.approx(
            torch.nn.functional.cross_entropy(hf(tokens).logits.flatten(0, 1), tokens.flatten()).item(), rel=1e-5)
