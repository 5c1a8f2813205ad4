"""Resume is exact, under the same layout and under another one.

Every run is 10 steps long (--steps 10 sets the LR schedule). A split run stops after step 5 with a checkpoint
(--stop-after 5), then a second invocation resumes it to step 10:
- same layout: the per-step losses and gradient norms equal the uninterrupted run of that layout bitwise;
- another layout (dp, tp, pp, cp, ZeRO, schedule all change; PP <-> non-PP, ZeRO <-> non-ZeRO, FSDP, tied and
  padded vocabularies, the sequence split another way): within rtol 1e-5 of the single-process run trained here without torch.distributed.
A control resumes with the AdamW moments dropped: it misses the reference by far more than the tolerance.
Mixture of experts: the experts (E, ...) tensors are saved under their single-process names and shapes
whatever ep x etp split them, so a resume may change ep (2 -> 4, ep -> none, etp/FSDP-sharded experts -> a
pipeline with ep): same tolerance, same single-process reference.
The layout-free format is checked directly too: a checkpoint written by tp4 with a padded vocabulary, and
one written by ep 2 with ZeRO-1 over the experts' replicas, exported to safetensors (and the MoE one as a
Mixtral folder), hold the single-process model's tensors.

CPU, gloo, fp32. Saves run in one process group per world size, then the resumes in another.
"""

from __future__ import annotations

import json
import os
import pytest
import torch
import torch.distributed as dist

from shardwise.checkpoint import state as ckpt_state
from shardwise.launch import spawn_ranks
from shardwise.parallel import build_mesh
from shardwise.specs import Layout, load_model, model_from_hf_config, validate_layout
from shardwise.train import TrainConfig, train

LR = 2e-4  # as in test_runtime_exactness.py: Adam's tiny-gradient entries stay inside the 1e-5 tolerance
STEPS, STOP = 10, 5

MODELS = {
    "tiny": load_model("tiny"),  # llama, GQA
    "tiny-gpt2": load_model("tiny-gpt2"),  # biases, learned positions, LM head tied to the embedding
    # vocab 259: tp 2 and 4 pad it (260); the padding must never reach the checkpoint
    "padded": model_from_hf_config({"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                                    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 259,
                                    "tie_word_embeddings": True, "max_position_embeddings": 64}, "padded", "test"),
    "tiny-moe": load_model("tiny-moe"),  # Mixtral-shaped: 4 experts, top-2
}


def L(dp=1, tp=1, pp=1, mb=None, **kw) -> Layout:
    mb = mb or (8 // dp if pp == 1 else 1)
    return Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, **kw)


# (name, model, layout that saves at step 5, layout that resumes to step 10)
CHANGES = [
    ("2x2x1-to-1x1x4", "tiny", L(dp=2, tp=2), L(pp=4)),
    ("2x2x1-zero1-to-4x1x1", "tiny", L(dp=2, tp=2, zero=1, sequence_parallel=True, mb=2), L(dp=4, mb=1)),
    ("pp2-dp2-zero1-interleaved-to-tp2", "tiny", L(dp=2, pp=2, vpp=2, zero=1, schedule="interleaved-1f1b"),
     L(tp=2, sequence_parallel=True)),
    ("fsdp-zero3-to-pp2-tp2-zbh1", "tiny", L(dp=2, zero=3, mb=2), L(pp=2, tp=2, mb=2, schedule="zb-h1")),
    ("1x1x1-to-2x2x1-zero2", "tiny", L(), L(dp=2, tp=2, zero=2, mb=2)),
    ("tied-pp2-gpipe-to-tp4", "tiny-gpt2", L(pp=2, mb=2, schedule="gpipe"), L(tp=4, sequence_parallel=True)),
    ("padded-tp4-to-2x2x1-zero1", "padded", L(tp=4), L(dp=2, tp=2, zero=1, mb=2)),
    ("4x1x1-zero1-to-2x1x1-zero1", "tiny", L(dp=4, zero=1, mb=1), L(dp=2, zero=1)),
    ("pp2-tp2-to-1x1x1", "tiny", L(pp=2, tp=2, mb=2), L()),
    ("cp2-allgather-dp2-zero1-to-cp4-ring", "tiny", L(dp=2, cp=2, cp_mode="allgather", zero=1, mb=2), L(cp=4, mb=4)),
    ("moe-dp2-ep2-to-dp4-ep4", "tiny-moe", L(dp=2, ep=2), L(dp=4, ep=4)),
    ("moe-dp4-ep2-zero1-to-1x1x1", "tiny-moe", L(dp=4, ep=2, zero=1, mb=1), L()),
    ("moe-dp4-etp2-fsdp-zero3-to-pp2-tp2-ep2", "tiny-moe", L(dp=4, etp=2, zero=3, mb=1),
     L(pp=2, tp=2, ep=2, sequence_parallel=True, mb=2)),
    # FSDP's shards saved and loaded as they are (nothing gathered): dp 4 -> 2, the padded vocabulary's 259 rows uneven
    ("padded-dp4-zero3-to-dp2-zero2", "padded", L(dp=4, zero=3, mb=1), L(dp=2, zero=2, mb=2)),
]
# Same layout before and after: bitwise (dp <= 2 keeps every all-reduce a two-term sum, so bucketing cannot reorder it)
SAME = [("same-2x2x1-zero1-sp", "tiny", L(dp=2, tp=2, zero=1, sequence_parallel=True, mb=2)),
        ("same-pp2-dp2-interleaved", "tiny", L(dp=2, pp=2, vpp=2, schedule="interleaved-1f1b")),
        ("same-fsdp-zero3", "tiny-gpt2", L(dp=2, zero=3, mb=2)),
        ("same-moe-dp2-tp2-ep4-zero1", "tiny-moe", L(dp=2, tp=2, ep=4, zero=1, sequence_parallel=True, mb=2))]


def _cfg(model: str, layout: Layout, **kw) -> TrainConfig:
    return TrainConfig(MODELS[model], layout, steps=STEPS, global_batch=8, seq_len=16, seed=3, lr=LR, warmup_steps=1,
                       progress=False, **kw)


def _jobs(tmp, phase: str) -> dict[int, list[tuple[str, TrainConfig]]]:
    """Jobs of a phase ("save" or "resume") by world size."""
    by_world: dict[int, list] = {}
    cases = CHANGES + [(n, m, a, a) for n, m, a in SAME]
    for name, model, first, second in cases:
        layout = first if phase == "save" else second
        validate_layout(layout, MODELS[model], 8, layout.world_size)
        kw = {"checkpoint_dir": str(tmp / name), **({"stop_after": STOP} if phase == "save" else {"resume": True})}
        by_world.setdefault(layout.world_size, []).append((f"{name}-{phase}", _cfg(model, layout, **kw)))
    if phase == "save":
        for name, model, layout in SAME:  # the uninterrupted run of that layout
            by_world[layout.world_size].append((f"{name}-straight", _cfg(model, layout)))
    return by_world


def _run(key: str, cfg: TrainConfig, mesh, out_dir) -> None:
    records = train(cfg, mesh).records
    if not dist.is_initialized() or dist.get_rank() == 0:
        with open(os.path.join(out_dir, f"{key}.json"), "w") as f:
            json.dump(records, f)


def _worker(rank: int, world: int, jobs, out_dir: str) -> None:
    for key, cfg in jobs:
        lay = cfg.layout
        _run(key, cfg, build_mesh(lay.pp, lay.dp, lay.tp, cp=lay.cp, backend="gloo", timeout_s=60), out_dir)
        dist.barrier()


def _phase(tmp, phase: str) -> None:
    for world, jobs in sorted(_jobs(tmp, phase).items()):
        if world == 1:
            for key, cfg in jobs:
                _run(key, cfg, None, str(tmp))
        else:
            spawn_ranks(_worker, world, jobs, str(tmp))


def _records(tmp, key) -> list[dict]:
    return json.loads((tmp / f"{key}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    _phase(tmp, "save")
    _phase(tmp, "resume")
    return tmp


@pytest.fixture(scope="module")
def references():
    """Single-process runs of all 10 steps, no torch.distributed."""
    return {name: train(_cfg(name, L())).records for name in MODELS}


def _field(records, field):
    return [r[field] for r in records]


@pytest.mark.slow
def test_resume_under_another_layout_matches_single_process(runs, references):
    failures = []
    for name, model, first, second in CHANGES:
        got = _records(runs, f"{name}-save") + _records(runs, f"{name}-resume")
        assert [r["step"] for r in got] == list(range(1, STEPS + 1)), name
        for field in ("loss", "grad_norm"):
            ours, ref = _field(got, field), _field(references[model], field)
            if not torch.allclose(torch.tensor(ours), torch.tensor(ref), rtol=1e-5, atol=0):
                failures.append(f"{name}: {field} {ours} vs single process {ref}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_resume_under_the_same_layout_is_bitwise(runs):
    for name, _, _ in SAME:
        straight = _records(runs, f"{name}-straight")
        split = _records(runs, f"{name}-save") + _records(runs, f"{name}-resume")
        for field in ("loss", "grad_norm"):
            assert _field(split, field) == _field(straight, field), f"{name}: {field}"


@pytest.mark.slow
def test_fsdp_saves_its_own_shards_without_gathering(runs):
    """ZeRO-3 is chosen where the whole model does not fit one GPU: its checkpoint holds each dp rank's chunk of a
    tensor nothing else splits (four pieces at dp 4), not one whole gathered copy, and resumes exactly (above)."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(runs / "padded-dp4-zero3-to-dp2-zero2" / "step_000005")).read_metadata()
    for key, rows in (("model.tok_embeddings.weight", 65), ("optim.tok_embeddings.weight.exp_avg", 65),
                      ("model.norm.weight", 16)):  # torch.chunk's pieces of 259 and 64 rows over 4 ranks
        chunks = meta.state_dict_metadata[key].chunks
        assert sorted(c.offsets[0] for c in chunks) == [0, rows, 2 * rows, 3 * rows], (key, chunks)


def test_single_process_resume_is_bitwise(tmp_path, references):
    first = train(_cfg("tiny", L(), checkpoint_dir=str(tmp_path), stop_after=STOP)).records
    second = train(_cfg("tiny", L(), checkpoint_dir=str(tmp_path), resume=True)).records
    assert [r["step"] for r in first + second] == list(range(1, STEPS + 1))
    assert _field(first + second, "loss") == _field(references["tiny"], "loss")
    assert _field(first + second, "grad_norm") == _field(references["tiny"], "grad_norm")


def test_dropping_the_optimizer_state_is_caught(tmp_path, references, monkeypatch):
    """The control: the same resume with fresh AdamW moments misses the reference by >> rtol 1e-5."""
    train(_cfg("tiny", L(), checkpoint_dir=str(tmp_path), stop_after=STOP))
    fresh = lambda p, moments, step, opt: {"step": step.clone(), **{m: torch.zeros_like(p) for m in moments}}  # noqa: E731
    monkeypatch.setattr(ckpt_state, "_adam_state", fresh)
    resumed = train(_cfg("tiny", L(), checkpoint_dir=str(tmp_path), resume=True)).records
    ref = _field(references["tiny"], "loss")[STOP:]
    worst = max(abs(a - b) / b for a, b in zip(_field(resumed, "loss"), ref))
    assert worst > 100 * 1e-5


@pytest.mark.slow
def test_tp4_checkpoint_of_a_padded_vocabulary_exports_the_single_process_model(runs, tmp_path):
    from safetensors.torch import load_file

    from shardwise.checkpoint.export import export_safetensors

    train(_cfg("padded", L(), checkpoint_dir=str(tmp_path / "ref"), stop_after=STOP))
    export_safetensors(tmp_path / "ref", tmp_path / "ref.safetensors")
    export_safetensors(runs / "padded-tp4-to-2x2x1-zero1" / "step_000005", tmp_path / "tp4.safetensors")
    ref, tp4 = load_file(tmp_path / "ref.safetensors"), load_file(tmp_path / "tp4.safetensors")
    assert ref.keys() == tp4.keys() and ref["tok_embeddings.weight"].shape == (259, 64)
    for name, t in ref.items():
        assert tp4[name].shape == t.shape, name
        assert (tp4[name] - t).abs().max() <= 1e-5, name


@pytest.mark.slow
def test_expert_parallel_checkpoint_exports_the_single_process_model(runs, tmp_path):
    """ep 2 x edp 2 with ZeRO-1 over the experts' replicas wrote the experts in pieces: the single file and
    the Mixtral folder hold the single-process model's tensors at that step."""
    from safetensors.torch import load_file

    from shardwise.checkpoint.export import export_safetensors
    from shardwise.hf.save import export_hf

    train(_cfg("tiny-moe", L(), checkpoint_dir=str(tmp_path / "ref"), stop_after=STOP))
    ep = runs / "moe-dp4-ep2-zero1-to-1x1x1" / "step_000005"
    for kind, export in (("file", lambda c, o: export_safetensors(c, o / "model.safetensors")), ("hf", export_hf)):
        export(tmp_path / "ref", tmp_path / f"ref-{kind}")
        export(ep, tmp_path / f"ep-{kind}")
    for kind in ("file", "hf"):
        ref = {k: v for f in sorted((tmp_path / f"ref-{kind}").glob("*.safetensors")) for k, v in load_file(f).items()}
        got = {k: v for f in sorted((tmp_path / f"ep-{kind}").glob("*.safetensors")) for k, v in load_file(f).items()}
        assert ref.keys() == got.keys(), kind
        if kind == "file":
            assert got["layers.0.feed_forward.experts.w1"].shape == (4, 64, 64)
        for name, t in ref.items():
            assert (got[name] - t).abs().max() <= 1e-5, (kind, name)


@pytest.mark.parametrize("fused", [True, False])
def test_a_restored_adamw_step_is_where_torch_would_put_it(fused):
    """Optimizer.load_state_dict puts a fused (or capturable) AdamW's step count on the parameter's device, where the
    fused CUDA kernel reads it; the checkpoint's own restore (state._adam_state) does the same. The meta device stands
    in for a GPU: a CPU step beside GPU parameters was a host pointer inside the kernel after every --resume."""
    from torch import nn

    from shardwise.checkpoint.state import _adam_state

    p = nn.Parameter(torch.empty(4, 4, device="meta"))
    opt = torch.optim.AdamW([p], fused=fused)
    moments = {m: torch.zeros(4, 4, device="meta") for m in ("exp_avg", "exp_avg_sq")}
    ours = _adam_state(p, moments, torch.tensor(3.0), opt)
    opt.load_state_dict({"state": {0: {"step": torch.tensor(3.0), **moments}},
                         "param_groups": opt.state_dict()["param_groups"]})
    theirs = opt.state[p]["step"]
    assert (ours["step"].device, ours["step"].dtype) == (theirs.device, theirs.dtype)
    assert ours["step"].device.type == ("meta" if fused else "cpu")
