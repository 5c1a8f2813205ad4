"""Where one GPU's training step goes, and the clock it holds under sustained work (run on a CUDA GPU).

    python benchmarks/gpu_step_profile.py --out step.json [--model CFG] [--seq-len 4096] [--micro-batches 8]
        [--parts step,host_floor,clock]

1. Clock: a BF16 8192^3 matmul timed as a short burst (3 warm-ups, 10 products: what a GEMM benchmark reports),
   then back to back for --sustain seconds with nvidia-smi sampling the SM clock, power and throttle reasons every
   0.5 s: the rate per second of sustained work, against the burst. A training step is sustained work.
2. Step: the runtime's model (shardwise.model, FP32 weights under BF16 autocast, fused AdamW, as `shardwise train`
   runs one GPU) for one step of --micro-batches micro-batches, under torch.profiler: GPU time by kernel kind
   (GEMM, attention, the rest), the step's wall time and the share the GPU sat idle (host-bound gaps), for the
   planner's terms to be compared with (`shardwise estimate ... --json`).
3. Host floor: gpt2 with 0, 1, 4 and 12 layers, forward + backward by tokens per micro-batch, 16 to 8,192, with the
   GPU's busy time in each (host_floor; added after the first H200 run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

KINDS = (("attention", ("flash", "fmha", "cudnn", "attention")),
         ("gemm", ("gemm", "nvjet", "sm90_xmma", "cutlass", "cublas", "matmul")),
         ("optimizer", ("adam", "multi_tensor")),
         ("nccl", ("nccl",)))


def kind(name: str) -> str:
    low = name.lower()
    return next((k for k, keys in KINDS if any(s in low for s in keys)), "other")


def _wall(torch, run, warmup: int, repeats: int, inner: int = 1) -> list[float]:
    """Wall seconds per call of `run`, each repeat `inner` calls back to back and synchronized at its end."""
    for _ in range(warmup):
        run()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            run()
        sync()
        walls.append((time.perf_counter() - t0) / inner)
    return walls


def _kernels(prof) -> list:
    return [e for e in prof.events() if e.device_type.name == "CUDA"]


def _device_us(e) -> float:
    return e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total


def gpu_busy_us(prof) -> float:
    """Microseconds the GPU ran a kernel in a profile: the union of the kernels' intervals."""
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((k.time_range.start, k.time_range.end) for k in _kernels(prof)):
        if cur_e is None or s > cur_e:
            busy += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return busy + (0 if cur_e is None else cur_e - cur_s)


def clock(torch, sustain_s: float) -> dict:
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    flops = 2 * n ** 3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def burst(reps=10):
        for _ in range(3):
            a @ b
        start.record()
        for _ in range(reps):
            a @ b
        end.record()
        end.synchronize()
        return flops * reps / (start.elapsed_time(end) / 1e3) / 1e12
    cold = burst()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "500"], stdout=subprocess.PIPE, text=True)
    rates, t_end = [], time.time() + sustain_s
    while time.time() < t_end:
        start.record()
        for _ in range(100):
            a @ b
        end.record()
        end.synchronize()
        rates.append(flops * 100 / (start.elapsed_time(end) / 1e3) / 1e12)
    perf = subprocess.run(["nvidia-smi", "-q", "-d", "PERFORMANCE"], capture_output=True, text=True).stdout
    hot = burst()
    lin = torch.nn.functional.linear
    start.record()
    for _ in range(10):
        lin(a, b)
    end.record()
    end.synchronize()
    hot_linear = flops * 10 / (start.elapsed_time(end) / 1e3) / 1e12
    smi.terminate()
    samples = [line.split(", ") for line in smi.communicate()[0].splitlines() if line.count(",") >= 3]
    out = {"burst_tflops_cold": cold, "sustained_tflops": rates, "burst_tflops_after": hot,
           "linear_tn_tflops_after": hot_linear, "smi": samples, "performance_while_sustained": perf}
    print(f"matmul 8192^3: burst {cold:.0f} TFLOP/s, sustained median {statistics.median(rates):.0f} "
          f"(first {rates[0]:.0f}, last {rates[-1]:.0f}), burst after {hot:.0f}, F.linear {hot_linear:.0f}", flush=True)
    for s in samples[:: max(1, len(samples) // 12)]:
        print("  smi", " | ".join(s), flush=True)
    print("\n".join(ln for ln in perf.splitlines() if ":" in ln and "Not Active" not in ln)[-1500:], flush=True)
    return out


def step(torch, config: str, seq: int, micro_batches: int) -> dict:
    from shardwise import precision
    from shardwise.model import Transformer
    from shardwise.specs import load_model

    spec = load_model(config)
    model = Transformer(spec, seed=0, device=torch.device("cuda"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    data = torch.randint(0, spec.vocab_size, (micro_batches, 1, seq), device="cuda")

    def run():
        for x in data:
            with precision.autocast("cuda"):
                loss = model(x, x) / micro_batches
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    walls = _wall(torch, run, warmup=2, repeats=3)
    torch.cuda.reset_peak_memory_stats()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    by_kind: dict[str, float] = {}
    top: dict[str, float] = {}
    for e in _kernels(prof):
        us = _device_us(e)
        by_kind[kind(e.name)] = by_kind.get(kind(e.name), 0.0) + us / 1e6
        top[e.name] = top.get(e.name, 0.0) + us / 1e6
    busy = gpu_busy_us(prof)
    out = {"model": spec.name, "seq_len": seq, "micro_batches": micro_batches, "wall_s": statistics.median(walls),
           "profiled_wall_s": wall, "gpu_busy_s": busy / 1e6, "by_kind_s": by_kind,
           "top_kernels_s": dict(sorted(top.items(), key=lambda kv: -kv[1])[:25]),
           "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
           # what the caching allocator held at the step's peak beyond its tensors: the fragmentation the planner
           # allows 5 % for (memory.FRAGMENTATION, no measurement yet)
           "peak_reserved_bytes": torch.cuda.max_memory_reserved()}
    print(f"step {spec.name} {micro_batches} x {seq}: wall {out['wall_s'] * 1e3:.1f} ms (profiled {wall * 1e3:.1f}), "
          f"GPU busy {out['gpu_busy_s'] * 1e3:.1f} ms; " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in
                                                                     sorted(by_kind.items())), flush=True)
    for name, s in list(out["top_kernels_s"].items())[:25]:
        print(f"  {s * 1e3:8.2f} ms  {name[:110]}", flush=True)
    return out


def host_floor(torch, config: str = "gpt2", tokens=(16, 256, 1024, 2048, 4096, 8192), layers=(0, 1, 4, 12),
               device: str = "cuda") -> dict:
    """Seconds of a model's forward + backward (embedding, `layers` layers, the head and loss) under autocast by
    tokens per micro-batch, back to back, and the GPU's busy time in one of them (torch.profiler): at a handful of
    tokens the GPU waits on the host (Python, dispatch, launches), so those points are the host's floor, per layer
    from the slope over layer counts. A calibrated layer time on a GPU should take the larger of it and the device's
    (docs/accuracy.md: gpt2 on an H200 is host-bound, and calibrate's fit is additive)."""
    from torch.profiler import ProfilerActivity, profile

    from shardwise import precision
    from shardwise.model import Transformer
    from shardwise.specs import load_model

    spec = load_model(config)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = []
    for n in layers:
        model = Transformer(spec, seed=0, layer_ids=range(n), device=torch.device(device))
        for t in tokens:
            seq = min(t, spec.max_positions)  # gpt2's learned positions stop at 1,024: more tokens are more sequences
            x = torch.randint(0, spec.vocab_size, (t // seq, seq), device=device)

            def run():
                with precision.autocast(device):
                    loss = model(x, x)
                loss.backward()
            wall = statistics.median(_wall(torch, run, warmup=3, repeats=5, inner=10))
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run()
                sync()
            busy = gpu_busy_us(prof) / 1e6
            out.append({"layers": n, "tokens": t, "wall_s": wall, "gpu_busy_s": busy})
            print(f"host floor {config} {n:2d} layers + head, {t:5d} tokens: wall {wall * 1e3:7.2f} ms, "
                  f"GPU busy {busy * 1e3:7.2f} ms", flush=True)
    return {"model": config, "points": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="benchmarks/data/gpu_configs/llama-1.3b-nanotron.json")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--sustain", type=float, default=20.0, help="seconds of back-to-back matmuls (clock)")
    ap.add_argument("--parts", default="step,host_floor,clock", help="what to measure, comma-separated: step, host_floor, clock")
    args = ap.parse_args()
    parts = args.parts.split(",")
    if unknown := set(parts) - {"step", "host_floor", "clock"}:
        ap.error(f"unknown --parts {', '.join(sorted(unknown))}: choose from step, host_floor, clock")
    import torch
    if not torch.cuda.is_available():
        print("gpu_step_profile: no CUDA GPU on this machine — skipped")
        return 0
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for part, run in (("step", lambda: step(torch, args.model, args.seq_len, args.micro_batches)),
                      ("host_floor", lambda: host_floor(torch)), ("clock", lambda: clock(torch, args.sustain))):
        if part in parts:
            result[part] = run()
            json.dump(result, open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
