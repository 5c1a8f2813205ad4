"""Gemma 2's attention-logit soft-capping in the planner: read from config.json (attn_logit_softcapping, Gemma2Config's
50.0 when absent, none when null); a stack whose fused attention cannot apply the cap (Transformer Engine's cuDNN
kernel, torch's SDPA) is priced as it runs such a model, with its unfused attention, and says so; a kernel that takes
the cap (flash-attn from 2.6, FlashAttention-3) keeps the fused price."""

from __future__ import annotations

import json

import pytest

from shardwise.cli import main
from shardwise.model_spec import model_from_hf_config

from test_hf_architectures import ARCHITECTURES

GEMMA2 = ARCHITECTURES["gemma-2-9b"][0]  # no attn_logit_softcapping key: Gemma2Config's default cap applies
LAYOUT = ["--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch", "16", "--seq-len", "4096", "--tp", "2",
          "--pp", "1", "--micro-batch", "1", "--recompute", "none", "--zero", "1"]
COMPARED = ("step_time_s", "memory_gib_per_gpu", "time_breakdown_s", "memory_breakdown_gib")


def estimate(tmp_path, capsys, changes: dict, framework: str, *more: str) -> dict:
    path = tmp_path / f"{abs(hash(json.dumps(changes, sort_keys=True))):x}.json"
    path.write_text(json.dumps(GEMMA2 | changes))
    assert main(["estimate", "--model", str(path), *LAYOUT, "--framework", framework, *more, "--json"]) == 0, \
        capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_the_cap_is_read_as_transformers_reads_it():
    assert model_from_hf_config(GEMMA2, "g", "test").attn_softcap == 50.0  # absent: Gemma2Config's default
    assert model_from_hf_config(GEMMA2 | {"attn_logit_softcapping": 30.0}, "g", "test").attn_softcap == 30.0
    assert model_from_hf_config(GEMMA2 | {"attn_logit_softcapping": None}, "g", "test").attn_softcap == 0.0
    llama = {k: v for k, v in GEMMA2.items() if k != "hidden_activation"} | {"model_type": "llama"}
    assert model_from_hf_config(llama, "l", "test").attn_softcap == 0.0  # a key of Gemma 2's alone


def test_the_final_cap_is_read_as_transformers_reads_it():
    assert model_from_hf_config(GEMMA2, "g", "test").final_softcap == 30.0  # absent: Gemma2Config's default
    assert model_from_hf_config(GEMMA2 | {"final_logit_softcapping": 50.0}, "g", "test").final_softcap == 50.0
    assert model_from_hf_config(GEMMA2 | {"final_logit_softcapping": None}, "g", "test").final_softcap == 0.0
    capped = model_from_hf_config(GEMMA2, "g", "test")
    assert model_from_hf_config(capped.to_hf_config(), "g", "test").final_softcap == 30.0  # written back as read


@pytest.mark.parametrize("framework", ["megatron-core", "deepspeed-2024"])
def test_final_logits_capped_keep_tanhs_output_and_cost_its_passes(framework, tmp_path, capsys):
    """tanh keeps its BF16 output for backward: one logits-sized tensor more on the last stage, the vocabulary split
    over TP (2 here), 2 bytes an element; and the element-wise passes cost time, a few milliseconds, not more."""
    capped = estimate(tmp_path, capsys, {}, framework)
    uncapped = estimate(tmp_path, capsys, {"final_logit_softcapping": None}, framework)
    tokens, vocab_shard = 4096, GEMMA2["vocab_size"] / 2
    extra_gib = capped["memory_breakdown_gib"]["logits"] - uncapped["memory_breakdown_gib"]["logits"]
    assert extra_gib == pytest.approx(tokens * vocab_shard * 2 / 2**30, abs=0.002)
    slower = capped["step_time_s"] - uncapped["step_time_s"]
    assert 0 < slower < 0.05 * uncapped["step_time_s"]
    assert "final_logit_softcapping" in capped["model_note"]
    assert "final_logit_softcapping" not in uncapped.get("model_note", "")


def test_a_malformed_cap_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA2 | {"attn_logit_softcapping": "50"}))
    assert main(["estimate", "--model", str(path), *LAYOUT, "--framework", "megatron-core"]) == 2
    err = capsys.readouterr().err.strip()
    assert "attn_logit_softcapping" in err and "\n" not in err


@pytest.mark.parametrize("framework", ["megatron-core", "shardwise"])
def test_a_kernel_that_cannot_cap_is_priced_as_the_unfused_attention(framework, tmp_path, capsys):
    capped = estimate(tmp_path, capsys, {}, framework)
    uncapped_unfused = estimate(tmp_path, capsys, {"attn_logit_softcapping": None}, framework, "--no-flash-attention")
    uncapped = estimate(tmp_path, capsys, {"attn_logit_softcapping": None}, framework)
    for key in COMPARED:
        assert capped[key] == uncapped_unfused[key], key
    assert capped["memory_gib_per_gpu"] > uncapped["memory_gib_per_gpu"]  # the s x s scores, held
    assert "cannot apply" in capped["model_note"] and "cannot apply" not in uncapped.get("model_note", "")


# flash-attn's own kernel, called with its cap; Megatron-Core's opt-in path through Transformer Engine's FA2 backend
@pytest.mark.parametrize("framework, more", [("deepspeed-2024", ()), ("nanotron", ()),
                                             ("megatron-core", ("--attention-backend", "flash"))])
def test_a_kernel_that_takes_the_cap_keeps_the_fused_price(framework, more, tmp_path, capsys):
    capped = estimate(tmp_path, capsys, {}, framework, *more)
    uncapped = estimate(tmp_path, capsys, {"attn_logit_softcapping": None}, framework, *more)
    for key in COMPARED:
        assert capped[key] == uncapped[key], key
    assert "applies the cap" in capped["model_note"]


@pytest.mark.parametrize("more", [("--attention-backend", "fused"), ("--flash-attention",), ("--cp", "2", "--tp", "1")],
                         ids=["cudnn-named", "flash-named", "cp"])
def test_a_refusal_names_the_cap_not_a_flag_never_given(more, tmp_path, capsys):
    """Where the cap keeps megatron-core's fused kernel out, a refusal says so (and that FA2 applies it), never
    'drop --no-flash-attention', which the user did not give; a kernel named for this model is refused, not replaced."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA2))
    argv = [a for a in LAYOUT if a != "--tp" and a != "2"] if "--tp" in more else list(LAYOUT)
    assert main(["estimate", "--model", str(path), *argv, "--framework", "megatron-core", *more]) == 2
    err = capsys.readouterr().err.strip()
    assert "soft-caps" in err and "--attention-backend flash" in err and "--no-flash-attention" not in err, err
    assert "\n" not in err


def test_context_parallelism_runs_on_the_kernel_that_takes_the_cap(tmp_path, capsys):
    out = estimate(tmp_path, capsys, {}, "megatron-core", "--attention-backend", "flash", "--cp", "2")
    assert out["layout"]["cp"] == 2 if "layout" in out else out["cp"] == 2
