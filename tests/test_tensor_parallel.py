"""Vocab-parallel pieces on their own: no rank holds full logits; the padded vocabulary changes nothing."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from shardwise.launch import spawn_ranks
from shardwise.model import Transformer
from shardwise.parallel import build_mesh, tensor_parallel
from shardwise.parallel.tensor_parallel import VocabParallelCrossEntropy, padded_vocab
from shardwise.specs import model_from_hf_config

VOCAB = 259  # tp 2 pads it to 260


def _spec(vocab=VOCAB):
    return model_from_hf_config({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                 "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": vocab,
                                 "max_position_embeddings": 32}, "t", "test")


def _worker(rank, world, out_dir):
    mesh = build_mesh(1, 1, 2, backend="gloo", timeout_s=60)
    group = mesh["tp"].get_group()
    # 1. the loss on vocabulary shards equals the full cross-entropy; so does the gradient of each shard
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, VOCAB, generator=g) * 3
    targets = torch.randint(0, VOCAB, (3, 5), generator=g)
    rows = padded_vocab(VOCAB, 2) // 2
    padded = torch.cat([logits, torch.full((3, 5, 1), 123.0)], dim=-1)  # a huge padded logit: must be ignored
    shard = padded[..., rank * rows:(rank + 1) * rows].clone().requires_grad_()
    loss = VocabParallelCrossEntropy(rank * rows, VOCAB, group)(shard, targets)
    loss.backward()
    # 2. a TP model's LM head emits only this rank's vocabulary rows
    model = tensor_parallel(Transformer(_spec(), seed=1), mesh["tp"]).model
    widths = []
    model.output.register_forward_hook(lambda m, a, o: widths.append(o.shape[-1]))
    model(torch.randint(0, VOCAB, (2, 8)), torch.randint(0, VOCAB, (2, 8)))
    torch.save({"loss": loss.detach(), "grad": shard.grad, "width": widths[0]}, os.path.join(out_dir, f"{rank}.pt"))


def test_vocab_parallel_loss_and_head(tmp_path):
    spawn_ranks(_worker, 2, str(tmp_path))
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, VOCAB, generator=g) * 3).requires_grad_()
    targets = torch.randint(0, VOCAB, (3, 5), generator=g)
    ref = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    ref.backward()
    got = [torch.load(tmp_path / f"{r}.pt", weights_only=True) for r in (0, 1)]
    for r in got:
        torch.testing.assert_close(r["loss"], ref.detach(), rtol=1e-6, atol=0)
        assert r["width"] == 130  # 260 padded rows / tp 2: never the full 259 logits
    grad = torch.cat([got[0]["grad"], got[1]["grad"]], dim=-1)
    torch.testing.assert_close(grad[..., :VOCAB], logits.grad, rtol=1e-5, atol=1e-7)
    assert torch.all(grad[..., VOCAB:] == 0)  # the padded row gets no gradient
