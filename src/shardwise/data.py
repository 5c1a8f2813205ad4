"""A small public-domain English corpus shipped with the package, a byte tokenizer, a deterministic sampler.

The corpus (~47 KB, files in shardwise/data/): the Declaration of Independence, Lincoln's Gettysburg and
Second Inaugural addresses, the Preamble and the Bill of Rights, Shakespeare's sonnets and speeches,
and chapters of the King James Bible. Tokens are bytes (vocabulary 256, the tiny presets' size).

The batch of step s is a pure function of (seed, s): `global_batch` windows of seq_len + 1 tokens at
random offsets. Data-parallel rank d takes rows [d*B/dp, (d+1)*B/dp) and cuts them into micro-batches,
so every layout sees the same global batch in the same order.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import torch

@lru_cache(maxsize=1)
def corpus_tokens() -> torch.Tensor:
    files = sorted(p for p in resources.files("shardwise").joinpath("data").iterdir() if p.name.endswith(".txt"))
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in files)
    return torch.frombuffer(bytearray(encode(text)), dtype=torch.uint8).long()


def encode(text: str) -> bytes:
    return text.encode("utf-8")


def decode(tokens) -> str:
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def global_batch(seed: int, step: int, batch: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each (batch, seq_len) int64: windows of the corpus and the same shifted by one."""
    tokens = corpus_tokens()
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch,), generator=g)
    windows = torch.stack([tokens[s : s + seq_len + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def local_microbatches(seed: int, step: int, batch: int, seq_len: int, dp: int, dp_rank: int, micro_batch: int,
                       device: str | torch.device = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This data-parallel rank's slice of the step's global batch, cut into micro-batches."""
    inputs, targets = global_batch(seed, step, batch, seq_len)
    rows = slice(dp_rank * batch // dp, (dp_rank + 1) * batch // dp)
    x, y = inputs[rows].to(device), targets[rows].to(device)
    return list(zip(x.split(micro_batch), y.split(micro_batch)))
