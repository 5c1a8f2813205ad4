"""Full recompute of only some layers (--recompute-layers N: Megatron's --recompute-method block, torchtitan's
selective_ac_option k, fms-fsdp's selective_checkpointing): memory and time against hand derivations, the
published OOM it predicts, the unnamed-knob rule, and the CLI's refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shardwise.cli import main
from shardwise.planner.estimate import complete_layout, estimate, fewest_recomputed
from shardwise.planner.job import make_job
from shardwise.planner.memory import memory_breakdown, rank_memory, rank_recomputed_layers, stage_activation_bytes
from shardwise.specs import Layout, load_cluster, load_model
from shardwise.stage_split import stage_layer_counts

GPT3 = load_model("gpt3-175b")  # h 12288, a 96, 96 layers, 4h GELU MLP
A100 = load_cluster("dgx-a100-80gb")


def _paper_job(batch: int = 64):
    # megatron-2021: the paper's accounting (16-bit activations, dropout, materialised softmax: no fused attention)
    return make_job(GPT3, A100, batch, 2048, "megatron-2021")


def test_activations_of_a_partly_recomputed_stage_by_hand():
    # Korthikanti et al. 2022 Eq. (1), s 2048, b 1, h 12288, a 96, tp 1: a layer keeps 34 s b h + 5 a s^2 b
    # = 855,638,016 + 2,013,265,920 = 2,868,903,936 bytes; a fully recomputed one keeps its input, 2 s b h =
    # 50,331,648. 12 layers, the first 3 recomputed, 4 micro-batches in flight: 4 x (3 x 50,331,648 + 9 x
    # 2,868,903,936) = 103,884,521,472, plus the layer being recomputed in backward holding its whole set again
    # in place of its input, (34 - 2) s b h + 5 a s^2 b = 805,306,368 + 2,013,265,920: 106,703,093,760 bytes.
    job = _paper_job()
    lay = Layout(pp=8, micro_batch=1, recompute="full", recompute_layers=3)
    assert stage_activation_bytes(job, lay, 12, 4, recomputed=3) == 106_703_093_760
    # every layer recomputed: 4 x 12 x 50,331,648 + 2,818,572,288 (what --recompute full alone keeps)
    assert stage_activation_bytes(job, lay.with_(recompute_layers=None), 12, 4) == 4 * 12 * 50_331_648 + 2_818_572_288


def test_the_first_pipeline_stage_holds_p_micro_batches_of_its_kept_layers():
    # 1F1B over 8 stages: rank 0 holds 8 micro-batches' activations; of its layers the first 3 keep only their input.
    job = _paper_job()
    lay = Layout(pp=8, micro_batch=1, recompute="full", recompute_layers=3)
    layers = stage_layer_counts(GPT3, 8, 2048)[0]
    sbh = 2048 * 12288
    scores = 5 * 96 * 2048 * 2048
    # plus the recomputed layer's whole set in place of its input in backward: (34 - 2) s b h and its scores
    expected = 8 * (3 * 2 * sbh + (layers - 3) * (34 * sbh + scores)) + 32 * sbh + scores
    assert rank_memory(job, lay, 0)["activations"] == expected


def test_interleaving_recomputes_the_first_layers_of_each_chunk():
    # Megatron-Core: one TransformerBlock per virtual chunk, each recomputing its first N (transformer_block.py
    # _checkpointed_forward, method "block"). pp 4 x v 2 of 96 layers: rank 0 holds two chunks of 12; N = 3
    # recomputes 3 in each, 6 in all; N = 20 (more than a chunk holds) is refused by validate_layout.
    job = _paper_job()
    lay = Layout(pp=4, vpp=2, micro_batch=1, schedule="interleaved-1f1b", recompute="full", recompute_layers=3)
    assert stage_layer_counts(GPT3, 8, 2048)[0::4] == (12, 12)
    assert rank_recomputed_layers(job, lay, 0) == 6


def test_recompute_time_and_flops_are_the_recomputed_layers_forward():
    # pp 1, 96 layers, 24 recomputed: the recompute term is 24/96 of full recompute's, and the hardware FLOPs exceed
    # the model FLOPs by the recomputed forwards, per token and layer 2 x 12 h^2 (the matmuls) + 4 s h (QK^T and
    # AV, uncausal as Megatron counts them) = 3,624,271,872 + 100,663,296 = 3,724,541,952 FLOPs, times
    # 24 layers x 64 sequences x 2048 tokens.
    job = _paper_job()
    base = Layout(dp=64, micro_batch=1, zero=1)
    full = estimate(job, base.with_(recompute="full"))
    part = estimate(job, base.with_(recompute="full", recompute_layers=24))
    assert part.time_s["recompute"] == pytest.approx(full.time_s["recompute"] * 24 / 96, rel=1e-12)
    assert part.hardware_flops - part.model_flops == pytest.approx(24 * 64 * 2048 * 3_724_541_952, rel=1e-12)
    assert estimate(job, base.with_(recompute="none")).step_time < part.step_time < full.step_time


def test_torchtitans_every_other_layer_does_not_fit_llama2_70b_at_local_batch_2():
    # pytorch/torchtitan docs/performance.md (1ea476e9f): Llama 2 70B on 64 A100 80GB, FSDP2, local batch 2:
    # "selective layer" (selective_ac_option "2": every other block) OOM, "selective op" OOM, "full" 353 WPS.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import published_runs

    row = next(r for r in published_runs.load_runs(published_runs.DEFAULT_CSV)
               if r.name == "torchtitan Llama 2 70B FSDP 64xA100 lbs2 AC full")
    assert estimate(row.job, row.layout).fits
    assert not estimate(row.job, row.layout.with_(recompute_layers=40)).fits
    assert not estimate(row.job, row.layout.with_(recompute="selective", recompute_layers=None)).fits


def test_an_unnamed_recompute_is_the_fewest_layers_that_fit():
    # GPT-3 175B on 64 A100 80GB, tp 8 x pp 8, micro-batch 4: no recompute (and selective, which under fused
    # attention keeps the same) does not fit, full recompute does. Unnamed, the stack recomputes the fewest layers
    # that still fit: N fits and N - 1 does not.
    job = make_job(GPT3, A100, 256, 2048, "megatron-core")
    lay = Layout(tp=8, pp=8, micro_batch=4, zero=1, sequence_parallel=True)
    fits = lambda t: sum(memory_breakdown(job, t)[1].values()) <= A100.gpu_memory_bytes  # noqa: E731
    assert not fits(lay) and not fits(lay.with_(recompute="selective"))
    chosen, implied = complete_layout(job, lay, {"zero", "sequence_parallel", "schedule"})  # (1F1B, as lay names)
    n = chosen.recompute_layers
    assert chosen.recompute == "full" and n is not None and 1 <= n < 12
    assert fits(chosen) and not fits(chosen.with_(recompute_layers=n - 1) if n > 1 else lay)
    assert chosen == fewest_recomputed(job, lay.with_(recompute="full"))
    assert any(f"of {n} layers per stage" in why for why in implied)


def _estimate(capsys, *extra):
    argv = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "64",
            "--seq-len", "4096", "--micro-batch", "1", "--json", *extra]
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_estimate_json_carries_recompute_layers_and_implies_full(capsys):
    code, out, err = _estimate(capsys, "--recompute-layers", "8", "--framework", "megatron-core")
    assert code == 0, err
    d = json.loads(out)
    assert (d["recompute"], d["recompute_layers"]) == ("full", 8)
    code, out, _ = _estimate(capsys, "--recompute", "full")
    assert json.loads(out)["recompute_layers"] is None  # every layer


@pytest.mark.parametrize("extra, words", [
    (("--recompute", "selective", "--recompute-layers", "4"), "--recompute full"),
    (("--recompute-layers", "0"), "at least 1"),
    (("--recompute-layers", "33"), "32 layers"),
    (("--recompute-layers", "4", "--framework", "deepspeed"), "deepspeed"),
    (("--recompute-layers", "4", "--framework", "composer"), "composer"),
    (("--recompute-layers", "7", "--framework", "torchtitan"), "every k-th block"),
    # 32 // k for k = 4, 5: the counts beside 7 it can run, and every layer
    (("--recompute-layers", "7", "--framework", "torchtitan"), "the nearest: 6 or 8, or all 32 with --recompute full"),
])
def test_what_cannot_run_is_refused_in_one_line(capsys, extra, words):
    code, out, err = _estimate(capsys, *extra)
    assert code == 2 and not out
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_torchtitan_runs_every_kth_block(capsys):
    # 32 layers, selective_ac_option "4": every 4th block, 32 // 4 = 8 of them
    code, out, err = _estimate(capsys, "--recompute-layers", "8", "--framework", "torchtitan")
    assert code == 0, err
    assert json.loads(out)["recompute_layers"] == 8


def test_the_recompute_phrase_says_layer_or_layers():
    # what explain and estimate's implied list print: "1 layer", not "1 layers"; per chunk under interleaving
    assert Layout(recompute="full", recompute_layers=1).recompute_phrase() == "full recompute of 1 layer per stage"
    interleaved = Layout(pp=2, vpp=2, schedule="interleaved-1f1b", recompute="full", recompute_layers=3)
    assert interleaved.recompute_phrase() == "full recompute of 3 layers per chunk"


def test_recompute_layers_are_counted_against_the_stacks_own_cut(capsys):
    # Llama 3 8B's 32 layers on 4 pipeline stages: Megatron builds 32 / 4 = 8 a stage (transformer_block.py
    # get_num_layers_to_build), so --recompute-layers 9 names more than a megatron-core chunk holds; shardwise's
    # runtime cuts by cost and gives a middle stage 9 layers (the LM head's 128K-vocabulary GEMM costs more than
    # a layer, so the last stage holds fewer), where 9 is every layer of that stage.
    pp4 = ("--pp", "4", "--recompute-layers", "9")
    code, out, err = _estimate(capsys, *pp4, "--framework", "megatron-core")
    assert code == 2 and not out and "exceeds the 8 layers" in err and len(err.strip().splitlines()) == 1, err
    code, out, err = _estimate(capsys, *pp4, "--framework", "shardwise")
    assert code == 0 and json.loads(out)["recompute_layers"] == 9, err
