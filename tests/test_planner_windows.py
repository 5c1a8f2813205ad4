"""Sliding-window attention in the planner (docs/planner.md "Sliding windows"): the windowed layers' model FLOPs count
the window's keys, as MaxText counts Gemma 2's local layers; their attention time is the band alone where the stack's
kernel skips the rest, full causal attention where it takes no window; memory does not move."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardwise
from shardwise.cli import main
from shardwise.planner import kernels
from shardwise.specs import load_cluster

from test_hf_architectures import ARCHITECTURES

MISTRAL = ARCHITECTURES["mistral-7b"][0]  # 32 layers, hidden 4096, 32 query heads of 128, a 4,096-token window
WINDOW, LAYERS, Q_DIM = MISTRAL["sliding_window"], MISTRAL["num_hidden_layers"], MISTRAL["hidden_size"]
GPUS, BATCH = 16, 8  # dp 2 x tp 8: torchtitan applies mixed precision only through FSDP (dp > 1)


def estimate(tmp_path, capsys, changes: dict, seq: int, framework: str, more: list[str] = (),
             cluster: str = "dgx-h100-80gb") -> dict:
    path = tmp_path / f"{abs(hash(json.dumps(changes, sort_keys=True))):x}.json"
    path.write_text(json.dumps(MISTRAL | changes))
    gpus = GPUS * (int(more[more.index("--pp") + 1]) if "--pp" in more else 1)
    assert main(["estimate", "--model", str(path), "--cluster", cluster, "--gpus", str(gpus),
                 "--global-batch", str(BATCH), "--seq-len", str(seq), "--tp", "8", "--micro-batch", "1",
                 "--framework", framework, *more, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def step_flops(out: dict) -> float:
    """Model FLOPs of one step over the job, from what estimate prints (TFLOP/s per GPU x seconds x GPUs)."""
    return out["model_tflops_per_gpu"] * 1e12 * out["step_time_s"] * GPUS


NO_WINDOW = {"sliding_window": None}
HALF = {"layer_types": ["sliding_attention", "full_attention"] * (LAYERS // 2)}


def test_within_the_window_nothing_changes(tmp_path, capsys):
    """At a sequence no longer than the window every query sees every earlier key: the same numbers as no window."""
    windowed = estimate(tmp_path, capsys, {}, WINDOW, "megatron-core")
    plain = estimate(tmp_path, capsys, NO_WINDOW, WINDOW, "megatron-core")
    for key in ("step_time_s", "memory_gib_per_gpu", "mfu", "time_breakdown_s", "memory_breakdown_gib"):
        assert windowed[key] == plain[key], key


@pytest.mark.parametrize("framework", ["megatron-core", "torchtitan", "shardwise", "megatron-2021"])
def test_model_flops_count_the_window_as_maxtext_does(framework, tmp_path, capsys):
    """MaxText's count (calculate_gemma2_tflops_training_per_device: 4 b s min(window, s) heads head_dim a local layer,
    forward; x 3 with backward) in place of PaLM's s keys, on every layer of Mistral's window, whatever runs it."""
    seq = 8 * WINDOW
    windowed = estimate(tmp_path, capsys, {}, seq, framework)
    plain = estimate(tmp_path, capsys, NO_WINDOW, seq, framework)
    saved = 3 * 4 * BATCH * seq * (seq - WINDOW) * Q_DIM * LAYERS  # the keys beyond the window, never attended
    assert step_flops(plain) - step_flops(windowed) == pytest.approx(saved, rel=2e-3)
    assert windowed["memory_gib_per_gpu"] == plain["memory_gib_per_gpu"]  # no scores kept either way


@pytest.mark.parametrize("framework, skips", [("megatron-core", True), ("nemo", True), ("torchtitan", True),
                                              ("shardwise", False), ("megatron-2021", False)])
@pytest.mark.parametrize("pp", [1, 4])
def test_attention_time_is_the_band_where_the_kernel_skips_the_rest(framework, skips, pp, tmp_path, capsys):
    """Transformer Engine's window_size and FlexAttention's block masks skip the keys outside the window: every layer
    windowed is faster than half of them, which is faster than none. torch's SDPA (the shardwise runtime's) and a
    materialised softmax take no window: every number as without one, a pipeline's stage split included."""
    seq = 8 * WINDOW
    outs = [estimate(tmp_path, capsys, changes, seq, framework, ["--pp", str(pp)] if pp > 1 else [])
            for changes in ({}, HALF, NO_WINDOW)]
    steps = [o["step_time_s"] for o in outs]
    if skips:
        assert steps[0] < steps[1] < steps[2]
    else:
        assert steps[0] == steps[1] == steps[2]
        assert outs[0]["memory_gib_per_gpu"] == outs[2]["memory_gib_per_gpu"]


def test_a_stack_on_sdpa_of_the_fa2_family_takes_no_window(tmp_path, capsys):
    """fms-fsdp attends through torch's SDPA (FlashAttention-2 underneath): no window argument, so a windowed model
    runs as long as one without, and the note names SDPA."""
    outs = []
    for changes in ({}, NO_WINDOW):
        path = tmp_path / f"{len(outs)}.json"
        path.write_text(json.dumps(MISTRAL | changes))
        assert main(["estimate", "--model", str(path), "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch",
                     "8", "--seq-len", str(8 * WINDOW), "--micro-batch", "1", "--framework", "fms-fsdp", "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["step_time_s"] == outs[1]["step_time_s"]
    assert any("(torch's SDPA) takes no window" in n for n in outs[0]["assumptions"]["implied"])


def test_the_stage_split_of_a_stack_without_windows_is_the_unwindowed_one(tmp_path, capsys):
    """A pipeline's split balances the layers' costs against the head's (stage_split): where the attention runs whole,
    as under the shardwise runtime's SDPA, a windowed model is split, and so timed and sized, as it would be without the
    window (at 128K tokens and a 256K vocabulary the head weighs enough for the split to notice)."""
    outs = []
    for changes in ({}, NO_WINDOW):
        path = tmp_path / f"{len(outs)}.json"
        path.write_text(json.dumps(MISTRAL | {"vocab_size": 256000} | changes))
        assert main(["estimate", "--model", str(path), "--cluster", "dgx-h100-80gb", "--gpus", "4", "--global-batch",
                     "4", "--seq-len", "131072", "--pp", "4", "--micro-batch", "1", "--framework", "shardwise",
                     "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert (outs[0]["step_time_s"], outs[0]["memory_gib_per_gpu"]) == (outs[1]["step_time_s"], outs[1]["memory_gib_per_gpu"])


def test_a_calibrated_cluster_times_the_band_too(tmp_path, capsys):
    """A cluster with measured rates ([measured]: its matmul and model rates) prices the windowed layers' attention
    over the band where the stack's kernel skips the rest, as the datasheet path does."""
    preset = Path(shardwise.__file__).parent / "presets" / "clusters" / "dgx-h100-80gb.toml"
    cluster = tmp_path / "measured.toml"
    cluster.write_text(preset.read_text() + "\n[measured]\nmatmul_tflops = 600\nmodel_tflops = 450\ncopy_gbs = 2500\n")
    seq = 8 * WINDOW
    steps = [estimate(tmp_path, capsys, changes, seq, "megatron-core", cluster=str(cluster))["step_time_s"]
             for changes in ({}, HALF, NO_WINDOW)]
    assert steps[0] < steps[1] < steps[2]


def test_layer_types_must_name_every_layer(tmp_path, capsys):
    """A layer_types list of another length than the layers is refused, as transformers refuses it (counted as it
    stood, 64 windowed layers of 32 gave a negative HFU)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MISTRAL | {"layer_types": ["sliding_attention"] * 2 * LAYERS}))
    assert main(["estimate", "--model", str(path), "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8",
                 "--seq-len", "32768", "--tp", "8", "--micro-batch", "1", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "layer_types names 64 layers, but the model has 32" in err and "\n" not in err
    # without a window in use too (use_sliding_window unset on a Qwen-style config), and a list of non-strings
    qwen = MISTRAL | {"model_type": "qwen2", "use_sliding_window": False}
    for types, said in ((["full_attention"], "layer_types names 1 layers, but the model has 32"),
                        ([1] * LAYERS, "layer_types must be a list of layer kinds"),
                        (["foo"] * LAYERS, "layer_types names 'foo', which shardwise does not model")):
        path.write_text(json.dumps(qwen | {"layer_types": types}))
        assert main(["estimate", "--model", str(path), "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch",
                     "8", "--seq-len", "4096", "--tp", "8", "--micro-batch", "1", "--json"]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and "\n" not in err, err


@pytest.mark.parametrize("framework, said", [("megatron-core", "skips the keys outside it"),
                                             ("shardwise", "(torch's SDPA) takes no window"),
                                             ("megatron-2021", "(a materialised softmax) takes no window")])
def test_the_note_says_how_the_window_is_priced(framework, said, tmp_path, capsys):
    out = estimate(tmp_path, capsys, HALF, 8 * WINDOW, framework)
    note = next(line for line in out["assumptions"]["implied"] if "sliding window" in line)
    assert "on 16 of its 32 layers" in note and "MaxText's count" in note and said in note


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100-80gb")


@pytest.mark.parametrize("kernel", ["cudnn", "fa2", "fa3"])
def test_the_band_meets_causal_attention_at_the_window(kernel, h100):
    """Just beyond the window the band is about the causal triangle: the time is continuous where windows begin."""
    near = kernels.band_attention_time(h100, kernel, WINDOW + 64, WINDOW + 64, WINDOW, 8, 128)
    assert near == pytest.approx(kernels.fused_attention_time(h100, kernel, WINDOW + 64, WINDOW + 64, 8, 128), rel=0.05)


@pytest.mark.parametrize("kernel", ["cudnn", "fa2", "fa3"])
@pytest.mark.parametrize("window", [128, 1024, 4096])
def test_the_band_grows_with_the_sequence_not_its_square(kernel, window, h100):
    """Each query sees at most `window` keys: far beyond the window, twice the sequence is about twice the time (the
    causal kernel's, four times), and always less than causal attention over the whole sequence."""
    for seq in (16 * window, 64 * window):
        one, two = (kernels.band_attention_time(h100, kernel, s, s, window, 8, 128) for s in (seq, 2 * seq))
        for a, b in zip(one, two):
            assert 1.9 < b / a < 2.1
        causal = kernels.fused_attention_time(h100, kernel, seq, seq, 8, 128)
        assert all(b < c for b, c in zip(one, causal))
