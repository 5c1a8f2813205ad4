"""The MoE block: the same numbers as transformers' Mixtral, the same parameter count as the planner, dropless."""

import pytest
import torch

from shardwise.model import Transformer, num_parameters
from shardwise.moe import MoE, set_microbatches, take_aux_loss
from shardwise.specs import load_model, model_from_hf_config

transformers = pytest.importorskip("transformers")

# DeepSeek-style: a dense first layer (first_k_dense_replace), a shared expert, sigmoid scores, top-1.
SHARED = {"hidden_size": 48, "intermediate_size": 96, "moe_intermediate_size": 24, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
          "n_routed_experts": 4, "num_experts_per_tok": 1, "n_shared_experts": 1, "first_k_dense_replace": 1,
          "scoring_func": "sigmoid", "norm_topk_prob": False, "routed_scaling_factor": 2.0, "aux_loss_alpha": 0.01}


def _copy_into_hf_mixtral(model, hf):
    sd = {"model.embed_tokens.weight": model.tok_embeddings.weight, "model.norm.weight": model.norm.weight,
          "lm_head.weight": model.output.weight}
    for i, block in model.layers.items():
        pre, a, moe = f"model.layers.{i}.", block.attention, block.feed_forward
        for ours, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
            sd[pre + f"self_attn.{theirs}.weight"] = getattr(a, ours).weight
        sd[pre + "input_layernorm.weight"] = block.attention_norm.weight
        sd[pre + "post_attention_layernorm.weight"] = block.ffn_norm.weight
        sd[pre + "mlp.gate.weight"] = moe.router.weight
        sd[pre + "mlp.experts.gate_up_proj"] = torch.cat([moe.experts.w1, moe.experts.w3], dim=1)
        sd[pre + "mlp.experts.down_proj"] = moe.experts.w2
    missing, unexpected = hf.load_state_dict({k: v.detach() for k, v in sd.items()}, strict=False)
    assert not unexpected and not [m for m in missing if "rotary" not in m], (missing, unexpected)


def test_logits_and_aux_loss_equal_mixtral():
    """tiny-moe (Mixtral keys): logits as transformers' MixtralForCausalLM; with one MoE layer and one sequence
    its load-balancing loss is exactly transformers' (which pools over layers and sequences otherwise)."""
    spec = load_model("tiny-moe")
    model = Transformer(spec, seed=11).eval()
    config = transformers.MixtralConfig(**{k: v for k, v in spec.to_hf_config().items() if k != "model_type"})
    config._attn_implementation = "eager"
    hf = transformers.MixtralForCausalLM(config).eval()
    _copy_into_hf_mixtral(model, hf)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=1e-4, atol=1e-5)

    one_layer = model_from_hf_config(spec.to_hf_config() | {"num_hidden_layers": 1}, "one", "test")
    model = Transformer(one_layer, seed=11)
    config = transformers.MixtralConfig(**{k: v for k, v in one_layer.to_hf_config().items() if k != "model_type"})
    hf = transformers.MixtralForCausalLM(config)
    _copy_into_hf_mixtral(model, hf)
    loss = model(tokens[:1], tokens[:1])
    aux = take_aux_loss([model])
    out = hf(tokens[:1], labels=tokens[:1], output_router_logits=True)
    assert aux.item() == pytest.approx(spec.aux_loss_coef * out.aux_loss.item(), rel=1e-5)
    # transformers shifts the labels; ours are already the next tokens, so compare the aux term only
    assert loss.item() > 0 and aux.item() > 0


def test_counts_dense_layers_and_shared_experts():
    spec = model_from_hf_config(SHARED, "shared", "test")
    model = Transformer(spec)
    assert spec.moe_layers == (1, 2)
    assert not isinstance(model.layers["0"].feed_forward, MoE)
    assert model.layers["1"].feed_forward.shared_experts.w1.out_features == 24
    assert num_parameters(model) == spec.num_params()
    assert num_parameters(Transformer(load_model("tiny-moe"))) == load_model("tiny-moe").num_params()


def test_route_top1_sigmoid_and_shared_expert_by_hand():
    """One MoE layer against the formula written out token by token."""
    spec = model_from_hf_config(SHARED, "shared", "test")
    moe = Transformer(spec, seed=2).layers["1"].feed_forward
    x = torch.randn(2, 5, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = moe(x)
        scores = torch.sigmoid(x @ moe.router.weight.T)
        want = moe.shared_experts(x).clone()
        for b in range(2):
            for t in range(5):
                e = int(scores[b, t].argmax())
                h = x[b, t]
                y = (torch.nn.functional.silu(moe.experts.w1[e] @ h) * (moe.experts.w3[e] @ h)) @ moe.experts.w2[e].T
                want[b, t] += 2.0 * scores[b, t, e] * y
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_aux_loss_gradient_reaches_the_router_and_is_counted_once_under_recompute():
    spec = load_model("tiny-moe")
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
    grads, auxes = [], []
    for recompute in ("none", "full"):
        model = Transformer(spec, seed=4, recompute=recompute)
        set_microbatches([model], 1)
        model(tokens, tokens).backward()
        grads.append(model.layers["0"].feed_forward.router.weight.grad.clone())
        auxes.append(take_aux_loss([model]).item())
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-8)
    assert auxes[0] == pytest.approx(auxes[1], rel=1e-6) and auxes[0] > 0
    # without the aux term the router gradient differs: the term is really in the backward
    plain = Transformer(model_from_hf_config(spec.to_hf_config() | {"router_aux_loss_coef": 0.0}, "n", "t"), seed=4)
    plain(tokens, tokens).backward()
    assert not torch.allclose(plain.layers["0"].feed_forward.router.weight.grad, grads[0], rtol=1e-3, atol=0)


def test_aux_loss_is_per_sequence_so_micro_batching_does_not_change_it():
    spec = load_model("tiny-moe")
    tokens = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(5))
    model = Transformer(spec, seed=4)
    set_microbatches([model], 1)
    model(tokens, tokens)
    whole = take_aux_loss([model]).item()
    set_microbatches([model], 4)
    for i in range(4):
        model(tokens[i:i + 1], tokens[i:i + 1])
    assert take_aux_loss([model]).item() == pytest.approx(whole, rel=1e-6)


def test_a_deepseek_config_trains_deepseeks_own_balance_loss():
    """DeepSeek's MoEGate (seq_aux): per sequence, f_i = count_i * E / (K * T) over the top-K picks, P_i the mean of
    the normalised scores; each MoE layer's alpha * sum_i f_i * P_i is added to the loss (not averaged). Written out
    here from router logits caught on the way; the Mixtral form (no K, layers averaged) differs by K / layers."""
    cfg = SHARED | {"model_type": "deepseek_v3", "num_experts_per_tok": 3, "norm_topk_prob": True,
                    "n_group": 1, "topk_group": 1, "num_hidden_layers": 3,
                    "q_lora_rank": None, "kv_lora_rank": None}  # no latent attention: the runtime trains GQA
    spec = model_from_hf_config(cfg, "ds", "test")
    assert spec.deepseek_balance_loss and spec.moe_layers == (1, 2) and spec.attention == "gqa"
    model = Transformer(spec, seed=5)
    logits = []
    for i in spec.moe_layers:
        model.layers[str(i)].feed_forward.router.register_forward_hook(lambda m, a, out: logits.append(out.detach()))
    tokens = torch.randint(0, 256, (3, 10), generator=torch.Generator().manual_seed(2))
    set_microbatches([model], 1)
    model(tokens, tokens)
    got = take_aux_loss([model]).item()
    e, k, t = 4, 3, 10  # k differs from the 2 MoE layers: the two forms differ
    want = 0.0
    for lg in logits:
        s = lg.float().sigmoid().view(3, t, e)
        ids = s.topk(k, dim=-1).indices
        counts = torch.nn.functional.one_hot(ids, e).sum(2).sum(1).float()  # (seq, E) over the top-k picks
        ce = counts / (t * k / e)
        want += 0.01 * (ce * (s / s.sum(-1, keepdim=True)).mean(1)).sum(1).mean().item()
    assert got == pytest.approx(want, rel=1e-5)
    mixtral_form = Transformer(model_from_hf_config(cfg | {"model_type": None}, "sw", "test"), seed=5)
    set_microbatches([mixtral_form], 1)
    mixtral_form(tokens, tokens)
    assert take_aux_loss([mixtral_form]).item() == pytest.approx(want * k / len(spec.moe_layers), rel=1e-5)
