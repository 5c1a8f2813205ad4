"""`explain`'s plausibility sentence (issue 9): no A100 plan above the best MFU ever published on A100 without a
sentence saying why this one should beat it, naming that record and its source."""

import csv
import re
from dataclasses import replace
from pathlib import Path

from shardwise.planner.explain import PUBLISHED_MFU_RECORD, explain, plausibility
from shardwise.planner.job import make_job
from shardwise.planner.search import SearchSpace, search
from shardwise.specs import load_cluster, load_model

CSV = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs.csv"


def _published_mfu(gpu: str, min_params_b: float, min_gpus: int) -> float:
    """The highest MFU of the published BF16 rows on this GPU of at least this many billion parameters on at least
    this many GPUs (the rows' own column, as the sources state it; a utilisation counting recomputed FLOPs left out)."""
    best = 0.0
    for row in csv.DictReader(CSV.open(encoding="utf-8")):
        size, mfu = re.match(r"[\d.]+", row["params_b"]), re.match(r"[\d.]+", row["mfu_or_peak_pct"])
        gpus = re.match(r"\d+", row["gpus"])
        if (gpu in row["gpu_type"] and size and mfu and gpus and float(size.group()) >= min_params_b
                and int(gpus.group()) >= min_gpus and "fp8" not in row["precision"]
                and "hardware" not in row["mfu_or_peak_pct"]):
            best = max(best, float(mfu.group()) / 100)
    return best


def test_the_records_are_the_best_published_rows_at_each_scale():
    # Hagemann et al. 2023's LLaMA 30B (62.0 %) from 20B up on any scale, their 13B (70.6 %) below (PaLM's count,
    # the sheets'); from 512 GPUs Korthikanti et al.'s 1T (56.3 %), the figure behind "every large A100 run is at or
    # below ~56 %"; on H100 the dgxc NeMo tables, then Llama 3 405B at 8,192.
    for arch, gpu in (("ampere", "A100"), ("hopper", "H100")):
        for size, tiers in PUBLISHED_MFU_RECORD[arch]:
            for floor, mfu, _ in tiers:
                assert abs(mfu - _published_mfu(gpu, size / 1e9, floor)) < 5e-4, (arch, size, floor)


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


def test_the_record_follows_the_scale():
    # Llama 2 70B on 2,048 A100: held to the best run on 2,048 or more (Korthikanti's 530B on 2,240, 54.2 %), not to
    # the 62.0 % of 64 GPUs; the same MFU on 64 GPUs needs no sentence.
    job = make_job(load_model("llama2-70b"), load_cluster("dgx-a100-80gb"), 1024, 4096)
    result = search(job, 2048, SearchSpace(tp=(4,), pp=(2,), micro_batch=(1,), max_vpp=2))
    win = result.ranked[0]
    assert win.layout.world_size == 2048
    assert plausibility(job, _at(win, 0.540)) == ""
    sentence = plausibility(job, _at(win, 0.566))
    assert "2,048 or more GPUs" in sentence and "530B on 2,240 A100 (54.2 %)" in sentence
    assert "56.6%" in sentence
    demo, small = _readme_demo()
    assert plausibility(demo, _at(small.ranked[0], 0.566)) == ""


def test_a_cluster_file_without_an_arch_is_held_to_the_a100_record(tmp_path):
    # The kernels time a cluster that names no arch with Ampere's constants; its plans answer to Ampere's record too.
    preset = Path(__file__).resolve().parents[1] / "src" / "shardwise" / "presets" / "clusters" / "dgx-a100-80gb.toml"
    text = "\n".join(line for line in preset.read_text(encoding="utf-8").splitlines() if not line.startswith("arch"))
    (tmp_path / "mine.toml").write_text(text, encoding="utf-8")
    job, result = _readme_demo()
    mine = make_job(load_model("llama-65b"), load_cluster(str(tmp_path / "mine.toml")), 256, 2048)
    assert mine.cluster.arch == "ampere"  # an A100's peak: the A100 it is (specs.DATASHEET_GPUS)
    assert "62.0 %" in plausibility(mine, _at(result.ranked[0], 0.63))
    # A peak no datasheet GPU has leaves the arch unnamed: still timed, and held, as Ampere.
    (tmp_path / "mine.toml").write_text(text.replace("peak_tflops = 312", "peak_tflops = 400"), encoding="utf-8")
    other = make_job(load_model("llama-65b"), load_cluster(str(tmp_path / "mine.toml")), 256, 2048)
    assert other.cluster.arch == ""
    assert "62.0 %" in plausibility(other, _at(result.ranked[0], 0.63))
    # A calibrated cluster (no arch either) measures its own peak: no published GPU record applies to it.
    calibrated = replace(other, cluster=replace(other.cluster, measured={"matmul_tflops": 1.0}))
    assert plausibility(calibrated, _at(result.ranked[0], 0.90)) == ""


def test_a_mixture_of_experts_answers_to_the_records_of_the_parameters_its_flops_count():
    # Mixtral's 46.7 B parameters hold 12.9 B a token uses: its GEMMs and MFU are a 13 B model's, so it answers to the
    # record under 20 B (LLaMA 13B's), not to the larger models' lower one, and the sentence says the class and that
    # the record is a dense run (helper-226).
    from shardwise.planner.explain import published_record

    job = make_job(load_model("mixtral-8x7b"), load_cluster("dgx-a100-80gb"), 256, 4096, "megatron-core")
    mfu, _, who, size_class = published_record(job, 64)
    assert "LLaMA 13B" in who and mfu > 0.7 and size_class.startswith("under 20 B FLOP-counted")
    win = search(job, 64, SearchSpace(micro_batch=(1,), max_vpp=2)).ranked[0]
    said = plausibility(job, _at(win, 0.75))
    assert "under 20 B FLOP-counted" in said and "a dense run" in said


def test_a_term_under_one_percent_of_the_step_is_not_said_as_zero():
    # "0% context-parallel K/V traffic" listed a term as a reason and as nothing at once (helper-226)
    job, result = _readme_demo()
    win = _at(result.ranked[0], 0.64)
    win = replace(win, time_s={**win.time_s, "ep_comm": 1e-4 * win.step_time})
    sentence = plausibility(job, win)
    assert "<1% the experts' all-to-all traffic" in sentence and " 0% " not in sentence, sentence
