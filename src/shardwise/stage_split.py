"""The one stage split: which contiguous layers each pipeline stage holds.

Used by the runtime (which layers each rank builds), the planner (memory and time per pipeline rank)
and the simulator (per-stage costs of a model): they all call `split_layers` / `stage_layer_counts`,
so what the planner scores is the cut that runs. No torch: the planner imports it.

The rule: the L layers are cut into S = pp*vpp contiguous pieces (virtual stage s on rank s mod pp,
Megatron's interleaved mapping) that minimise the costliest stage, where a layer costs its forward
FLOPs, the first stage also pays the embedding and the last the LM head and loss (backward is about
twice the forward for all three, so the ratio is the same). Among the cuts with that minimal maximum,
the most even one, with the extra layers on the later stages: under 1F1B rank r holds p − r
micro-batches in flight, so a layer costs the least memory late in the pipeline. Consequences:
  - with no edge costs (or edge costs within the slack) it is the even split, ⌊L/S⌋ or ⌈L/S⌉
    layers per stage (Megatron's and torchtitan's default when S divides L);
  - a heavy LM head takes layers off the last stage: Llama 3.1 405B on 16 stages gives 7 layers to
    the first and last stage and 8 elsewhere, which is what Meta ran (Llama 3 paper, Sec. 3.3.2).
  - more stages than layers (at most L + 2, where the stack lets a chunk hold only the embedding or only
    the LM head and loss: `max_chunks`) leave the first stage only the embedding and the last only the head:
    Llama 3.1 405B on 16 x 8 = 128 virtual stages gives 0, then 126 stages of one layer, then 0 — the paper's
    "the first model chunk on the first stage has only the embedding, and the last model chunk on the last
    stage has only output projection and loss calculation", and Megatron-Core's split with
    --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split ((L + 2) / (pp*vpp) slots a
    chunk, the embedding and the loss one each).
Why cost-balanced rather than even: a pipeline step is as slow as its slowest stage, and the head of
a large-vocabulary model costs several layers (GPT-2: 3.7 layers at s = 2048) — an even split leaves
that stage the bottleneck that every other stage waits for.

Megatron-LM does not balance by cost unless told to ("megatron" rule, the split of a Megatron-family profile:
Framework.stage_split): it builds L / S layers per stage (megatron/core/transformer/transformer_block.py
get_num_layers_to_build), or, with --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split,
(L + 2) / S slots a stage with the embedding and the loss one slot each, so the first and the last stage one layer
fewer. Zero Bubble PP (Qi et al. 2023, Sec. 5.1) ran the latter on Megatron-LM: "both the initial and final
pipeline stages possess one fewer transformer layer". Other cuts need the layout named (--pipeline-model-parallel-
layout, or the first/last stage's layers): there the rule is the cost-balanced one, which is what shardwise's
Megatron arguments name (emit/megatron.py).
"""

from __future__ import annotations

from bisect import bisect_left
from functools import lru_cache

from shardwise.model_spec import ModelSpec


# Chunks beyond one per layer a stack can cut: one holding only the embedding, one only the LM head and loss.
EDGE_CHUNKS = 2


def max_chunks(num_layers: int, edge_chunks: bool) -> int:
    """The most virtual stages (pp * vpp) the L layers can be cut into: one layer each, or, where the stack counts
    the embedding and the loss as a layer each in its split (Framework.edge_chunks), L + 2."""
    return num_layers + (EDGE_CHUNKS if edge_chunks else 0)


def layer_costs(spec: ModelSpec, seq_len: int) -> tuple[float, float, float]:
    """(per layer, embedding, LM head + loss) forward FLOPs per token."""
    layer = 2 * spec.params_per_layer() + 4 * seq_len * spec.attention_width  # matmuls + attention scores/values
    embedding = 2 * spec.hidden  # a lookup (and its scatter-add in backward): memory, not FLOPs
    head = 2 * spec.hidden * spec.vocab_size + 5 * spec.vocab_size  # logits matmul + softmax/loss
    return float(layer), float(embedding), float(head)


RULES = ("balanced", "megatron")


def megatron_cuts(num_layers: int, num_stages: int) -> bool:
    """Whether Megatron-LM builds this cut itself: L / S layers a chunk, or (L + 2) / S with the embedding and the loss
    a layer's slot each (transformer_block.py get_num_layers_to_build, transformer_config.py); any other cut runs
    only through a named layout (--pipeline-model-parallel-layout)."""
    L, S = num_layers, num_stages
    return S <= L and L % S == 0 or 2 < S <= L + 2 and (L + 2) % S == 0


@lru_cache(maxsize=4096)
def stage_layer_counts(spec: ModelSpec, num_stages: int, seq_len: int, rule: str = "balanced") -> tuple[int, ...]:
    """Layers per virtual stage (see the module docstring for the rules). Every stage gets at least one
    layer when there are enough; with more stages than layers (`max_chunks`: the runtime refuses them) the
    edge stages give up theirs first, as their embedding or head already costs something."""
    L, S = spec.num_layers, num_stages
    if S < 1:
        raise ValueError(f"cannot cut {L} layers into {S} stages")
    if rule == "megatron" and S <= L and L % S == 0:  # Megatron's even split
        return (L // S,) * S
    if rule == "megatron" and megatron_cuts(L, S):  # embedding and loss a layer's slot each
        k = (L + 2) // S
        return (k - 1,) + (k,) * (S - 2) + (k - 1,)
    least = 1 if S <= L else 0
    layer, embed, head = layer_costs(spec, seq_len)
    edge = [0.0] * S
    edge[0] += embed
    edge[-1] += head

    def capacity(limit: float) -> list[int]:
        # The most layers each stage can take without exceeding `limit` (1e-9 absorbs rounding).
        return [int((limit - e) / layer + 1e-9) for e in edge]

    def fits(limit: float) -> bool:
        caps = capacity(limit)
        return min(caps) >= least and sum(min(c, L) for c in caps) >= L

    # The smallest maximum stage cost is n*layer + edge of some stage: search those candidates.
    candidates = sorted({n * layer + e for e in set(edge) for n in range(least, L + 1)})
    caps = capacity(candidates[bisect_left(candidates, True, key=fits)])
    # Most even under the caps: fill every stage up to a common level k, then take the surplus back
    # from the first stages at that level, so extra layers sit on the later stages, which hold fewer
    # micro-batches in flight (1F1B: rank r holds p - r).
    k = next(k for k in range(1, L + 1) if sum(min(c, k) for c in caps) >= L)
    counts = [min(c, k) for c in caps]
    surplus = sum(counts) - L
    for s in range(S):
        if surplus and counts[s] == k and k > least:
            counts[s] -= 1
            surplus -= 1
    return tuple(counts)


def split_layers(spec: ModelSpec, num_stages: int, seq_len: int, rule: str = "balanced") -> list[list[int]]:
    """Contiguous layer ids per virtual stage."""
    out, first = [], 0
    for n in stage_layer_counts(spec, num_stages, seq_len, rule):
        out.append(list(range(first, first + n)))
        first += n
    return out


@lru_cache(maxsize=1 << 16)
def rank_layers(spec: ModelSpec, pp: int, vpp: int, rank: int, seq_len: int, rule: str = "balanced") -> int:
    """Layers held by pipeline rank `rank`: its vpp chunks (virtual stages rank, rank + pp, ...)."""
    return sum(stage_layer_counts(spec, pp * vpp, seq_len, rule)[rank::pp])


def distinct_ranks(spec: ModelSpec, pp: int, vpp: int, seq_len: int, rule: str = "balanced") -> list[int]:
    """One pipeline rank per kind (first, last, and each set of chunk sizes in between), the lowest of each:
    ranks of one kind hold the same parameters and cost the same time, and a lower rank holds at least
    as many micro-batches of each chunk in flight (a longer warm-up). The planner evaluates these instead of
    every rank."""
    return list(_distinct_ranks(spec, pp, vpp, seq_len, rule))


@lru_cache(maxsize=4096)
def _distinct_ranks(spec: ModelSpec, pp: int, vpp: int, seq_len: int, rule: str = "balanced") -> tuple[int, ...]:
    return tuple(sorted(set(rank_kinds(spec, pp, vpp, seq_len, rule))))


@lru_cache(maxsize=4096)
def rank_kind_counts(spec: ModelSpec, pp: int, vpp: int, seq_len: int, rule: str = "balanced") -> tuple[tuple[int, int], ...]:
    """(distinct rank, how many pipeline ranks are of its kind) for each kind."""
    kinds = rank_kinds(spec, pp, vpp, seq_len, rule)
    return tuple((r, kinds.count(r)) for r in sorted(set(kinds)))


@lru_cache(maxsize=4096)
def rank_kinds(spec: ModelSpec, pp: int, vpp: int, seq_len: int, rule: str = "balanced") -> tuple[int, ...]:
    """For each pipeline rank, the distinct rank (distinct_ranks) of its kind: what it holds and costs. A kind is
    first or not, last or not, its chunks' layer counts and, for a mixture of experts, how many of each chunk's
    layers are MoE layers (DeepSeek-V3's first three are dense: the rank holding them costs less than the next)."""
    counts = stage_layer_counts(spec, pp * vpp, seq_len, rule)
    moe = _chunk_moe_layers(spec, counts) if spec.moe_layers else (0,) * len(counts)
    first: dict = {}
    return tuple(first.setdefault((r == 0, r == pp - 1, counts[r::pp], moe[r::pp]), r) for r in range(pp))


def _chunk_moe_layers(spec: ModelSpec, counts: tuple[int, ...]) -> tuple[int, ...]:
    """MoE layers in each virtual stage of the cut `counts` (layers in order, stage by stage)."""
    out, start = [], 0
    for n in counts:
        out.append(sum(spec.is_moe_layer(i) for i in range(start, start + n)))
        start += n
    return tuple(out)


def stage_flops(spec: ModelSpec, num_stages: int, seq_len: int, rule: str = "balanced") -> list[float]:
    """Forward FLOPs per token of each virtual stage under the split (what the balanced split balances)."""
    layer, embed, head = layer_costs(spec, seq_len)
    counts = stage_layer_counts(spec, num_stages, seq_len, rule)
    return [n * layer + (embed if s == 0 else 0.0) + (head if s == num_stages - 1 else 0.0) for s, n in enumerate(counts)]


@lru_cache(maxsize=1 << 16)
def rank_recomputed_layers(spec: ModelSpec, pp: int, vpp: int, rank: int, seq_len: int, per_chunk: int | None,
                           rule: str = "balanced") -> int:
    """Layers pipeline rank `rank` recomputes in full when each of its chunks recomputes its first `per_chunk`
    layers (all of a chunk that holds fewer; None: every layer) — Megatron's block method, per TransformerBlock."""
    counts = stage_layer_counts(spec, pp * vpp, seq_len, rule)[rank::pp]
    return sum(counts) if per_chunk is None else sum(min(per_chunk, c) for c in counts)


def max_chunk_layers(spec: ModelSpec, pp: int, vpp: int, seq_len: int, rule: str = "balanced") -> int:
    """The most layers one model chunk (virtual stage) holds: what --recompute-layers counts against."""
    return max(stage_layer_counts(spec, pp * vpp, seq_len, rule))
