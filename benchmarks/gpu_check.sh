#!/usr/bin/env bash
# On a GPU machine, a few minutes:
#  1. (issue 10) pipeline point-to-point on NCCL: `shardwise train` with pp 2, 1F1B and interleaved 1F1B,
#     8 micro-batches, gpt2 at seq 1024: each activation or gradient message is 1 x 1024 x 768 values
#     (>= 1.5 MiB), above NCCL's eager threshold, so a send completes only once its receive is posted —
#     the case an unpaired send/receive order deadlocks in. Needs 2 GPUs (NCCL runs one rank per GPU);
#     a hang fails after --timeout.
#  2. (issue 6) calibrate the GPU (NCCL, bf16), then validate a world-1 sweep of gpt2 (micro-batch and
#     recompute variants) — step time and memory, including torch.cuda.max_memory_allocated over a step
#     against the planner's total.
# Skips cleanly without a GPU.
#   OUT=dir benchmarks/gpu_check.sh     (default dir: benchmarks/out)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA GPU on this machine — skipped"
    exit 0
fi
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
if [ "$GPUS" -ge 2 ]; then
    for SCHED in 1f1b interleaved-1f1b; do
        VPP=$([ "$SCHED" = interleaved-1f1b ] && echo 2 || echo 1)
        timeout 900 shardwise train --model gpt2 --pp 2 --schedule "$SCHED" --vpp "$VPP" --global-batch 8 \
            --microbatches 8 --seq-len 1024 --steps 3 --backend nccl --timeout 120 --json > "$OUT/gpu-pp2-$SCHED.json"
        python3 - "$OUT/gpu-pp2-$SCHED.json" "$SCHED" <<'PY'
import json, math, sys
r = json.load(open(sys.argv[1]))
s = r["summary"]
msg = s["layout"]["micro_batch"] * 1024 * 768 * 2  # values per message x 2 bytes (bf16; fp32 is twice)
assert s["layout"]["pp"] == 2 and s["num_microbatches"] >= 4 and msg >= 2**20, s
assert all(math.isfinite(x["loss"]) for x in r["records"]), r["records"]
print(f"pp 2 {sys.argv[2]} on NCCL: {s['num_microbatches']} micro-batches, messages >= {msg / 2**20:.1f} MiB, "
      f"loss {s['first_loss']:.3f} -> {s['last_loss']:.3f}, median step {s['median_step_time_s'] * 1e3:.0f} ms: ok")
PY
    done
else
    echo "gpu_check: pipeline check skipped — pp 2 on NCCL needs 2 GPUs (one rank per GPU), found $GPUS"
fi
MODEL=${MODEL:-gpt2}
SEQ=${SEQ:-1024}
shardwise calibrate --backend nccl --world 1 --model "$MODEL" --seq-len "$SEQ" --micro-batch 2 \
    --out "$OUT/gpu-profile.toml" | tee "$OUT/gpu-calibrate.txt"
shardwise validate --backend nccl --world 1 --model "$MODEL" --seq-len "$SEQ" --global-batch 16 \
    --cluster "$OUT/gpu-profile.toml" --steps 5 --repeats 3 --plot "$OUT/gpu-accuracy.png" --json > "$OUT/gpu-validate.json"
python3 - "$OUT/gpu-validate.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for x in r["layouts"]:
    peak = x.get("measured_allocator_peak_bytes", 0) / 2**30
    print(f"{x['name']:32s} step predicted {x['predicted_step_time_s'] * 1e3:8.1f} ms measured {x['measured_step_time_s'] * 1e3:8.1f} ms"
          f" | states+saved predicted {x['predicted_memory_bytes'] / 2**30:.2f} GiB measured {x['measured_memory_bytes'] / 2**30:.2f} GiB"
          f" | allocator peak {peak:.2f} GiB vs planner total {x.get('predicted_total_bytes', 0) / 2**30:.2f} GiB")
print(json.dumps(r["summary"], indent=1))
PY
