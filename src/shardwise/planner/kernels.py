"""One GPU's kernels: a GEMM's time from its own shape, the attention core's, element-wise traffic.

Inputs are datasheet and kernel-measurement figures of the cluster (specs.ClusterSpec): SM count,
dense BF16 peak, the maximum achievable matmul rate (MAMF, Bekman's mamf-finder), HBM bandwidth.
Nothing here is fitted on training runs; docs/planner.md gives every constant with its source, and
tests/test_planner_kernels.py checks the GEMM model against the published MAMF measurements and the
quantization effects of NVIDIA's "Matrix Multiplication Background" guide.

GEMM (NVIDIA, "Matrix Multiplication Background User's Guide", Sec. 2-3): the output is cut into
Mt x Nt tiles, one thread block each; the GPU runs them in waves of one tile per SM. Time =
waves x (one tile's 2*Mt*Nt*K FLOPs at one SM's share of the achievable rate), or the time to move
the operands and the output through HBM if longer (small K: memory-bound), or a kernel launch if
longer still. cuBLAS picks the tile; we take the fastest of the tile shapes it uses.
"""

from __future__ import annotations

import math
from functools import lru_cache

from shardwise.specs import POWER_CURVES, ClusterSpec

# Tile shapes cuBLAS uses for large BF16 GEMMs (the guide, Sec. 2.3: 256x128 and 128x256 are the most
# efficient, then 128x128, 128x64/64x128, 64x64). A tile of at least 128x128 re-uses its operands
# enough to keep the tensor cores fed; a smaller one does Mt*Nt/(Mt+Nt) FLOP per operand byte, so
# runs at that share of the 128x128 tile's rate (42.7/64 = 2/3 for 128x64, 32/64 = 1/2 for 64x64).
TILES = ((256, 128, 1.0), (128, 256, 1.0), (128, 128, 1.0), (128, 64, 2 / 3), (64, 128, 2 / 3), (64, 64, 0.5))
# A kernel costs at least its launch: a few microseconds of host and driver work, hidden behind the
# previous kernel only when that one runs longer (NVIDIA, "Getting Started with CUDA Graphs", 2019).
KERNEL_LAUNCH_S = 4e-6
# Streaming kernels (copies, norms, element-wise) reach ~90 % of the datasheet HBM bandwidth
# (BabelStream / nvbandwidth copy figures on A100 and H100).
HBM_EFFICIENCY = 0.9
# Matmul efficiency when the cluster file gives no MAMF: the median of the NVIDIA rows of the MAMF table
# (A100 SXM 85.9 %, GH200 83.0 %, A100 PCIe 82.2 %, H100 SXM 80.1 %).
DEFAULT_MATMUL_EFFICIENCY = 0.826


# The one constant taken from training runs (benchmarks/published_runs.py fits it and prints every
# source's error with it fitted without that source): the share of the kernel benchmarks' tensor-core
# rates (MAMF, FlashAttention's curves) a whole training step sustains — clocks settle lower under a full
# node's sustained power and heat than in a single-GPU benchmark, and concurrent kernels (NCCL's,
# element-wise) share the SMs, L2 and HBM. A100's expectation from NVIDIA's own practice, the clock A100
# sustains at its power limit under dense tensor work (1305 MHz, vs the 1410 MHz of the 312 TFLOP/s
# peak: 0.93), is a cross-check (docs/planner.md).
# FP8 GEMMs have their own share ("hopper-fp8"): the FP8 tensor cores do twice the work per clock, and a node
# running them flat out sits deeper in its power limit, so its clocks settle lower than under BF16 work.
IN_SITU_EFFICIENCY = {"ampere": 0.81, "hopper": 0.78, "hopper-fp8": 0.71}


def in_situ(cluster: ClusterSpec, precision: str = "bf16") -> float:
    """The in-situ efficiency of `cluster`'s GPUs for BF16 work, or for its FP8 GEMMs (`precision` "fp8")."""
    key = situ_key(cluster.arch, precision)
    if key in IN_SITU_EFFICIENCY:
        return IN_SITU_EFFICIENCY[key]
    if precision == "fp8":
        return in_situ(cluster)
    bf16 = [v for k, v in IN_SITU_EFFICIENCY.items() if "-" not in k]
    return sum(bf16) / len(bf16)


def situ_key(arch: str, precision: str = "bf16") -> str:
    """The IN_SITU_EFFICIENCY entry of an architecture's BF16 work or FP8 GEMMs."""
    return f"{arch}-fp8" if precision == "fp8" else arch


@lru_cache(maxsize=64)  # read by every GEMM and attention time of the planner's inner loop
def power_share(cluster: ClusterSpec) -> float:
    """The share of its rated tensor-core rate a GPU keeps under its board power limit (`power_limit_w`; 1 at the rated
    TDP). Dynamic power goes as f·V² with the voltage rising with the clock, so P ~ f^n; n runs through the datasheet's
    two TDPs of one die (specs.POWER_CURVES: H100 SXM 700 W and NVL 400 W, 1,979 and 1,671 TFLOP/s: n = 3.31, near
    the cube law), and a limit P keeps (P / rated)^(1/n) of the clock — 0.903 at 500 W. HBM is clocked apart from the
    SMs (the 400 W NVL is rated at more bandwidth than the 700 W SXM), so memory-bound work keeps its rate."""
    if not cluster.power_limit_w or cluster.arch not in POWER_CURVES:
        return 1.0
    rated, low, share = POWER_CURVES[cluster.arch]
    n = math.log(rated / low) / math.log(1 / share)
    return min(1.0, cluster.power_limit_w / rated) ** (1 / n)


def mamf_rate(cluster: ClusterSpec) -> float:
    """The GPU's maximum achievable BF16 matmul FLOP/s, as a lone GEMM benchmark measures it (the cluster file's
    `mamf_tflops`, else DEFAULT_MATMUL_EFFICIENCY of its peak)."""
    return cluster.mamf_tflops * 1e12 if cluster.mamf_tflops else cluster.peak_flops * DEFAULT_MATMUL_EFFICIENCY


def matmul_rate(cluster: ClusterSpec, precision: str = "bf16") -> float:
    """Dense BF16 matmul FLOP/s of one GPU on a large, well-quantized GEMM inside a training step (of a job whose
    linears run in `precision`: a BF16 GEMM of an FP8 job runs at that job's in-situ share), under its power limit."""
    mamf = mamf_rate(cluster)
    return mamf * in_situ(cluster, precision) * power_share(cluster)


def hbm_rate(cluster: ClusterSpec) -> float:
    """Achieved HBM bandwidth of streaming kernels (a calibrated cluster's figure is already a measurement)."""
    return cluster.hbm_bandwidth * (1.0 if cluster.measured else HBM_EFFICIENCY)


# An FP8 GEMM's tile pays a fixed cost beside its main loop (filling the pipeline, converting and writing its
# output), which the main loop, half as long as BF16's, no longer hides: tilelang's FP8 GEMM of 8192 x 8192 x K on
# H800 SXM (H100's compute) takes 0.026 ms + K x 8.6e-5 us — 1,560 TFLOP/s asymptotically (0.79 of 1,979, BF16's
# MAMF share), 1,343 at K = 2048 — that is 1.6 us on each of its 16 waves (tilelang's
# benchmark/matmul_fp8/README.md, fork xwhzz/tilelang at 6b1faf71).
FP8_WAVE_S = 1.6e-6
# The same for BF16 on Hopper: tilelang's FP16 GEMM of 8192 x 8192 x K on H800 SXM takes 0.0286 ms + K x 1.735e-4 ms
# (K 8192: 1.450 ms, 16384: 2.871 ms; 773 TFLOP/s asymptotically, MAMF's rate) and more below (K 2048: 705 TFLOP/s,
# K 256: 386) — 1.8 us on each of its 16 waves (benchmark/matmul/README.md, same fork at b2acfc37). MAMF is measured
# at large K, where that cost is spread thin, so short-K GEMMs (a row-parallel GEMM's K = width / tp, a weight
# gradient's K = the micro-batch's tokens) lose it on top. No such table for Ampere: its GEMMs are timed at MAMF.
BF16_WAVE_S = {"hopper": 1.8e-6}
# cuBLAS runs a GEMM whose output tiles do not fill the SMs as stream-K (Osama et al. 2023, "Stream-K: Work-centric
# Parallel Decomposition for Dense Matrix-Matrix Multiplication on the GPU", PPoPP '23): every SM takes an equal share
# of the tiles' K iterations, so the GEMM takes tiles / SMs of a wave, not a whole one, and an SM that does not finish
# its tile writes its FP32 partial sums to a workspace the tile's last SM reads back (4 + 4 B per output element of each
# extra contributor: (SMs - tiles) / tiles of the output). Measured on an H200 (benchmarks/data/gpu/h200-kernels.json:
# the narrow weight-gradient GEMMs of TP shards at K = 16K, 32-96 tiles on 132 SMs, ran 20-24 % faster than whole
# waves of their best tile shape allow). Applied as measured: on Hopper, to one BF16 GEMM at a time (a batch of GEMMs,
# as a stack's local experts, and FP8 keep whole waves), where K is at least STREAM_K_MIN_K, the shortest K measured.
STREAM_K_ARCHS = ("hopper",)
STREAM_K_MIN_K = 4096
STREAM_K_FIXUP_BYTES = 8
# K of the shape the MAMF figure was measured at (Bekman's mamf-finder: A100 SXM 6912x16384x2048, H100 SXM
# 6144x17920x2816).
MAMF_K = {"ampere": 2048, "hopper": 2816}


@lru_cache(maxsize=1 << 16)
def _gemm(m: int, n: int, k: int, batch: int, sms: int, rate: float, hbm: float, in_bytes: float,
          out_bytes: float, wave_s: float = 0.0, stream_k: bool = False) -> float:
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    if sms:
        # stream-K as measured: one BF16 GEMM (not a batch of them, nor FP8: no table here), K deep enough
        fixup = STREAM_K_FIXUP_BYTES * m * n / hbm if stream_k and batch == 1 and k >= STREAM_K_MIN_K else None
        compute = min(_waves_time(batch * math.ceil(m / mt) * math.ceil(n / nt), 2 * mt * nt * k / (rate / sms * eff),
                                  wave_s, sms, fixup) for mt, nt, eff in TILES)
    else:
        compute = 2 * batch * m * n * k / rate
    memory = batch * (in_bytes * (m * k + k * n) + out_bytes * m * n) / hbm
    return max(compute, memory, KERNEL_LAUNCH_S)


def _waves_time(tiles: int, tile_s: float, wave_s: float, sms: int, fixup_s: float | None) -> float:
    """Seconds of `tiles` output tiles of `tile_s` each on `sms` SMs: whole waves (data-parallel), or, with a stream-K
    `fixup_s` (the output's FP32 partials written and read once) where the tiles leave SMs idle, the tiles' share of a
    wave plus the partials of the SMs that share a tile, whichever is faster (cuBLAS's heuristic picks)."""
    whole = math.ceil(tiles / sms) * (tile_s + wave_s)
    if fixup_s is None or not 0 < tiles < sms:
        return whole
    return min(whole, tiles / sms * tile_s + wave_s + fixup_s * (sms - tiles) / tiles)


def gemm_time(cluster: ClusterSpec, m: int, n: int, k: int, batch: int = 1, in_bytes: float = 2,
              out_bytes: float = 2, fp8: bool = False, precision: str = "bf16") -> float:
    """Seconds for `batch` GEMMs C[m,n] = A[m,k] B[k,n] (BF16 inputs; out_bytes per output element
    moved through HBM: 2 for a BF16 output, 8 when accumulating into an FP32 gradient buffer). `fp8`: FP8
    inputs (1 byte) on the FP8 tensor cores, which sustain the same share of their peak as BF16 ones
    (`fp8_rate`). `precision`: the job's (a BF16 GEMM of an FP8 job runs at the FP8 job's in-situ share)."""
    if fp8:  # a wave's fixed cost is clock cycles too: a power limit stretches it with the main loop
        rate, wave_s = fp8_rate(cluster), FP8_WAVE_S / power_share(cluster)
    else:
        rate, wave_s = main_loop_rate(cluster, matmul_rate(cluster, precision))
    return _gemm(int(m), int(n), int(k), int(batch), cluster.sm_count, rate, hbm_rate(cluster),
                 1 if fp8 else in_bytes, out_bytes, wave_s, cluster.arch in STREAM_K_ARCHS and not fp8)


def benchmark_gemm_time(cluster: ClusterSpec, m: int, n: int, k: int) -> float:
    """Seconds of one BF16 GEMM timed alone on one GPU, as a GEMM benchmark times it: the model of gemm_time at MAMF's
    own rate, without the in-situ share a whole training step keeps (benchmarks/gpu_kernels.py scores this against a
    GPU's measured GEMMs)."""
    mamf = mamf_rate(cluster)
    rate, wave_s = main_loop_rate(cluster, mamf * power_share(cluster))
    return _gemm(int(m), int(n), int(k), 1, cluster.sm_count, rate, hbm_rate(cluster), 2, 2, wave_s,
                 cluster.arch in STREAM_K_ARCHS)


def main_loop_rate(cluster: ClusterSpec, rate: float) -> tuple[float, float]:
    """(the main loop's FLOP/s, the fixed seconds per wave) of BF16 GEMMs: MAMF was measured at one shape, K =
    MAMF_K, where each wave of 256 x 128 tiles already paid BF16_WAVE_S; the main loop runs that much faster, so the
    measured shape keeps MAMF's rate and other K gain or lose the wave's fixed cost (clock cycles: a power limit
    stretches it as it does the main loop)."""
    wave_s = BF16_WAVE_S.get(cluster.arch, 0.0) / power_share(cluster)
    k = MAMF_K.get(cluster.arch)
    if not wave_s or not k or not cluster.sm_count:
        return rate, 0.0
    wave = 2 * 256 * 128 * k / (rate / cluster.sm_count)
    return rate * wave / (wave - wave_s), wave_s


def fp8_rate(cluster: ClusterSpec) -> float:
    """Dense FP8 matmul FLOP/s inside a training step: the FP8 peak at the share of peak the BF16 matmuls
    sustain (the same tensor cores at the same clocks, each FP8 instruction twice the BF16 one's work; a
    cuBLASLt FP8 GEMM of 8192^3 on H100 SXM runs ~1,600 TFLOP/s, 0.81 of 1,979, beside BF16's MAMF share 0.80)."""
    mamf = mamf_rate(cluster)
    return mamf * in_situ(cluster, "fp8") * power_share(cluster) * cluster.fp8_flops / cluster.peak_flops


def gemm_tflops(cluster: ClusterSpec, m: int, n: int, k: int) -> float:
    """Achieved TFLOP/s of one GEMM in this model (what a throughput curve by shape plots)."""
    return 2 * m * n * k / gemm_time(cluster, m, n, k) / 1e12


# --------------------------------------------------------------------------- attention core

# Fused attention kernels, measured on one H100 SXM5 in BF16 (Shah et al. 2024, FlashAttention-3, Fig. 5: forward,
# 16K-token batches, 2048-wide heads, sequence length 512 to 16K), TFLOP/s counting FLOPs as FlashAttention does
# (forward 4*s^2*d per head, backward 2.5x forward, causal masking halving both), by head dim: the causal curve, then
# the one without the mask (FlashAttention-3 at head dim 256, 1K without the mask: its label is under the legend, read
# off the bar's height). The masked kernel skips the tiles above the diagonal but pays the diagonal's partial tiles
# and every query block's set-up over half as many key blocks, so it gains on the unmasked one with length: 0.63 of
# its rate at 512, 0.91 (cuDNN) to 0.95 (FA3) at 16K.
_FWD_H100 = {
    "fa2": {64: ((180, 229, 262, 284, 295, 299), (282, 306, 318, 321, 322, 324)),
            128: ((191, 260, 298, 319, 333, 335), (309, 350, 362, 366, 370, 370)),
            256: ((208, 251, 278, 293, 297, 298), (275, 313, 321, 323, 324, 326))},
    "cudnn": {64: ((225, 288, 334, 363, 379, 388), (335, 373, 395, 408, 412, 413)),
              128: ((315, 410, 484, 518, 529, 539), (497, 574, 617, 609, 600, 595)),
              256: ((308, 391, 450, 483, 497, 509), (470, 546, 580, 581, 580, 581))},
    "fa3": {64: ((197, 265, 371, 420, 460, 473), (333, 392, 460, 476, 496, 497)),
            128: ((292, 423, 521, 579, 602, 616), (467, 565, 625, 638, 646, 648)),
            256: ((286, 427, 537, 612, 628, 642), (482, 628, 707, 736, 746, 756))},
}
# Backward without the mask at 16K (Fig. 6, head dims 64 and 128; head dim 256 at head dim 128's backward / forward
# ratio). The paper plots the backward without the mask only.
_BWD_H100_16K = {"fa2": {64: 291, 128: 322}, "cudnn": {64: 433, 128: 516}, "fa3": {64: 474, 128: 561}}
# cuDNN's own benchmark (cudnn-frontend benchmark/benchmark_results.csv at b740542, cuDNN 9.1, one Hopper GPU, 16K
# tokens per batch to 16K, then b 1; 16 heads of 128) measured cuDNN and PyTorch's FlashAttention-2 from 4K to 64K:
# TFLOP/s forward causal, backward causal, forward unmasked, backward unmasked. It carries each curve past 16K at its
# own ratio to 16K, and gives the backward its own shape from 4K (the unmasked backward from Fig. 6's 16K figure at
# this benchmark's ratios, the causal one at this benchmark's causal / unmasked ratio); below 4K, and for
# FlashAttention-3 (not measured here: held at 16K past it), the backward follows its forward's curve. Past 16K
# cuDNN's masked rate does not rise (586.8, 577.3, 567.0): its gap to the unmasked kernel narrows (0.91 -> 0.94)
# because the unmasked one falls (641.9, 612.6, 602.2). FlashAttention-2's masked backward catches up with its
# unmasked one by 16K (0.99), its forward does not (0.91).
ATTENTION_SEQS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_CUDNN_FRONTEND = {
    "cudnn": {4096: (542.32, 443.60, 654.15, 517.25), 8192: (572.86, 463.54, 668.70, 530.37),
              16384: (586.82, 497.68, 641.91, 538.46), 32768: (577.35, 499.66, 612.56, 536.23),
              65536: (567.02, 503.81, 602.15, 535.41)},
    "fa2": {4096: (314.06, 248.76, 354.24, 287.36), 8192: (325.14, 277.44, 355.40, 303.29),
            16384: (324.77, 305.18, 357.15, 308.87), 32768: (345.30, 317.28, 349.25, 312.49),
            65536: (342.65, 323.16, 353.12, 321.91)},
}
# cuDNN's fused attention is what Transformer Engine runs on Hopper (TE 1.4's DotProductAttention: "Select
# FusedAttention on sm90 and FlashAttention on others for performance"; its context parallelism calls the same
# kernel per ring step), so Megatron-Core and NeMo attend at cuDNN's rates there; FlashAttention-3 only where a
# stack calls it directly.
# Ampere: FlashAttention-2, "up to 73 % of the theoretical max in the forward pass, 63 % in the backward" (Dao 2023,
# Sec. 4.1, A100, head dim 128 without the mask), taken to causal masking, lengths and other head dims at the same
# kernel's ratios on H100 above.
_H100_PEAK = 989.0


def _curves(kernel: str) -> dict:
    """{head dim: (forward causal, backward causal, forward no-mask, backward no-mask)}, each a curve over
    ATTENTION_SEQS as a share of H100's peak."""
    seqs, i16 = ATTENTION_SEQS, ATTENTION_SEQS.index(16384)
    bench = _CUDNN_FRONTEND.get(kernel, {})
    past = lambda col: [bench[s][col] / bench[16384][col] if bench else 1.0 for s in seqs[i16 + 1:]]
    out = {}
    for d, (fc, fnc) in _FWD_H100[kernel].items():
        bwd16 = _BWD_H100_16K[kernel]
        b16 = bwd16[d] if d in bwd16 else fnc[-1] * bwd16[128] / _FWD_H100[kernel][128][1][-1]
        fc, fnc = [*fc, *(fc[-1] * r for r in past(0))], [*fnc, *(fnc[-1] * r for r in past(2))]
        if bench:  # the backward's own shape from 4K, its forward's below
            bnc = {s: b16 * bench[s][3] / bench[16384][3] for s in bench}
            bc = {s: bnc[s] * bench[s][1] / bench[s][3] for s in bench}
            first = seqs.index(min(bench))
            bnc = [bnc.get(s, bnc[seqs[first]] * fnc[i] / fnc[first]) for i, s in enumerate(seqs)]
            bc = [bc.get(s, bc[seqs[first]] * fc[i] / fc[first]) for i, s in enumerate(seqs)]
        else:
            bnc = [b16 * x / fnc[i16] for x in fnc]
            bc = [y * x / z for x, y, z in zip(fc, bnc, fnc)]
        out[d] = tuple(tuple(x / _H100_PEAK for x in curve) for curve in (fc, bc, fnc, bnc))
    return out


def _scaled(table: dict, fwd: float, bwd: float) -> dict:
    """`table` with its head-dim-128 curves' 16K values without the mask moved to (fwd, bwd), every curve with them."""
    i16 = ATTENTION_SEQS.index(16384)
    f16, b16 = table[128][2][i16], table[128][3][i16]
    return {d: tuple(tuple(x * (fwd / f16, bwd / b16)[i % 2] for x in curve) for i, curve in enumerate(v))
            for d, v in table.items()}


# Forward + backward together on A100, TFLOP/s, per kernel, (causal, head dim), at 512, 1K, 2K, 4K, 8K and 16K tokens
# (batches of 16K tokens, 2048-wide heads): Dao 2023, FlashAttention-2, Fig. 4 (A100 80GB SXM4), the bars' printed
# labels (Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png; the two FlashAttention-2 labels its legend
# hides, no mask at head dim 128, 512 and 1K, read off the bars: 151, 173). "xformers" is xformers' memory-efficient
# attention.
_FWD_BWD_A100 = {
    "fa2": {(False, 64): (132, 153, 162, 171, 175, 176), (False, 128): (151, 173, 187, 196, 201, 203),
            (True, 64): (88, 119, 140, 156, 165, 171), (True, 128): (99, 133, 155, 173, 182, 189)},
    "fa1": {(False, 64): (91, 92, 104, 108, 110, 110), (False, 128): (76, 72, 76, 80, 82, 83),
            (True, 64): (58, 70, 77, 87, 92, 97), (True, 128): (55, 62, 69, 76, 80, 83)},
    "xformers": {(False, 64): (68, 73, 76, 77, 75, 75), (False, 128): (83, 91, 95, 96, 97, 98),
                 (True, 64): (51, 60, 66, 68, 69, 67), (True, 128): (58, 72, 82, 87, 91, 92)},
}


def _fig_ratio(kernel: str, causal: bool, head_dim: int) -> list[float]:
    """`kernel`'s forward + backward rate over FlashAttention-2's in the FlashAttention-2 paper's A100 figure, at each
    of ATTENTION_SEQS (the 16K ratio beyond)."""
    num, den = _FWD_BWD_A100[kernel][(causal, head_dim)], _FWD_BWD_A100["fa2"][(causal, head_dim)]
    ratio = [a / b for a, b in zip(num, den)]
    return ratio + [ratio[-1]] * (len(ATTENTION_SEQS) - len(ratio))


def _relative(fa2: dict, kernel: str) -> dict:
    """FlashAttention-2's curves times `kernel`'s measured ratio to it, by mask, head dim (head dim 256 at 128's
    ratios) and length. The figure times forward and backward together: both take the same ratio."""
    out = {}
    for d, curves in fa2.items():
        near = 64 if d <= 64 else 128
        ratios = (_fig_ratio(kernel, True, near), _fig_ratio(kernel, False, near))
        out[d] = tuple(tuple(x * r for x, r in zip(curve, ratios[i // 2])) for i, curve in enumerate(curves))
    return out


_FA2_H100 = _curves("fa2")
# A100: Dao 2023's non-causal head-dim-128 maxima (Sec. 4.1: "up to 73 % of the theoretical max in the forward pass, 63 %
# in the backward"), at FlashAttention-2's H100 ratios between the entries (within 5 % of Fig. 4's A100 bars from 1K).
_FA2_A100 = _scaled(_FA2_H100, 0.73, 0.63)
ATTENTION_EFFICIENCY = {
    ("fa2", "hopper"): _FA2_H100,
    ("cudnn", "hopper"): _curves("cudnn"),
    ("fa3", "hopper"): _curves("fa3"),
    ("fa2", "ampere"): _FA2_A100,
    # FlashAttention-1 and xformers: FlashAttention-2's curves at their measured ratio to it (FlashAttention-1 at head
    # dim 128 runs 0.41-0.55 of FlashAttention-2's rate on A100, at head dim 64 0.57-0.69).
    **{(k, "ampere"): _relative(_FA2_A100, k) for k in ("fa1", "xformers")},
}
# Kernel each attention family runs per architecture: "te" is Transformer Engine's choice (cuDNN on Hopper,
# FlashAttention-2 on Ampere), "fa3" FlashAttention-3 where it exists, "fa2" FlashAttention-2 (PyTorch SDPA), "fa1"
# FlashAttention-1 and "xformers" (2022-23 stacks; FlashAttention-2 on Hopper, which those stacks never ran on).
ATTENTION_KERNEL = {"te": {"hopper": "cudnn", "ampere": "fa2"}, "fa3": {"hopper": "fa3", "ampere": "fa2"},
                    "fa2": {"hopper": "fa2", "ampere": "fa2"}, "fa1": {"hopper": "fa2", "ampere": "fa1"},
                    "xformers": {"hopper": "fa2", "ampere": "xformers"},
                    # torch's SDPA as of 2.11: cuDNN first on sm90 (PyTorch sdp_utils.cpp check_prefer_cudnn_attention,
                    # gated on the bundled cuDNN > 9.15), FlashAttention-2 on Ampere
                    "sdpa": {"hopper": "cudnn", "ampere": "fa2"}}
# The attention families whose kernels take a sliding window and skip the key blocks outside it: flash-attn from 2.3
# (window_size=(left, right), "local (sliding window) attention": Dao-AILab/flash-attention v2.3.0, 2023-10), and so
# FlashAttention-3, Transformer Engine's DotProductAttention(window_size=...) (Megatron-Core's --window-size; its
# flash-attn and cuDNN backends) and xformers' local-attention biases; "fa2" also stands for torchtitan, whose windowed
# models (GPT-OSS) attend through FlexAttention's sliding-window block mask, which skips the blocks outside it too.
# Not: FlashAttention-1 (no window), torch's SDPA (no window argument: a windowed boolean mask sends it from its flash
# and cuDNN kernels to the memory-efficient one, which visits every block) or a materialised softmax (the masked
# s x s scores, whole).
WINDOW_FAMILIES = frozenset({"te", "fa2", "fa3", "xformers"})
# The attention families whose fused kernels soft-cap the logits (Gemma 2's cap * tanh(logit / cap)): flash-attn from
# 2.6 (flash_attn_func(..., softcap=), added for Gemma 2 in 2024-07) and FlashAttention-3; "fa2" also stands for
# torchtitan, whose models with a score modifier attend through FlexAttention (score_mod). Transformer Engine's
# DotProductAttention takes a softcap only since NVIDIA/TransformerEngine #3391 (2026-08), through its FA2/FA3 backends:
# cuDNN's FusedAttention is disqualified by it; Megatron-Core passes it (attn_logit_softcapping, NVIDIA/Megatron-LM
# #6590) only on Megatron-Bridge's opt-in Gemma 2 path (NVIDIA-NeMo/Megatron-Bridge #5628), the default one running
# its unfused attention: so "te" is not here, and --attention-backend flash (Job.attention "fa2") prices the opt-in
# path. Not either: torch's SDPA (no argument for it), xformers, FlashAttention-1. Where the stack's kernel cannot,
# its layers run a materialised softmax (job.softcap_unfused), scores and all.
SOFTCAP_FAMILIES = frozenset({"fa2", "fa3"})
# A materialised softmax (no fused kernel) moves the s x s scores through HBM, in units of one score
# in activation precision, per pass: Megatron's fused scale-mask-softmax reads scores and writes
# probabilities (2); dropout reads them and writes its output and a 1-byte mask (2 + 1/e). Backward:
# dropout's gradient (read gradient and mask, write: 2 + 1/e), softmax's (read probabilities and
# gradient, write: 3).
SOFTMAX_PASSES = (2, 3)
DROPOUT_PASSES = (2, 2)


def _along(curve: tuple, seq: float) -> float:
    """A measured curve at key length `seq`: log-linear between ATTENTION_SEQS, the end values beyond them."""
    seqs = ATTENTION_SEQS
    if seq <= seqs[0] or seq >= seqs[-1]:
        return curve[0] if seq <= seqs[0] else curve[-1]
    i = next(i for i, x in enumerate(seqs) if x >= seq)
    w = math.log2(seq / seqs[i - 1]) / math.log2(seqs[i] / seqs[i - 1])
    return (1 - w) * curve[i - 1] + w * curve[i]


def attention_efficiency(kernel: str, arch: str, seq_q: int, seq_kv: int, head_dim: int, causal: bool = True
                         ) -> tuple[float, float]:
    """(forward, backward) share of peak of a fused attention kernel on this shape: the measured curves at the key
    length (each query block's inner loop over the keys) and head dim (log-linear between 64, 128 and 256, the end
    points beyond)."""
    table = ATTENTION_EFFICIENCY.get((kernel, arch), ATTENTION_EFFICIENCY[("fa2", "ampere")])
    dims = sorted(table)
    d = min(max(head_dim, dims[0]), dims[-1])
    hi = next(x for x in dims if x >= d)
    lo = max(x for x in dims if x <= d)
    w = 0.0 if hi == lo else math.log2(d / lo) / math.log2(hi / lo)
    col = 0 if causal else 2
    return tuple((1 - w) * _along(table[lo][col + i], seq_kv) + w * _along(table[hi][col + i], seq_kv) for i in (0, 1))


# FlashAttention-2 compiles its kernels for head dims 32, 64, 96, 128, 160, 192, 224 and 256 and runs any other in the
# next one up (flash-attn 2.0 csrc/flash_attn/src/static_switch.h FWD_HEADDIM_SWITCH: `if (HEADDIM <= 32) kHeadDim = 32;
# else if (HEADDIM <= 64) ...`; flash_api.cpp rounds the head size up to a multiple of 8 and pads): a head dim of 80 runs
# the 96 kernel, whose tiles do 96 columns of work for 80 of result.
FA2_HEAD_DIMS = (32, 64, 96, 128, 160, 192, 224, 256)
# FlashAttention-1 (flash-attn 0.2.x, the release GPT-NeoX v1.0 pinned) compiles three: fmha_api.cpp run_fmha_fwd and
# run_fmha_bwd at v0.2.2 dispatch `d <= 32`, `d <= 64`, `d <= 128` (mha_fwd checks head_size % 8 == 0 and <= 128): a
# head dim of 80 (Pythia 2.8B's 2,560 / 32) runs the 128 kernel.
FA1_HEAD_DIMS = (32, 64, 128)
COMPILED_HEAD_DIMS = {"fa2": FA2_HEAD_DIMS, "fa1": FA1_HEAD_DIMS}


def kernel_head_dim(kernel: str, head_dim: float) -> float:
    """The head dim the kernel's tiles run at for heads of `head_dim` (the kernel's next compiled size, for the
    FlashAttention releases that compile a few: COMPILED_HEAD_DIMS)."""
    sizes = COMPILED_HEAD_DIMS.get(kernel, ())
    return next((d for d in sizes if d >= head_dim), head_dim)


def fused_attention_time(cluster: ClusterSpec, kernel: str, tokens: int, seq_kv: int, heads: int, head_dim: int,
                         precision: str = "bf16", causal: bool = True, loop: float | None = None
                         ) -> tuple[float, float]:
    """(forward, backward) seconds of a fused attention kernel over `tokens` query tokens attending to `seq_kv`
    keys each, `heads` heads on this GPU; causal (query i sees keys up to i: half the blocks) or unmasked. `loop`:
    the key length the kernel's rate is read at, when these keys are part of a longer loop (default `seq_kv`)."""
    tile = kernel_head_dim(kernel, head_dim)  # the work the kernel does: its compiled head dim
    flops = 4 * tokens * seq_kv * tile * heads / (2 if causal else 1)
    eff_f, eff_b = attention_efficiency(kernel, cluster.arch or "ampere", tokens, loop or seq_kv, tile, causal)
    peak = cluster.peak_flops * in_situ(cluster, precision) * power_share(cluster)
    return max(flops / (peak * eff_f), KERNEL_LAUNCH_S), max(2.5 * flops / (peak * eff_b), KERNEL_LAUNCH_S)


def band_attention_time(cluster: ClusterSpec, kernel: str, tokens: int, seq: int, window: int, heads: int,
                        head_dim: int, precision: str = "bf16") -> tuple[float, float]:
    """(forward, backward) seconds of causal attention inside a sliding window of `window` keys over sequences of
    `seq` (> window) tokens, by a kernel that skips the blocks outside it: query i attends to keys i - window + 1 .. i,
    w s - w (w - 1) / 2 pairs a sequence where causal attention has s^2 / 2. Timed as causal attention over
    2w - w^2 / s keys (the same pairs) at the rate of a causal kernel over w keys: each query block's loop visits about
    w keys with a partly masked block at each end of the band, as a causal loop over w keys visits w / 2 on average
    with one."""
    keys = 2 * window - window * window / seq
    return fused_attention_time(cluster, kernel, tokens, keys, heads, head_dim, precision, loop=window)


# A ring merges each step's partial result outside the attention kernel, in HBM passes over the step's rows; bytes
# per element of the step's queries (output, dQ) and of its K and V rows (dK/dV), `e` the activation bytes:
#   "te"    Transformer Engine's AttnFuncWithCPAndKVP2P (TE 1.4 to 2.x), in the activation dtype: the output
#           correction reads the step's output and the running one and writes it (3e); dQ accumulated (3e); the
#           step's dK and dV concatenated and added to the block received (2e + 3e); a step on half a block first
#           copies that half out (`.contiguous()`, 2e): the K/V half, or the query half (in backward the output and
#           its gradient's halves too).
#   "torch" torch's context_parallel (_templated_ring_attention, _SDPAMerger with convert_to_f32, the default) in
#           FP32: the step's output cast (e + 4), `out - sigmoid(lse diff) * (out - block)` as eager ops (12 + 8 +
#           12); dQ and dK/dV accumulated in FP32 (e + 4 + 4 each), the dK/dV send buffer concatenated (4 + 4), the
#           K/V send buffer concatenated each forward step (2e); halves are views.
#   "shardwise" this project's RingAttention in FP32: _merge (out.mul_ 8, the block times its weight e + 4, add_ 12),
#           dQ accumulated (e + 8), dK/dV added on the step's keys (e + 8) and, over the whole local block each step,
#           zeroed (4) and added to the received (12: `dkv_block`, per element of the local K/V); K/V stacked once.
def ring_merge_bytes(stack: str, e: float) -> dict:
    """Bytes per element of a ring step's merge passes (see above): out, dq per query element; dkv per K or V element;
    slice per element copied out of a half block; kv_send per K or V element; dkv_block ("shardwise") per element of
    the rank's whole local K/V."""
    if stack == "torch":
        return {"out": e + 4 + 32, "dq": e + 8, "dkv": e + 8 + 8, "slice": 0, "kv_send": 2 * e}
    if stack == "shardwise":  # parallel/context_parallel.py RingAttention: an FP32 output, dQ and dK/dV; K/V stacked once
        # _merge: out.mul_ (8), block * exp (e + 4), add_ (12); dq += (e + 8); dK/dV += the block's on its keys (e + 8),
        # and on the whole local block each step: zeros (4), += the received (12)
        return {"out": e + 24, "dq": e + 8, "dkv": e + 8, "slice": 0, "kv_send": 0, "dkv_block": 16}
    return {"out": 3 * e, "dq": 3 * e, "dkv": 5 * e, "slice": 2 * e, "kv_send": 0}


# Ranks whose chunks cp_attention_time's all-gather scheme times one by one; beyond, that many evenly spaced.
CP_RANKS_TIMED = 64


def cp_attention_time(cluster: ClusterSpec, kernel: str, batch: int, seq: int, cp: int, scheme: str, heads: int,
                      head_dim: int, precision: str = "bf16", kv_width: float = 0.0, e: int = 2, stack: str = "te"
                      ) -> tuple[float, float]:
    """(forward, backward) seconds of one rank's causal attention under context parallelism over `cp` ranks with
    the zig-zag split (rank r holds chunks r and 2cp-1-r of 2cp), as the kernels really run it:

    "ring": the load-balanced ring of Transformer Engine's p2p context parallelism (AttnFuncWithCPAndKVP2P) and
    torch's context_parallel (_templated_ring_attention, either rotate method): step 0 attends the local s/cp
    tokens to themselves with the causal mask; each of the cp-1 others without a mask, either every local query
    against the first half of a block from an earlier rank, or the second query half against a whole block from a
    later rank (s/cp x s/2cp either way); each step's result merged in HBM passes as `stack` does it
    (ring_merge_bytes; K and V `kv_width` elements per token on this GPU, `e` bytes each). The ring is synchronous:
    a step lasts as long as its slower kind.
    "chunks": the all-gather of Transformer Engine (AttnFuncWithCPAndKVAllGather) and Llama 3: each local chunk j
    attends to the j chunks before it without a mask and to itself with it, as one kernel; the slowest rank sets
    the pace.
    `kernel` "math": shardwise's FP32 math blocks on a GPU (math_attention_time), each block computed whole."""
    def f(q: float, kv: float, causal: bool, loop: float | None = None) -> tuple[float, float]:
        if kernel == "math":  # shardwise's runtime on a GPU (math_attention_time)
            return math_attention_time(cluster, batch * q, kv, heads, head_dim, causal)
        return fused_attention_time(cluster, kernel, batch * q, kv, heads, head_dim, precision, causal, loop)

    if scheme == "ring":
        local = seq / cp

        def step(q: float, kv: float, causal: bool) -> tuple[float, float]:
            m, qw, kw = ring_merge_bytes(stack, e), q * heads * head_dim, kv * 2 * kv_width
            half = kw if kv < q else qw if q < kv else 0  # the half block copied out, if any
            merge_f = m["out"] * qw + m["slice"] * half + m["kv_send"] * local * 2 * kv_width  # the whole block sent on
            merge_b = (m["dq"] * qw + m["dkv"] * kw + m["slice"] * (3 * half if q < kv else half)
                       + m.get("dkv_block", 0) * local * 2 * kv_width)
            return tuple(t + batch * x / hbm_rate(cluster) for t, x in zip(f(q, kv, causal), (merge_f, merge_b)))

        steps = [max(a, b) for a, b in zip(step(local, local / 2, False), step(local / 2, local, False))]
        return tuple(d + (cp - 1) * x for d, x in zip(step(local, local, True), steps))
    c = seq / (2 * cp)

    def chunk(j: int) -> tuple[float, float]:
        tri = f(c, c, True)  # the masked diagonal; the j chunks before it unmasked, in the same key loop
        return tri if j == 0 else tuple(a + b for a, b in zip(tri, f(c, j * c, False, (j + 1) * c)))

    # Every rank's pair of chunks reaches back 2cp - 1 chunks in all; which rank is slowest follows from how the
    # kernel's rate varies with the key length, smoothly in r. Up to CP_RANKS_TIMED ranks each is timed; beyond, that
    # many evenly spaced (both ends among them), so the cost stays bounded whatever cp a search or a user names.
    timed = range(cp) if cp <= CP_RANKS_TIMED else sorted({round(i * (cp - 1) / (CP_RANKS_TIMED - 1))
                                                            for i in range(CP_RANKS_TIMED)})
    ranks = [tuple(a + b for a, b in zip(chunk(r), chunk(2 * cp - 1 - r))) for r in timed]
    return tuple(max(x[i] for x in ranks) for i in (0, 1))


# FP32 FLOP/s of a GPU's CUDA cores (torch's default FP32 matmul: TF32 off, no tensor cores) as a share of its dense
# BF16 tensor-core peak at the same clock: per SM, GA100's 64 FP32 lanes (2 FLOP each a clock) against 2,048 dense BF16
# tensor FLOP a clock, GH100's 128 against 4,096 (NVIDIA A100 and H100 whitepapers): 1/16 on both.
FP32_SIMT_SHARE = 1 / 16
# HBM bytes per FP32 score of shardwise's context-parallel math blocks (parallel/context_parallel.math_block_forward /
# math_block_backward), each op reading its inputs and writing its output once. Forward: QK^T written (4), scaled (read
# and write, 8), torch.logsumexp (its amax read 4, s - max read and written 8, exp_ 8, sum read 4: 24), s - lse (8) and
# its exp (8), read by P.V (4) = 56. Backward: the
# scores again (4 + 8), s - lse and exp (16), P read by dV (4), dP written (4), dP - D (8), P * (dP - D) (12), dS read by
# dQ and dK (8) = 64. A causal block (the diagonal) masks its scores first: a boolean mask read and the scores read and
# written (9), in each pass.
MATH_SCORE_BYTES = (56, 64)
MATH_MASK_BYTES = 9
# Scores-sized FP32 tensors alive at once in math_block_backward (s, P, dP, dP - D and dS), the peak of either pass.
MATH_SCORE_TENSORS = 5


def math_attention_flops(tokens: float, seq_kv: float, heads: int, head_dim: float) -> tuple[float, float]:
    """(forward, backward) matmul FLOPs of one math block: QK^T and P.V forward; backward the scores again, dV, dP, dQ
    and dK, the whole tokens x seq_kv block (a causal one is masked after its product, not skipped)."""
    one = 2 * tokens * seq_kv * head_dim * heads
    return 2 * one, 5 * one


def math_attention_time(cluster: ClusterSpec, tokens: float, seq_kv: float, heads: int, head_dim: float,
                        causal: bool) -> tuple[float, float]:
    """(forward, backward) seconds of one context-parallel block of shardwise's runtime on a GPU: its matmuls in FP32
    on the CUDA cores (FP32_SIMT_SHARE of the peak, at the share of it the BF16 GEMMs keep in a step: cuBLAS's SGEMM
    may keep more of its own, so this errs slow) and its FP32 passes over the scores at HBM bandwidth
    (MATH_SCORE_BYTES). Not counted: the per-step FP32 casts of q, k, v (and GQA's repeated K/V), under 1 % of the
    score passes for blocks of 8K keys or more."""
    rate = matmul_rate(cluster) * FP32_SIMT_SHARE
    scores = tokens * seq_kv * heads
    extra = MATH_MASK_BYTES if causal else 0
    return tuple(flops / rate + scores * (per + extra) / hbm_rate(cluster)
                 for flops, per in zip(math_attention_flops(tokens, seq_kv, heads, head_dim), MATH_SCORE_BYTES))


def unfused_attention_time(cluster: ClusterSpec, batch: int, seq: int, seq_kv: int, heads: int, head_dim: int,
                           e: int, dropout: bool) -> tuple[float, float]:
    """(forward, backward) seconds of the attention core as batched GEMMs around a materialised
    softmax (Megatron-LM before fused attention): QK^T and softmax.V in forward; in backward the
    gradients of both inputs of each (four GEMMs); the full s x s scores, causal or not."""
    n = batch * heads
    scores = gemm_time(cluster, seq, seq_kv, head_dim, n)  # Q K^T
    context = gemm_time(cluster, seq, head_dim, seq_kv, n)  # P V
    fwd = scores + context
    bwd = gemm_time(cluster, seq_kv, head_dim, seq, n) + gemm_time(cluster, seq, seq_kv, head_dim, n)  # dV, dP
    bwd += gemm_time(cluster, seq, head_dim, seq_kv, n) + gemm_time(cluster, seq_kv, head_dim, seq, n)  # dQ, dK
    score_bytes = n * seq * seq_kv * e
    f_passes, b_passes = SOFTMAX_PASSES
    if dropout:
        f_passes += DROPOUT_PASSES[0] + 1 / e
        b_passes += DROPOUT_PASSES[1] + 1 / e
    return fwd + f_passes * score_bytes / hbm_rate(cluster), bwd + b_passes * score_bytes / hbm_rate(cluster)


# --------------------------------------------------------------------------- FP8 scaling

# Bytes moved per element to quantize a GEMM operand to FP8 with per-tensor scaling, by recipe:
#   "te"      Transformer Engine's delayed scaling (NeMo, Megatron-Core): one fused cast-transpose kernel reads the
#             BF16 tensor (2) and writes its FP8 copy and the transposed FP8 copy Hopper's FP8 GEMMs need for the
#             other two products (1 + 1); the amax is taken in the same kernel, the scale from last step's history
#             (transformer_engine/pytorch/module/linear.py, cpp_extensions cast_transpose).
#   "torchao" torchao's Float8Linear with dynamic tensor-wise scaling (torchtitan): an amax reduction reads the tensor
#             first (2), then the cast and its transpose (2 + 1 + 1), as separate eager kernels.
FP8_CAST_BYTES = {"te": 4, "torchao": 6}
FP8_CAST_KERNELS = {"te": 1, "torchao": 3}
# torchao under torch.compile: Inductor takes the amax in the kernel that produces the tensor, so the cast costs its
# one cast-and-transpose pass (read 2, write 1 + 1), and two launches (the amax's final reduction, the cast) — where
# the producer is itself an Inductor kernel (a norm, silu(gate) * up, a residual add's gradient, RoPE's backward), not
# a library call (the attention kernel's output, its dV). torchao's own roofline of compiled float8 training counts
# the same: torchao/testing/float8/roofline_utils.py (pytorch/ao 042170ff), get_tensor_memory_traffic_ovhd_s,
# tensorwise "input" / "grad_output" with fuse_with_prev: kernel 1 (max_abs stage 1) 0 bytes, kernel 3 read BF16 and
# write FP8 twice (row- and column-major); without fuse_with_prev, kernel 1 reads the tensor too (FP8_CAST_BYTES).
FP8_CAST_FUSED = (4, 2)  # (bytes per element, launches)


def fp8_cast_time(cluster: ClusterSpec, tensors: list[tuple[float, bool]], recipe: str) -> float:
    """Seconds to quantize each of `tensors` (elements, whether its amax is taken in the compiled kernel that produces
    it: FP8_CAST_FUSED) to FP8, one launch each at least."""
    plain = (FP8_CAST_BYTES[recipe], FP8_CAST_KERNELS[recipe])
    return sum(max(n * per / hbm_rate(cluster), launches * KERNEL_LAUNCH_S)
               for n, fused in tensors for per, launches in (FP8_CAST_FUSED if fused else plain,))


# --------------------------------------------------------------------------- element-wise work

# Activation traffic per token and layer outside the GEMMs and the attention core, in bytes per element
# of the tensor it runs on, counted from the dataflow: each kernel reads its inputs and writes its
# outputs once. Forward; backward moves about twice as much (it reads the saved input and the incoming
# gradient and writes the outgoing one).
#   fused stacks (Megatron / Transformer Engine / Apex kernels): a norm reads and writes (2e); a residual
#   add with its bias/dropout reads two and writes one (3e); SwiGLU reads gate and up and writes their
#   product (3e per f), GELU reads and writes (2e); rotary embedding reads and writes Q and K (2e).
#   eager PyTorch (torchtitan without torch.compile; this project's runtime on a CPU): RMSNorm as nn.RMSNorm's
#   composite ops in FP32 (cast in 2+4, square 4+4, mean 4, scale 4+4, cast out 4+2, weight 2+2 = 36 B);
#   LayerNorm under autocast runs in FP32 (cast in 2+4, norm 4+4, cast out 4+2 = 20 B); SwiGLU as
#   silu(w1 x) * w3 x (silu 2e, product 3e = 5e); rotary embedding on complex FP32 views (cast in 2+4,
#   complex product 4+4, cast out 4+2 = 20 B) (pytorch/torchtitan models/common: nn_modules.RMSNorm,
#   rope.apply_rotary_emb, feed_forward; PyTorch autocast op reference: layer_norm runs in float32).
#   "compiled" (torch.compile / Inductor over each block: torchtitan's compile.enable, apply_compile wraps every
#   TransformerBlock; OLMo-core's compile per block): Inductor fuses every chain of point-wise ops and reductions
#   between two GEMM/attention calls into one kernel that reads its inputs once and writes its outputs once, the
#   FP32 upcasts staying in registers (PyTorch docs, "TorchInductor": pointwise/reduction fusion; Ansel et al. 2024,
#   "PyTorch 2", Sec. 5). In a pre-norm block x -> h = x + attn(norm1(x)) -> h + mlp(norm2(h)) the chains are:
#   norm1 reads x, writes its output (2 + 2); the first residual add and norm2 are one chain: it reads x and the
#   attention's output and writes h and norm2's output (4 + 4); the last residual add reads 2, writes 1 (6); so the
#   two norms cost 4 + 2 = 6 B (3 each) beside the residual adds' 6 each. silu(gate) * up reads two, writes one
#   (6 per f), GELU 4, rotary reads and writes Q and K (4). The block boundary (the next block's norm1) is where
#   per-block compilation stops fusing.
#   "autocast" (this project's runtime on a GPU, shardwise.model: FP32 weights, embedding output and residual stream,
#   the forward under BF16 autocast; SavedTensors.autocast_casts): RMSNorm on the FP32 stream as eager ops (square
#   4+4, mean 4, scale 4+4, weight 4+4 = 28 B); then each linear casts the FP32 norm output to BF16 itself (4+2 per
#   linear: q, k, v, gate and up, 30 B per h-element a layer, folded into the two norms' bytes as 15 each: 43);
#   GPT-2's LayerNorm is one FP32 kernel (4+4) and its q, k, v and fc1 cast 24 (8 + 12 = 20); each residual add reads
#   the FP32 stream and the BF16 output and writes FP32 (4+2+4 = 10); SwiGLU eager (10 per f), GELU 4; rotary on Q
#   and K (BF16) in FP32 math, as model.apply_rope runs it: the negated half and the concatenation (2 + 4), two
#   products reading BF16 and writing FP32 (6 + 6), their sum (12), the cast back (6) = 36.
# Kernels per layer (each costs at least a launch): fused 6 forward / 12 backward, eager 20 / 40, compiled 5 / 10
# (norm1, rotary, add + norm2, silu * mul, last add), autocast 33 / 66 (two norms of six ops, five casts, six rotary
# ops on each of Q and K, two adds, silu and the product).
ELEMENTWISE = {
    # (norm bytes, residual bytes, gated-MLP bytes per f, GELU bytes per f, rotary bytes) with e = 2
    True: (4, 6, 6, 4, 4),
    False: ({"llama": 36, "gpt2": 20}, 6, 10, 4, 20),
    "compiled": (3, 6, 6, 4, 4),
    "autocast": ({"llama": 43, "gpt2": 20}, 10, 10, 4, 36),
}
ELEMENTWISE_KERNELS = {True: (6, 12), False: (20, 40), "compiled": (5, 10), "autocast": (33, 66)}


def rotary_time(cluster: ClusterSpec, tokens: int, q_dim: int, kv_dim: int, tp: int, e: int,
                fused: bool | str = True) -> float:
    """Forward seconds of one layer's rotary embedding on Q and K (its ELEMENTWISE bytes): elementwise_time's rotary
    term, and what a stack's selective recompute runs again with the attention core (Framework.selective_recomputes_rope)."""
    return tokens * ELEMENTWISE[fused][4] * (q_dim + kv_dim) / tp * e / 2 / hbm_rate(cluster)


def elementwise_time(cluster: ClusterSpec, tokens: int, hidden: int, ffn: int, q_dim: int, kv_dim: int, tp: int,
                     sp: bool, gated: bool, rotary: bool, e: int, fused: bool | str = True, family: str = "llama",
                     glu_bytes: float | None = None, gelu_bytes: float | None = None,
                     fused_norms: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's element-wise kernels for `tokens` tokens. `fused`: an ELEMENTWISE
    key (True fused kernels, False eager, "compiled"). `glu_bytes` / `gelu_bytes`: the gated / plain activation's
    bytes per f-element when the stack runs it its own way (Framework.glu_bytes, Framework.gelu_epilogue).
    `fused_norms`: the norms as fused kernels whatever the rest (Job.fused_norms)."""
    norm, residual, swiglu, gelu, _ = ELEMENTWISE[fused]
    if fused_norms:
        norm = ELEMENTWISE[True][0]
    swiglu = swiglu if glu_bytes is None else glu_bytes
    gelu = gelu if gelu_bytes is None else gelu_bytes
    if isinstance(norm, dict):
        norm = norm.get(family, norm["llama"])
    scale = e / 2  # the byte counts above are for 2-byte activations
    per_token = 2 * (norm + residual) * hidden / (tp if sp else 1) + (swiglu if gated else gelu) * ffn / tp
    fwd = tokens * per_token * scale / hbm_rate(cluster)
    if rotary:
        fwd += rotary_time(cluster, tokens, q_dim, kv_dim, tp, e, fused)
    kf, kb = ELEMENTWISE_KERNELS[fused]
    return max(fwd, kf * KERNEL_LAUNCH_S), max(2 * fwd, kb * KERNEL_LAUNCH_S)
