"""`shardwise validate`: the machinery (a small real sweep, its contract, its statistics), not the accuracy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from shardwise.cli import main
from shardwise.specs import Layout, load_model
from shardwise.validate import (default_layouts, describe, kendall_tau, parse_layout, quantile, spearman, summarize)

LAYOUT_KEYS = {"predicted_step_time_s", "measured_step_time_s", "predicted_memory_bytes", "measured_memory_bytes"}
SUMMARY_KEYS = {"median_abs_error", "p90_abs_error", "spearman", "kendall_tau", "top1_regret", "best_in_top3"}


@pytest.fixture(scope="module")
def sweep():
    """A real world-2 sweep: data parallel, tensor parallel, a GPipe pipeline, ZeRO-3 with full recompute."""
    cmd = [sys.executable, "-m", "shardwise", "validate", "--model", "tiny", "--world", "2",
           "--cluster", "dgx-h100-80gb", "--layouts", "dp2", "tp2", "pp2:gpipe", "dp2:zero3:full",
           "--global-batch", "4", "--seq-len", "32", "--steps", "2", "--repeats", "1", "--warmup", "1", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_contract_keys_and_well_formed_values(sweep):
    assert [x["name"] for x in sweep["layouts"]] == ["dp2 tp1 pp1 mb1", "dp1 tp2 pp1 mb1", "dp1 tp1 pp2 mb1 gpipe",
                                                     "dp2 tp1 pp1 mb1 zero3 full recompute"]
    for x in sweep["layouts"]:
        assert LAYOUT_KEYS <= x.keys()
        assert all(x[k] > 0 for k in LAYOUT_KEYS)
        assert x["timed_steps"] >= 2
    s = sweep["summary"]
    assert SUMMARY_KEYS <= s.keys()
    assert -1 <= s["spearman"] <= 1 and -1 <= s["kendall_tau"] <= 1
    assert s["median_abs_error"] >= 0 and s["p90_abs_error"] >= s["median_abs_error"]
    assert s["top1_regret"] >= 0 and isinstance(s["best_in_top3"], bool)
    # other processes' CPU use during the sweep (contention.py); a datasheet cluster has no calibration's
    m = sweep["machine"]
    assert m["cores"] >= 1 and (m["other_cpu_cores"] is None or m["other_cpu_cores"] >= 0)
    assert m["calibration_other_cpu_cores"] is None
    # the calibration's reference workload timed again during the sweep; no calibration to compare with here
    assert m["reference_s"] > 0 and m["calibration_reference_s"] is None and m["speed_ratio"] is None
    # and the call between layers (world 2); on a datasheet cluster nothing to correct the predictions by
    assert m["call_s"] is not None and m["call_speed_ratio"] is None
    assert "drift_corrected" not in s and all("drift_corrected_step_time_s" not in x for x in sweep["layouts"])


def test_layout_records_report_dp_shard_as_estimate_does(sweep):
    """dp_shard in each layout record is the shard group's dp ranks, as `estimate --json` reports it (dp here: no
    layout is hybrid), never the Layout's 0 for "every dp rank"."""
    for x in sweep["layouts"]:
        assert x["dp_shard"] == x["dp"], x["name"]
    zero3 = next(x for x in sweep["layouts"] if x["zero"] == 3)
    assert zero3["dp_shard"] == 2


def test_layouts_share_their_process_groups(sweep):
    """Each gloo group keeps an event-loop thread waking 100 times a second (validate.measure.mesh_split), so the
    sweep's meshes share every group of the same ranks. Hand count of a rank's groups for the fixture's four layouts
    (dp2, tp2, pp2, dp2:zero3; a DeviceMesh has a group for every dimension, size 1 too): the default group, the two
    ranks (each split's size-2 dimension) and this rank alone (the size-1 ones) = 3; the reference workloads' ZeRO-3
    layer runs on dp2's mesh. A mesh per layout, and one for that layer, held 1 + 5 x 4 = 21."""
    if sys.platform.startswith("linux"):  # where /proc names the threads
        assert sweep["machine"]["gloo_loop_threads"] == 3


def test_measured_model_states_are_the_planners(sweep):
    """Parameters, gradients and AdamW states as allocated equal the planner's bytes (fp32: 4 + 4 + 8 per parameter)."""
    by_name = {x["name"]: x for x in sweep["layouts"]}
    dp = by_name["dp2 tp1 pp1 mb1"]
    params = load_model("tiny").num_params()
    assert dp["measured_memory"]["weights"] == dp["predicted_memory"]["weights"] == 4 * params
    assert dp["measured_memory"]["gradients"] == 4 * params
    # AdamW keeps exp_avg and exp_avg_sq per parameter plus one step counter per tensor.
    assert 8 * params <= dp["measured_memory"]["optimizer"] <= 8 * params + 8 * 64
    zero3 = by_name["dp2 tp1 pp1 mb1 zero3 full recompute"]
    assert zero3["measured_memory"]["gradients"] == pytest.approx(2 * params, rel=0.01)  # sharded over dp = 2
    # Saved activations: measured by autograd's hooks, positive; recompute keeps less than none.
    assert 0 < zero3["measured_memory"]["activations"] < dp["measured_memory"]["activations"]


def test_measured_memory_is_the_planners(sweep):
    """States + saved activations, per part, as the planner counts them: FSDP's gathered parameters as
    weights (ZeRO-3 keeps the root unit and two layers gathered beside its shards), full recompute's
    activations with the working set of the layer being recomputed. Within 1 % (AdamW's step
    counters, the padded vocabulary of tp2)."""
    for x in sweep["layouts"]:
        for part, predicted in x["predicted_memory"].items():
            assert x["measured_memory"][part] == pytest.approx(predicted, rel=0.01), (x["name"], part)


def test_plot(tmp_path, sweep):
    from shardwise.validate import plot

    path = tmp_path / "accuracy.png"
    plot(sweep, str(path))
    assert path.stat().st_size > 10_000


@pytest.mark.parametrize("argv, words", [
    (["--world", "0"], "--world must be at least 1"),
    (["--layouts", "dp2:turbo"], "unknown part 'turbo'"),
    (["--layouts", "tp2:sp:sp"], "names its sequence parallelism twice ('sp')"),  # ran as tp2:sp, unsaid
    (["--layouts", "dp2:zero1:zero3"], "names its ZeRO stage twice ('zero3')"),
    (["--layouts", "tp3"], "does not divide the world"),
    (["--layouts", "dp1:tp1:pp1"], "the sweep runs 2 ranks (--world)"),  # ranks, not GPUs: it said '2 GPUs' on CPU
    (["--layouts", "dp0"], "a degree of 0 ('dp')"),  # validate has no --dp: it named one
    (["--layouts", "pp2:interleaved-1f1b:v4"], "exceed"),
    (["--backend", "nccl", "--world", "4096"], "nccl"),
    (["--steps", "0"], "--steps"),
    (["--seq-len", "0"], "--seq-len must be at least 1, got 0"),  # validate has no --micro-batch to name
    # as train runs them: interleaving named with one chunk a rank is refused; a knob that changes nothing is set back
    # (pp1:gpipe runs as pp1), so the two are one layout — refused without the note that said it
    (["--layouts", "pp2:interleaved-1f1b:v1"], "layout 'pp2:interleaved-1f1b:v1': --schedule interleaved-1f1b with --vpp 1"),
    (["--layouts", "pp1:gpipe", "dp2"], "--layouts pp1:gpipe and dp2 are the same layout"),
    (["--layouts", "dp2:sp", "dp2"], "--layouts dp2:sp and dp2 are the same layout"),
])
def test_bad_input_exits_2_with_one_line(argv, words, capsys):
    assert main(["validate", "--cluster", "dgx-h100-80gb", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_parse_layout():
    assert parse_layout("dp2", 2) == Layout(dp=2)
    assert parse_layout("tp2:sp:full", 2) == Layout(tp=2, sequence_parallel=True, recompute="full")
    assert parse_layout("pp2:v2:mb2", 4) == Layout(dp=2, pp=2, vpp=2, micro_batch=2, schedule="interleaved-1f1b")
    assert parse_layout("dp2:zero3:gpipe", 2) == Layout(dp=2, zero=3, schedule="gpipe")
    assert parse_layout("cp2:allgather", 4) == Layout(dp=2, cp=2, cp_mode="allgather")
    assert parse_layout("tp2:ep2:zero3", 4) == Layout(dp=2, tp=2, ep=2, zero=3)
    assert parse_layout("tp2:etp2", 2) == Layout(tp=2, etp=2)


def test_default_sweep_covers_every_split_schedule_and_zero_stage():
    lays = default_layouts(load_model("tiny"), 2, 8, 64)
    assert {(x.dp, x.tp, x.pp, x.cp) for x in lays} == {(2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2)}
    assert {x.cp_mode for x in lays if x.cp > 1} == {"ring", "allgather"}
    assert {x.schedule for x in lays if x.pp > 1} == {"naive", "gpipe", "1f1b", "zb-h1", "interleaved-1f1b"}
    assert {x.zero for x in lays} == {0, 1, 2, 3}
    assert {x.recompute for x in lays} == {"none", "selective", "full"}
    assert any(x.sequence_parallel for x in lays) and any(x.micro_batch == 2 for x in lays)
    assert len(set(lays)) == len(lays)
    assert all(x.ep == x.etp == 1 for x in lays)  # a dense model has no experts to split


def test_default_sweep_of_a_moe_model_splits_its_experts():
    dense = set(default_layouts(load_model("tiny"), 2, 8, 64))
    lays = default_layouts(load_model("tiny-moe"), 2, 8, 64)
    split = {(x.dp, x.tp, x.ep, x.etp, x.zero) for x in lays if x.ep * x.etp > 1}
    # over both ranks of the dp split (also under ZeRO-3, which shards the dense weights) and of the
    # tp split; each expert's width over tp
    assert split == {(2, 1, 2, 1, 0), (2, 1, 2, 1, 3), (1, 2, 2, 1, 0), (1, 2, 1, 2, 0)}
    assert {x for x in lays if x.ep * x.etp == 1} == dense
    assert len({describe(x) for x in lays}) == len(lays)  # each named apart in the table and the JSON


pairs = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=3, max_size=12).filter(
    lambda xs: len({a for a, _ in xs}) > 1 and len({b for _, b in xs}) > 1)


@settings(max_examples=60, deadline=None)
@given(pairs)
def test_rank_correlations_match_scipy(xs):
    a, b = [float(x) for x, _ in xs], [float(y) for _, y in xs]
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-9)
    assert kendall_tau(a, b) == pytest.approx(stats.kendalltau(a, b).statistic, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=20), st.floats(0, 1))
def test_quantile_matches_numpy(xs, q):
    import numpy as np

    assert quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)), abs=1e-9)


def test_summary_regret_and_top3():
    predicted = [1.0, 2.0, 3.0, 4.0]
    measured = [1.2, 1.0, 5.0, 0.9]  # the planner picks layout 0; the best is layout 3, its 4th choice
    s = summarize(predicted, measured)
    assert s["top1_regret"] == pytest.approx(1.2 / 0.9 - 1)
    assert s["best_in_top3"] is False
    assert s["median_abs_error"] == pytest.approx((0.4 + 1.0) / 2)  # errors 0.17, 1.0, 0.4, 3.4
    # one layout orders no pair: its rank correlations are undefined, not 0
    one = summarize([1.0], [1.2])
    assert one["spearman"] is None and one["kendall_tau"] is None and one["top1_regret"] == 0


def test_warns_when_other_processes_shared_the_machine():
    """The printed report names other processes' CPU use during the sweep or the calibration, and only then."""
    from rich.console import Console

    from shardwise.commands.validate import _print

    layout = {"name": "dp2 tp1 pp1 mb1", "predicted_step_time_s": 0.02, "measured_step_time_s": 0.03,
              "predicted_memory_bytes": 2**20, "measured_memory_bytes": 2**20, "noisy": False, "step_time_spread": 0.1}
    summary = {"median_abs_error": 0.3, "p90_abs_error": 0.3, "spearman": 1.0, "kendall_tau": 1.0, "top1_regret": 0.0,
               "best_in_top3": True, "memory_median_abs_error": 0.0, "memory_p90_abs_error": 0.0, "noisy_layouts": 0}

    def printed(machine):
        console = Console(record=True, width=200)
        _print(console, {"model": "tiny", "world": 2, "backend": "gloo", "cluster": "calibrated", "global_batch": 8,
                         "seq_len": 64, "layouts": [layout], "summary": summary, "machine": machine}, None)
        return console.export_text()

    quiet = printed({"cores": 2, "other_cpu_cores": 0.02, "calibration_other_cpu_cores": None, "speed_ratio": 1.1})
    assert "other processes" not in quiet and "reference workload" not in quiet
    busy = printed({"cores": 2, "other_cpu_cores": 0.9, "calibration_other_cpu_cores": 0.1, "speed_ratio": None})
    assert "0.9 of this machine's" in busy and "during the sweep" in busy and "during the calibration" not in busy
    slower = printed({"cores": 2, "other_cpu_cores": 0.0, "calibration_other_cpu_cores": 0.0, "speed_ratio": 1.4})
    assert "1.40x its calibrated time" in slower and "slower" in slower and "other processes" not in slower


def _one_layout_result(model: str, measured_s: float, noisy: bool, other_cores: float) -> dict:
    """validate's JSON answer for one dp2 layout predicted at 20 ms (what a test puts in place of the sweep)."""
    error = abs(measured_s / 0.02 - 1)
    layout = {"name": "dp2 tp1 pp1 mb1", "predicted_step_time_s": 0.02, "measured_step_time_s": measured_s,
              "predicted_memory_bytes": 2**20, "measured_memory_bytes": 2**20, "noisy": noisy,
              "step_time_spread": 0.4 if noisy else 0.1}
    summary = {"median_abs_error": error, "p90_abs_error": error, "spearman": 1.0, "kendall_tau": 1.0,
               "top1_regret": 0.0, "best_in_top3": True, "memory_median_abs_error": 0.0, "memory_p90_abs_error": 0.0,
               "noisy_layouts": int(noisy)}
    return {"model": model, "world": 2, "backend": "gloo", "cluster": "dgx-h100-80gb", "global_batch": 8, "seq_len": 64,
            "layouts": [layout], "summary": summary,
            "machine": {"cores": 2, "other_cpu_cores": other_cores, "calibration_other_cpu_cores": None,
                        "speed_ratio": None}}


def test_json_keeps_stdout_the_json_and_says_the_warnings_on_stderr(monkeypatch, capsys):
    """`validate --json > run.json` on a busy machine: the warnings the table prints go to stderr, the JSON alone to
    stdout (they were printed in table mode only, so a sweep at 1.3 other cores passed silently)."""
    import shardwise.validate as sweep

    result = _one_layout_result("tiny", measured_s=0.03, noisy=True, other_cores=1.3)
    monkeypatch.setattr(sweep, "validate", lambda cfg, progress: result)
    code = main(["validate", "--model", "tiny", "--world", "2", "--cluster", "dgx-h100-80gb", "--layouts",
                 "dp2", "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out) == result
    warned = [line for line in err.splitlines() if line.startswith("shardwise: warning:")]
    assert len(warned) == 2 and "1.3 of this machine's" in warned[0] and "1 layout(s) stayed noisy" in warned[1]


def test_machine_speed_compares_the_same_workload_only():
    """The sweep's reference time is set beside the calibration's own figure for it (its smallest model point)
    only when the calibration timed the same model at the same sequence length."""
    from dataclasses import replace

    from shardwise.specs import load_cluster
    from shardwise.validate import ValidateConfig, machine_speed

    base = load_cluster("dgx-h100-80gb")
    cluster = replace(base, measured={"model": "tiny", "tokens": 64, "model_points": [[1e7, 0.004], [2e7, 0.006]]})
    cfg = ValidateConfig(model=load_model("tiny"), cluster=cluster, seq_len=64)
    speed = machine_speed(cfg, {"reference": [0.005, 0.006, 0.007]})
    assert speed["reference_s"] == 0.006 and speed["calibration_reference_s"] == 0.004
    assert speed["speed_ratio"] == pytest.approx(1.5)
    assert machine_speed(replace(cfg, seq_len=32), {"reference": [0.005]})["speed_ratio"] is None  # another workload
    assert machine_speed(replace(cfg, cluster=base), {"reference": [0.005]})["calibration_reference_s"] is None  # a datasheet


def test_a_gpu_sweeps_layouts_are_checked_as_gpu_jobs():
    """validate --backend nccl checks each layout as the GPU job it is (the GPUs' count and free memory), not as a
    CPU job against this machine's RAM; with no GPU here every layout of 2 ranks is refused for that."""
    from shardwise.errors import UsageError
    from shardwise.validate import check_layout

    assert default_layouts(load_model("tiny"), 2, 8, 64)
    assert default_layouts(load_model("tiny"), 2, 8, 64, backend="nccl") == []
    with pytest.raises(UsageError, match="need 2 GPUs, found 0"):
        check_layout(Layout(dp=2), load_model("tiny"), 2, 8, 64, backend="nccl")



def test_a_model_folder_with_weights_is_told_they_are_not_read(monkeypatch, capsys, tmp_path):
    # validate times seeded weights: a folder's safetensors (even a truncated one) went unmentioned (helper-224)
    import shardwise.validate as sweep
    from hf_models import make_model

    folder = tmp_path / "llama"
    make_model(folder, "llama", tokenizer=False)
    result = _one_layout_result("llama", measured_s=0.02, noisy=False, other_cores=0.0)
    monkeypatch.setattr(sweep, "validate", lambda cfg, progress: result)
    assert main(["validate", "--model", str(folder), "--world", "2", "--cluster", "dgx-h100-80gb", "--layouts", "dp2",
                 "--json"]) == 0
    err = capsys.readouterr().err
    assert "the layouts run on seeded weights" in err and "safetensors are not read" in err
