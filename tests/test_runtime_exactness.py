"""The promise: every dp x tp layout (SP on/off, ZeRO 0/1/2/3) trains to the single-process numbers.

CPU, gloo, fp32, 5 AdamW steps on the same data. The reference is trained here, in this process, with no
torch.distributed at all; one set of 2 (then 4) spawned processes runs every layout in turn.
Compared per step: loss (rtol 1e-5) and global gradient norm (rtol 1e-5; Adam is blind to a gradient that
is off by a constant factor, the norm is not); after 5 steps, every parameter gathered to its full
unpadded shape (atol 1e-5). Clipping engages (norms are ~2-5, the clip is 1.0).
"""

from __future__ import annotations

import os

import pytest
import torch

from exactness import differences, reference_runs

from shardwise.launch import spawn_ranks
from shardwise.model import Transformer
from shardwise.parallel import build_mesh, full_state_dict
from shardwise.specs import Layout, load_model, model_from_hf_config, validate_layout
from shardwise.train import TrainConfig, train

# Adam divides by sqrt(v) + 1e-8, so an entry whose gradient is ~1e-9 moves by lr * (its rounding error / 1e-8):
# with lr 1e-3 that reaches ~2e-5 for one or two of 16k entries of a weight (fp32 summation order differs
# between layouts). lr 2e-4 keeps those entries under the 1e-5 tolerance; a wrong gradient still moves
# entries by ~lr = 2e-4 per step, 20x the tolerance.
LR = 2e-4

MODELS = {
    "tiny": load_model("tiny"),  # llama, GQA (4 heads, 2 KV heads), untied
    "tiny-gpt2": load_model("tiny-gpt2"),  # biases, learned positions, tied, 4 KV heads (tp 4 possible)
    # vocab 259: tp 2 and 4 pad it to 260 (Megatron); padded logits must not change a single number
    "padded": model_from_hf_config({"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                                    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 259,
                                    "tie_word_embeddings": True, "max_position_embeddings": 64}, "padded", "test"),
}


def _cfg(model: str, layout: Layout | None = None) -> TrainConfig:
    return TrainConfig(MODELS[model], layout or Layout(), steps=5, global_batch=8, seq_len=16, seed=3, lr=LR,
                       warmup_steps=1, progress=False)


def _jobs(world: int) -> list[tuple[str, TrainConfig]]:
    """(model, dp, tp, sp, zero, micro_batch, recompute) cases whose dp * tp == world."""
    cases = []
    for dp in (d for d in (1, 2, 4) if world % d == 0):
        tp = world // dp
        for sp in (False, True) if tp > 1 else (False,):
            for zero in (0, 1, 2, 3) if dp > 1 else (0,):
                model = "tiny" if tp <= 2 else "tiny-gpt2"
                cases.append((model, dp, tp, sp, zero, 4 // dp, "none"))  # 2 micro-batches per step
    cases += [("tiny-gpt2", 1, world, True, 0, 8, "selective"), ("tiny-gpt2", world, 1, False, 3, 1, "none"),
              ("padded", 1, world, world == 4, 0, 4, "full")]
    if world == 4:
        cases += [("tiny-gpt2", 2, 2, True, 3, 2, "none"), ("tiny-gpt2", 2, 2, False, 1, 4, "full")]
    jobs = []
    for model, dp, tp, sp, zero, mb, rc in cases:
        layout = Layout(dp=dp, tp=tp, zero=zero, sequence_parallel=sp, micro_batch=mb, recompute=rc)
        validate_layout(layout, MODELS[model], 8, world)
        jobs.append((f"{model}-dp{dp}-tp{tp}{'-sp' if sp else ''}-z{zero}-mb{mb}-{rc}", _cfg(model, layout)))
    return jobs


def _worker(rank: int, world: int, jobs, out_dir: str) -> None:
    for key, cfg in jobs:
        mesh = build_mesh(1, cfg.layout.dp, cfg.layout.tp, backend="gloo", timeout_s=60)
        result = train(cfg, mesh)
        params = full_state_dict(result.runtime.chunks[0])
        if rank == 0:
            torch.save({"records": result.records, "params": params}, os.path.join(out_dir, f"{key}.pt"))


@pytest.fixture(scope="module")
def references():
    return reference_runs(MODELS, _cfg)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_every_layout_matches_single_process(world, references, tmp_path):
    jobs = _jobs(world)
    spawn_ranks(_worker, world, jobs, str(tmp_path))
    failures = []
    for key, cfg in jobs:
        got = torch.load(tmp_path / f"{key}.pt", weights_only=True)
        failures += differences(key, got["records"], got["params"], references[cfg.spec.name], steps=5)
    assert not failures, "\n".join(failures)


def test_training_moves_the_weights(references):
    """The comparison above is not vacuous: 5 steps change the loss and every weight matrix by >> 1e-5."""
    records, params = references["tiny"]
    start = dict(Transformer(MODELS["tiny"], seed=3).named_parameters())
    assert records[-1]["loss"] < records[0]["loss"] - 1e-3
    for name, p in params.items():
        if p.dim() == 2:
            assert (p - start[name]).abs().max() > 50 * 1e-5, name


def test_the_gradient_norm_of_a_large_tensor_is_the_same_whole_or_split():
    # An fp32 norm's rounding grows with the tensor (on a CPU about 7e-5 relative at 4M elements), so a layout that
    # splits a large tensor over TP (a vocabulary's rows) reported another norm than one process, and clipped by
    # another coefficient: 1.2e-5 apart at vocabulary 6,000, past the 1e-5 above. The norm is summed in fp64.
    from shardwise.parallel import GlobalGradNorm, Sharded

    torch.manual_seed(0)
    grad = torch.randn(4096, 1024)
    exact = grad.double().norm().item()

    def norm(*parts: torch.Tensor) -> float:
        chunks = []
        for part in parts:
            layer = torch.nn.Linear(part.shape[1], part.shape[0], bias=False)
            layer.weight.grad = part.clone()
            chunks.append(Sharded(module=layer, model=layer))
        return GlobalGradNorm(chunks, None).clip_(1e9, torch.device("cpu"))[0].item()

    whole, halves = norm(grad), norm(grad[:2048], grad[2048:])
    assert abs(whole - exact) / exact < 1e-7 and abs(halves - exact) / exact < 1e-7, (whole, halves, exact)
