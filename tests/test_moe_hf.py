"""Mixtral folders in and out: the mapping's Mixtral table (router, one HF tensor per expert stacked into
shardwise's (experts, ...) tensors) loads transformers' logits, each rank reads only its experts under expert
parallelism, exports back; a MoE shape without a table is one line."""

from __future__ import annotations

import pytest
import torch

from hf_models import hf_logits
from shardwise.cli import main
from shardwise.hf.load import inspect_folder, loader
from shardwise.launch import spawn_ranks
from shardwise.model import Transformer
from shardwise.parallel import build_mesh, full_state_dict, parallelize
from shardwise.specs import Layout, load_model

transformers = pytest.importorskip("transformers")
TOKENS = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "mixtral"
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=256,
                                     max_position_embeddings=64, rms_norm_eps=1e-5)
    model = transformers.MixtralForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.eval().save_pretrained(folder)
    return folder


def _load(folder, mesh=None, layout=Layout()):
    spec = load_model(str(folder))
    return parallelize(Transformer(spec, device="meta"), mesh, layout, "cpu", weights=loader(inspect_folder(folder, spec)))


def test_mixtral_folder_loads_with_transformers_logits(mixtral):
    model = _load(mixtral).model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf_logits(mixtral, TOKENS), rtol=0, atol=1e-5)


def _each_rank_reads_its_experts(rank, world, folder, out):
    chunk = _load(folder, build_mesh(1, 2, 1, backend="gloo", timeout_s=60), Layout(dp=2, ep=2, etp=1))
    local = chunk.model.layers["0"].feed_forward.experts.w1
    full = full_state_dict(chunk)
    if rank == 0:
        torch.save({"local_shape": tuple(local.shape), "full": full}, out)


def test_expert_parallel_ranks_read_their_experts(mixtral, tmp_path):
    out = tmp_path / "full.pt"
    spawn_ranks(_each_rank_reads_its_experts, 2, str(mixtral), str(out))
    got = torch.load(out, weights_only=True)
    assert got["local_shape"] == (2, 96, 64)  # 2 of the 4 experts
    whole = {k: v for k, v in _load(mixtral).model.named_parameters()}
    for name, value in got["full"].items():
        torch.testing.assert_close(value, whole[name].detach(), rtol=0, atol=0)


def test_mixtral_trains_exports_and_reloads_in_transformers(mixtral, tmp_path):
    from shardwise.checkpoint.export import load_tensors

    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    assert main(["train", "--model", str(mixtral), "--steps", "2", "--global-batch", "2", "--seq-len", "16",
                 "--checkpoint-dir", str(ckpt), "--no-progress", "--lr", "1e-2"]) == 0
    assert main(["checkpoint", "export", str(ckpt), "--format", "hf", "--to", str(out)]) == 0
    trained, _ = load_tensors(ckpt)
    ours = Transformer(load_model(str(out)))
    ours.load_state_dict(trained, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(hf_logits(out, TOKENS), ours(TOKENS), rtol=0, atol=1e-5)


def test_a_moe_shape_without_a_table_is_one_line(tmp_path, capsys):
    """Shared experts (DeepSeek-style keys on a Llama attention): counted and trained from the seed, not loaded."""
    import json

    from safetensors.torch import save_file

    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "n_shared_experts": 1}))
    save_file({"model.embed_tokens.weight": torch.zeros(256, 64)}, str(folder / "model.safetensors"))
    assert main(["train", "--model", str(folder), "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no Hugging Face mapping" in err and "--init random" in err, err


def test_a_sliding_window_shorter_than_the_sequence_is_refused(tmp_path, capsys):
    """transformers' Mixtral attends through sliding_window; the runtime attends over the whole sequence: at a
    longer --seq-len the logits would not be the model's (0.5 apart at a window of 4 and 16 tokens). One line, before
    any rank starts; at a sequence inside the window it trains and matches transformers."""
    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=256,
                                     max_position_embeddings=64, sliding_window=8)
    folder = tmp_path / "windowed"
    torch.manual_seed(0)
    transformers.MixtralForCausalLM(cfg).eval().save_pretrained(folder)
    capsys.readouterr()  # transformers' own progress bar
    args = ["train", "--model", str(folder), "--steps", "1", "--global-batch", "2", "--no-progress"]
    assert main([*args, "--seq-len", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "sliding window of 8 tokens" in err and "--seq-len 8 or less" in err, err
    model = _load(folder).model.eval()
    tokens = TOKENS[:, :8]
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf_logits(folder, tokens), rtol=1e-4, atol=1e-4)

