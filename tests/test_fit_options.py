"""`estimate` on a layout that does not fit names the single changes that would make it fit (`fit_options`), and each,
applied on the command line, fits with the memory and step time it was shown with."""

from __future__ import annotations

import json

import pytest

from shardwise.cli import main

BASE = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-a100-40gb", "--gpus", "8", "--global-batch", "64",
        "--seq-len", "4096", "--framework", "megatron-core"]


def _estimate(capsys, *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _applied(args: list[str], change: str) -> list[str]:
    """`args` with the option's flag set to its value (replacing the flag if given)."""
    flag, *value = change.split()
    out = list(args)
    if flag in out:
        out[out.index(flag) + 1:out.index(flag) + 1 + len(value)] = value
    else:
        out += [flag, *value]
    return out


# torchtitan's eager loss keeps FP32 logits and their gradients: compiled, it keeps less (--compile is offered)
TORCHTITAN = ["--framework", "torchtitan", "--cluster", "dgx-a100-80gb", "--tp", "1", "--micro-batch", "2", "--zero", "3",
              "--recompute", "none", "--seq-len", "4608"]


@pytest.mark.parametrize("layout", [["--tp", "4", "--recompute", "none", "--micro-batch", "4", "--zero", "1"],
                                    ["--tp", "2", "--recompute", "selective", "--micro-batch", "1", "--zero", "1"],
                                    ["--tp", "2", "--recompute", "full", "--micro-batch", "4", "--zero", "1"],
                                    ["--tp", "8", "--recompute", "none", "--micro-batch", "4", "--zero", "0",
                                     "--no-sequence-parallel", "--seq-len", "8192"],
                                    TORCHTITAN,
                                    # a release that fused its norms: --compile is offered with --fused-norms dropped
                                    # (Inductor fuses them; the command line refuses the two together)
                                    [*TORCHTITAN, "--fused-norms", "--seq-len", "5120"],
                                    ["--model", "llama3.1-70b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--seq-len",
                                     "8192", "--tp", "4", "--pp", "4", "--vpp", "2", "--micro-batch", "4", "--zero", "1",
                                     "--recompute", "none"],
                                    # no --zero: nothing fits, so the ZeRO stage shown is the closest to fitting;
                                    # each option is estimate's answer with its flag added (ZeRO filled in again)
                                    ["--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-80gb", "--gpus", "16",
                                     "--global-batch", "512", "--framework", "nemo", "--precision", "fp8", "--tp", "1",
                                     "--pp", "2", "--vpp", "24", "--ep", "8", "--micro-batch", "2", "--recompute",
                                     "none"]])
def test_every_suggested_change_fits_as_shown(capsys, layout):
    args = [*BASE, *layout]  # a later --model, --seq-len, --cluster, --gpus or --framework replaces BASE's
    est = _estimate(capsys, *args)
    assert not est["fits"]
    options = est["fit_options"]
    assert options, "a layout a recompute policy, ZeRO stage or smaller micro-batch makes fit names them"
    assert [o["step_time_s"] for o in options] == sorted(o["step_time_s"] for o in options)
    for option in options:
        kept = [a for a in args if a not in option["dropped"]]
        after = _estimate(capsys, *_applied(kept, option["change"]))
        assert after["fits"] and "fit_options" not in after
        assert after["memory_gib_per_gpu"] == pytest.approx(option["memory_gib"], abs=0.01)
        assert after["step_time_s"] == pytest.approx(option["step_time_s"], rel=1e-5)


def test_no_single_change_is_said_in_one_line(capsys):
    """Nothing one knob can do (405B on 8 GPUs): the text says so and what is left; the JSON's list is empty."""
    args = ["estimate", "--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "16",
            "--seq-len", "8192", "--micro-batch", "1", "--tp", "8"]
    assert _estimate(capsys, *args)["fit_options"] == []
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "does not fit" in out and "more GPUs, or another split" in out


def test_a_stack_that_compiles_is_offered_compile(capsys):
    changes = [o["change"] for o in _estimate(capsys, *BASE, *TORCHTITAN)["fit_options"]]
    assert "--compile" in changes and changes.index("--compile") == 0  # the fastest of them here
    fused_norms = [*BASE, *TORCHTITAN, "--fused-norms", "--seq-len", "5120"]  # fused norms keep less: a longer one
    fused = {o["change"]: o["dropped"] for o in _estimate(capsys, *fused_norms)["fit_options"]}
    assert fused["--compile"] == ["--fused-norms"] and all(not d for c, d in fused.items() if c != "--compile")
    assert main(fused_norms) == 0
    assert "--compile (drop --fused-norms)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("model, args, offered", [
    ("llama3-8b", ["--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "64", "--seq-len", "4608", "--tp", "1",
                   "--pp", "1", "--micro-batch", "2", "--zero", "3", "--recompute", "none"], True),
    ("llama3.1-405b", ["--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "16", "--seq-len", "8192"], False)])
def test_plans_nothing_fits_names_compile_only_where_it_fits(capsys, model, args, offered):
    """plan's one line when nothing fits names --compile only where the leanest layout fits compiled, and then
    `estimate --compile` of that layout fits."""
    assert main(["plan", "--model", model, "--framework", "torchtitan", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("shardwise: error: nothing fits")
    assert ("--compile" in err) == offered
    if offered:
        est = _estimate(capsys, "estimate", "--model", model, "--framework", "torchtitan", *args, "--compile")
        assert est["fits"]


def test_an_option_names_what_the_stacks_defaults_filled_in_beside_it(capsys):
    """A change can move more than its own knob: with full recompute the freed memory takes llama3's interleaved
    schedule, whose smaller bubble is why that option's step is faster than the layout that did not fit. The option says
    so (filled_in) and the text too; adding those flags reproduces it, pinning the schedule as it was does not."""
    args = ["estimate", "--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--gpus", "8192", "--global-batch",
            "2048", "--seq-len", "8192", "--tp", "8", "--pp", "16", "--micro-batch", "1", "--recompute", "none",
            "--framework", "llama3"]
    est = _estimate(capsys, *args)
    full = next(o for o in est["fit_options"] if o["change"] == "--recompute full")
    assert full["filled_in"] == ["--schedule interleaved-1f1b", "--vpp 8"] and full["step_time_s"] < est["step_time_s"]
    again = _estimate(capsys, *_applied(args, "--recompute full"), "--schedule", "interleaved-1f1b", "--vpp", "8")
    assert again["step_time_s"] == pytest.approx(full["step_time_s"], rel=1e-9)
    pinned = _estimate(capsys, *_applied(args, "--recompute full"), "--schedule", "1f1b")
    assert pinned["step_time_s"] > est["step_time_s"]  # recompute alone costs time
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    said = (f"--recompute full ({full['memory_gib_per_gpu']:.1f} GiB, step {full['step_time_s']:,.2f} s; the stack's "
            f"defaults then fill in --schedule interleaved-1f1b --vpp 8)")
    assert said in out, out


def test_the_changes_that_fit_say_their_steps_in_the_unit_that_fits_them(capsys, monkeypatch):
    """A 24-second step reads "23.92 s" as everywhere else (units.seconds), not "23,916 ms"."""
    from shardwise.units import seconds

    args = ["estimate", "--model", "llama2-70b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "256",
            "--seq-len", "4096", "--framework", "megatron-2021", "--tp", "4", "--pp", "2"]
    options = _estimate(capsys, *args)["fit_options"]
    assert options and all(o["step_time_s"] > 1 for o in options)
    monkeypatch.setenv("COLUMNS", "400")
    assert main(args) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert all(f"step {seconds(o['step_time_s'])}" in text for o in options) and " ms" not in text.split("it fits with")[1]


def test_estimate_json_carries_the_note_of_the_stack_it_fell_back_to(capsys):
    """Where the default stack cannot run the flags, estimate runs under megatron-core: its JSON says so under the key
    plan's and explain's carry (framework_note), as well as in assumptions.implied."""
    out = _estimate(capsys, "estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "8",
                    "--global-batch", "32", "--seq-len", "8192", "--zero", "1")
    assert out["framework"] == "megatron-core" and "torchtitan has no ZeRO-1" in out["framework_note"]
    assert out["framework_note"] in out["assumptions"]["implied"]
