"""validate's drift correction (pure, < 2 s): a calibration rescaled to the machine's speed during the sweep
(calibrate.profile.at_speed) and the two speed ratios it is given (validate.machine_speed)."""

from __future__ import annotations

import dataclasses

import pytest

from shardwise.calibrate.config import COLLECTIVES
from shardwise.calibrate.profile import COMPUTE_RATES, NOT_SECONDS, SPEED_CLASS, Profile, at_speed, speed_ratios
from shardwise.planner import estimate
from shardwise.planner.job import runtime_job
from shardwise.specs import Layout, load_model
from shardwise.validate import describe

SIZES = [1024, 16384, 262144, 4194304]


def _profile() -> Profile:
    """A world-2 gloo calibration with every figure the planner reads (the sizes of one on this machine)."""
    return Profile(
        world=2, backend="gloo", device="x86_64", dtype="float32", model="tiny", tokens=64, memory_gib=8.0,
        matmul_tflops=0.06, gemms=[[64, 64, 64, 1e-5]], copy_gbs=15.0, model_tflops=0.03, layer_overhead_s=5e-4,
        embedding_overhead_s=1e-4, head_overhead_s=5e-4, edge_points=[1e-4, 1e-3], model_points=[[8e7, 4e-3]],
        optimizer_s=2e-3, optimizer_params=400_000, checkpoint_overhead_s=5e-4, checkpoint_points=[4e-3, 5e-3],
        sync_points=[1e-3, 2.5e-3, 3e-4, 2.2e-3, 2e-4, 2.4e-3, 5e-3, 7.2e-3, 2.5e-3, 7.8e-3], sync_bytes=16384, fsdp_call_s=7e-4, fsdp_tensors=12,
        ddp_microbatch_s=6e-4, fsdp_points=[5e-3, 1e-2, 2e-3, 6e-3, 5.5e-3], loop_points=[1e-2, 1.1e-2],
        split_points=[2e-3, 3.6e-3], split_layers=2, alone_points=[4e-3, 3.6e-3], concurrent_slowdown=1.1,
        cp_points=[1.7e-3, 8e-3, 7e-3], cp_attention_s=3e-5, cp_block_bytes=8192,
        tables={kind: [[size, 2e-4 + size / 2e9] for size in SIZES] for kind in COLLECTIVES},
        reference_rounds_s=[4e-3, 4.1e-3, 4e-3], other_cpu_cores=0.02)


LAYOUTS = [Layout(dp=2), Layout(dp=2, micro_batch=2), Layout(tp=2), Layout(tp=2, sequence_parallel=True),
           Layout(pp=2, schedule="1f1b"), Layout(pp=2, schedule="naive"), Layout(pp=2, schedule="zb-h1"),
           Layout(pp=2, schedule="interleaved-1f1b", vpp=2), Layout(dp=2, zero=1), Layout(dp=2, zero=2),
           Layout(dp=2, zero=3, recompute="full"), Layout(cp=2, cp_mode="ring"), Layout(cp=2, cp_mode="allgather")]


def _time(cluster, layout, key=None):
    est = estimate(runtime_job(load_model("tiny"), cluster, 8, 64, gpu=False), layout)
    return est.step_time if key is None else est.time_s[key]


def _gpu_profile(host_layer_s: float = 2e-3) -> Profile:
    """_profile() with a GPU's host floor (its model at 16 tokens 4 x host_layer_s + edges)."""
    return dataclasses.replace(_profile(), host_layer_s=host_layer_s, host_embedding_s=1e-4, host_head_s=3e-4,
                               host_floor_points=[4 * host_layer_s + 4e-4, 1e-4, 3e-4])


def test_every_profile_key_has_one_speed_class():
    """A new [measured] key must say how it moves with the machine's speed, or the correction silently skips it."""
    classes = [set(SPEED_CLASS), set(COMPUTE_RATES), set(NOT_SECONDS)]
    assert set(_gpu_profile().measured_table()) <= set().union(*classes)
    assert sum(len(c) for c in classes) == len(set().union(*classes))  # no key in two classes


def _uniform(k):
    return speed_ratios({"compute": k, "calls": k, "p2p": k, "exchange": k, "fsdp": k})


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu-host-bound"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: describe(lay).replace(" ", "-"))
def test_a_machine_k_times_slower_takes_k_times_every_step(layout, gpu):
    """Every step time is sums and maxima of calibrated times (compute, calls, the pipeline program's waits, a GPU's
    host floor), so a machine on which all of them take k times as long predicts k times the step: nothing is left
    unscaled."""
    cluster = (_gpu_profile(5e-3) if gpu else _profile()).to_cluster()
    assert _time(at_speed(cluster, _uniform(1.7)), layout) == pytest.approx(1.7 * _time(cluster, layout), rel=1e-9)


def test_each_kind_of_call_moves_its_own_terms():
    """Compute x 2 doubles the layers' compute and leaves tensor parallelism's calls alone; collectives x 3 does the
    reverse (gloo on CPU: nothing overlaps, so each term is one or the other); send/recv x 3 moves only what a
    pipeline exchanges (its p2p term) and FSDP x 3 only ZeRO-3's calls beyond their tables."""
    cluster, tp, pp, z3 = _profile().to_cluster(), Layout(tp=2), Layout(pp=2), Layout(dp=2, zero=3)

    def ratio(layout, key, **r):
        return _time(at_speed(cluster, {**_uniform(1.0), **r}), layout, key) / _time(cluster, layout, key)
    assert ratio(tp, "compute", compute=2.0) == pytest.approx(2) and ratio(tp, "tp_comm", compute=2.0) == pytest.approx(1)
    assert ratio(tp, "tp_comm", calls=3.0) == pytest.approx(3) and ratio(tp, "compute", calls=3.0) == pytest.approx(1)
    # (the pipeline program's waits are maxima over both ranks' arrivals, so its term grows, not exactly 3x)
    assert ratio(pp, "pp_p2p", p2p=3.0) > 1.1 and ratio(tp, "tp_comm", p2p=3.0) == pytest.approx(1)
    assert ratio(pp, "compute", p2p=3.0) == pytest.approx(1) and ratio(pp, "pipeline_bubble", p2p=3.0) == pytest.approx(1)
    # the executor's exchange beyond its table: only the pipeline's p2p term
    assert ratio(pp, "pp_p2p", exchange=3.0) > 1.5 and ratio(tp, "tp_comm", exchange=3.0) == pytest.approx(1)
    assert ratio(pp, "compute", exchange=3.0) == pytest.approx(1)
    # ZeRO-3's 14 calls per micro-batch: 3x the fsdp_call_s part of dp_comm, its table part unchanged
    calls = 4 * 14 * cluster.measured["fsdp_call_s"]
    wire = _time(cluster, z3, "dp_comm") - calls
    assert _time(at_speed(cluster, {**_uniform(1.0), "fsdp": 3.0}), z3, "dp_comm") == pytest.approx(wire + 3 * calls)


def _cfg(cluster):
    from shardwise.validate import ValidateConfig

    return ValidateConfig(model=load_model("tiny"), cluster=cluster, seq_len=64)


def test_machine_speed_pairs_each_call_with_what_it_ran_beside():
    """Each call's time now is the median of the repeats' paired differences, set beside the calibration's (an
    all-reduce after a layer: sync_points[1] - sync_points[0] = 1.5 ms; a send/recv: [3] - [0] = 1.2 ms; ZeRO-3's
    layer beyond a plain one: fsdp_points[1] - [0] = 5 ms); the compute's is the model at one sequence."""
    from shardwise.validate import machine_speed

    cfg = _cfg(_profile().to_cluster())
    now = {"reference": [6e-3, 5e-3, 8e-3], "layer": [1e-3, 2e-3, 1e-3], "both": [4e-3, 5e-3, 4e-3],
           "p2p": [2.2e-3, 3.2e-3, 2.2e-3], "plain": [5e-3, 6e-3, 5e-3], "sharded": [7.5e-3, 8.5e-3, 7.5e-3]}
    speed = machine_speed(cfg, now)
    assert speed["speed_ratio"] == pytest.approx(6e-3 / 4e-3)
    assert speed["call_s"] == pytest.approx(3e-3) and speed["calibration_call_s"] == pytest.approx(1.5e-3)
    assert speed["call_speed_ratio"] == pytest.approx(2.0)
    assert speed["p2p_speed_ratio"] == pytest.approx(1.0) and speed["fsdp_speed_ratio"] == pytest.approx(0.5)
    # one rank (no call timed), or another model's calibration: no ratio, never a guess
    assert machine_speed(cfg, {"reference": [6e-3]})["call_speed_ratio"] is None
    other = dataclasses.replace(cfg, model=load_model("tiny-gpt2"))
    assert machine_speed(other, now)["speed_ratio"] is None and machine_speed(other, now)["fsdp_speed_ratio"] is None


def test_the_correction_uses_what_was_measured_only():
    """The ratios rescale the calibration; a call the calibration has no figure for (an older calibration) takes the
    collectives' ratio, and without that the compute's; without the compute's (a datasheet cluster, another
    workload) nothing is corrected."""
    from shardwise.validate import drift_corrected, predict

    cfg, tp = _cfg(_profile().to_cluster()), Layout(tp=2)
    given = {"speed_ratio": 1.5, "call_speed_ratio": 0.8, "p2p_speed_ratio": None, "fsdp_speed_ratio": 1.2}
    now = drift_corrected(cfg, given).cluster.measured
    assert now["sync_overhead_s"] == pytest.approx(0.8 * cfg.cluster.measured["sync_overhead_s"])
    assert now["p2p_sync_s"] == pytest.approx(0.8 * cfg.cluster.measured["p2p_sync_s"])  # the collectives' ratio
    assert now["fsdp_call_s"] == pytest.approx(1.2 * cfg.cluster.measured["fsdp_call_s"])
    assert now["model_tflops"] == pytest.approx(cfg.cluster.measured["model_tflops"] / 1.5)
    alone = drift_corrected(cfg, {**given, "call_speed_ratio": None, "fsdp_speed_ratio": None})
    assert predict(alone, tp)["step_time_s"] == pytest.approx(1.5 * predict(cfg, tp)["step_time_s"])
    assert drift_corrected(cfg, {**given, "speed_ratio": None}) is None


@pytest.mark.parametrize("bad", ["model_points = [[1.0]]", 'model_points = "4 ms"', 'sync_points = [[1e-3], 2e-3]',
                                 'fsdp_points = ["5 ms"]'])
def test_a_malformed_calibration_figure_is_refused_before_the_sweep(tmp_path, bad):
    """validate reads the calibration's model point and call figures only after minutes of sweep: a profile whose
    figures are not the shape calibrate writes is refused when it is loaded, in one line."""
    from shardwise.errors import UsageError
    from shardwise.specs import load_cluster

    path = tmp_path / "stale.toml"
    text = _profile().to_toml()
    path.write_text("\n".join(line for line in text.splitlines()
                              if not line.startswith(("model_points", "sync_points", "fsdp_points"))).replace(
                                  "\n[measured]\n", f"\n[measured]\n{bad}\n"))
    with pytest.raises(UsageError, match="rerun `shardwise calibrate`"):
        load_cluster(str(path))
    path.write_text(text)
    assert load_cluster(str(path)).measured["sync_points"] == _profile().sync_points  # as calibrate writes them


def test_a_gpus_host_drifts_on_its_own():
    """On a GPU calibration the host's floor is timed again beside the sweep (the model at 16 tokens, "host") and set
    beside the calibration's (host_floor_points[0]): its ratio scales the host's times only, the compute's the rest.
    A host-bound layout then moves with its host, not with its GPU; without a host figure the host's times move
    with the compute (FALLBACK), as before."""
    from shardwise.validate import machine_speed, speed_ratios_of

    cluster = _gpu_profile(host_layer_s=5e-3).to_cluster()
    cfg = _cfg(cluster)
    floor = cluster.measured["host_floor_points"][0]
    speed = machine_speed(cfg, {"reference": [4e-3], "host": [1.5 * floor]})
    assert speed["host_speed_ratio"] == pytest.approx(1.5) and speed["speed_ratio"] == pytest.approx(1.0)
    ratios = speed_ratios_of(speed)
    lay = Layout(dp=2)
    bound = _time(cluster, lay, "host_wait")
    assert bound > 0  # host-bound at 5 ms a layer
    slower_host = at_speed(cluster, ratios)
    assert slower_host.measured["host_layer_s"] == pytest.approx(1.5 * 5e-3)
    assert slower_host.measured["layer_overhead_s"] == pytest.approx(cluster.measured["layer_overhead_s"])
    assert _time(slower_host, lay, "compute") == pytest.approx(_time(cluster, lay, "compute"))
    assert _time(slower_host, lay, "host_wait") > bound
    assert speed_ratios_of(machine_speed(cfg, {"reference": [8e-3]}))["host"] == pytest.approx(2.0)


def test_validate_times_the_calibrations_floor_workload(monkeypatch):
    """validate's reference workloads (validate.measure._reference): on a calibration with a host floor, calibrate's
    floor workload too — the same model at HOST_FLOOR_TOKENS tokens, as calibrate timed it ("host"); none without."""
    from shardwise.calibrate import timer
    from shardwise.calibrate.compute import HOST_FLOOR_TOKENS
    from shardwise.validate import measure

    asked = []
    monkeypatch.setattr(timer, "reference", lambda t, tokens=0: asked.append(tokens) or (lambda: None))
    assert "host" in measure._reference(_cfg(_gpu_profile().to_cluster()), 0, 1)()
    assert asked == [0, HOST_FLOOR_TOKENS]
    asked.clear()
    assert "host" not in measure._reference(_cfg(_profile().to_cluster()), 0, 1)()
    assert asked == [0]


def test_the_reference_is_found_whatever_micro_batch_was_calibrated():
    """A calibration at micro-batch 2 (tokens 128 of 64-token sequences) states its model at one sequence apart
    (one_sequence_points): validate's speed ratio reads it, for the same model and sequence length only."""
    from shardwise.validate import machine_speed

    cluster = dataclasses.replace(_profile(), tokens=128, one_sequence_points=[64, 4e-3]).to_cluster()
    assert machine_speed(_cfg(cluster), {"reference": [6e-3]})["speed_ratio"] == pytest.approx(1.5)
    other = dataclasses.replace(_cfg(cluster), seq_len=32)
    assert machine_speed(other, {"reference": [6e-3]})["speed_ratio"] is None
    older = dataclasses.replace(_profile(), tokens=128).to_cluster()  # written before the figure: no ratio, no guess
    assert machine_speed(_cfg(older), {"reference": [6e-3]})["speed_ratio"] is None
