"""Invariants an outside checker holds the planner to, each once broken (a fuzz of ~7,500 plan/estimate/explain cases,
2026-12-05): a peak is the whole schedule's, selective recompute is never dearer than full, a knob that changes
nothing changes no number, a suggested flag gives what was suggested, and plan weighs every layout estimate runs."""

from __future__ import annotations

import json

import pytest

from shardwise.cli import main


def run(capsys, *argv) -> dict:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def states(out: dict) -> float:
    mem = out["memory_breakdown_gib"]
    return mem["weights"] + mem["gradients"] + mem["optimizer"]


PIPELINED_FSDP = ["--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--seq-len", "1024",
                  "--framework", "torchtitan", "--tp", "2", "--pp", "4", "--vpp", "15", "--schedule", "interleaved-1f1b",
                  "--zero", "2", "--recompute", "selective", "--micro-batch", "1"]


def test_fsdp_under_a_pipeline_peaks_after_its_last_backward(capsys):
    """torch.distributed.pipelining runs FSDP with every gradient unsharded until one reduce-scatter after the
    schedule: with 4 micro-batches only some of the 15 chunks have a gradient at the activations' peak, but every one
    has it after the last backward. The same layout with 64 micro-batches holds them all at its activations' peak:
    its weights, gradients and optimizer states are the floor of the short schedule's memory."""
    short = run(capsys, "estimate", *PIPELINED_FSDP, "--global-batch", "8")
    long = run(capsys, "estimate", *PIPELINED_FSDP, "--global-batch", "128")
    assert long["memory_breakdown_gib"]["gradients"] > 10  # all 15 chunks' FP32 gradients
    assert short["memory_gib_per_gpu"] >= states(long)
    assert short["memory_breakdown_gib"]["gradients"] == long["memory_breakdown_gib"]["gradients"]
    assert not short["fits"] and short["memory_gib_per_gpu"] > short["gpu_memory_gib"]


def test_plan_winner_fits_at_its_schedule_end(capsys):
    """What plan calls fitting holds after the last backward too (the search once picked this job's 15-chunk
    layout, 102.5 GiB there, as fitting at 77.8)."""
    best = run(capsys, "plan", "--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--gpus", "16",
               "--global-batch", "8", "--seq-len", "1024", "--framework", "torchtitan", "--top", "1")["best"]
    assert best["fits"] and best["memory_gib_per_gpu"] <= best["gpu_memory_gib"]
    twin = ["--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--seq-len", "1024",
            "--framework", "torchtitan", "--tp", str(best["tp"]), "--pp", str(best["pp"]), "--vpp", str(best["vpp"]),
            "--schedule", best["schedule"], "--zero", str(best["zero"]), "--recompute", best["recompute"],
            "--micro-batch", str(best["micro_batch"]), "--global-batch", str(16 * 8 * best["dp"])]
    assert states(run(capsys, "estimate", *twin)) <= best["gpu_memory_gib"]


@pytest.mark.parametrize("model", ["gpt2", "llama3-8b", "llama2-13b"])
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_selective_recompute_is_never_dearer_than_full(model, precision, capsys):
    """torchtitan's op-level checkpointing runs half the matmuls again, full recompute all of them and the attention:
    under FP8 too, where the recomputed matmuls run in FP8 as the forward's did."""
    shape = ["--model", model, "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "32", "--seq-len",
             "512", "--framework", "torchtitan", "--precision", precision, "--micro-batch", "1", "--zero", "3"]
    steps = {r: run(capsys, "estimate", *shape, "--recompute", r)["step_time_s"] for r in ("none", "selective", "full")}
    assert steps["none"] < steps["selective"] < steps["full"]


@pytest.mark.parametrize("framework", ["deepspeed-bf16", "shardwise", "torchtitan"])
def test_a_zero_stage_without_data_parallelism_changes_nothing(framework, capsys):
    """At dp x cp = 1 there is nothing to shard over: every stage is ZeRO-0's step, reported as ZeRO-0 with a note
    (deepspeed-bf16 once dropped its gradient accumulation at ZeRO-2 here, 11 % faster)."""
    shape = ["estimate", "--model", "llama2-7b", "--cluster", "dgx-h200", "--gpus", "1", "--global-batch", "8",
             "--seq-len", "2048", "--framework", framework, "--micro-batch", "1", "--recompute", "full"]
    plain = run(capsys, *shape)
    for zero in (1, 2, 3):
        out = run(capsys, *shape, "--zero", str(zero))
        assert (out["zero"], out["step_time_s"], out["memory_gib_per_gpu"]) == (0, plain["step_time_s"],
                                                                                 plain["memory_gib_per_gpu"])
        assert any(f"--zero {zero} changes nothing" in n for n in out["assumptions"]["implied"])


def test_plan_takes_zero_0_where_no_layout_has_data_parallelism(capsys):
    """lit-gpt runs ZeRO-3 only, but on one GPU every stack runs ZeRO-0's step, which plan reports: naming it is no
    error there, and is one on a job that has data parallelism."""
    shape = ["--model", "tiny-gpt2", "--cluster", "dgx-h100-80gb", "--seq-len", "256", "--framework", "lit-gpt",
             "--zero", "0"]
    assert run(capsys, "plan", *shape, "--gpus", "1", "--global-batch", "2")["best"]["zero"] == 0
    assert main(["plan", *shape, "--gpus", "8", "--global-batch", "8", "--json"]) == 2
    assert "lit-gpt has no ZeRO-0" in capsys.readouterr().err


def test_a_fit_option_priced_under_the_fallback_stack_names_it(capsys):
    """Without --framework, torchtitan refuses TP without sequence parallelism and megatron-core runs the job; its
    fit options must say --framework megatron-core, or --sequence-parallel alone would run under torchtitan (126 GiB
    where 75.7 were promised). Each option, added to the command, gives the memory and time it promised."""
    argv = ["estimate", "--model", "llama2-70b", "--cluster", "dgx-h100-80gb", "--gpus", "40", "--global-batch", "40",
            "--seq-len", "4096", "--tp", "8", "--pp", "5", "--micro-batch", "4", "--zero", "2", "--recompute", "none",
            "--schedule", "1f1b", "--no-sequence-parallel"]
    out = run(capsys, *argv)
    assert out["framework"] == "megatron-core" and out["fit_options"]
    for option in out["fit_options"]:
        assert option["change"].endswith("--framework megatron-core")
        flags = option["change"].split()
        asked = [a for a in argv if not (a == "--no-sequence-parallel" and "--sequence-parallel" in flags)]
        if "--micro-batch" in flags:  # the option's micro-batch replaces the command's
            i = asked.index("--micro-batch")
            asked = asked[:i] + asked[i + 2:]
        again = run(capsys, *asked, *flags)
        assert (again["memory_gib_per_gpu"], again["step_time_s"]) == (option["memory_gib_per_gpu"],
                                                                       option["step_time_s"])


@pytest.mark.parametrize("framework", ["megatron-core", "nemo", "torchtitan"])
def test_plan_weighs_the_stages_estimate_runs(framework, capsys):
    """A stack that gives the embedding and the loss a stage each runs pp up to the layers + 2: estimate takes tiny's
    4 layers over 6 stages, and plan narrowed to them finds the same layout at the same numbers."""
    shape = ["--model", "tiny", "--cluster", "dgx-h100-80gb", "--gpus", "6", "--global-batch", "12", "--seq-len", "1024",
             "--framework", framework, "--pp", "6"]
    best = run(capsys, "plan", *shape, "--top", "1")["best"]
    assert best["pp"] == 6
    again = run(capsys, "estimate", *shape, "--micro-batch", str(best["micro_batch"]), "--zero", str(best["zero"]),
                "--recompute", best["recompute"], "--schedule", best["schedule"], "--vpp", str(best["vpp"]))
    assert (again["step_time_s"], again["memory_gib_per_gpu"]) == (best["step_time_s"], best["memory_gib_per_gpu"])


@pytest.mark.parametrize("batch, cp, said", [
    ("3", "2,4", "--cp 2,4: --framework composer runs no context parallelism"),
    ("8", "1,2", "global batch 8 is not divisible by any data-parallel degree dp = gpus/(tp*pp*cp) possible here (16)"),
])
def test_nothing_to_plan_names_the_first_real_blocker(batch, cp, said, capsys):
    """Composer runs neither context parallelism nor a pipeline: a batch the CP degrees' dp would not divide is not the
    cause when no CP degree runs at all, and 'add 1f1b' is no fix for a stack without pipelines (the advice each
    message gave before, followed, met the other blocker)."""
    assert main(["plan", "--model", "llama3-8b", "--cluster", "dgx-a100-80gb", "--gpus", "16", "--global-batch", batch,
                 "--seq-len", "65536", "--framework", "composer", "--cp", cp, "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and "\n" not in err
