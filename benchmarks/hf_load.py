"""Loading a Hugging Face checkpoint: a rank's peak memory at tp 2, and one rank's time against transformers.

    python benchmarks/hf_load.py [--family gpt2|llama] [--repeats 5] [--shard-size 200MB] [--json]

The model is gpt2-size (124M parameters, GPT-2's config) with random weights, built here with transformers
and saved as sharded safetensors (no download). Then:
  memory   two processes (tp 2, gloo, CPU): each builds shardwise's model on the meta device, slices it for
           tp and reads only its slices from the memory-mapped files. Peak RSS during the load (VmHWM after
           resetting it through /proc/self/clear_refs) minus the RSS just before, against the bytes of the
           rank's own shard: the goal is <= 1.2 x shard + a fixed overhead.
  speed    one process, interleaved, `repeats` times each (files in the page cache after the first round):
           shardwise (check the folder + meta model + every parameter: whole fp32 tensors as mapped views,
           GPT-2's transposed Conv1D weights copied) against transformers.AutoModelForCausalLM.from_pretrained(DIR),
           which maps every tensor lazily and reads nothing yet; then both again with every weight read once
           (what the first forward pass pays). Median times; ratios = shardwise / transformers.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch


def make_folder(folder: Path, shard_size: str, family: str) -> None:
    """gpt2: GPT-2's own config (124M). llama: a Llama of the same size (hidden 768, 12 layers, 12 heads, FFN 2048,
    vocabulary 32,000: 110M), whose nn.Linear layout needs no transposes."""
    import transformers

    if (folder / "config.json").is_file():
        return
    torch.manual_seed(0)
    if family == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
            num_key_value_heads=12, vocab_size=32000, max_position_embeddings=1024))
    model.save_pretrained(folder, max_shard_size=shard_size)


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _load(folder, mesh, layout):
    from shardwise.hf.load import inspect_folder, loader
    from shardwise.model import Transformer
    from shardwise.parallel import parallelize
    from shardwise.specs import load_model

    spec = load_model(str(folder))
    return parallelize(Transformer(spec, device="meta"), mesh, layout, "cpu", weights=loader(inspect_folder(folder, spec))).model


def _memory_rank(rank, world, folder, out_dir):
    from shardwise.parallel import build_mesh
    from shardwise.specs import Layout

    layout = Layout(tp=world)
    mesh = build_mesh(1, 1, world, backend="gloo", timeout_s=120)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = _status("VmRSS")
    model = _load(folder, mesh, layout)
    peak = _status("VmHWM")
    shard = sum(p.numel() * p.element_size() for p in model.parameters())
    Path(out_dir, f"{rank}.json").write_text(json.dumps({"rank": rank, "before": before, "peak": peak, "shard": shard}))


def memory(folder: Path) -> list[dict]:
    from shardwise.launch import spawn_ranks

    with tempfile.TemporaryDirectory() as out:
        spawn_ranks(_memory_rank, 2, str(folder), out, timeout_s=300)
        return [json.loads(Path(out, f"{r}.json").read_text()) for r in range(2)]


def speed(folder: Path, repeats: int) -> dict:
    import transformers

    from shardwise.specs import Layout

    def touched(model):  # every weight read once: what the first forward pass costs a lazily mapped model
        with torch.no_grad():
            for p in model.parameters():
                p.sum()
        return model

    contenders = {
        "shardwise": lambda: _load(folder, None, Layout()),
        "transformers": lambda: transformers.AutoModelForCausalLM.from_pretrained(folder),
        "shardwise+read": lambda: touched(_load(folder, None, Layout())),
        "transformers+read": lambda: touched(transformers.AutoModelForCausalLM.from_pretrained(folder)),
    }
    times = {k: [] for k in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            gc.collect()
            start = time.perf_counter()
            model = fn()
            times[name].append(time.perf_counter() - start)
            del model
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"seconds": med, "ratio": med["shardwise"] / med["transformers"],
            "ratio_read": med["shardwise+read"] / med["transformers+read"], "repeats": repeats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--dir", default=None, help="where the random model is saved (default: the temp folder)")
    ap.add_argument("--shard-size", default="200MB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    folder = Path(args.dir or os.path.join(tempfile.gettempdir(), f"shardwise-{args.family}-random"))
    make_folder(folder, args.shard_size, args.family)
    from shardwise.hf.load import read_header

    files = sorted(folder.glob("*.safetensors"))
    largest = max(int(t["data_offsets"][1]) - int(t["data_offsets"][0]) for f in files for t in read_header(f).values())
    mem = memory(folder)
    spd = speed(folder, args.repeats)
    result = {"files": len(files), "largest_tensor_bytes": largest, "memory": mem, "speed": spd}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    mb = 2**20
    print(f"{args.family} (random weights), {len(files)} safetensors files, largest tensor {largest / mb:.1f} MiB")
    for m in mem:
        delta = m["peak"] - m["before"]
        print(f"tp rank {m['rank']}: own shard {m['shard'] / mb:.1f} MiB, peak RSS during load +{delta / mb:.1f} MiB "
              f"= {delta / m['shard']:.3f} x shard (overhead over the shard {(delta - m['shard']) / mb:+.1f} MiB)")
    t = spd["seconds"]
    print(f"one rank (median of {spd['repeats']}): shardwise {t['shardwise']:.3f} s, transformers.from_pretrained "
          f"{t['transformers']:.3f} s, ratio {spd['ratio']:.2f}; with every weight read once: {t['shardwise+read']:.3f} s "
          f"vs {t['transformers+read']:.3f} s, ratio {spd['ratio_read']:.2f}")


if __name__ == "__main__":
    main()
