"""Tokenizers: bytes (the built-in corpus's) or a Hugging Face tokenizer.json read with `tokenizers`.

Documents are encoded without special tokens and each is followed by the end-of-text token, as nanoGPT
and Megatron prepare pretraining data. The end-of-text token comes from tokenizer_config.json's
eos_token, else the model folder's config.json eos_token_id, else the first known end-of-text token in
the vocabulary. The byte tokenizer ends documents with byte 0 (NUL): data holding a NUL is refused (token_file).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from shardwise.errors import UsageError
from shardwise.paths import refuse_special

BYTES = "bytes"
FILE = "tokenizer.json"
KNOWN_EOS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")


@dataclass(frozen=True)
class TokenizerSpec:
    """What the data pipeline needs to know of a tokenizer (picklable; the tokenizer itself is loaded where used)."""

    path: str  # "bytes" or a tokenizer.json
    vocab_size: int  # largest id + 1
    eos_id: int
    sha256: str

    @property
    def dtype(self) -> str:
        return "uint16" if self.vocab_size <= 2**16 else "uint32"


BYTE_TOKENIZER = TokenizerSpec(BYTES, 256, 0, "bytes-v1")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _eos(tok, file: Path) -> int:
    token = _read_json(file.parent / "tokenizer_config.json").get("eos_token")
    token = token.get("content") if isinstance(token, dict) else token
    if isinstance(token, str) and tok.token_to_id(token) is not None:
        return tok.token_to_id(token)
    eos = _read_json(file.parent / "config.json").get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if isinstance(eos, int) and not isinstance(eos, bool) and tok.id_to_token(eos) is not None:
        return eos
    for token in KNOWN_EOS:
        if tok.token_to_id(token) is not None:
            return tok.token_to_id(token)
    raise UsageError(f"{file}: no end-of-text token (tokenizer_config.json eos_token, config.json eos_token_id, or one of "
                     f"{', '.join(KNOWN_EOS)}) — documents are joined with it; add one to the tokenizer")


def find_tokenizer(path) -> Path:
    """A tokenizer.json given directly or inside a folder."""
    p = Path(path)
    file = p / FILE if p.is_dir() else p
    refuse_special(file, f"--tokenizer {path}" + (f": its {FILE}" if p.is_dir() else ""))  # a pipe would block
    if not file.is_file():
        raise UsageError(f"--tokenizer {path}: no {FILE} there — give a tokenizer.json or a model folder holding one")
    return file


def load_tokenizer(path) -> TokenizerSpec:
    """Read and check a Hugging Face tokenizer.json (file or folder)."""
    file = find_tokenizer(path)
    tok = _open(str(file))
    vocab = tok.get_vocab(with_added_tokens=True)
    size = max(vocab.values(), default=-1) + 1
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    return TokenizerSpec(str(file.resolve()), size, _eos(tok, file), digest)


def _open(file: str):
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - a runtime dependency
        raise UsageError("reading a tokenizer.json needs the tokenizers package — pip install tokenizers") from None
    try:
        return Tokenizer.from_file(file)
    except Exception as exc:  # tokenizers raises a bare Exception for malformed files
        raise UsageError(f"{file}: not a tokenizer.json that `tokenizers` can read ({str(exc).splitlines()[0][:120]}) "
                         f"— give a Hugging Face model's tokenizer.json with --tokenizer, or none to train on bytes") from None


def encoder(spec: TokenizerSpec) -> Callable[[list[str]], list[np.ndarray]]:
    """texts -> their token ids (no special tokens), one array per text."""
    if spec.path == BYTES:
        return lambda texts: [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
    tok = _open(spec.path)
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no character offsets: we only need ids
    dtype = np.dtype(spec.dtype)
    return lambda texts: [np.array(e.ids, dtype=dtype) for e in encode(texts, add_special_tokens=False)]


def check_vocab(spec: TokenizerSpec, model_vocab: int, model_name: str) -> None:
    if spec.vocab_size > model_vocab:
        what = "the byte tokenizer" if spec.path == BYTES else spec.path
        raise UsageError(f"{what}: vocabulary of {spec.vocab_size:,} tokens exceeds the {model_vocab:,} of {model_name} — "
                         f"use the model's own tokenizer or a model with a larger vocab_size")
