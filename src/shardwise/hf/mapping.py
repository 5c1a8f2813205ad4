"""The one mapping between Hugging Face checkpoints and shardwise's model: names, layouts, fused tensors.

Every direction uses this table: loading a folder into any layout (each rank reads the rows or columns it
holds, `hf.load`), exporting a checkpoint (`hf.save`), and checking a folder's shapes before a job starts.

A `Rule` says where one shardwise tensor lives in the HF checkpoint:
- `theirs`: the HF name ({i} the layer, {e} an expert: the same placeholders as in `ours`);
- `conv1d`: GPT-2's Conv1D stores a weight as (in, out), the transpose of nn.Linear's (out, in);
- `parts`: the HF tensor fuses several of ours along its output features (GPT-2's c_attn holds q, k
  and v side by side): `parts(spec)` gives the sizes, `part` which one is ours.

RoPE: shardwise rotates the two halves of each head (Hugging Face's `rotate_half`, model.py), and HF's
Llama checkpoints are already permuted for that convention (their conversion script permutes Meta's
interleaved q/k weights once), so q_proj and k_proj map one to one, with no permutation.

Mixtral (mixture of experts) is one more table: the Llama rules but the FFN's, the router
(`layers.{i}.feed_forward.router.weight` <- `model.layers.{i}.block_sparse_moe.gate.weight`) and, because
shardwise stacks the routed experts into (experts, ...) tensors where Mixtral stores one tensor per expert,
a stacked rule per expert matrix (`layers.{i}.feed_forward.experts.w1` <- `...experts.{e}.w1.weight`, dim 0
running over {e}; w1 gate, w3 up, w2 down as in Mixtral's checkpoints). `hf_tensors` names one HF tensor per
expert, its member `ours#e`. Other MoE shapes (shared experts, dense layers) have no table yet: hf.load refuses
them by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from shardwise.specs import ModelSpec


@dataclass(frozen=True)
class Rule:
    ours: str
    theirs: str
    conv1d: bool = False
    parts: Callable[[ModelSpec], tuple[int, ...]] | None = None
    part: int = 0
    stacked: bool = False  # ours stacks one HF tensor per expert along dim 0 ({e} in `theirs`)

    def offset(self, spec: ModelSpec) -> int:
        """Where our rows start along the HF tensor's output features (0 unless fused)."""
        return sum(self.parts(spec)[: self.part]) if self.parts else 0


def _qkv(spec: ModelSpec) -> tuple[int, int, int]:
    return spec.q_dim, spec.kv_dim, spec.kv_dim


LLAMA = (
    Rule("tok_embeddings.weight", "model.embed_tokens.weight"),
    Rule("layers.{i}.attention_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    Rule("layers.{i}.attention.wq.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    Rule("layers.{i}.attention.wk.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    Rule("layers.{i}.attention.wv.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    Rule("layers.{i}.attention.wo.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    Rule("layers.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    Rule("layers.{i}.feed_forward.w1.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    Rule("layers.{i}.feed_forward.w3.weight", "model.layers.{i}.mlp.up_proj.weight"),
    Rule("layers.{i}.feed_forward.w2.weight", "model.layers.{i}.mlp.down_proj.weight"),
    Rule("norm.weight", "model.norm.weight"),
    Rule("output.weight", "lm_head.weight"),
)

GPT2 = (
    Rule("tok_embeddings.weight", "transformer.wte.weight"),
    Rule("pos_embeddings.weight", "transformer.wpe.weight"),
    *(Rule(f"layers.{{i}}.attention_norm.{p}", f"transformer.h.{{i}}.ln_1.{p}") for p in ("weight", "bias")),
    *(Rule(f"layers.{{i}}.attention.{w}.weight", "transformer.h.{i}.attn.c_attn.weight", conv1d=True, parts=_qkv, part=k)
      for k, w in enumerate(("wq", "wk", "wv"))),
    *(Rule(f"layers.{{i}}.attention.{w}.bias", "transformer.h.{i}.attn.c_attn.bias", parts=_qkv, part=k)
      for k, w in enumerate(("wq", "wk", "wv"))),
    Rule("layers.{i}.attention.wo.weight", "transformer.h.{i}.attn.c_proj.weight", conv1d=True),
    Rule("layers.{i}.attention.wo.bias", "transformer.h.{i}.attn.c_proj.bias"),
    *(Rule(f"layers.{{i}}.ffn_norm.{p}", f"transformer.h.{{i}}.ln_2.{p}") for p in ("weight", "bias")),
    Rule("layers.{i}.feed_forward.w1.weight", "transformer.h.{i}.mlp.c_fc.weight", conv1d=True),
    Rule("layers.{i}.feed_forward.w1.bias", "transformer.h.{i}.mlp.c_fc.bias"),
    Rule("layers.{i}.feed_forward.w2.weight", "transformer.h.{i}.mlp.c_proj.weight", conv1d=True),
    Rule("layers.{i}.feed_forward.w2.bias", "transformer.h.{i}.mlp.c_proj.bias"),
    *(Rule(f"norm.{p}", f"transformer.ln_f.{p}") for p in ("weight", "bias")),
    Rule("output.weight", "lm_head.weight"),  # GPT2LMHeadModel's head: the embedding unless untied (helper-228)
)

MIXTRAL = tuple(r for r in LLAMA if ".feed_forward." not in r.ours) + (
    Rule("layers.{i}.feed_forward.router.weight", "model.layers.{i}.block_sparse_moe.gate.weight"),
    *(Rule(f"layers.{{i}}.feed_forward.experts.{w}", f"model.layers.{{i}}.block_sparse_moe.experts.{{e}}.{w}.weight",
           stacked=True) for w in ("w1", "w3", "w2")),
)

TABLES = {"llama": LLAMA, "gpt2": GPT2, "mixtral": MIXTRAL}
# What `save_pretrained` puts before the decoder's names; checkpoints on the Hub may omit it (GPT-2's do).
BASE_PREFIX = {"llama": "model.", "gpt2": "transformer."}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel", "mixtral": "MixtralForCausalLM"}
# Tensors an HF file may hold that are not weights: GPT-2's causal-mask buffers, old RoPE caches.
IGNORED = re.compile(r"(\.attn\.bias|\.attn\.masked_bias|\.rotary_emb\.inv_freq)$")


def _pattern(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{e\}", r"(?P<e>\d+)") + "$")


_COMPILED = {family: [(_pattern(r.ours), r) for r in rules] for family, rules in TABLES.items()}


def table_key(spec: ModelSpec) -> str:
    """Which table maps `spec`: its family's, or Mixtral's for a MoE of Mixtral's shape (every layer routed,
    no shared expert). KeyError for another MoE shape."""
    if not spec.is_moe:
        return spec.family
    if spec.shared_ffn_hidden or len(spec.moe_layers) != spec.num_layers:
        raise KeyError(f"no Hugging Face mapping for {spec.name}'s experts (shared experts or dense layers): only "
                       f"Mixtral's layout has one")
    return "mixtral"


@dataclass(frozen=True)
class Source:
    """Where one of our tensors is in the HF checkpoint: name, transpose, offset along the output features."""

    name: str
    conv1d: bool
    offset: int
    stacked: bool = False  # `name` still holds {e}: one HF tensor per expert


@lru_cache(maxsize=4096)
def source(spec: ModelSpec, ours: str) -> Source:
    """The HF tensor holding our tensor `ours` (a tied LM head is the embedding)."""
    if ours == "output.weight" and spec.tie_embeddings:
        ours = "tok_embeddings.weight"
    for pattern, rule in _COMPILED[table_key(spec)]:
        m = pattern.match(ours)
        if m:
            return Source(rule.theirs.replace("{i}", m["i"]) if "{i}" in rule.ours else rule.theirs, rule.conv1d,
                          rule.offset(spec), rule.stacked)
    raise KeyError(f"no Hugging Face name for shardwise tensor '{ours}' ({spec.family})")


def our_names(spec: ModelSpec) -> list[str]:
    """Every tensor of the whole shardwise model (a tied LM head once, as the embedding)."""
    out = []
    for rule in TABLES[table_key(spec)]:
        if rule.ours == "output.weight" and spec.tie_embeddings:
            continue
        layers = range(spec.num_layers) if "{i}" in rule.ours else [None]
        out += [rule.ours.format(i=i) for i in layers]
    return out


def our_shape(spec: ModelSpec, ours: str) -> tuple[int, ...]:
    """The logical (unsharded, unpadded) shape of our tensor, as model.py builds it."""
    h, f = spec.hidden, spec.ffn_hidden
    leaf = ours.rsplit(".", 2)
    module, kind = leaf[-2], leaf[-1]
    if ".experts." in ours:  # (experts, out, in): w1, w3 (E, f_e, h); w2 (E, h, f_e)
        fe = spec.moe_ffn_hidden
        return (spec.num_experts, h, fe) if kind == "w2" else (spec.num_experts, fe, h)
    if module == "router":
        return (spec.num_experts, h)
    outs = {"wq": spec.q_dim, "wk": spec.kv_dim, "wv": spec.kv_dim, "wo": h, "w1": f, "w3": f, "w2": h}
    ins = {"wo": spec.q_dim, "w2": f}
    if module in outs:
        return (outs[module],) if kind == "bias" else (outs[module], ins.get(module, h))
    if ours in ("tok_embeddings.weight", "output.weight"):
        return (spec.vocab_size, h)
    if ours == "pos_embeddings.weight":
        return (spec.max_positions, h)
    return (h,)  # norms


def hf_tensors(spec: ModelSpec) -> dict[str, tuple[list[str], tuple[int, ...], bool]]:
    """Every HF tensor of the model: {HF name: (our tensors in it, in order; its shape; conv1d)}."""
    out: dict[str, tuple[list[str], list[int], bool]] = {}
    for ours in our_names(spec):
        src = source(spec, ours)
        shape = list(our_shape(spec, ours))
        if src.stacked:  # one HF tensor per expert; member "ours#e"
            for e in range(shape[0]):
                out[src.name.format(e=e)] = ([f"{ours}#{e}"], shape[1:], False)
            continue
        if src.conv1d:
            shape.reverse()
        out_dim = len(shape) - 1 if src.conv1d else 0
        if src.name in out:
            members, have, _ = out[src.name]
            members.append(ours)
            have[out_dim] += shape[out_dim]  # a fused tensor grows along its output features
        else:
            out[src.name] = ([ours], shape, src.conv1d)
    return {k: (m, tuple(s), c) for k, (m, s, c) in out.items()}


def hf_config(spec: ModelSpec, base: dict | None = None) -> dict:
    """config.json for `transformers`: the original folder's config when there was one (its token ids,
    its extra keys), else the spec's; always fp32 weights and this architecture."""
    cfg = dict(base) if base else spec.to_hf_config()
    key = table_key(spec)
    # both spellings: transformers >= 4.56 writes and reads `dtype` first, so a bf16 source folder's `dtype` left
    # beside our `torch_dtype` would load the fp32 weights rounded to bf16
    cfg.update(architectures=[ARCHITECTURES[key]], model_type=key, torch_dtype="float32", dtype="float32")
    if spec.family == "gpt2":
        cfg.setdefault("activation_function", "gelu_new")
    else:
        cfg.setdefault("hidden_act", "silu")
    return cfg
