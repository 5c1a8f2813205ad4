"""NCCL's point-to-point semantics emulated on gloo, for the executor tests (PipelineExecutor(p2p=...)).

On NCCL a large send completes only once its receive is posted, and all messages between two ranks
pass through one FIFO. gloo buffers sends and matches by tag, so an order that deadlocks on GPUs runs
fine here. `RendezvousP2P` restores NCCL's rules on top of gloo:
  - one server thread per peer serves the messages to and from it in posting order, one exchange at a
    time (the messages of one exchange to one peer together, as in an NCCL group);
  - a receive, when served, tells the sender it is posted (a one-element "ready" token on a separate
    tag); a send waits for that token before its data moves, and only then completes;
  - tags are ignored, as NCCL ignores them: the k-th send to a peer meets the k-th receive from it (the caller's
    tag stays in the messages, to name the op), so both sides must post their messages in the same order.
A wait that sees its message unfinished for `timeout_s` raises `Deadlock`, naming what this rank's
servers are stuck on, instead of hanging (the caller then leaves the process: the stuck threads hold
gloo receives that never complete).
"""

from __future__ import annotations

import queue
import threading

import torch
import torch.distributed as dist

READY = 1 << 24  # tag offset of the ready tokens


class Deadlock(RuntimeError):
    pass


class _Op:
    def __init__(self, kind, tensor, peer, tag, group, wire):
        self.kind, self.tensor, self.peer, self.tag, self.group = kind, tensor, peer, tag, group
        self.wire = wire  # the tag gloo matches on: this op's place in its peer's FIFO, one way
        self.done = threading.Event()

    def __repr__(self):
        return f"{self.kind} tag {self.tag} {'to' if self.kind == 'send' else 'from'} rank {self.peer}"


class _Server(threading.Thread):
    """Serves one peer's FIFO: each exchange's ops to that peer together, exchanges in posting order."""

    def __init__(self):
        super().__init__(daemon=True)
        self.units: queue.Queue = queue.Queue()
        self.current: list = []

    def run(self):
        while True:
            self.current = unit = self.units.get()
            token = torch.zeros(1)
            # Serve every op of the exchange at once: receives announce themselves, sends listen.
            ready = {id(op): dist.irecv(torch.zeros(1), op.peer, op.group, tag=READY + op.wire)
                     for op in unit if op.kind == "send"}
            works = [(op, dist.isend(token, op.peer, op.group, tag=READY + op.wire)) for op in unit if op.kind == "recv"]
            works += [(op, dist.irecv(op.tensor, op.peer, op.group, tag=op.wire)) for op in unit if op.kind == "recv"]
            for op in unit:
                if op.kind == "send":
                    ready[id(op)].wait()  # its receive is posted: now the data may move
                    works.append((op, dist.isend(op.tensor, op.peer, op.group, tag=op.wire)))
            for _, work in works:
                work.wait()
            for op in unit:
                op.done.set()
            self.current = []


class RendezvousP2P:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.servers: dict[int, _Server] = {}
        self.posted: dict[tuple[str, int], int] = {}  # (kind, peer) -> messages posted so far

    def post(self, sends, recvs, group) -> list:
        units: dict[int, list] = {}
        for kind, items in (("send", sends), ("recv", recvs)):
            for tensor, peer, tag in items:
                n = self.posted[kind, peer] = self.posted.get((kind, peer), -1) + 1
                units.setdefault(peer, []).append(_Op(kind, tensor, peer, tag, group, n % READY))
        for peer, unit in units.items():
            if peer not in self.servers:
                self.servers[peer] = _Server()
                self.servers[peer].start()
            self.servers[peer].units.put(unit)
        return [_Wait(self, op) for unit in units.values() for op in unit]

    def stuck_on(self) -> str:
        return ", ".join(repr(op) for server in self.servers.values() for op in server.current if not op.done.is_set())


class _Wait:
    def __init__(self, p2p: RendezvousP2P, op: _Op):
        self.p2p, self.op = p2p, op

    def wait(self) -> None:
        if not self.op.done.wait(self.p2p.timeout_s):
            raise Deadlock(f"rank {dist.get_rank()} waits for {self.op!r}; its FIFO serves {self.p2p.stuck_on()}")
