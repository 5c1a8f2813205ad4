"""How long `plan`, `estimate`, `explain` and `simulate` take on their worst inputs, from the shell.

Each command runs as a new process (`python -m shardwise ...`, as a user types it), `--repeats` times; the
median wall time is printed beside the start-up of `python -m shardwise --help` measured in the same run (the
floor every command pays: the interpreter and the imports), and the ratio between them. The inputs are the
largest each command accepts (a search just below the layout budget, a simulation at the closed-form switch,
pipelines of 10,000 stages and 2^32 micro-batches) and the huge or degenerate ones it refuses in one line.

    python benchmarks/answer_time.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

CASES = {
    "startup (shardwise --help)": ["--help"],
    "plan: gpt3-175b, 3072 GPUs (narrowed to even virtual stages)": [
        "plan", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--gpus", "3072", "--global-batch", "1536",
        "--seq-len", "2048"],
    "plan: llama-65b, 64 GPUs (the README's, 5,562 layouts in full)": [
        "plan", "--model", "llama-65b", "--cluster", "dgx-a100-80gb", "--gpus", "64", "--global-batch", "1024",
        "--seq-len", "2048"],
    "explain: gpt3-175b, 3072 GPUs": [
        "explain", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--gpus", "3072", "--global-batch", "1536",
        "--seq-len", "2048"],
    "plan: 10^18 GPUs (refused)": [
        "plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", str(10**18), "--global-batch", "1024",
        "--seq-len", "2048"],
    "plan: 720,720 GPUs, batch 1,441,440 (the search narrows itself)": [
        "plan", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--gpus", "720720", "--global-batch", "1441440",
        "--seq-len", "2048"],
    "plan: deepseek-v3, 2048 GPUs (MoE, narrowed to 1,942 layouts)": [
        "plan", "--model", "deepseek-v3", "--cluster", "dgx-h100-80gb", "--gpus", "2048", "--global-batch", "8192",
        "--seq-len", "4096"],
    "plan: deepseek-v3, 16,384 GPUs (refused: too many layouts)": [
        "plan", "--model", "deepseek-v3", "--cluster", "dgx-h100-80gb", "--gpus", "16384", "--global-batch", "16384",
        "--seq-len", "4096"],
    "estimate: 2^20 GPUs, batch 2^32": [
        "estimate", "--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--gpus", str(2**20), "--global-batch",
        str(2**32), "--seq-len", "8192", "--tp", "8", "--pp", "16", "--micro-batch", "1"],
    "simulate: 20,000 actions, simulated (pp 100, m 100)": ["simulate", "--pp", "100", "--microbatches", "100"],
    "simulate: pp 10,000 x m 2^32 (closed forms)": ["simulate", "--pp", "10000", "--microbatches", str(2**32)],
    "simulate: pp 2000 x m 2000, 4 schedules (closed forms)": [
        "simulate", "--compare", "--pp", "2000", "--microbatches", "2000"],
    "simulate: pp 10^9 (refused)": ["simulate", "--pp", str(10**9), "--microbatches", "4"],
}


def run(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system of the child: what a busy machine does not inflate), exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "shardwise", *argv], capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, done.returncode


def main(args: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per case; the median is shown (default 3)")
    opts = ap.parse_args(args)
    wall: dict[str, list[float]] = {name: [] for name in CASES}
    cpu: dict[str, list[float]] = {name: [] for name in CASES}
    codes: dict[str, int] = {}
    for _ in range(opts.repeats):  # interleaved: the machine's load changes alike for every case
        for name, argv in CASES.items():
            w, c, codes[name] = run(argv)
            wall[name].append(w)
            cpu[name].append(c)
    med = {n: (statistics.median(wall[n]), statistics.median(cpu[n])) for n in CASES}
    base = med["startup (shardwise --help)"]
    print(f"{'case':66} {'exit':>4} {'wall s':>7} {'cpu s':>6} {'cpu x startup':>13}")
    for name in CASES:
        w, c = med[name]
        print(f"{name:66} {codes[name]:>4} {w:7.2f} {c:6.2f} {c / base[1]:13.2f}")
    worst = max((n for n in CASES if not n.startswith("startup")), key=lambda n: med[n][1])
    print(f"\nslowest: {worst}: {med[worst][1]:.2f} s CPU ({med[worst][1] / base[1]:.1f} x the {base[1]:.2f} s start-up), "
          f"{med[worst][0]:.2f} s wall at load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
