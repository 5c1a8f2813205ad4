"""ModelSpec: the architecture, from a preset or a Hugging Face config.json, in the terms the planner and the
runtime share — and back to a config.json (`to_hf_config`).

Plain Python (no torch), so the planner imports in milliseconds. Every check raises UsageError with one line that
names the problem and the fix. `shardwise.specs` re-exports what callers use (load_model, ModelSpec, ...).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path

from shardwise.errors import UsageError
from shardwise.frozen import cached_hash
from shardwise.hf_architectures import LLAMA_VARIANTS, READERS
from shardwise.hf_keys import (MAX_LAYERS, SWIGLU_ACTS, count, dropout, flag, mlp_of_act, optional, require,
                               require_any)
from shardwise.paths import refuse_special


@cached_hash
@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, in the terms both the planner and the runtime use.

    family "llama": RMSNorm, RoPE, SwiGLU MLP (3 matrices), grouped-query attention, no biases.
    family "gpt2":  LayerNorm, learned positions, GELU MLP (2 matrices), biases, tied embeddings.
    """

    name: str
    family: str
    hidden: int
    ffn_hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    head_dim: int
    max_positions: int = 2048
    tie_embeddings: bool = False
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    model_type: str = ""  # the Hugging Face model_type it came from (round trips through to_hf_config)
    # Mixture of experts (num_experts 0: a dense model). Layers in `moe_layers` replace the FFN by a top-k
    # router over `num_experts` SwiGLU experts of width `moe_ffn_hidden` (+ a shared SwiGLU expert of width
    # `shared_ffn_hidden`, DeepSeek/Qwen2); the other layers keep the dense FFN of width `ffn_hidden`.
    num_experts: int = 0
    experts_per_token: int = 0  # top-k
    moe_ffn_hidden: int = 0
    shared_ffn_hidden: int = 0
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid(Linear(h, 1)) scales the shared expert
    moe_layers: tuple[int, ...] = ()
    router_scoring: str = "softmax"  # or "sigmoid" (DeepSeek-V3)
    norm_topk: bool = True  # renormalise the top-k weights to sum to 1
    routed_scaling: float = 1.0  # DeepSeek's routed_scaling_factor
    aux_loss_coef: float = 0.0  # load-balancing loss coefficient (router_aux_loss_coef / aux_loss_alpha)
    router_groups: int = 1  # DeepSeek's group-limited routing: n_group, topk_group
    router_topk_groups: int = 1
    # Attention variants the planner counts exactly (the runtime trains plain GQA attention only).
    attention: str = "gqa"  # or "mla" (DeepSeek multi-head latent attention)
    q_lora_rank: int = 0  # MLA: 0 = a plain q projection
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    qk_norm: str = ""  # a norm on q and k: "head" (Qwen3: over head_dim) or "full" (OLMo 2: over all heads)
    qkv_bias: bool = False  # Qwen2: biases on q, k, v
    # The MLP where it is not the family's own (llama SwiGLU, gpt2 GELU), counted by the planner: "swiglu", "geglu"
    # (gated: three matrices) or "gelu", "relu", "squared-relu" (two: Nemotron-4's squared ReLU with Llama-style
    # blocks otherwise).
    mlp: str = ""
    # Whether training applies dropout (and keeps its masks for backward); None: the family's recipes (GPT-2 yes,
    # Llama no). HF configs say it (resid_pdrop / hidden_dropout); MosaicML's MPT recipes set it to 0.
    dropout: bool | None = None
    # Where an architecture differs from its family's blocks in what it holds (None or "": the family's own; see
    # hf_architectures for which architecture sets which). Biases on the attention's four matrices and on the MLP's.
    attn_bias: bool | None = None
    mlp_bias: bool | None = None
    head_bias: bool = False  # GPT-J's LM head has a bias
    attention_sinks: bool = False  # GPT-OSS: one learned logit per head and layer joins each softmax
    # Gemma 2: each attention logit soft-capped, cap * tanh(logit / cap) (its attn_logit_softcapping; 0: none). No
    # parameters; it decides which fused attention kernels can run it (planner/job.softcap_unfused).
    attn_softcap: float = 0.0
    # Gemma 2: the LM head's logits soft-capped the same way before the loss (final_logit_softcapping; 0: none): one
    # more logits-sized tensor kept for backward (tanh's output) and three element-wise passes over the logits.
    final_softcap: float = 0.0
    norm: str = ""  # "layernorm" (weight and bias), "layernorm-nobias" (MPT), "rmsnorm", "nonparametric" (OLMo)
    layer_norms: int = 2  # norms per layer: 1 where attention and MLP share one (GPT-J, Falcon-7B), 4 in Gemma 2
    embed_norm: bool = False  # BLOOM's LayerNorm right after the embedding
    positions: str = ""  # "learned" (a table), "rotary", "alibi" or "none" (the last three hold no parameters)
    position_offset: int = 0  # OPT's learned table has 2 rows more than max_position_embeddings
    # Attention and MLP read the same input and their outputs join the residual together (GPT-J, GPT-NeoX/Pythia,
    # Falcon, PaLM): the same matrices and FLOPs, but tensor parallelism reduces the summed outputs once per layer
    # forward (planner/layer_time.tp_layer_comm).
    parallel_residual: bool = False
    # A sliding attention window (tokens; 0 none) and how many layers attend through it: the planner counts those
    # layers' attention over the window (attended_keys), so they are part of the spec's equality.
    sliding_window: int = 0
    window_layers: int = 0
    # Outside the spec's equality, as no planner number depends on them: DeepSeek's multi-token-prediction modules
    # (num_nextn_predict_layers) — read so that the planner can say it leaves them out (commands.common.model_note) —,
    # and the RoPE scaling, which the runtime runs (model.rope_tables: Llama 3.1's) and the emitters write (a resume
    # compares it through the checkpoint manifest's copy of every field).
    rope_scaling: tuple = field(default=(), compare=False)  # (key, value) pairs, "rope_type" among them
    mtp_layers: int = field(default=0, compare=False)

    @property
    def gated_mlp(self) -> bool:
        return self.mlp in GATED_MLPS if self.mlp else self.family == "llama"

    @property
    def trains_with_dropout(self) -> bool:
        return self.family == "gpt2" if self.dropout is None else self.dropout

    @property
    def attention_bias(self) -> bool:
        """Biases on Q, K, V and the output projection."""
        return self.family == "gpt2" if self.attn_bias is None else self.attn_bias

    @property
    def ffn_bias(self) -> bool:
        return self.family == "gpt2" if self.mlp_bias is None else self.mlp_bias

    @property
    def has_bias(self) -> bool:
        """Biases on every linear layer of a block (GPT-2's blocks; the runtime builds both or neither)."""
        return self.attention_bias and self.ffn_bias

    @property
    def norm_kind(self) -> str:
        return self.norm or ("layernorm" if self.family == "gpt2" else "rmsnorm")

    @property
    def norm_vectors(self) -> int:
        """Parameter vectors of width hidden in one norm: LayerNorm's weight and bias, RMSNorm's weight."""
        return NORM_VECTORS[self.norm_kind]

    @property
    def layer_norm_params(self) -> int:
        """One layer's norm parameters: its norms' weight (and bias) vectors of width hidden."""
        return self.layer_norms * self.norm_vectors * self.hidden

    @property
    def learned_positions(self) -> bool:
        return self.positions == "learned" if self.positions else self.family == "gpt2"

    @property
    def rotary(self) -> bool:
        return self.positions == "rotary" if self.positions else self.family == "llama"

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attention_width(self) -> float:
        """Per token, over all heads, the mean width of the attention core's two products: Q·Kᵀ runs over the
        query/key head dim, P·V over the value head dim. Both are head_dim (q_dim) except in MLA, where Q·Kᵀ spans
        qk_nope + qk_rope (192 in DeepSeek-V3) and P·V v_head_dim (128): Megatron-Core's num_floating_point_operations
        counts heads · (qk_head_dim + qk_pos_emb_head_dim) / 2 + heads · v_head_dim / 2 there."""
        if self.attention == "mla":
            return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) / 2
        return self.q_dim

    def windowed(self, seq_len: int) -> bool:
        """Whether some layers attend through a sliding window shorter than the sequence (the others globally)."""
        return bool(self.window_layers) and 0 < self.sliding_window < seq_len

    def window_share(self, seq_len: int) -> float:
        """The share of the layers that attend through a window shorter than the sequence (0 where none does)."""
        return self.window_layers / self.num_layers if self.windowed(seq_len) else 0.0

    def attended_keys(self, seq_len: int) -> float:
        """Keys per query token in the attention cores' unmasked count (PaLM's), mean over the layers: the sequence
        on a global layer, the window on a windowed one where it is shorter — MaxText's count for Gemma 2's local
        layers (AI-Hypercomputer/maxtext maxtext_utils.calculate_gemma2_tflops_training_per_device:
        min(sliding_window_size, max_target_length) keys where the global layers have the sequence)."""
        share = self.window_share(seq_len)
        return (1 - share) * seq_len + share * self.sliding_window if share else float(seq_len)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def deepseek_balance_loss(self) -> bool:
        """DeepSeek's MoEGate balance loss (DeepSeek-MoE, -V2, -V3): f_i = E · count_i / (K · T) over the top-K picks
        and each MoE layer's term added to the loss; Switch/GShard's (Mixtral, Qwen-MoE in transformers) counts
        f_i = count_i / T and averages the layers."""
        return self.model_type in DEEPSEEK_KEYS

    def is_moe_layer(self, layer: int) -> bool:
        return layer in self._moe_layer_set

    @cached_property
    def _moe_layer_set(self) -> frozenset:  # the planner asks per layer, per layout: a set, built once
        return frozenset(self.moe_layers)

    # Parameter counts, matrix by matrix, as Hugging Face builds the model.
    def attention_params(self) -> int:
        h = self.hidden
        if self.attention == "mla":
            heads, qk = self.num_heads, self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk) if self.q_lora_rank else h * heads * qk
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank \
                + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            # attention_bias: on q_a_proj, kv_a_proj_with_mqa and o_proj (the up-projections never have one)
            bias = self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim + h if self.attention_bias else 0
            return q + kv + heads * self.v_head_dim * h + bias
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.attention_bias:
            attn += self.q_dim + 2 * self.kv_dim + h
        elif self.qkv_bias:
            attn += self.q_dim + 2 * self.kv_dim
        return attn + self.qk_norm_params() + (self.num_heads if self.attention_sinks else 0)

    def qk_norm_params(self) -> int:
        """Qwen3 norms q and k per head (one head_dim weight each), OLMo 2 over all heads (q_dim and kv_dim)."""
        if self.qk_norm == "full":
            return self.q_dim + self.kv_dim
        return 2 * self.head_dim if self.qk_norm else 0

    def dense_ffn_params(self, width: int | None = None) -> int:
        f = self.ffn_hidden if width is None else width
        bias = ((2 if self.gated_mlp else 1) * f + self.hidden) if self.ffn_bias else 0
        return (3 if self.gated_mlp else 2) * self.hidden * f + bias

    def expert_params(self) -> int:
        """One routed expert (a SwiGLU of width moe_ffn_hidden; with the MLP's biases, GPT-OSS's, on each matrix)."""
        bias = 2 * self.moe_ffn_hidden + self.hidden if self.ffn_bias else 0
        return 3 * self.hidden * self.moe_ffn_hidden + bias

    def moe_dense_params(self) -> int:
        """What every token of a MoE layer's FFN uses: the router, the shared expert (and its gate)."""
        shared = 3 * self.hidden * self.shared_ffn_hidden + (self.hidden if self.shared_expert_gate else 0)
        return self.num_experts * (self.hidden + self.ffn_bias) + shared  # the router (and its bias, GPT-OSS)

    def layer_params(self, layer: int, active: bool = False) -> int:
        """Parameters of layer `layer` (active: only the top-k of its routed experts). A layer is dense or MoE, so
        there are at most four answers: each computed once per spec (the planner asks per layer, per layout)."""
        key = (self.is_moe_layer(layer), active)
        if key not in self._layer_params_cache:
            self._layer_params_cache[key] = self._layer_params(layer, active)
        return self._layer_params_cache[key]

    @cached_property
    def _layer_params_cache(self) -> dict:
        return {}

    def _layer_params(self, layer: int, active: bool) -> int:
        norms = self.layer_norm_params
        if self.is_moe_layer(layer):
            experts = self.experts_per_token if active else self.num_experts
            ffn = experts * self.expert_params() + self.moe_dense_params()
        else:
            ffn = self.dense_ffn_params()
        return self.attention_params() + ffn + norms

    def expert_params_per_layer(self) -> float:
        """The routed experts' parameters, averaged over all layers (0 for a dense model)."""
        return len(self.moe_layers) * self.num_experts * self.expert_params() / self.num_layers

    def params_per_layer(self) -> float:
        """Parameters of one layer (all layers alike for dense models; the mean over layers for MoE)."""
        if not self.is_moe:
            return self.layer_params(0)
        return _layer_sum(self, False) / self.num_layers

    def embedding_params(self) -> int:
        pos = (self.max_positions + self.position_offset) * self.hidden if self.learned_positions else 0
        return self.vocab_size * self.hidden + pos + (self.norm_vectors * self.hidden if self.embed_norm else 0)

    def head_params(self) -> int:
        """Final norm plus the LM head (zero extra when tied to the embedding) and its bias (GPT-J)."""
        final_norm = self.hidden * self.norm_vectors
        return final_norm + (0 if self.tie_embeddings else self.vocab_size * self.hidden) + (
            self.vocab_size if self.head_bias else 0)

    def num_params(self) -> int:
        return _layer_sum(self, False) + self.embedding_params() + self.head_params()

    def active_params(self) -> int:
        """Parameters one token uses: all but the routed experts it is not sent to (MoE); num_params when dense."""
        return _layer_sum(self, True) + self.embedding_params() + self.head_params()

    def to_hf_config(self) -> dict:
        """An HF-style config.json for this spec (round-trips through load_model): Llama's or GPT-2's keys, so
        not for an architecture read from keys of its own (hf_architectures.READERS, StarCoder2's use_bias, StableLM's
        and Cohere's norm and block flags, Phi-3.5-MoE's head bias: OWN_KEY_TYPES)."""
        if self.model_type in READERS or self.model_type in OWN_KEY_TYPES:
            raise ValueError(f"no config.json writer for model_type {self.model_type}: give its own config.json")
        if self.family == "gpt2" and self.parallel_residual:
            return self._gpt_neox_config()
        if self.family == "gpt2":
            # GPT-2's keys cannot say multi-query attention; GPT-BigCode's (StarCoder's) can (hf_architectures.gpt_bigcode)
            mqa = {"model_type": "gpt_bigcode", "multi_query": True,
                   "activation_function": ACT_OF_MLP[self.mlp or "gelu"]} if self.num_kv_heads == 1 < self.num_heads else {}
            return {
                "model_type": "gpt2", "n_embd": self.hidden, "n_layer": self.num_layers,
                "n_head": self.num_heads, "n_inner": self.ffn_hidden, "n_positions": self.max_positions,
                "vocab_size": self.vocab_size, "layer_norm_epsilon": self.norm_eps,
            } | ({"resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.0} if self.dropout is False else {}) | (
                {} if self.tie_embeddings else {"tie_word_embeddings": False}) | mqa
        cfg = {
            "model_type": self.model_type or "llama", "hidden_size": self.hidden,
            "intermediate_size": self.ffn_hidden,
            "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads, "vocab_size": self.vocab_size,
            "head_dim": self.head_dim, "max_position_embeddings": self.max_positions,
            "tie_word_embeddings": self.tie_embeddings, "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
        }
        if not self.gated_mlp:  # a Llama block with a two-matrix MLP: Nemotron's, or a config without model_type
            cfg["hidden_act"] = ACT_OF_MLP.get(self.mlp, "relu2")
            if not self.model_type:
                del cfg["model_type"]
        if self.dropout:
            cfg |= {"hidden_dropout": 0.1, "attention_dropout": 0.1}
        if self.rope_scaling:  # Llama 3.1's, as its config.json writes it (read back by rope_scaling)
            cfg["rope_scaling"] = dict(self.rope_scaling)
        if cfg.get("model_type") in WINDOWED_TYPES:  # the window as config_extras reads it back: how many layers attend
            cfg["sliding_window"] = self.sliding_window or None  # through it (what the planner prices), not which
            if self.window_layers:
                cfg["use_sliding_window"] = True
                cfg["layer_types"] = (["sliding_attention"] * self.window_layers
                                      + ["full_attention"] * (self.num_layers - self.window_layers))
        if self.model_type in ("gemma2", "gemma3_text"):  # absent reads as the config class's default: written either way
            cfg["attn_logit_softcapping"] = self.attn_softcap or None
            cfg["final_logit_softcapping"] = self.final_softcap or None
        return cfg | moe_hf_keys(self) | attention_hf_keys(self)

    def _gpt_neox_config(self) -> dict:
        """GPT-2-style blocks with a parallel residual, which GPT-2's keys cannot say: GPT-NeoX's config.json
        (transformers' GPTNeoXConfig keys, read back by hf_architectures.gpt_neox)."""
        drop = 0.1 if self.trains_with_dropout else 0.0
        return {"model_type": "gpt_neox", "hidden_size": self.hidden, "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_heads, "intermediate_size": self.ffn_hidden,
                "max_position_embeddings": self.max_positions, "vocab_size": self.vocab_size,
                "layer_norm_eps": self.norm_eps, "tie_word_embeddings": self.tie_embeddings, "hidden_act": "gelu",
                "use_parallel_residual": True, "hidden_dropout": drop, "attention_dropout": drop}


@lru_cache(maxsize=256)
def _layer_sum(spec: ModelSpec, active: bool) -> int:
    """All layers' parameters (or only those a token uses): summed once per spec, as the planner asks often."""
    if not spec.is_moe:
        return spec.num_layers * spec.layer_params(0, active=active)
    return sum(spec.layer_params(i, active=active) for i in range(spec.num_layers))


def preset_dir(kind: str):
    """The shipped presets of one kind: "models" (config.json files) or "clusters" (TOML files)."""
    return resources.files("shardwise").joinpath("presets").joinpath(kind)


def model_presets() -> list[str]:
    return sorted(p.name[: -len(".json")] for p in preset_dir("models").iterdir() if p.name.endswith(".json"))


# Hugging Face `model_type` -> the family shardwise models it as: parameters, memory, time and the runtime's
# model all follow that family. A config of any other model_type is refused by name (it would be modelled
# wrongly). Add an architecture here and its reader in hf_architectures once it is modelled; a config without
# model_type is read by its keys (Llama's hidden_size..., GPT-2's n_embd...).
# MLP names (ModelSpec.mlp): swiglu and geglu are gated (three matrices); gelu, relu and squared-relu are not.
GATED_MLPS = ("swiglu", "geglu")
NORM_VECTORS = {"layernorm": 2, "layernorm-nobias": 1, "rmsnorm": 1, "nonparametric": 0}
# ModelSpec.mlp of a non-gated MLP -> a Hugging Face hidden_act (hf_keys.MLP_OF_ACT reads them).
ACT_OF_MLP = {"squared-relu": "relu2", "relu": "relu", "gelu": "gelu"}
# DeepSeek-V3's keys and defaults (sigmoid routing, renormalised top-k): Moonshot's Kimi K2 (model_type kimi_k2) is
# DeepSeek-V3's architecture under its own name (its config.json names DeepseekV3ForCausalLM).
DEEPSEEK_V3_KEYS = ("deepseek_v3", "kimi_k2")
DEEPSEEK_KEYS = ("deepseek_v2", *DEEPSEEK_V3_KEYS)
MODEL_TYPES = {"llama": "llama", "gpt2": "gpt2",
               # Nemotron-4: Llama-style blocks with a non-gated squared-ReLU MLP (counted by the planner, not trained)
               "nemotron": "llama",
               # mixtures of experts with Llama-style blocks (DeepSeek's MLA attention is counted, not trained)
               "mixtral": "llama", "qwen2_moe": "llama", "qwen3_moe": "llama", "deepseek_v2": "llama", "deepseek_v3": "llama",
               # architectures with keys of their own (hf_architectures.READERS: each reader names its family, GPT-2's
               # blocks but ChatGLM's) and with Llama's keys (hf_architectures.LLAMA_VARIANTS): counted, not trained
               **dict.fromkeys(READERS, "gpt2"), **dict.fromkeys(LLAMA_VARIANTS, "llama")}


# What names a config an encoder's where its model_type does not (an unknown model_type is refused by name anyway):
# a masked-language-model or pre-training head in `architectures` (BertForMaskedLM, RobertaForMaskedLM,
# ElectraForPreTraining; a decoder's heads are ...ForCausalLM), or BERT's token-type embeddings (type_vocab_size).
ENCODER_HEADS = ("ForMaskedLM", "ForPreTraining")


def encoder_sign(cfg: dict) -> str:
    """What in the config says it is an encoder's ("architectures: BertForMaskedLM", "type_vocab_size"), or ""."""
    names = cfg.get("architectures")
    heads = [n for n in names if isinstance(n, str) and n.endswith(ENCODER_HEADS)] if isinstance(names, list) else []
    if heads:
        return f"architectures: {heads[0]}"
    return "type_vocab_size: BERT's token-type embeddings" if "type_vocab_size" in cfg else ""


# The head class names transformers gives a decoder's `architectures` (LlamaForCausalLM, GPT2LMHeadModel): the model
# type is the rest of the name, as transformers spells its classes after it (GptOssForCausalLM: gpt_oss).
CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")


def type_from_architectures(cfg: dict, source: str) -> str | None:
    """A config without model_type: the model type its `architectures` names (Qwen2ForCausalLM: qwen2), where that is
    one shardwise models; UsageError where it names another (its keys alone would read as Llama's, dropping what
    makes it that architecture: Cohere 2's interleaved windows, Granite-MoE's experts); None where it names no
    decoder."""
    names = cfg.get("architectures")
    heads = [n for n in names if isinstance(n, str) and n.endswith(CAUSAL_HEADS)] if isinstance(names, list) else []
    if not heads:
        return None
    stem = heads[0].removesuffix("ForCausalLM").removesuffix("LMHeadModel").lower()
    known = {t.replace("_", "").replace("-", ""): t for t in MODEL_TYPES}
    if stem not in known:
        raise UsageError(f"{source}: architectures {heads[0]} is not an architecture shardwise models (and the config "
                         f"names no model_type) — supported: {', '.join(sorted(MODEL_TYPES))}; pick a preset "
                         f"({', '.join(model_presets())})")
    return known[stem]


def model_family(cfg: dict, source: str) -> str:
    """The family of a config: by its model_type (which must be in MODEL_TYPES), else by its keys."""
    model_type = cfg.get("model_type")
    if model_type is not None:
        if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
            raise UsageError(f"{source}: model_type {model_type!r} is not an architecture shardwise models — "
                             f"supported: {', '.join(sorted(MODEL_TYPES))}; pick a preset ({', '.join(model_presets())})")
        return MODEL_TYPES[model_type]
    if "n_embd" in cfg:
        return "gpt2"
    if "hidden_size" in cfg:
        return "llama"
    raise UsageError(
        f"{source}: not a recognised model config — need Llama keys (hidden_size, ...) or GPT-2 keys (n_embd, ...)"
    )


def model_from_hf_config(cfg: dict, name: str, source: str) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config dict: Llama- or GPT-2-family keys, or an architecture's own
    (hf_architectures.READERS)."""
    if not isinstance(cfg, dict):
        raise UsageError(f"{source}: expected a JSON object with model keys, got {JSON_TYPES.get(type(cfg), type(cfg).__name__)} — give a "
                         f"Hugging Face config.json or use a preset")
    if cfg.get("is_encoder_decoder") is True or ("encoder_layers" in cfg and "decoder_layers" in cfg
                                                  and cfg.get("is_encoder_decoder") is not False):
        raise UsageError(f"{source}: an encoder-decoder model (is_encoder_decoder / encoder_layers and decoder_layers) "
                         f"— shardwise plans decoder-only transformers; give a decoder's config.json or a preset")
    encoder = encoder_sign(cfg)
    if encoder:
        raise UsageError(f"{source}: an encoder model ({encoder}) — shardwise plans decoder-only transformers; give a "
                         f"decoder's config.json or a preset")
    if cfg.get("model_type") is None and (named := type_from_architectures(cfg, source)) is not None:
        cfg = {**cfg, "model_type": named}  # read as the architecture it names, not by its keys alone
    family = model_family(cfg, source)
    model_type = str(cfg.get("model_type") or "")
    if model_type in READERS:
        spec = ModelSpec(name=name, model_type=model_type, **READERS[model_type](cfg, source))
    elif family == "gpt2":
        spec = _gpt2_spec(cfg, name, source)
    else:
        spec = _llama_spec(cfg, name, source, model_type)
    if spec.num_heads % spec.num_kv_heads:
        default = (f", {model_type}'s default where the config leaves it out" if "num_key_value_heads" not in cfg
                   and model_type in KV_HEADS_DEFAULT else "")
        raise UsageError(f"{source}: {spec.num_heads} attention heads are not a multiple of the {spec.num_kv_heads} "
                         f"key/value heads (num_key_value_heads{default}) — fix the config")
    if spec.family == "gpt2" and spec.hidden % spec.num_heads:
        raise UsageError(f"{source}: the hidden size {spec.hidden} (n_embd) is not divisible by the "
                         f"{spec.num_heads} heads (n_head) — fix the config")
    # Llama's own keys (an architecture's reader checks its own: ChatGLM's kv_channels, DeepSeek's MLA dims)
    if (model_type not in READERS and spec.family == "llama" and cfg.get("head_dim") is None
            and model_type not in HEAD_DIM_DEFAULT and spec.attention != "mla" and spec.hidden % spec.num_heads):
        raise UsageError(f"{source}: the hidden size {spec.hidden} (hidden_size) is not divisible by the "
                         f"{spec.num_heads} heads (num_attention_heads) — fix the config, or give head_dim")
    return replace(spec, **config_extras(cfg, spec.num_layers, model_type, source))


# The architectures whose transformers modelling code attends through a sliding window (Llama's ignores the key):
# (the window its config class defaults to, which layers use it without layer_types: "all", "even" (Gemma 2 and GPT-OSS
# alternate, the first local), "from_max" (Qwen2/3: layers from max_window_layers on), "even_below_max" (Qwen2-MoE:
# every other layer below it), whether use_sliding_window must say true (the Qwen configs default it to false)).
# Llama-keyed types whose configs hold flags Llama's keys cannot write back (to_hf_config refuses them).
OWN_KEY_TYPES = frozenset({"starcoder2", "stablelm", "cohere", "phimoe"})

WINDOWED_TYPES = {"mistral": (4096, "all", False), "mixtral": (0, "all", False), "starcoder2": (0, "all", False),
                  "phi3": (0, "all", False), "gemma2": (4096, "even", False), "gpt_oss": (128, "even", False),
                  "qwen2": (0, "from_max", True), "qwen3": (0, "from_max", True),
                  "qwen2_moe": (0, "even_below_max", True), "qwen3_moe": (0, "all", True),
                  # Gemma 3: 5 local layers of every sliding_window_pattern (6), then a global one; Phi-3.5-MoE: all
                  "gemma3_text": (4096, "pattern", False), "phimoe": (0, "all", False)}


# The layer kinds a config's layer_types may name for the architectures modelled here (transformers' Mistral, Qwen2,
# Gemma 2, GPT-OSS configs): attention over the whole sequence, or through the sliding window.
LAYER_TYPES = ("full_attention", "sliding_attention")


def config_extras(cfg: dict, num_layers: int, model_type: str, source: str = "config") -> dict:
    """What a config says beyond the model's shape: its sliding attention window and how many layers use it (as its
    transformers config class lays them out: WINDOWED_TYPES, or the config's layer_types), which the planner prices
    (ModelSpec.attended_keys); its RoPE scaling, and its multi-token-prediction modules, which it does not. Each value
    is checked (a window of "1024" or -1 is one line, not a model without a window); null is none."""
    def given(key: str, default: int = 0) -> int:
        return count(cfg, key, source) if key in cfg else default

    default, rule, switched = WINDOWED_TYPES.get(model_type, (0, "", False))
    window = given("sliding_window", default)
    on = flag(cfg, "use_sliding_window", source) or not switched
    window = window if rule and on else 0
    types, first = cfg.get("layer_types"), given("max_window_layers", 28)
    if types is not None and (not isinstance(types, list) or not all(isinstance(t, str) for t in types)):
        raise UsageError(f"{source}: layer_types must be a list of layer kinds such as \"full_attention\", "
                         f"\"sliding_attention\", got {json.dumps(types)[:60]} — fix the config")
    unknown = sorted({t for t in types or () if t not in LAYER_TYPES})
    if unknown:  # transformers' layer_type_validation refuses a kind outside its list; these models use these two
        raise UsageError(f"{source}: layer_types names {unknown[0]!r}, which shardwise does not model (it prices "
                         f"{' and '.join(repr(t) for t in LAYER_TYPES)} layers) — fix the config")
    if types and len(types) != num_layers:  # as transformers' layer_type_validation refuses it, window or not
        raise UsageError(f"{source}: layer_types names {len(types)} layers, but the model has {num_layers} "
                         f"(num_hidden_layers) — fix the config")
    if window and types:
        layers = sum(t == "sliding_attention" for t in types)
    else:
        local = {"all": lambda i: True, "even": lambda i: i % 2 == 0, "from_max": lambda i: i >= first,
                 "even_below_max": lambda i: i % 2 == 0 and i < first,
                 "pattern": lambda i: (i + 1) % optional(cfg, "sliding_window_pattern", 6, source) != 0,
                 }.get(rule, lambda i: False)
        layers = sum(local(i) for i in range(num_layers)) if window else 0
    return {"sliding_window": window if layers else 0, "window_layers": layers, "rope_scaling": rope_scaling(cfg, source),
            "mtp_layers": given("num_nextn_predict_layers")}


def rope_scaling(cfg: dict, source: str = "config") -> tuple:
    """The config's RoPE scaling as sorted (key, value) pairs, its type under "rope_type" (() for none, or
    transformers 5's "default"); read to be written to a launch file, not priced."""
    for key in ("rope_scaling", "rope_parameters"):  # transformers validates these as dicts; a string is a typo
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise UsageError(f"{source}: key '{key}' must be an object such as {{\"rope_type\": \"llama3\", \"factor\": 8.0, "
                             f"...}}, got {json.dumps(cfg[key])} — fix it, or leave it out for plain RoPE")
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(params, dict):
        return ()
    kind = params.get("rope_type", params.get("type"))
    if kind in (None, "default"):
        return ()
    for key, value in params.items():  # its factors are numbers (longrope's short/long factors lists of them; yarn's
        # truncate, GPT-OSS's, a flag)
        values = value if isinstance(value, list) else [value]
        if key not in ("rope_type", "type") and value is not None and not isinstance(value, bool) and not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            raise UsageError(f"{source}: RoPE scaling's '{key}' must be a finite number, got {json.dumps(value)[:40]} — "
                             f"fix it, or leave the key out")
    factor = params.get("factor")
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor <= 0:  # a scale of positions
        raise UsageError(f"{source}: RoPE scaling's 'factor' must be positive (how many times the trained context it "
                         f"stretches to, e.g. 8.0), got {factor} — fix it, or leave rope_scaling out")
    keep = {k: v for k, v in params.items() if k not in ("type", "rope_theta") and isinstance(v, (int, float, str))}
    return tuple(sorted((keep | {"rope_type": str(kind)}).items()))


# GPT2Config's attribute_map: transformers' generic names of GPT-2's own keys. Set after them, they win where a config
# gives both, as GPT2Config.from_dict reads it.
GPT2_ALIASES = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
                "max_position_embeddings": "n_positions"}


def _gpt2_spec(cfg: dict, name: str, source: str) -> ModelSpec:
    # each value checked under the name the file gives it (require_any: the generic name first, as it wins)
    names = {own: (generic, own) for generic, own in GPT2_ALIASES.items()}
    hidden = require_any(cfg, names["n_embd"], source)
    heads = require_any(cfg, names["n_head"], source)
    positions = next((k for k in names["n_positions"] if cfg.get(k) is not None), "n_positions")
    return ModelSpec(
        name=name, family="gpt2", hidden=hidden, ffn_hidden=optional(cfg, "n_inner", 4 * hidden, source),
        num_layers=require_any(cfg, names["n_layer"], source, MAX_LAYERS), num_heads=heads, num_kv_heads=heads,
        vocab_size=require(cfg, "vocab_size", source), head_dim=hidden // heads,
        max_positions=optional(cfg, positions, 1024, source),  # GPT2Config's default context
        # transformers' PretrainedConfig: tie_word_embeddings defaults to true, and GPT2LMHeadModel ties lm_head to
        # wte only then (PreTrainedModel.tie_weights); Megatron's GPTs may untie them
        tie_embeddings=flag(cfg, "tie_word_embeddings", source, default=True),
        norm_eps=optional(cfg, "layer_norm_epsilon", 1e-5, source),
        dropout=dropout(cfg, ("resid_pdrop", "attn_pdrop", "embd_pdrop"), source, default=0.1),
    )


def _llama_spec(cfg: dict, name: str, source: str, model_type: str) -> ModelSpec:
    """Llama's keys (and MoE, MLA, Nemotron's), then what a Llama-keyed architecture changes
    (hf_architectures.LLAMA_VARIANTS: Gemma's GeGLU, OLMo's norms, ...)."""
    hidden = require(cfg, "hidden_size", source)
    heads = require(cfg, "num_attention_heads", source)
    ffn = require(cfg, "intermediate_size", source)
    layers = require(cfg, "num_hidden_layers", source, MAX_LAYERS)
    check_stated_keys(cfg, source, model_type)
    attention = _attention_from_hf(cfg, source, model_type)
    head_dim = attention.pop("head_dim", 0) or optional(cfg, "head_dim", HEAD_DIM_DEFAULT.get(model_type, max(1, hidden // heads)),
                                                        source)
    # MLA's keys and values are per head (kv_b_proj): num_key_value_heads, which DeepSeek's configs carry, is unused
    kv = heads if attention.get("attention") == "mla" else _kv_heads(cfg, heads, model_type, source)
    biases = LLAMA_BIAS_KEYS.get(model_type, ("attention_bias", "mlp_bias"))
    fields = dict(
        name=name, family="llama", hidden=hidden, ffn_hidden=ffn,
        num_layers=layers, num_heads=heads, num_kv_heads=kv,
        vocab_size=require(cfg, "vocab_size", source), head_dim=head_dim,
        max_positions=optional(cfg, "max_position_embeddings", MAX_POSITIONS_DEFAULT.get(model_type, 2048), source),
        tie_embeddings=flag(cfg, "tie_word_embeddings", source),
        norm_eps=optional(cfg, "rms_norm_eps", 1e-5, source), rope_theta=optional(cfg, "rope_theta", _rope_theta(cfg), source),
        model_type=model_type, mlp=_mlp_from_hf(cfg, source, model_type),
        dropout=dropout(cfg, ("hidden_dropout", "attention_dropout"), source, default=0.0),
        # LlamaConfig's attention_bias (q, k, v, o) and mlp_bias (gate, up, down), where the architecture reads them
        # (LLAMA_BIAS_KEYS); None when off, the family's own
        attn_bias=("attention_bias" in biases and flag(cfg, "attention_bias", source)) or None,
        mlp_bias=("mlp_bias" in biases and flag(cfg, "mlp_bias", source)) or None,
        **_moe_from_hf(cfg, source, layers, model_type), **attention,
    )
    variant = LLAMA_VARIANTS.get(model_type)
    return ModelSpec(**(fields | (variant(cfg, source) if variant else {})))


# head_dim where a config leaves it out: the config class's default where it has one (else hidden / heads)
HEAD_DIM_DEFAULT = {"qwen3": 128, "gemma": 256, "gemma2": 256, "gemma3_text": 256, "gpt_oss": 64}
# max_position_embeddings where a config leaves it out: its transformers config class's default (LlamaConfig's 2048
# for the types not named; read for the runtime's refusal and the long-sequence note, never priced).
MAX_POSITIONS_DEFAULT = {"mistral": 131072, "mixtral": 131072, "gpt_oss": 131072, "qwen2": 32768, "qwen3": 32768,
                         "qwen2_moe": 32768, "qwen3_moe": 32768, "gemma": 8192, "gemma2": 8192, "deepseek_v3": 4096,
                         "nemotron": 4096, "phi3": 4096, "starcoder2": 4096}
# num_key_value_heads where a config leaves it out: the default of the architecture's transformers config class (None in
# LlamaConfig and the others not named: the attention heads, multi-head attention). A null key is the heads everywhere.
KV_HEADS_DEFAULT = {"mistral": 8, "mixtral": 8, "gpt_oss": 8, "qwen2": 32, "qwen3": 32, "qwen2_moe": 16, "qwen3_moe": 4,
                    "gemma": 16, "gemma2": 4, "starcoder2": 2, "gemma3_text": 4, "stablelm": 32, "phimoe": 8}

# Which of LlamaConfig's bias keys each architecture's transformers code reads (absent: both, as Llama's): Mistral,
# Mixtral, Qwen2 (its q/k/v biases are fixed: qkv_bias), Phi-3 build their linears without biases whatever the config
# says; Qwen3, Gemma, OLMo and DeepSeek-V3 (MLA's q_a, kv_a and o) read attention_bias only; GPT-OSS and StarCoder2
# set theirs (hf_architectures.LLAMA_VARIANTS); the remote-code architectures read their own keys there.
LLAMA_BIAS_KEYS = {"mistral": (), "mixtral": (), "qwen2": (), "qwen2_moe": (), "phi3": (), "starcoder2": (), "gpt_oss": (),
                   "qwen3": ("attention_bias",), "qwen3_moe": ("attention_bias",), "gemma": ("attention_bias",),
                   "gemma2": ("attention_bias",), "olmo": ("attention_bias",), "olmo2": ("attention_bias",),
                   "deepseek_v3": ("attention_bias",), "kimi_k2": ("attention_bias",),
                   "internlm": (), "internlm2": (), "baichuan": (), "qwen": ()}


def _kv_heads(cfg: dict, heads: int, model_type: str, source: str) -> int:
    if "num_key_value_heads" not in cfg:
        return KV_HEADS_DEFAULT.get(model_type, heads)
    return optional(cfg, "num_key_value_heads", heads, source)


def _mlp_from_hf(cfg: dict, source: str, model_type: str) -> str:
    """ModelSpec.mlp of a Llama-family config: '' (SwiGLU) except Nemotron's non-gated MLP (hidden_act), and a
    hand-written config without a model_type whose hidden_act names a non-gated activation (GELU, ReLU: a GPT-style
    two-matrix MLP, as such a config means; transformers itself loads no config without a model_type)."""
    if model_type == "nemotron":
        return mlp_of_act(cfg, "hidden_act", "relu2", source)
    if not model_type:  # none named, or SiLU: Llama's SwiGLU
        return mlp_of_act(cfg, "hidden_act", SWIGLU_ACTS[0], source, gated=SWIGLU_ACTS)
    # Llama's, Mixtral's, Qwen's and DeepSeek's MLPs gate with ACT2FN[hidden_act]: SiLU is SwiGLU, a GELU GeGLU (the
    # same matrices, counted alike, but another model to train or to write a launch file for)
    act = mlp_of_act(cfg, "hidden_act", SWIGLU_ACTS[0], source, gated=SWIGLU_ACTS)
    if act == "gelu":
        return "geglu"
    if act:  # a ReLU gate, say: no name for it here
        raise UsageError(f"{source}: hidden_act gates this MLP with {act}, which shardwise counts only as SiLU (SwiGLU) "
                         f"or GELU (GeGLU) — use silu or gelu")
    return ""


_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")  # Mixtral, Qwen-MoE, DeepSeek
# The model types that are mixtures of experts whatever their keys, and the key each names its expert count with.
_MOE_TYPES = {"mixtral": "num_local_experts", "qwen2_moe": "num_experts", "qwen3_moe": "num_experts",
              "deepseek_v2": "n_routed_experts", "deepseek_v3": "n_routed_experts", "kimi_k2": "n_routed_experts",
              "gpt_oss": "num_local_experts", "phimoe": "num_local_experts", "deepseek": "n_routed_experts"}


# Keys a family's config must state because a missing one would be read otherwise than transformers reads it (its
# configuration_<type>.py default, in parentheses in the refusal): without moe_intermediate_size the experts would
# take the dense FFN width, without the shared-expert and dense-layer counts none, without DeepSeek's LoRA ranks no
# low-rank projection (q_lora_rank null, as DeepSeek-V2-Lite writes it, is stated: none).
_DEEPSEEK_V3_STATED = {"moe_intermediate_size": 2048, "n_shared_experts": 1, "first_k_dense_replace": 3,
                       "q_lora_rank": 1536, "kv_lora_rank": 512}
_STATED_KEYS = {"qwen2_moe": {"moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632},
                "qwen3_moe": {"moe_intermediate_size": 768}, "deepseek": {"moe_intermediate_size": 1407},
                "deepseek_v2": {"moe_intermediate_size": 1407, "n_shared_experts": 2, "q_lora_rank": 1536,
                                "kv_lora_rank": 512},
                **dict.fromkeys(DEEPSEEK_V3_KEYS, _DEEPSEEK_V3_STATED)}


def check_stated_keys(cfg: dict, source: str, model_type: str) -> None:
    """One line naming the first key of _STATED_KEYS[model_type] the config leaves out."""
    for key, default in _STATED_KEYS.get(model_type, {}).items():
        if key not in cfg:
            raise UsageError(f"{source}: model_type {model_type} config leaves out '{key}' (transformers would fill in "
                             f"{default}, {model_type}'s default, which may not be this model's) — add it from the "
                             f"model's own config.json")


def _moe_from_hf(cfg: dict, source: str, num_layers: int, model_type: str) -> dict:
    """ModelSpec's mixture-of-experts fields from Mixtral, Qwen2/3-MoE or DeepSeek keys ({} for a dense model).
    Which layers are MoE follows each family's rule: DeepSeek's first_k_dense_replace (and moe_layer_freq),
    Qwen's decoder_sparse_step and mlp_only_layers."""
    key = next((k for k in _EXPERT_KEYS if cfg.get(k)), None)
    if key is None and model_type in _MOE_TYPES:  # transformers would fill in its default: say which, not plan a dense model
        raise UsageError(f"{source}: model_type {model_type} is a mixture of experts, but the config gives no expert "
                         f"count ('{_MOE_TYPES[model_type]}', at least 1) — add it from the model's own config.json")
    if key is None:
        return {}
    experts = require(cfg, key, source)
    top_k = require(cfg, "num_experts_per_tok", source)
    if top_k > experts:
        raise UsageError(f"{source}: num_experts_per_tok {top_k} exceeds the {experts} experts ({key}) — "
                         f"route each token to at most {experts} experts")
    width = optional(cfg, "moe_intermediate_size", 0, source) or require(cfg, "intermediate_size", source)
    shared = count(cfg, "shared_expert_intermediate_size", source) or count(cfg, "n_shared_experts", source) * width
    first_dense = count(cfg, "first_k_dense_replace", source)
    every, step = optional(cfg, "moe_layer_freq", 1, source), optional(cfg, "decoder_sparse_step", 1, source)
    dense_only = cfg.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense_only):
        raise UsageError(f"{source}: key 'mlp_only_layers' must be a list of layer indices, got {json.dumps(dense_only)} — fix it "
                         f"or leave it out")
    outside = [i for i in dense_only if not 0 <= i < num_layers]
    if outside:
        raise UsageError(f"{source}: mlp_only_layers {outside} are not layers of a {num_layers}-layer model (0 to "
                         f"{num_layers - 1}) — fix the config")
    moe_layers = tuple(i for i in range(num_layers)
                       if i >= first_dense and i % every == 0 and (i + 1) % step == 0 and i not in set(dense_only))
    if not moe_layers:
        raise UsageError(f"{source}: {experts} experts ({key}) but no layer is a MoE layer (first_k_dense_replace, "
                         f"moe_layer_freq, decoder_sparse_step or mlp_only_layers leave none of the {num_layers}) — "
                         f"fix the config, or drop the expert keys for a dense model")
    groups, topk_groups = optional(cfg, "n_group", 1, source), optional(cfg, "topk_group", 1, source)
    if groups < 1 or experts % groups or not 1 <= topk_groups <= groups:
        raise UsageError(f"{source}: group-limited routing needs n_group dividing the {experts} experts and "
                         f"1 <= topk_group <= n_group, got n_group {groups}, topk_group {topk_groups} — fix the config")
    scoring = cfg.get("scoring_func") or ("sigmoid" if model_type in DEEPSEEK_V3_KEYS else "softmax")
    if scoring not in ("softmax", "sigmoid"):
        raise UsageError(f"{source}: scoring_func {scoring!r} is not supported — use softmax or sigmoid")
    # Mixtral always renormalises the top-k weights (it has no key for it); the others say so in norm_topk_prob.
    norm = flag(cfg, "norm_topk_prob", source, model_type in ("mixtral", *DEEPSEEK_V3_KEYS) or key == "num_local_experts")
    coef = cfg.get("router_aux_loss_coef", cfg.get("aux_loss_alpha", 0.001))
    scaling = cfg.get("routed_scaling_factor", 1.0)
    for name, value in (("router_aux_loss_coef", coef), ("routed_scaling_factor", scaling)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6):
            raise UsageError(f"{source}: key '{name}' must be a non-negative number, got {value!r} — fix it or leave it out")
    return {"num_experts": experts, "experts_per_token": top_k, "moe_ffn_hidden": width, "shared_ffn_hidden": shared,
            "shared_expert_gate": bool(cfg.get("shared_expert_intermediate_size")), "moe_layers": moe_layers,
            "router_scoring": scoring, "norm_topk": bool(norm), "routed_scaling": float(scaling or 1.0),
            "aux_loss_coef": float(coef or 0.0), "router_groups": groups, "router_topk_groups": topk_groups}


def _rope_theta(cfg: dict) -> float:
    """transformers >= 5 writes the RoPE base as rope_parameters.rope_theta (older configs: rope_theta)."""
    params = cfg.get("rope_parameters")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta) if isinstance(theta, (int, float)) and not isinstance(theta, bool) and theta > 0 else 10000.0


def _attention_from_hf(cfg: dict, source: str, model_type: str) -> dict:
    """Attention variants beyond plain GQA: DeepSeek's MLA (kv_lora_rank), Qwen3's QK-norm, Qwen2's q/k/v biases."""
    out = {"qk_norm": "head" if model_type in ("qwen3", "qwen3_moe") else "",
           "qkv_bias": bool(cfg.get("qkv_bias", model_type in ("qwen2", "qwen2_moe")))}
    # MLA where the config gives a latent rank (0 is no rank: refused, transformers' modules would have no width); null
    # is none, which the runtime trains as plain attention under DeepSeek's routing (tests/test_moe_model.py)
    if cfg.get("kv_lora_rank") is not None:
        # q_lora_rank null: q projected at full rank (DeepSeek-V2-Lite); 0 is no rank, refused as kv_lora_rank's is
        q_rank = 0 if cfg.get("q_lora_rank") is None else require(cfg, "q_lora_rank", source)
        out.update(attention="mla", q_lora_rank=q_rank, kv_lora_rank=require(cfg, "kv_lora_rank", source),
                   qk_nope_head_dim=require(cfg, "qk_nope_head_dim", source),
                   qk_rope_head_dim=require(cfg, "qk_rope_head_dim", source), v_head_dim=require(cfg, "v_head_dim", source))
        out["head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]  # what q and k carry per head
    return out


def moe_hf_keys(spec: ModelSpec) -> dict:
    """The mixture-of-experts keys of `spec` in its family's spelling (round trips through model_from_hf_config)."""
    if not spec.is_moe:
        return {}
    dense = [i for i in range(spec.num_layers) if not spec.is_moe_layer(i)]
    keys = {"num_experts_per_tok": spec.experts_per_token, "moe_intermediate_size": spec.moe_ffn_hidden,
            "norm_topk_prob": spec.norm_topk, "router_aux_loss_coef": spec.aux_loss_coef}
    if spec.model_type in DEEPSEEK_KEYS:
        if dense != list(range(len(dense))):
            raise ValueError("DeepSeek configs can only make the first layers dense")
        keys.update(n_routed_experts=spec.num_experts, n_shared_experts=spec.shared_ffn_hidden // spec.moe_ffn_hidden,
                    first_k_dense_replace=len(dense), routed_scaling_factor=spec.routed_scaling,
                    n_group=spec.router_groups, topk_group=spec.router_topk_groups, scoring_func=spec.router_scoring)
        return keys
    keys.update({"num_experts" if spec.model_type.startswith("qwen") else "num_local_experts": spec.num_experts,
                 "mlp_only_layers": dense, "decoder_sparse_step": 1, "scoring_func": spec.router_scoring,
                 "routed_scaling_factor": spec.routed_scaling})
    if spec.shared_expert_gate or spec.model_type == "qwen2_moe":  # Qwen2-MoE states it, 0 for none (_STATED_KEYS)
        keys["shared_expert_intermediate_size"] = spec.shared_ffn_hidden
    elif spec.shared_ffn_hidden:
        keys["n_shared_experts"] = spec.shared_ffn_hidden // spec.moe_ffn_hidden
    return keys


def attention_hf_keys(spec: ModelSpec) -> dict:
    if spec.attention == "mla":
        return {"q_lora_rank": spec.q_lora_rank or None, "kv_lora_rank": spec.kv_lora_rank,
                "qk_nope_head_dim": spec.qk_nope_head_dim, "qk_rope_head_dim": spec.qk_rope_head_dim,
                "v_head_dim": spec.v_head_dim}
    biases = {"attention_bias": spec.attn_bias, "mlp_bias": spec.mlp_bias}  # LlamaConfig's keys, where set
    return {k: v for k, v in biases.items() if v is not None} | ({"qkv_bias": True} if spec.qkv_bias else {})


# What a JSON document's top level was, in JSON's words.
JSON_TYPES = {type(None): "null", list: "a list", str: "a string", int: "a number", float: "a number", bool: "true or false"}


def read_json_file(path: Path, source: str, fix: str):
    """A user's JSON file, or one UsageError line naming it and the fix."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{source}: malformed JSON ({exc}) — {fix}") from None
    except ValueError as exc:  # an integer past Python's digit limit for str -> int (sys.set_int_max_str_digits)
        raise UsageError(f"{source}: malformed JSON ({exc}) — {fix}") from None
    except OSError as exc:
        raise UsageError(f"{source}: cannot read it ({exc.strerror}) — check the path and its permissions") from None
    except RecursionError:
        raise UsageError(f"{source}: nested too deeply to be a config — {fix}") from None


def config_path(ref: str | None) -> str | None:
    """The config.json file `load_model(ref)` reads: ref itself (a config file), the folder's config.json, or None (a
    preset, or nothing there)."""
    if not ref:
        return None
    path = Path(ref)
    if path.is_dir():
        return str(path / "config.json") if (path / "config.json").is_file() else None
    return str(path) if path.is_file() else None


def load_model(ref: str) -> ModelSpec:
    """A preset name (see `model_presets()`), a path to a Hugging Face config.json, or a model folder holding one."""
    path = Path(ref)
    if not ref.strip():
        raise UsageError(f"--model is empty — give a preset ({', '.join(model_presets())}), a config.json or a model folder")
    if ref not in model_presets():  # a named pipe, a symlink loop: said as such, never opened (a pipe would block)
        refuse_special(path, f"--model {ref}", f"; or give a preset ({', '.join(model_presets())})")
    if path.is_dir():
        refuse_special(path / "config.json", f"--model {ref}: its config.json")
        if not (path / "config.json").is_file():
            raise UsageError(f"{ref}: no config.json in this folder — a Hugging Face model folder holds config.json "
                             f"(and its weights); or give a preset ({', '.join(model_presets())})")
        cfg = read_json_file(path / "config.json", str(path / "config.json"), "fix the file or download the model again")
        return model_from_hf_config(cfg, name=path.resolve().name, source=str(path / "config.json"))
    if ref.endswith(".json") or path.is_file():
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "not found"  # a pipe, a device
            raise UsageError(f"model config '{ref}' {what} — give a preset ({', '.join(model_presets())}) or an existing config.json")
        cfg = read_json_file(path, ref, "fix the file or use a preset")
        # config.json: its folder's name (absolute, not resolved: a Hugging Face cache links it into blobs/)
        name = path.stem if path.stem != "config" else path.absolute().parent.name
        return model_from_hf_config(cfg, name=name, source=ref)
    ref = HUB_PRESETS.get(ref.lower(), ref)  # a Hugging Face hub id whose config a preset is
    preset = preset_dir("models").joinpath(f"{ref}.json")
    if ref not in model_presets() or not preset.is_file():
        twin = HUB_PRESETS.get(f"{ref.lower()}-hf")
        if twin and not path.exists():  # Meta's original-format repos (meta-llama/Llama-2-7b) hold no config.json
            raise UsageError(f"--model {ref}: Meta's original checkpoint, which has no config.json — its transformers "
                             f"twin {ref}-hf is the preset {twin}: pass --model {twin}")
        if HUB_ID.fullmatch(ref) and not path.exists():
            raise UsageError(f"--model {ref}: not found here, and shardwise reads no network — download its config "
                             f"(`hf download {ref} config.json --local-dir {ref.split('/')[1]}`; `huggingface-cli "
                             f"download` before huggingface_hub 0.34) and pass that folder, or give a preset "
                             f"({', '.join(model_presets())})")
        if "/" in ref or os.sep in ref or path.exists():
            raise UsageError(f"--model {ref}: {'not a model folder or a config.json' if path.exists() else 'not found'} — "
                             f"give a Hugging Face model folder, its config.json, or a preset ({', '.join(model_presets())})")
        raise UsageError(f"unknown model '{ref}' — valid presets: {', '.join(model_presets())}; or pass a path to a config.json")
    return model_from_hf_config(json.loads(preset.read_text()), name=ref, source=f"preset {ref}")


# Hugging Face hub ids whose config.json a preset is (lower case): `--model meta-llama/Llama-2-70b-hf` reads the
# preset, as no network is read. Each preset is that repository's config.json (parameter counts tested against
# transformers and the model cards, tests/test_specs.py).
HUB_PRESETS = {
    "openai-community/gpt2": "gpt2", "huggyllama/llama-65b": "llama-65b",
    **{f"meta-llama/llama-2-{size}-hf": f"llama2-{size}" for size in ("7b", "13b", "70b")},
    "meta-llama/meta-llama-3-8b": "llama3-8b", "meta-llama/meta-llama-3-70b": "llama3-70b",
    **{f"meta-llama/{prefix}llama-3.1-{size}": f"llama3.1-{size}" for prefix in ("", "meta-") for size in
       ("8b", "70b", "405b")},
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b", "mistralai/mixtral-8x22b-v0.1": "mixtral-8x22b",
    "qwen/qwen1.5-moe-a2.7b": "qwen1.5-moe-a2.7b", "qwen/qwen3-30b-a3b": "qwen3-30b-a3b",
    "deepseek-ai/deepseek-v3": "deepseek-v3",
}
# ORG/NAME as the hub spells repositories (no leading or trailing '.' or '-', no '..'), and not a file a user meant
# to give (a name ending in a file's extension): what a user types for a model they have not downloaded
HUB_ID = re.compile(r"(?!.*\.\.)(?!.*\.(?:json|toml|safetensors|bin|txt|pt|yaml|yml)$)"
                    r"[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?")
