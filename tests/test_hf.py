"""Hugging Face folders in and out, in one process: the mapping reproduces transformers' logits, an exported
checkpoint loads in transformers with the same logits, and a bad folder is one line and exit 2.
(Every layout: tests/test_hf_layouts.py.)"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hf_models import hf_logits, make_model
from shardwise.cli import main
from shardwise.hf.load import inspect_folder, loader
from shardwise.model import Transformer
from shardwise.parallel import parallelize
from shardwise.specs import Layout, load_model

transformers = pytest.importorskip("transformers")
ATOL = 1e-5


def _load(folder) -> Transformer:
    spec = load_model(str(folder))
    return parallelize(Transformer(spec, device="meta"), None, Layout(), "cpu", weights=loader(inspect_folder(folder, spec))).model


def _tokens(vocab=384):
    return torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    make_model(root / "llama", "llama", shard_size="60KB", tokenizer=False)  # several shards and an index
    make_model(root / "gpt2", "gpt2", vocab=385, tokenizer=False)  # one model.safetensors
    make_model(root / "llama-bf16", "llama", tokenizer=False, dtype=torch.bfloat16)  # read into new fp32 tensors
    make_model(root / "gpt2-untied", "gpt2", tokenizer=False, tie=False)  # its own lm_head (helper-228: refused, and
    return root  # an untied head trained from random was left out of the export)


@pytest.mark.parametrize("family", ["llama", "gpt2", "llama-bf16", "gpt2-untied"])
def test_loaded_model_has_transformers_logits(folders, family):
    folder = folders / family
    model = _load(folder).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(_tokens()), hf_logits(folder, _tokens()), rtol=0, atol=ATOL)


# Llama 3.1's RoPE scaling at a context short enough for a 64-position model to cross every band of it: the highest
# frequency blended, the others slowed (model.llama3_inv_freq).
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}


def test_llama3_rope_scaling_loads_with_transformers_logits(tmp_path):
    make_model(tmp_path / "l31", "llama", tokenizer=False, rope_scaling=LLAMA3_ROPE)
    spec = load_model(str(tmp_path / "l31"))
    assert dict(spec.rope_scaling)["rope_type"] == "llama3"
    with torch.no_grad():
        ours = _load(tmp_path / "l31").eval()(_tokens())
        torch.testing.assert_close(ours, hf_logits(tmp_path / "l31", _tokens()), rtol=0, atol=ATOL)
        plain = dict(json.loads((tmp_path / "l31" / "config.json").read_text()))
        plain.pop("rope_scaling", None), plain.pop("rope_parameters", None)
        (tmp_path / "l31" / "config.json").write_text(json.dumps(plain))
        assert not torch.allclose(_load(tmp_path / "l31").eval()(_tokens()), ours, atol=1e-3)  # the scaling matters here


def test_gpt2_names_without_the_transformer_prefix_load_too(folders, tmp_path):
    """GPT-2 checkpoints on the Hub name tensors 'h.0.attn.c_attn.weight' (no 'transformer.'), as the original release did."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(folders / "gpt2", tmp_path / "hub")
    tensors = load_file(tmp_path / "hub" / "model.safetensors")
    save_file({k.removeprefix("transformer."): v for k, v in tensors.items()}, tmp_path / "hub" / "model.safetensors",
              metadata={"format": "pt"})
    with torch.no_grad():
        torch.testing.assert_close(_load(tmp_path / "hub")(_tokens()), hf_logits(folders / "gpt2", _tokens()), rtol=0, atol=ATOL)


def _mapped_from(t: torch.Tensor) -> str:
    """The file whose mapping holds t's first element ("[heap]", "" or the like for a copy)."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= t.data_ptr() < hi:
                return fields[5] if len(fields) > 5 else ""
    return ""


def test_one_rank_keeps_gpt2_weights_mapped_and_replicas_get_contiguous_copies(folders):
    """With no data-parallel replica every GPT-2 weight stays a copy-on-write view of the mapped file (the load
    reads nothing, as from_pretrained): Conv1D weights seen transposed (x @ W, as Conv1D computes it), q, k and v
    side by side in c_attn. A parameter that DDP, ZeRO or FSDP will broadcast or shard is contiguous at the start
    of its own storage (gloo sends from there; FSDP refuses strided parameters). Same values either way, and
    the same AdamW step: make_optimizer makes the c_attn columns dense (torch's fused AdamW ignores strides)."""
    from shardwise.parallel import Sharded, make_optimizer

    folder = folders / "gpt2"
    spec = load_model(str(folder))
    views = _load(folder)
    attn, ffn = views.layers["0"].attention, views.layers["0"].feed_forward
    for w in (attn.wq.weight, attn.wk.weight, attn.wo.weight, ffn.w1.weight, ffn.w2.weight):
        assert w.stride()[0] == 1, w.stride()  # (in, out) seen as (out, in): no transpose
    for w in (attn.wv.weight, attn.wo.weight, ffn.w1.weight, ffn.w2.weight, attn.wk.bias, views.tok_embeddings.weight):
        assert _mapped_from(w).endswith("model.safetensors"), _mapped_from(w)
    assert attn.wk.weight.data_ptr() == attn.wq.weight.data_ptr() + 4 * spec.q_dim  # columns of one c_attn
    copies = Transformer(spec, device="meta")
    loader(inspect_folder(folder, spec))(Sharded(copies, copies), "cpu", replicated=True)
    mapped = dict(views.named_parameters())
    for name, p in copies.named_parameters():
        assert p.is_contiguous() and p.storage_offset() == 0, name
        assert torch.equal(p, mapped[name]), name
    steps = [make_optimizer([{"params": list(m.parameters())}], 0, None, lr=1e-2) for m in (views, copies)]
    assert attn.wk.weight.t().is_contiguous()  # dense now, in the same order
    for model, opt in zip((views, copies), steps):
        for name, p in model.named_parameters():  # laid out like the parameter, as autograd accumulates it
            p.grad = torch.empty_like(p).copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
        opt.step()
    for name, p in copies.named_parameters():
        assert torch.equal(p, mapped[name]), name


@pytest.mark.parametrize("family", ["llama", "gpt2", "llama-bf16", "gpt2-untied"])
def test_train_export_reload_in_transformers(folders, tmp_path, family):
    """train --model DIR (1 process, 3 steps) -> checkpoint export --format hf -> transformers: the trained logits.
    From a bf16 folder (its config.json says "dtype": "bfloat16", as transformers >= 4.56 writes it) the export still
    loads as the fp32 weights it holds, with no dtype asked: an outside check found them rounded to bf16."""
    from shardwise.checkpoint.export import load_tensors

    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    assert main(["train", "--model", str(folders / family), "--steps", "3", "--global-batch", "2", "--seq-len", "16",
                 "--checkpoint-dir", str(ckpt), "--no-progress", "--lr", "1e-2"]) == 0
    assert main(["checkpoint", "export", str(ckpt), "--format", "hf", "--to", str(out), "--max-shard-size", "50KB"]) == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    trained, _ = load_tensors(ckpt)
    spec = load_model(str(out))
    ours = Transformer(spec)
    ours.load_state_dict(trained, strict=False)
    start = _load(folders / family)
    with torch.no_grad():
        assert (ours(_tokens()) - start(_tokens())).abs().max() > 1e-3  # training moved the weights
        torch.testing.assert_close(hf_logits(out, _tokens()), ours(_tokens()), rtol=0, atol=ATOL)
    import transformers

    assert transformers.AutoModelForCausalLM.from_pretrained(out).dtype == torch.float32


def test_random_init_ignores_the_weights(folders):
    from shardwise.commands.train import config_from
    from shardwise.cli import build_parser

    argv = ["train", "--model", str(folders / "llama"), "--init", "random"]
    cfg = config_from(build_parser(argv).parse_args(argv))
    assert cfg.weights is None and cfg.hf_config["model_type"] == "llama"
    argv = ["train", "--model", str(folders / "llama")]
    assert config_from(build_parser(argv).parse_args(argv)).weights is not None


def _damage(kind, folder):
    if kind == "no-config":
        (folder / "config.json").unlink()
        return str(folder), "no config.json"
    if kind == "shape":
        cfg = json.loads((folder / "config.json").read_text())
        cfg["intermediate_size"] = 128
        (folder / "config.json").write_text(json.dumps(cfg))
        return ".safetensors: 'model.layers.0.mlp.gate_proj.weight'", "has shape (96, 64), but config.json implies (128, 64)"
    if kind == "layers":
        cfg = json.loads((folder / "config.json").read_text())
        cfg["num_hidden_layers"] = 5
        (folder / "config.json").write_text(json.dumps(cfg))
        return "model.layers.4", "does not match the weights"
    shards = sorted(folder.glob("model-*.safetensors"))
    if kind == "missing-shard":
        shards[1].unlink()
        return f"{shards[1].name}: missing", "download it again"
    if kind == "truncated":
        shards[2].write_bytes(shards[2].read_bytes()[:-100])
        return f"{shards[2].name}: truncated", "download it again"
    if kind == "rope-scaling":
        cfg = json.loads((folder / "config.json").read_text())
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}  # Llama 3.1's (llama3) runs: test above
        (folder / "config.json").write_text(json.dumps(cfg))
        # named by the file that holds the key, not by the folder's name (the model's)
        return f"{folder / 'config.json'}: llama uses linear RoPE scaling", "which shardwise's runtime does not implement"
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["no-config", "shape", "layers", "missing-shard", "truncated", "rope-scaling"])
def test_bad_folder_is_one_line_naming_the_file(folders, tmp_path, capsys, kind):
    folder = tmp_path / "llama"
    shutil.copytree(folders / "llama", folder)
    assert len(list(folder.glob("model-*.safetensors"))) > 3
    where, what = _damage(kind, folder)
    assert main(["train", "--model", str(folder), "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and where in err and what in err, err


@pytest.mark.parametrize("given", ["folder", "config.json"])
@pytest.mark.parametrize("command", [["train", "--steps", "1", "--global-batch", "4", "--no-progress"],
                                     ["calibrate", "--world", "2"], ["validate", "--world", "2", "--cluster", "dgx-h200"]],
                         ids=["train", "calibrate", "validate"])
def test_an_unsupported_rope_scaling_names_the_config_file(tmp_path, capsys, given, command, monkeypatch):
    """`train --model FOLDER` (or its config.json) whose config asks for YaRN: the refusal names the config.json that
    holds rope_scaling, not only the folder's name (the model's), whichever check meets it first; calibrate and
    validate too (they named the model alone)."""
    from shardwise.specs import load_model

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "mymodel"
    folder.mkdir()
    cfg = load_model("tiny").to_hf_config() | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                                "original_max_position_embeddings": 64}}
    (folder / "config.json").write_text(json.dumps(cfg))
    model = folder if given == "folder" else folder / "config.json"
    assert main([command[0], "--model", str(model), *command[1:], "--seq-len", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{folder / 'config.json'}: mymodel uses yarn RoPE scaling" in err, err


def test_init_pretrained_needs_a_folder(capsys):
    assert main(["train", "--model", "tiny", "--init", "pretrained"]) == 2
    assert "needs a Hugging Face model folder" in capsys.readouterr().err


def test_a_folder_of_blocks_the_runtime_lacks_says_that_first(tmp_path, capsys):
    """A GPT-NeoX folder whose activation the llama check would refuse first: the blocks are what no --init fixes."""
    (tmp_path / "neox").mkdir()
    (tmp_path / "neox" / "config.json").write_text(json.dumps({
        "model_type": "gpt_neox", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 256, "vocab_size": 256, "max_position_embeddings": 128, "hidden_act": "gelu"}))
    (tmp_path / "neox" / "model.safetensors").write_bytes(b"")
    for init in ([], ["--init", "random"]):
        assert main(["train", "--model", str(tmp_path / "neox"), "--steps", "1", *init]) == 2
        err = capsys.readouterr().err
        assert "uses gpt_neox's blocks, which shardwise's runtime does not implement" in err and "hidden_act" not in err


def test_blocks_the_runtime_lacks_are_said_before_a_sequence_limit_that_would_not_help(tmp_path, capsys):
    # A Mistral config with a 16-token window at --seq-len 32 was told "train at --seq-len 16 or less", which then
    # refused its blocks (an outside check): the blocks come first, since no flag changes them.
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "mistral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128,
        "sliding_window": 16}))
    assert main(["train", "--model", str(tmp_path / "config.json"), "--seq-len", "32", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "uses mistral's blocks" in err and "sliding window" not in err


@pytest.mark.parametrize("weights", ["pytorch_model.bin", "model.pt", "consolidated.safetensors"])
def test_a_folder_of_weights_it_cannot_read_is_refused_not_trained_from_random(folders, tmp_path, capsys, weights):
    # a folder whose only weights are another format trained from a random start, exit 0, without a word
    folder = tmp_path / "llama"
    folder.mkdir()
    shutil.copy(folders / "llama" / "config.json", folder / "config.json")
    (folder / weights).write_bytes(b"weights")
    assert main(["train", "--model", str(folder), "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"weights in {weights}" in err and "--init random" in err, err


def test_a_folder_without_weights_says_it_starts_from_random(folders, tmp_path, capsys):
    folder = tmp_path / "llama"
    folder.mkdir()
    shutil.copy(folders / "llama" / "config.json", folder / "config.json")
    (folder / "training_args.bin").write_bytes(b"a Trainer's settings, not weights")
    assert main(["train", "--model", str(folder), "--steps", "1", "--global-batch", "2", "--seq-len", "8",
                 "--no-progress"]) == 0
    assert "holds no weights: training starts from a seeded initialisation" in capsys.readouterr().err


def test_export_refuses_a_folder_in_use(folders, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert main(["train", "--model", "tiny", "--steps", "1", "--global-batch", "2", "--seq-len", "8",
                 "--checkpoint-dir", str(ckpt), "--no-progress"]) == 0
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert main(["checkpoint", "export", str(ckpt), "--format", "hf", "--to", str(tmp_path / "out")]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert main(["checkpoint", "export", str(ckpt), "--format", "hf", "--to", str(tmp_path / "new"),
                 "--max-shard-size", "lots"]) == 2
    assert "--max-shard-size 'lots'" in capsys.readouterr().err


def test_a_preset_exports_to_a_folder_transformers_loads(tmp_path):
    """No source folder: the config is written from the spec (tiny: Llama with GQA)."""
    from shardwise.checkpoint.export import load_tensors

    ckpt = tmp_path / "ckpt"
    assert main(["train", "--model", "tiny", "--steps", "1", "--global-batch", "2", "--seq-len", "8",
                 "--checkpoint-dir", str(ckpt), "--no-progress"]) == 0
    assert main(["checkpoint", "export", str(ckpt), "--format", "hf", "--to", str(tmp_path / "out")]) == 0
    ours = Transformer(load_model("tiny"))
    ours.load_state_dict(load_tensors(ckpt)[0])
    with torch.no_grad():
        torch.testing.assert_close(hf_logits(tmp_path / "out", _tokens(256)), ours(_tokens(256)), rtol=0, atol=ATOL)


def test_weights_that_hold_nan_are_named_not_the_learning_rate(tmp_path, capsys):
    """A folder whose weights hold NaN: step 1's loss comes before any update, so the stop names the weights the run
    started from, not a lower --lr (which it had advised: the hint for a run that diverges later). A run that
    diverges later still gets that hint (tests/test_train_cli.py)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "nan"
    make_model(folder, "llama", tokenizer=False)
    weights = load_file(folder / "model.safetensors")
    name = next(k for k in weights if k.endswith("mlp.down_proj.weight"))
    weights[name][0, 0] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()  # transformers' own progress lines, writing the folder
    assert main(["train", "--model", str(folder), "--steps", "2", "--global-batch", "2", "--seq-len", "8",
                 "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training stopped at step 1, before any update" in err[0], err
    assert f"--model {folder}'s" in err[0] and "not the learning rate" in err[0] and "--lr" not in err[0]


def test_a_folder_with_both_a_single_file_and_an_index_reads_the_single_file_as_transformers_does(tmp_path):
    """model.safetensors beside a model.safetensors.index.json (a folder saved twice): transformers' from_pretrained
    reads model.safetensors first; so does shardwise, so both load the same weights (it read the index's shards,
    here a stale index naming a shard no longer there, which it refused)."""
    folder = tmp_path / "both"
    make_model(folder, "llama", tokenizer=False)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    with torch.no_grad():
        torch.testing.assert_close(_load(folder).eval()(_tokens()), hf_logits(folder, _tokens()), rtol=0, atol=ATOL)
