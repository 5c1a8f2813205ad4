"""Tiny Hugging Face models, a tokenizer and corpora, made here with transformers and tokenizers (no download)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch

VOCAB = 384  # the tokenizer's; the models' vocabularies are at least this


def shipped_texts() -> list[Path]:
    return sorted(Path(str(p)) for p in resources.files("shardwise").joinpath("data").iterdir() if p.name.endswith(".txt"))


def make_tokenizer(folder: Path) -> Path:
    """A byte-level BPE tokenizer (GPT-2's scheme) trained on the shipped corpus, with <|endoftext|> = id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(p) for p in shipped_texts()], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def make_model(folder: Path, family: str, *, vocab: int = VOCAB, layers: int = 4, shard_size: str | None = None,
               tokenizer: bool = True, seed: int = 0, dtype: torch.dtype = torch.float32, rope_scaling: dict | None = None,
               tie: bool = True):
    """A random tiny Llama (GQA, untied) or GPT-2 (biases; tied unless `tie` is False) saved as a Hugging Face folder."""
    import transformers

    torch.manual_seed(seed)
    if family == "llama":
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                                       num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=64,
                                       bos_token_id=0, eos_token_id=0, rms_norm_eps=1e-5,
                                       **({"rope_scaling": rope_scaling} if rope_scaling else {}))
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GPT2Config(n_embd=64, n_layer=layers, n_head=4, vocab_size=vocab, n_positions=64,
                                      bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      tie_word_embeddings=tie)
        model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():  # transformers starts norms at 1 and biases at 0: make every tensor matter
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.to(dtype).eval().save_pretrained(folder, **({"max_shard_size": shard_size} if shard_size else {}))
    if tokenizer:
        make_tokenizer(folder)
    return model


def hf_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


def write_corpus(folder: Path) -> dict[str, Path]:
    """The shipped corpus as text files, JSON lines (one paragraph a line) and Parquet (if pyarrow is here)."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = [p.read_text(encoding="utf-8") for p in shipped_texts()]
    (folder / "text").mkdir(exist_ok=True)
    for i, t in enumerate(texts):
        (folder / "text" / f"{i}.txt").write_text(t, encoding="utf-8")
    paragraphs = [p for t in texts for p in t.split("\n\n") if p.strip()]
    with open(folder / "paragraphs.jsonl", "w", encoding="utf-8") as f:
        for p in paragraphs:
            f.write(json.dumps({"id": len(p), "body": p}) + "\n")
    out = {"text": folder / "text", "jsonl": folder / "paragraphs.jsonl"}
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return out
    pq.write_table(pa.table({"text": paragraphs[::-1]}), folder / "paragraphs.parquet", row_group_size=64)
    out["parquet"] = folder / "paragraphs.parquet"
    return out
