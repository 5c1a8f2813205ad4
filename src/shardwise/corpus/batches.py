"""The training loop's data: the same global batch at each step whatever the layout, each rank reading its rows.

Built-in corpus (no --data): step s's batch is a pure function of (seed, s) (shardwise.data).

A token file (--data): sequence i is tokens [i*S, i*S + S + 1) of the file (inputs and targets shifted by
one, consecutive sequences sharing one token, as Megatron's GPT dataset cuts them); documents run on
across sequence boundaries, separated by end-of-text tokens. Each epoch visits every sequence once in an
order drawn from (seed, epoch). The run's position is the number of sequences consumed, p = (step - 1) * B
before step `step`: the global batch is positions [p, p + B), data-parallel rank d takes rows
[p + d*B/dp, p + (d+1)*B/dp) and cuts them into micro-batches. So a global batch depends on (seed, data,
position) only, never on the layout; the position is saved in every checkpoint and restored on resume.

Validation (--val-data): the first whole global batches of its sequences, in file order, at most
--eval-batches of them: every layout evaluates the same sequences.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from shardwise.corpus.token_file import TokenFile
from shardwise.errors import UsageError


class TokenSequences:
    """Fixed-length sequences of a memory-mapped token file."""

    def __init__(self, tf: TokenFile, seq_len: int, vocab: int | None = None):
        self.tokens = np.memmap(tf.path, dtype=tf.dtype, mode="r", shape=(tf.tokens,))
        self.seq_len, self.path, self.vocab = seq_len, tf.path, vocab
        self.count = (tf.tokens - 1) // seq_len

    def rows(self, ids) -> torch.Tensor:
        """(len(ids), seq_len + 1) int64: only these sequences' tokens are read from the file."""
        s = self.seq_len
        out = np.empty((len(ids), s + 1), dtype=np.int64)
        for k, i in enumerate(ids):
            out[k] = self.tokens[i * s : i * s + s + 1]
        self._check(out, ids)
        return torch.from_numpy(out)

    def _check(self, out: np.ndarray, ids) -> None:
        """A token the model has no row for: the tokenizer's ids were checked against the model's vocabulary before
        the run, so the token file changed after it was written (a damaged cache entry of the right size). Named
        here, on the few rows read, rather than as an embedding's IndexError."""
        if self.vocab is None or not out.size or (top := int(out.max())) < self.vocab:
            return
        row = int(np.argmax(out.max(axis=1)))
        raise UsageError(f"token file {self.path}: token id {top:,} in sequence {list(ids)[row]:,} is outside the model's "
                         f"vocabulary of {self.vocab:,} — the cached token file is damaged: delete it and its .json, "
                         f"and the data is tokenized again")


def check_size(tf: TokenFile, seq_len: int, global_batch: int, flag: str) -> None:
    count = (tf.tokens - 1) // seq_len
    if count < global_batch:
        raise UsageError(f"{flag} {tf.describe()}: {tf.tokens:,} tokens make {count} sequences of {seq_len} + 1 tokens, "
                         f"fewer than one global batch of {global_batch} — add data, or lower --global-batch or --seq-len")


def _split(rows: torch.Tensor, micro_batch: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = rows[:, :-1].to(device), rows[:, 1:].to(device)
    return list(zip(x.split(micro_batch), y.split(micro_batch)))


def _epoch_seed(seed: int, epoch: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:data:{epoch}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


class BuiltinBatches:
    """The shipped corpus through the byte tokenizer: batch s from (seed, s)."""

    def __init__(self, seed: int, global_batch: int, seq_len: int):
        self.seed, self.global_batch, self.seq_len = seed, global_batch, seq_len

    def local_microbatches(self, step: int, dp: int, dp_rank: int, micro_batch: int, device):
        from shardwise import data

        return data.local_microbatches(self.seed, step, self.global_batch, self.seq_len, dp, dp_rank, micro_batch, device)

    def state(self, step: int) -> dict:
        return {"seed": self.seed, "next_step": step + 1}

    def restore(self, state: dict, step: int) -> None:
        pass  # a function of the step


class CorpusBatches:
    """A token file's sequences in a seeded order, one global batch per step, from a saved position."""

    def __init__(self, tf: TokenFile, seed: int, global_batch: int, seq_len: int, vocab: int | None = None):
        self.tf, self.seed, self.global_batch = tf, seed, global_batch
        self.sequences = TokenSequences(tf, seq_len, vocab)
        self.position = 0  # sequences consumed
        self._order: tuple[int, np.ndarray] | None = None

    def _ids(self, start: int, count: int) -> list[int]:
        n, out = self.sequences.count, []
        for pos in range(start, start + count):
            epoch = pos // n
            if self._order is None or self._order[0] != epoch:
                g = torch.Generator().manual_seed(_epoch_seed(self.seed, epoch))
                self._order = (epoch, torch.randperm(n, generator=g).numpy())
            out.append(int(self._order[1][pos % n]))
        return out

    def local_microbatches(self, step: int, dp: int, dp_rank: int, micro_batch: int, device):
        b = self.global_batch
        lo, hi = dp_rank * b // dp, (dp_rank + 1) * b // dp
        rows = self.sequences.rows(self._ids(self.position + lo, hi - lo))
        self.position += b
        return _split(rows, micro_batch, device)

    def state(self, step: int) -> dict:
        s = self.sequences.seq_len
        return {"seed": self.seed, "next_step": step + 1, "sequences": self.position,
                "epoch": self.position // self.sequences.count, "tokens": self.position * s, "data": self.tf.key}

    def restore(self, state: dict, step: int) -> None:
        self.position = int(state.get("sequences", step * self.global_batch))


def batches(cfg):
    """The data of a run: the token file of --data, else the built-in corpus."""
    if cfg.data is None:
        return BuiltinBatches(cfg.seed, cfg.global_batch, cfg.seq_len)
    return CorpusBatches(cfg.data, cfg.seed, cfg.global_batch, cfg.seq_len, cfg.spec.vocab_size)


def validation_batches(cfg, dp: int, dp_rank: int, micro_batch: int, device):
    """Per evaluated global batch, this dp rank's micro-batches (the same sequences for every layout)."""
    seqs = TokenSequences(cfg.val_data, cfg.seq_len, cfg.spec.vocab_size)
    b = cfg.global_batch
    for k in range(min(seqs.count // b, cfg.eval_batches)):
        lo, hi = k * b + dp_rank * b // dp, k * b + (dp_rank + 1) * b // dp
        yield _split(seqs.rows(range(lo, hi)), micro_batch, device)
