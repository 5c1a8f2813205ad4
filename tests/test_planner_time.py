"""Step-time model against independent figures (public kernel and collective measurements, published layer
times and FLOP counts) and properties (monotonicity, limits), never against its own formulas."""

import contextlib
import dataclasses
import io
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.cli import main
from shardwise.planner import Job, estimate, kernels
from shardwise.planner.comm import collective_time, interpolate, nccl_time, zero1_call_time
from shardwise.planner.frameworks import FRAMEWORKS
from shardwise.planner.job import make_job
from shardwise.planner.overlap import hidden
from shardwise.planner.layer_time import layer_cost, matmul_params_per_layer
from shardwise.planner.step_time import accumulation_time, model_flops_per_step, step_time, tied_embedding_time
from shardwise.specs import Layout, ModelSpec, TrainSpec, load_cluster, load_model, model_from_hf_config, validate_layout

A100 = load_cluster("dgx-a100-80gb")
H100 = load_cluster("dgx-h100-80gb")


def bus_bandwidth(cluster, kind, nbytes, n, stride=1):
    """nccl-tests' busBw of the model's time: algbw x 2(n-1)/n (all-reduce) or (n-1)/n (gather/scatter)."""
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n}[kind]
    return nbytes / nccl_time(cluster, kind, nbytes, n, stride) * factor


# ------------------------------------------------------------------ collectives vs public nccl-tests figures

def test_nvlink_bus_bandwidth_matches_nccl_tests():
    # DGX A100, 8 GPUs, 1 GiB all-reduce: nccl-tests report ~200-235 GB/s bus bandwidth (NVIDIA/nccl-tests issue 149
    # measures ~200 on an HGX A100; NVIDIA's DGX A100 figure is ~230).
    assert 190e9 <= bus_bandwidth(A100, "all_reduce", 2**30, 8) <= 250e9
    # DGX H100, ring (non-NVLS) large messages: "an effective NVLink bandwidth of 370GB/s" (NCCL maintainer,
    # NVIDIA/nccl-tests issue 212).
    assert bus_bandwidth(H100, "all_gather", 8 * 2**30, 8) == pytest.approx(370e9, rel=0.05)


def test_network_bus_bandwidth_matches_nccl_tests():
    # 3 nodes of 8 A100 with 4 HDR NICs each (100 GB/s of line rate per node): nccl-tests all_reduce at 128 MB
    # measured 85-96 GB/s bus bandwidth (NVIDIA/nccl-tests issue 119).
    four_hdr = dataclasses.replace(load_cluster("dgx-a100-40gb"), inter_node_bandwidth=4 * 25e9 / 8)
    assert 75e9 <= bus_bandwidth(four_hdr, "all_reduce", 128 * 2**20, 24) <= 100e9
    # One member per node (a DP group with tp = 8): one NIC's worth, never more.
    assert bus_bandwidth(A100, "all_reduce", 2**30, 16, stride=8) <= 25e9


def _worst_placed(per_node: int, group: int, stride: int, world: int) -> tuple[int, int]:
    """Brute force: every group of `group` ranks `stride` apart in a world of `world` ranks filling nodes in order
    (blocks of group x stride ranks, `stride` interleaved groups in each), the fewest members on one node first."""
    out = []
    for start in range(0, world, group * stride):
        for offset in range(stride):
            nodes = [(start + offset + i * stride) // per_node for i in range(group)]
            out.append((min(nodes.count(n) for n in set(nodes)), len(set(nodes))))
    return min(out, key=lambda w: (w[0], -w[1]))


@pytest.mark.parametrize("per_node", [4, 6, 8, 16])
def test_placement_is_the_worst_group_the_job_has(per_node):
    # every group size and stride of worlds up to 96 ranks: the job's own groups only (a 6-GPU job on a node of 8 is
    # one node whatever its groups; 10 GPUs at tp 5 have ranks 5-9 as their worst group, 3 + 2 across two nodes)
    from shardwise.planner.comm import _placement

    for world in range(1, 97):
        for group in range(1, world + 1):
            for stride in range(1, world // group + 1):
                if world % (group * stride):
                    continue
                assert _placement(per_node, group, stride, world) == _worst_placed(per_node, group, stride, world), \
                    (per_node, group, stride, world)


def test_groups_that_do_not_tile_the_nodes_are_priced_by_their_worst_member_across_the_network():
    # tp 6 on nodes of 8 GPUs: ranks 6-11 are 2 GPUs of one node and 4 of the next, so that group's ring crosses the
    # network on the 2 GPUs' NICs; the step waits for that group, so tp 6 runs below tp 4's and tp 8's NVLink rate.
    nbytes = 2**28
    assert bus_bandwidth(A100, "all_reduce", nbytes, 6) <= 2 * A100.inter_node_bandwidth
    assert bus_bandwidth(A100, "all_reduce", nbytes, 8) > 5 * bus_bandwidth(A100, "all_reduce", nbytes, 6)
    assert bus_bandwidth(A100, "all_reduce", nbytes, 4) > 5 * bus_bandwidth(A100, "all_reduce", nbytes, 6)
    # groups of 3 ranks 8 apart (one member per node) are no worse off than groups of 2 or 4 of them
    assert bus_bandwidth(A100, "all_reduce", nbytes, 3, stride=8) == pytest.approx(
        bus_bandwidth(A100, "all_reduce", nbytes, 4, stride=8) * (2 * 2 / 3) / (2 * 3 / 4), rel=0.2)


def test_a_node_network_shared_by_its_gpus_runs_rings_at_the_nodes_line_rate():
    # IBM's H100 cluster behind fms-fsdp (PyTorch blog "Maximizing training throughput using PyTorch FSDP", 2024):
    # "an H100 cluster with 96 GPUs and 800Gbps inter-node interconnect", 12.5 GB/s per GPU. An NCCL ring over 12
    # whole nodes crosses each node boundary once per ring (channel), so the node's NICs carry the message once
    # whatever their number: bus bandwidth = the node's 100 GB/s line rate x NCCL's efficiency, a quarter of a DGX
    # H100's (8 x 400 Gb/s = 400 GB/s, capped by NVLink's 371).
    ibm = dataclasses.replace(H100, inter_node_bandwidth=800 / 8 / 8 * 1e9)
    assert 80e9 <= bus_bandwidth(ibm, "all_gather", 8 * 2**30, 96) <= 100e9
    assert bus_bandwidth(H100, "all_gather", 8 * 2**30, 96) > 3.5 * bus_bandwidth(ibm, "all_gather", 8 * 2**30, 96)
    # Eight DP groups of one GPU per node (tp = 8) share the same NICs: an eighth each.
    assert bus_bandwidth(ibm, "all_reduce", 2**30, 12, stride=8) <= 12.5e9


def test_small_messages_are_latency_bound_like_nccl_tests():
    # 2 A100s, a 32-byte all-reduce: 10.1 us in nccl-tests (NVIDIA/nccl issue 583).
    assert 5e-6 <= nccl_time(A100, "all_reduce", 32, 2) <= 20e-6
    # Latency grows with the group, bandwidth does not shrink: a big group pays more for a small message.
    assert nccl_time(A100, "all_gather", 1e5, 1024) > 10 * nccl_time(A100, "all_gather", 1e5, 8)


def test_a_broadcast_across_nodes_pays_a_network_hop_per_rank_as_nccls_tuner_does():
    # NCCL's tuner (src/graph/tuning.cc, ncclFuncBroadcast, ring): when the channels' GPU orders differ (multi-NIC
    # nodes), every one of the n steps costs a network hop, at least LL's 2.7 us; on one node, one hop. A 16 KB
    # broadcast over 1,024 A100s (128 nodes) so takes >= 2.8 ms, and a thousand ranks cost far more than 64.
    assert nccl_time(A100, "broadcast", 16e3, 1024) >= 1024 * 2.7e-6
    assert nccl_time(A100, "broadcast", 16e3, 1024) > 12 * nccl_time(A100, "broadcast", 16e3, 64)
    assert nccl_time(A100, "broadcast", 16e3, 8) < 10e-6


@given(nbytes=st.floats(1e3, 1e10), n=st.sampled_from([2, 4, 8, 16, 64, 512]), stride=st.sampled_from([1, 2, 8]))
@settings(max_examples=60, deadline=None)
def test_collectives_are_monotone_and_bounded(nbytes, n, stride):
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        t = collective_time(H100, kind, nbytes, n, stride)
        assert t > 0 and collective_time(H100, kind, 2 * nbytes, n, stride) >= t
    # never faster than the wire allows (NVLink's datasheet bandwidth per GPU)
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        assert bus_bandwidth(H100, kind, nbytes, n, stride) <= H100.intra_node_bandwidth


def test_calibrated_tables_are_interpolated_log_log():
    table = [[1e6, 1e-4], [1e8, 1e-2]]  # slope 1 in log-log
    assert interpolate(table, 1e7) == pytest.approx(1e-3)
    assert interpolate(table, 1e5) == pytest.approx(1e-4)  # below the table: the smallest time
    assert interpolate(table, 2e8) == pytest.approx(2e-2)  # beyond: linear in bytes
    cal = dataclasses.replace(A100, measured={"all_reduce": table, "matmul_tflops": 200.0})
    assert collective_time(cal, "all_reduce", 1e7, 8) == pytest.approx(1e-3)


# ------------------------------------------------------------------ GEMMs vs public throughput by shape

@pytest.fixture
def kernel_view(monkeypatch):
    """The kernels as a single-GPU benchmark sees them (no in-situ derating)."""
    monkeypatch.setattr(kernels, "IN_SITU_EFFICIENCY", {"ampere": 1.0, "hopper": 1.0})


def test_gemm_reaches_the_measured_maximum_at_its_best_shape(kernel_view):
    # Bekman's mamf-finder (stas00/ml-engineering): A100 SXM 267.9 TFLOP/s at 6912x16384x2048, H100 SXM 792.1 at
    # 6144x17920x2816. The tile/wave model must not penalise the shapes the sweep found best.
    assert kernels.gemm_tflops(A100, 6912, 16384, 2048) == pytest.approx(267.9, rel=0.03)
    assert kernels.gemm_tflops(H100, 6144, 17920, 2816) == pytest.approx(792.1, rel=0.03)


def test_short_k_gemms_lose_their_fixed_cost_per_wave(kernel_view):
    # tilelang's FP16 GEMM of 8192 x 8192 x K on H800 SXM (benchmark/matmul/README.md): 628, 705, 736 and 766
    # TFLOP/s at K 1024, 2048, 4096 and 16384. The model keeps MAMF's rate at MAMF's own shape (K 2816) and charges
    # each wave 1.8 us beside its main loop: the same fall-off with K, measured on another kernel library.
    def rate(k):
        return 2 * 8192 * 8192 * k / kernels.gemm_time(H100, 8192, 8192, k)
    for k, measured in ((1024, 628), (2048, 705), (4096, 736)):
        assert rate(k) / rate(16384) == pytest.approx(measured / 766, rel=0.06)
    assert kernels.gemm_tflops(H100, 6144, 17920, 2816) == pytest.approx(792.1, rel=0.03)  # MAMF's shape unchanged


def test_gemm_wave_and_tile_quantization(kernel_view):
    # NVIDIA's "Matrix Multiplication Background" guide, Sec. 3: one tile more than a full wave of 108 SMs
    # (A100) costs a whole extra wave; a dimension one past a tile multiple wastes a tile column.
    full = kernels.gemm_tflops(A100, 6912, 512, 8192)  # 27 x 4 = 108 tiles of 256 x 128: one wave
    assert kernels.gemm_tflops(A100, 6912, 640, 8192) < 0.9 * full
    # H100 (132 SMs): 66 x 16 tiles of 128 x 256 are exactly 8 waves; one more column of N starts a ninth.
    assert kernels.gemm_tflops(H100, 8448, 4097, 8192) < 0.95 * kernels.gemm_tflops(H100, 8448, 4096, 8192)


def test_small_gemms_are_memory_or_launch_bound(kernel_view):
    # Sec. 2 of the guide: below the GPU's FLOP:byte ratio a GEMM runs at HBM bandwidth.
    t = kernels.gemm_time(H100, 8192, 8192, 16)
    assert t >= 2 * (8192 * 16 * 2 + 8192 * 8192) / kernels.hbm_rate(H100)
    assert kernels.gemm_tflops(H100, 8192, 8192, 16) < 0.1 * kernels.gemm_tflops(H100, 8192, 8192, 8192)
    assert kernels.gemm_time(H100, 8, 8, 8) == kernels.KERNEL_LAUNCH_S


def test_a_power_limit_slows_the_tensor_cores_not_hbm(kernel_view):
    # NVIDIA's H100 datasheet rates the same 132-SM die at 1,979 BF16 TFLOP/s (sparse) as the SXM at 700 W and 1,671 as
    # the NVL at 400 W: capped at 400 W, a compute-bound GEMM runs at the NVL's rated share of the SXM's rate.
    capped = {w: dataclasses.replace(H100, power_limit_w=w) for w in (400, 500, 600, 700)}
    def slowdown(c, m, n, k):
        return kernels.gemm_time(c, m, n, k) / kernels.gemm_time(H100, m, n, k)
    assert slowdown(capped[400], 8192, 8192, 8192) == pytest.approx(1979 / 1671, rel=1e-3)
    assert slowdown(capped[700], 8192, 8192, 8192) == pytest.approx(1.0)
    # in between, dynamic power ~ f V^2 with V rising with f: near the cube law, and more lost the lower the limit
    at = [slowdown(capped[w], 8192, 8192, 8192) for w in (700, 600, 500, 400)]
    assert at == sorted(at) and at[2] == pytest.approx((700 / 500) ** (1 / 3), rel=0.02)
    # the FP8 tensor cores and the attention kernel run on the same clock; HBM is clocked apart: a memory-bound GEMM
    # (K = 16) and a streaming kernel keep their time
    assert kernels.fp8_rate(capped[500]) / kernels.fp8_rate(H100) == pytest.approx(1 / at[2])
    attn = [kernels.fused_attention_time(c, "fa3", 8192, 8192, 32, 128)[0] for c in (H100, capped[500])]
    assert attn[1] / attn[0] == pytest.approx(at[2])
    assert slowdown(capped[400], 8192, 8192, 16) == pytest.approx(1.0)
    assert kernels.hbm_rate(capped[400]) == kernels.hbm_rate(H100)


def test_torchtitans_500w_grand_teton_preset():
    # torchtitan's benchmarks/llama3_h100_202412_torchtitan.md: "96GB HBM2e with 2.4 TB/sec peak memory bandwidth",
    # "RDMA network with 400 Gb/s per GPU", "the default 500W power limit"; its MFU footnote still divides by the SXM's
    # peak, as the preset's MFU does.
    c = load_cluster("h100-96gb-500w")
    assert (c.hbm_bandwidth, c.inter_node_bandwidth, c.power_limit_w) == (2.4e12, 50e9, 500)
    assert c.gpu_memory_bytes == 96e9 and c.peak_flops == H100.peak_flops
    assert kernels.matmul_rate(c) < 0.92 * kernels.matmul_rate(H100)
    # estimate says what it assumed, and a compute-bound job on it runs slower than on the 700 W HBM3 preset
    job = make_job(load_model("llama3-8b"), c, 16, 8192, "torchtitan")
    est, full = estimate(job, Layout(dp=8, micro_batch=2, zero=3)), estimate(dataclasses.replace(job, cluster=H100),
                                                                            Layout(dp=8, micro_batch=2, zero=3))
    assert est.assumptions["power_limit_w"] == 500 and est.assumptions["tensor_core_power_share"] < 0.92
    assert "power_limit_w" not in full.assumptions and est.step_time > 1.08 * full.step_time


def test_the_export_variants_keep_the_die_and_lose_nvlink():
    """A800 / H800: the A100's / H100's compute, HBM and memory with NVLink at 400 GB/s (Reuters, 2022-11-08; NVIDIA's
    H800 specifications). DeepSeek-V3's report (arXiv 2412.19437, Sec 3.2.2) measured its H800s' NVLink at 160 GB/s."""
    h800, a800 = load_cluster("hgx-h800-80gb"), load_cluster("hgx-a800-80gb")
    assert bus_bandwidth(h800, "all_gather", 8 * 2**30, 8) == pytest.approx(160e9, rel=0.1)
    assert bus_bandwidth(a800, "all_reduce", 2**30, 8) < 0.7 * bus_bandwidth(A100, "all_reduce", 2**30, 8)
    for slow, full in ((a800, A100), (h800, H100)):
        assert kernels.matmul_rate(slow) == kernels.matmul_rate(full) and slow.gpu_memory_bytes == full.gpu_memory_bytes
        # a TP8 step: the same GEMMs, slower tensor-parallel collectives inside the node
        job = make_job(load_model("llama3-70b"), slow, 8, 4096, "megatron-core")
        lay = Layout(tp=8, pp=1, dp=1, micro_batch=1, sequence_parallel=True, recompute="full")
        mine, theirs = estimate(job, lay), estimate(dataclasses.replace(job, cluster=full), lay)
        assert mine.time_s["compute"] == pytest.approx(theirs.time_s["compute"])
        assert mine.time_s["tp_comm"] > 1.3 * theirs.time_s["tp_comm"]


@given(m=st.integers(1, 20000), n=st.integers(1, 20000), k=st.integers(1, 20000))
@settings(max_examples=80, deadline=None)
def test_gemm_never_beats_the_peak_or_the_roofline(m, n, k):
    for c in (A100, H100):
        t = kernels.gemm_time(c, m, n, k)
        assert t >= 2 * m * n * k / c.peak_flops and t >= 2 * (m * k + k * n + m * n) / c.hbm_bandwidth


def test_attention_efficiency_follows_flashattention_curves():
    # FlashAttention-2 (Dao 2023): up to 73 % of A100's peak forward and 63 % backward; shorter sequences
    # and head dim 64 run slower; H100 without FA3 reaches ~335 TFLOP/s forward with the causal mask at 16K.
    f, b = kernels.attention_efficiency("fa2", "ampere", 16384, 16384, 128, causal=False)
    assert f == pytest.approx(0.73, rel=0.02) and b == pytest.approx(0.63, rel=0.02)
    assert kernels.attention_efficiency("fa2", "ampere", 512, 512, 128)[0] < f
    assert kernels.attention_efficiency("fa2", "ampere", 4096, 4096, 64)[0] < kernels.attention_efficiency("fa2", "ampere", 4096, 4096, 128)[0]
    assert kernels.attention_efficiency("fa2", "hopper", 16384, 16384, 128)[0] * 989 == pytest.approx(335, rel=0.02)
    # The causal mask costs its diagonal blocks; FA3 beats cuDNN beats FA2 on H100 at long sequences.
    for k in ("fa2", "cudnn", "fa3"):
        assert kernels.attention_efficiency(k, "hopper", 8192, 8192, 128) < kernels.attention_efficiency(
            k, "hopper", 8192, 8192, 128, causal=False)
    rates = [sum(kernels.attention_efficiency(k, "hopper", 16384, 16384, 128)) for k in ("fa2", "cudnn", "fa3")]
    assert rates == sorted(rates)


def test_flashattention1_and_xformers_on_a100_against_flashattention2s_figure():
    # Dao 2023 (FlashAttention-2), Fig. 4, forward + backward on A100: FlashAttention-1 is slower at head dim 128 than at
    # 64 (83 vs 97 TFLOP/s causal at 16K), where FlashAttention-2 is faster (189 vs 171); xformers is the faster of the
    # two at head dim 128 (92) and the slower at 64 (67). A model that took FlashAttention-1 as FlashAttention-2 scaled
    # by one factor (Dao's "25-40 % of the theoretical maximum") put its head-dim-128 rate 30 % too high.
    def fwd_bwd(kernel: str, d: int, s: int = 16384) -> float:
        f, b = kernels.attention_efficiency(kernel, "ampere", s, s, d)
        return 3.5 / (1 / f + 2.5 / b) * 312
    assert fwd_bwd("fa1", 128) < fwd_bwd("fa1", 64) and fwd_bwd("fa2", 128) > fwd_bwd("fa2", 64)
    assert fwd_bwd("xformers", 128) > fwd_bwd("fa1", 128) and fwd_bwd("xformers", 64) < fwd_bwd("fa1", 64)
    for d, measured in ((128, (55, 62, 69, 76, 80, 83)), (64, (58, 70, 77, 87, 92, 97))):
        for s, rate in zip((512, 1024, 2048, 4096, 8192, 16384), measured):
            assert fwd_bwd("fa1", d, s) == pytest.approx(rate, rel=0.1), (d, s)
    # Meta's 2022-23 stack (llama2) attends with xformers, not FlashAttention-1.
    assert FRAMEWORKS["llama2"].attention == "xformers"


# flash-attn 2.0 compiles kernels for head dims 32, 64, 96, 128, ... 256 only (csrc/flash_attn/src/static_switch.h
# FWD_HEADDIM_SWITCH): heads of 80 (GPT3-2.7B's 2,560 over 32 heads) run in the 96 kernel, so they take as long as heads
# of 96, and longer than the rate read between the 64 and 128 curves would give them; cuDNN is not bound to it.
# flash-attn 0.2.2 (FlashAttention-1, GPT-NeoX v1.0's pin) dispatches d <= 32, d <= 64, d <= 128 (csrc/flash_attn/
# fmha_api.cpp run_fmha_fwd, run_fmha_bwd): Pythia 2.8B's heads of 80 take as long as heads of 128.
@pytest.mark.parametrize("kernel, cluster, kernel_dim, unbound", [("fa2", "dgx-h100-80gb", 96, "cudnn"),
                                                                  ("fa1", "dgx-a100-40gb", 128, "fa2")])
def test_flashattention_runs_a_head_dim_between_its_kernels_in_the_next_one_up(kernel, cluster, kernel_dim, unbound):
    c = load_cluster(cluster)
    t80, t_kernel = (kernels.fused_attention_time(c, kernel, 4096, 1024, 32, d) for d in (80, kernel_dim))
    assert t80 == pytest.approx(t_kernel)
    assert kernels.fused_attention_time(c, kernel, 4096, 1024, 32, 64) < t80
    # a kernel with another set of compiled sizes runs 80 faster than that kernel's next size up
    assert (kernels.fused_attention_time(c, unbound, 4096, 1024, 32, 80)
            < kernels.fused_attention_time(c, unbound, 4096, 1024, 32, kernel_dim))


def test_flash_attns_fused_mlp_runs_gelu_in_the_gemm_epilogue_on_a100_only():
    # flash_attn/ops/fused_dense.py FusedMLP, heuristic 'auto': on A100 (CUDA >= 11.8) the GELU runs in the FC1 GEMM's
    # cuBLASLt epilogue, which writes the pre-activation beside the output (2 B per f-element) and the dgrad GEMM's
    # DGELU epilogue reads it back; on H100 "the fused cuBlasLt implementation is slower than the unfused version", so
    # F.linear and a separate GELU (4 B forward, 8 backward, as every fused stack's element-wise table). On A100, where
    # both run FlashAttention-2, a flash-attn layer saves exactly those passes against megatron-core's.
    spec, c = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb")
    lay = Layout(dp=1, tp=8, pp=1, micro_batch=1)
    fa, mc = (layer_cost(make_job(spec, c, 64, 2048, fw), lay) for fw in ("flash-attn", "megatron-core"))
    saved = 2048 * spec.ffn_hidden / 8 * (4 - 2) / (c.hbm_bandwidth * kernels.HBM_EFFICIENCY)
    assert mc.fwd - fa.fwd == pytest.approx(saved, rel=1e-6)
    assert mc.bwd_in - fa.bwd_in == pytest.approx(2 * saved, rel=1e-6)
    assert FRAMEWORKS["flash-attn"].gelu_epilogue == ("ampere",)


def test_cudnn_at_16k_against_cudnn_frontends_own_benchmark():
    # Two measurements of the same kernel: the model reads the FA3 paper's (Fig. 5 forward, Fig. 6 backward without
    # the mask) and takes the causal backward at cuDNN's own benchmark's causal / unmasked ratio. That benchmark
    # (cudnn-frontend benchmark/benchmark_results.csv at b740542, cuDNN 9.1; its README locks the Hopper GPU's clocks
    # at 1980 MHz), b 1, 16 heads, head dim 128, 16K causal, measured forward 586.8, backward 497.7 TFLOP/s; at the
    # 1830 MHz of the 989 TFLOP/s peak that is 542 and 460.
    f, b = kernels.attention_efficiency("cudnn", "hopper", 16384, 16384, 128)
    assert f * 989 == pytest.approx(586.8 * 1830 / 1980, rel=0.03)
    assert b * 989 == pytest.approx(497.7 * 1830 / 1980, rel=0.04)


def test_causal_attention_gains_on_the_unmasked_kernel_with_length_as_flashattention2_measured_it():
    # FlashAttention-2's own H100 benchmark, on another bench and kernel release than the curves the model reads
    # (Dao-AILab/flash-attention assets/flash2_h100_fwd_bwd_benchmark.png: H100 80GB SXM5, forward + backward,
    # 16K tokens per batch, 2048-wide heads), TFLOP/s with the causal mask, then without, at 512 ... 16K. The masked
    # kernel gains on the unmasked one with length (0.66 -> 0.97): its diagonal's partial tiles and each query block's
    # set-up weigh less as the key loop grows; by 16K its backward runs at the unmasked rate.
    measured = {128: ((163, 221, 265, 294, 308, 328), (248, 294, 320, 326, 335, 338)),
                64: ((141, 192, 232, 257, 273, 284), (215, 254, 274, 288, 294, 296))}

    def fwd_bwd(eff: tuple[float, float]) -> float:  # FlashAttention's count: backward 2.5x the forward's FLOPs
        return 3.5 / (1 / eff[0] + 2.5 / eff[1])
    for d, (causal, plain) in measured.items():
        for s, c, p in zip((512, 1024, 2048, 4096, 8192, 16384), causal, plain):
            model = fwd_bwd(kernels.attention_efficiency("fa2", "hopper", s, s, d)) / fwd_bwd(
                kernels.attention_efficiency("fa2", "hopper", s, s, d, causal=False))
            assert model == pytest.approx(c / p, abs=0.045), (d, s)


def test_cudnn_causal_forward_by_length_against_cudnn_frontends_own_benchmark():
    # The model's forward up to 16K is the FA3 paper's; cuDNN's own benchmark (b740542, above: 16K tokens per batch)
    # measured the same kernel's causal / unmasked forward at 4K (542.3 / 654.2) and 8K (572.9 / 668.7).
    for s, c, p in ((4096, 542.3, 654.2), (8192, 572.9, 668.7)):
        model = (kernels.attention_efficiency("cudnn", "hopper", s, s, 128)[0]
                 / kernels.attention_efficiency("cudnn", "hopper", s, s, 128, causal=False)[0])
        assert model == pytest.approx(c / p, abs=0.03)


def test_transformer_engines_ring_against_cudnns_measured_kernels():
    # Transformer Engine's p2p context parallelism at cp 2 over a 32K sequence (AttnFuncWithCPAndKVP2P): step 0 the
    # rank's 16K tokens causally; step 1 unmasked, 16K queries against 8K keys on one rank, 8K against 16K on the
    # other. cuDNN's own benchmark (cudnn-frontend benchmark_results.csv at b740542, cuDNN 9.1, 16 heads of 128)
    # measured those kernels: 16K causal 586.8 / 497.7 TFLOP/s forward / backward, unmasked 8K 668.7 / 530.4 and 16K
    # 641.9 / 538.5, and the one 32K causal kernel the ring replaces, 577.3 / 499.7. At those rates the ring (its
    # slower rank each step) takes 0.965 of the single kernel's time for the same queries (kernels only: e=0 leaves
    # out the ring's merge passes, which cuDNN's benchmark does not run).
    unit = 1.0  # forward FLOPs of 16K x 16K unmasked, per head
    ring = unit / 2 * (1 / 586.8 + 1 / 641.9) + 2.5 * unit / 2 * (1 / 497.7 + 1 / 530.4)
    single = unit * (1 / 577.3 + 2.5 / 499.7)
    heads, d, s = 16, 128, 32768
    model_ring = sum(kernels.cp_attention_time(H100, "cudnn", 1, s, 2, "ring", heads, d, kv_width=heads * d, e=0))
    model_single = sum(kernels.fused_attention_time(H100, "cudnn", s // 2, s, heads, d))
    assert model_ring / model_single == pytest.approx(ring / single, abs=0.03)


def test_context_parallel_attention_runs_the_kernels_of_the_stack():
    # Megatron-Core's all-gather (TE's AttnFuncWithCPAndKVAllGather) attends each local chunk to the gathered keys
    # before it: other kernels than its p2p ring's. torch's context_parallel runs the ring's steps whichever way it
    # rotates K/V (all-gather or all-to-all). Same FLOPs either way, so the times stay within the kernels' spread.
    model = load_model("llama3.1-8b")
    times = {}
    for fw in ("megatron-core", "torchtitan"):
        job = make_job(model, H100, 64, 65536, fw, flash_attention=True)
        for mode in ("ring", "allgather"):
            lay = Layout(dp=1, tp=1, pp=1, cp=8, cp_mode=mode, micro_batch=1)
            times[fw, mode] = layer_cost(job, lay).attn_fwd
    assert times["torchtitan", "ring"] == times["torchtitan", "allgather"]
    assert times["megatron-core", "ring"] != times["megatron-core", "allgather"]
    assert times["megatron-core", "allgather"] == pytest.approx(times["megatron-core", "ring"], rel=0.15)


def test_cudnn_against_flashattention2_as_transformer_engine_measured_them():
    # Transformer Engine's attention benchmark (docs/examples/attention/attention.ipynb at 43569381c, H100, kernel
    # times from nsys): b 2, 32 heads, 4 KV groups, head dim 128, 8K causal, forward + backward: cuDNN 12.01 ms,
    # flash-attn 19.07 ms — a 1.59x speed ratio, measured on another bench than the curves the model reads.
    def fwd_bwd(kernel):
        f, b = kernels.fused_attention_time(H100, kernel, 2 * 8192, 8192, 32, 128)
        return f + b
    assert fwd_bwd("fa2") / fwd_bwd("cudnn") == pytest.approx(19.07 / 12.01, rel=0.05)


# ------------------------------------------------------------------ published layer times and FLOP counts

def test_a_gpt3_token_costs_what_brown_et_al_counted():
    # GPT-3 175B: 3.14e23 training FLOPs for 300e9 tokens (Brown et al. 2020, Table D.1), i.e. 6 N per token.
    m = load_model("gpt3-175b")
    per_token = 6 * m.num_layers * matmul_params_per_layer(m)
    assert per_token == pytest.approx(3.14e23 / 300e9, rel=0.02)


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2"])
def test_model_flops_are_what_torch_counts_on_the_model(name):
    # torch's own FLOP counter over one forward + backward of shardwise's model (attention through SDPA's math
    # path, so its matmuls are counted, over the whole s x s as PaLM's model FLOPs count them).
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from shardwise.model import Transformer

    spec, b, s = load_model(name), 2, 32
    tokens = torch.randint(0, spec.vocab_size, (b, s + 1), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        Transformer(spec)(tokens[:, :-1], tokens[:, 1:]).backward()
    assert model_flops_per_step(Job(spec, A100, TrainSpec(b, s))) == counter.get_total_flops()


def test_korthikanti_22b_layer_times():
    # One 22B layer (h 6144, 64 heads, s 2048, b 4, TP 8, A100, Megatron 2022): forward 7.7 ms, backward 11.9 ms
    # without recompute (Korthikanti et al. 2022, Table 4) — a kernel-level measurement the model never saw.
    spec = ModelSpec("22b", "gpt2", 6144, 24576, 48, 64, 64, 51200, 96, 2048, True)
    job = make_job(spec, A100, 4, 2048, "megatron-2021")
    lc = layer_cost(job, Layout(tp=8, micro_batch=4))
    assert lc.fwd + lc.tp_fwd == pytest.approx(7.7e-3, rel=0.15)
    assert lc.bwd_in + lc.bwd_w + lc.tp_bwd == pytest.approx(11.9e-3, rel=0.15)


def test_parallel_residual_reduces_the_layer_outputs_once():
    # EleutherAI/pythia-12b's config.json (GPTNeoXConfig: use_parallel_residual defaults to true) at the TP 4 it
    # trained with (pythia models/12B/pythia-12b.yml: model-parallel-size 4). GPT-NeoX v1.0 ParallelTransformerLayer
    # with gpt_j_residual adds the attention's and the MLP's row-parallel outputs before one all-reduce; the
    # backward's all-reduces are the column-parallel inputs' gradients (copy_to_model_parallel_region), two either
    # way. The same blocks in sequence: two each way.
    cfg = {"model_type": "gpt_neox", "hidden_size": 5120, "intermediate_size": 20480, "num_attention_heads": 40,
           "num_hidden_layers": 36, "vocab_size": 50688, "max_position_embeddings": 2048, "tie_word_embeddings": False}
    neox = model_from_hf_config(cfg, "pythia-12b", "test")
    assert neox.parallel_residual
    sequential = dataclasses.replace(neox, parallel_residual=False)
    par, seq = (layer_cost(make_job(m, A100, 1024, 2048, "gpt-neox"), Layout(tp=4, micro_batch=8))
                for m in (neox, sequential))
    assert par.tp_fwd == pytest.approx(seq.tp_fwd / 2) and par.tp_bwd == pytest.approx(seq.tp_bwd)
    assert (par.fwd, par.bwd_in, par.bwd_w) == (seq.fwd, seq.bwd_in, seq.bwd_w)  # the same matrices and FLOPs
    # Sequence parallelism: one reduce-scatter of the sum forward, one gather of its gradient backward.
    lay = Layout(tp=4, micro_batch=8, sequence_parallel=True)
    par, seq = (layer_cost(make_job(m, A100, 1024, 2048, "megatron-core", tp_comm_overlap=False), lay)
                for m in (neox, sequential))
    assert seq.tp_fwd > par.tp_fwd > seq.tp_fwd / 2 and seq.tp_bwd > par.tp_bwd
    one = layer_cost(make_job(neox, A100, 1024, 2048, "gpt-neox"), Layout(tp=1, micro_batch=8))
    assert one.tp_fwd == one.tp_bwd == 0.0


def test_torchtitans_sequence_parallel_collectives_copy_along_the_sequence_dim():
    # torchtitan shards [batch, seq, hidden] along dim 1 (DTensor Shard(1)); NCCL gathers along dim 0, so torch's
    # functional collectives copy each reduce-scatter's input, and each all-gather's output unless the micro-batch
    # is one sequence. The copies are HBM traffic on the compute stream: faster HBM shrinks them, and Megatron-Core's
    # [seq, batch, hidden] collectives (no copy) do not see HBM at all.
    model, lay = load_model("llama3.1-8b"), Layout(tp=8, micro_batch=2, sequence_parallel=True)
    fast_hbm = dataclasses.replace(H100, hbm_bandwidth=2 * H100.hbm_bandwidth)

    def tp(framework, cluster=H100, mb=2):
        lc = layer_cost(make_job(model, cluster, 64, 8192, framework), lay.with_(micro_batch=mb))
        return (lc.tp_fwd + lc.tp_bwd) / mb  # per sequence

    assert tp("megatron-core", fast_hbm) == pytest.approx(tp("megatron-core"))
    assert tp("torchtitan", fast_hbm) < tp("torchtitan")
    # one sequence a micro-batch: the gather's output is a view, so a sequence costs less than at two
    assert tp("torchtitan", mb=1) < tp("torchtitan", mb=2)
    assert tp("megatron-core", mb=1) >= tp("megatron-core", mb=2)


# ------------------------------------------------------------------ properties of the step

def _t(job, **kw):
    return sum(step_time(job, Layout(**kw)).values())


def test_more_recompute_is_never_faster():
    job = make_job(load_model("llama2-13b"), A100, 64, 4096, "megatron-core")
    base = dict(dp=2, tp=4, pp=1, micro_batch=1, zero=1, sequence_parallel=True)
    times = [_t(job, recompute=r, **base) for r in ("none", "selective", "full")]
    assert times == sorted(times) and times[2] > 1.2 * times[0]


def test_torchtitan_selective_recomputes_half_the_matmuls():
    # torchtitan's op-level checkpointing runs again every second matmul (wk, wo, w3 of a Llama block) and the
    # element-wise kernels, but not attention: between Megatron's selective (attention core) and full recompute.
    model = load_model("llama2-13b")
    base = dict(dp=1, tp=1, pp=1, micro_batch=1, zero=0, recompute="selective")
    titan = make_job(model, A100, 1, 4096, "torchtitan")
    mega = dataclasses.replace(titan, selective="attention")
    op, attn = (step_time(j, Layout(**base))["recompute"] for j in (titan, mega))
    full = step_time(titan, Layout(**{**base, "recompute": "full"}))["recompute"]
    assert attn < op < full
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_dim
    rate = 2 * 4096 * (h * kv + h * h + h * f) * model.num_layers / op  # the matmuls alone would run above peak
    assert 0.5 * A100.peak_flops < rate < A100.peak_flops


def test_fp8_runs_the_linears_on_the_fp8_tensor_cores():
    from shardwise.errors import UsageError
    model, h100 = load_model("llama3-70b"), load_cluster("dgx-h100-80gb")
    lay = Layout(dp=2, tp=4, pp=4, vpp=5, micro_batch=1, zero=1, recompute="selective", sequence_parallel=True,
                 schedule="interleaved-1f1b")
    bf16, fp8 = (make_job(model, h100, 128, 8192, "nemo", precision=p) for p in ("bf16", "fp8"))
    e16, e8 = estimate(bf16, lay), estimate(fp8, lay)
    # faster, but less than the 2x of the FP8 peak: attention and the LM head stay BF16, casts cost HBM passes,
    # and the in-situ share of FP8 GEMMs is their own
    assert 1.2 < e16.step_time / e8.step_time < 2.0
    assert e8.memory_bytes["activations"] < e16.memory_bytes["activations"]
    assert e8.to_dict()["assumptions"]["precision"] == "fp8" and "Transformer Engine" in e8.assumptions["gemm_dtype"]
    assert e8.mfu > e16.mfu  # both against the BF16 peak, as NeMo reports
    # an FP8 GEMM's fixed per-wave cost makes short K relatively dearer than in BF16 (its main loop is half as long)
    def rate(k, fp8):
        return 2 * 8192 * 8192 * k / kernels.gemm_time(h100, 8192, 8192, k, fp8=fp8)
    assert rate(1024, True) / rate(8192, True) < 0.9 and rate(1024, True) / rate(8192, True) < rate(1024, False) / rate(8192, False)
    with pytest.raises(UsageError, match="no FP8 tensor cores"):
        make_job(model, A100, 128, 8192, "nemo", precision="fp8")
    with pytest.raises(UsageError, match="has no FP8 training"):
        make_job(model, h100, 128, 8192, "megatron-2021", precision="fp8")


def test_compiled_torchao_casts_take_their_amax_in_the_kernel_that_makes_the_tensor():
    # torchao's tensor-wise Float8Linear: eager, each cast reads the BF16 tensor for its amax, then again to write the
    # FP8 copy and its transpose (2 + 2 + 1 + 1 B). Under torch.compile the amax comes from the kernel that produces
    # the tensor (torchao's float8 roofline, fuse_with_prev): 4 B, unless a library kernel produced it. Llama 3 8B at
    # TP 1 (h = q = 4096, kv = 1024, f = 14336), per token: the forward casts the QKV and FC1 inputs (norm outputs,
    # 2 x 4096) and FC2's (silu * up, 14336) fused, the projection's (the attention kernel's output, 4096) not:
    # 4 x 22528 + 6 x 4096 = 114688 B against 6 x 26624 = 159744 eager. Backward: Q and K's gradients (RoPE's
    # backward, 5120), the projection's and FC2's output gradients (residual adds, 2 x 4096) and FC1's (gate and up,
    # 28672) fused, V's (the attention kernel's dV, 1024) not: 4 x 41984 + 6 x 1024 = 174080 against 6 x 43008.
    from shardwise.planner.layer_time import fp8_casts
    model, lay = load_model("llama3-8b"), Layout(dp=8, micro_batch=1, zero=3)
    eager, compiled = (make_job(model, H100, 8, 8192, "torchtitan", precision="fp8", compile=c) for c in (False, True))
    (ef, eb), (cf, cb) = fp8_casts(eager, lay, 8192), fp8_casts(compiled, lay, 8192)
    assert cf / ef == pytest.approx(114688 / 159744, rel=1e-3) and cb / eb == pytest.approx(174080 / 258048, rel=1e-3)
    assert ef == pytest.approx(8192 * 159744 / kernels.hbm_rate(H100), rel=1e-3)  # at the HBM's achieved rate
    # a step's worth: compiled FP8 is faster, and says how it casts; Transformer Engine's fused casts never change
    assert estimate(compiled, lay).step_time < estimate(eager, lay).step_time
    assert "compiled kernel" in estimate(compiled, lay).assumptions["gemm_dtype"]
    assert "compiled kernel" not in estimate(eager, lay).assumptions["gemm_dtype"]


def test_data_parallel_speedup_and_overlap():
    model = load_model("llama3-8b")
    core = make_job(model, H100, 256, 4096, "megatron-core")
    assert _t(core, dp=8, zero=1) < _t(core, dp=4, zero=1) < _t(core, dp=2, zero=1)
    # The same layout without overlap (Megatron 2021 semantics: FP32 all-reduce after the backward) exposes more.
    old = dataclasses.replace(core, framework="megatron-2021")
    lay = Layout(dp=64, micro_batch=1)
    assert step_time(old, lay)["dp_comm"] > 3 * step_time(core, lay)["dp_comm"]
    # and a faster network can only help; an infinitely fast one hides it entirely
    fast = dataclasses.replace(old, cluster=dataclasses.replace(H100, inter_node_bandwidth=1e15, intra_node_bandwidth=1e15))
    assert step_time(fast, lay)["dp_comm"] < 0.01 * step_time(old, lay)["dp_comm"]


def test_gradients_in_fp32_cost_twice_the_bytes_of_bf16():
    model = load_model("llama3-8b")
    nemo, core = make_job(model, H100, 64, 4096, "nemo"), make_job(model, H100, 64, 4096, "megatron-core")
    lay = Layout(dp=64, micro_batch=1, zero=1)
    # overlap aside, megatron-core reduces FP32 gradients, NeMo's distributed Adam BF16 ones
    no_overlap = {"comm_overlap": 0.0, "matmul_tflops": 600.0}
    f = step_time(dataclasses.replace(core, cluster=dataclasses.replace(H100, measured=no_overlap)), lay)["dp_comm"]
    b = step_time(dataclasses.replace(nemo, cluster=dataclasses.replace(H100, measured=no_overlap)), lay)["dp_comm"]
    assert 1.3 < f / b < 2.1


def test_megatron_fsdp_zero2_gathers_its_weights_once_a_step():
    # Megatron FSDP's optim_grads never shards the model weights (param_and_grad_buffer.py): every micro-batch's
    # backward reduce-scatters the FP32 gradients, and the updated BF16 weights are all-gathered once, after the
    # optimizer. Blocking (comm_overlap 0): m reduce-scatters of 4 B and one gather of 2 B per parameter. FSDP2's
    # ZeRO-2 (shardwise) gathers again in every micro-batch's forward: m of each.
    from shardwise.planner.memory import rank_params
    cluster = dataclasses.replace(H100, measured={"comm_overlap": 0.0, "matmul_tflops": 600.0})
    lay, m = Layout(dp=8, micro_batch=1, zero=2), 4
    core = make_job(load_model("llama3-8b"), cluster, 8 * m, 4096, "megatron-core")
    params = rank_params(core, lay, 0)
    rs, ag = (collective_time(cluster, kind, n * params, 8) for kind, n in (("reduce_scatter", 4), ("all_gather", 2)))
    assert step_time(core, lay)["dp_comm"] == pytest.approx(m * rs + ag, rel=1e-6)
    runtime = make_job(load_model("llama3-8b"), cluster, 8 * m, 4096, "shardwise")
    assert step_time(runtime, lay)["dp_comm"] > m * collective_time(cluster, "all_gather", 4 * params, 8)


def test_bucket_overlap_schedule():
    from shardwise.planner.overlap import OVERLAP_SLOWDOWN as k
    assert hidden(1.0, 0.0, 1e9, 25e6) == 1.0  # nothing to hide behind
    # only the last bucket is exposed; the hidden 0.975 s slow the backward beside them by Lee et al.'s 18.9 %
    assert hidden(1.0, 100.0, 1e9, 25e6) == pytest.approx(0.025 + 0.975 * k)
    assert hidden(3.0, 1.0, 1e9, 25e6) == pytest.approx(3.0 - 0.975 + 0.975 * k)  # the stream cannot outrun the backward


def test_pipeline_bubble_shrinks_with_interleaving_and_zb_h1():
    job = make_job(load_model("llama2-13b"), A100, 64, 4096, "shardwise")
    base = dict(dp=1, tp=4, pp=4, micro_batch=1, sequence_parallel=True)
    b1 = step_time(job, Layout(schedule="1f1b", **base))["pipeline_bubble"]
    assert step_time(job, Layout(schedule="interleaved-1f1b", vpp=2, **base))["pipeline_bubble"] < b1
    assert step_time(job, Layout(schedule="zb-h1", **base))["pipeline_bubble"] < b1


def test_tp_across_nodes_costs_more():
    job = make_job(load_model("llama2-70b"), A100, 16, 2048, "megatron-core")
    inside = step_time(job, Layout(dp=2, tp=8, micro_batch=1, sequence_parallel=True))["tp_comm"]
    across = step_time(job, Layout(dp=1, tp=16, micro_batch=1, sequence_parallel=True))["tp_comm"]
    assert across > 2 * inside


def test_deepspeed_zero3_is_latency_bound_at_scale():
    # Per-parameter gathers with a host synchronisation each: at fixed work per GPU, more ranks cost more; the
    # coalesced, prefetched gathers of later releases hide more.
    model = load_model("gpt3-175b")
    small = make_job(model, A100, 384, 2048, "deepspeed")
    large = make_job(model, A100, 1536, 2048, "deepspeed")
    newer = make_job(model, A100, 1536, 2048, "deepspeed-2024", flash_attention=False)
    lay = dict(tp=1, pp=1, micro_batch=1, zero=3, recompute="full")
    assert step_time(large, Layout(dp=1536, **lay))["dp_comm"] > step_time(small, Layout(dp=384, **lay))["dp_comm"]
    assert step_time(newer, Layout(dp=1536, **lay))["dp_comm"] < step_time(large, Layout(dp=1536, **lay))["dp_comm"]


def test_deepspeeds_2021_zero3_gathers_pass_through_hbm_around_nccl(monkeypatch):
    # DeepSpeed's 2021 ZeRO-3 (partition_parameters.py at 599258f97 / v0.3.13): _allgather_param fills the whole
    # gathered buffer with zeros (torch.zeros: one write of its bytes), then all-gathers into a list of per-rank views
    # of it, which PyTorch's ProcessGroupNCCL::allgather copies out of its flat result (one kernel per rank, the bytes
    # read and written); _reduce_scatter_gradient reduce-scatters from a list of views of the gradient, which PyTorch
    # first copies into a flat input (one kernel per rank, read and written). GPT-3 175B at dp 64, one micro-batch,
    # full recompute: per layer 16 tensors (Q, K, V, projection, two MLP matrices, their 6 biases, 2 LayerNorms'
    # weights and biases) of 12 h^2 + 13 h elements, 2 bytes each; gathered three times (forward, the recomputed
    # forward, backward) and reduce-scattered once. Per layer: 3 x (16 x 64 launches + 3 x 2E bytes) + (16 x 64
    # launches + 2 x 2E bytes) at 4 us a launch and 90 % of the A100-80GB's 2,039 GB/s: 96 layers, 3.66 s.
    import dataclasses as dc

    from shardwise.planner import frameworks

    model = load_model("gpt3-175b")
    h, hbm, launches = 12288, 2039e9 * 0.9, 16 * 64 * 4e-6
    nbytes = 2 * (12 * h * h + 13 * h)
    expected = 96 * (3 * (launches + 3 * nbytes / hbm) + launches + 2 * nbytes / hbm)
    lay = Layout(dp=64, tp=1, pp=1, micro_batch=1, zero=3, recompute="full")
    plain = dc.replace(frameworks.DEEPSPEED, name="deepspeed-in-place", list_collectives=False)
    monkeypatch.setitem(frameworks.FRAMEWORKS, plain.name, plain)
    ds = step_time(make_job(model, A100, 64, 2048, "deepspeed"), lay)["dp_comm"]
    in_place = step_time(make_job(model, A100, 64, 2048, plain.name), lay)["dp_comm"]
    assert ds - in_place == pytest.approx(expected, rel=0.02)


def test_a_synchronous_step_waits_for_its_slowest_gpu():
    # Sinha et al. 2022: identical GPUs differ by ~8 % across a cluster; the expected slowest of N grows with N.
    from shardwise.planner.step_time import straggler

    job = make_job(load_model("llama3-8b"), H100, 4096, 4096, "megatron-core")
    factors = [straggler(job, Layout(dp=n)) for n in (1, 8, 128, 2048, 16384)]
    assert factors[0] == 1.0 and factors == sorted(factors) and factors[-1] < 1.06
    assert straggler(dataclasses.replace(job, cluster=dataclasses.replace(H100, measured={"matmul_tflops": 1.0})),
                     Layout(dp=128)) == 1.0  # a calibrated cluster's rates are its own GPUs'


def test_estimate_says_what_it_assumes():
    job = make_job(load_model("llama3-8b"), H100, 64, 4096, "nemo")
    d = estimate(job, Layout(dp=2, tp=2, pp=2, vpp=2, schedule="interleaved-1f1b", zero=1, sequence_parallel=True)).to_dict()
    for key in ("tp", "pp", "dp", "vpp", "micro_batch", "num_microbatches", "zero", "recompute", "sequence_parallel",
                "schedule", "fits", "memory_gib_per_gpu", "memory_breakdown_gib", "step_time_s", "time_breakdown_s",
                "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu", "framework"):
        assert key in d
    assert d["framework"] == "nemo" and d["assumptions"]["gradient_reduce_dtype"] == "bf16"
    assert d["assumptions"]["tp_comm_overlap"] is True
    assert d["step_time_s"] == pytest.approx(sum(d["time_breakdown_s"].values()), rel=1e-4)
    assert d["tokens_per_s"] == pytest.approx(64 * 4096 / d["step_time_s"], rel=1e-4)


@settings(max_examples=80, deadline=None)
@given(model=st.sampled_from(["tiny", "tiny-gpt2", "gpt2", "llama2-13b", "llama3-70b", "llama3.1-405b"]),
       cluster=st.sampled_from(["dgx-a100-40gb", "dgx-h100-80gb", "dgx-h200"]),
       framework=st.sampled_from(sorted(FRAMEWORKS)),
       tp=st.sampled_from([1, 2, 4, 8, 16]), pp=st.sampled_from([1, 2, 3, 4, 8]), dp=st.sampled_from([1, 2, 3, 8]),
       mb=st.sampled_from([1, 2, 4]), vpp=st.sampled_from([1, 2, 3]), zero=st.sampled_from([0, 1, 2, 3]),
       recompute=st.sampled_from(["none", "selective", "full"]), sp=st.booleans(),
       schedule=st.sampled_from(["naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1"]),
       seq=st.sampled_from([1, 64, 2048]), flash=st.booleans())
def test_estimate_never_crashes_on_valid_input(model, cluster, framework, tp, pp, dp, mb, vpp, zero, recompute, sp,
                                              schedule, seq, flash):
    from shardwise.errors import UsageError
    spec = load_model(model)
    batch = dp * mb * pp * 2
    lay = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, vpp=vpp, zero=zero, recompute=recompute,
                 sequence_parallel=sp, schedule=schedule)
    try:
        validate_layout(lay, spec, batch, dp * tp * pp)
    except UsageError:
        return
    e = estimate(make_job(spec, load_cluster(cluster), batch, seq, framework, flash_attention=flash), lay)
    d = e.to_dict()
    assert e.step_time > 0 and e.memory_per_gpu > 0 and 0 < e.mfu <= e.hfu < 1
    assert all(math.isfinite(v) and v >= 0 for v in d["time_breakdown_s"].values())


# ------------------------------------------------------------------ calibrated per-call costs (counted, not fitted)

def _tiny_job(framework="shardwise", **measured):
    # A calibrated cluster (alpha-beta collectives) whether or not `measured` holds the costs under test.
    cluster = dataclasses.replace(A100, measured={"world_size": 0, **measured})
    return Job(load_model("tiny"), cluster, TrainSpec(8, 64), flash_attention=True, framework=framework,
               zero1_broadcast_per_tensor=True)


def _delta(key: str, lay: Layout, framework="shardwise", **measured) -> float:
    """What the calibrated costs in `measured` add to `key` (comm_overlap, when given, holds for both)."""
    base = {k: v for k, v in measured.items() if k == "comm_overlap"}
    return step_time(_tiny_job(framework, **measured), lay)[key] - step_time(_tiny_job(framework, **base), lay)[key]


def test_every_tensor_parallel_call_pays_the_sync_cost():
    # tiny: 4 layers x (2 all-reduces forward + 2 backward) + embedding, LM head and loss = 19 calls per
    # micro-batch, 8 micro-batches. Sequence parallelism: twice the calls, but a block's gather follows
    # the previous scatter with only a norm between, so each of the 4 x 4 pairs synchronises once; the
    # backward gathers again the saved sequence shard of q/k/v's and gate/up's input (4 x 2 calls), and
    # the edges are 6 calls (embedding scatter and its gather, head gather, scatter and re-gather, loss) = 30.
    x = 1e-3
    assert _delta("tp_comm", Layout(tp=2), sync_overhead_s=x) == pytest.approx(8 * 19 * x)
    assert _delta("tp_comm", Layout(tp=2, sequence_parallel=True), sync_overhead_s=x) == pytest.approx(8 * 30 * x)
    # once per step: the gradient norm over tp (and SP's partial norm gradients)
    assert _delta("step_comm", Layout(tp=2), sync_overhead_s=x) == pytest.approx(x)
    assert _delta("step_comm", Layout(tp=2, sequence_parallel=True), sync_overhead_s=x) == pytest.approx(2 * x)
    # shardwise sends norm and loss in one all-reduce over every rank; under plain DP none is waited for
    assert _delta("step_comm", Layout(pp=2), sync_overhead_s=x) == pytest.approx(x)
    assert _delta("step_comm", Layout(dp=2), sync_overhead_s=x) == 0
    assert _delta("step_comm", Layout(dp=2, zero=3), sync_overhead_s=x) == pytest.approx(x)
    # what shardwise's loop adds to a bare step, once per step whatever the layout
    for lay in (Layout(dp=2), Layout(tp=2), Layout(pp=2)):
        assert _delta("optimizer", lay, train_step_overhead_s=x) == pytest.approx(x)


def test_fsdp_calls_are_counted_per_unit():
    # dp2, 4 micro-batches per rank; 4 layer units + 1 root. ZeRO-3: per micro-batch 5 gathers in
    # forward, 4 in backward (the root stays gathered), 5 reduce-scatters = 14. ZeRO-2: per micro-batch
    # 5 gathers (kept until backward) and 5 reduce-scatters (gradients stay sharded) = 10.
    y = 1e-3
    assert _delta("dp_comm", Layout(dp=2, zero=3), fsdp_call_s=y, comm_overlap=0.0) == pytest.approx(4 * 14 * y)
    assert _delta("dp_comm", Layout(dp=2, zero=2), fsdp_call_s=y, comm_overlap=0.0) == pytest.approx(4 * 10 * y)
    # ZeRO-0: one all-reduce
    assert _delta("dp_comm", Layout(dp=2), sync_overhead_s=y, comm_overlap=0.0) == pytest.approx(y)


def test_each_zero1_broadcast_pays_its_calibrated_cost():
    # torch's ZeroRedundancyOptimizer broadcasts every parameter tensor of the runtime's model once per step, each
    # paying calibrate's zero1_call_s beyond its table time; ZeRO-0 and the datasheet clusters pay nothing of it
    from shardwise.model import Transformer

    tensors = len(list(Transformer(load_model("tiny"), seed=0, device="meta").parameters()))
    y = 1e-3
    assert _delta("dp_comm", Layout(dp=2, zero=1), zero1_call_s=y, comm_overlap=0.0) == pytest.approx(tensors * y)
    assert _delta("dp_comm", Layout(dp=2), zero1_call_s=y, comm_overlap=0.0) == 0
    datasheet = Job(load_model("tiny"), A100, TrainSpec(8, 64), flash_attention=True, framework="shardwise")
    assert zero1_call_time(datasheet.cluster) == 0


@pytest.mark.parametrize("lay", [dict(dp=2, zero=1), dict(dp=4, ep=2, zero=1), dict(dp=2, ep=2, zero=1)])
def test_zero1_broadcasts_are_the_runtime_optimizers_tensors_on_a_mixture_of_experts(lay):
    # train.build_optimizer: one ZeroRedundancyOptimizer over dp for the dense tensors (each MoE layer's router in
    # place of its FFN), and the experts split over ep in a second one over their edp replicas, which broadcasts
    # their stacked w1 / w3 / w2 only where edp > 1
    from shardwise.model import Transformer
    from shardwise.planner import moe

    spec, layout = load_model("tiny-moe"), Layout(**lay)
    names = [n for n, _ in Transformer(spec, seed=0, device="meta").named_parameters()]
    experts = [n for n in names if ".experts." in n]
    split = layout.ep > 1
    runtime = len(names) - len(experts) * split + len(experts) * (split and moe.expert_replicas(layout, 1) > 1)
    y = 1e-3

    def job(**measured):
        cluster = dataclasses.replace(A100, measured={"world_size": 0, "comm_overlap": 0.0, **measured})
        return Job(spec, cluster, TrainSpec(16, 64), flash_attention=True, framework="shardwise")

    charged = step_time(job(zero1_call_s=y), layout)["dp_comm"] - step_time(job(), layout)["dp_comm"]
    assert charged == pytest.approx(runtime * y)


def test_lit_gpt_reduce_scatters_once_per_optimizer_step():
    # TinyLlama's pretrain/tinyllama.py (01c9c77) runs every micro-batch but the step's last under
    # fabric.no_backward_sync, which Lightning 2.1.2's FSDPStrategy turns into FSDP1's no_sync(): FULL_SHARD still
    # gathers every unit in each forward and backward, but reduce-scatters only in the last backward. tiny, dp 2, 4
    # micro-batches: 4 x (5 + 4) gathers + 5 reduce-scatters = 41 calls; Composer's FSDP (no no_sync) 4 x 14 = 56.
    y = 1e-3
    lay = Layout(dp=2, zero=3)
    assert _delta("dp_comm", lay, "lit-gpt", fsdp_call_s=y, comm_overlap=0.0) == pytest.approx(41 * y)
    assert _delta("dp_comm", lay, "composer", fsdp_call_s=y, comm_overlap=0.0) == pytest.approx(56 * y)


def test_lit_gpt_holds_its_gradients_unsharded_while_it_accumulates():
    from shardwise.planner.kernels import hbm_rate
    from shardwise.planner.memory import memory_breakdown, rank_params

    # Under no_sync() FSDP1 keeps each unit's gradient unsharded in the dtype it computes in (FP32 under Lightning's
    # bf16-mixed: param_dtype float32) from the first micro-batch's backward to the last: Llama 2 7B's 6.74e9
    # parameters x 4 B on every GPU, not 1/16 of it; with one micro-batch per step nothing is accumulated and the
    # gradient is reduce-scattered into its shard as usual.
    model, lay = load_model("llama2-7b"), Layout(dp=16, zero=3, micro_batch=1)
    params = 6_738_415_616
    accumulating = make_job(model, A100, 64, 2048, "lit-gpt")  # 4 micro-batches
    assert memory_breakdown(accumulating, lay)[1]["gradients"] == pytest.approx(4 * params, rel=0.01)
    single = make_job(model, A100, 16, 2048, "lit-gpt")
    assert memory_breakdown(single, lay)[1]["gradients"] == pytest.approx(4 * params / 16, rel=0.01)
    # Autograd adds each later micro-batch's FP32 gradient into the held one in place (AccumulateGrad: read 4 + 4,
    # write 4): 3 of 4 micro-batches, 12 B per parameter, at HBM bandwidth.
    held = rank_params(accumulating, lay, 0)
    assert accumulation_time(accumulating, lay, 0) == pytest.approx(3 / 4 * 12 * held / hbm_rate(A100))
    assert accumulation_time(make_job(model, A100, 64, 2048, "composer"), lay, 0) == 0  # reduced every micro-batch


def test_checkpointed_layers_pay_the_checkpoint_cost():
    z = 1e-3
    for policy in ("selective", "full"):  # 4 layers x 8 micro-batches
        assert _delta("recompute", Layout(recompute=policy), checkpoint_overhead_s=z) == pytest.approx(32 * z)


def test_pipeline_waits_count_the_programs_receiving_exchanges():
    from shardwise.planner.step_time import pipeline_waits
    from shardwise.schedules import build
    from shardwise.schedules.p2p import Exchange, p2p_program

    assert pipeline_waits(Layout(pp=2), 8) == 8  # rank 0 the gradients, rank 1 the activations
    assert pipeline_waits(Layout(pp=2, schedule="gpipe"), 8) == 8  # its 8 lone gradient sends are not waits
    assert pipeline_waits(Layout(pp=4), 8) == 16  # a middle rank receives both
    assert pipeline_waits(Layout(pp=2, vpp=2, schedule="interleaved-1f1b"), 8) == 24  # 3 of its 4 chunk edges
    assert pipeline_waits(Layout(), 8) == 0
    # Every receive of a rank is posted in some exchange that it waits on before the action that needs it.
    for name, v in (("1f1b", 1), ("gpipe", 1), ("zb-h1", 1), ("naive", 1), ("interleaved-1f1b", 2)):
        for p, m in ((2, 4), (4, 8)):
            programs = p2p_program(build(name, p, m, v))
            assert all(x.wait for prog in programs for x in prog if isinstance(x, Exchange) and x.recvs)
            most = max(sum(len(x.recvs) for x in prog if isinstance(x, Exchange)) for prog in programs)
            assert pipeline_waits(Layout(pp=p, vpp=v, schedule=name), m) <= most
    # The executor's sends wait for their receives, so in GPipe's drain the two ranks hand the gradients
    # over in lockstep and rank 0 sleeps before each of its 8 receives (plus what the transfers shift).
    x = 1e-3
    assert 8 * x <= _delta("pp_p2p", Layout(pp=2, schedule="gpipe"), sync_overhead_s=x) < 8.2 * x


def test_a_calibrated_pipeline_runs_the_executors_program():
    # Interleaved 1F1B at p = 2 (m = 8): each chunk's activation send waits until the neighbour posts its
    # receive, which a pipeline with asynchronous sends (the closed form) never does; 1F1B has no such wait.
    eps = 1e-9  # calibrated, with a negligible wake-up
    inter = Layout(pp=2, vpp=2, schedule="interleaved-1f1b")
    t = step_time(_tiny_job(p2p_sync_s=eps), inter)
    assert t["pp_p2p"] > 0.2 * (t["compute"] + t["pipeline_bubble"])
    assert t["pp_p2p"] > 5 * step_time(_tiny_job(), inter)["pp_p2p"]  # datasheet cluster: the closed form
    # 1F1B: only its transfers, at most the closed form's (each rank at its own costs may hide some of them)
    one = step_time(_tiny_job(p2p_sync_s=eps), Layout(pp=2))
    assert 0 < one["pp_p2p"] <= step_time(_tiny_job(), Layout(pp=2))["pp_p2p"] * 1.01


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2"])
def test_parameter_tensors_are_the_runtimes(name):
    from shardwise.model import Transformer
    from shardwise.planner.job import Job
    from shardwise.planner.step_time import param_tensors

    spec = load_model(name)
    job = Job(spec, load_cluster("dgx-h100-80gb"), TrainSpec(8, 64))
    assert param_tensors(job, Layout(), 0) == len(list(Transformer(spec).parameters()))
    lay = Layout(pp=2)
    first = Transformer(spec, layer_ids=range(2), last=False)
    last = Transformer(spec, layer_ids=range(2, 4), first=False)
    assert [param_tensors(job, lay, r) for r in (0, 1)] == [len(list(m.parameters())) for m in (first, last)]


def test_zb_h1_split_stages_pay_the_split_backward():
    # pp2 ZB-H1, 8 micro-batches: the last rank splits every backward of its 2 layers into I and W; the first
    # stage has no input gradient to split (its W runs one plain backward). Other schedules never split.
    x = 1e-3
    assert _delta("compute", Layout(pp=2, schedule="zb-h1"), split_backward_s=x) == pytest.approx(8 * 2 * x)
    for schedule in ("1f1b", "gpipe", "naive"):
        assert _delta("compute", Layout(pp=2, schedule=schedule), split_backward_s=x) == 0
    assert _delta("compute", Layout(dp=2), split_backward_s=x) == 0


def test_pipeline_ranks_computing_alone_run_at_the_alone_rate():
    # The calibrated rate is every rank's at once; what a pipeline rank computes while the others wait runs
    # k times faster: the fill and drain of 1F1B / GPipe, all of a naive schedule. Nothing else changes.
    k = 1.25
    for schedule in ("1f1b", "gpipe", "zb-h1"):
        lay = Layout(pp=2, schedule=schedule)
        base, slow = step_time(_tiny_job(), lay), step_time(_tiny_job(concurrent_slowdown=k), lay)
        assert slow["pipeline_bubble"] == pytest.approx(base["pipeline_bubble"] / k)
        assert slow["compute"] == pytest.approx(base["compute"])
    lay = Layout(pp=2, schedule="naive", recompute="full")
    base, slow = step_time(_tiny_job(), lay), step_time(_tiny_job(concurrent_slowdown=k), lay)
    for key in ("compute", "recompute", "pipeline_bubble"):
        assert slow[key] == pytest.approx(base[key] / k)
    for lay in (Layout(dp=2), Layout(tp=2)):  # every rank computes all the time
        assert step_time(_tiny_job(concurrent_slowdown=k), lay) == step_time(_tiny_job(), lay)


def test_ddp_wraps_every_micro_batch():
    # dp2: 4 micro-batches per rank under DDP; pipelines and FSDP do not use DDP.
    w = 1e-3
    assert _delta("compute", Layout(dp=2), ddp_microbatch_s=w) == pytest.approx(4 * w)
    assert _delta("compute", Layout(dp=2, zero=1), ddp_microbatch_s=w) == pytest.approx(4 * w)
    for lay in (Layout(dp=2, zero=3), Layout(pp=2), Layout(tp=2)):
        assert _delta("compute", lay, ddp_microbatch_s=w) == 0


def test_the_shardwise_profile_carries_a_calibrated_per_step_overhead():
    # The hook `calibrate` fills (frameworks.CALIBRATED_STEP_OVERHEAD): added once per step, to shardwise only.
    from shardwise.planner.frameworks import CALIBRATED_STEP_OVERHEAD

    assert _delta("optimizer", Layout(dp=2), **{CALIBRATED_STEP_OVERHEAD: 7e-3}) == pytest.approx(7e-3)
    other = dataclasses.replace(_tiny_job(**{CALIBRATED_STEP_OVERHEAD: 7e-3}), framework="megatron-core")
    plain = dataclasses.replace(_tiny_job(), framework="megatron-core")
    assert step_time(other, Layout(dp=2))["optimizer"] == step_time(plain, Layout(dp=2))["optimizer"]


def test_fp8_parameters_are_stored_and_gathered_in_one_byte():
    # NeMo's fp8_params (Transformer Engine's fp8_model_init): the weights live in FP8 and the distributed optimizer
    # gathers FP8 weights. GPT-3 175B at MLPerf v4.0's 10,752-GPU layout: a pipeline rank holds 1/24 of 174.6 B
    # parameters (plus the embedding, 51,200 x 12,288, on the first rank).
    layout = Layout(dp=448, tp=4, pp=6, vpp=8, schedule="interleaved-1f1b", zero=1, sequence_parallel=True)
    base = make_job(load_model("gpt3-175b"), H100, 2688, 2048, "nemo", precision="fp8")
    fp8w = make_job(load_model("gpt3-175b"), H100, 2688, 2048, "nemo", precision="fp8", fp8_params=True)
    e2, e1 = estimate(base, layout), estimate(fp8w, layout)
    # Per weight: the FP8 weight and the transpose Transformer Engine keeps for the backward (2 B), where BF16
    # weights keep the BF16 copy and the FP8 copy and transpose beside it (4 B).
    weights = e1.memory_bytes["weights"]
    assert 2 * 174.6e9 / 24 * 0.98 <= weights <= 2 * (174.6e9 / 24 + 51200 * 12288 / 4) * 1.02
    assert e2.memory_bytes["weights"] == pytest.approx(2 * weights, rel=0.02)
    assert e1.assumptions["param_gather_dtype"] == "fp8" and e2.assumptions["param_gather_dtype"] == "bf16"
    assert e1.time_s["dp_comm"] < 0.8 * e2.time_s["dp_comm"]  # the updated weights' all-gather halves


def test_fp8_params_need_fp8_training():
    from shardwise.errors import UsageError

    for framework, precision in (("nemo", "bf16"), ("torchtitan", "bf16")):
        with pytest.raises(UsageError, match="--fp8-params"):
            make_job(load_model("gpt3-175b"), H100, 2688, 2048, framework, precision=precision, fp8_params=True)
    titan = make_job(load_model("gpt3-175b"), H100, 2688, 2048, "torchtitan", precision="fp8", fp8_params=True)
    assert titan.fp8_all_gather and titan.train.weight_bytes == 2  # torchao gathers FP8 from FP32 shards it keeps


def test_torchaos_float8_all_gather_moves_and_holds_a_byte_per_weight():
    # torchtitan's enable_fsdp_float8_all_gather: each layer's weights are cast to FP8 on the FSDP shard, gathered
    # and held at one byte (the root unit, embedding and head, stays BF16), and the gathered FP8 weight feeds the
    # forward as it is: only its transpose is written for the backward. Llama 3 8B, FSDP over 64 H100s (8 nodes).
    from shardwise.planner import overlap
    from shardwise.planner.frameworks import FRAMEWORKS
    from shardwise.planner.layer_time import fp8_weight_cast
    from shardwise.planner.memory import layer_params

    model, fw = load_model("llama3-8b"), FRAMEWORKS["torchtitan"]
    plain = make_job(model, H100, 64, 8192, "torchtitan", precision="fp8")
    gather = make_job(model, H100, 64, 8192, "torchtitan", precision="fp8", fp8_params=True)
    layout = Layout(dp=64, zero=3, micro_batch=1)
    layer, root = layer_params(model, 1), 2 * model.vocab_size * model.hidden
    bf16, fp8 = overlap._unit_calls(plain, layout, fw, layer, root), overlap._unit_calls(gather, layout, fw, layer, root, layer)
    assert fp8.gather < 0.6 * bf16.gather  # a 218 M-element unit: bandwidth-bound, so about half
    assert fp8.root_gather == bf16.root_gather and fp8.scatter == bf16.scatter
    e0, e1 = estimate(plain, layout), estimate(gather, layout)
    held = e0.memory_bytes["weights"] - e1.memory_bytes["weights"]  # the prefetched layer and the one in use
    assert 1.9 * layer <= held <= 2.1 * layer
    assert 0 < fp8_weight_cast(gather, layout, 1) < fp8_weight_cast(plain, layout, 1)  # the transpose, not the cast
    assert e1.time_s["dp_comm"] < e0.time_s["dp_comm"] and e1.step_time < e0.step_time
    assert e1.assumptions["fp8_all_gather"] and not e0.assumptions["fp8_all_gather"]
    # torchtitan turns it on only where FSDP shards over data-parallel ranks (dp_shard_enabled): DDP, one rank, a
    # replicate-only HSDP and FSDP over context-parallel ranks alone run plain Float8, and so does the planner
    for lay in (Layout(dp=8, zero=0), Layout(dp=1), Layout(dp=8, zero=3, dp_shard=1), Layout(dp=1, cp=8, zero=3)):
        asked = estimate(gather, lay)
        assert asked.step_time == estimate(plain, lay).step_time, lay
        assert asked.memory_bytes == estimate(plain, lay).memory_bytes and not asked.assumptions["fp8_all_gather"], lay
    # MoE: torchtitan's routed experts (GroupedExperts) are no Float8Linear and gather in BF16, so on Mixtral 8x7B,
    # whose experts are 96 % of its weights, the FP8 gather saves a few percent of the data-parallel time, not half
    moe_plain, moe_gather = (make_job(load_model("mixtral-8x7b"), H100, 64, 4096, "torchtitan", precision="fp8",
                                      fp8_params=flag) for flag in (False, True))
    for ep in (1, 8):
        lay = Layout(dp=64, zero=3, ep=ep)
        before, after = estimate(moe_plain, lay).time_s["dp_comm"], estimate(moe_gather, lay).time_s["dp_comm"]
        assert 0.9 * before < after < before, ep


def test_unfused_adamw_moves_a_pass_per_operation():
    """Composer's DecoupledAdamW (composer v0.16.4 composer/optim/decoupled_weight_decay.py) runs one kernel per
    operation and tensor. Per FP32 element, weight_decay 0 as in llm-foundry's MPT recipes: exp_avg.mul_ (4 + 4),
    .add_(grad) (4 + 4 + 4), exp_avg_sq.mul_ (8), .addcmul_(grad, grad) (12), sqrt (8), the bias-correction divide (8),
    .add_(eps) (8), param.addcdiv_ (16) = 80 B; FSDP's clip_grad_norm_ reads each gradient for its norm (4) and
    multiplies it by the clip coefficient (8): 92 B. torchtitan's torch.optim.AdamW(foreach=True, weight_decay=0.1)
    (1ea476e9f train.py; _multi_tensor_adamw) makes the same passes with lerp_ for Composer's mul_ + add_ (12 for 20)
    and the decoupled weight decay as one more (params.mul_: 8): 80 + 12 = 92 B as well. A fused AdamW with clipping
    (Megatron's) moves 34 B (reads master, m, v and the gradient, 16; writes master, m, v and the BF16 weight, 14;
    the clip's read, 4). Same shards, same HBM: the optimizer's share of the step is 92 / 34 of the fused one's."""
    model = load_model("llama2-7b")
    layout = Layout(dp=8, micro_batch=1, zero=3, recompute="full")
    composer, titan, fused = (step_time(make_job(model, H100, 8, 2048, fw), layout)["optimizer"]
                              for fw in ("composer", "torchtitan", "megatron-core"))
    assert composer / fused == pytest.approx(92 / 34, rel=1e-9)
    assert titan == pytest.approx(composer, rel=1e-9)
    # 6.74 B parameters / 8 GPUs x 92 B at H100's 3.35 TB/s datasheet HBM bandwidth: 23 ms, less the part of the
    # datasheet rate a streaming kernel does not reach (kernels.hbm_rate) - at most a third more.
    assert 0.023 <= composer <= 0.023 * 4 / 3


def test_composer_loss_counts_the_training_metrics():
    """llm-foundry's MPT loss is flash-attn's xentropy on the BF16 logits: a max and a sum pass forward (2 + 2 B per
    logit), the logits read and the gradient written backward (2 + 2). Composer then evaluates MPT's two training
    metrics (LanguageCrossEntropy, LanguagePerplexity) on the same logits every micro-batch, each an F.cross_entropy
    whose log_softmax autocast runs in FP32: cast (2 + 4), max, sum and output passes (3 x 4) and the write (4) = 22.
    In all 4 + 44 + 4 = 52 B per logit, against torchtitan's eager FP32 cross-entropy's 22 + 26 = 48: 4 B per logit
    more, at HBM bandwidth, for every token of the step (one GPU, so no slowest-GPU factor)."""
    model = load_model("llama2-7b")
    layout = Layout(dp=1, micro_batch=2, zero=0, recompute="none")
    composer, titan = (step_time(make_job(model, H100, 4, 2048, fw), layout)["compute"] for fw in ("composer", "torchtitan"))
    logits = 4 * 2048 * model.vocab_size
    assert composer - titan == pytest.approx(4 * logits / kernels.hbm_rate(H100), rel=1e-6)


def test_composer_runs_fsdp_only():
    """Composer 0.16-0.17 wraps a model in FSDP, DDP or DeepSpeed: no tensor, pipeline or context parallelism."""
    composer = FRAMEWORKS["composer"]
    # Each refusal names the missing kind of parallelism and its fix, whatever ZeRO stage the layout asks for (at
    # ZeRO-0 a rule about DDP with TP would otherwise answer first and suggest ZeRO-2/3, which cannot help).
    for zero in (0, 3):
        for layout, why in ((Layout(dp=4, tp=2, zero=zero), "has no tensor parallelism (use --tp 1)"),
                            (Layout(dp=4, pp=2, zero=zero), "has no pipeline parallelism (use --pp 1)"),
                            (Layout(dp=4, cp=2, zero=zero), "context parallelism (drop --cp)")):
            assert why in composer.refusal(layout)
    assert composer.refusal(Layout(dp=8, zero=3)) is None
    # llm-foundry's MPT checkpoints whole blocks (modeling_mpt.py activation_checkpointing_fn: isinstance(module,
    # MPTBlock)): full recompute or none, not torchtitan's op-level selective checkpointing.
    assert "no selective recompute" in composer.refusal(Layout(dp=8, zero=3, recompute="selective"))
    assert composer.refusal(Layout(dp=8, zero=3, recompute="full")) is None


def test_a_search_under_a_stack_without_tp_or_pp_names_what_is_missing():
    """`plan --framework composer --tp 2` (llama2 --pp 2): the search has nothing to score and says which kind of
    parallelism the stack lacks, with the fix; without --tp the search scores tp 1 layouts only."""
    from shardwise.errors import UsageError
    from shardwise.planner.search import SearchSpace, search

    job = make_job(load_model("llama2-7b"), H100, 64, 2048, "composer")
    with pytest.raises(UsageError, match="composer has no tensor parallelism — allow tp 1"):
        search(job, 16, SearchSpace(tp=(2, 4)))
    llama2 = make_job(load_model("llama2-7b"), H100, 64, 2048, "llama2")
    with pytest.raises(UsageError, match="llama2 has no pipeline parallelism — allow pp 1"):
        search(llama2, 16, SearchSpace(pp=(2,)))
    result = search(job, 16)
    assert result.ranked and {e.layout.tp for e in result.ranked} == {1}
    # explain says why tp and pp are 1, not that "no other degree fits" (the heads would allow tp 2-16).
    from shardwise.planner.explain import explain

    words = explain(job, 16, result)
    assert "TP = 1: composer has no tensor parallelism; every GPU runs whole layers." in words
    assert any(p.startswith("PP = 1") and p.endswith("composer has no pipeline parallelism.") for p in words)


def test_tied_embedding_gradients_are_summed_between_the_edge_stages():
    # GPT-3 175B ties its LM head to the embedding: at pp 8 the first and the last stage each hold this GPU's
    # ceil(50257 / 8) = 6283 vocabulary rows of 12288 (77.2 M elements) and all-reduce their gradient once a step
    # (Megatron's embedding group). The two ranks are 7 x 2 x 8 = 112 ranks apart, on different DGX A100 nodes: a
    # 2-rank ring over one 200 Gb/s HDR NIC each, NCCL's 92 % of line rate = 23 GB/s of bus bandwidth, and for n = 2
    # nccl-tests' busBw of an all-reduce equals its algBw: time = bytes / 23 GB/s. Megatron-Core sums its FP32
    # main_grad (4 B a element: 13.4 ms); NeMo's distributed Adam keeps BF16 gradients (2 B: half of it).
    gpt3 = load_model("gpt3-175b")
    lay = Layout(dp=2, tp=8, pp=8)
    core = make_job(gpt3, A100, 16, 2048, "megatron-core")
    assert tied_embedding_time(core, lay) == pytest.approx(6283 * 12288 * 4 / 23e9, rel=0.02)
    nemo = make_job(gpt3, A100, 16, 2048, "nemo")
    assert tied_embedding_time(nemo, lay) == pytest.approx(tied_embedding_time(core, lay) / 2, rel=0.02)
    assert tied_embedding_time(core, lay.with_(pp=1, dp=16)) == 0  # one stage holds both
    untied = make_job(load_model("llama2-7b"), A100, 16, 2048, "megatron-core")
    assert tied_embedding_time(untied, Layout(dp=2, tp=8, pp=2)) == 0
    # once a step, in the per-step collectives
    assert step_time(core, lay)["step_comm"] >= tied_embedding_time(core, lay)


def test_deepspeeds_bf16_pipeline_accumulates_fp32_gradients_and_all_reduces_them():
    # DeepSpeed's BF16_Optimizer (v0.6.5 runtime/bf16_optimizer.py update_hp_grads, called after every micro-batch's
    # backward by the pipeline engine) casts each BF16 gradient to FP32 (read 2, write 4) and adds it into the FP32
    # copy (read 4 + 4, write 4): 18 B per local parameter, the first micro-batch too. GPT-3 175B at tp 8 · pp 8, a
    # middle stage: 12 layers of 12 h^2 / 8 weights plus 7 h / 8 sharded and 6 h replicated biases and norm
    # parameters, h = 12288: 2.719e9 parameters; at 90 % of the A100-80GB's 2,039 GB/s, 26.7 ms a micro-batch.
    gpt3, lay = load_model("gpt3-175b"), Layout(dp=8, tp=8, pp=8, zero=1, recompute="full")
    bf16 = make_job(gpt3, A100, 512, 2048, "deepspeed-bf16", flash_attention=False)
    h = 12288
    params = 12 * (12 * h * h / 8 + 7 * h / 8 + 6 * h)
    assert accumulation_time(bf16, lay, 3) == pytest.approx(18 * params / (2039e9 * 0.9), rel=0.01)
    fp16 = make_job(gpt3, A100, 512, 2048, "deepspeed", flash_attention=False)
    assert accumulation_time(fp16, lay, 3) == 0  # its ZeRO-1 path: autograd accumulates, as every stack's GEMMs here
    # At the end of the step both paths all-reduce whole gradients in 16 bits and all-gather the updated partitions
    # (the same NCCL bytes); they differ in the HBM passes around them: 36 B per local parameter for the BF16 path
    # (flatten the FP32 gradients 8, cast 6, scale 4, cast back 6, copy back 8, the gather's copy-out 4) against the
    # fp16 path's 16 (flatten 4, scale 4, copy back 4, copy-out 4): 20 B more, 30 ms for the 2.7e9 parameters.
    extra = step_time(bf16, lay)["dp_comm"] - step_time(fp16, lay)["dp_comm"]
    assert extra == pytest.approx(20 * params / (2039e9 * 0.9), rel=0.05)


def test_deepspeeds_2021_zero1_all_reduces_whole_gradients():
    # DeepSpeed v0.3.17-v0.7.1 runs ZeRO-1 through its stage-2 optimizer with contiguous_gradients forced off for
    # stage 1 (v0.5.5 engine.py _configure_zero_optimizer), so at the boundary reduce_ipg_grads takes
    # buffered_reduce_fallback: each flattened bucket is all-reduced whole (stage2.py allreduce_and_copy), not
    # reduce-scattered; after the step the updated FP16 partitions are all-gathered into a list (stage2.py step).
    # Ring all-reduce moves 2 (n-1)/n of the bytes per GPU, reduce-scatter and all-gather (n-1)/n each, so on a 175B
    # stage's bandwidth-bound sizes ZeRO-1 costs (2 + 1) / (1 + 1) = 1.5 times what reduce-scatter + all-gather does
    # (deepspeed-2024: since b288cf1b9, v0.7.2, stage 1 keeps contiguous gradients and reduces each range to its
    # owner). Plus the copies around them: flatten (read 2, write 2), div_ (2 + 2), copy back (2 + 2), the list
    # all-gather's copy-out (2 + 2) = 16 B per local parameter at 90 % of the A100-80GB's 2,039 GB/s.
    gpt3, lay = load_model("gpt3-175b"), Layout(dp=8, tp=8, pp=8, zero=1, recompute="full")
    h = 12288
    params = 12 * (12 * h * h / 8 + 7 * h / 8 + 6 * h)  # a middle stage, as above: 2.72e9
    old = make_job(gpt3, A100, 512, 2048, "deepspeed")
    new = make_job(gpt3, A100, 512, 2048, "deepspeed-2024", flash_attention=False)
    hbm = 2039e9 * 0.9
    copies = 16 * params / hbm
    # The NCCL times by hand: the 8 data-parallel ranks sit tp = 8 apart, one on each node, so every ring step
    # crosses the network, each GPU through its own 200 Gb/s NIC (25 GB/s, dgx-a100-80gb.toml) at the 92 % of line
    # rate NCCL's rings sustain (nccl-tests issue 119): 23 GB/s of bus bandwidth. 16-bit gradients and weights,
    # 5.44 GB: the ring all-reduce moves 2 x 7/8 of them through each NIC, 0.414 s; the all-gather 7/8, 0.207 s
    # (NCCL's tree all-reduce, at half that bandwidth, is slower; the latencies, ~0.3 ms, are within rel=2e-3).
    bus, grads = 25e9 * 0.92, 2 * params
    all_reduce, all_gather = 2 * 7 / 8 * grads / bus, 7 / 8 * grads / bus
    old_dp, new_dp = step_time(old, lay)["dp_comm"], step_time(new, lay)["dp_comm"]
    assert old_dp - copies == pytest.approx(1.5 * new_dp, rel=0.05)
    assert old_dp == pytest.approx(all_reduce + all_gather + copies, rel=0.05)
    # Exactly, for one stage's parameters (nothing is overlapped: overlap_comm off): ZeRO-1 pays the all-reduce, the
    # gather and 16 B; ZeRO-0 takes the same allreduce_and_copy (engine.py buffered_allreduce_fallback): the
    # all-reduce and its 12 B, without the gather and its 4 B.
    from shardwise.planner.overlap import Window, dp_exposed

    win, fw = Window(1.0, 2.0, 0.1, 0.2, 12, 64), FRAMEWORKS["deepspeed"]
    one = dp_exposed(old, lay, fw, params, params / 12, 192, win)
    assert one == (pytest.approx(all_reduce + all_gather + copies, rel=2e-3), 0.0)
    zero0 = dp_exposed(old, lay.with_(zero=0), fw, params, params / 12, 192, win)
    assert zero0 == (pytest.approx(all_reduce + 12 * params / hbm, rel=2e-3), 0.0)
    # What ZeRO-1 adds to ZeRO-0 is the gather and its copy-out, 4 B: 0.207 + 0.006 s.
    assert one[0] - zero0[0] == pytest.approx(all_gather + 4 * params / hbm, rel=5e-3)


@pytest.mark.parametrize("framework, states", [
    # docs/planner.md "Model states": Megatron keeps bf16 weights, an FP32 main_grad and an FP32 master with Adam's
    # m and v; the runtime trains FP32 parameters (their own master) with FP32 moments; NeMo AutoModel keeps bf16
    # parameters and bf16 Adam states, no master (from_config torch_dtype bfloat16, torch.optim.Adam).
    ("megatron-core", "bf16 weights 2, fp32 gradients 4, fp32 master + Adam moments 12"),
    ("shardwise", "fp32 weights 4, fp32 gradients 4, fp32 Adam moments 8"),
    ("automodel", "bf16 weights 2, bf16 gradients 2, bf16 Adam moments 4"),
    ("deepspeed-bf16", "bf16 weights 2, fp32 + bf16 gradients 6, fp32 master + Adam moments 12"),
])
def test_explain_names_each_model_states_dtype(framework, states):
    from shardwise.planner.explain import explain
    from shardwise.planner.search import SearchSpace, search

    job = make_job(load_model("tiny"), A100, 8, 64, framework)
    result = search(job, 2, SearchSpace(tp=(1,), pp=(1,)))
    assert any(f"({states})" in line for line in explain(job, 2, result))


# ------------------------------------------------------------------ hybrid sharding (HSDP)

IBM_H100 = dataclasses.replace(H100, inter_node_bandwidth=800 / 8 / 8 * 1e9)  # 800 Gb/s per node of 8 GPUs


def test_hsdp_all_reduces_each_gradient_shard_across_the_nodes():
    from shardwise.planner.overlap import replica_all_reduce

    # Llama 2 7B, one layer: 4 x 4096^2 attention + 3 x 4096 x 11008 MLP = 202.4 M parameters, 809.7 MB in FP32.
    # HSDP over 96 GPUs in shard groups of one node (8): after the reduce-scatter inside the node each GPU holds
    # 101.2 MB, all-reduced over the 12 GPUs with its local rank, one per node, 8 such groups sharing each node's
    # 800 Gb/s: 12.5 GB/s each, x 0.92 (NET_EFFICIENCY) = 11.5 GB/s bus. Ring: 2 x 11/12 x 101.2 MB / 11.5 GB/s =
    # 16.1 ms, plus microseconds of latency.
    job = make_job(load_model("llama2-7b"), IBM_H100, 192, 4096, "torchtitan")
    layer = 4 * 4096**2 + 3 * 4096 * 11008
    t = replica_all_reduce(job, Layout(dp=96, zero=3, micro_batch=2, dp_shard=8), 4 * layer, 0.0)
    assert t == pytest.approx(2 * 11 / 12 * 4 * layer / 8 / 11.5e9, rel=0.05)
    assert replica_all_reduce(job, Layout(dp=96, zero=3, micro_batch=2), 4 * layer, 0.0) == 0.0  # plain ZeRO-3


def test_hsdp_shards_states_over_its_group_and_saves_network_traffic_with_a_16_bit_reduce():
    from shardwise.planner.memory import memory_breakdown

    # Memory: Llama 2 7B's 6,738,415,616 parameters (its Hugging Face checkpoint), AdamW's 12 bytes each over a shard
    # group of 8, not 96: 10.1 GB per GPU.
    job = make_job(load_model("llama2-7b"), IBM_H100, 192, 4096, "composer-pure")
    full, hsdp = Layout(dp=96, zero=3, micro_batch=2), Layout(dp=96, zero=3, micro_batch=2, dp_shard=8)
    assert memory_breakdown(job, hsdp)[1]["optimizer"] == pytest.approx(12 * 6_738_415_616 / 8, rel=0.01)
    # Time: per step and node the network carries, in bytes per parameter, FULL_SHARD's forward and backward
    # all-gathers and BF16 reduce-scatter (2 + 2 + 2) but HSDP's BF16 all-reduce only (2 x 2); the shard group's
    # gathers stay on NVLink. On 800 Gb/s per node HSDP's data-parallel cost is the lower one.
    assert step_time(job, hsdp)["dp_comm"] < step_time(job, full)["dp_comm"]


def test_hybrid_sharding_is_checked_with_the_other_layout_rules():
    from shardwise.errors import UsageError

    model = load_model("llama2-7b")
    for bad, words in ((dict(dp_shard=5), "does not divide dp=96"), (dict(dp_shard=8, zero=2), "needs --zero 3"),
                       (dict(dp_shard=-1), "at least 1")):
        with pytest.raises(UsageError, match=words):
            validate_layout(Layout(dp=96, micro_batch=2, **{"zero": 3, **bad}), model, 192)
    assert FRAMEWORKS["megatron-core"].refusal(Layout(dp=96, zero=3, dp_shard=8)) is not None
    assert FRAMEWORKS["torchtitan"].refusal(Layout(dp=96, zero=3, dp_shard=8)) is None


def test_torch_fsdp_moves_the_unsharded_units_through_hbm_around_its_collectives():
    from shardwise.planner.kernels import hbm_rate
    from shardwise.planner.overlap import fsdp_copy_time

    model, hbm = load_model("llama2-13b"), hbm_rate(H100)
    fsdp1 = make_job(model, H100, 16, 2048, "composer")  # FSDP1, BF16 compute, FP32 reduce
    fsdp1_bf16 = make_job(model, H100, 16, 2048, "composer-pure")  # FSDP1, BF16 reduce
    fsdp2 = make_job(model, H100, 16, 2048, "torchtitan")  # FSDP2, BF16 compute, FP32 reduce
    # Per reduced gradient element, FSDP1 (_post_backward_hook, _reduce_grad): cast BF16 -> FP32 (read 2, write 4),
    # divide in place by the predivide factor (read 4, write 4) = 14 bytes; with a BF16 reduce only the division
    # (2 + 2) = 4.
    assert fsdp_copy_time(fsdp1, FRAMEWORKS["composer"], 0, 1e9, 0, 16) == pytest.approx(14e9 / hbm)
    assert fsdp_copy_time(fsdp1_bf16, FRAMEWORKS["composer-pure"], 0, 1e9, 0, 16) == pytest.approx(4e9 / hbm)
    # Per gathered element, FSDP1 casts only its own FP32 shard to the BF16 gather input (read 4, write 2 per local
    # element: 6 / 16 over 16 ranks); the gather lands in the flat parameter, no copy out.
    assert fsdp_copy_time(fsdp1, FRAMEWORKS["composer"], 1e9, 0, 0, 16) == pytest.approx(6e9 / 16 / hbm)
    # Per element of a unit's backward, FSDP1's autograd concatenates the views' BF16 gradients into the flat
    # gradient (split_with_sizes_backward: read 2, write 2) = 4 bytes, whether or not that micro-batch reduces.
    assert fsdp_copy_time(fsdp1, FRAMEWORKS["composer"], 0, 0, 1e9, 16) == pytest.approx(4e9 / hbm)
    # FSDP2 (_fsdp_collectives.py): the reduce-scatter copy-in casts each gradient into the FP32 input (2 + 4 = 6),
    # NCCL averages (no division kernel); each all-gather's copy-out reads and writes the BF16 weights (2 + 2 = 4), and
    # before it the FP32 shard is cast (4 + 2) and copied into the gather input (2 + 2): (6 + 4) / 16 per gathered
    # element over 16 ranks. 1e9 of each: 6 + 4 + 10 / 16 = 10.625 bytes.
    assert fsdp_copy_time(fsdp2, FRAMEWORKS["torchtitan"], 1e9, 1e9, 1e9, 16) == pytest.approx(10.625e9 / hbm)
    # AutoModel keeps no FP32 master (bf16 parameters): its shard is gathered as stored, no cast; 4 + 4 / 16 + 6.
    automodel = make_job(model, H100, 16, 2048, "automodel")
    assert fsdp_copy_time(automodel, FRAMEWORKS["automodel"], 1e9, 1e9, 0, 16) == pytest.approx(10.25e9 / hbm)
    # Megatron's and DeepSpeed's own sharding is not torch FSDP.
    assert fsdp_copy_time(make_job(model, H100, 16, 2048, "megatron-core"), FRAMEWORKS["megatron-core"], 1e9, 1e9, 1e9,
                          16) == 0


def test_a_run_that_turns_cudnn_attention_off_attends_with_flashattention2():
    # Transformer Engine under NVTE_FUSED_ATTN=0 (dgxc-benchmarking v24.11.1 nemo_megatron/launch.sh) runs flash-attn's
    # FlashAttention-2 instead of cuDNN's fused attention. FlashAttention-3's paper (Shah et al. 2024, Fig. 5, one H100
    # SXM5, BF16, head dim 128, 8K causal) measured the forward at 529 TFLOP/s (cuDNN) and 333 (FlashAttention-2): the
    # layer's attention forward takes 529 / 333 = 1.59x as long (Transformer Engine's own notebook, forward + backward
    # at 8K: 19.07 / 12.01 = 1.59), and the step is slower.
    from shardwise.planner.estimate import assumptions
    model = load_model("llama3.1-8b")
    lay = Layout(dp=1, tp=1, pp=1, micro_batch=2)
    job = make_job(model, H100, 2, 8192, "nemo")
    off = dataclasses.replace(job, attention="fa2")
    assert assumptions(job)["attention"] == "cudnn" and assumptions(off)["attention"] == "fa2"
    assert layer_cost(off, lay).attn_fwd / layer_cost(job, lay).attn_fwd == pytest.approx(529 / 333, rel=0.01)
    assert estimate(off, lay).step_time > estimate(job, lay).step_time


def test_nanotrons_eager_swiglu_is_priced_by_the_bytes_its_aten_ops_move():
    # nanotron's GLUActivation (models/llama.py at c2528430): split the fused gate/up output, SiLU one half, multiply by
    # the other; eager, so each op reads its inputs from HBM and writes its output. Count those bytes per f-element
    # from the aten ops the forward dispatches (BF16), independently of the planner, and compare with the profile.
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode
    from shardwise.planner.frameworks import get

    class Traffic(TorchDispatchMode):
        moved = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func._overloadpacket not in (torch.ops.aten.split, torch.ops.aten.split_with_sizes, torch.ops.aten.view):
                tensors = [t for t in (*args, out) if isinstance(t, torch.Tensor)]
                Traffic.moved += sum(t.numel() * t.element_size() for t in tensors)
            return out

    tokens, f = 8, 32
    merged = torch.randn(tokens, 2 * f, dtype=torch.bfloat16)
    with Traffic():
        gate, up = torch.split(merged, f, dim=-1)
        F.silu(gate) * up
    assert Traffic.moved / (tokens * f) == get("nanotron").glu_bytes == 10


def test_explain_names_torchaos_float8_all_gather_where_it_would_gather():
    # torchtitan's config leaves enable_fsdp_float8_all_gather off; where the winner shards its weights with FSDP,
    # explain says what the option would give, with the two keys to set, and says nothing once it is on or where
    # nothing is gathered (one data-parallel rank).
    from shardwise.planner.explain import explain
    from shardwise.planner.search import SearchSpace, search

    model = load_model("llama3-8b")

    def note(gpus: int, cp: int = 1, **flags):
        job = make_job(model, H100, 128, 8192, "torchtitan", precision="fp8", **flags)
        result = search(job, gpus, SearchSpace(tp=(1,), pp=(1,), cp=(cp,), micro_batch=(1,), zero=(3,)))
        return [p for p in explain(job, gpus, result) if p.startswith("FP8 gathers")], result.ranked[0]

    (said,), win = note(64)
    with_it = estimate(make_job(model, H100, 128, 8192, "torchtitan", precision="fp8", fp8_params=True), win.layout)
    assert "enable_fsdp_float8_all_gather = true" in said and "precompute_float8_dynamic_scale_for_fsdp" in said
    assert with_it.step_time < win.step_time and "(-" in said  # faster, and said so
    assert note(64, fp8_params=True)[0] == [] and note(8, cp=8)[0] == []  # FSDP over CP ranks alone gathers none


def test_estimate_says_when_fp8_params_gather_nothing(capsys):
    # --fp8-params under torchtitan where FSDP shards nothing (DDP): one note, in the table's output and in the JSON,
    # instead of a silent no-op; none where it runs.
    import json

    from shardwise.cli import main

    argv = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8",
            "--seq-len", "8192", "--micro-batch", "1", "--framework", "torchtitan", "--precision", "fp8",
            "--fp8-params", "--recompute", "full"]
    assert main(argv + ["--zero", "0"]) == 0
    assert "gathers none" in capsys.readouterr().out.replace("\n", " ")
    assert main(argv + ["--zero", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not doc["assumptions"]["fp8_all_gather"] and any("gathers none" in n for n in doc["assumptions"]["implied"])
    assert main(argv + ["--zero", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["assumptions"]["fp8_all_gather"] and not any("gathers none" in n for n in doc["assumptions"]["implied"])


def test_explain_lists_every_tp_degree_and_says_when_a_group_spans_nodes():
    # GPT-3's 96 heads on 48 nodes of 8: tp 3, 6, 12 ... are degrees too, and tp 6's groups do not tile the nodes,
    # so its TP traffic is the network's; the other degrees listed are the fastest ones, the runner-up's among them.
    from shardwise.planner.explain import tp_paragraph
    from shardwise.planner.search import SearchSpace, search

    job = make_job(load_model("gpt3-175b"), A100, 1536, 2048, "deepspeed")
    result = search(job, 384, SearchSpace(tp=(1, 2, 3, 4, 6, 8), pp=(8, 16)))
    words = tp_paragraph(job, 384, result)
    assert "(possible here: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96)" in words
    assert result.ranked[0].layout.tp == 8
    runner = next(e.layout.tp for e in result.ranked if e.layout.tp != 8)
    assert f"tp={runner}:" in words.split("Best step at other degrees:")[1]
    six = search(job, 384, SearchSpace(tp=(6,), pp=(8, 16)))
    assert "the inter-node network (groups of 6 do not tile nodes of 8" in tp_paragraph(job, 384, six)


def test_explain_says_no_pipeline_fits_one_gpu_and_when_no_tp_degree_stays_in_a_node(tmp_path):
    """One GPU: no pipeline to split over (it pointed at estimate --pp N); nodes of 3 GPUs, where none of the tp
    degrees the heads allow (2, 4) divides the node: the NVLink rule is said with that caveat (a review, 2026-12-07)."""
    from dataclasses import replace

    from shardwise.planner.explain import pp_paragraph, tp_paragraph
    from shardwise.planner.search import SearchSpace, search

    one = make_job(load_model("tiny"), load_cluster("dgx-h100-80gb"), 8, 256, "megatron-core")
    assert pp_paragraph(one, search(one, 1, SearchSpace()), 1).endswith("One GPU has no pipeline to split over.")
    three = replace(load_cluster("dgx-h100-80gb"), gpus_per_node=3)
    job = make_job(load_model("llama3-8b"), three, 48, 2048, "megatron-core")
    words = tp_paragraph(job, 12, search(job, 12, SearchSpace()))
    assert "(possible here: 1, 2, 4)" in words and "(none of the possible tp > 1 here does)" in words
    assert "(none of" not in tp_paragraph(one, 8, search(one, 8, SearchSpace()))


def test_explain_counts_the_recompute_beside_the_dominant_compute():
    # plan's summary counts recompute in compute; explain's dominant term names it beside the compute it repeats
    from shardwise.planner.explain import uncertainty
    from shardwise.planner.search import SearchSpace, search

    job = make_job(load_model("gpt3-175b"), A100, 1536, 2048, "megatron-2021")
    result = search(job, 1024, SearchSpace(tp=(8,), pp=(8,), recompute=("full",)))
    t = result.ranked[0].time_s
    assert t["recompute"] > 0
    assert "more recomputing it" in uncertainty(job, result)[0]


def test_context_parallel_layers_hold_their_k_v_buffers_in_memory():
    # all-gather CP holds every rank's K/V block of the layer it runs (and their gradients in backward); the ring the
    # block in use and the one arriving: Llama 3.1 70B at 1M tokens, tp 8 x cp 8 (kv_dim 1,024 / tp 8, 131,072
    # tokens a rank: blocks of 64 MiB), about 1 GiB more for the all-gather than for the ring, as many blocks apart
    from shardwise.planner.memory import cp_buffer_bytes, cp_kv_blocks, memory_breakdown

    job = make_job(load_model("llama3.1-70b"), H100, 8, 1 << 20, "megatron-core")
    ring, gather = (Layout(tp=8, cp=8, dp=1, zero=3, recompute="full", cp_mode=m) for m in ("ring", "allgather"))
    block = 64 * 2**20  # K and V, 131,072 tokens x 128 channels of this rank, 2 bytes each
    assert cp_kv_blocks(job, ring, (1 << 20) // 8) == (block, block)
    assert cp_buffer_bytes(job, gather) - cp_buffer_bytes(job, ring) == (8 - 2) * 2 * block
    held = {lay.cp_mode: memory_breakdown(job, lay)[1]["activations"] for lay in (ring, gather)}
    assert held["allgather"] - held["ring"] == pytest.approx(12 * block)
    assert cp_buffer_bytes(job, ring.with_(cp=1)) == 0


def test_the_step_scalars_pipeline_group_spans_the_nodes_its_stages_sit_on():
    # Rank order pp, dp, cp, tp: at dp 1 x tp 1 x pp 2 x cp 8 on 8-GPU nodes the two stages are 8 ranks apart, one
    # per node, so the gradient norm's and the loss's all-reduces over pp cross the network; on 16-GPU nodes they do
    # not. (The cp group of 8 sits in one node either way.)
    from shardwise.planner.step_time import step_comm_time
    job = make_job(load_model("llama3-8b"), load_cluster("dgx-h100-80gb"), 8, 16384, "megatron-core")
    lay = Layout(dp=1, tp=1, pp=2, cp=8, micro_batch=1, zero=1)
    wide = dataclasses.replace(job, cluster=dataclasses.replace(job.cluster, gpus_per_node=16, num_gpus=16))
    narrow = dataclasses.replace(job, cluster=dataclasses.replace(job.cluster, num_gpus=16))
    assert step_comm_time(narrow, lay) > step_comm_time(wide, lay)


def test_a_costlier_recompute_is_never_faster_under_interleaving():
    """The pipeline's idle time that hides gradient traffic is each rank's first chunk alone under interleaving (the
    last backward and the first forward are chunk 0's: schedules.simulate, p 4, m 8, v 2 ends rank r's last backward
    r x (b + w) / v before rank 0's). Crediting whole ranks let rank 1 hide its traffic behind rank 0's extra
    recompute: full recompute came out 0.04 % faster than none for this job."""
    argv = ["estimate", "--model", "deepseek-v3", "--cluster", "dgx-h200", "--gpus", "256", "--tp", "8", "--pp", "2",
            "--vpp", "3", "--schedule", "interleaved-1f1b", "--global-batch", "32", "--seq-len", "512",
            "--micro-batch", "1", "--zero", "3", "--dp-shard", "8", "--sequence-parallel", "--framework", "torchtitan",
            "--precision", "fp8", "--json"]
    steps = []
    for recompute in ("none", "selective", "full"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main([*argv, "--recompute", recompute]) == 0
        steps.append(json.loads(out.getvalue())["step_time_s"])
    assert steps == sorted(steps), steps


def test_torchao_weight_casts_widen_the_window_a_prefetched_gather_hides_behind():
    """torchao casts each Float8Linear's weight inside its forward, while FSDP2 fetches the next layer: the cast is
    part of the window the gather hides behind. Left out of it, FP8 shrank the window by its GEMM saving and then
    charged the cast on top, so this gather-bound job ran 4 % slower in FP8 than in BF16."""
    argv = ["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "128",
            "--seq-len", "1024", "--micro-batch", "1", "--zero", "3", "--recompute", "selective", "--framework",
            "torchtitan", "--no-compile", "--json"]
    runs = {}
    for precision in ("bf16", "fp8"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main([*argv, "--precision", precision]) == 0
        runs[precision] = json.loads(out.getvalue())
    gathers = runs["bf16"]["time_breakdown_s"]["dp_comm"]
    assert gathers > runs["bf16"]["time_breakdown_s"]["compute"]  # gather-bound: the case the window decides
    assert runs["fp8"]["step_time_s"] < runs["bf16"]["step_time_s"]
