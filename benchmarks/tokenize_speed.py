"""Tokenizing a corpus: shardwise's pipeline against `tokenizers`' own batch encode on the same files.

    python benchmarks/tokenize_speed.py [--mb 100] [--files 100] [--repeats 3] [--json]

The corpus: `--files` text files of --mb MB in all, paragraphs of the shipped corpus in a seeded random order
(so no two files are alike). The tokenizer: byte-level BPE (GPT-2's scheme, 4,096 tokens) trained here on the
shipped corpus. Contenders, interleaved, `repeats` times each, medians:
  shardwise            `corpus.token_file.prepare` into an empty cache: hash the files, read them, encode,
                       append end-of-text tokens, write the uint16 token file (what `train --data` does once)
  encode_batch         Tokenizer.encode_batch(texts) over the same files, 16 files a call, ids taken as lists
  encode_batch_fast    the same with encode_batch_fast (no character offsets), which shardwise itself uses
Throughput in MB of text per second; ratio = shardwise / encode_batch (goal >= 0.8).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from importlib import resources
from pathlib import Path


def make_corpus(folder: Path, total_mb: float, files: int) -> list[Path]:
    texts = [p.read_text(encoding="utf-8") for p in resources.files("shardwise").joinpath("data").iterdir()
             if p.name.endswith(".txt")]
    paragraphs = [p for t in texts for p in t.split("\n\n") if p.strip()]
    rng = random.Random(0)
    per_file = int(total_mb * 1e6 / files)
    out = []
    for i in range(files):
        chunks, size = [], 0
        while size < per_file:
            p = rng.choice(paragraphs)
            chunks.append(p)
            size += len(p.encode()) + 2
        path = folder / f"{i:04d}.txt"
        path.write_text("\n\n".join(chunks), encoding="utf-8")
        out.append(path)
    return out


def make_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    files = [str(p) for p in resources.files("shardwise").joinpath("data").iterdir() if p.name.endswith(".txt")]
    tok.train(files, trainers.BpeTrainer(vocab_size=4096, special_tokens=["<|endoftext|>"], show_progress=False,
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def _baseline(files: list[Path], tok_file: Path, fast: bool) -> int:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_file))
    encode = tok.encode_batch_fast if fast else tok.encode_batch
    n = 0
    for i in range(0, len(files), 16):
        texts = [p.read_text(encoding="utf-8") for p in files[i:i + 16]]
        n += sum(len(e.ids) for e in encode(texts, add_special_tokens=False))
    return n


def _shardwise(files: list[Path], tok_file: Path, cache: Path) -> int:
    from shardwise.corpus.token_file import prepare
    from shardwise.corpus.tokenizer import load_tokenizer

    shutil.rmtree(cache, ignore_errors=True)
    return prepare(files, load_tokenizer(tok_file), cache=str(cache)).tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "data").mkdir()
        files = make_corpus(root / "data", args.mb, args.files)
        mb = sum(p.stat().st_size for p in files) / 1e6
        tok_file = make_tokenizer(root)
        contenders = {"shardwise": lambda: _shardwise(files, tok_file, root / "cache"),
                      "encode_batch": lambda: _baseline(files, tok_file, fast=False),
                      "encode_batch_fast": lambda: _baseline(files, tok_file, fast=True)}
        times = {k: [] for k in contenders}
        tokens = {}
        for _ in range(args.repeats):
            for name, fn in contenders.items():
                start = time.perf_counter()
                tokens[name] = fn()
                times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"mb": mb, "files": len(files), "repeats": args.repeats, "tokens": tokens,
              "mb_per_s": {k: mb / t for k, t in med.items()}, "seconds": med,
              "ratio_vs_encode_batch": med["encode_batch"] / med["shardwise"],
              "ratio_vs_encode_batch_fast": med["encode_batch_fast"] / med["shardwise"]}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{mb:.1f} MB in {len(files)} files, {tokens['shardwise']:,} tokens (with one end-of-text per file)")
    for name in contenders:
        print(f"  {name:18s} {med[name]:7.2f} s  {mb / med[name]:6.2f} MB/s")
    print(f"shardwise / encode_batch throughput: {result['ratio_vs_encode_batch']:.2f} (goal >= 0.8); "
          f"/ encode_batch_fast: {result['ratio_vs_encode_batch_fast']:.2f}")


if __name__ == "__main__":
    main()
