"""One GPU's kernels, measured: the planner's kernel inputs (GEMM time by shape, the attention core, HBM traffic, a
kernel launch) timed on the GPU this runs on, so the planner's kernel model (planner/kernels.py) can be checked against
a measurement of its own GPU rather than against training runs.

    python benchmarks/gpu_kernels.py --out kernels.json          # on a CUDA GPU, about a minute
    python benchmarks/gpu_kernels.py --score kernels.json --cluster dgx-h200   # anywhere: the model against it

Measuring: BF16, CUDA events around batches of back-to-back launches (a warm-up first), the median over batches;
operands rotate through enough copies to overflow the L2 cache, and are random (never zeros). GEMMs are the three of
every linear layer of Llama-shaped models (forward, input gradient, weight gradient) at tensor-parallel widths 1-8,
plus a K sweep at 8192 x 8192 and the MAMF shape. The attention core is torch's scaled_dot_product_attention on its
FlashAttention-2 and cuDNN backends, 16K tokens a batch, 2048-wide heads (FlashAttention-3's Fig. 5/6 setting).
Element-wise: a copy, torch's fused RMSNorm and SiLU-and-multiply, and the runtime's own eager ops under autocast
(`eager_ops`: casts, mixed-precision adds, broadcasts, its RMSNorm and RoPE, the loss), each at the bytes its dataflow
moves (added after the first H200 run: not yet measured).
Scoring prints each GEMM's measured and modelled TFLOP/s and the medians (+ = the model is slower than measured).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

# Llama-shaped models: (hidden, ffn), the shapes of 1-8B, 8B and 70B-class layers.
MODELS = ((2048, 8192), (4096, 14336), (8192, 28672))
TOKENS = (4096, 16384)
TPS = (1, 2, 4, 8)
K_SWEEP = (256, 512, 1024, 2048, 4096, 8192, 16384)
ATTN_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
L2_BYTES = 256 << 20  # rotate operands through at least this much (the H100/H200 L2 is 50-60 MB)


def linear_gemms(hidden: int, ffn: int, tokens: int, tp: int) -> list[tuple[str, int, int, int]]:
    """(name, m, n, k) of the forward, input-gradient and weight-gradient GEMMs of a Llama layer's four linears at
    tensor-parallel width tp (column-parallel q/k/v and gate/up, row-parallel output and down projections)."""
    linears = (("qkv", hidden, 3 * hidden // tp), ("out", hidden // tp, hidden),
               ("gate_up", hidden, 2 * ffn // tp), ("down", ffn // tp, hidden))
    out = []
    for name, fan_in, fan_out in linears:
        out += [(f"{name}.fwd", tokens, fan_out, fan_in), (f"{name}.dgrad", tokens, fan_in, fan_out),
                (f"{name}.wgrad", fan_out, fan_in, tokens)]
    return out


def gemm_cases() -> list[dict]:
    cases = []
    for hidden, ffn in MODELS:
        for tokens in TOKENS:
            for tp in TPS:
                for name, m, n, k in linear_gemms(hidden, ffn, tokens, tp):
                    cases.append({"case": f"h{hidden} t{tokens} tp{tp} {name}", "m": m, "n": n, "k": k})
    cases += [{"case": f"k-sweep 8192x8192x{k}", "m": 8192, "n": 8192, "k": k} for k in K_SWEEP]
    cases += [{"case": "mamf-shape H100", "m": 6144, "n": 17920, "k": 2816},
              {"case": "square 8192", "m": 8192, "n": 8192, "k": 8192}]
    return cases


# --------------------------------------------------------------------------- measuring (CUDA)

def _timed(torch, fn, min_s: float = 0.02, batches: int = 5) -> float:
    """Median seconds per call of fn over `batches` event-timed batches of back-to-back calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end) / 1e3, 1e-6)
    inner = max(1, min(200, math.ceil(min_s / one)))
    samples = []
    for _ in range(batches):
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(samples)


def _rotating(torch, shapes: list[tuple[int, ...]]):
    """Enough random copies of the operands to overflow the L2; returns a function giving the next set."""
    size = sum(math.prod(s) * 2 for s in shapes)
    sets = [[torch.randn(s, device="cuda", dtype=torch.bfloat16) for s in shapes]
            for _ in range(max(1, min(16, math.ceil(L2_BYTES / size))))]
    state = {"i": 0}

    def take():
        state["i"] = (state["i"] + 1) % len(sets)
        return sets[state["i"]]
    return take


def measure_gemms(torch) -> list[dict]:
    rows = []
    for c in gemm_cases():
        m, n, k = c["m"], c["n"], c["k"]
        take = _rotating(torch, [(m, k), (n, k)])

        def run():
            a, b = take()
            torch.nn.functional.linear(a, b)  # [m,k] x [n,k]^T: cuBLAS's TN, as a linear layer's forward
        s = _timed(torch, run)
        rows.append({**c, "seconds": s, "tflops": 2 * m * n * k / s / 1e12})
        print(f"gemm {c['case']:34s} {m:6d}x{n:6d}x{k:6d} {rows[-1]['tflops']:7.1f} TFLOP/s", flush=True)
    return rows


def measure_attention(torch) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    rows = []
    for head_dim in (64, 128):
        heads = 2048 // head_dim
        for seq in ATTN_SEQS:
            batch = 16384 // seq
            for causal in (True, False):
                fwd_flops = 4 * batch * heads * seq * seq * head_dim / (2 if causal else 1)
                for name, backend in backends.items():
                    try:
                        q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16,
                                               requires_grad=True) for _ in range(3))
                        grad = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
                        with sdpa_kernel(backend):
                            fwd = _timed(torch, lambda: torch.nn.functional.scaled_dot_product_attention(
                                q, k, v, is_causal=causal))

                            def both():
                                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                                torch.autograd.grad(out, (q, k, v), grad)
                            total = _timed(torch, both)
                    except Exception as exc:  # a backend this torch or GPU lacks: recorded, not fatal
                        print(f"attention {name} d{head_dim} s{seq}: {type(exc).__name__}: {exc}"[:200], flush=True)
                        continue
                    bwd = max(total - fwd, 1e-9)
                    rows.append({"backend": name, "head_dim": head_dim, "seq": seq, "causal": causal,
                                 "fwd_s": fwd, "bwd_s": bwd, "fwd_tflops": fwd_flops / fwd / 1e12,
                                 "bwd_tflops": 2.5 * fwd_flops / bwd / 1e12})
                    r = rows[-1]
                    print(f"attention {name:5s} d{head_dim:3d} s{seq:5d} {'causal' if causal else 'full  '} "
                          f"fwd {r['fwd_tflops']:6.1f} bwd {r['bwd_tflops']:6.1f} TFLOP/s", flush=True)
    return rows


def measure_memory(torch) -> dict:
    n = 1 << 29  # 1 GiB of bf16
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    copy = _timed(torch, lambda: y.copy_(x))
    h = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    norm = _timed(torch, lambda: torch.nn.functional.rms_norm(h, (4096,), w))
    g = torch.randn(16384, 14336, device="cuda", dtype=torch.bfloat16)
    u = torch.randn_like(g)
    swiglu = _timed(torch, lambda: torch.nn.functional.silu(g) * u)
    tiny = torch.zeros(1, device="cuda")
    launch = _timed(torch, lambda: tiny.add_(1), min_s=0.05)
    out = {"copy_bytes_per_s": 2 * n * 2 / copy, "rms_norm_bytes_per_s": 2 * h.numel() * 2 / norm,
           "silu_mul_bytes_per_s": 5 * g.numel() * 2 / swiglu,  # two kernels: silu reads and writes, the product 2 + 1
           "launch_s": launch}
    print(json.dumps(out), flush=True)
    return out


def eager_ops(torch, device: str = "cuda", tokens: int = 8192, hidden: int = 4096, head_dim: int = 128,
              vocab: int = 131072) -> dict:
    """{name: (the op, the bytes it moves as counted from its dataflow)}: the runtime's eager element-wise work as
    shardwise.model runs it under autocast on a GPU (FP32 residual stream and norms, BF16 linears), at a Llama-8B
    layer's width, to price eager stacks' element-wise kernels at their measured rate rather than at streaming
    bandwidth (the H200's step spent 410 ms in them where their bytes at streaming rate come to ~250)."""
    from shardwise.model import RMSNorm, apply_rope

    bf16, fp32 = torch.bfloat16, torch.float32
    x32 = torch.randn(tokens, hidden, device=device, dtype=fp32)
    x16 = torch.randn(tokens, hidden, device=device, dtype=bf16)
    norm = RMSNorm(hidden, 1e-5).to(device)
    inv = torch.rand(tokens, 1, device=device, dtype=fp32)
    heads = hidden // head_dim
    q = torch.randn(1, tokens, heads, head_dim, device=device, dtype=bf16).transpose(1, 2)  # as the model's q
    cos = torch.randn(tokens, head_dim, device=device, dtype=fp32)
    logits = torch.randn(tokens // 2, vocab, device=device, dtype=bf16)
    target = torch.randint(0, vocab, (tokens // 2,), device=device)
    e, lg = tokens * hidden, logits.numel()
    return {
        "cast fp32->bf16": (lambda: x32.to(bf16), 6 * e),
        "cast bf16->fp32": (lambda: x16.to(fp32), 6 * e),
        "residual add fp32 + bf16": (lambda: x32 + x16, 10 * e),
        "broadcast mul fp32 [T,h] x [T,1]": (lambda: x32 * inv, 8 * e),
        "RMSNorm fp32 (shardwise.model, 4 kernels)": (lambda: norm(x32), 28 * e),
        "RoPE on transposed bf16 q (shardwise.model)": (lambda: apply_rope(q, cos, cos), 36 * e),
        "cross-entropy fwd on FP32 copy of bf16 logits": (lambda: torch.nn.functional.cross_entropy(logits.float(), target),
                                                          (6 + 8) * lg),
    }


def measure_eager(torch) -> list[dict]:
    rows = []
    for name, (op, nbytes) in eager_ops(torch).items():
        with torch.no_grad():
            s = _timed(torch, op)
        rows.append({"op": name, "seconds": s, "bytes": nbytes, "bytes_per_s": nbytes / s})
        print(f"eager {name:48s} {s * 1e6:8.1f} us  {nbytes / s / 1e12:5.2f} TB/s", flush=True)
    return rows


PARTS = ("memory", "eager", "gemm", "attention")


def measure(path: str, parts=PARTS) -> None:
    import torch
    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA GPU on this machine — skipped")
        return
    props = torch.cuda.get_device_properties(0)
    result = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
              "cuda": torch.version.cuda, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(result), flush=True)
    for key, fn in (("memory", measure_memory), ("eager", measure_eager), ("gemm", measure_gemms),
                    ("attention", measure_attention)):
        if key not in parts:
            continue
        result[key] = fn(torch)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


# --------------------------------------------------------------------------- scoring (anywhere)

def score(path: str, cluster_name: str) -> dict:
    """Each measured GEMM against planner.kernels' single-GPU time for it (the kernel benchmark's rate: MAMF without
    the in-situ share a whole training step keeps)."""
    from shardwise.planner import kernels
    from shardwise.specs import load_cluster
    cluster = load_cluster(cluster_name)
    run = json.load(open(path))
    rows = []
    for g in run.get("gemm", []):
        model = kernels.benchmark_gemm_time(cluster, g["m"], g["n"], g["k"])
        rows.append({**g, "model_s": model, "error": model / g["seconds"] - 1})
    errs = [abs(r["error"]) for r in rows]
    return {"cluster": cluster_name, "gpu": run.get("gpu"), "rows": rows,
            "median_abs_error": statistics.median(errs) if errs else None, "max_abs_error": max(errs, default=None)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="measure on this machine's GPU and write the JSON here")
    ap.add_argument("--parts", default=",".join(PARTS), help="what to measure (--out), comma-separated: " + ", ".join(PARTS))
    ap.add_argument("--score", help="score the planner's kernel model against this measurement")
    ap.add_argument("--cluster", default="dgx-h200", help="cluster preset the model is read from (--score)")
    ap.add_argument("--json", action="store_true", help="print the score as JSON")
    args = ap.parse_args(argv)
    if args.out:
        parts = args.parts.split(",")
        if unknown := set(parts) - set(PARTS):
            ap.error(f"unknown --parts {', '.join(sorted(unknown))}: choose from {', '.join(PARTS)}")
        measure(args.out, parts)
    if args.score:
        s = score(args.score, args.cluster)
        if args.json:
            print(json.dumps(s, indent=1))
        else:
            for r in s["rows"]:
                print(f"{r['case']:34s} measured {r['tflops']:6.1f} model {2 * r['m'] * r['n'] * r['k'] / r['model_s'] / 1e12:6.1f}"
                      f" TFLOP/s  {r['error'] * 100:+6.1f} %")
            print(f"{s['gpu']} vs {s['cluster']}: median |error| {s['median_abs_error'] * 100:.1f} %, "
                  f"max {s['max_abs_error'] * 100:.1f} % over {len(s['rows'])} GEMMs")
    if not (args.out or args.score):
        ap.error("give --out (measure) or --score (compare)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
