"""`explain`'s plausibility sentence (issue 9): no A100 plan above the best MFU ever published on A100 without a
sentence saying why this one should beat it, naming that record and its source."""

import csv
import re
from dataclasses import replace
from pathlib import Path

from shardwise.planner.explain import PUBLISHED_MFU_RECORD, explain, plausibility
from shardwise.planner.memory import make_job
from shardwise.planner.search import SearchSpace, search
from shardwise.specs import load_cluster, load_model

CSV = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs.csv"


def _published_a100_mfu(min_params_b: float) -> float:
    """The highest MFU (%) of the published A100 rows of at least this many billion parameters (the rows'
    own column, as the sources state it)."""
    best = 0.0
    for row in csv.DictReader(CSV.open(encoding="utf-8")):
        size = re.match(r"[\d.]+", row["params_b"])
        mfu = re.match(r"[\d.]+", row["mfu_or_peak_pct"])
        if "A100" in row["gpu_type"] and size and mfu and float(size.group()) >= min_params_b:
            best = max(best, float(mfu.group()))
    return best


def test_the_a100_records_are_the_best_published_rows():
    # Hagemann et al. 2023's LLaMA 30B (62.0 %) from 20B up, their 13B (70.6 %) below (PaLM's count, the sheets').
    (size_big, big, _), (size_small, small, _) = PUBLISHED_MFU_RECORD["ampere"]
    assert abs(100 * big - _published_a100_mfu(size_big / 1e9)) < 0.05
    assert abs(100 * small - _published_a100_mfu(size_small / 1e9)) < 0.05


def _readme_demo():
    """The README's demo: llama-65b on 64 A100-80GB, 256 x 2048, megatron-core (narrowed for speed)."""
    job = make_job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), 256, 2048)
    return job, search(job, 64, SearchSpace(micro_batch=(1, 2), max_vpp=4))


def test_explain_says_why_an_a100_plan_beats_the_best_published_mfu():
    job, result = _readme_demo()
    win = _at(result.ranked[0], 0.64)  # the demo's winner, had it come out above the 62.0 % record
    result = replace(result, ranked=[win, *result.ranked[1:]])
    sentence = next(p for p in explain(job, 64, result) if p.startswith("Plausibility:"))
    assert "62.0 %" in sentence and "Hagemann" in sentence and f"{win.mfu:.1%}" in sentence
    assert "verify" in sentence


def _at(win, mfu: float):
    """The winner with its step's model FLOPs scaled to this MFU (MFU is model FLOPs over time and peak)."""
    return replace(win, model_flops=win.model_flops * mfu / win.mfu)


def test_no_sentence_at_or_below_the_record_and_the_small_model_record():
    job, result = _readme_demo()
    win = result.ranked[0]
    assert plausibility(job, _at(win, 0.619)) == ""
    assert plausibility(job, _at(win, 0.621)).startswith("Plausibility:")
    # Below 20B parameters the record is the 13B's 70.6 %: 65 % needs no reason, 72 % does.
    small = make_job(load_model("llama2-7b"), load_cluster("dgx-a100-80gb"), 256, 2048)
    assert plausibility(small, _at(win, 0.65)) == ""
    assert "LLaMA 13B" in plausibility(small, _at(win, 0.72))


def test_a_cluster_file_without_an_arch_is_held_to_the_a100_record(tmp_path):
    # The kernels time a cluster that names no arch with Ampere's constants; its plans answer to Ampere's record too.
    preset = Path(__file__).resolve().parents[1] / "src" / "shardwise" / "presets" / "clusters" / "dgx-a100-80gb.toml"
    text = "\n".join(line for line in preset.read_text(encoding="utf-8").splitlines() if not line.startswith("arch"))
    (tmp_path / "mine.toml").write_text(text, encoding="utf-8")
    job, result = _readme_demo()
    mine = make_job(load_model("llama-65b"), load_cluster(str(tmp_path / "mine.toml")), 256, 2048)
    assert mine.cluster.arch == ""
    assert "62.0 %" in plausibility(mine, _at(result.ranked[0], 0.63))
    # A calibrated cluster (no arch either) measures its own peak: no published GPU record applies to it.
    calibrated = replace(mine, cluster=replace(mine.cluster, measured={"matmul_tflops": 1.0}))
    assert plausibility(calibrated, _at(result.ranked[0], 0.90)) == ""
