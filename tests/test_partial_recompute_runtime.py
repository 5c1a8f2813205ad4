"""`shardwise train --recompute full --recompute-layers N`: only the first N blocks of each model chunk are
checkpointed (Megatron's --recompute-method block), and training stays exact.

CPU, gloo, fp32, 5 AdamW steps, world 2 (dp 2, and pp 2 under 1F1B), compared with the single-process run as
every exactness test is (tests/exactness.py: loss and gradient norm rtol 1e-5, parameters atol 1e-5).
"""

from __future__ import annotations

import pytest
import torch

from exactness import collected, differences, reference_runs, train_layouts

from shardwise.launch import spawn_ranks
from shardwise.model import Transformer
from shardwise.specs import Layout, load_model, validate_layout
from shardwise.train import TrainConfig

LR = 2e-4  # see test_runtime_exactness.py
TINY = load_model("tiny")  # 4 layers


def _cfg(name: str, layout: Layout | None = None) -> TrainConfig:
    return TrainConfig(TINY, layout or Layout(), steps=5, global_batch=8, seq_len=16, seed=7, lr=LR, warmup_steps=1,
                       progress=False)


def test_only_the_first_blocks_of_a_chunk_run_twice():
    # A checkpointed block runs its forward again in backward, the others once: with 1 of 4 layers recomputed,
    # block 0 runs twice per forward + backward and blocks 1-3 once (every layer: all twice).
    for layers, expected in ((1, [2, 1, 1, 1]), (None, [2, 2, 2, 2])):
        model = Transformer(TINY, seed=0, recompute="full", recompute_layers=layers)
        calls = [0] * 4
        for i, block in enumerate(model.layers.values()):
            inner = block._forward
            block._forward = lambda x, rope, inner=inner, i=i: (calls.__setitem__(i, calls[i] + 1), inner(x, rope))[1]
        tokens = torch.randint(0, TINY.vocab_size, (2, 16))
        model(tokens, tokens).backward()
        assert calls == expected, (layers, calls)


@pytest.mark.slow
def test_partial_recompute_trains_to_the_single_process_numbers(tmp_path):
    layouts = {"dp2": Layout(dp=2, micro_batch=2, recompute="full", recompute_layers=1),
               "pp2": Layout(pp=2, micro_batch=2, recompute="full", recompute_layers=1, schedule="1f1b")}
    for layout in layouts.values():
        validate_layout(layout, TINY, 8, 2, seq_len=16)
    spawn_ranks(train_layouts, 2, [(key, _cfg("tiny", lay)) for key, lay in layouts.items()], str(tmp_path))
    reference = reference_runs({"tiny": TINY}, _cfg)["tiny"]
    failures = []
    for key, lay in layouts.items():
        records, params = collected(tmp_path, key, lay.pp)
        failures += differences(key, records, params, reference, steps=5)
    assert not failures, "\n".join(failures)
