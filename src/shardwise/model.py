"""A plain decoder-only transformer, built from the same ModelSpec the planner reads.

family "llama": RMSNorm, rotary positions (RoPE), SwiGLU MLP, grouped-query attention, no biases.
family "gpt2":  LayerNorm, learned positions, GELU MLP, biases, LM head tied to the embedding.

The model knows nothing about parallelism. Parallelism is applied afterwards as a transformation
(shardwise.parallel.*): tensor parallelism slices the weights of this very model in place, data
parallelism wraps it. Parameter names are the full-model names under every layout
(`layers.3.attention.wq.weight`, ...) so a checkpoint never depends on the layout.

A pipeline stage is the same class with only some layers (`layer_ids`) and without the embedding
(`first=False`) or without the final norm / LM head (`last=False`); `forward` skips the parts that
are None, torchtitan's pattern. Weights are initialised parameter by parameter from (seed, name),
so a stage, a TP shard or the whole model all start from exactly the same numbers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from shardwise.hf_architectures import PLANNER_ONLY
from shardwise.moe import MoE
from shardwise.specs import ModelSpec


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # the statistics in fp32 even under bf16 autocast, as Llama does
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def make_norm(spec: ModelSpec) -> nn.Module:
    return RMSNorm(spec.hidden, spec.norm_eps) if spec.family == "llama" else nn.LayerNorm(spec.hidden, spec.norm_eps)


def rope_tables(spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (max_positions, head_dim), Hugging Face's rotate-half convention."""
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, spec.head_dim, 2, dtype=torch.float32) / spec.head_dim))
    scaling = dict(spec.rope_scaling)
    if scaling.get("rope_type") == "llama3":
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    angles = torch.outer(torch.arange(spec.max_positions, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's RoPE scaling (transformers' _compute_llama3_parameters, Meta's apply_scaling): wavelengths
    above the original context's / low_freq_factor slowed by `factor`, those below its / high_freq_factor kept, the
    ones between blended."""
    factor, low, high = scaling.get("factor", 8.0), scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old = scaling.get("original_max_position_embeddings", 8192)
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, blended, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, heads, seq, head_dim)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).type_as(x)


def project(x: torch.Tensor, linears) -> tuple[torch.Tensor, ...]:
    """Every linear of `linears` applied to the same input x. One call for all of them, so tensor
    parallelism can replace it with one that moves x once for the group (Megatron's fused QKV and
    gate/up projections): its `tensor_parallel` sets the block's `project` to a `ColumnParallel`."""
    return tuple(w(x) for w in linears)


class Attention(nn.Module):
    """Causal self-attention. Head counts are inferred from the weight shapes (view(..., -1, head_dim)),
    so the same code runs the full model and a tensor-parallel shard holding heads/tp heads."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        bias = spec.has_bias
        self.head_dim = spec.head_dim
        self.wq = nn.Linear(spec.hidden, spec.q_dim, bias=bias)
        self.wk = nn.Linear(spec.hidden, spec.kv_dim, bias=bias)
        self.wv = nn.Linear(spec.hidden, spec.kv_dim, bias=bias)
        self.wo = nn.Linear(spec.q_dim, spec.hidden, bias=bias)
        self.project = project  # tensor parallelism swaps in its own (shardwise.parallel.tensor_parallel)
        self.recompute_core = False  # selective recompute: recompute the attention core in backward
        self.attend = causal_attention  # (q, k, v) -> output; context parallelism swaps in attention over shards

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        # (batch, seq, heads, head_dim) -> (batch, heads, seq, head_dim); under sequence parallelism x holds
        # part of the sequence and q, k, v all of it, so shapes come from the projections, not from x.
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2) for t in self.project(x, (self.wq, self.wk, self.wv)))
        if self.recompute_core:
            out = checkpoint(self._core, q, k, v, rope, use_reentrant=False)
        else:
            out = self._core(q, k, v, rope)
        return self.wo(out.transpose(1, 2).flatten(2))

    def _core(self, q, k, v, rope):
        if rope is not None:
            cos, sin = (t[: q.shape[2]] for t in rope)
            q, k = apply_rope(q, cos, sin).type_as(v), apply_rope(k, cos, sin).type_as(v)
        return self.attend(q, k, v)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q: (batch, heads, seq, head_dim); k, v: (batch, kv_heads, seq, head_dim)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


class FeedForward(nn.Module):
    """SwiGLU (w2(silu(w1 x) * w3 x)) for llama, GELU MLP (w2(gelu(w1 x))) for gpt2."""

    def __init__(self, spec: ModelSpec, width: int | None = None):
        super().__init__()
        bias, f = spec.has_bias, width or spec.ffn_hidden
        self.w1 = nn.Linear(spec.hidden, f, bias=bias)
        self.w3 = nn.Linear(spec.hidden, f, bias=False) if spec.gated_mlp else None
        self.w2 = nn.Linear(f, spec.hidden, bias=bias)
        self.project = project  # tensor parallelism swaps in its own (shardwise.parallel.tensor_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            gate, up = self.project(x, (self.w1, self.w3))
            return self.w2(F.silu(gate) * up)
        (up,) = self.project(x, (self.w1,))
        return self.w2(F.gelu(up, approximate="tanh"))


def make_feed_forward(spec: ModelSpec, layer_id: int) -> nn.Module:
    """The dense FFN, or in a mixture-of-experts layer the router, experts and shared expert (moe.py)."""
    if not spec.is_moe_layer(layer_id):
        return FeedForward(spec)
    return MoE(spec, FeedForward(spec, spec.shared_ffn_hidden) if spec.shared_ffn_hidden else None)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, layer_id: int = 0):
        super().__init__()
        self.attention_norm = make_norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = make_norm(spec)
        self.feed_forward = make_feed_forward(spec, layer_id)
        self.recompute = False  # full recompute: keep only the block input, redo the block in backward

    def forward(self, x, rope):
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, rope, use_reentrant=False)
        return self._forward(x, rope)

    def _forward(self, x, rope):
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


class CrossEntropy(nn.Module):
    """Mean next-token loss over all tokens. Tensor parallelism swaps in a vocab-parallel version."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec, *, seed: int = 0, layer_ids: Iterable[int] | None = None,
                 first: bool = True, last: bool = True, device: str | torch.device = "cpu", recompute: str = "none",
                 recompute_layers: int | None = None):
        super().__init__()
        self.spec = spec
        layer_ids = range(spec.num_layers) if layer_ids is None else list(layer_ids)
        with torch.device("meta"):  # shapes only; real memory is allocated once, below
            self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden) if first else None
            self.pos_embeddings = nn.Embedding(spec.max_positions, spec.hidden) if first and spec.learned_positions else None
            self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in layer_ids})
            self.norm = make_norm(spec) if last else None
            self.output = nn.Linear(spec.hidden, spec.vocab_size, bias=False) if last else None
        self.loss_fn = CrossEntropy() if last else None
        self.to_empty(device=device)
        self.tie()
        meta = torch.device(device).type == "meta"  # shapes only: the weights come later (shardwise.hf.load)
        if spec.family == "llama":  # constants, not state: never saved, never synchronised
            cos, sin = rope_tables(spec)
            self.register_buffer("rope_cos", cos.to("cpu" if meta else device), persistent=False)
            self.register_buffer("rope_sin", sin.to("cpu" if meta else device), persistent=False)
        if not meta:
            self.init_weights(seed)
        self.set_recompute(recompute, recompute_layers)

    def tie(self):
        """GPT-2's LM head is the embedding (again, after either was replaced: shardwise.hf.load)."""
        if self.spec.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def set_recompute(self, mode: str, layers: int | None = None) -> None:
        """`mode` for every block; with "full", `layers` recomputes only this chunk's first ones (Megatron's
        --recompute-method block), the rest keeping all their activations."""
        for i, block in enumerate(self.layers.values()):
            block.recompute = mode == "full" and (layers is None or i < layers)
            block.attention.recompute_core = mode == "selective"

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Each parameter from its own generator seeded by (seed, full-model name): independent of which
        parameters this rank holds. GPT-2's scheme: N(0, 0.02), residual projections 0.02/sqrt(2L)."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                key = "tok_embeddings.weight" if name == "output.weight" and self.spec.tie_embeddings else name
                residual = name.endswith(("wo.weight", "w2.weight", "experts.w2"))  # projections into the residual stream
                std = 0.02 / math.sqrt(2 * self.spec.num_layers) if residual else 0.02
                g = torch.Generator().manual_seed(param_seed(seed, key))
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """x: token ids (batch, seq) on the first stage, hidden states (batch, seq, hidden) after it.
        Returns the mean loss when `targets` is given (last stage), else the stage output."""
        h = x
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(x)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(torch.arange(x.shape[1], device=x.device).unsqueeze(0))
        rope = (self.rope_cos, self.rope_sin) if self.spec.family == "llama" else None
        for layer in self.layers.values():
            h = layer(h, rope)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        if targets is None or self.loss_fn is None:
            return h
        return self.loss_fn(h, targets)


def unsupported(spec: ModelSpec) -> str | None:
    """What of `spec` this model does not implement (the planner still counts it exactly), or None."""
    if spec.model_type in PLANNER_ONLY:  # norms, positions, biases or blocks of its own (hf_architectures)
        return f"{spec.model_type}'s blocks"
    features = []
    if spec.family == "llama" and (spec.attention_bias or spec.ffn_bias):
        features.append("attention or MLP biases (attention_bias, mlp_bias)")
    if spec.attention == "mla":
        features.append("multi-head latent attention (MLA)")
    if spec.qk_norm:
        features.append("QK-norm (Qwen3)")
    if spec.qkv_bias:
        features.append("q/k/v biases (Qwen2)")
    if spec.mlp and spec.gated_mlp != (spec.family == "llama") or spec.mlp not in ("", "swiglu", "gelu"):
        features.append(f"a {spec.mlp} MLP with {spec.family}-style blocks")
    rope = dict(spec.rope_scaling).get("rope_type")
    if rope not in (None, "llama3"):  # rope_tables runs Llama 3.1's scaling only
        features.append(f"{rope} RoPE scaling")
    if spec.router_topk_groups < spec.router_groups:
        features.append("group-limited routing (n_group/topk_group)")
    return " and ".join(filter(None, [", ".join(features[:-1]), features[-1]])) if features else None


def param_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
