"""The executor under NCCL's rules, on gloo: rendezvous sends, one FIFO per pair of ranks, tags ignored
(tests/rendezvous.py; at pp 2 and pp 4).

The order the executor used before (each send left in flight, each receive alone before its action)
hangs under those rules — 1F1B with p = 2, m = 2 — and the emulation names the messages each rank is
stuck on, the ones the static check predicts. The paired program (`schedules.p2p_program`) runs every
schedule (naive, GPipe, 1F1B, interleaved 1F1B, ZB-H1) to the end under the same rules, with the same
gradients as the plain gloo run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import pytest
import torch
import torch.distributed as dist

from rendezvous import Deadlock, RendezvousP2P

from shardwise.launch import spawn_ranks
from shardwise.specs import load_model

SPEC = dataclasses.replace(load_model("tiny"), hidden=32, ffn_hidden=64, head_dim=8, num_layers=4)
SEQ, MB = 16, 2
# (schedule, m, v, program): the paired program must finish; the old one must hang.
RUNS = [("naive", 2, 1, "paired"), ("gpipe", 4, 1, "paired"), ("1f1b", 4, 1, "paired"),
        ("interleaved-1f1b", 4, 2, "paired"), ("zb-h1", 4, 1, "paired"), ("1f1b", 2, 1, "unpaired")]
PAIRED = [f"{name}-m{m}-v{v}-paired" for name, m, v, program in RUNS if program == "paired"]
HUNG = 3  # exit code of a rank that hung as expected


def _step(name, m, v, program, rank, p2p):
    from shardwise.parallel.pipeline import PipelineExecutor
    from shardwise.parallel.pipeline_step import build_stage_chunks
    from shardwise.schedules import build
    from shardwise.schedules.p2p import p2p_program, unpaired_program

    schedule = build(name, 2, m, v)
    chunks = build_stage_chunks(SPEC, 2, v, rank, seed=3, seq_len=SEQ)
    programs = (p2p_program if program == "paired" else unpaired_program)(schedule)
    ex = PipelineExecutor(schedule, rank, chunks, dist.group.WORLD, (MB, SEQ, SPEC.hidden), program=programs[rank], p2p=p2p)
    tokens = torch.randint(0, SPEC.vocab_size, (m * MB, SEQ + 1), generator=torch.Generator().manual_seed(0))
    ex.step(list(tokens[:, :-1].chunk(m)), list(tokens[:, 1:].chunk(m)), 0.0)
    return {n: p.grad.clone() for c in chunks for n, p in c.named_parameters()}


def _worker(rank, world, out_dir):
    results = {}
    for name, m, v, program in RUNS:
        key = f"{name}-m{m}-v{v}-{program}"
        plain = _step(name, m, v, program, rank, None)  # gloo, buffered sends: always finishes
        try:
            emulated = _step(name, m, v, program, rank, RendezvousP2P(timeout_s=60 if program == "paired" else 5))
        except Deadlock as exc:
            results[key] = {"hung": str(exc)}
        else:
            diff = max((emulated[n] - plain[n]).abs().max().item() for n in plain)
            results[key] = {"finished": True, "max_grad_diff": diff}
        if "hung" in results[key]:
            break  # the stuck server threads hold receives that never complete: nothing can follow
    with open(os.path.join(out_dir, f"{rank}.json.tmp"), "w") as f:
        json.dump(results, f)
    os.replace(os.path.join(out_dir, f"{rank}.json.tmp"), os.path.join(out_dir, f"{rank}.json"))
    # A barrier through the files, not the process group (its receives are stuck): a rank that left early
    # would close the peer's connection while the peer still waits out its own deadlock timeout.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(os.path.exists(os.path.join(out_dir, f"{r}.json")) for r in range(world)):
        time.sleep(0.05)
    if any("hung" in r for r in results.values()):
        os._exit(HUNG)  # leave without tearing down a process group with receives pending forever


def test_old_order_hangs_under_rendezvous_and_the_paired_program_runs(tmp_path):
    from shardwise.schedules import build
    from shardwise.schedules.p2p import check, unpaired_program

    with pytest.raises(RuntimeError, match=f"exit code {HUNG}"):  # the ranks that hung left on purpose
        spawn_ranks(_worker, 2, str(tmp_path), timeout_s=120)
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    for rank in got:
        for key in PAIRED:  # every schedule name
            assert rank[key]["finished"] and rank[key]["max_grad_diff"] == 0.0, (key, rank[key])
        assert "hung" in rank["1f1b-m2-v1-unpaired"], rank
    # Stuck where the static check says: rank 0 behind its second activation send, rank 1 behind its
    # first gradient send (tags: (stage * 2 + is_grad) * m + micro-batch).
    assert "send tag 1 to rank 1" in got[0]["1f1b-m2-v1-unpaired"]["hung"]
    assert "send tag 6 to rank 0" in got[1]["1f1b-m2-v1-unpaired"]["hung"]
    predicted = check(build("1f1b", 2, 2), unpaired_program(build("1f1b", 2, 2)), "rendezvous")
    assert "send act1.s0 to rank 1" in predicted and "send grad0.s1 to rank 0" in predicted



def _send_then_receive(rank, world, out_dir):
    t = torch.ones(4096)  # 16 KiB: one micro-batch's activation of the tiny model
    if rank == 0:
        dist.isend(t, 1).wait()
        stamp = time.time()  # when rank 0's send completed
    else:
        time.sleep(0.3)  # rank 0 has long posted its send by now
        stamp = time.time()  # when rank 1 posts the receive
        dist.recv(t, 0)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(stamp, f)


def test_a_gloo_send_completes_only_once_its_receive_is_posted(tmp_path):
    # What the planner's pipeline term assumes of the executor's sends (schedules.p2p.program_makespan):
    # rendezvous, like NCCL's large messages; if gloo ever buffers them, its timed program must change.
    spawn_ranks(_send_then_receive, 2, str(tmp_path))
    sent, posted = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert sent >= posted


RUNS4 = [("gpipe", 4, 1), ("1f1b", 4, 1), ("1f1b", 8, 1), ("interleaved-1f1b", 8, 2), ("zb-h1", 4, 1)]
SPEC8 = dataclasses.replace(SPEC, num_layers=8)


def _worker4(rank, world, out_dir):
    """pp 4 under the emulation (NCCL's rendezvous, one tagless FIFO per pair): every rank's program meets its
    neighbours' in the same order, so each schedule finishes with plain gloo's gradients."""
    from shardwise.parallel.pipeline import PipelineExecutor
    from shardwise.parallel.pipeline_step import build_stage_chunks
    from shardwise.schedules import build

    out = {}
    for name, m, v in RUNS4:
        grads = []
        for p2p in (None, RendezvousP2P(timeout_s=60)):
            schedule = build(name, world, m, v)
            chunks = build_stage_chunks(SPEC8, world, v, rank, seed=3, seq_len=SEQ)
            ex = PipelineExecutor(schedule, rank, chunks, dist.group.WORLD, (MB, SEQ, SPEC8.hidden), p2p=p2p)
            tokens = torch.randint(0, SPEC8.vocab_size, (m * MB, SEQ + 1), generator=torch.Generator().manual_seed(0))
            ex.step(list(tokens[:, :-1].chunk(m)), list(tokens[:, 1:].chunk(m)), 0.0)
            grads.append({n: p.grad.clone() for c in chunks for n, p in c.named_parameters()})
        out[f"{name}-m{m}-v{v}"] = max((grads[1][n] - grads[0][n]).abs().max().item() for n in grads[0])
    with open(os.path.join(out_dir, f"pp4-{rank}.json"), "w") as f:
        json.dump(out, f)


def test_four_stages_run_every_schedule_under_nccls_rules(tmp_path):
    spawn_ranks(_worker4, 4, str(tmp_path), timeout_s=120)
    for rank in range(4):
        got = json.loads((tmp_path / f"pp4-{rank}.json").read_text())
        assert got == {f"{n}-m{m}-v{v}": 0.0 for n, m, v in RUNS4}, (rank, got)


def _swapped(rank, world, out_dir):
    """Two messages to one peer, received in the other order than sent, each named by its own tag."""
    p2p = RendezvousP2P(timeout_s=30)
    if rank == 0:
        for w in p2p.post([(torch.full((4,), 1.0), 1, 11), (torch.full((4,), 2.0), 1, 22)], [], dist.group.WORLD):
            w.wait()
    else:
        first, second = torch.zeros(4), torch.zeros(4)
        for w in p2p.post([], [(second, 0, 22), (first, 0, 11)], dist.group.WORLD):
            w.wait()
        with open(os.path.join(out_dir, "got.json"), "w") as f:
            json.dump([first[0].item(), second[0].item()], f)


def test_the_emulation_ignores_tags_as_nccl_does(tmp_path):
    # gloo would match tag 22 to the second send; NCCL matches the first send to the first receive posted. The
    # emulation does what NCCL does, so an executor relying on tags to reorder its messages fails here.
    spawn_ranks(_swapped, 2, str(tmp_path), timeout_s=60)
    assert json.loads((tmp_path / "got.json").read_text()) == [2.0, 1.0]  # the tag-11 receive got the second send
