#!/usr/bin/env bash
# Issue 6 on a GPU, one run of a few minutes: calibrate the GPU (NCCL, bf16), then validate a world-1
# sweep of gpt2 (micro-batch and recompute variants) — step time and memory, including
# torch.cuda.max_memory_allocated over a step against the planner's total. Skips cleanly without a GPU.
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
