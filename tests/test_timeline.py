"""Timelines: Chrome-trace JSON, pictures, and the `shardwise simulate` command."""

from __future__ import annotations

import json

import pytest

from shardwise.cli import main
from shardwise.schedules.generators import build
from shardwise.schedules.simulate import Costs, simulate
from shardwise.timeline import Event, bubble_fraction, chrome_trace, draw_timeline, write_chrome_trace

MEASURED = [  # what an executor records: seconds, with communication and waiting
    {"rank": 0, "kind": "F", "microbatch": 0, "chunk": 0, "start": 10.000, "end": 10.002},
    {"rank": 0, "kind": "send", "microbatch": 0, "chunk": 0, "start": 10.002, "end": 10.0025},
    {"rank": 1, "kind": "recv", "microbatch": 0, "chunk": 0, "start": 10.000, "end": 10.0025},
    {"rank": 1, "kind": "F", "microbatch": 0, "chunk": 0, "start": 10.0025, "end": 10.0045},
    {"rank": 1, "kind": "B", "microbatch": 0, "chunk": 0, "start": 10.0045, "end": 10.0085},
    {"rank": 0, "kind": "idle", "microbatch": -1, "chunk": 0, "start": 10.002, "end": 10.009},
    {"rank": 0, "kind": "B", "microbatch": 0, "chunk": 0, "start": 10.009, "end": 10.013},
]


def test_chrome_trace_is_perfetto_shaped(tmp_path):
    path = write_chrome_trace(MEASURED, tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(MEASURED)
    f0 = next(e for e in spans if e["name"] == "F0" and e["pid"] == 2)  # rank 1: pid 0 is the kernel's to Perfetto
    assert f0["ts"] == pytest.approx(2500.0) and f0["dur"] == pytest.approx(2000.0)  # microseconds from the first event
    assert {e["tid"] for e in spans if e["cat"] in ("send", "recv")} == {1}  # communication on its own track
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {1: "rank 0", 2: "rank 1"}


@pytest.mark.parametrize("schedule, vpp", [("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2), ("zb-h1", 1)])
def test_complete_events_on_one_track_nest(schedule, vpp):
    # The Trace Event Format wants "X" events on one thread to nest: a simulated send longer than the actions between
    # two of them (transfer 2.5, actions 1) had overlapped the previous one on the communication track; each overlapping
    # transfer now takes another lane. Touching events must not overlap by float noise either.
    sim = simulate(build(schedule, 4, 8, vpp), Costs(1, 1, 1, c=2.5))
    trace = chrome_trace(sim.events + sim.transfers)
    tracks = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        assert all(b1 <= a2 or b2 <= b1 for (a1, b1), (a2, b2) in zip(spans, spans[1:])), spans
    lanes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert "communication 2" in lanes  # the transfers in flight at once were that many


def test_bubble_fraction_counts_only_compute():
    # Span 13 ms on 2 ranks; compute 2+4 on rank 0 and 2+4 on rank 1.
    assert bubble_fraction(MEASURED) == pytest.approx(1 - 12 / 26)
    sim = simulate(build("1f1b", 4, 8), Costs(1, 1, 1))
    assert bubble_fraction(sim.events) == pytest.approx(sim.bubble_fraction)


@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_draw_timeline_writes_a_picture(tmp_path, suffix, magic):
    path = draw_timeline(MEASURED, tmp_path / f"t{suffix}", title="measured")
    assert path.read_bytes().startswith(magic)
    if suffix == ".svg":
        text = path.read_text()
        assert "bubble 53.8%" in text and "rank 1" in text  # title carries the bubble; one row per rank


def test_events_accept_dataclasses_and_dicts():
    as_dicts = [dict(rank=e.rank, kind=e.kind, microbatch=e.microbatch, chunk=e.chunk, start=e.start, end=e.end)
                for e in simulate(build("gpipe", 2, 2)).events]
    assert chrome_trace(as_dicts) == chrome_trace([Event(**d) for d in as_dicts])


def test_simulate_json_contract(capsys):
    assert main(["simulate", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--costs", "1,1,1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["makespan"] == pytest.approx(33.0)
    assert out["bubble_fraction"] == pytest.approx(3 / 11)
    assert out["bubble_fraction_per_rank"] == pytest.approx([3 / 11] * 4)
    assert out["peak_inflight_microbatches_per_rank"] == [4, 3, 2, 1]


@pytest.mark.parametrize("schedule,vpp", [("naive", 1), ("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1)])
def test_simulate_json_says_the_schedule_is_deadlock_free_under_both_sends(schedule, vpp, capsys):
    assert main(["simulate", "--schedule", schedule, "--pp", "4", "--microbatches", "8", "--vpp", str(vpp), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["deadlock_free_buffered"] is True and out["deadlock_free_rendezvous"] is True


def test_simulate_model_cuts_stages_as_training_does(capsys):
    # gpt2's LM head costs ~3.7 layers: the split gives the last stage fewer layers, and the stages still
    # differ in cost, so the bubble is larger than with four equal stages.
    assert main(["simulate", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--json"]) == 0
    even = json.loads(capsys.readouterr().out)["bubble_fraction"]
    assert main(["simulate", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--model", "gpt2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bubble_fraction"] > even


def test_simulate_compare_draws_and_traces(tmp_path, capsys):
    png, trace = tmp_path / "compare.png", tmp_path / "trace.json"
    code = main(["simulate", "--compare", "--pp", "4", "--microbatches", "8", "--comm", "0.1",
                 "--out", str(png), "--trace", str(trace), "--json"])
    assert code == 0
    results = json.loads(capsys.readouterr().out)["compare"]
    assert [r["schedule"] for r in results] == ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"]
    assert results[2]["vpp"] == 2
    bubbles = [r["bubble_fraction"] for r in results]
    assert bubbles[3] < bubbles[2] < bubbles[1]  # ZB-H1 < interleaved < 1F1B
    assert png.read_bytes().startswith(b"\x89PNG")
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == set(range(1, 17))  # four schedules x four ranks, from pid 1
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names[1] == "gpipe rank 0" and names[16] == "zb-h1 rank 3"


def test_simulate_compare_on_one_rank_leaves_out_the_interleaved_panel(capsys):
    """One pipeline rank has nothing to interleave (estimate and train refuse it): --compare shows the other panels."""
    assert main(["simulate", "--compare", "--pp", "1", "--microbatches", "8", "--json"]) == 0
    assert [r["schedule"] for r in json.loads(capsys.readouterr().out)["compare"]] == ["gpipe", "1f1b", "zb-h1"]
    assert main(["simulate", "--compare", "--pp", "1", "--microbatches", "8"]) == 0
    assert "one pipeline rank (--pp 1) has nothing to interleave: left out" in capsys.readouterr().out
    assert main(["simulate", "--compare", "--pp", "1", "--microbatches", "8", "--framework", "megatron-core"]) == 0
    out = capsys.readouterr().out  # the reason is the one rank, not the framework
    assert "nothing to interleave" in out and "megatron-core runs no" not in out
    assert main(["simulate", "--compare", "--pp", "1", "--microbatches", "8", "--vpp", "3"]) == 2
    assert "--vpp 3 sets the interleaved panel, which --pp 1 leaves out" in capsys.readouterr().err


def test_simulate_compare_with_micro_batches_interleaving_cannot_group_leaves_it_out(capsys):
    """--pp 4 --microbatches 6: interleaved 1F1B takes micro-batches in groups of pp, so --compare shows the other
    panels and says why (it refused the whole comparison); a --vpp for the panel left out is one line; and a --seq-len
    beyond the planner's bound is refused as plan refuses it (it ran with 10^22 tokens)."""
    assert main(["simulate", "--compare", "--pp", "4", "--microbatches", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["schedule"] for r in out["compare"]] == ["gpipe", "1f1b", "zb-h1"]
    assert "interleaved-1f1b takes micro-batches in groups of --pp (6 is not a multiple of 4)" in out["left_out"]
    assert main(["simulate", "--compare", "--pp", "4", "--microbatches", "6", "--vpp", "2"]) == 2
    assert "--vpp 2 sets the interleaved panel, which --microbatches 6 leaves out" in capsys.readouterr().err
    assert main(["simulate", "--pp", "4", "--microbatches", "8", "--model", "tiny", "--seq-len", str(10**22)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--seq-len must be between 1 and 4,294,967,296" in err


def test_simulate_summary_without_json(capsys):
    assert main(["simulate", "--schedule", "zb-h1", "--pp", "2", "--microbatches", "4"]) == 0
    out = capsys.readouterr().out
    assert "zb-h1" in out and "bubble" in out


@pytest.mark.parametrize("argv,msg", [
    (["--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "6"], "multiple of --pp"),
    (["--schedule", "1f1b", "--vpp", "2", "--pp", "4", "--microbatches", "8"], "needs --schedule interleaved-1f1b"),
    (["--pp", "0", "--microbatches", "8"], "--pp must be at least 1"),
    (["--schedule", "interleaved-1f1b", "--pp", "1", "--microbatches", "8"], "interleaved-1f1b interleaves model chunks over pipeline ranks, and pp=1 has one"),
    (["--vpp", "2", "--pp", "1", "--microbatches", "8"], "--vpp 2 interleaves model chunks over pipeline ranks, and --pp 1"),  # not
    # "needs --schedule interleaved-1f1b", which would then be refused too
    # --vpp alone interleaves, as estimate reads it (helper-232: "vpp=2 needs --schedule interleaved-1f1b (got 1f1b)")
    (["--vpp", "2", "--pp", "4", "--microbatches", "6"], "multiple of --pp"),
    (["--pp", "2", "--microbatches", "8", "--costs", "1,x,1"], "--costs must be three"),
    (["--pp", "2", "--microbatches", "8", "--comm", "-1"], "--comm must be non-negative"),
    (["--pp", "2", "--microbatches", "8", "--out", "t.pdf"], "--out must end in .png or .svg"),
    (["--compare", "--schedule", "1f1b", "--pp", "2", "--microbatches", "8"], "drop --schedule"),
    (["--pp", "16", "--microbatches", "16", "--model", "tiny"], "exceed the 4 layers"),
    (["--schedule", "1f1b", "--pp", "7", "--microbatches", "7", "--model", "tiny"],
     "7 model chunks exceed the 4 layers plus a chunk for the embedding and one for the loss"),
    (["--schedule", "interleaved-1f1b", "--pp", "7", "--vpp", "1", "--microbatches", "7", "--model", "tiny"],
     "interleaves nothing (one chunk per rank)"),
    (["--pp", "2", "--microbatches", "8", "--model", "nope"], "unknown model"),
    (["--pp", "2", "--microbatches", "8", "--framework", "nope"], "unknown framework 'nope' — choose one of"),
    (["--pp", "4", "--microbatches", "8", "--schedule", "zb-h1", "--framework", "deepspeed"],
     "--framework deepspeed cannot run this layout: deepspeed has no zb-h1 pipeline schedule"),
    (["--pp", "4", "--microbatches", "8", "--compare", "--framework", "composer"], "composer has no pipeline parallelism"),
    (["--pp", "2", "--microbatches", "8", "--schedule", "interleaved-1f1b", "--framework", "megatron-2021"],
     "megatron-2021's interleaved schedule needs pp >= 3"),
    (["--schedule", "interleaved-1f1b", "--pp", "4", "--vpp", "3", "--microbatches", "8", "--model", "llama3-8b",
      "--framework", "megatron-2021"], "cuts the 32 layers into equal model chunks only"),
    (["--pp", "6", "--microbatches", "6", "--model", "tiny", "--framework", "shardwise"],
     "6 model chunks exceed the 4 layers of tiny"),  # its runtime gives every stage a layer
])
def test_simulate_bad_input_is_one_line(argv, msg, capsys):
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and "Traceback" not in err


def test_simulate_cuts_and_schedules_as_the_named_framework_does(capsys):
    """`simulate --framework` means what it means for estimate, plan and explain: the stack's pipeline. Megatron-Core
    builds L / S layers a stage (transformer_block.py get_num_layers_to_build): Llama 3 8B's 32 layers on pp 4 are 8 a
    stage, the LM head's stage the slowest, where the runtime's cost-balanced cut (no --framework) moves layers off
    it; its 1F1B step is longer. --compare shows only the schedules the stack runs."""
    job = ["--pp", "4", "--microbatches", "8", "--model", "llama3-8b", "--json"]
    assert main(["simulate", *job]) == 0
    balanced = json.loads(capsys.readouterr().out)["makespan"]
    assert main(["simulate", *job, "--framework", "megatron-core"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] > balanced * 1.01
    assert main(["simulate", *job, "--framework", "torchtitan"]) == 0  # torchtitan's cut is the balanced one
    assert json.loads(capsys.readouterr().out)["makespan"] == pytest.approx(balanced)
    assert main(["simulate", "--compare", "--pp", "4", "--microbatches", "8", "--framework", "megatron-core", "--json"]) == 0
    assert [r["schedule"] for r in json.loads(capsys.readouterr().out)["compare"]] == ["1f1b", "interleaved-1f1b"]


def test_simulate_takes_the_uneven_cut_plan_recommends(capsys):
    """`plan` for Llama 3.1 405B on the llama3 stack picks pp 16 x vpp 8 = 128 chunks for 126 layers (a chunk holding
    only the embedding, one only the loss: the paper's Sec. 3.3.2); `simulate --model` times that same cut rather than
    refusing it."""
    job = ["--model", "llama3.1-405b", "--seq-len", "8192"]
    assert main(["plan", *job, "--cluster", "dgx-h100-80gb", "--gpus", "16384", "--global-batch", "2048",
                 "--framework", "llama3", "--tp", "8", "--pp", "16", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert best["pp"] * best["vpp"] == 128
    assert main(["simulate", *job, "--schedule", best["schedule"], "--pp", str(best["pp"]), "--vpp", str(best["vpp"]),
                 "--microbatches", str(best["num_microbatches"]), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert (sim["pp"], sim["vpp"], sim["microbatches"]) == (16, 8, 32)


def test_simulate_with_a_model_says_what_it_cut_and_what_each_stage_cost(capsys):
    """--model gpt2 on 4 stages: the JSON names the model, sequence and stack, the layers each stage holds and each
    stage's costs (it echoed only F=B=W=1, the average stage's, so two stacks' different cuts read alike); the
    stages' forwards add up to the pipeline's, an average stage costing the given F."""
    argv = ["simulate", "--pp", "4", "--microbatches", "8", "--model", "gpt2", "--json"]
    assert main(argv) == 0
    paper = json.loads(capsys.readouterr().out)
    assert paper["model"] == "gpt2" and paper["seq_len"] == 2048 and paper["framework"] is None
    assert sum(paper["stage_layers"]) == 12 and paper["stage_layers"] == [3, 4, 4, 1]
    assert sum(paper["stage_costs_ms"]["f"]) == pytest.approx(4 * paper["costs_ms"]["f"])
    assert main(argv + ["--framework", "megatron-core"]) == 0
    megatron = json.loads(capsys.readouterr().out)
    assert megatron["framework"] == "megatron-core" and megatron["stage_layers"] == [3, 3, 3, 3]
