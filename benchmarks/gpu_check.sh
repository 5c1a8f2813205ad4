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
#  3. (issue 9) the planner's kernel inputs measured on this GPU (benchmarks/gpu_kernels.py: GEMMs by shape,
#     the attention core, HBM traffic, a launch), to score planner/kernels.py against its own GPU.
#  4. (issue 9) a 1.3B Llama (nanotron's benchmark model, seq 4096) trained on one GPU and predicted from the
#     datasheet profile of this GPU (no calibration): the uncalibrated planner's absolute step time.
#  5. (issue 9) where that model's training step goes on this GPU (torch.profiler: GEMM, attention, the rest,
#     idle) and the SM clock under sustained matmuls (benchmarks/gpu_step_profile.py).
# Each part runs even if an earlier one failed; the script fails at the end if any did.
# Skips cleanly without a GPU.
#   OUT=dir PARTS="kernels pipeline gpt2 llama1b profile" benchmarks/gpu_check.sh   (defaults: benchmarks/out, all)
#   KERNELS_PARTS=memory,eager,gemm,attention: what part 3 measures (default all)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA GPU on this machine — skipped"
    exit 0
fi
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
FAILED=""
PARTS=" ${PARTS:-kernels pipeline gpt2 llama1b profile} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
# the datasheet profile of the GPU present (part 4 predicts from it, uncalibrated)
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
    *H200*) GPU_CLUSTER=dgx-h200 ;;
    *H100*) GPU_CLUSTER=dgx-h100-80gb ;;
    *A100*80GB*) GPU_CLUSTER=dgx-a100-80gb ;;
    *A100*) GPU_CLUSTER=dgx-a100-40gb ;;
    *) GPU_CLUSTER=dgx-h200 ;;
esac
KERNELS_CLUSTER=${KERNELS_CLUSTER:-$GPU_CLUSTER}
BIG=benchmarks/data/gpu_configs/llama-1.3b-nanotron.json
if part profile; then
    timeout 240 python3 benchmarks/gpu_step_profile.py --model "$BIG" --out "$OUT/gpu-step-profile.json" || FAILED="$FAILED profile"
fi
if part kernels; then
    timeout 300 python3 benchmarks/gpu_kernels.py --out "$OUT/gpu-kernels.json" --parts "${KERNELS_PARTS:-memory,eager,gemm,attention}" || FAILED="$FAILED kernels"
fi
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
if ! part pipeline; then
    :
elif [ "$GPUS" -ge 2 ]; then
    for SCHED in 1f1b interleaved-1f1b; do
        VPP=$([ "$SCHED" = interleaved-1f1b ] && echo 2 || echo 1)
        {  # a failure here is noted, and the later parts still run (set -e is off inside an || list)
        timeout 900 shardwise train --model gpt2 --pp 2 --schedule "$SCHED" --vpp "$VPP" --global-batch 8 \
            --microbatches 8 --seq-len 1024 --steps 3 --backend nccl --timeout 120 --json --trace "$OUT/trace-$SCHED" \
            > "$OUT/gpu-pp2-$SCHED.json" &&
        python3 - "$OUT/gpu-pp2-$SCHED.json" "$SCHED" <<'PY'
import json, math, sys
r = json.load(open(sys.argv[1]))
s = r["summary"]
msg = s["layout"]["micro_batch"] * 1024 * 768 * 2  # values per message x 2 bytes (bf16; fp32 is twice)
assert s["layout"]["pp"] == 2 and s["num_microbatches"] >= 4 and msg >= 2**20, s
assert all(math.isfinite(x["loss"]) for x in r["records"]), r["records"]
t = r["trace"]  # synchronised records: the measured bubble is work, not kernel launches
assert t and 0.0 < t["measured_bubble"] < 0.9, t
print(f"pp 2 {sys.argv[2]} on NCCL: {s['num_microbatches']} micro-batches, messages >= {msg / 2**20:.1f} MiB, "
      f"loss {s['first_loss']:.3f} -> {s['last_loss']:.3f}, median step {s['median_step_time_s'] * 1e3:.0f} ms: ok")
PY
        } || FAILED="$FAILED pipeline-$SCHED"
    done
else
    echo "gpu_check: pipeline check skipped — pp 2 on NCCL needs 2 GPUs (one rank per GPU), found $GPUS"
fi
MODEL=${MODEL:-gpt2}
SEQ=${SEQ:-1024}
part gpt2 && {
# validate times the model at one sequence and the host's floor again beside its sweep, to tell how far the machine's
# speed moved since the calibration (gpt2 is host-bound here, and a host's speed moves 20 % within minutes). Each step
# runs only if the one before it passed (set -e is off inside an || list): no stale profile of an earlier run is used.
rm -f "$OUT/gpu-profile.toml"
timeout 240 shardwise calibrate --backend nccl --world 1 --model "$MODEL" --seq-len "$SEQ" --micro-batch 1 \
    --out "$OUT/gpu-profile.toml" | tee "$OUT/gpu-calibrate.txt" &&
timeout 240 shardwise validate --backend nccl --world 1 --model "$MODEL" --seq-len "$SEQ" --global-batch 16 \
    --cluster "$OUT/gpu-profile.toml" --steps 5 --repeats 3 --plot "$OUT/gpu-accuracy.png" --json > "$OUT/gpu-validate.json" &&
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
} || { part gpt2 && FAILED="$FAILED gpt2-validate"; }
# two layouts: the sweep keeps every layout built, and four of this model's 20 GiB of FP32 states overfill an H100
part llama1b && { timeout 300 shardwise validate --backend nccl --world 1 --model "$BIG" --seq-len 4096 --global-batch 8 \
    --layouts dp1 dp1:full --cluster "$KERNELS_CLUSTER" --steps 3 --repeats 2 --json > "$OUT/gpu-validate-llama1b.json" || FAILED="$FAILED llama1b-validate"; }
part llama1b && python3 - "$OUT/gpu-validate-llama1b.json" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
for x in r["layouts"]:
    print(f"{x['name']:40s} step predicted {x['predicted_step_time_s'] * 1e3:8.1f} ms measured {x['measured_step_time_s'] * 1e3:8.1f} ms")
print(json.dumps(r["summary"]))
PY
true
if [ -n "$FAILED" ]; then echo "gpu_check: failed:$FAILED"; exit 1; fi
