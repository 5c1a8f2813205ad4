"""Loading a Hugging Face checkpoint: a rank's peak memory at tp 2, and one rank's time against transformers.

    python benchmarks/hf_load.py [--family gpt2|llama] [--repeats 5] [--shard-size 200MB] [--json]

The model is gpt2-size (124M parameters, GPT-2's config) with random weights, built here with transformers
and saved as sharded safetensors (no download). Then:
  memory   two processes (tp 2, gloo, CPU): each builds shardwise's model on the meta device, slices it for
           tp and reads only its slices from the memory-mapped files. Peak RSS during the load (VmHWM after
           resetting it through /proc/self/clear_refs) minus the RSS just before, against the bytes of the
           rank's own shard: the goal is <= 1.2 x shard + a fixed overhead.
  speed    one rank. Each timed load runs in a fresh process forked from this one once it has imported
           everything and loaded both once (so a first load in a process, as in `train`, without the imports);
           `repeats` rounds, in each both contenders for each stage, the one that goes first alternating:
             shardwise     check the folder + build on meta + every parameter from the mapping: with no
                           data-parallel replica every fp32 tensor stays a copy-on-write view of the mapped
                           file, GPT-2's Conv1D weights seen transposed (x @ W, as Conv1D computes it)
             transformers  AutoModelForCausalLM.from_pretrained(DIR), which also keeps mapped views, in
                           Conv1D's layout
           stages: "call" (the load alone: neither side has read the weights yet), "read" (then every weight
           read once: what the first forward pays to page them in), "forward" (then one forward pass of 1 x 16
           tokens; includes each model's own compute) and "train-ready" (then the optimizer built as each
           trainer builds it: shardwise's make_optimizer, which makes GPT-2's q/k/v columns dense, and a fused
           torch AdamW for transformers; then every weight written once in place, what the first optimizer
           step does to mapped pages). Median times; ratios = shardwise / transformers.
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


STAGES = ("call", "read", "forward", "train-ready")


def _in_child(fn) -> float:
    """Seconds fn() takes in a fresh child process forked from this one."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        start = time.perf_counter()
        fn()
        os.write(w, repr(time.perf_counter() - start).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    if not out:
        raise RuntimeError("a timed load failed in its child process")
    return float(out)


def speed(folder: Path, repeats: int) -> dict:
    import transformers

    from shardwise.parallel import make_optimizer
    from shardwise.specs import Layout

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    tokens = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(0))
    optimizer = {"shardwise": lambda params: make_optimizer([{"params": params}], 0, None),
                 "transformers": lambda params: torch.optim.AdamW(params, fused=True)}

    @torch.no_grad()
    def then(model, who, stage):
        if stage == "read":
            for p in model.parameters():
                p.sum()
        elif stage == "forward":
            model(tokens)
        elif stage == "train-ready":
            optimizer[who](list(model.parameters()))
            for p in model.parameters():
                p.mul_(1.0)
        return model

    load = {"shardwise": lambda: _load(folder, None, Layout()),
            "transformers": lambda: transformers.AutoModelForCausalLM.from_pretrained(folder)}
    for who, fn in load.items():  # imports, first-call caches, the files in the page cache
        then(fn(), who, "forward")
    gc.collect()
    times = {(who, stage): [] for stage in STAGES for who in load}
    for r in range(repeats):
        for stage in STAGES:
            for who in sorted(load, reverse=r % 2 == 1):
                times[who, stage].append(_in_child(lambda: then(load[who](), who, stage)))
    med = {f"{who}+{stage}": statistics.median(v) for (who, stage), v in times.items()}
    return {"seconds": med, "repeats": repeats,
            "ratio": {stage: med[f"shardwise+{stage}"] / med[f"transformers+{stage}"] for stage in STAGES}}


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
    before = os.getloadavg()[0]
    mem = memory(folder)
    spd = speed(folder, args.repeats)
    result = {"files": len(files), "largest_tensor_bytes": largest, "memory": mem, "speed": spd,
              "load_average": [before, os.getloadavg()[0]]}
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
    print(f"one rank, median of {spd['repeats']} (shardwise / transformers.from_pretrained):")
    for stage in STAGES:
        print(f"  {stage:11s} {t['shardwise+' + stage]:.3f} s / {t['transformers+' + stage]:.3f} s = "
              f"{spd['ratio'][stage]:.2f}")
    print(f"load average {result['load_average'][0]:.1f} before, {result['load_average'][1]:.1f} after")


if __name__ == "__main__":
    main()
