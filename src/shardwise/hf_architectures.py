"""The Hugging Face architectures beyond Llama and GPT-2, each read from its own config.json keys (names and defaults
as transformers' configuration_*.py spell them; what each holds as its modeling_*.py builds it) into ModelSpec's terms.

`READERS`: architectures with keys of their own (OPT, BLOOM, MPT, GPT-NeoX, Falcon, GPT-J, StarCoder, ChatGLM2/3),
modelled with GPT-2-family blocks (LayerNorm, a two-matrix MLP) or, for ChatGLM, Llama-style ones. `LLAMA_VARIANTS`:
architectures with Llama's keys (Mistral, Qwen v1, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3's text model, OLMo, OLMo 2,
Phi-3, InternLM, InternLM2, Baichuan, Nemotron, StarCoder2, Granite, Cohere, StableLM; GPT-OSS and Phi-3.5-MoE with
Mixtral's, Kimi K2 with DeepSeek-V3's, DeepSeek-MoE with DeepSeek-V2's MoE keys), read by model_spec's Llama reader
and then changed where they differ.

What the planner counts is what changes parameters, FLOPs or memory: biases, a learned position table, an untied head,
multi-query K/V heads, the MLP's kind and width, the norms; and what changes communication: parallel attention+MLP
blocks (ModelSpec.parallel_residual, GPT-J's, GPT-NeoX's, Falcon's, Cohere's, StableLM's with use_parallel_residual:
the same matrices and FLOPs, one tensor-parallel reduction of the summed outputs per layer forward instead of two).
What it does not model changes neither materially: ALiBi or rotary (a few element-wise operations per score or per q/k
element, no parameters), partial rotary (GPT-NeoX's rotary_pct, GPT-J's rotary_dim, StableLM's partial_rotary_factor),
fused QKV or gate/up matrices (Phi-3: the same parameters), Gemma's embedding scale, Granite's multipliers and
Cohere's logit_scale (an element-wise pass each), OLMo's clip_qkv. Gemma 2's soft-caps are read: the attention logits'
(attn_logit_softcapping) decides whether the stack's fused attention can run the layer (planner/job.softcap_unfused);
the final logits' (final_logit_softcapping) keeps one more logits-sized tensor and adds element-wise passes over them
(planner/memory.last_stage_bytes, step_time.loss_bytes). Sliding-window attention (Mistral, Gemma 2's local layers,
Gemma 3's on 5 of every 6 layers) is read (model_spec.config_extras) and priced by the planner (docs/planner.md
"Sliding windows").
None of these is trained by `shardwise train` (the runtime builds Llama and GPT-2 blocks only).
"""

from __future__ import annotations

import json

from shardwise.errors import UsageError
from shardwise.hf_keys import MAX_LAYERS, MLP_OF_ACT, dropout_on, flag, mlp_of_act, optional, require, require_any


def _gpt2_blocks(hidden: int, heads: int, **fields) -> dict:
    """ModelSpec fields of a GPT-2-family model (LayerNorm, biases everywhere unless `fields` say otherwise)."""
    return {"family": "gpt2", "hidden": hidden, "num_heads": heads, "num_kv_heads": heads,
            "head_dim": hidden // heads} | fields


def opt(cfg: dict, source: str) -> dict:
    """OPT (facebook/opt-*, metaseq): learned positions with 2 rows more than max_position_embeddings
    (OPTLearnedPositionalEmbedding's offset), ReLU MLP of width ffn_dim, biases (enable_bias), tied head."""
    hidden, heads = require(cfg, "hidden_size", source), require(cfg, "num_attention_heads", source)
    proj = optional(cfg, "word_embed_proj_dim", hidden, source)
    if proj != hidden or not flag(cfg, "do_layer_norm_before", source, True):
        raise UsageError(f"{source}: OPT with word_embed_proj_dim {proj} != hidden_size {hidden} or post-LayerNorm "
                         "blocks (OPT-350m) has projections shardwise does not count — use another OPT size")
    bias = flag(cfg, "enable_bias", source, True)
    return _gpt2_blocks(
        hidden, heads, ffn_hidden=require(cfg, "ffn_dim", source),
        num_layers=require(cfg, "num_hidden_layers", source, MAX_LAYERS), vocab_size=require(cfg, "vocab_size", source),
        max_positions=optional(cfg, "max_position_embeddings", 2048, source), position_offset=2,
        positions="learned", tie_embeddings=flag(cfg, "tie_word_embeddings", source, True), attn_bias=bias,
        mlp_bias=bias, norm="layernorm" if flag(cfg, "layer_norm_elementwise_affine", source, True) else "nonparametric",
        mlp=mlp_of_act(cfg, "activation_function", "relu", source),
        dropout=dropout_on(cfg, {"dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0}, source))


def bloom(cfg: dict, source: str) -> dict:
    """BLOOM (bigscience/bloom*): ALiBi (no position table), a LayerNorm after the embedding, GELU MLP of width
    4 * hidden (BloomMLP's fixed dense_h_to_4h), biases everywhere, tied head. Old configs spell n_embed,
    num_attention_heads; new ones hidden_size, n_head (BloomConfig's attribute_map)."""
    hidden = require_any(cfg, ("n_embed", "hidden_size"), source)
    heads = require_any(cfg, ("n_head", "num_attention_heads"), source)
    return _gpt2_blocks(
        hidden, heads, ffn_hidden=4 * hidden,
        num_layers=require_any(cfg, ("n_layer", "num_hidden_layers"), source, MAX_LAYERS),
        vocab_size=require(cfg, "vocab_size", source),
        # ALiBi has no position limit; seq_length is the length it was trained at (the checks' bound)
        max_positions=optional(cfg, "seq_length", 2048, source), positions="alibi", embed_norm=True,
        tie_embeddings=flag(cfg, "tie_word_embeddings", source, True),
        norm_eps=optional(cfg, "layer_norm_epsilon", 1e-5, source), mlp="gelu",
        dropout=dropout_on(cfg, {"hidden_dropout": 0.0, "attention_dropout": 0.0}, source))


def mpt(cfg: dict, source: str) -> dict:
    """MPT (mosaicml/mpt-*, llm-foundry): ALiBi, GELU MLP of width expansion_ratio * d_model (transformers' port fixes
    it at 4), tied head, and with no_bias (its default) neither linear biases nor LayerNorm biases (llm-foundry's
    norms take bias=not no_bias; transformers' MptBlock drops the norms' biases as well)."""
    attn = cfg.get("attn_config", {})
    attn = {} if attn is None else attn
    if not isinstance(attn, dict):
        raise UsageError(f"{source}: key 'attn_config' must be an object, got {json.dumps(attn)} — fix it or leave it out")
    ffn = cfg.get("ffn_config", {})
    ffn = {} if ffn is None else ffn
    if not isinstance(ffn, dict) or ffn.get("ffn_type", "mptmlp") != "mptmlp":
        raise UsageError(f"{source}: ffn_config {ffn!r} is not MPT's GELU MLP (ffn_type mptmlp), the one shardwise counts")
    hidden, heads = require(cfg, "d_model", source), require(cfg, "n_heads", source)
    kind = attn.get("attn_type", "multihead_attention")
    kv = {"multiquery_attention": 1, "grouped_query_attention": optional(attn, "kv_n_heads", heads, source)}.get(kind, heads)
    no_bias = flag(cfg, "no_bias", source, True)
    alibi = flag(attn, "alibi", source, True)
    return _gpt2_blocks(
        hidden, heads, ffn_hidden=optional(cfg, "expansion_ratio", 4, source) * hidden,
        num_layers=require(cfg, "n_layers", source, MAX_LAYERS), vocab_size=require(cfg, "vocab_size", source),
        num_kv_heads=kv,
        max_positions=optional(cfg, "max_seq_len", 2048, source),
        positions="alibi" if alibi else ("learned" if flag(cfg, "learned_pos_emb", source, True) else "none"),
        tie_embeddings=flag(cfg, "tie_word_embeddings", source, True), attn_bias=not no_bias, mlp_bias=not no_bias,
        norm="layernorm-nobias" if no_bias else "layernorm", qk_norm="full" if flag(attn, "qk_ln", source) else "",
        norm_eps=optional(cfg, "layer_norm_epsilon", 1e-5, source), mlp="gelu",
        dropout=dropout_on(cfg, {"resid_pdrop": 0.0, "emb_pdrop": 0.0}, source) or dropout_on(
            attn, {"attn_pdrop": 0.0}, source))


def gpt_neox(cfg: dict, source: str) -> dict:
    """GPT-NeoX / Pythia (EleutherAI/gpt-neox-20b, pythia-*): rotary on rotary_pct of each head, parallel residual,
    biases (attention_bias, default true; the MLP's always), an untied head (embed_out) by default."""
    hidden, heads = require(cfg, "hidden_size", source), require(cfg, "num_attention_heads", source)
    return _gpt2_blocks(
        hidden, heads, ffn_hidden=require(cfg, "intermediate_size", source),
        num_layers=require(cfg, "num_hidden_layers", source, MAX_LAYERS), vocab_size=require(cfg, "vocab_size", source),
        max_positions=optional(cfg, "max_position_embeddings", 2048, source), positions="rotary",
        tie_embeddings=flag(cfg, "tie_word_embeddings", source), attn_bias=flag(cfg, "attention_bias", source, True),
        norm_eps=optional(cfg, "layer_norm_eps", 1e-5, source), mlp=mlp_of_act(cfg, "hidden_act", "gelu", source),
        # GPTNeoXConfig: use_parallel_residual defaults to true (GPT-NeoX's gpt_j_residual, set in every Pythia config)
        parallel_residual=flag(cfg, "use_parallel_residual", source, True),
        dropout=dropout_on(cfg, {"hidden_dropout": 0.0, "attention_dropout": 0.0}, source))


def falcon(cfg: dict, source: str) -> dict:
    """Falcon (tiiuae/falcon-*): rotary (or ALiBi), no biases by default (bias), tied head, GELU MLP of width
    ffn_hidden_size (4 * hidden). K/V heads: num_kv_heads with new_decoder_architecture (40B, 180B), else 1 with
    multi_query (7B), else all. Norms per block: two unless parallel_attn shares one (num_ln_in_parallel_attn,
    2 for the new architecture), as FalconDecoderLayer builds them."""
    hidden = require_any(cfg, ("n_embed", "hidden_size"), source)
    # the first Falcon configs (RWConfig, the checkpoints' remote-code configuration_RW.py) spell them n_head, n_layer
    # and n_head_kv
    heads = require_any(cfg, ("num_attention_heads", "n_head"), source)
    new = flag(cfg, "new_decoder_architecture", source)
    kv_key = "num_kv_heads" if cfg.get("num_kv_heads") is not None else "n_head_kv"
    kv = optional(cfg, kv_key, heads, source) if new or not flag(cfg, "multi_query", source, True) else 1
    parallel = flag(cfg, "parallel_attn", source, True)
    norms = optional(cfg, "num_ln_in_parallel_attn", 2 if new else 1, source) if parallel else 2
    bias = flag(cfg, "bias", source)
    return _gpt2_blocks(
        hidden, heads, num_kv_heads=kv, ffn_hidden=optional(cfg, "ffn_hidden_size", 4 * hidden, source),
        num_layers=require_any(cfg, ("num_hidden_layers", "n_layer"), source, MAX_LAYERS),
        vocab_size=require(cfg, "vocab_size", source), max_positions=optional(cfg, "max_position_embeddings", 2048, source),
        positions="alibi" if flag(cfg, "alibi", source) else "rotary", layer_norms=2 if norms == 2 else 1,
        parallel_residual=parallel,
        tie_embeddings=flag(cfg, "tie_word_embeddings", source, True), attn_bias=bias, mlp_bias=bias,
        norm_eps=optional(cfg, "layer_norm_epsilon", 1e-5, source), mlp=mlp_of_act(cfg, "activation", "gelu", source),
        dropout=dropout_on(cfg, {"hidden_dropout": 0.0, "attention_dropout": 0.0}, source))


def gptj(cfg: dict, source: str) -> dict:
    """GPT-J (EleutherAI/gpt-j-6b): rotary on rotary_dim of each head, attention and MLP in parallel after one
    LayerNorm (ln_1), no attention biases, MLP biases, an untied LM head with a bias."""
    hidden, heads = require(cfg, "n_embd", source), require(cfg, "n_head", source)
    return _gpt2_blocks(
        hidden, heads, ffn_hidden=optional(cfg, "n_inner", 4 * hidden, source),
        num_layers=require(cfg, "n_layer", source, MAX_LAYERS), vocab_size=require(cfg, "vocab_size", source),
        max_positions=optional(cfg, "n_positions", 2048, source), positions="rotary", layer_norms=1,
        parallel_residual=True,
        tie_embeddings=flag(cfg, "tie_word_embeddings", source), attn_bias=False, mlp_bias=True, head_bias=True,
        norm_eps=optional(cfg, "layer_norm_epsilon", 1e-5, source),
        mlp=mlp_of_act(cfg, "activation_function", "gelu_new", source),
        dropout=dropout_on(cfg, {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}, source))


def gpt_bigcode(cfg: dict, source: str) -> dict:
    """StarCoder / SantaCoder (bigcode/starcoder, model_type gpt_bigcode): GPT-2's blocks with one K/V head
    (multi_query, the default)."""
    hidden, heads = require(cfg, "n_embd", source), require(cfg, "n_head", source)
    return _gpt2_blocks(
        hidden, heads, num_kv_heads=1 if flag(cfg, "multi_query", source, True) else heads,
        ffn_hidden=optional(cfg, "n_inner", 4 * hidden, source),
        num_layers=require(cfg, "n_layer", source, MAX_LAYERS), vocab_size=require(cfg, "vocab_size", source),
        max_positions=require(cfg, "n_positions", source), positions="learned",
        tie_embeddings=flag(cfg, "tie_word_embeddings", source, True),
        norm_eps=optional(cfg, "layer_norm_epsilon", 1e-5, source),
        mlp=mlp_of_act(cfg, "activation_function", "gelu_pytorch_tanh", source),
        dropout=dropout_on(cfg, {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}, source))


def chatglm(cfg: dict, source: str) -> dict:
    """ChatGLM2 / ChatGLM3 (THUDM/chatglm2-6b, chatglm3-6b; model_type chatglm, keys of its own): Llama-style blocks
    (RMSNorm, SwiGLU of width ffn_hidden_size, rotary on half of each head), multi_query_group_num K/V heads with
    multi_query_attention, a bias on the fused q/k/v only (add_qkv_bias), an untied output layer."""
    heads = require(cfg, "num_attention_heads", source)
    bias = flag(cfg, "add_bias_linear", source)
    return {"family": "llama", "hidden": require(cfg, "hidden_size", source), "num_heads": heads,
            "num_kv_heads": optional(cfg, "multi_query_group_num", heads, source)
            if flag(cfg, "multi_query_attention", source) else heads,
            "head_dim": require(cfg, "kv_channels", source), "ffn_hidden": require(cfg, "ffn_hidden_size", source),
            "num_layers": require(cfg, "num_layers", source, MAX_LAYERS),
            "vocab_size": require(cfg, "padded_vocab_size", source),
            "max_positions": optional(cfg, "seq_length", 2048, source), "positions": "rotary",
            "tie_embeddings": False, "qkv_bias": flag(cfg, "add_qkv_bias", source), "attn_bias": bias or None,
            "mlp_bias": bias or None, "norm": "" if flag(cfg, "rmsnorm", source, True) else "layernorm",
            "norm_eps": optional(cfg, "layernorm_epsilon", 1e-5, source)}


READERS = {"opt": opt, "bloom": bloom, "mpt": mpt, "gpt_neox": gpt_neox, "falcon": falcon, "gptj": gptj,
           "gpt_bigcode": gpt_bigcode, "chatglm": chatglm}


def _gemma(cfg: dict, source: str, norms: int = 2) -> dict:
    """Gemma: GeGLU (gelu_pytorch_tanh, named by hidden_act; Gemma 2's by hidden_activation, the key each MLP reads in
    transformers 5), head_dim 256 in its configs, tied head; Gemma 2 adds a norm after attention and one after the MLP
    (four per block)."""
    key = "hidden_activation" if norms == 4 else "hidden_act"
    if cfg.get(key) is not None:
        act = cfg[key]
        if not isinstance(act, str) or MLP_OF_ACT.get(act) != "gelu":
            raise UsageError(f"{source}: key '{key}' is {cfg[key]!r}, but Gemma's MLP gates with a GELU, which "
                             f"shardwise counts as GeGLU — use gelu_pytorch_tanh (Gemma's own) or leave it out")
    return {"mlp": "geglu", "layer_norms": norms, "tie_embeddings": flag(cfg, "tie_word_embeddings", source, True)}


def _softcap(cfg: dict, source: str, key: str, default: float) -> float:
    """One of Gemma 2's soft-caps: its key, Gemma2Config's default when the key is absent (attention 50.0, final
    logits 30.0), none when it is null (transformers' Gemma2 caps only where the key is not None)."""
    if key in cfg and cfg[key] is None:
        return 0.0
    return optional(cfg, key, default, source)


def _gemma2(cfg: dict, source: str, caps: tuple[float, float] = (50.0, 30.0)) -> dict:
    """Gemma 2: Gemma's blocks with four norms a layer, its attention logits and its final logits soft-capped (`caps`:
    the config class's defaults where a key is absent)."""
    return _gemma(cfg, source, norms=4) | {"attn_softcap": _softcap(cfg, source, "attn_logit_softcapping", caps[0]),
                                           "final_softcap": _softcap(cfg, source, "final_logit_softcapping", caps[1])}


def _gemma3_text(cfg: dict, source: str) -> dict:
    """Gemma 3's language model (model_type gemma3_text: gemma-3-1b, and the text_config of the larger, multimodal
    ones): Gemma 2's blocks (attention_bias read, the MLP never biased) with an RMSNorm on q and one on k over
    head_dim (q_norm, k_norm), no soft-cap unless the config sets one (Gemma3TextConfig's attn_logit_softcapping and
    final_logit_softcapping default to null), and sliding windows on the layers layer_types names (without it, 5 of
    every sliding_window_pattern = 6: model_spec.config_extras). query_pre_attn_scalar (the scores' scale) and
    rope_local_base_freq hold no parameters. EmbeddingGemma's config (use_bidirectional_attention) is an encoder's:
    refused."""
    if flag(cfg, "use_bidirectional_attention", source):
        raise UsageError(f"{source}: use_bidirectional_attention is true: an encoder (EmbeddingGemma), not a causal "
                         "decoder — shardwise plans decoder-only transformers; give a decoder's config.json")
    return _gemma2(cfg, source, caps=(0.0, 0.0)) | {
        "qk_norm": "head", "mlp_bias": None, "max_positions": optional(cfg, "max_position_embeddings", 131072, source)}


def _granite(cfg: dict, source: str) -> dict:
    """IBM Granite 3.x (model_type granite): Llama's blocks and bias keys (attention_bias, mlp_bias), untied by default,
    with four scalar multipliers that hold no parameters and cost an element-wise pass each: embedding_multiplier on
    the embeddings, residual_multiplier on each block's two outputs, attention_multiplier as the scores' scale (in place
    of 1/sqrt(head_dim)), logits_scaling dividing the logits. Read only to check them (a malformed one is one line)."""
    for key in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
        optional(cfg, key, 1.0, source)
    return {}


def _cohere(cfg: dict, source: str) -> dict:
    """Cohere Command-R and Aya (model_type cohere): attention and the SwiGLU MLP in parallel after one LayerNorm
    without bias (CohereLayerNorm: weight only), tied head, attention_bias on q, k, v and o (the MLP never has
    biases); with use_qk_norm (Command R+), a LayerNorm weight per head on q and on k (num_heads x head_dim and
    num_kv_heads x head_dim: counted as qk_norm "full"). logit_scale multiplies the logits (an element-wise pass, no
    parameters)."""
    optional(cfg, "logit_scale", 0.0625, source)
    return {"norm": "layernorm-nobias", "layer_norms": 1, "parallel_residual": True, "mlp_bias": None,
            "qk_norm": "full" if flag(cfg, "use_qk_norm", source) else "",
            "tie_embeddings": flag(cfg, "tie_word_embeddings", source, True),
            "norm_eps": optional(cfg, "layer_norm_eps", 1e-5, source),
            "max_positions": optional(cfg, "max_position_embeddings", 8192, source)}


def _stablelm(cfg: dict, source: str) -> dict:
    """StableLM (stabilityai/stablelm-3b-4e1t, stablelm-2-*; model_type stablelm): Llama's SwiGLU MLP without biases,
    LayerNorm with bias, rotary on partial_rotary_factor of each head (no parameters), biases on q, k and v with
    use_qkv_bias (o never), one LayerNorm weight per head on q and on k with qk_layernorm (StableLmLayerNormPerHead,
    no bias: counted as qk_norm "full"), and with use_parallel_residual attention and MLP side by side after the one
    input LayerNorm (no post-attention norm). Untied head by default."""
    parallel = flag(cfg, "use_parallel_residual", source)
    return {"norm": "layernorm", "layer_norms": 1 if parallel else 2, "parallel_residual": parallel,
            "attn_bias": None, "mlp_bias": None, "qkv_bias": flag(cfg, "use_qkv_bias", source),
            "qk_norm": "full" if flag(cfg, "qk_layernorm", source) else "",
            "norm_eps": optional(cfg, "layer_norm_eps", 1e-5, source),
            "max_positions": optional(cfg, "max_position_embeddings", 4096, source)}


def _phimoe(cfg: dict, source: str) -> dict:
    """Phi-3.5-MoE (model_type phimoe): Mixtral's keys and experts (num_local_experts SwiGLU experts, a router without
    bias), LayerNorm with bias (its eps under rms_norm_eps), biases on q, k, v and o with attention_bias, a bias on the
    LM head with lm_head_bias. Its SparseMixer routing and jitter pick the top-k differently, at no other cost."""
    return {"norm": "layernorm", "mlp_bias": None, "head_bias": flag(cfg, "lm_head_bias", source),
            "max_positions": optional(cfg, "max_position_embeddings", 131072, source)}


# Llama-keyed architectures: what each changes of the Llama reader's spec (None: nothing). Qwen2's q/k/v biases and
# Qwen3's per-head QK-norm are read with the MoE variants (model_spec._attention_from_hf).
def _internlm_bias(cfg: dict, source: str) -> dict:
    """InternLM and InternLM2: a bias on q, k, v and o unless the config's `bias` says false."""
    return {"attn_bias": flag(cfg, "bias", source, True) or None}


LLAMA_VARIANTS = {
    "mistral": None,  # Llama's blocks; sliding_window attention (see the module's note)
    "kimi_k2": None,  # DeepSeek-V3's keys and blocks (model_spec.DEEPSEEK_V3_KEYS): MLA, sigmoid routing
    # GPT-OSS: Mixtral's keys, biases on attention (attention_bias), on every expert matrix and on the router,
    # an attention sink per head; its clamped SwiGLU and alternating 128-token windows are not modelled
    "gpt_oss": lambda cfg, source: {"attn_bias": flag(cfg, "attention_bias", source, True), "mlp_bias": True,
                                    "attention_sinks": True},
    "qwen2": None,
    "qwen3": None,
    # Remote-code architectures with Llama's keys (their modeling files ship with the checkpoints, not in transformers).
    # InternLM (internlm/internlm-7b, -20b): biases on q, k, v and o (InternLMConfig's `bias`, default true).
    # InternLM2: q, k, v fused in one wqkv, the same matrices; biases by the same `bias` (false in its released configs).
    "internlm": _internlm_bias,
    "internlm2": _internlm_bias,
    # Baichuan and Baichuan 2 (baichuan-inc/*): q, k, v fused (W_pack), no biases; the 13B models run ALiBi where the
    # 7B ones run rotary, neither holding parameters; the trained length is model_max_length.
    "baichuan": lambda cfg, source: {"max_positions": optional(cfg, "model_max_length", 4096, source)},
    # Qwen (v1, Qwen/Qwen-7B ...): intermediate_size counts both SwiGLU input branches (w1 and w2 are
    # intermediate_size // 2 wide each), a bias on the fused c_attn (q, k, v) only, the trained length seq_length.
    "qwen": lambda cfg, source: {"ffn_hidden": require(cfg, "intermediate_size", source) // 2, "qkv_bias": True,
                                 "max_positions": optional(cfg, "seq_length", 2048, source)},
    "phi3": None,  # fused qkv_proj and gate_up_proj: the same matrices as Llama's, one GEMM each
    "gemma": _gemma,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3_text,
    "granite": _granite,
    "cohere": _cohere,
    "stablelm": _stablelm,
    "phimoe": _phimoe,
    # DeepSeek-MoE (deepseek-ai/deepseek-moe-16b-*, remote code; model_type deepseek): Llama's attention (attention_bias
    # on q, k, v, o) and DeepSeek-V2's MoE keys (n_routed_experts, n_shared_experts, first_k_dense_replace,
    # moe_layer_freq, read by model_spec._moe_from_hf); its MLPs and router have no biases
    "deepseek": lambda cfg, source: {"mlp_bias": None},
    # OLMo: LayerNorm without weight or bias (OlmoLayerNorm); OLMo 2: RMSNorm after attention and after the MLP
    # (none before), and RMSNorm on q and k over all heads (q_norm: num_heads * head_dim)
    "olmo": lambda cfg, source: {"norm": "nonparametric"},
    # Nemotron: LayerNorm1P, a LayerNorm with weight and bias (zero-centred weight), its epsilon as norm_eps
    "nemotron": lambda cfg, source: {"norm": "layernorm", "norm_eps": optional(cfg, "norm_eps", 1e-5, source)},
    "olmo2": lambda cfg, source: {"qk_norm": "full"},
    # StarCoder2: LayerNorm with bias, biases on every linear layer (use_bias), a GELU MLP, tied head
    "starcoder2": lambda cfg, source: {
        "norm": "layernorm", "attn_bias": flag(cfg, "use_bias", source, True),
        "mlp_bias": flag(cfg, "use_bias", source, True), "mlp": mlp_of_act(cfg, "hidden_act", "gelu_pytorch_tanh", source),
        "tie_embeddings": flag(cfg, "tie_word_embeddings", source, True),
        "norm_eps": optional(cfg, "norm_epsilon", 1e-5, source),
        "dropout": dropout_on(cfg, {"residual_dropout": 0.0, "embedding_dropout": 0.0, "attention_dropout": 0.0}, source)},
}

# What `shardwise train` refuses by name: the runtime builds only Llama's and GPT-2's blocks.
PLANNER_ONLY = frozenset(READERS) | frozenset(LLAMA_VARIANTS)
