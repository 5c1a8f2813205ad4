"""Context parallelism: split every sequence over the cp ranks; attention is the only layer that mixes tokens.

Zig-zag split (Megatron-Core, Llama 3): the sequence is cut into 2·cp chunks and cp rank i holds chunks i and
2·cp−1−i. Under a causal mask a late chunk attends to far more keys than an early one; pairing the i-th
earliest with the i-th latest gives every rank the same work, so none idles on the masked half.

Every other layer is per token: norms, projections, the MLP and the loss run on the local tokens unchanged.
Positions come from each token's global index (RoPE tables and learned positions are permuted once, here).
Each rank's loss is the mean over its tokens; the shards are the same size, so averaging the gradients over
dp × cp (the data-parallel group, as Megatron does) gives exactly the gradient of the mean over all tokens.

Attention over the shards, two ways (`--cp-mode`):
  ring       K/V blocks travel around the cp ring, one hop per step, each hop posted before the step's block
             is computed (overlap). Partial results merge by log-sum-exp (online softmax). Backward sends the
             K/V around again, and with them the dK/dV accumulated so far; after cp hops each block's
             gradient is back with its owner (Liu et al. 2023, Ring Attention; Megatron's AttnFuncWithCPAndKVP2P).
  allgather  all-gather K/V once per layer, attend, and in backward gather again and reduce-scatter dK/dV
             (Llama 3, Sec. 3.3.2: with GQA, K/V are small next to Q).
Both keep what a fused attention kernel keeps for backward: the local q, k, v, the output and the
log-sum-exp per query (scores are recomputed block by block in backward, never stored).

Point to point is written for NCCL: each ring step posts its send and its receive together in one
`batch_isend_irecv`, every rank in the same order, so a send that completes only when its receive is posted
(rendezvous) cannot deadlock, and each pair of ranks sees one FIFO of messages in the same order on both sides.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from shardwise.parallel.tensor_parallel import _all_gather_single, _reduce_scatter_single

from shardwise.specs import CP_MODES as MODES  # noqa: E402  (one list of mode names)


# --------------------------------------------------------------------------- the split


def zigzag_positions(seq_len: int, cp: int, rank: int, device=None) -> torch.Tensor:
    """Global token indices held by cp rank `rank`: chunks rank and 2·cp−1−rank of 2·cp equal chunks."""
    c = seq_len // (2 * cp)
    first, second = rank * c, (2 * cp - 1 - rank) * c
    return torch.cat([torch.arange(first, first + c, device=device), torch.arange(second, second + c, device=device)])


def shard_sequence(t: torch.Tensor, cp: int, rank: int) -> torch.Tensor:
    """This rank's tokens of a (batch, seq, ...) tensor."""
    if cp == 1:
        return t
    return t.index_select(1, zigzag_positions(t.shape[1], cp, rank, t.device)).contiguous()


# --------------------------------------------------------------------------- attention blocks
# q: (batch, heads, sq, dim); k, v: (batch, kv_heads, sk, dim) (GQA: fewer KV heads). A block returns its
# output and the log-sum-exp of its scores per query, so blocks merge exactly (online softmax); `causal` is
# the square block on the diagonal. On CPU a block is the same fused kernel SDPA runs (FlashAttention-style,
# it skips the masked half); elsewhere plain fp32 math (correct, not fast).


def _block_forward(q, k, v, causal: bool):
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return math_block_forward(q, k, v, causal)


def _block_backward(dout, q, k, v, out, lse, causal: bool):
    """(dq, dk, dv) of one block, given the *final* output and log-sum-exp of these queries (FlashAttention-2)."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal)
    return math_block_backward(dout, q, k, v, out, lse, causal)


def math_block_forward(q, k, v, causal: bool):
    # Autocast off: the forward runs inside the model's bf16 autocast, the backward outside it; bf16 scores here would
    # give a log-sum-exp the fp32 backward's softmax does not sum to 1 with (gradients a few % off).
    with torch.autocast(q.device.type, enabled=False):
        s, k, v = _math_scores(q, k, v, causal)
        lse = torch.logsumexp(s, dim=-1)
        return (torch.exp(s - lse.unsqueeze(-1)) @ v).to(q.dtype), lse


def math_block_backward(dout, q, k, v, out, lse, causal: bool):
    kv_heads = k.shape[1]
    with torch.autocast(q.device.type, enabled=False):  # the forward's precision (above)
        s, k, v = _math_scores(q, k, v, causal)
        p, dout = torch.exp(s - lse.unsqueeze(-1)), dout.to(s.dtype)
        dv = p.transpose(-1, -2) @ dout
        ds = p * (dout @ v.transpose(-1, -2) - (dout * out.to(s.dtype)).sum(-1, keepdim=True))
        scale = q.shape[-1] ** -0.5
        dq, dk = ds @ k * scale, ds.transpose(-1, -2) @ q.to(s.dtype) * scale
    fold = lambda t: t.unflatten(1, (kv_heads, -1)).sum(2)  # noqa: E731  (GQA: sum over the heads sharing a KV head)
    return dq.to(q.dtype), fold(dk).to(q.dtype), fold(dv).to(q.dtype)


def _math_scores(q, k, v, causal):
    group, acc = q.shape[1] // k.shape[1], _acc(q)
    k, v = k.repeat_interleave(group, dim=1).to(acc), v.repeat_interleave(group, dim=1).to(acc)
    s = (q.to(acc) @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return s, k, v


def _merge(out, lse, block_out, block_lse):
    """Online softmax: fold a block's partial result into the running fp32 (out, lse), in place."""
    new = torch.logaddexp(lse, block_lse)
    out.mul_(torch.exp(lse - new).unsqueeze(-1)).add_(block_out * torch.exp(block_lse - new).unsqueeze(-1))
    lse.copy_(new)


def _acc(t: torch.Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


def _output_buffer(q: torch.Tensor) -> torch.Tensor:
    """Zeros shaped like q (batch, heads, seq, dim) but laid out (batch, seq, heads, dim), as SDPA returns it: the
    model's transpose back to (batch, seq, hidden) is then a view, and wo keeps the very tensor attention saved."""
    b, h, s, d = q.shape
    return q.new_zeros((b, s, h, d), dtype=_acc(q)).transpose(1, 2)


# --------------------------------------------------------------------------- ring


# Point to point used by the ring: None = torch.distributed's batch_isend_irecv. Tests put NCCL's rules emulated on
# gloo here (an object with post(sends, recvs, group) -> waitables; sends/recvs are (tensor, global peer, tag)).
P2P = None


class _Ring:
    """One exchange per call: send to the next cp rank and receive from the previous one, posted together."""

    def __init__(self, group):
        self.group = group
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        self.next = dist.get_global_rank(group, (rank + 1) % cp)
        self.prev = dist.get_global_rank(group, (rank - 1) % cp)

    def exchange(self, send: torch.Tensor, tag: int):
        recv = torch.empty_like(send)
        if P2P is not None:
            return P2P.post([(send, self.next, tag)], [(recv, self.prev, tag)], self.group), recv
        ops = [dist.P2POp(dist.isend, send, self.next, self.group, tag),
               dist.P2POp(dist.irecv, recv, self.prev, self.group, tag)]
        return dist.batch_isend_irecv(ops), recv


def _wait(pending):
    works, recv = pending
    for w in works:
        w.wait()
    return recv


def _ring_step(step: int, rank: int, cp: int, c: int):
    """Which local queries attend to which part of the block held at `step` (zig-zag layout, causal):
    (query slice, key slice, causal). Own block: causal over both chunks. A block from an earlier rank:
    every query sees its first chunk only. From a later rank: only the second query chunk sees it, fully."""
    src = (rank - step) % cp
    if step == 0:
        return slice(None), slice(None), True
    if src < rank:
        return slice(None), slice(0, c), False
    return slice(c, None), slice(None), False


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group):
        cp, rank, ring, c = dist.get_world_size(group), dist.get_rank(group), _Ring(group), q.shape[2] // 2
        out = _output_buffer(q)
        lse = q.new_full(q.shape[:-1], float("-inf"), dtype=_acc(q))
        kv = torch.stack([k, v])
        for step in range(cp):
            pending = ring.exchange(kv, tag=step) if step + 1 < cp else None  # overlaps this step's block
            rows, keys, causal = _ring_step(step, rank, cp, c)
            block = _block_forward(q[..., rows, :], kv[0][..., keys, :], kv[1][..., keys, :], causal)
            _merge(out[..., rows, :], lse[..., rows], *block)
            if pending is not None:
                kv = _wait(pending)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group = group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, dout = ctx.group, dout.contiguous()
        cp, rank, ring, c = dist.get_world_size(group), dist.get_rank(group), _Ring(group), q.shape[2] // 2
        dq = torch.zeros(q.shape, dtype=_acc(q), device=q.device)
        kv, dkv_pending = torch.stack([k, v]), None
        for step in range(cp):
            kv_pending = ring.exchange(kv, tag=2 * step) if step + 1 < cp else None
            rows, keys, causal = _ring_step(step, rank, cp, c)
            dq_b, dk_b, dv_b = _block_backward(dout[..., rows, :], q[..., rows, :], kv[0][..., keys, :], kv[1][..., keys, :],
                                               out[..., rows, :], lse[..., rows], causal)
            dq[..., rows, :] += dq_b
            dkv = torch.zeros((2,) + k.shape, dtype=_acc(q), device=k.device)
            dkv[0][..., keys, :] += dk_b
            dkv[1][..., keys, :] += dv_b
            if dkv_pending is not None:  # what the ranks before us accumulated for this block
                dkv += _wait(dkv_pending)
            # This block's gradient moves on with it; after cp hops it is back with its owner.
            dkv_pending = ring.exchange(dkv, tag=2 * step + 1)
            if kv_pending is not None:
                kv = _wait(kv_pending)
        dkv = _wait(dkv_pending)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None


# --------------------------------------------------------------------------- all-gather


def _gather_kv(k, v, group):
    """Every rank's K/V (2, batch, kv_heads, seq, dim), in global token order."""
    cp = dist.get_world_size(group)
    kv = torch.stack([k, v]).contiguous()
    gathered = kv.new_empty((cp * 2,) + kv.shape[1:])
    _all_gather_single(gathered, kv, group=group)
    halves = gathered.view((cp,) + kv.shape).chunk(2, dim=-2)
    # chunk j < cp is rank j's first half, chunk j >= cp rank 2cp-1-j's second
    return torch.cat([halves[0][j] if j < cp else halves[1][2 * cp - 1 - j] for j in range(2 * cp)], dim=-2)


def _allgather_blocks(rank: int, cp: int, c: int):
    """(query slice, key slice, causal) blocks a rank computes: each local chunk j sees every earlier chunk
    fully and itself causally."""
    out = []
    for half, chunk in ((0, rank), (1, 2 * cp - 1 - rank)):
        rows = slice(half * c, (half + 1) * c)
        if chunk:
            out.append((rows, slice(0, chunk * c), False))
        out.append((rows, slice(chunk * c, (chunk + 1) * c), True))
    return out


class AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group):
        cp, rank, c = dist.get_world_size(group), dist.get_rank(group), q.shape[2] // 2
        kv = _gather_kv(k, v, group)
        out = _output_buffer(q)
        lse = q.new_full(q.shape[:-1], float("-inf"), dtype=_acc(q))
        for rows, keys, causal in _allgather_blocks(rank, cp, c):
            _merge(out[..., rows, :], lse[..., rows], *_block_forward(q[..., rows, :], kv[0][..., keys, :],
                                                                       kv[1][..., keys, :], causal))
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)  # K/V are gathered again in backward, not kept
        ctx.group = group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, dout = ctx.group, dout.contiguous()
        cp, rank, c = dist.get_world_size(group), dist.get_rank(group), q.shape[2] // 2
        kv = _gather_kv(k, v, group)
        dq = torch.zeros(q.shape, dtype=_acc(q), device=q.device)
        dkv = torch.zeros(kv.shape, dtype=_acc(q), device=q.device)
        for rows, keys, causal in _allgather_blocks(rank, cp, c):
            dq_b, dk_b, dv_b = _block_backward(dout[..., rows, :], q[..., rows, :], kv[0][..., keys, :], kv[1][..., keys, :],
                                               out[..., rows, :], lse[..., rows], causal)
            dq[..., rows, :] += dq_b
            dkv[0][..., keys, :] += dk_b
            dkv[1][..., keys, :] += dv_b
        # Back to rank order (rank r: chunks r and 2cp-1-r), then sum every rank's contribution to each block.
        chunks = dkv.chunk(2 * cp, dim=-2)
        per_rank = torch.stack([torch.cat([chunks[r], chunks[2 * cp - 1 - r]], dim=-2) for r in range(cp)])
        mine = dkv.new_empty((2,) + k.shape)
        _reduce_scatter_single(mine, per_rank.reshape((cp * 2,) + k.shape), group=group)
        return dq.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype), None


# --------------------------------------------------------------------------- the transformation


def _attend(q, k, v, *, group, mode, local_len):
    if q.shape[2] != local_len:
        raise ValueError(f"context parallelism was set up for {local_len} tokens per rank, got {q.shape[2]}")
    return (RingAttention if mode == "ring" else AllGatherAttention).apply(q, k, v, group)


def context_parallel(model: nn.Module, cp_mesh, mode: str, seq_len: int) -> nn.Module:
    """Make `model` (a Transformer or a pipeline stage of one, possibly tensor-parallel) run on this cp rank's
    zig-zag shard of `seq_len`-token sequences, in place. Parameters are untouched (replicated over cp)."""
    if cp_mesh is None or cp_mesh.size() == 1:
        return model
    if mode not in MODES:
        raise ValueError(f"unknown context-parallel mode {mode!r}")
    cp, rank = cp_mesh.size(), cp_mesh.get_local_rank()
    positions = zigzag_positions(seq_len, cp, rank)
    rank_local = ["cp_positions"]
    model.register_buffer("cp_positions", positions, persistent=False)
    if getattr(model, "rope_cos", None) is not None:
        # The model slices rope[:seq]; this rank's rows, in its token order, make that slice right.
        model.register_buffer("rope_cos", model.rope_cos[positions].clone(), persistent=False)
        model.register_buffer("rope_sin", model.rope_sin[positions].clone(), persistent=False)
        rank_local += ["rope_cos", "rope_sin"]
    if getattr(model, "pos_embeddings", None) is not None:
        model.pos_embeddings.register_forward_pre_hook(lambda mod, args: (model.cp_positions.unsqueeze(0),))
    attend = partial(_attend, group=cp_mesh.get_group(), mode=mode, local_len=seq_len // cp)
    for block in model.layers.values():
        block.attention.attend = attend
    # Rank-local buffers: DDP must not overwrite them with rank 0's at construction.
    model._ddp_params_and_buffers_to_ignore = list(getattr(model, "_ddp_params_and_buffers_to_ignore", [])) + rank_local
    return model
