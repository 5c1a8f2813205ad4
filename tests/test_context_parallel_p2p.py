"""Ring attention under NCCL's point-to-point rules, emulated on gloo (tests/rendezvous.py): a send completes only
once its receive is posted, and all messages between two ranks pass through one FIFO.

The ring posts each step's send and receive together, every rank in the same order: under the emulation it runs to
the end at cp 2 and 4, forward and backward (GQA), with exactly the outputs and gradients of gloo's buffered sends.
The control posts each send alone and waits for it before receiving — an order gloo's buffers forgive and NCCL
does not: under the emulation every rank hangs in its first send, which the emulation names.
"""

from __future__ import annotations

import importlib
import json
import os
import time

import pytest
import torch
import torch.distributed as dist

from rendezvous import Deadlock, RendezvousP2P

from shardwise.launch import spawn_ranks

cp_module = importlib.import_module("shardwise.parallel.context_parallel")
HUNG = 3  # exit code of a rank that hung as expected


def _ring(rank: int, world: int, p2p):
    """Forward and backward of ring attention on this rank's zig-zag shard; (output, dq, dk, dv)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 16, 8, generator=g) for h in (4, 2, 2))
    grad = torch.randn(2, 4, 16, 8, generator=g)
    pos = cp_module.zigzag_positions(16, world, rank)
    q, k, v = (t[:, :, pos].clone().requires_grad_() for t in (q, k, v))
    cp_module.P2P = p2p
    try:
        out = cp_module.RingAttention.apply(q, k, v, dist.group.WORLD)
        out.backward(grad[:, :, pos])
    finally:
        cp_module.P2P = None
    return [out.detach(), q.grad, k.grad, v.grad]


def _send_first(ring, send, tag):
    """The control: each send posted alone and waited for, then the receive."""
    recv = torch.empty_like(send)
    for w in cp_module.P2P.post([(send, ring.next, tag)], [], ring.group):
        w.wait()
    return cp_module.P2P.post([], [(recv, ring.prev, tag)], ring.group), recv


def _worker(rank, world, out_dir, control):
    plain = _ring(rank, world, None)  # gloo, buffered sends
    emulated = _ring(rank, world, RendezvousP2P(timeout_s=60))
    result = {"finished": True, "max_diff": max((a - b).abs().max().item() for a, b in zip(plain, emulated))}
    if control:
        paired = cp_module._Ring.exchange
        cp_module._Ring.exchange = _send_first
        try:
            _ring(rank, world, RendezvousP2P(timeout_s=5))
            result["control"] = "finished"
        except Deadlock as exc:
            result["control"] = str(exc)
        finally:
            cp_module._Ring.exchange = paired
    with open(os.path.join(out_dir, f"{world}-{rank}.json"), "w") as f:
        json.dump(result, f)
    if result.get("control", "finished") != "finished":
        # Leave without tearing down a process group with receives pending forever — once every rank has written
        # its result (the first to exit would have the others stopped).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(os.path.exists(os.path.join(out_dir, f"{world}-{r}.json"))
                                                       for r in range(world)):
            time.sleep(0.1)
        os._exit(HUNG)


def test_ring_attention_is_nccl_safe(tmp_path):
    spawn_ranks(_worker, 4, str(tmp_path), False, timeout_s=120)
    with pytest.raises(Exception, match=f"exit code {HUNG}"):  # the control hung and left on purpose
        spawn_ranks(_worker, 2, str(tmp_path), True, timeout_s=120)
    for world in (4, 2):
        for rank in range(world):
            got = json.loads((tmp_path / f"{world}-{rank}.json").read_text())
            assert got["finished"] and got["max_diff"] == 0.0, (world, rank, got)
    for rank in (0, 1):
        control = json.loads((tmp_path / f"2-{rank}.json").read_text())["control"]
        assert f"send tag 0 to rank {1 - rank}" in control, control
