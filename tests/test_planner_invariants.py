"""Invariants an outside checker holds the planner to, each once broken (a fuzz of ~7,500 plan/estimate/explain cases,
2026-12-05): selective recompute is never dearer than full, a knob that changes nothing changes no number, a
suggested flag gives what was suggested, plan weighs every layout estimate runs, and a refusal names its real cause."""

from __future__ import annotations

import json

import pytest

from shardwise.cli import main


def run(capsys, *argv) -> dict:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


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


@pytest.mark.parametrize("pp", [1, 4])
def test_the_planner_prices_an_idle_zero_stage_as_zero_0(pp):
    """Below the command line too: a layout without data or context parallelism costs the same whatever ZeRO stage
    it carries, on every stack that runs it (deepspeed-bf16 once dropped its gradient accumulation at 'ZeRO-2')."""
    from shardwise.planner.estimate import estimate
    from shardwise.planner.frameworks import FRAMEWORKS
    from shardwise.planner.job import make_job
    from shardwise.specs import Layout, load_cluster, load_model

    model, cluster = load_model("llama2-7b"), load_cluster("dgx-h200")
    for name, fw in FRAMEWORKS.items():
        job = make_job(model, cluster, 16, 2048, name)
        base = Layout(pp=pp, micro_batch=1, recompute="full", schedule="1f1b")
        if fw.refusal(base, model.num_layers):
            continue
        plain = estimate(job, base)
        for zero in (1, 2, 3):
            other = estimate(job, base.with_(zero=zero))
            assert (other.step_time, other.memory_per_gpu) == (plain.step_time, plain.memory_per_gpu), (name, zero)


@pytest.mark.parametrize("zero", ["0", "1"])
def test_plan_takes_any_zero_stage_where_no_layout_has_data_parallelism(zero, capsys):
    """lit-gpt runs ZeRO-3 only, but on one GPU every stack runs ZeRO-0's step, which plan reports with a note:
    naming another stage is no error there, as estimate takes it, and is one on a job that has data parallelism."""
    shape = ["--model", "tiny-gpt2", "--cluster", "dgx-h100-80gb", "--seq-len", "256", "--framework", "lit-gpt",
             "--zero", zero]
    out = run(capsys, "plan", *shape, "--gpus", "1", "--global-batch", "2")
    assert out["best"]["zero"] == 0
    if zero != "0":
        assert f"--zero {zero} changes nothing" in out["winner_note"]
    assert main(["plan", *shape, "--gpus", "8", "--global-batch", "8", "--json"]) == 2
    assert f"lit-gpt has no ZeRO-{zero}" in capsys.readouterr().err


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
    # dp 2 beside the 6 stages: torchtitan applies mixed precision only through FSDP (data parallelism)
    shape = ["--model", "tiny", "--cluster", "dgx-h100-80gb", "--gpus", "12", "--global-batch", "12", "--seq-len", "1024",
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
