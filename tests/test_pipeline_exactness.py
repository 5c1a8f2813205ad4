"""The promise under pipeline parallelism: every schedule, pp in {2, 4} (interleaved with v = 2), and full
3-D layouts dp*tp*pp = 8 train to the single-process numbers.

CPU, gloo, fp32, 5 AdamW steps on the same data. The reference runs here, without torch.distributed; one
set of spawned processes per world size runs every layout in turn. Compared per step: loss and global
gradient norm (rtol 1e-5); after 5 steps every parameter, gathered over tp/dp and collected from every
pipeline stage under its layout-free name (atol 1e-5).
"""

from __future__ import annotations

import pytest

from exactness import collected, differences, reference_runs, train_layouts

from shardwise.launch import spawn_ranks
from shardwise.specs import Layout, load_model, model_from_hf_config, validate_layout
from shardwise.train import TrainConfig

LR = 2e-4  # see test_runtime_exactness.py: keeps Adam's ~1e-9-gradient entries inside the tolerance
GLOBAL_BATCH = 8

MODELS = {
    "tiny": load_model("tiny"),
    "tiny-gpt2": load_model("tiny-gpt2"),  # tied embeddings: first and last stage share gradients
    # 8 layers so that pp 4 x v 2 has a layer per chunk
    "tiny8": model_from_hf_config({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 8,
                                   "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
                                   "max_position_embeddings": 64}, "tiny8", "test"),
}


def _cfg(model: str, layout: Layout | None = None) -> TrainConfig:
    return TrainConfig(MODELS[model], layout or Layout(), steps=5, global_batch=GLOBAL_BATCH, seq_len=16, seed=5,
                       lr=LR, warmup_steps=1, progress=False)


def _layouts(world: int) -> list[tuple[str, Layout]]:
    out = []
    if world in (2, 4):
        for schedule in ("naive", "gpipe", "1f1b", "zb-h1", "interleaved-1f1b"):
            vpp = 2 if schedule == "interleaved-1f1b" else 1
            model = "tiny8" if world * vpp > 4 else "tiny"
            out.append((model, Layout(pp=world, vpp=vpp, micro_batch=1, schedule=schedule)))
        out.append(("tiny-gpt2", Layout(pp=2, dp=world // 2, micro_batch=2, schedule="1f1b")))
    if world == 4:
        out += [("tiny", Layout(pp=2, tp=2, sequence_parallel=True, micro_batch=2, schedule="zb-h1")),
                ("tiny8", Layout(pp=2, dp=2, vpp=2, micro_batch=1, zero=1, schedule="interleaved-1f1b")),
                # tied embedding sharded by FSDP on both stages; ZeRO-2 reduce-scatters every micro-batch
                ("tiny-gpt2", Layout(pp=2, dp=2, micro_batch=1, zero=2, schedule="1f1b"))]
    if world == 8:
        out += [("tiny", Layout(pp=2, dp=2, tp=2, micro_batch=1, schedule="1f1b")),
                ("tiny", Layout(pp=2, dp=2, tp=2, micro_batch=2, sequence_parallel=True, zero=1, schedule="zb-h1")),
                ("tiny8", Layout(pp=2, dp=2, tp=2, vpp=2, micro_batch=1, zero=3, schedule="interleaved-1f1b")),
                ("tiny-gpt2", Layout(pp=2, dp=2, tp=2, micro_batch=2, sequence_parallel=True, schedule="gpipe"))]
    jobs = []
    for model, layout in out:
        validate_layout(layout, MODELS[model], GLOBAL_BATCH, world)
        jobs.append((f"{model}-{layout.describe()}-{layout.schedule}-z{layout.zero}{'-sp' if layout.sequence_parallel else ''}",
                     _cfg(model, layout)))
    return jobs


@pytest.fixture(scope="module")
def references():
    return reference_runs(MODELS, _cfg)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4, 8])
def test_pipeline_layouts_match_single_process(world, references, tmp_path):
    jobs = _layouts(world)
    spawn_ranks(train_layouts, world, jobs, str(tmp_path))
    failures = []
    for key, cfg in jobs:
        records, params = collected(tmp_path, key, cfg.layout.pp)
        if cfg.spec.tie_embeddings:
            twin = params.pop("output.weight", None)  # the last stage's copy of tok_embeddings.weight
            if twin is not None and (twin - params["tok_embeddings.weight"]).abs().max() > 1e-6:
                failures.append(f"{key}: tied LM head drifted from the embedding")
        failures += differences(key, records, params, references[cfg.spec.name], steps=5)
    assert not failures, "\n".join(failures)

