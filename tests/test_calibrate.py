"""`shardwise calibrate`: a real world-2 gloo calibration writes a profile the planner loads and uses.

Timings are never asserted: only that the profile is well-formed, consistent with what the planner
reads, and that the planner's numbers really come from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardwise.calibrate import COLLECTIVES, Profile, fit_alpha_beta, gemm_shapes, parse_size
from shardwise.calibrate.comm import cp_attention_flops
from shardwise.calibrate.compute import (fit_line, fit_model, full_checkpoint_overhead, model_elementwise, model_flops,
                                         split_edges)
from shardwise.cli import main
from shardwise.planner.comm import collective_time, interpolate
from shardwise.planner.job import Job
from shardwise.planner.layer_time import achievable_flops, matmul_params_per_layer
from shardwise.specs import ClusterSpec, Layout, TrainSpec, load_cluster, load_model

SIZES = [1024, 65536, 1048576]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _calibrate_cmd(out: Path) -> list[str]:
    return ["calibrate", "--world", "2", "--backend", "gloo", "--sizes", "1K", "64K,1M", "--repeats", "3",
            "--warmup", "1", "--copy-size", "4M", "--seq-len", "32", "--out", str(out), "--json"]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """One real calibration through the CLI: (profile path, its --json output)."""
    out = tmp_path_factory.mktemp("cal") / "profile.toml"
    proc = subprocess.run([sys.executable, "-m", "shardwise", *_calibrate_cmd(out)], capture_output=True,
                          text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout)


def test_profile_loads_with_positive_monotone_tables(calibrated):
    path, printed = calibrated
    cluster = load_cluster(str(path))
    assert cluster.gpus_per_node == 2 and cluster.num_gpus == 2
    for value in (cluster.peak_flops, cluster.hbm_bandwidth, cluster.intra_node_bandwidth, cluster.intra_node_latency,
                  cluster.gpu_memory_bytes):
        assert value > 0
    m = cluster.measured
    assert m["world_size"] == 2 and m["backend"] == "gloo"
    assert m["model_tflops"] > 0 and m["layer_overhead_s"] >= 0 and len(m["model_points"]) == 4
    assert m["step_overhead_s"] >= 0
    for key in ("sync_overhead_s", "p2p_sync_s", "checkpoint_overhead_s", "fsdp_call_s", "fsdp_tensor_s", "ddp_microbatch_s",
                "zero1_call_s", "train_step_overhead_s", "split_backward_s", "pipeline_exchange_s", "lockstep_spread"):
        assert m[key] >= 0, key
    assert len(m["sync_points"]) == 10 and m["sync_points"][6] > m["sync_points"][0]  # a stage is longer than a layer
    assert [w for w, _ in m["wait_penalty_points"]] == [m["sync_points"][0], m["sync_points"][6]]
    assert all(x >= 0 for _, x in m["wait_penalty_points"])
    assert [w for w, _ in m["handoff_points"]] == [m["sync_points"][0], m["sync_points"][6]]
    assert all(x >= 0 for _, x in m["handoff_points"])
    assert 0 < m["action_scatter"] < 5  # one stage call's scatter: some, on any machine, and not wild
    assert m["comm_overlap"] == 0.0  # gloo: collectives block the compute thread
    # the model split over both ranks by tensor parallelism, beside the plain one, and what each TP call costs there
    # (at least minus the cheapest table time at a layer's activation: no call costs less than nothing)
    assert len(m["tp_points"]) == 3 and min(m["tp_points"]) > 0  # plain, TP, TP with SP
    assert "tp_sp_call_s" in m
    activation = 32 * load_model("tiny").hidden * 4
    assert m["tp_call_s"] >= -min(interpolate(m[k], activation) for k in ("all_reduce", "all_gather", "reduce_scatter"))
    assert m.get("other_cpu_cores", 0.0) >= 0  # other processes' CPU use meanwhile (absent where unknown)
    # the reference workload (the smallest micro-batch) per round: the overall median lies between theirs
    rounds = m["reference_rounds_s"]
    assert len(rounds) == 3 and min(rounds) > 0
    assert min(rounds) <= m["model_points"][0][1] <= max(rounds)
    assert m["matmul_tflops"] * 1e12 == pytest.approx(cluster.peak_flops)
    for kind in COLLECTIVES:
        sizes, times = zip(*m[kind])
        assert list(sizes) == SIZES  # fp32, divisible by the world: exactly the sizes asked for
        assert all(t > 0 for t in times)
        assert list(times) == sorted(times), kind
    # --json prints what the file holds.
    assert printed["measured"]["all_reduce"] == m["all_reduce"]
    assert printed["cluster"]["peak_tflops"] == pytest.approx(cluster.peak_flops / 1e12)


def test_calibration_holds_one_data_parallel_mesh_as_train_does(calibrated):
    """Each gloo group keeps an event-loop thread waking 100 times a second, and their number changes how fast a CPU
    rank computes (validate.measure.mesh_split), so calibrate measures beside what a world-2 data-parallel `train`
    holds: the default group + one mesh of 4 (pp, dp, cp, tp; a DeviceMesh makes one per dimension, size 1 too) = 5.
    The FSDP layer and train's loop each built their own mesh before: 9."""
    if sys.platform.startswith("linux"):  # where /proc names the threads
        assert load_cluster(str(calibrated[0])).measured["gloo_loop_threads"] == 5


def test_planner_reads_the_measured_tables(calibrated):
    path, _ = calibrated
    cluster = load_cluster(str(path))
    job = Job(load_model("tiny"), cluster, TrainSpec(global_batch=8, seq_len=32))
    assert achievable_flops(job) == pytest.approx(cluster.measured["model_tflops"] * 1e12)
    for kind in COLLECTIVES:
        assert collective_time(cluster, kind, 300_000, 2) == pytest.approx(interpolate(cluster.measured[kind], 300_000))
    # A group of another size than the calibrated one falls back to alpha-beta from the fitted keys.
    from shardwise.planner.comm import alpha_beta_time, link

    bw, lat = link(cluster, 4, 1)
    assert bw == pytest.approx(cluster.intra_node_bandwidth * 0.8) and lat == cluster.intra_node_latency
    assert collective_time(cluster, "all_reduce", 300_000, 4) == pytest.approx(alpha_beta_time(cluster, "all_reduce", 300_000, 4))


def _estimate(capsys, profile: Path, framework: str = "megatron-core") -> dict:
    code = main(["estimate", "--model", "tiny", "--cluster", str(profile), "--gpus", "2", "--tp", "2",
                 "--global-batch", "8", "--seq-len", "32", "--micro-batch", "1", "--framework", framework, "--json"])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_runs_on_the_profile_and_follows_its_numbers(calibrated, capsys, tmp_path):
    path, _ = calibrated
    base = _estimate(capsys, path)
    text = path.read_text()
    measured = load_cluster(str(path)).measured
    rate, overhead = measured["model_tflops"], measured["layer_overhead_s"]

    def variant(old: str, new: str, framework: str = "megatron-core") -> dict:
        changed = tmp_path / "changed.toml"
        changed.write_text(text.replace(old, new))
        assert changed.read_text() != text
        return _estimate(capsys, changed, framework)

    faster = variant(f"model_tflops = {rate!r}", f"model_tflops = {rate * 4!r}")
    assert faster["time_breakdown_s"]["compute"] < base["time_breakdown_s"]["compute"]
    changed = variant(f"layer_overhead_s = {overhead!r}", f"layer_overhead_s = {overhead + 1e-3!r}")
    # +1 ms per layer and micro-batch: 4 layers x 8 micro-batches (tp2, global batch 8, micro-batch 1)
    delta = changed["time_breakdown_s"]["compute"] - base["time_breakdown_s"]["compute"]
    assert delta == pytest.approx(4 * 8 * 1e-3, abs=2e-6)
    assert changed["time_breakdown_s"]["tp_comm"] == pytest.approx(base["time_breakdown_s"]["tp_comm"])
    step = variant(f"step_overhead_s = {measured['step_overhead_s']!r}", "step_overhead_s = 0.5")
    delta = step["time_breakdown_s"]["optimizer"] - base["time_breakdown_s"]["optimizer"]
    assert delta == pytest.approx(0.5 - measured["step_overhead_s"], abs=2e-6)
    # train's loop beyond a bare step: the shardwise profile adds it, a profile of another stack does not
    loop = f"train_step_overhead_s = {measured['train_step_overhead_s']!r}"
    for framework, added in (("shardwise", 0.5 - measured["train_step_overhead_s"]), ("megatron-core", 0.0)):
        delta = (variant(loop, "train_step_overhead_s = 0.5", framework)["time_breakdown_s"]["optimizer"]
                 - _estimate(capsys, path, framework)["time_breakdown_s"]["optimizer"])
        assert delta == pytest.approx(added, abs=2e-6), framework


def test_under_torchrun_each_process_is_one_rank(tmp_path):
    out = tmp_path / "profile.toml"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "shardwise", *_calibrate_cmd(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert load_cluster(str(out)).measured["world_size"] == 2


@pytest.mark.parametrize("argv, words", [
    (["--world", "0"], "--world must be at least 1"),
    (["--backend", "nccl", "--world", "4096"], "nccl"),
    (["--backend", "mpi"], "unknown backend"),
    (["--sizes", "12X"], "not a number of bytes"),
    (["--repeats", "0"], "--repeats"),
])
def test_bad_input_exits_2_with_one_line(argv, words, capsys, tmp_path):
    assert main(["calibrate", *argv, "--out", str(tmp_path / "p.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1
    assert not (tmp_path / "p.toml").exists()


def test_parse_size():
    assert [parse_size(s) for s in ("4096", "64K", "1M", "2GiB", "1.5k")] == [4096, 65536, 2**20, 2**31, 1536]


def test_gemm_shapes_count_the_planners_flops():
    model, tokens = load_model("tiny"), 96
    flops = sum(2 * m * n * k * c for m, n, k, c in gemm_shapes(model, tokens))
    per_token = model.num_layers * matmul_params_per_layer(model) + model.hidden * model.vocab_size
    assert flops == 3 * 2 * tokens * per_token  # forward + two backward GEMMs per linear layer


def _profile(tables: dict, world: int) -> Profile:
    return Profile(world=world, backend="gloo", device="cpu", dtype="float32", model="tiny", tokens=128,
                   memory_gib=1.0, matmul_tflops=0.1, gemms=[], copy_gbs=10.0, tables=tables, repeats=3)


def test_fit_recovers_alpha_beta_and_the_fallback_reproduces_the_tables():
    alpha, beta, n = 30e-6, 2e9, 4
    sizes = [2**k for k in range(10, 26, 3)]
    model = {"all_reduce": lambda b: 2 * (n - 1) * alpha + 2 * (n - 1) / n * b / beta,
             "all_gather": lambda b: (n - 1) * alpha + (n - 1) / n * b / beta,
             "reduce_scatter": lambda b: (n - 1) * alpha + (n - 1) / n * b / beta,
             "broadcast": lambda b: (n - 1) * alpha + b / beta,
             "send_recv": lambda b: alpha + b / beta}
    tables = {k: [[b, f(b)] for b in sizes] for k, f in model.items()}
    for kind, points in tables.items():
        fitted_beta, _ = fit_alpha_beta(kind, points, n)
        assert fitted_beta == pytest.approx(beta, rel=1e-6)
    profile = _profile(tables, n)
    cluster = ClusterSpec(**{**profile.to_cluster().__dict__, "measured": {}})
    for kind, f in model.items():  # large sizes: bandwidth-bound, the fallback matches the table
        assert collective_time(cluster, kind, sizes[-1], n if kind != "send_recv" else 2) == pytest.approx(f(sizes[-1]), rel=0.02)


def test_monotone_tables_cap_small_sizes_by_larger_ones():
    profile = _profile({"all_reduce": [[1024, 5e-4], [4096, 2e-4], [65536, 3e-4]]}, 2)
    assert profile.monotone_tables()["all_reduce"] == [[1024, 2e-4], [4096, 2e-4], [65536, 3e-4]]


def test_theil_sen_ignores_one_disturbed_point():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    ys = [0.5 + 2 * x for x in xs]
    ys[3] += 40  # a busy moment
    assert fit_line(xs, ys) == pytest.approx((0.5, 2.0))


def test_element_wise_passes_are_the_planners_hand_derived_bytes():
    # tiny (hidden 64, FFN 128), one sequence of 64 tokens, fp32, 10 GB/s: one layer's forward moves
    # 64 tokens x 4 bytes x (10 x 64 + 3 x 128) = 262,144 bytes: 26.2 us; forward + backward (1 + 2 passes)
    # over 4 layers: 12 x 26.2 us = 0.315 ms
    assert model_elementwise(load_model("tiny"), 4, 1, 64, 4, 10.0) == pytest.approx(12 * 262_144 / 10e9)


@pytest.mark.parametrize("model_name", ["tiny", "tiny-gpt2"])
def test_the_calibrated_planner_reproduces_the_model_times_it_was_fitted_on(model_name):
    """A machine whose layer costs 0.6 ms per micro-batch beyond its FLOPs at 30 GFLOP/s, whose embedding costs
    0.15 ms and whose norm + head + loss 0.9 ms at one sequence (the head's GEMMs among them), plus the element-wise
    passes at its 10 GB/s copy bandwidth; its 4-layer model measured at micro-batches 1-4 in three repeats. The fit
    and the edge split recover 0.6 ms, 30 GFLOP/s, 0.15 ms and 0.9 ms less the head's GEMMs; the planner's compute for
    one micro-batch of the same model (dp 1, tp 1, pp 1) is the measured time (the element-wise passes counted once:
    fitted into the rate and added again they made it 12 passes per layer too slow), and at pp 2 the two ranks' compute
    adds up to it, the last rank's larger by its edge less the first's (one fixed cost per layer instead gave each
    rank half of the two edges)."""
    from shardwise.planner.job import runtime_job
    from shardwise.planner.memory import rank_layers
    from shardwise.planner.step_time import stage_cost

    model, layers, seq, copy_gbs, rate = load_model(model_name), 4, 64, 10.0, 30e9
    xs = [model_flops(model, layers, b, seq) for b in (1, 2, 3, 4)]
    own = [model_elementwise(model, layers, b, seq, 4, copy_gbs) for b in (1, 2, 3, 4)]
    head_flops = 3 * 2 * seq * model.hidden * model.vocab_size  # at one sequence
    fixed = layers * 0.6e-3 + 0.15e-3 + 0.9e-3 - head_flops / rate
    times = [fixed + x / rate + o for x, o in zip(xs, own)]
    overhead, slope = fit_model(xs, [times] * 3, own)
    assert 1 / slope == pytest.approx(rate)
    split = split_edges(overhead, slope, [0.15e-3, 0.9e-3], head_flops, layers)
    assert split == pytest.approx({"layer_overhead_s": 0.6e-3, "embedding_overhead_s": 0.15e-3,
                                   "head_overhead_s": 0.9e-3 - head_flops / rate})
    profile = Profile(world=1, backend="gloo", device="cpu", dtype="float32", model=model_name, tokens=seq,
                      memory_gib=1.0, matmul_tflops=0.05, gemms=[], copy_gbs=copy_gbs, model_tflops=1 / slope / 1e12,
                      **split)
    for b, measured in zip((1, 2, 3, 4), times):
        job = runtime_job(model, profile.to_cluster(), b, seq, gpu=False)
        assert stage_cost(job, Layout(micro_batch=b), 0).compute == pytest.approx(measured, rel=1e-9), b
    job, pp2 = runtime_job(model, profile.to_cluster(), 2, seq, gpu=False), Layout(pp=2)
    first, last = stage_cost(job, pp2, 0).compute, stage_cost(job, pp2, 1).compute
    assert first + last == pytest.approx(times[0], rel=1e-9)
    layer = (times[0] - 0.15e-3 - 0.9e-3) / layers  # one layer's share at one sequence
    extra = rank_layers(job, pp2, 1) - rank_layers(job, pp2, 0)
    assert last - first == pytest.approx(extra * layer + 0.9e-3 - 0.15e-3, rel=1e-9)


@pytest.mark.parametrize("model_name", ["tiny", "tiny-gpt2", "tiny-moe", "tiny-moe dense first"])
def test_full_recompute_costs_the_calibrated_model_what_calibrate_measured(model_name):
    """The 4-layer model measured with every layer checkpointed whole, 9 ms above without at one sequence: the planner's
    recompute term for that model and micro-batch (dp 1, pp 1, one micro-batch) is those 9 ms, whatever the rate and
    per-layer cost; a calibration that did not measure it keeps selective recompute's per-layer cost."""
    from shardwise.planner.job import runtime_job

    import dataclasses

    model, layers, seq, rate, copy_gbs = load_model(model_name.split()[0]), 4, 64, 30e9, 10.0
    if model_name.endswith("dense first"):  # a dense first layer (DeepSeek's first_k_dense_replace): FC2 there only
        model = dataclasses.replace(model, moe_layers=(1, 2, 3))
        model_name = "tiny-moe"
    profile = Profile(world=1, backend="gloo", device="cpu", dtype="float32", model=model_name, tokens=seq,
                      memory_gib=1.0, matmul_tflops=0.05, gemms=[], copy_gbs=copy_gbs, model_tflops=rate / 1e12,
                      layer_overhead_s=0.6e-3, checkpoint_overhead_s=0.4e-3)
    profile.full_checkpoint_overhead_s = full_checkpoint_overhead(model, layers, 1, seq, 1 / rate, 0.6e-3, 4, copy_gbs, 9e-3)
    assert profile.full_checkpoint_overhead_s > 0
    job = runtime_job(model, profile.to_cluster(), 1, seq, gpu=False)
    assert estimate_time(job, Layout(recompute="full"))["recompute"] == pytest.approx(9e-3, rel=1e-9)
    profile.full_checkpoint_overhead_s = 0.0  # measured as nothing beyond the recomputed forward
    job = runtime_job(model, profile.to_cluster(), 1, seq, gpu=False)
    forward = estimate_time(job, Layout(recompute="full"))["recompute"]
    assert full_checkpoint_overhead(model, layers, 1, seq, 1 / rate, 0.6e-3, 4, copy_gbs, forward) == pytest.approx(0, abs=1e-12)


def test_a_calibrations_early_stop_saving_scales_with_the_model_planned():
    """torch's checkpoint stops the recomputed forward before FC2 (the runtime's early stop): calibrate measures that on
    its own model, and the planner takes out each planned model's own FC2, so a model with a 4x wider FFN recomputes
    less than its 4x wider forward (a calibration's constant had carried the small model's saving)."""
    import dataclasses

    from shardwise.planner.job import runtime_job
    from shardwise.planner.step_time import stage_cost

    model, layers, seq, rate, copy_gbs = load_model("tiny"), 4, 64, 30e9, 10.0
    profile = Profile(world=1, backend="gloo", device="cpu", dtype="float32", model="tiny", tokens=seq,
                      memory_gib=1.0, matmul_tflops=0.05, gemms=[], copy_gbs=copy_gbs, model_tflops=rate / 1e12,
                      layer_overhead_s=0.6e-3, checkpoint_overhead_s=0.4e-3)
    profile.full_checkpoint_overhead_s = full_checkpoint_overhead(model, layers, 1, seq, 1 / rate, 0.6e-3, 4, copy_gbs, 9e-3)
    cluster = profile.to_cluster()
    wide = dataclasses.replace(model, ffn_hidden=4 * model.ffn_hidden)
    job = lambda m: runtime_job(m, cluster, 1, seq, gpu=False)  # noqa: E731
    recompute = lambda m: stage_cost(job(m), Layout(recompute="full"), 0).recompute  # noqa: E731
    forward = lambda m: model.num_layers * stage_cost(job(m), Layout(), 0).layer_f  # noqa: E731
    fc2 = 2 * seq * model.hidden * 3 * model.ffn_hidden / rate  # the wider FC2's extra seconds a layer
    assert recompute(wide) - recompute(model) == pytest.approx(forward(wide) - forward(model) - model.num_layers * fc2)


def test_warns_when_the_machine_changed_speed_during_the_calibration():
    from rich.console import Console

    from shardwise.commands.calibrate import _print

    def printed(rounds):
        profile = Profile(world=1, backend="gloo", device="cpu", dtype="float32", model="tiny", tokens=64,
                          memory_gib=1.0, matmul_tflops=0.05, gemms=[], copy_gbs=10.0, reference_rounds_s=rounds)
        console = Console(record=True, width=300)
        _print(console, profile, "p.toml")
        return profile.reference_drift(), console.export_text()

    drift, text = printed([0.004, 0.0041, 0.0042])
    assert drift == pytest.approx(1.05) and "speed moved" not in text
    drift, text = printed([0.00415, 0.0055, 0.00667])
    assert drift == pytest.approx(0.00667 / 0.00415) and "1.61x" in text and "4.15, 5.50, 6.67 ms" in text
    assert printed([])[0] == 1.0  # an older profile: no rounds, nothing to say


def _cp_profile(cp_points: list) -> Profile:
    """A world-2 calibration (tiny, 64 tokens): collectives 0.2 ms + bytes / 2 GB/s, an all-reduce after a layer
    0.5 ms beyond its table and a send/recv 0.3 ms (sync_points), the layer's plain, ring and all-gather attention."""
    tables = {kind: [[size, 2e-4 + size / 2e9] for size in (1024, 8192, 16384, 262144)] for kind in COLLECTIVES}
    call = 2e-4 + 16384 / 2e9  # the tables' all-reduce and send/recv of the 16 KiB activation after the layer
    return Profile(world=2, backend="gloo", device="cpu", dtype="float32", model="tiny", tokens=64, memory_gib=1.0,
                   matmul_tflops=0.06, gemms=[], copy_gbs=15.0, model_tflops=0.03, layer_overhead_s=5e-4,
                   tables=tables, sync_points=[1e-3, 1e-3 + call + 5e-4, call, 1e-3 + call + 3e-4, call],
                   sync_bytes=16384, cp_points=cp_points, cp_block_bytes=2 * 32 * 32 * 4,
                   cp_attention_s=cp_attention_flops(load_model("tiny"), 1, 64, 2) / 0.03e12)


def test_pipeline_exchange_is_the_line_through_its_two_measured_points():
    # The executor's exchange after a 1 ms layer costs 0.2 ms of table + 0.3 ms + 0.1 x 1 ms; after a 5 ms stage
    # 0.2 + 0.3 + 0.1 x 5 ms: calibrate keeps 0.3 ms beyond the table and the slope 0.1.
    table = 2e-4 + 16384 / 2e9
    p = _cp_profile([])
    p.sync_points += [1e-3 + table + 3e-4 + 1e-4, 5e-3, 5e-3 + table + 3e-4 + 5e-4]
    assert p.pipeline_exchange_s() == pytest.approx(3e-4) and p.lockstep_spread() == pytest.approx(0.1)
    # no dearer after the longer compute (noise): no slope, the whole cost after the layer beyond the table
    p.sync_points[7] = 5e-3 + table
    assert p.lockstep_spread() == 0.0 and p.pipeline_exchange_s() == pytest.approx(4e-4)
    assert _cp_profile([]).pipeline_exchange_s() == 0.0  # an older calibration: the planner keeps p2p_sync_s


def test_the_planner_charges_the_exchanges_spread_more_after_longer_actions():
    # Two calibrations with the same exchange beyond its table (0.3 ms), one measuring it 0.1 x the compute dearer after
    # compute: interleaved 1F1B's program charges the second more, and twice the micro-batch (longer actions between
    # exchanges) more again; the one-way wake-up of an older calibration is not charged beside the exchange.
    from shardwise.planner.job import runtime_job

    tiny, table = load_model("tiny"), 2e-4 + 16384 / 2e9

    def profile(k):
        p = _cp_profile([])
        p.sync_points += [1e-3 + table + 3e-4 + k * 1e-3, 5e-3, 5e-3 + table + 3e-4 + k * 5e-3]
        return p
    flat, spread = profile(0.0), profile(0.1)
    assert flat.pipeline_exchange_s() == pytest.approx(spread.pipeline_exchange_s()) == pytest.approx(3e-4)
    extra = []
    for mb in (1, 2):
        lay = Layout(pp=2, vpp=2, schedule="interleaved-1f1b", micro_batch=mb)
        job = lambda p: runtime_job(tiny, p.to_cluster(), 8 * mb, 64, gpu=False)  # 8 micro-batches either way
        a, b = (estimate_time(job(p), lay)["pp_p2p"] for p in (flat, spread))
        extra.append(b - a)
    assert 0 < extra[0] < extra[1]


def test_a_rank_that_waited_pays_the_handoffs_measured_turn_beyond_the_lockstep_exchange():
    # The exchange after a 1 ms layer costs 0.5 ms in lockstep ([5] - [0]), after a 5 ms stage 0.8 ms ([7] - [6]);
    # taking turns, a rank's turn of the layer costs 1.6 ms ([8]), of the stage 6.2 ms ([9]): 0.1 and 0.4 ms beyond
    # the lockstep exchange after the same compute, paid by a rank that waited a layer or a stage for its neighbour.
    from shardwise.planner.job import runtime_job

    p = _cp_profile([])
    p.sync_points += [1.5e-3, 5e-3, 5.8e-3]
    lockstep = Profile(**{**p.__dict__, "sync_points": list(p.sync_points)})
    p.sync_points += [1.6e-3, 6.2e-3]
    assert [x for point in p.wait_penalty_points() for x in point] == pytest.approx([1e-3, 1e-4, 5e-3, 4e-4])
    assert lockstep.wait_penalty_points() == []  # an older calibration: nothing charged
    assert p.measured_table()["wait_penalty_points"] == p.wait_penalty_points()
    # a turn no dearer than the lockstep exchange (noise): no penalty, never a credit
    q = Profile(**{**p.__dict__, "sync_points": p.sync_points[:8] + [1.4e-3, 5.8e-3]})
    assert [x for point in q.wait_penalty_points() for x in point] == pytest.approx([1e-3, 0.0, 5e-3, 0.0])
    # The planner charges the schedules whose ranks wait for each other's actions: interleaved 1F1B and naive more
    # than 1F1B, whose steady state keeps both ranks busy.
    tiny = load_model("tiny")
    extra = {}
    for name, v in (("1f1b", 1), ("interleaved-1f1b", 2), ("naive", 1)):
        lay = Layout(pp=2, vpp=v, schedule=name)
        a, b = (estimate_time(runtime_job(tiny, x.to_cluster(), 8, 64, gpu=False), lay)["pp_p2p"] for x in (lockstep, p))
        extra[name] = b - a
    assert 0 <= extra["1f1b"] < extra["interleaved-1f1b"] and extra["1f1b"] < extra["naive"]


def test_handoff_points_are_a_turn_beyond_its_compute_and_the_transfer():
    # Taking turns, a rank's turn of the 1 ms layer costs 1.6 ms ([8]), of the 5 ms stage 5.3 ms ([9]): beyond the
    # compute and the send_recv table's 16 KiB transfer, what a rank woken after waiting that long pays.
    p = _cp_profile([])
    p.sync_points += [1.5e-3, 5e-3, 5.8e-3]
    assert p.handoff_points() == []  # a calibration without the hand-offs: the lockstep exchange for everyone
    table = 2e-4 + 16384 / 2e9
    p.sync_points += [1.6e-3, 5e-3 + table + 1e-4]
    assert [x for point in p.handoff_points() for x in point] == pytest.approx([1e-3, 6e-4 - table, 5e-3, 1e-4])
    assert p.measured_table()["handoff_points"] == p.handoff_points()
    p.sync_points[9] = 5e-3  # a turn no dearer than its compute (noise): nothing, never a credit
    assert p.handoff_points()[1] == pytest.approx([5e-3, 0.0])


def test_with_a_measured_scatter_only_the_rank_that_waits_pays_the_exchange():
    # A 3-layer model's two stages are 2 layers (and the embedding) and 1 (and the head): every exchange, the second
    # stage has waited for the first. The later rank finds its message posted and pays the transfer alone (measured
    # in the executor's records: 0.2-0.6 ms against the lockstep loop's 1.1-1.5 ms, docs/accuracy.md), so how dear
    # the lockstep exchange is hardly moves the step; without a measured scatter (an older calibration) every waited
    # exchange pays it.
    from dataclasses import replace as with_

    from shardwise.planner.job import runtime_job

    spec = with_(load_model("tiny"), num_layers=3)
    table = 2e-4 + 16384 / 2e9

    def p2p(exchange_beyond: float, scatter: float) -> float:
        p = _cp_profile([])
        p.sync_points += [1e-3 + table + exchange_beyond, 5e-3, 5e-3 + table + exchange_beyond,
                          1e-3 + table + 1e-4, 5e-3 + table + 1e-4]
        p.action_scatter = scatter
        return estimate_time(runtime_job(spec, p.to_cluster(), 8, 64, gpu=False), Layout(pp=2))["pp_p2p"]

    cheap, dear = p2p(1e-4, 0.1), p2p(2e-3, 0.1)
    assert dear - cheap < 0.1 * 1.9e-3 * 16  # under a tenth of what 16 exchanges at 1.9 ms more would add
    assert p2p(2e-3, 0.0) - p2p(1e-4, 0.0) > 8 * 1.9e-3  # the older rule: the busier rank pays it on each


def test_context_parallel_attention_work_is_the_measured_layer_beyond_what_the_planner_counts():
    # tiny (K/V 32 wide) at 64 tokens on 2 ranks: a layer's local 32 queries; its K/V block 2 x 32 x 32 x 4 bytes =
    # 8 KiB. Ring at cp 2: 1 K/V hop forward, 1 + 2 backward, each the send/recv table (0.2 ms + 8192 / 2e9 s) + 0.3 ms;
    # all-gather: two 16 KiB all-gathers and a 16 KiB reduce-scatter, each table (0.2 ms + 16384 / 2e9 s) + 0.5 ms.
    # The attention FLOPs beyond the plain layer: 3 x 4 x 32 queries x 32 more keys x 64 wide / 0.8 at 30 GFLOP/s.
    # Measured layers built from those parts plus a known residue of the attention's own work (0.4 ms per ring step,
    # two steps at cp 2; 0.9 ms for the all-gather's layer): calibrate must recover the residue, and nothing else.
    plain, attention = 1.7e-3, 3 * 4 * 32 * 32 * 64 / 0.8 / 30e9
    hop, call = 2e-4 + 8192 / 2e9 + 3e-4, 2e-4 + 16384 / 2e9 + 5e-4
    ring, allgather = plain + attention + 4 * hop + 2 * 0.4e-3, plain + attention + 3 * call + 0.9e-3
    p = _cp_profile([plain, ring, allgather])
    assert p.sync_overhead_s() == pytest.approx(5e-4) and p.p2p_sync_s() == pytest.approx(3e-4)
    assert p.cp_attention_s == pytest.approx(attention)
    assert p.cp_ring_step_s() == pytest.approx(0.4e-3)
    assert p.cp_allgather_s() == pytest.approx(0.9e-3)
    # A calibration whose exchanges already account for the whole difference leaves no extra (never negative).
    assert _cp_profile([plain, plain + 1e-4, plain + 1e-4]).cp_ring_step_s() == 0.0
    assert _cp_profile([]).cp_ring_step_s() == 0.0 and _cp_profile([]).cp_allgather_s() == 0.0


@pytest.mark.parametrize("mode", ["ring", "allgather"])
def test_the_planner_charges_a_context_parallel_layer_what_calibrate_measured(mode):
    """The planner's cp2 layout (tiny, 64 tokens, 8 micro-batches of 1) against the plain model on the 32 tokens a
    rank holds: every term but the attention is the same, so the difference in compute + context-parallel exchanges
    is 8 micro-batches x 4 layers x (the measured context-parallel layer - the plain one) — calibrate's subtraction
    (the attention FLOPs, the exchanges at the tables) and the planner's charge count the same things."""
    from shardwise.planner.job import runtime_job

    plain, ring, allgather = 1.7e-3, 4.6e-3, 4.7e-3
    cluster, tiny = _cp_profile([plain, ring, allgather]).to_cluster(), load_model("tiny")
    cp = estimate_time(runtime_job(tiny, cluster, 8, 64, gpu=False), Layout(cp=2, cp_mode=mode))
    local = estimate_time(runtime_job(tiny, cluster, 8, 32, gpu=False), Layout())
    measured = ring if mode == "ring" else allgather
    assert cp["compute"] + cp["cp_comm"] - local["compute"] == pytest.approx(8 * 4 * (measured - plain), rel=1e-9)


def estimate_time(job, layout) -> dict:
    from shardwise.planner import estimate

    return estimate(job, layout).time_s


@pytest.mark.parametrize("extra", [0.0, 4e-3, 20e-3])
def test_the_planner_prices_a_tp_step_as_calibrate_measured_it(extra):
    """calibrate's TP forward + backward of its model (tiny, 4 layers, one 64-token micro-batch on 2 ranks) took
    `extra` seconds more than the planner's split FLOPs and TP calls at the tables + sync_overhead_s: each TP call's
    price (tp_call_s) is set so that the planner's tp2 step of the same model, 8 micro-batches, costs 8 x the measured
    TP - plain; where the tables alone exceed the measurement, no call goes below nothing."""
    from shardwise.calibrate.profile import tp_call_in_step
    from shardwise.planner.job import runtime_job

    tiny = load_model("tiny")
    p = _cp_profile([])

    def split_cost(profile) -> float:
        cluster = profile.to_cluster()
        tp = estimate_time(runtime_job(tiny, cluster, 8, 64, gpu=False), Layout(tp=2))
        plain = estimate_time(runtime_job(tiny, cluster, 8, 64, gpu=False), Layout())
        return tp["compute"] + tp["tp_comm"] + tp["recompute"] - plain["compute"] - plain["recompute"]

    plain_s = 8e-3
    planned = split_cost(p) / 8  # at sync_overhead_s a call (0.5 ms), as before this measurement
    p.tp_points, p.tp_layers = [plain_s, plain_s + planned + extra], 4
    p.tp_call_s = tp_call_in_step(p, tiny, 1, 64)
    assert p.tp_call_s > p.sync_overhead_s() if extra else p.tp_call_s == pytest.approx(p.sync_overhead_s())
    assert split_cost(p) == pytest.approx(8 * (p.tp_points[1] - p.tp_points[0]), rel=1e-9)
    # a TP step measured faster than its calls at the tables: each call at least costs nothing
    p.tp_points = [plain_s, plain_s / 4]
    table = 2e-4 + 64 * tiny.hidden * 4 / 2e9
    assert tp_call_in_step(p, tiny, 1, 64) == pytest.approx(-table)
    assert tp_call_in_step(_cp_profile([]), tiny, 1, 64) is None  # no TP measurement: the planner keeps sync_overhead_s
    # tables timed only below the layer's activation (--sizes 1K 4K): the floor is what the profile's loader allows,
    # not the tables extrapolated past their largest size, so calibrate never writes a file it then refuses
    from shardwise.specs import _check_measured, tp_call_credit

    p.tables = {k: [row for row in v if row[0] <= 4096] for k, v in p.tables.items()}
    p.tp_call_s = tp_call_in_step(p, tiny, 1, 64)
    assert p.tp_call_s == pytest.approx(-tp_call_credit(p.monotone_tables()))
    _check_measured(p.measured_table(), "profile.toml")


def test_sequence_parallel_calls_are_priced_from_the_split_with_sequence_parallelism():
    """calibrate times the model split with SP too (tp_points[2]): SP's all-gathers and reduce-scatters get their own
    price (tp_sp_call_s), at which the planner's tp2:sp step costs 8 x the measured SP - plain, while plain TP keeps
    its own; a calibration without the SP point (older, or a sequence that does not split) prices SP's calls as TP's."""
    from shardwise.calibrate.profile import tp_call_in_step
    from shardwise.planner.job import runtime_job

    tiny = load_model("tiny")
    p = _cp_profile([])

    def split_cost(profile, sp: bool) -> float:
        job = runtime_job(tiny, profile.to_cluster(), 8, 64, gpu=False)
        tp, plain = estimate_time(job, Layout(tp=2, sequence_parallel=sp)), estimate_time(job, Layout())
        return tp["compute"] + tp["tp_comm"] - plain["compute"]

    plain_s = 8e-3
    p.tp_points, p.tp_layers = [plain_s, plain_s + split_cost(p, False) / 8 + 4e-3], 4
    p.tp_call_s = tp_call_in_step(p, tiny, 1, 64)
    assert tp_call_in_step(p, tiny, 1, 64, sp=True) is None
    older = split_cost(p, True)  # SP's calls at tp_call_s
    p.tp_points.append(plain_s + split_cost(p, True) / 8 - 2e-3)  # SP measured 2 ms a micro-batch cheaper than that
    p.tp_sp_call_s = tp_call_in_step(p, tiny, 1, 64, sp=True)
    assert p.tp_sp_call_s < p.tp_call_s and p.measured_table()["tp_sp_call_s"] == p.tp_sp_call_s
    assert split_cost(p, True) == pytest.approx(8 * (p.tp_points[2] - p.tp_points[0]), rel=1e-9) == \
        pytest.approx(older - 16e-3, rel=1e-9)
    assert split_cost(p, False) == pytest.approx(8 * (p.tp_points[1] - p.tp_points[0]), rel=1e-9)  # TP keeps its own


def test_one_rank_alone_runs_the_model_as_the_base_it_is_compared_with(monkeypatch):
    """concurrent_slowdown compares the model timed on every rank at once with rank 0 running it alone; the variants run
    in a new order every repeat, and the recomputing ones (selective, full) leave the model so. Run right after them,
    the alone variant must still run the model without recompute, as its base does."""
    from shardwise.calibrate import measure
    from shardwise.calibrate.config import CalibrateConfig
    from shardwise.model import Transformer

    recomputing, forward = [], Transformer.forward

    def spy(self, *args, **kwargs):
        recomputing.append(any(b.recompute or b.attention.recompute_core for b in self.layers.values()))
        return forward(self, *args, **kwargs)

    seen = {}

    def after_recompute(self, fns, repeats, seed=0, barrier_each=False):  # an order the shuffle can draw
        for before in ("full 1", "selective 1"):
            fns[before]()
            recomputing.clear()
            fns["alone 1"]()
            seen[before] = list(recomputing)
        return {name: [1e-3 * (i + 1)] * repeats for i, name in enumerate(fns)}

    monkeypatch.setattr(Transformer, "forward", spy)
    monkeypatch.setattr(measure.Timer, "interleaved", after_recompute)
    t = measure.Timer(CalibrateConfig(model=load_model("tiny"), world=1, repeats=1, warmup=0, seq_len=16), 0, 1)
    out = {"copy_gbs": 10.0}
    for _ in measure.measure_model(t, out):
        pass
    assert seen == {"full 1": [False], "selective 1": [False]}


def test_the_plan_it_suggests_names_the_model_as_given(tmp_path):
    """A config file's profile records its file's stem as the model's name ("gpt2" for gpt2.json, a preset's name):
    the command calibrate prints at the end must name the file itself, or it plans the preset (or an unknown model)."""
    import shlex

    from rich.console import Console

    from shardwise.commands.calibrate import _print

    config = tmp_path / "my runs" / "gpt2.json"
    profile = Profile(world=1, backend="gloo", device="cpu", dtype="float32", model="gpt2", tokens=64,
                      memory_gib=1.0, matmul_tflops=0.05, gemms=[], copy_gbs=10.0)
    console = Console(record=True, width=400)
    _print(console, profile, str(tmp_path / "p.toml"), str(config))
    line = next(ln for ln in console.export_text().splitlines() if "use it:" in ln)
    argv = shlex.split(line.split("use it:", 1)[1])
    assert argv[argv.index("--model") + 1] == str(config) and argv[argv.index("--gpus") + 1] == "1"


def test_validate_refuses_a_profile_calibrated_at_another_world(tmp_path, capsys):
    """A profile's collectives and the ranks' sharing of the cores were measured at its own world size."""
    from shardwise.cli import main

    profile = tmp_path / "three.toml"
    from shardwise.model_spec import preset_dir

    preset = preset_dir("clusters").joinpath("dgx-h100-80gb.toml").read_text()
    profile.write_text(preset + "\n[measured]\nworld_size = 3\n")
    assert main(["validate", "--model", "tiny", "--world", "2", "--cluster", str(profile)]) == 2
    err = capsys.readouterr().err.strip()
    assert "calibrated on 3 ranks" in err and "--world 2" in err and "\n" not in err


def test_a_gpu_precision_calibration_runs_every_measurement():
    """On a GPU calibrate measures in BF16: the runtime's FP32 weights under BF16 autocast, as `train` runs them. Its
    first run on an H200 died in the split-backward measurement (a bf16 input into fp32 norm weights with no autocast
    around the forward), as did the tensor-parallel one under a CPU's autocast. Here the GPU's precision runs on two
    gloo ranks (dtype bfloat16: CPU autocast), every measurement of a two-rank profile included (tensor-parallel,
    context-parallel, the pipeline exchanges and the split backward)."""
    from shardwise.calibrate import calibrate
    from shardwise.calibrate.config import CalibrateConfig

    cfg = CalibrateConfig(model=load_model("tiny"), world=2, repeats=1, warmup=0, seq_len=16, sizes=(1024,),
                          copy_bytes=1 << 20, dtype="bfloat16")
    profile = calibrate(cfg)
    assert profile.dtype == "bfloat16"
    assert len(profile.cp_points) == 3 and len(profile.split_points) == 2 and profile.sync_points
    assert profile.model_tflops > 0 and len(profile.tp_points) == 3 and min(profile.tp_points) > 0


def test_estimate_as_shardwise_on_a_calibration_predicts_what_validate_does(calibrated, capsys):
    # `--framework shardwise` is this runtime: on a CPU calibration, fp32 activations and the tensors its model keeps,
    # as validate's prediction (planner.job.runtime_job) — it had priced bf16 activations under autocast, 0.2-1.6 %
    # off validate's step on every layout and off its memory.
    from shardwise.planner.estimate import estimate
    from shardwise.planner.job import runtime_job

    path, _ = calibrated
    said = _estimate(capsys, path, "shardwise")
    lay = Layout(**{k: said[k] for k in ("tp", "pp", "dp", "vpp", "micro_batch", "zero", "recompute", "recompute_layers",
                                         "sequence_parallel", "schedule", "cp", "cp_mode")})
    own = estimate(runtime_job(load_model("tiny"), load_cluster(str(path)), 8, 32, gpu=False), lay)
    assert said["step_time_s"] == pytest.approx(own.step_time, rel=1e-5)
    assert said["memory_gib_per_gpu"] == pytest.approx(own.memory_per_gpu / 2**30, abs=1e-3)  # 3 decimals


def test_a_table_whose_times_fall_never_prices_a_larger_message_at_nothing():
    # Beyond the largest size the line through the last two goes on; where their times fell (noise), it went below
    # zero and a data-parallel reduction was priced free. It goes on at least at the largest size's own rate.
    points = [[1024, 0.002], [65536, 0.001]]
    assert interpolate(points, 1 << 20) >= 0.001 * (1 << 20) / 65536 * (1 - 1e-9)
    assert interpolate([[1024, 1e-4], [65536, 1e-3]], 1 << 20) > 1e-3  # a rising table as before


ZERO1_SCRIPT = """
import collections, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
from shardwise.calibrate.comm import _plain_layer, fsdp_workloads
from shardwise.calibrate.config import CalibrateConfig
from shardwise.calibrate.timer import Timer
from shardwise.specs import load_model
mesh = init_device_mesh("cpu", (1, 2, 1, 1), mesh_dim_names=("pp", "dp", "cp", "tp"))
t = Timer(CalibrateConfig(model=load_model("tiny"), world=2).resolved(), 0, 2, mesh)
fns, _ = fsdp_workloads(t)
fns["plain"]()
def broadcasts(name):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fns[name]()
    return sum(e.name == "c10d::broadcast_" for e in prof.events())
print(broadcasts("plain update"), broadcasts("zero1 update"), len(list(_plain_layer(t.cfg.model, "meta").parameters())))
"""


def test_the_zero1_update_calibrate_times_broadcasts_every_tensor_as_the_runtime_does():
    # zero1_call_s is (the "zero1 update" - the plain one - the broadcast tables) per tensor: the update must be the
    # runtime's ZeRO-1 (torch's ZeroRedundancyOptimizer, one broadcast per parameter tensor after the step), on a fake
    # process group of two ranks in a process of its own
    done = subprocess.run([sys.executable, "-c", ZERO1_SCRIPT], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    plain, zero1, tensors = map(int, done.stdout.split()[-3:])
    assert (plain, zero1) == (0, tensors) and tensors > 3


def test_a_calibration_plans_the_runtime_it_measured_unless_told(calibrated, capsys):
    """A profile `calibrate` wrote holds this project's runtime's measured costs: with no --framework, plan and
    estimate price that runtime (shardwise, fp32 matmuls on gloo) and say why, where they took torchtitan's (bf16,
    ZeRO-3 filled in, pp 2 under megatron-core) and left out splits torchtitan cannot run as if they did not fit."""
    path, _ = calibrated
    common = ["--model", "tiny", "--cluster", str(path), "--gpus", "2", "--global-batch", "8", "--seq-len", "32", "--json"]
    assert main(["estimate", *common, "--pp", "2"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["framework"] == "shardwise" and "`shardwise calibrate`'s measurement" in est["framework_note"]
    assert est["assumptions"]["gemm_dtype"] == "fp32"
    assert main(["plan", *common, "--top", "10"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {c["framework"] for c in plan["candidates"]} == {"shardwise"}
    assert {(c["dp"], c["pp"]) for c in plan["candidates"]} >= {(2, 1), (1, 2)}  # the pipeline is planned too
    assert main(["estimate", *common, "--pp", "2", "--framework", "torchtitan"]) == 2  # named, the stack's own answer


def test_a_calibration_of_another_model_or_length_is_said(calibrated, capsys):
    """Its per-layer and per-call costs are the measured model's: another model, or another sequence length, is
    priced from them, and the answer says so (cluster_note) — nothing said where they are the job's own."""
    path, _ = calibrated
    measured = load_cluster(str(path)).measured
    same = ["--model", measured["model"], "--seq-len", str(measured["tokens"])]
    for what, note in ((same, None), (["--model", "tiny-gpt2", "--seq-len", str(measured["tokens"])], "tiny-gpt2"),
                       (["--model", measured["model"], "--seq-len", str(2 * measured["tokens"])], "at 32")):
        assert main(["estimate", *what, "--cluster", str(path), "--gpus", "2", "--global-batch", "8", "--json"]) == 0
        got = json.loads(capsys.readouterr().out).get("cluster_note")
        assert (got is None) if note is None else (f"calibrated on {measured['model']}" in got and note in got), got


def test_the_send_recv_beyond_its_table_is_read_at_the_pipeline_messages_size():
    """On a GPU the layers' all-reduce moves BF16 (sync_bytes) and the pipeline's send/recv FP32, twice the bytes
    (p2p_bytes): the send/recv's cost beyond its table is its measured call less the table at its own size. A profile
    from before p2p_bytes reads it at sync_bytes, as it was measured."""
    import dataclasses

    p = _cp_profile([])
    tables = dict(p.tables, send_recv=[[size, 2e-4 + size / 2e9] for size in (1024, 8192, 16384, 32768, 262144)])
    gpu = dataclasses.replace(p, tables=tables, sync_points=[1e-3, 0, 0, 1e-3 + 2e-4 + 32768 / 2e9 + 3e-4],
                              p2p_bytes=32768)
    assert gpu.p2p_sync_s() == pytest.approx(3e-4)
    older = dataclasses.replace(gpu, p2p_bytes=0, sync_points=[1e-3, 0, 0, 1e-3 + 2e-4 + 16384 / 2e9 + 3e-4])
    assert older.p2p_sync_s() == pytest.approx(3e-4)
