"""Validated descriptions of what is trained, where, and how it is split.

ModelSpec   — the architecture (from a preset or a Hugging Face config.json).
ClusterSpec — the hardware (from a preset or a TOML file).
TrainSpec   — the job: global batch, sequence length, optimizer bytes.
Layout      — one way to split the job: dp x tp x pp, micro-batch, ZeRO, recompute, schedule.

Everything here is plain Python (no torch), so the planner imports in milliseconds.
Every check raises UsageError with one line that names the problem and the fix.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path

from shardwise.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

# The one list of pipeline schedules (schedules/generators.py builds each) and of recompute policies.
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1")
PLANNED_SCHEDULES = SCHEDULES[1:]  # what `plan` searches and `simulate --compare` draws: all but the article's naive
RECOMPUTE = ("none", "selective", "full")


def default_schedule(vpp: int) -> str:
    """The schedule a layout runs when none is named: interleaved 1F1B with virtual stages, else 1F1B."""
    return "interleaved-1f1b" if vpp > 1 else "1f1b"
CP_MODES = ("ring", "allgather")
ZERO_STAGES = (0, 1, 2, 3)


# --------------------------------------------------------------------------- model


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
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k
    qkv_bias: bool = False  # Qwen2: biases on q, k, v
    # The MLP where it is not the family's own (llama SwiGLU, gpt2 GELU), counted by the planner: "swiglu", "geglu"
    # (gated: three matrices) or "gelu", "relu", "squared-relu" (two: Nemotron-4's squared ReLU with Llama-style
    # blocks otherwise).
    mlp: str = ""
    # Whether training applies dropout (and keeps its masks for backward); None: the family's recipes (GPT-2 yes,
    # Llama no). HF configs say it (resid_pdrop / hidden_dropout); MosaicML's MPT recipes set it to 0.
    dropout: bool | None = None

    @property
    def gated_mlp(self) -> bool:
        return self.mlp in GATED_MLPS if self.mlp else self.family == "llama"

    @property
    def trains_with_dropout(self) -> bool:
        return self.family == "gpt2" if self.dropout is None else self.dropout

    @property
    def has_bias(self) -> bool:
        return self.family == "gpt2"

    @property
    def learned_positions(self) -> bool:
        return self.family == "gpt2"

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

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
            return q + kv + heads * self.v_head_dim * h
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.has_bias:
            attn += self.q_dim + 2 * self.kv_dim + h
        elif self.qkv_bias:
            attn += self.q_dim + 2 * self.kv_dim
        return attn + (2 * self.head_dim if self.qk_norm else 0)

    def dense_ffn_params(self, width: int | None = None) -> int:
        f = self.ffn_hidden if width is None else width
        return (3 if self.gated_mlp else 2) * self.hidden * f + ((f + self.hidden) if self.has_bias else 0)

    def expert_params(self) -> int:
        """One routed expert (a SwiGLU of width moe_ffn_hidden)."""
        return 3 * self.hidden * self.moe_ffn_hidden

    def moe_dense_params(self) -> int:
        """What every token of a MoE layer's FFN uses: the router, the shared expert (and its gate)."""
        shared = 3 * self.hidden * self.shared_ffn_hidden + (self.hidden if self.shared_expert_gate else 0)
        return self.num_experts * self.hidden + shared

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
        norms = 2 * self.hidden * (2 if self.family == "gpt2" else 1)  # LayerNorm has a bias
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
        pos = self.max_positions * self.hidden if self.learned_positions else 0
        return self.vocab_size * self.hidden + pos

    def head_params(self) -> int:
        """Final norm plus the LM head (zero extra when tied to the embedding)."""
        final_norm = self.hidden * (2 if self.family == "gpt2" else 1)
        return final_norm + (0 if self.tie_embeddings else self.vocab_size * self.hidden)

    def num_params(self) -> int:
        return _layer_sum(self, False) + self.embedding_params() + self.head_params()

    def active_params(self) -> int:
        """Parameters one token uses: all but the routed experts it is not sent to (MoE); num_params when dense."""
        return _layer_sum(self, True) + self.embedding_params() + self.head_params()

    def to_hf_config(self) -> dict:
        """An HF-style config.json for this spec (round-trips through load_model)."""
        if self.family == "gpt2":
            return {
                "model_type": "gpt2", "n_embd": self.hidden, "n_layer": self.num_layers,
                "n_head": self.num_heads, "n_inner": self.ffn_hidden, "n_positions": self.max_positions,
                "vocab_size": self.vocab_size, "layer_norm_epsilon": self.norm_eps,
            } | ({"resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.0} if self.dropout is False else {})
        cfg = {
            "model_type": self.model_type or ("llama" if self.gated_mlp else "nemotron"), "hidden_size": self.hidden,
            "intermediate_size": self.ffn_hidden,
            "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads, "vocab_size": self.vocab_size,
            "head_dim": self.head_dim, "max_position_embeddings": self.max_positions,
            "tie_word_embeddings": self.tie_embeddings, "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
        }
        if not self.gated_mlp:
            cfg["hidden_act"] = ACT_OF_MLP.get(self.mlp, "relu2")
        if self.dropout:
            cfg |= {"hidden_dropout": 0.1, "attention_dropout": 0.1}
        return cfg | moe_hf_keys(self) | attention_hf_keys(self)


@lru_cache(maxsize=256)
def _layer_sum(spec: ModelSpec, active: bool) -> int:
    """All layers' parameters (or only those a token uses): summed once per spec, as the planner asks often."""
    if not spec.is_moe:
        return spec.num_layers * spec.layer_params(0, active=active)
    return sum(spec.layer_params(i, active=active) for i in range(spec.num_layers))


def _preset_dir(kind: str):
    return resources.files("shardwise").joinpath("presets").joinpath(kind)


def model_presets() -> list[str]:
    return sorted(p.name[: -len(".json")] for p in _preset_dir("models").iterdir() if p.name.endswith(".json"))


def cluster_presets() -> list[str]:
    return sorted(p.name[: -len(".toml")] for p in _preset_dir("clusters").iterdir() if p.name.endswith(".toml"))


# Hugging Face `model_type` -> the family shardwise models it as: parameters, memory, time and the runtime's
# model all follow that family. A config of any other model_type is refused by name (it would be modelled
# wrongly). Add an architecture here, in this one place, once it is modelled; a config without model_type
# is read by its keys (Llama's hidden_size..., GPT-2's n_embd...).
# MLP names (ModelSpec.mlp): gated ones have three matrices.
MLPS = ("swiglu", "geglu", "gelu", "relu", "squared-relu")
GATED_MLPS = ("swiglu", "geglu")
# Hugging Face hidden_act of a non-gated MLP (Nemotron's "relu2" is squared ReLU) and back.
MLP_OF_ACT = {"relu2": "squared-relu", "relu": "relu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_new": "gelu"}
ACT_OF_MLP = {"squared-relu": "relu2", "relu": "relu", "gelu": "gelu"}
MODEL_TYPES = {"llama": "llama", "gpt2": "gpt2",
               # Nemotron-4: Llama-style blocks with a non-gated squared-ReLU MLP (counted by the planner, not trained)
               "nemotron": "llama",
               # mixtures of experts with Llama-style blocks (DeepSeek's MLA attention is counted, not trained)
               "mixtral": "llama", "qwen2_moe": "llama", "qwen3_moe": "llama", "deepseek_v2": "llama", "deepseek_v3": "llama"}
MAX_LAYERS = 10_000  # far beyond any model built; bounds the planner's work (pipeline splits, virtual stages)
MAX_DIM = 2**31  # any width, head count or vocabulary


def _require(cfg: dict, key: str, source: str, limit: int = MAX_DIM):
    if key not in cfg:
        raise UsageError(f"{source}: missing key '{key}' — add it to the config (see the Hugging Face config of the model)")
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UsageError(f"{source}: key '{key}' must be a positive integer, got {value!r}")
    if value > limit:
        raise UsageError(f"{source}: key '{key}' is {value:,}, above the {limit:,} shardwise accepts — check the config")
    return value


def _optional(cfg: dict, key: str, default, source: str):
    """An optional key: absent or null gives `default`; else an integer (int default) or a number (float
    default) that is positive and finite."""
    value = cfg.get(key)
    if value is None:
        return default
    kind = type(default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok or (kind is int and value != int(value)) or value > MAX_DIM:
        what = "a positive integer" if kind is int else "a positive number"
        raise UsageError(f"{source}: key '{key}' must be {what}, got {value!r} — fix it or leave it out")
    return kind(value)


def _flag(cfg: dict, key: str, source: str) -> bool:
    value = cfg.get(key, False)
    if not isinstance(value, bool) and value is not None:
        raise UsageError(f"{source}: key '{key}' must be true or false, got {value!r}")
    return bool(value)


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
    """Build a ModelSpec from a Hugging Face config dict (Llama- or GPT-2-family keys)."""
    if not isinstance(cfg, dict):
        raise UsageError(f"{source}: expected a JSON object with model keys, got {type(cfg).__name__}")
    family = model_family(cfg, source)
    if family == "gpt2":
        hidden = _require(cfg, "n_embd", source)
        heads = _require(cfg, "n_head", source)
        spec = ModelSpec(
            name=name, family="gpt2", hidden=hidden, ffn_hidden=_optional(cfg, "n_inner", 4 * hidden, source),
            num_layers=_require(cfg, "n_layer", source, MAX_LAYERS), num_heads=heads, num_kv_heads=heads,
            vocab_size=_require(cfg, "vocab_size", source), head_dim=hidden // heads,
            max_positions=_require(cfg, "n_positions", source), tie_embeddings=True,
            norm_eps=_optional(cfg, "layer_norm_epsilon", 1e-5, source),
            dropout=_dropout(cfg, ("resid_pdrop", "attn_pdrop", "embd_pdrop"), source, default=0.1),
        )
    else:
        hidden = _require(cfg, "hidden_size", source)
        heads = _require(cfg, "num_attention_heads", source)
        ffn = _require(cfg, "intermediate_size", source)
        layers = _require(cfg, "num_hidden_layers", source, MAX_LAYERS)
        model_type = str(cfg.get("model_type", ""))
        attention = _attention_from_hf(cfg, source, model_type)
        head_dim = attention.pop("head_dim", 0) or _optional(cfg, "head_dim", max(1, hidden // heads), source)
        spec = ModelSpec(
            name=name, family="llama", hidden=hidden, ffn_hidden=ffn, num_layers=layers, num_heads=heads,
            num_kv_heads=_optional(cfg, "num_key_value_heads", heads, source),
            vocab_size=_require(cfg, "vocab_size", source), head_dim=head_dim,
            max_positions=_optional(cfg, "max_position_embeddings", 2048, source),
            tie_embeddings=_flag(cfg, "tie_word_embeddings", source),
            norm_eps=_optional(cfg, "rms_norm_eps", 1e-5, source), rope_theta=_optional(cfg, "rope_theta", _rope_theta(cfg), source),
            model_type=model_type, mlp=_mlp_from_hf(cfg, source, model_type),
            dropout=_dropout(cfg, ("hidden_dropout", "attention_dropout"), source, default=0.0),
            **_moe_from_hf(cfg, source, layers, model_type), **attention,
        )
    if spec.num_heads % spec.num_kv_heads:
        raise UsageError(f"{source}: num_attention_heads {spec.num_heads} is not a multiple of num_key_value_heads {spec.num_kv_heads}")
    if spec.family == "gpt2" and spec.hidden % spec.num_heads:
        raise UsageError(f"{source}: n_embd {spec.hidden} is not divisible by n_head {spec.num_heads}")
    return spec


def _mlp_from_hf(cfg: dict, source: str, model_type: str) -> str:
    """ModelSpec.mlp of a Llama-family config: '' (SwiGLU) except Nemotron's non-gated MLP (hidden_act)."""
    if model_type != "nemotron":
        return ""
    act = cfg.get("hidden_act", "relu2")
    if act not in MLP_OF_ACT:
        raise UsageError(f"{source}: hidden_act {act!r} is not an activation shardwise counts for a non-gated MLP — "
                         f"use one of {', '.join(MLP_OF_ACT)}")
    return MLP_OF_ACT[act]


def _dropout(cfg: dict, keys: tuple[str, ...], source: str, default: float) -> bool | None:
    """Whether the config trains with dropout: any of `keys` above 0 (absent keys count as Hugging Face's `default`);
    None when the answer is the family's own (GPT-2 with dropout, Llama without)."""
    values = []
    for key in keys:
        value = cfg.get(key, default)
        if value is None:
            value = 0.0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise UsageError(f"{source}: key '{key}' must be a probability in [0, 1), got {value!r}")
        values.append(value)
    on = any(v > 0 for v in values)
    return None if on == (default > 0) else on


_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")  # Mixtral, Qwen-MoE, DeepSeek


def _moe_from_hf(cfg: dict, source: str, num_layers: int, model_type: str) -> dict:
    """ModelSpec's mixture-of-experts fields from Mixtral, Qwen2/3-MoE or DeepSeek keys ({} for a dense model).
    Which layers are MoE follows each family's rule: DeepSeek's first_k_dense_replace (and moe_layer_freq),
    Qwen's decoder_sparse_step and mlp_only_layers."""
    key = next((k for k in _EXPERT_KEYS if cfg.get(k)), None)
    if key is None:
        return {}
    experts = _require(cfg, key, source)
    top_k = _require(cfg, "num_experts_per_tok", source)
    if top_k > experts:
        raise UsageError(f"{source}: num_experts_per_tok {top_k} exceeds the {experts} experts ({key}) — "
                         f"route each token to at most {experts} experts")
    width = _optional(cfg, "moe_intermediate_size", 0, source) or _require(cfg, "intermediate_size", source)
    shared = _count(cfg, "shared_expert_intermediate_size", source) or _count(cfg, "n_shared_experts", source) * width
    first_dense = _count(cfg, "first_k_dense_replace", source)
    every, step = _optional(cfg, "moe_layer_freq", 1, source), _optional(cfg, "decoder_sparse_step", 1, source)
    dense_only = cfg.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or not all(isinstance(i, int) for i in dense_only):
        raise UsageError(f"{source}: key 'mlp_only_layers' must be a list of layer indices, got {dense_only!r}")
    moe_layers = tuple(i for i in range(num_layers)
                       if i >= first_dense and i % every == 0 and (i + 1) % step == 0 and i not in set(dense_only))
    scoring = cfg.get("scoring_func") or ("sigmoid" if model_type == "deepseek_v3" else "softmax")
    if scoring not in ("softmax", "sigmoid"):
        raise UsageError(f"{source}: scoring_func {scoring!r} is not supported — use softmax or sigmoid")
    # Mixtral always renormalises the top-k weights (it has no key for it); the others say so in norm_topk_prob.
    norm = cfg.get("norm_topk_prob", model_type in ("mixtral", "deepseek_v3") or key == "num_local_experts")
    coef = cfg.get("router_aux_loss_coef", cfg.get("aux_loss_alpha", 0.001))
    scaling = cfg.get("routed_scaling_factor", 1.0)
    for name, value in (("router_aux_loss_coef", coef), ("routed_scaling_factor", scaling)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6):
            raise UsageError(f"{source}: key '{name}' must be a non-negative number, got {value!r}")
    return {"num_experts": experts, "experts_per_token": top_k, "moe_ffn_hidden": width, "shared_ffn_hidden": shared,
            "shared_expert_gate": bool(cfg.get("shared_expert_intermediate_size")), "moe_layers": moe_layers,
            "router_scoring": scoring, "norm_topk": bool(norm), "routed_scaling": float(scaling or 1.0),
            "aux_loss_coef": float(coef or 0.0), "router_groups": _optional(cfg, "n_group", 1, source),
            "router_topk_groups": _optional(cfg, "topk_group", 1, source)}


def _rope_theta(cfg: dict) -> float:
    """transformers >= 5 writes the RoPE base as rope_parameters.rope_theta (older configs: rope_theta)."""
    params = cfg.get("rope_parameters")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta) if isinstance(theta, (int, float)) and not isinstance(theta, bool) and theta > 0 else 10000.0


def _count(cfg: dict, key: str, source: str) -> int:
    """A non-negative integer key (absent or null: 0)."""
    value = cfg.get(key) or 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_DIM:
        raise UsageError(f"{source}: key '{key}' must be a non-negative integer, got {value!r}")
    return value


def _attention_from_hf(cfg: dict, source: str, model_type: str) -> dict:
    """Attention variants beyond plain GQA: DeepSeek's MLA (kv_lora_rank), Qwen3's QK-norm, Qwen2's q/k/v biases."""
    out = {"qk_norm": model_type in ("qwen3", "qwen3_moe"),
           "qkv_bias": bool(cfg.get("qkv_bias", model_type in ("qwen2", "qwen2_moe")))}
    if cfg.get("kv_lora_rank"):
        out.update(attention="mla", q_lora_rank=_count(cfg, "q_lora_rank", source), kv_lora_rank=_require(cfg, "kv_lora_rank", source),
                   qk_nope_head_dim=_require(cfg, "qk_nope_head_dim", source),
                   qk_rope_head_dim=_require(cfg, "qk_rope_head_dim", source), v_head_dim=_require(cfg, "v_head_dim", source))
        out["head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]  # what q and k carry per head
    return out


def moe_hf_keys(spec: ModelSpec) -> dict:
    """The mixture-of-experts keys of `spec` in its family's spelling (round trips through model_from_hf_config)."""
    if not spec.is_moe:
        return {}
    dense = [i for i in range(spec.num_layers) if not spec.is_moe_layer(i)]
    keys = {"num_experts_per_tok": spec.experts_per_token, "moe_intermediate_size": spec.moe_ffn_hidden,
            "norm_topk_prob": spec.norm_topk, "router_aux_loss_coef": spec.aux_loss_coef}
    if spec.model_type.startswith("deepseek"):
        if dense != list(range(len(dense))):
            raise ValueError("DeepSeek configs can only make the first layers dense")
        keys.update(n_routed_experts=spec.num_experts, n_shared_experts=spec.shared_ffn_hidden // spec.moe_ffn_hidden,
                    first_k_dense_replace=len(dense), routed_scaling_factor=spec.routed_scaling,
                    n_group=spec.router_groups, topk_group=spec.router_topk_groups, scoring_func=spec.router_scoring)
        return keys
    keys.update({"num_experts" if spec.model_type.startswith("qwen") else "num_local_experts": spec.num_experts,
                 "mlp_only_layers": dense, "decoder_sparse_step": 1, "scoring_func": spec.router_scoring,
                 "routed_scaling_factor": spec.routed_scaling})
    if spec.shared_expert_gate:
        keys["shared_expert_intermediate_size"] = spec.shared_ffn_hidden
    elif spec.shared_ffn_hidden:
        keys["n_shared_experts"] = spec.shared_ffn_hidden // spec.moe_ffn_hidden
    return keys


def attention_hf_keys(spec: ModelSpec) -> dict:
    if spec.attention == "mla":
        return {"q_lora_rank": spec.q_lora_rank or None, "kv_lora_rank": spec.kv_lora_rank,
                "qk_nope_head_dim": spec.qk_nope_head_dim, "qk_rope_head_dim": spec.qk_rope_head_dim,
                "v_head_dim": spec.v_head_dim}
    return {"qkv_bias": True} if spec.qkv_bias else {}


def read_json_file(path: Path, source: str, fix: str):
    """A user's JSON file, or one UsageError line naming it and the fix."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{source}: malformed JSON ({exc}) — {fix}") from None
    except OSError as exc:
        raise UsageError(f"{source}: cannot read it ({exc.strerror}) — check the path and its permissions") from None
    except RecursionError:
        raise UsageError(f"{source}: nested too deeply to be a config — {fix}") from None


def load_model(ref: str) -> ModelSpec:
    """A preset name (see `model_presets()`), a path to a Hugging Face config.json, or a model folder holding one."""
    path = Path(ref)
    if not ref.strip():
        raise UsageError(f"--model is empty — give a preset ({', '.join(model_presets())}), a config.json or a model folder")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"{ref}: no config.json in this folder — a Hugging Face model folder holds config.json "
                             f"(and its weights); or give a preset ({', '.join(model_presets())})")
        cfg = read_json_file(path / "config.json", str(path / "config.json"), "fix the file or download the model again")
        return model_from_hf_config(cfg, name=path.resolve().name, source=str(path / "config.json"))
    if ref.endswith(".json") or path.is_file():
        if not path.is_file():
            raise UsageError(f"model config '{ref}' not found — give a preset ({', '.join(model_presets())}) or an existing config.json")
        cfg = read_json_file(path, ref, "fix the file or use a preset")
        return model_from_hf_config(cfg, name=path.stem if path.stem != "config" else path.parent.name, source=ref)
    preset = _preset_dir("models").joinpath(f"{ref}.json")
    if ref not in model_presets() or not preset.is_file():
        if "/" in ref or os.sep in ref or path.exists():
            raise UsageError(f"--model {ref}: {'not a model folder or a config.json' if path.exists() else 'not found'} — "
                             f"give a Hugging Face model folder, its config.json, or a preset ({', '.join(model_presets())})")
        raise UsageError(f"unknown model '{ref}' — valid presets: {', '.join(model_presets())}; or pass a path to a config.json")
    return model_from_hf_config(json.loads(preset.read_text()), name=ref, source=f"preset {ref}")


# --------------------------------------------------------------------------- cluster


@dataclass(frozen=True)
class ClusterSpec:
    """Hardware, per GPU. Bandwidths are unidirectional bytes/s one GPU can drive on that link."""

    name: str
    gpus_per_node: int
    gpu_memory_bytes: float
    peak_flops: float  # dense BF16 FLOP/s per GPU
    hbm_bandwidth: float  # bytes/s
    intra_node_bandwidth: float  # NVLink, bytes/s per GPU, one direction
    inter_node_bandwidth: float  # network, bytes/s per GPU, one direction
    intra_node_latency: float = 5e-6  # seconds per collective step
    inter_node_latency: float = 10e-6
    num_gpus: int = 0  # 0 = not fixed by the cluster; `--gpus` sets it
    # Optional measured tables from `shardwise calibrate` (size -> seconds); empty for datasheet presets.
    measured: dict = field(default_factory=dict, compare=False, hash=False)
    # What the planner's kernel and collective models read (planner/kernels.py, planner/comm.py);
    # 0 / "" = unknown, and those models fall back to plain rates (docs/planner.md).
    sm_count: int = 0  # streaming multiprocessors: GEMM tiles run in waves of this many
    mamf_tflops: float = 0.0  # maximum achievable dense BF16 matmul TFLOP/s (a kernel measurement)
    arch: str = ""  # "ampere" | "hopper": picks the attention kernels' and NCCL's constants
    fp8_flops: float = 0.0  # dense FP8 tensor-core FLOP/s per GPU (0: no FP8 tensor cores, e.g. A100)

    @property
    def gpu_memory_gib(self) -> float:
        return self.gpu_memory_bytes / 2**30


_CLUSTER_KEYS = {
    "gpus_per_node": int, "gpu_memory_gib": float, "peak_tflops": float, "hbm_bandwidth_gbs": float,
    "intra_node_bandwidth_gbs": float, "inter_node_bandwidth_gbs": float,
}
# Optional [cluster] keys of the kernel models (each preset cites its source).
_OPTIONAL_KEYS = {"sm_count": int, "mamf_tflops": float, "fp8_peak_tflops": float}
ARCHS = ("ampere", "hopper")


def cluster_from_toml(data: dict, name: str, source: str) -> ClusterSpec:
    """Cluster TOML: a [cluster] table with the keys in _CLUSTER_KEYS (GB/s = 1e9 bytes/s, TFLOP/s = 1e12)."""
    table = data.get("cluster", {k: v for k, v in data.items() if k != "measured"})
    if not isinstance(table, dict):
        raise UsageError(f"{source}: [cluster] must be a table of keys — see the presets in shardwise/presets/clusters")
    _check_cluster_keys(table, source)
    values = {}
    for key, kind in (*_CLUSTER_KEYS.items(), *_OPTIONAL_KEYS.items()):
        if key not in table:
            if key in _OPTIONAL_KEYS:
                continue
            raise UsageError(f"{source}: missing key '{key}' in [cluster] — see the presets in shardwise/presets/clusters")
        values[key] = _cluster_number(table, key, kind, source)
        if values[key] <= 0:
            raise UsageError(f"{source}: key '{key}' must be positive, got {table[key]!r}")
    for key in ("intra_node_latency_us", "inter_node_latency_us", "num_gpus"):
        if key in table and _cluster_number(table, key, int if key == "num_gpus" else float, source) < 0:
            raise UsageError(f"{source}: key '{key}' must not be negative, got {table[key]!r}")
    _check_measured(data.get("measured", {}), source)
    arch = str(table.get("arch", ""))
    if arch and arch not in ARCHS:
        raise UsageError(f"{source}: unknown arch '{arch}' — use one of {', '.join(ARCHS)}, or leave it out")
    return ClusterSpec(
        name=str(table.get("name", name)),
        gpus_per_node=values["gpus_per_node"],
        gpu_memory_bytes=values["gpu_memory_gib"] * 2**30,
        peak_flops=values["peak_tflops"] * 1e12,
        hbm_bandwidth=values["hbm_bandwidth_gbs"] * 1e9,
        intra_node_bandwidth=values["intra_node_bandwidth_gbs"] * 1e9,
        inter_node_bandwidth=values["inter_node_bandwidth_gbs"] * 1e9,
        intra_node_latency=float(table.get("intra_node_latency_us", 5.0)) * 1e-6,
        inter_node_latency=float(table.get("inter_node_latency_us", 10.0)) * 1e-6,
        num_gpus=int(table.get("num_gpus", 0)),
        measured=dict(data.get("measured", {})),
        sm_count=values.get("sm_count", 0),
        mamf_tflops=values.get("mamf_tflops", 0.0),
        arch=arch,
        fp8_flops=values.get("fp8_peak_tflops", 0.0) * 1e12,
    )


# Every other [cluster] key the loader reads (a key it does not read is a typo: refused, not ignored).
_OTHER_KEYS = ("name", "arch", "num_gpus", "intra_node_latency_us", "inter_node_latency_us")


def _check_cluster_keys(table: dict, source: str) -> None:
    """A key nobody reads (intra_node_latency_ms for _us, a misspelt optional key) would silently leave the default
    in place: one line naming it, the closest known key and the list."""
    import difflib

    known = (*_CLUSTER_KEYS, *_OPTIONAL_KEYS, *_OTHER_KEYS)
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else "remove it; "
            raise UsageError(f"{source}: unknown key '{key}' in [cluster] — {hint}known keys: {', '.join(known)}")


def _cluster_number(table: dict, key: str, kind, source: str):
    """A finite number (an integer where `kind` is int), or one UsageError line."""
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (kind is int and value != int(value)):
        what = "a whole number" if kind is int else "a finite number"
        raise UsageError(f"{source}: key '{key}' must be {what}, got {value!r}")
    return kind(value)


def _check_measured(measured, source: str) -> None:
    """[measured] (written by `shardwise calibrate`): numbers finite, collective tables [[bytes, seconds], ...]."""
    if not isinstance(measured, dict):
        raise UsageError(f"{source}: [measured] must be a table — rerun `shardwise calibrate` to write it again")

    def numbers(value):
        if isinstance(value, (list, tuple)):
            return [x for v in value for x in numbers(v)]
        if isinstance(value, dict):
            return [x for v in value.values() for x in numbers(v)]
        return [value] if isinstance(value, (int, float)) else []

    bad = [k for k, v in measured.items() if any(not math.isfinite(x) for x in numbers(v))]
    # Scalars the planner reads as numbers (every one but the labels calibrate writes).
    bad += [k for k, v in measured.items() if k not in ("backend", "dtype", "model")
            and not isinstance(v, (list, tuple, dict)) and (isinstance(v, bool) or not isinstance(v, (int, float)))]
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"):
        table = measured.get(kind)
        if table is not None and not (isinstance(table, list) and all(
                isinstance(row, list) and len(row) == 2 and all(isinstance(x, (int, float)) and x >= 0 for x in row)
                for row in table)):
            bad.append(kind)
    if bad:
        raise UsageError(f"{source}: [measured] {', '.join(dict.fromkeys(bad))} must be finite numbers (tables: [[bytes, seconds], ...]) — "
                         f"rerun `shardwise calibrate` to write it again")


def load_cluster(ref: str) -> ClusterSpec:
    """A preset name (see `cluster_presets()`) or a path to a cluster TOML file."""
    path = Path(ref)
    if not ref.strip():
        raise UsageError(f"--cluster is empty — give a preset ({', '.join(cluster_presets())}) or a cluster .toml file")
    if path.is_dir():
        raise UsageError(f"--cluster {ref} is a folder — give a cluster .toml file (e.g. from `shardwise calibrate`) "
                         f"or a preset ({', '.join(cluster_presets())})")
    if ref.endswith(".toml") or path.is_file():
        if not path.is_file():
            raise UsageError(f"cluster file '{ref}' not found — give a preset ({', '.join(cluster_presets())}) or an existing .toml")
        try:
            data = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{ref}: malformed TOML ({exc}) — fix the file or use a preset") from None
        except OSError as exc:
            raise UsageError(f"{ref}: cannot read it ({exc.strerror}) — check the path and its permissions") from None
        return cluster_from_toml(data, name=path.stem, source=ref)
    preset = _preset_dir("clusters").joinpath(f"{ref}.toml")
    if ref not in cluster_presets() or not preset.is_file():
        raise UsageError(f"unknown cluster '{ref}' — valid presets: {', '.join(cluster_presets())}; or pass a path to a .toml")
    return cluster_from_toml(tomllib.loads(preset.read_text()), name=ref, source=f"preset {ref}")


# --------------------------------------------------------------------------- training job


@dataclass(frozen=True)
class TrainSpec:
    """The job. Mixed-precision Adam bytes per parameter (see docs/planner.md for the why):

    weight_bytes 2 (bf16 weights used in forward/backward), grad_bytes 4 (fp32 gradient
    accumulation buffer, as Megatron and FSDP keep it), optimizer_bytes 12 (fp32 master copy +
    Adam m + v). 2 + 4 + 12 = 18 B/param, what real frameworks keep; the textbook 16 assumes
    bf16 gradients.
    """

    global_batch: int
    seq_len: int
    weight_bytes: int = 2
    grad_bytes: int = 4
    optimizer_bytes: int = 12
    activation_bytes: int = 2  # bf16 activations

    MAX = 2**32  # sequences per step, tokens per sequence: far beyond any run, and keeps every answer fast

    def __post_init__(self):
        for flag, value in (("--global-batch", self.global_batch), ("--seq-len", self.seq_len)):
            if not 1 <= value <= self.MAX:
                raise UsageError(f"{flag} must be between 1 and {self.MAX:,}, got {value:,}")

    @property
    def bytes_per_param(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """One split of the job over dp * tp * pp * cp GPUs (rank order: pp outer, dp, cp, tp inner)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    vpp: int = 1
    zero: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    cp: int = 1  # context parallelism: each sequence split over cp ranks (zig-zag chunks)
    cp_mode: str = "ring"  # attention over the shards: "ring" (K/V passed around) or "allgather"
    ep: int = 1  # expert parallelism, folded over the same dp x tp ranks (Megatron's MoE parallel folding)
    etp: int = 1  # tensor parallelism inside each expert

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def num_microbatches(self, global_batch: int) -> int:
        return global_batch // (self.dp * self.micro_batch)

    def to_dict(self) -> dict:
        return asdict(self)

    def with_(self, **changes) -> "Layout":
        return replace(self, **changes)

    @property
    def split(self) -> tuple[int, int, int, int, int]:
        """The dp x tp x pp x cp x ep split: `plan` shows the best layout of each."""
        return (self.dp, self.tp, self.pp, self.cp, self.ep)

    def describe(self) -> str:
        parts = [f"dp{self.dp}", f"tp{self.tp}", f"pp{self.pp}"] + ([f"cp{self.cp}"] if self.cp > 1 else [])
        if self.ep > 1 or self.etp > 1:
            parts.append(f"ep{self.ep}" + (f"·etp{self.etp}" if self.etp > 1 else ""))
        if self.vpp > 1:
            parts.append(f"v{self.vpp}")
        parts.append(f"mb{self.micro_batch}")
        return "·".join(parts)


def validate_layout(layout: Layout, model: ModelSpec, global_batch: int, num_gpus: int | None = None,
                    seq_len: int | None = None) -> None:
    """Raise UsageError naming the first thing that makes `layout` impossible for this job."""
    for name in ("dp", "tp", "pp", "cp", "micro_batch", "vpp", "ep", "etp"):
        if getattr(layout, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(layout, name)}")
    if num_gpus is not None and layout.world_size != num_gpus:
        degrees = "dp*tp*pp" + ("*cp" if layout.cp > 1 else "")
        values = "*".join(str(v) for v in (layout.dp, layout.tp, layout.pp) + ((layout.cp,) if layout.cp > 1 else ()))
        raise UsageError(
            f"{degrees} = {values} = {layout.world_size} does not match {num_gpus} GPUs — "
            f"choose degrees whose product is {num_gpus}"
        )
    if seq_len is not None:
        check_sequence_split(layout, model, seq_len)
    if layout.schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule '{layout.schedule}' — choose one of {', '.join(SCHEDULES)}")
    if layout.recompute not in RECOMPUTE:
        raise UsageError(f"unknown recompute '{layout.recompute}' — choose one of {', '.join(RECOMPUTE)}")
    if layout.zero not in ZERO_STAGES:
        raise UsageError(f"unknown ZeRO stage {layout.zero} — choose 0, 1, 2 or 3")
    if model.num_heads % layout.tp:
        raise UsageError(f"tp={layout.tp} does not divide the {model.num_heads} attention heads of {model.name} — pick a divisor")
    if model.num_kv_heads % layout.tp:
        raise UsageError(f"tp={layout.tp} does not divide the {model.num_kv_heads} KV heads of {model.name} — pick a divisor of {model.num_kv_heads}")
    if model.ffn_hidden % layout.tp and len(model.moe_layers) < model.num_layers:
        raise UsageError(f"tp={layout.tp} does not divide the FFN size {model.ffn_hidden} of {model.name} — pick a divisor")
    validate_experts(layout, model)
    if layout.pp * layout.vpp > model.num_layers:
        raise UsageError(
            f"pp*vpp = {layout.pp * layout.vpp} model chunks exceed the {model.num_layers} layers of {model.name} — lower pp or vpp"
        )
    if layout.vpp > 1 and layout.schedule != "interleaved-1f1b":
        raise UsageError(f"vpp={layout.vpp} needs --schedule interleaved-1f1b (got {layout.schedule})")
    if layout.schedule == "interleaved-1f1b" and layout.pp == 1:
        raise UsageError("interleaved-1f1b needs pp > 1 — use pp>=2 or another schedule")
    if global_batch % layout.dp:
        raise UsageError(f"--global-batch {global_batch} is not divisible by dp={layout.dp} — each dp rank takes an "
                         f"equal slice; pick a multiple of {layout.dp}")
    if global_batch % (layout.dp * layout.micro_batch):
        raise UsageError(
            f"global batch {global_batch} is not divisible by dp*micro_batch = {layout.dp}*{layout.micro_batch} — "
            f"pick a global batch that is a multiple of {layout.dp * layout.micro_batch}"
        )
    m = layout.num_microbatches(global_batch)
    if layout.schedule == "interleaved-1f1b" and m % layout.pp:
        raise UsageError(
            f"interleaved-1f1b needs the number of micro-batches ({m}) to be a multiple of pp={layout.pp} (Megatron's rule)"
        )


def check_sequence_split(layout: Layout, model: ModelSpec, seq_len: int) -> None:
    """Can each sequence be split over cp (and, with sequence parallelism, each shard over tp)?

    Context parallelism cuts the sequence into 2*cp equal chunks (rank i holds chunks i and 2cp-1-i, which
    balances the causal mask's work). Every position scheme of the supported families is a function of the
    token's global index (RoPE rotates by it, GPT-2 looks it up), so positions split with the tokens; what
    splitting cannot do is give a token a position the model does not have: a sequence longer than the
    model's positions stays impossible at any cp."""
    if layout.cp_mode not in CP_MODES:
        raise UsageError(f"unknown --cp-mode '{layout.cp_mode}' — choose {' or '.join(CP_MODES)}")
    if layout.cp > 1 and seq_len % (2 * layout.cp):
        raise UsageError(
            f"cp={layout.cp} cuts each sequence into 2*cp = {2 * layout.cp} equal chunks (zig-zag causal balance), but "
            f"--seq-len {seq_len} is not divisible by {2 * layout.cp} — use a multiple of {2 * layout.cp}")
    if layout.cp > 1 and seq_len > model.max_positions:
        kind = ("a learned table of" if model.learned_positions else "rotary positions trained for")
        raise UsageError(
            f"--seq-len {seq_len} exceeds the {model.max_positions} positions of {model.name} ({kind} {model.max_positions}); "
            f"cp splits the tokens over ranks but each keeps its global position, so cp cannot lengthen the sequence — "
            f"use at most {model.max_positions} tokens or a model with more positions")
    local = seq_len // layout.cp
    if layout.cp == 1 and layout.sequence_parallel and layout.tp > 1 and seq_len % layout.tp:
        raise UsageError(f"sequence parallelism splits the sequence over tp={layout.tp}, but --seq-len {seq_len} is not "
                         f"divisible — use a multiple of {layout.tp}")
    if layout.cp > 1 and layout.sequence_parallel and layout.tp > 1 and local % layout.tp:
        raise UsageError(
            f"sequence parallelism splits each rank's {local} tokens (seq-len {seq_len} / cp {layout.cp}) over tp={layout.tp}, "
            f"which does not divide them — use a sequence length that is a multiple of {layout.cp * layout.tp}")


def runtime_refusal(layout: Layout) -> str | None:
    """What shardwise's runtime cannot run although validate_layout accepts it (one clause), or None.
    launch.check raises it before a job starts; the planner's `shardwise` framework profile skips it."""
    if layout.pp > 1 and layout.schedule == "zb-h1" and layout.zero >= 2:
        return ("zb-h1 splits each backward into input and weight passes, which FSDP (ZeRO 2/3) cannot follow — "
                "use --zero 1 with zb-h1, or another schedule")
    return None


def validate_experts(layout: Layout, model: ModelSpec) -> None:
    """Expert parallelism: ep experts groups x etp expert shards fold over the dp x tp (x cp) ranks of a stage."""
    if not model.is_moe:
        if layout.ep > 1 or layout.etp > 1:
            raise UsageError(f"--ep/--etp split experts, but {model.name} has no experts — drop them or use a MoE model")
        return
    if model.num_experts % layout.ep:
        raise UsageError(f"ep={layout.ep} does not divide the {model.num_experts} experts of {model.name} — pick a divisor "
                         f"of {model.num_experts}")
    if model.moe_ffn_hidden % layout.etp:
        raise UsageError(f"etp={layout.etp} does not divide the expert FFN size {model.moe_ffn_hidden} of {model.name} — "
                         f"pick a divisor")
    if model.shared_ffn_hidden % layout.tp:
        raise UsageError(f"tp={layout.tp} does not divide the shared-expert FFN size {model.shared_ffn_hidden} of "
                         f"{model.name} — pick a divisor")
    ranks = layout.dp * layout.tp * layout.cp
    if ranks % (layout.ep * layout.etp):
        raise UsageError(f"ep*etp = {layout.ep}*{layout.etp} = {layout.ep * layout.etp} does not divide dp*tp*cp = {ranks}: "
                         f"the experts fold over the same ranks as the dense layers — pick ep*etp dividing {ranks}")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    out, rest, p = [1], n, 2
    while p * p <= rest:  # factorise: about sqrt of the largest prime factor steps, not sqrt(n) divisions
        k = 0
        while rest % p == 0:
            rest //= p
            k += 1
        if k:
            out = [d * p**e for d in out for e in range(k + 1)]
        p += 1 if p == 2 else 2
    if rest > 1:
        out += [d * rest for d in out]
    return tuple(sorted(out))


def divisors(n: int) -> list[int]:
    """Every positive divisor of n >= 1, ascending."""
    return list(_divisors(n))
