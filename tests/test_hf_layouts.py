"""Real weights and real data under every kind of layout (one spawned world of 4, CPU, gloo, fp32).

For a tiny Llama (GQA, untied, sharded safetensors) and a tiny GPT-2 (tied, fused c_attn, a vocabulary tp
pads) made here with transformers, and a corpus tokenized with a BPE tokenizer trained here:
- loaded under dp·tp·pp·cp (ZeRO 1/3, sequence parallelism, GPipe, interleaved 1F1B, ring attention), the logits equal
  transformers' (atol 1e-5): each rank read only its slices (whole fp32 tensors stay mapped views, slices
  and transposed or fused tensors are copied; both kinds are broadcast by ZeRO-1 and saved by DCP here);
- 4 steps on the tokenized corpus, with validation, give the single-process losses, gradient norms and
  validation losses (rtol 1e-5);
- the checkpoint, exported with `--format hf`, loads in transformers with the trained model's logits;
- a run stopped after step 2 under dp2·tp2 and resumed under tp2·pp2 continues with the same batches:
  all 4 steps equal the single-process run.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from hf_models import hf_logits, make_model, write_corpus
from shardwise.corpus.token_file import prepare
from shardwise.corpus.tokenizer import load_tokenizer
from shardwise.hf.load import inspect_folder, read_config
from shardwise.launch import spawn_ranks
from shardwise.parallel import build_mesh
from shardwise.specs import Layout, load_model, validate_layout
from shardwise.train import TrainConfig, build_runtime, train

transformers = pytest.importorskip("transformers")
STEPS, B, S = 4, 8, 16
TOKENS = torch.randint(0, 384, (2, S), generator=torch.Generator().manual_seed(7))


def L(dp=1, tp=1, pp=1, mb=None, **kw) -> Layout:
    return Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb or (B // dp if pp == 1 else 2), **kw)


# (key, model, layout): trained 4 steps, checkpoint at the end
LAYOUTS = [
    ("llama-tp2-pp2-interleaved", "llama", L(tp=2, pp=2, vpp=2, schedule="interleaved-1f1b")),
    ("gpt2-dp2-pp2-zero1-gpipe-tied", "gpt2", L(dp=2, pp=2, zero=1, schedule="gpipe")),
    ("gpt2-dp2-tp2-zero3-padded", "gpt2", L(dp=2, tp=2, zero=3)),
    ("llama-tp2-cp2-ring", "llama", L(tp=2, cp=2)),
]
# stopped after step 2 under the first layout, resumed to step 4 under the second
RESUME = ("llama", L(dp=2, tp=2, zero=1, sequence_parallel=True, mb=2), L(tp=2, pp=2, sequence_parallel=True))


def _gather_logits(rt, tokens):
    """The full logits on the rank holding the last stage with dp = tp = cp = 0 (None elsewhere): forward through
    the stages (point to point) on this cp rank's zig-zag chunks, then the sequence gathered over cp and the
    vocabulary shards over tp."""
    from shardwise.parallel import coordinates, group, shard_sequence, size
    from shardwise.parallel.context_parallel import zigzag_positions

    mesh, lay = rt.mesh, rt.cfg.layout
    c, pp = coordinates(mesh), size(mesh, "pp")
    stages = pp * lay.vpp
    pp_group = group(mesh, "pp")
    local = shard_sequence(tokens, lay.cp, c["cp"]) if lay.cp > 1 else tokens
    seq = local.shape[1] // lay.tp if lay.sequence_parallel and lay.tp > 1 else local.shape[1]
    out = None
    with torch.no_grad():
        for stage in range(c["pp"], stages, pp):
            x = local
            if stage > 0:
                x = torch.empty(tokens.shape[0], seq, rt.cfg.spec.hidden)
                dist.recv(x, src=dist.get_global_rank(pp_group, (stage - 1) % pp), group=pp_group)
            out = rt.models[stage // pp](x)
            if stage < stages - 1:
                dist.send(out.contiguous(), dst=dist.get_global_rank(pp_group, (stage + 1) % pp), group=pp_group)
        if c["pp"] != (stages - 1) % pp:
            return None
        if lay.cp > 1:
            parts = [torch.empty_like(out) for _ in range(lay.cp)]
            dist.all_gather(parts, out.contiguous(), group=group(mesh, "cp"))
            full = out.new_empty(tokens.shape + out.shape[-1:])
            for r, part in enumerate(parts):
                full[:, zigzag_positions(tokens.shape[1], lay.cp, r)] = part
            out = full
        if lay.tp > 1:
            parts = [torch.empty_like(out) for _ in range(lay.tp)]
            dist.all_gather(parts, out.contiguous(), group=group(mesh, "tp"))
            out = torch.cat(parts, dim=-1)[..., : rt.cfg.spec.vocab_size]
    return out if c["dp"] == 0 and c["tp"] == 0 and c.get("cp", 0) == 0 else None


def _worker(rank, world, jobs, out_dir):
    for key, cfg in jobs:
        lay = cfg.layout
        mesh = build_mesh(lay.pp, lay.dp, lay.tp, cp=lay.cp, backend="gloo", timeout_s=60)
        loaded = _gather_logits(build_runtime(cfg, mesh), TOKENS) if not cfg.resume else None
        result = train(cfg, mesh)
        trained = _gather_logits(result.runtime, TOKENS)
        if trained is not None:
            torch.save({"loaded": loaded, "trained": trained, "records": result.records}, os.path.join(out_dir, f"{key}.pt"))
        dist.barrier()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_layouts")
    make_model(root / "llama", "llama", shard_size="60KB")
    make_model(root / "gpt2", "gpt2", vocab=385)
    corpus = write_corpus(root / "data")
    tok = load_tokenizer(root / "llama")
    data = prepare([corpus["text"]], tok, cache=str(root / "cache"))
    val = prepare([corpus["jsonl"]], tok, "body", cache=str(root / "cache"))

    def cfg(model, layout, **kw):
        folder = root / model
        spec = load_model(str(folder))
        validate_layout(layout, spec, B)
        return TrainConfig(spec, layout, steps=STEPS, global_batch=B, seq_len=S, seed=3, lr=2e-4, warmup_steps=1,
                           progress=False, weights=inspect_folder(folder, spec), hf_config=read_config(folder),
                           data=data, val_data=val, eval_every=2, eval_batches=2, **kw)

    return root, cfg


@pytest.fixture(scope="module")
def runs(setup):
    root, cfg = setup
    jobs = [(key, cfg(model, lay, checkpoint_dir=str(root / "ckpt" / key))) for key, model, lay in LAYOUTS]
    model, first, second = RESUME
    jobs.append(("resume-save", cfg(model, first, checkpoint_dir=str(root / "ckpt" / "resume"), stop_after=2)))
    jobs.append(("resume-load", cfg(model, second, checkpoint_dir=str(root / "ckpt" / "resume"), resume=True)))
    spawn_ranks(_worker, 4, jobs, str(root))
    return {key: torch.load(root / f"{key}.pt") for key, _ in jobs}


@pytest.fixture(scope="module")
def references(setup):
    _, cfg = setup
    return {model: train(cfg(model, L())).records for model in ("llama", "gpt2")}


def _compare(records, reference, key) -> list[str]:
    failures = []
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), key
    for field in ("loss", "grad_norm", "val_loss"):
        ours = [r[field] for r in records if field in r]
        ref = [r[field] for r in reference if field in r]
        if len(ours) != len(ref) or not torch.allclose(torch.tensor(ours), torch.tensor(ref), rtol=1e-5, atol=0):
            failures.append(f"{key}: {field} {ours} vs single process {ref}")
    return failures


@pytest.mark.slow
def test_loaded_logits_equal_transformers_under_every_layout(setup, runs):
    root, _ = setup
    expected = {m: hf_logits(root / m, TOKENS) for m in ("llama", "gpt2")}
    for key, model in [(k, m) for k, m, _ in LAYOUTS] + [("resume-save", RESUME[0])]:
        torch.testing.assert_close(runs[key]["loaded"], expected[model], rtol=0, atol=1e-5, msg=key)


@pytest.mark.slow
def test_training_on_real_data_matches_one_process(runs, references):
    failures = []
    for key, model, _ in LAYOUTS:
        failures += _compare(runs[key]["records"], references[model], key)
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_resume_under_another_layout_continues_with_the_same_batches(runs, references):
    model = RESUME[0]
    records = runs["resume-save"]["records"] + runs["resume-load"]["records"]
    failures = _compare(records, references[model], "resume dp2·tp2 -> tp2·pp2 (SP)")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_exported_checkpoints_load_in_transformers_with_the_trained_logits(setup, runs):
    from shardwise.hf.save import export_hf

    root, _ = setup
    for key, ckpt in [(k, k) for k, _, _ in LAYOUTS] + [("resume-load", "resume")]:
        out = root / "export" / key
        export_hf(root / "ckpt" / ckpt, out, max_shard_size="100KB")
        trained = runs[key]["trained"]
        start = runs["resume-save" if key == "resume-load" else key]["loaded"]
        assert (trained - start).abs().max() > 1e-4, key  # 4 steps moved the weights
        torch.testing.assert_close(hf_logits(out, TOKENS), trained, rtol=0, atol=1e-5, msg=key)
        assert (out / "tokenizer.json").is_file()
