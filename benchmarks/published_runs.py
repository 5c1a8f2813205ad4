"""Predicted vs published TFLOP/s per GPU for the published runs in ../shared/reference/published_runs.csv.

For each usable row, the planner estimates the published layout on the published architecture and
hardware, and we compare in the source's own FLOP convention (see the CSV's README):
  Megatron-style rows (MT-NLG, BLOOM, GPT-NeoX) count the recompute forward -> our hardware TFLOP/s;
  every other row is PaLM-style model FLOPs -> our model TFLOP/s (MFU x peak).
Rows whose throughput is marked '?' are weak evidence: printed, but kept out of the summary.

    python benchmarks/published_runs.py [--csv PATH] [--json]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from shardwise.planner import Job, estimate
from shardwise.specs import Layout, ModelSpec, TrainSpec, load_cluster

# The project's shared reference file when it sits beside the checkout, else the copy shipped here.
SHARED_CSV = Path(__file__).resolve().parents[2] / "shared/reference/published_runs.csv"
DEFAULT_CSV = SHARED_CSV if SHARED_CSV.is_file() else Path(__file__).resolve().parent / "data/published_runs.csv"

# Vocabulary when the row says NR: the tokenizer of that model family where it is public,
# else the padded GPT-2 BPE Megatron uses (51200).
VOCAB_BY_NAME = {"Llama3.1": 128256, "Nemotron4": 256000, "GLM-130B": 150528}
DEFAULT_VOCAB = 51200
# Sources whose TFLOP/s count the recompute forward pass (the README's Megatron-style convention).
HARDWARE_FLOP_SOURCES = ("MT-NLG", "BLOOM", "GPT-NeoX")
# Frameworks of these runs used a fused attention kernel (FlashAttention); the 2021-22 Megatron,
# DeepSpeed, BLOOM, NeoX, GLM and OPT runs materialised the softmax.
FLASH_SOURCES = ("nemo", "mosaicml", "dgxc-benchmarking")


@dataclass
class Run:
    name: str
    job: Job | None
    layout: Layout | None
    published_tflops: float | None
    convention: str  # "model" or "hardware"
    weak: bool
    skip: str = ""  # why the row is not usable
    flops_per_sequence: float | None = None  # the source's own model-FLOP count, when it states one


def _int(cell: str) -> int | None:
    m = re.search(r"\d+", cell.replace(",", ""))
    return int(m.group()) if m else None


def _float(cell: str) -> float | None:
    m = re.search(r"\d+(\.\d+)?", cell)
    return float(m.group()) if m else None


def _cluster(gpu_type: str):
    name = "dgx-h100-80gb" if "H100" in gpu_type else "dgx-a100-40gb" if "40GB" in gpu_type else "dgx-a100-80gb"
    cluster = load_cluster(name)
    # Network stated in the row (per node, shared by its 8 GPUs).
    if "Omni-Path" in gpu_type:  # Jean Zay: 4 x 100 Gb/s Omni-Path per node
        cluster = replace(cluster, inter_node_bandwidth=4 * 12.5e9 / 8)
    elif "4x ConnectX-6 HDR" in gpu_type:  # 4 x 200 Gb/s HDR per node
        cluster = replace(cluster, inter_node_bandwidth=4 * 25e9 / 8)
    return cluster


def _model(row: dict) -> ModelSpec:
    name = row["run"]
    heads = _int(row["heads"])
    kv = heads
    m = re.search(r"(\d+) (query groups|KV)", row["heads"])
    if m:
        kv = int(m.group(1))
    gated = "Llama" in name or "GeGLU" in row["ffn_hidden"]
    hidden = _int(row["hidden"])
    vocab = _int(row["vocab"]) if row["vocab"].strip()[:1].isdigit() else next(
        (v for k, v in VOCAB_BY_NAME.items() if k in name), DEFAULT_VOCAB)
    ffn = _int(row["ffn_hidden"])
    return ModelSpec(name=name, family="llama" if gated else "gpt2", hidden=hidden, ffn_hidden=ffn,
                     num_layers=_int(row["layers"]), num_heads=heads, num_kv_heads=kv, vocab_size=vocab,
                     head_dim=hidden // heads, max_positions=_int(row["seq_len"]), tie_embeddings=not gated)


def _recompute(cell: str) -> str:
    c = cell.lower()
    if c.startswith("selective"):
        return "selective"
    if c.startswith("full") or c.startswith("yes"):
        return "full"
    return "none"


def _zero(cell: str) -> int:
    c = cell.strip()
    return int(c[0]) if c[:1].isdigit() else (0 if c.startswith("none") else 1)


def parse(row: dict) -> Run:
    name = row["run"]
    tflops_cell, pct_cell = row["tflops_per_gpu"].strip(), row["mfu_or_peak_pct"].strip()
    hardware = any(s in name for s in HARDWARE_FLOP_SOURCES)
    weak = "?" in tflops_cell or "?" in pct_cell or "convention not stated" in row["notes"]
    cluster = _cluster(row["gpu_type"])
    model = _model(row)
    seq = _int(row["seq_len"])
    gpus, tp, pp = _int(row["gpus"]), _int(row["tp"]), _int(row["pp"])
    cp = _int(row["cp"]) or 1
    dp = gpus // (tp * pp * cp)
    mb = _int(row["micro_batch"]) or 1  # NR: one sequence per micro-batch
    vpp_cell = row["vpp_interleave"]
    vpp = _int(vpp_cell.split(" / ")[-1]) or 1  # README vs yaml disagree: the yaml is what ran
    recompute_cell = row["recompute"]
    recompute = _recompute(recompute_cell)
    dgxc = "dgxc-benchmarking" in row["source"]  # README: SP on, TP-communication and P2P overlap on
    sp = "SP" in recompute_cell or "SP on" in row["notes"] or "sequence parallel" in name or dgxc
    # Global batch: the configured value when the source gives two (NeoX: paper 1538, config 1536).
    batches = [int(x) for x in re.findall(r"\d+", row["global_batch_seqs"].split("(")[0] + " " +
                                              " ".join(re.findall(r"config[^)]*?(\d+)", row["global_batch_seqs"])))]
    batch = next((b for b in reversed(batches) if b % (dp * mb) == 0), None)
    if batch is None:  # an approximate batch ("~1024 (2M tokens)"): the nearest multiple of dp * mb
        batch = max(1, round(batches[0] / (dp * mb))) * dp * mb
    flash = any(s in (name + row["source"]).lower() for s in FLASH_SOURCES)
    if tflops_cell and _float(tflops_cell):
        published, convention = _float(tflops_cell), "hardware" if hardware else "model"
    elif pct_cell and _float(pct_cell):
        published, convention = _float(pct_cell) / 100 * cluster.peak_flops / 1e12, "model"
    else:
        published, convention = None, "model"
    schedule = "interleaved-1f1b" if vpp > 1 else "1f1b"
    layout = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, vpp=vpp, zero=_zero(row["zero_stage"]),
                    recompute=recompute, sequence_parallel=sp and tp > 1, schedule=schedule)
    # NeMo's distributed_fused_adam keeps one contiguous gradient buffer in its grad_sync_dtype (bf16
    # in these configs) and fp32 master weights + moments sharded: 2 + 2 + 12/d bytes per parameter.
    train = TrainSpec(global_batch=batch, seq_len=seq, grad_bytes=2 if dgxc else 4)
    job = Job(model, cluster, train, flash_attention=flash, context_parallel=cp,
              tp_comm_overlap=dgxc)
    run = Run(name, job, layout, published, convention, weak)
    m = re.search(r"Model flops/seq = ([\d.]+e[+]?\d+)", row["notes"])
    proxy = re.search(r"\(([\d/]+) layers\)", row["notes"])  # reduced-depth proxies of the full model
    is_proxy = bool(proxy) and str(model.num_layers) in proxy.group(1).split("/")
    if m and not is_proxy:  # NeMo counts its own model FLOPs (Nemotron: 1.01e16 vs PaLM's 8.6e15): use them
        run.flops_per_sequence = float(m.group(1))
    if published is None:
        m = re.search(r"iteration time ([\d.]+) s", row["notes"])
        if m:  # Korthikanti baselines: the source gives the time; model FLOP/s follow from it.
            from shardwise.planner.step_time import model_flops_per_step
            run.published_tflops = model_flops_per_step(job) / float(m.group(1)) / gpus / 1e12
        else:
            run.skip = "no throughput reported"
    return run


def load_runs(path: Path) -> list[Run]:
    with open(path, newline="") as fh:
        return [parse(row) for row in csv.DictReader(fh)]


def predict(run: Run) -> tuple[float, bool]:
    est = estimate(run.job, run.layout)
    value = est.hardware_tflops_per_gpu if run.convention == "hardware" else est.model_tflops_per_gpu
    if run.flops_per_sequence and run.convention == "model":
        # Same FLOP count as the source, so the comparison is one of step times.
        value = run.flops_per_sequence * run.job.train.global_batch / est.step_time / est.gpus / 1e12
    return value, est.fits


def compare(path: Path) -> tuple[list[dict], dict]:
    rows, errors = [], []
    for run in load_runs(path):
        if run.skip:
            rows.append({"run": run.name, "skip": run.skip})
            continue
        pred, fits = predict(run)
        err = pred / run.published_tflops - 1
        rows.append({"run": run.name, "layout": run.layout.describe(), "convention": run.convention,
                     "published": round(run.published_tflops, 1), "predicted": round(pred, 1),
                     "error": round(err, 4), "fits": fits, "weak": run.weak})
        if not run.weak:
            errors.append(abs(err))
    strong = [r for r in rows if "error" in r and not r["weak"]]
    summary = {"rows": len(strong), "median_abs_error": statistics.median(errors), "max_abs_error": max(errors),
               "all_fit": all(r["fits"] for r in strong)}
    return rows, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV, help="published_runs.csv")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    if not args.csv.is_file():
        print(f"published_runs.py: {args.csv} not found — pass --csv PATH", file=sys.stderr)
        return 2
    rows, summary = compare(args.csv)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=2))
        return 0
    print(f"{'run':58} {'layout':22} {'conv':8} {'publ':>6} {'pred':>6} {'error':>7} fits")
    for r in rows:
        if "skip" in r:
            print(f"{r['run'][:58]:58} skipped: {r['skip']}")
            continue
        mark = " (weak: not in summary)" if r["weak"] else ""
        print(f"{r['run'][:58]:58} {r['layout']:22} {r['convention']:8} {r['published']:6.1f} {r['predicted']:6.1f} "
              f"{r['error']:+7.1%} {'yes' if r['fits'] else 'NO'}{mark}")
    print(f"\n{summary['rows']} rows: median |error| {summary['median_abs_error']:.1%}, "
          f"max |error| {summary['max_abs_error']:.1%}, every published layout fits: {summary['all_fit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
