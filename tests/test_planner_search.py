"""Search, ranking, explanation and the plan / estimate / explain commands (contract, bad input)."""

import json
import re
import subprocess
import sys

import pytest

from shardwise.cli import main
from shardwise.planner import Job, estimate
from shardwise.planner.search import SearchSpace, search
from shardwise.specs import Layout, TrainSpec, load_cluster, load_model, validate_layout

ARTICLE = ["--model", "llama-65b", "--cluster", "dgx-a100-80gb", "--gpus", "64", "--global-batch", "256",
           "--seq-len", "2048"]
# A narrower search for tests that only need a plan, not the whole space (seconds each otherwise).
NARROW = ["--micro-batch", "1,2", "--max-vpp", "4"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_search_returns_valid_fitting_layouts_sorted_fastest_first():
    job = Job(load_model("llama2-13b"), load_cluster("dgx-a100-40gb"), TrainSpec(64, 2048))
    result = search(job, 16)
    assert result.ranked and result.timed <= result.scored
    times = [e.step_time for e in result.ranked]
    assert times == sorted(times)
    for e in result.ranked[:50]:  # megatron-core may give the embedding and the loss a chunk each: pp*vpp <= 40 + 2
        validate_layout(e.layout, job.model, 64, 16, edge_chunks=True)
        assert e.fits


@pytest.mark.parametrize("framework", ["megatron-core", "torchtitan", "deepspeed"])
def test_search_winner_beats_every_fitting_layout_of_a_brute_force_sample(framework):
    # Exhaustive over a small space, interleaved schedules included: no fitting layout the framework can run is
    # faster than the winner, whatever the pruning skipped.
    from shardwise.planner.frameworks import get
    from shardwise.planner.job import make_job
    from shardwise.specs import SCHEDULES, divisors

    job = make_job(load_model("llama2-7b"), load_cluster("dgx-a100-40gb"), 16, 1024, framework)
    fw = get(framework)
    best = search(job, 8, SearchSpace(micro_batch=(1, 2))).ranked[0]
    assert fw.refusal(best.layout) is None
    checked = interleaved = 0
    for tp in (1, 2, 4, 8):
        for pp in divisors(8 // tp):
            dp = 8 // (tp * pp)
            for mb in [d for d in divisors(16 // dp) if d <= 2]:
                m = 16 // (dp * mb)
                scheds = [("1f1b", 1)] if pp == 1 else [(s, 1) for s in SCHEDULES if s not in ("naive", "interleaved-1f1b")]
                if pp > 1 and m % pp == 0:
                    scheds += [("interleaved-1f1b", v) for v in (2, 4, 8) if pp * v <= 32]
                for sched, vpp in scheds:
                    for zero in (0, 1, 2, 3):
                        for rc in ("none", "selective", "full"):
                            for sp in {False, tp > 1}:
                                lay = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, vpp=vpp, zero=zero, recompute=rc,
                                             sequence_parallel=sp, schedule=sched)
                                if fw.refusal(lay):
                                    continue
                                e = estimate(job, lay)
                                checked += 1
                                interleaved += vpp > 1
                                if e.fits:
                                    assert e.step_time >= best.step_time * (1 - 1e-9), lay
    assert checked > 100
    assert interleaved > 0 or "interleaved-1f1b" not in fw.schedules  # the layouts that usually win were scored


def test_plan_json_contract(capsys):
    code, out, _ = run_cli(capsys, "plan", *ARTICLE, *NARROW, "--top", "3", "--json")
    assert code == 0
    data = json.loads(out)
    assert set(data) >= {"best", "candidates"} and len(data["candidates"]) == 3
    assert data["best"] == data["candidates"][0]
    best = data["best"]
    assert best["tp"] * best["pp"] * best["dp"] == 64 and best["fits"]
    assert best["num_microbatches"] == 256 // (best["dp"] * best["micro_batch"])


def test_plan_table_and_explain_use_the_articles_terms(capsys):
    code, out, _ = run_cli(capsys, "plan", *ARTICLE, *NARROW, "--top", "5", "--explain")
    assert code == 0 and "MFU" in out and "M_model" in out and "M_GPU" in out
    code, out, _ = run_cli(capsys, "explain", *ARTICLE, *NARROW)
    assert code == 0
    for needle in ("M_model", "TP =", "PP =", "DP =", "bubble", "Runner-up"):
        assert needle in out


def test_estimate_json_matches_the_library(capsys):
    argv = ["estimate", *ARTICLE, "--tp", "8", "--pp", "4", "--micro-batch", "1", "--vpp", "2", "--zero", "1",
            "--recompute", "selective", "--sequence-parallel", "--json"]
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    data = json.loads(out)
    assert data.pop("job") == {"model": "llama-65b", "cluster": "DGX A100 80GB", "gpus": 64, "global_batch": 256,
                               "seq_len": 2048, "precision": "bf16"}  # what it was asked, echoed
    # every knob named but the framework: what the CLI adds is the one phrase saying which stack it assumed, here
    # megatron-core, since the default (torchtitan) has no ZeRO-1
    implied = data["assumptions"].pop("implied")
    assert len(implied) == 1 and implied[0].startswith("framework megatron-core (--framework not given, and the "
                                                       "default torchtitan cannot run this: torchtitan has no ZeRO-1")
    assert data.pop("framework_note") == implied[0]  # also under the key plan's and explain's JSON carry
    job = Job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), TrainSpec(256, 2048), flash_attention=True)  # megatron-core
    lay = Layout(dp=2, tp=8, pp=4, micro_batch=1, vpp=2, zero=1, recompute="selective", sequence_parallel=True,
                 schedule="interleaved-1f1b")
    assert data == json.loads(json.dumps(estimate(job, lay).to_dict()))
    code, again, _ = run_cli(capsys, *argv, "--dp", "2")  # the dp that --gpus implies, named: the same answer
    again = json.loads(again)
    assert code == 0 and again["assumptions"].pop("implied") == implied and again.pop("job") and again.pop("framework_note")
    assert again == data


@pytest.mark.parametrize("argv, needle", [
    (["estimate", *ARTICLE, "--tp", "3", "--micro-batch", "1"], "does not divide 64 GPUs"),
    (["estimate", "--model", "llama-65b", "--cluster", "dgx-a100-80gb", "--gpus", "48", "--global-batch", "256",
      "--seq-len", "2048", "--tp", "3", "--micro-batch", "1"], "does not divide the 64 attention heads"),
    (["estimate", *ARTICLE, "--tp", "8", "--micro-batch", "3"], "not divisible"),
    (["estimate", *ARTICLE, "--tp", "8", "--dp", "4", "--micro-batch", "1"], "--dp 4 disagrees with --gpus 64"),
    (["plan", "--model", "nope", "--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "8", "--seq-len", "8"],
     "valid presets"),
    (["plan", "--model", "llama3.1-405b", "--cluster", "dgx-a100-40gb", "--gpus", "8", "--global-batch", "8",
      "--seq-len", "4096"], "nothing fits"),
    (["plan", *ARTICLE[:-2], "--seq-len", "2048", "--top", "0"], "--top"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_nothing_fits_says_how_many_gpus():
    code = subprocess.run([sys.executable, "-m", "shardwise", "plan", "--model", "llama3.1-405b", "--cluster",
                           "dgx-a100-40gb", "--gpus", "8", "--global-batch", "8", "--seq-len", "4096"],
                          capture_output=True, text=True)
    assert code.returncode == 2 and "use about" in code.stderr and "GPUs" in code.stderr
    assert "widen the search" not in code.stderr  # nothing was narrowed


def test_a_plan_from_the_shell_writes_all_it_prints_before_its_quick_exit(tmp_path):
    # plan, estimate and explain leave at once (cli.exit_now): a long JSON on a pipe and the report page must be whole.
    page = tmp_path / "plan.html"
    r = subprocess.run([sys.executable, "-m", "shardwise", "plan", "--model", "llama2-13b", "--cluster", "dgx-a100-40gb",
                        "--gpus", "16", "--global-batch", "64", "--seq-len", "2048", "--json", "--all-variants",
                        "--top", "100000", "--html", str(page), "--framework", "megatron-core"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # well past a pipe's 64 KiB buffer
    assert len(r.stdout) > 1 << 20 and len(out["candidates"]) > 1000 and out["html"]["bytes"] == page.stat().st_size


def test_nothing_fits_suggests_only_usable_gpu_counts_and_widening_only_when_narrowed():
    import re

    from shardwise.planner.search import degrees, nothing_fits_message

    job = Job(load_model("llama2-70b"), load_cluster("dgx-a100-40gb"), TrainSpec(32, 4096))
    for gpus in (8, 16, 32, 24):
        result = search(job, gpus)
        if result.ranked:
            continue
        msg = nothing_fits_message(job, gpus, result, SearchSpace())
        n = int(re.search(r"use about (\d+) GPUs", msg).group(1))
        assert n > gpus and n % 8 == 0 and any(True for _ in degrees(job, n)), msg
        assert "widen" not in msg
        narrowed = nothing_fits_message(job, gpus, result, SearchSpace(tp=(1,)))
        assert "widen the search" in narrowed
    # the CLI's default lists are the full space, in whatever order
    assert not SearchSpace(schedules=("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")).narrowed()


def test_framework_flag_contract(capsys):
    for fw in ("megatron-2021", "megatron-core", "nemo", "deepspeed", "torchtitan", "shardwise"):
        code, out, _ = run_cli(capsys, "plan", *ARTICLE, *NARROW, "--top", "2", "--json", "--framework", fw, "--pp", "1,2,4")
        assert code == 0
        best = json.loads(out)["best"]
        assert best["framework"] == fw
        from shardwise.planner.frameworks import get
        assert get(fw).refusal(Layout(**{k: best[k] for k in ("dp", "tp", "pp", "micro_batch", "vpp", "zero",
                                                               "recompute", "sequence_parallel", "schedule")})) is None
    code, out, _ = run_cli(capsys, "explain", *ARTICLE, *NARROW, "--framework", "deepspeed", "--pp", "1,2,4")
    assert code == 0 and "Framework deepspeed" in out and "Sensitivity" in out and "Dominant term" in out


@pytest.mark.parametrize("argv, needle", [
    (["--framework", "megatron-9000"], "unknown framework"),
    (["--framework", "torchtitan", "--zero", "1"], "torchtitan has no ZeRO-1"),
    (["--framework", "torchtitan", "--zero", "0"], "DDP (ZeRO-0) does not combine with tensor"),
    (["--framework", "deepspeed", "--sequence-parallel"], "no sequence parallelism"),
    (["--framework", "deepspeed", "--pp", "2", "--vpp", "2"], "no interleaved-1f1b"),
    # deepspeed-bf16 runs ZeRO-1 only: an unnamed --zero must not hide the knob it really refuses behind "no ZeRO-0"
    (["--framework", "deepspeed-bf16", "--sequence-parallel"], "no sequence parallelism"),
    (["--framework", "deepspeed-bf16", "--zero", "2"], "deepspeed-bf16 has no ZeRO-2"),
    # a shard group of 0 ranks is no size (the layout's 0, "every dp rank", is what leaving the flag out means)
    (["--framework", "torchtitan", "--dp-shard", "0"], "--dp-shard must be at least 1, got 0"),
    (["--framework", "megatron-core", "--dp-shard", "2"], "megatron-core has no hybrid sharding"),
    (["--framework", "shardwise", "--pp", "2", "--schedule", "zb-h1", "--zero", "2"], "FSDP"),
    (["--framework", "shardwise", "--tp-comm-overlap"], "no TP communication overlap"),
    (["--precision", "fp8"], "no FP8 tensor cores"),
])
def test_estimate_refuses_what_the_framework_cannot_run(capsys, argv, needle):
    code, out, err = run_cli(capsys, "estimate", *ARTICLE, "--tp", "8", "--micro-batch", "1", *argv)
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv, needle", [
    # plan's --sequence-parallel keeps only layouts with it where tp > 1: with every tp > 1 the cause is the flag
    (["--seq-len", "2048", "--tp", "2,4", "--framework", "deepspeed", "--sequence-parallel"],
     "--sequence-parallel: --framework deepspeed has no sequence parallelism"),
    # 2,047 tokens, odd: neither tp 2 nor tp 4 splits the sequence
    (["--seq-len", "2047", "--tp", "2,4", "--sequence-parallel"],
     "--sequence-parallel: it splits each sequence over tp, but --seq-len 2047 is not divisible by tp 2, 4"),
])
def test_plan_names_sequence_parallelism_when_it_leaves_no_layout(capsys, argv, needle):
    code, _, err = run_cli(capsys, "plan", *ARTICLE[:-2], *argv)
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("framework, zero, runs", [
    ("llama3", "3", "no ZeRO-3 (it runs ZeRO 0, 1, 2)"),  # the paper's FSDP never reshards after forward: no ZeRO-3
    ("torchtitan", "1", "no ZeRO-1 (it runs ZeRO 0, 2, 3)"),  # FSDP2 shards gradients with the optimizer states: no ZeRO-1
    ("deepspeed-bf16", "0,2", "no ZeRO-0 or ZeRO-2 (it runs ZeRO 1)"),  # BF16_Optimizer always partitions the optimizer states, and only those
])
def test_plan_refuses_zero_stages_the_framework_never_runs(capsys, framework, zero, runs):
    # Else only layouts without data parallelism are left and the table shows them as ZeRO-0, not what was asked.
    for command in ("plan", "explain"):
        code, out, err = run_cli(capsys, command, *ARTICLE, "--framework", framework, "--zero", zero)
        assert code == 2 and f"{framework} has {runs}" in err and err.count("\n") == 1 and not out


@pytest.mark.parametrize("argv, layout, implied", [
    # torchtitan and NeMo always shard the sequence with TP; torchtitan's data parallelism is FSDP2
    (["--framework", "torchtitan"], {"sequence_parallel": True, "zero": 3}, ["sequence parallelism", "ZeRO-3"]),
    (["--framework", "torchtitan", "--pp", "2"], {"zero": 2}, ["ZeRO-2"]),
    (["--framework", "nemo", "--recompute", "selective"], {"sequence_parallel": True, "zero": 1, "recompute": "selective"},
     ["sequence parallelism", "ZeRO-1"]),
    (["--framework", "megatron-core", "--tp-comm-overlap"], {"sequence_parallel": True}, ["TP comm overlap needs it"]),
    # flags a user of each stack passes naturally
    (["--framework", "megatron-core", "--zero", "1", "--recompute", "selective", "--sequence-parallel"],
     {"zero": 1, "recompute": "selective"}, []),
    (["--framework", "megatron-core", "--zero", "3"], {"zero": 3}, []),
    (["--framework", "megatron-2021", "--sequence-parallel", "--recompute", "selective"],
     {"sequence_parallel": True, "recompute": "selective"}, []),
    # unnamed: torchtitan, or megatron-core where the flags ask what torchtitan cannot run
    ([], {"zero": 3, "sequence_parallel": True}, ["ZeRO-3", "framework torchtitan (the default"]),
    (["--zero", "1"], {"zero": 1}, ["framework megatron-core (--framework not given, and the default torchtitan cannot "
                                    "run this: torchtitan has no ZeRO-1"]),
    (["--no-sequence-parallel"], {"sequence_parallel": False, "zero": 1},
     ["ZeRO-1 (megatron-core's default", "the default torchtitan cannot run this: torchtitan's tensor parallelism "
                                        "always shards the sequence"]),
    # Megatron-LM of 2021 as the issue and the paper describe it: full recompute, no distributed optimizer, unless named
    (["--framework", "megatron-2021", "--pp", "2"], {"zero": 0, "recompute": "full"},
     ["ZeRO-0 (megatron-2021's default", "full recompute (megatron-2021's own"]),
])
def test_estimate_implies_what_the_framework_always_does(capsys, argv, layout, implied):
    code, out, err = run_cli(capsys, "estimate", *ARTICLE, "--tp", "8", "--micro-batch", "1", "--json", *argv)
    assert code == 0, err
    est = json.loads(out)
    assert {k: est[k] for k in layout} == layout
    said = " ".join(est["assumptions"].get("implied", []))
    assert all(phrase in said for phrase in implied), said


def test_unnamed_zero_and_recompute_are_the_cheapest_that_fit(capsys):
    # A DeepSpeed ZeRO-3 or FSDP layout at scale under the default framework: Megatron FSDP, and it fits.
    big = ["--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--gpus", "1536", "--global-batch", "1536",
           "--seq-len", "2048", "--micro-batch", "1", "--json"]
    code, out, err = run_cli(capsys, "estimate", *big, "--zero", "3")
    assert code == 0, err
    assert json.loads(out)["fits"] and json.loads(out)["zero"] == 3
    code, out, _ = run_cli(capsys, "estimate", *big)  # nothing named: ZeRO-1 does not fit 175B on one GPU's share
    est = json.loads(out)
    assert est["fits"] and est["zero"] >= 2 and "ZeRO-" in " ".join(est["assumptions"]["implied"])


def test_unnamed_sequence_parallelism_is_the_faster_that_fits(capsys):
    # Llama 3 405B's 8K split on 8,192 H100 (tp8 . pp16), Megatron-Core, nothing else named: plain TP holds every
    # layer's activations whole on each of the 8 ranks; sequence parallelism splits the norms' and dropouts' share
    # 8 ways (Korthikanti et al. 2022), so it is the one chosen, and it is exactly the layout --sequence-parallel
    # names. megatron-2021 (SP came in 2022, opt-in) and shardwise (`train` runs without it) keep it off.
    llama = ["--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--gpus", "8192", "--global-batch", "2048",
             "--seq-len", "8192", "--tp", "8", "--pp", "16", "--micro-batch", "1", "--schedule", "1f1b", "--json"]
    runs = {}
    for flag in ([], ["--sequence-parallel"], ["--no-sequence-parallel"]):
        code, out, err = run_cli(capsys, "estimate", *llama, *flag)
        assert code == 0, err
        runs[" ".join(flag)] = json.loads(out)
    unnamed, on, off = runs[""], runs["--sequence-parallel"], runs["--no-sequence-parallel"]
    assert unnamed["sequence_parallel"] and not off["sequence_parallel"]
    assert unnamed["step_time_s"] == on["step_time_s"] < off["step_time_s"]
    # at the ZeRO stage and recompute policy picked, plain TP holds more (the picks differ once SP fits without recompute)
    layers = ["--recompute-layers", str(unnamed["recompute_layers"])] if unnamed["recompute_layers"] else []
    code, out, err = run_cli(capsys, "estimate", *llama, "--no-sequence-parallel", "--zero", str(unnamed["zero"]),
                             "--recompute", unnamed["recompute"], *layers)
    assert code == 0, err
    assert unnamed["memory_gib_per_gpu"] < json.loads(out)["memory_gib_per_gpu"]
    assert any("sequence parallelism" in why for why in unnamed["assumptions"]["implied"])
    for fw in ("megatron-2021", "shardwise"):  # 2021's Megatron cuts 126 layers evenly only: pp 2, not 16
        argv = [("2" if fw == "megatron-2021" and a == "16" else a) for a in llama]
        code, out, err = run_cli(capsys, "estimate", *argv, "--framework", fw)
        assert code == 0, err
        assert not json.loads(out)["sequence_parallel"]


def test_megatron_2021_plans_only_what_the_2021_stack_ran_unless_listed(capsys):
    # Narayanan et al. 2021 (the megatron-2021): full recompute, no distributed optimizer, no sequence
    # parallelism; those arrived in Megatron-LM v3.0 (2022) as opt-in flags (--use-distributed-optimizer,
    # --recompute-activations, --sequence-parallel). Listed nothing, plan ranks the layouts estimate fills in the same
    # way: its best, re-estimated from its degrees, micro-batch and schedule alone, is the same layout and step time.
    # GPT-3 175B on 96 A100 at tp 8 (Narayanan et al. Table 1's 175B row at a twelfth of the GPUs).
    gpt = ["--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--gpus", "96", "--global-batch", "192",
           "--seq-len", "2048", "--framework", "megatron-2021"]
    code, out, err = run_cli(capsys, "plan", *gpt, "--tp", "8", "--micro-batch", "1", "--max-vpp", "2", "--json")
    assert code == 0, err
    best = json.loads(out)["best"]
    assert (best["zero"], best["recompute"], best["sequence_parallel"]) == (0, "full", False)
    code, out, err = run_cli(capsys, "estimate", *gpt, "--tp", "8", "--pp", str(best["pp"]), "--micro-batch", "1",
                             "--vpp", str(best["vpp"]), "--schedule", best["schedule"], "--json")
    assert code == 0, err
    paper = json.loads(out)
    assert paper["step_time_s"] == best["step_time_s"]
    assert not any("Megatron-LM v3.0" in n for n in paper["assumptions"]["implied"])
    # named, each 2022 flag is said to be that release's (the megatron-2021 has none of them)
    code, out, err = run_cli(capsys, "estimate", *gpt, "--tp", "8", "--pp", "2", "--micro-batch", "1", "--zero", "1",
                             "--recompute", "selective", "--sequence-parallel", "--json")
    assert code == 0, err
    said = [n for n in json.loads(out)["assumptions"]["implied"] if "Megatron-LM v3.0" in n]
    assert len(said) == 1 and all(f in said[0] for f in ("--sequence-parallel", "--zero 1", "--recompute selective"))
    # listed, the 2022 flags are searched: sequence parallelism and selective recompute hold less and run faster
    code, out, err = run_cli(capsys, "plan", *gpt, "--tp", "8", "--micro-batch", "1", "--max-vpp", "2", "--zero", "0,1",
                             "--recompute", "selective,full", "--sequence-parallel", "--json")
    assert code == 0, err
    listed = json.loads(out)["best"]
    assert listed["sequence_parallel"] and listed["step_time_s"] < best["step_time_s"]
    assert "Megatron-LM v3.0" in json.loads(out)["winner_note"]  # the winner's 2022 flags, said as estimate says them


def test_nemo_interleaves_a_pipeline_unless_a_schedule_is_named(capsys):
    # NeMo's recipes run every pipeline interleaved (nemo/collections/llm/recipes: gpt3_175b pp 8 vpp 6, llama3_70b
    # pp 4 vpp 5, mixtral_8x7b pp 4 vpp 8; Megatron-Bridge nemotron4_340b pp 12 vpp 8). GPT-3 175B as its recipe runs it
    # (tp 4, pp 8, micro-batch 2, 2,048 sequences) on 512 H100: dp 16, m = 2048 / (16 * 2) = 64 micro-batches per
    # replica; plain 1F1B idles (p-1)/(m+p-1) = 7/71 = 9.9 % of the step, v chunks per rank cut that to 7/(64 v)
    # (Narayanan et al. 2021, Sec. 2.2.2). Named nothing, estimate interleaves at the fastest depth that fits, says so,
    # and is exactly the layout its --vpp names; --schedule 1f1b keeps plain 1F1B; megatron-core's default stays 1F1B.
    gpt = ["--model", "gpt3-175b", "--cluster", "dgx-h100-80gb", "--gpus", "512", "--global-batch", "2048",
           "--seq-len", "2048", "--tp", "4", "--pp", "8", "--micro-batch", "2", "--json"]
    runs = {}
    for flags in (["--framework", "nemo"], ["--framework", "nemo", "--schedule", "1f1b"], ["--framework", "megatron-core"]):
        code, out, err = run_cli(capsys, "estimate", *gpt, *flags)
        assert code == 0, err
        runs[" ".join(flags)] = json.loads(out)
    unnamed, plain, core = runs["--framework nemo"], runs["--framework nemo --schedule 1f1b"], runs["--framework megatron-core"]
    assert unnamed["schedule"] == "interleaved-1f1b" and unnamed["vpp"] >= 2
    assert any("interleaved" in why for why in unnamed["assumptions"]["implied"])
    assert (plain["schedule"], plain["vpp"], core["schedule"], core["vpp"]) == ("1f1b", 1, "1f1b", 1)
    assert unnamed["step_time_s"] < plain["step_time_s"]
    code, out, err = run_cli(capsys, "estimate", *gpt, "--framework", "nemo", "--vpp", str(unnamed["vpp"]))
    assert code == 0, err
    assert json.loads(out)["step_time_s"] == unnamed["step_time_s"]


def test_an_unnamed_depth_keeps_the_recomputed_layers_a_chunk_holds(capsys):
    # --recompute-layers N recomputes the first N layers of each chunk, and a chunk holding fewer is refused when
    # named. Llama 3 8B's 32 layers on pp 2: one chunk per rank holds 16 layers, v chunks hold at most
    # ceil(34 / 2v) (nemo gives the embedding and the loss a slot each), 9 at v = 2, so N = 16 leaves only plain
    # 1F1B; and whatever estimate fills in, named again, is the same answer.
    llama = ["--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "256",
             "--seq-len", "4096", "--tp", "2", "--pp", "2", "--micro-batch", "1", "--framework", "nemo", "--json"]
    code, out, err = run_cli(capsys, "estimate", *llama, "--recompute-layers", "16")
    assert code == 0, err
    filled = json.loads(out)
    assert (filled["schedule"], filled["vpp"], filled["recompute_layers"]) == ("1f1b", 1, 16)
    code, out, err = run_cli(capsys, "estimate", *llama, "--recompute-layers", "16", "--schedule", filled["schedule"],
                             "--vpp", str(filled["vpp"]))
    assert code == 0, err
    assert json.loads(out)["step_time_s"] == filled["step_time_s"]


def test_deepspeed_2021_22_recomputes_whole_layers_unless_selective_is_named(capsys):
    # The Megatron-DeepSpeed of the 2021-22 runs (bigscience-workshop/Megatron-DeepSpeed megatron/arguments.py) has
    # only --checkpoint-activations and --checkpoint-num-layers: whole layers, no selective recompute (Megatron-LM
    # v3.0's, 2022-06). BLOOM's pre-study split of a 175B GPT (tp 8, pp 12, dp 4, micro-batch 2) holds 123 GiB per GPU
    # without recompute, more than 80: unnamed, deepspeed recomputes every layer (the same step as --recompute full);
    # plan lists selective only when --recompute names it.
    gpt = ["--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--gpus", "384", "--global-batch", "2048",
           "--seq-len", "2048", "--tp", "8", "--pp", "12", "--json"]
    runs = {}
    for flags in ([], ["--recompute", "full"], ["--recompute", "none"]):
        code, out, err = run_cli(capsys, "estimate", *gpt, "--micro-batch", "2", "--framework", "deepspeed", *flags)
        assert code == 0, err
        runs[" ".join(flags)] = json.loads(out)
    assert not runs["--recompute none"]["fits"]
    assert runs[""]["recompute"] == "full" and runs[""]["step_time_s"] == runs["--recompute full"]["step_time_s"]
    # the choice is among the two policies the code runs, and says so (selective, faster here, is no candidate)
    assert ("full recompute (of none and full, the policies deepspeed's code runs, the fastest that fits; --recompute "
            "not given)") in runs[""]["assumptions"]["implied"]
    code, out, err = run_cli(capsys, "plan", *gpt, "--micro-batch", "1,2", "--framework", "deepspeed")
    assert code == 0, err
    assert json.loads(out)["best"]["recompute"] != "selective"
    # named, selective is priced, and the note says whose code it is (an outside check found it said nothing)
    code, out, err = run_cli(capsys, "estimate", *gpt, "--micro-batch", "2", "--framework", "deepspeed",
                             "--recompute", "selective")
    assert code == 0, err
    assert any(n.startswith("--recompute selective: not in the code deepspeed stands for")
               for n in json.loads(out)["assumptions"]["implied"])


def test_an_unnamed_schedule_is_said_and_llama3_weighs_interleaving(capsys):
    # Llama 3 405B on 8,192 and 16,384 H100 as the paper's Table 4 gives it (tp 8, pp 16, micro-batch 1), no schedule
    # named. internevo and torchtitan run 1F1B (internevo's num_chunks defaults to 1, torchtitan's
    # pipeline_parallel_schedule to 1F1B, as five of its six published pipeline rows ran) and say so, with what
    # interleaving would take; Meta's stack (Sec. 3.3.2: interleaved) weighs each depth and runs the 16,384-GPU job at the
    # paper's 41 % MFU, where plain 1F1B's bubble (16 micro-batches, 16 stages) would put it near 19 %. A choice that
    # leaves nothing fitting says it is the closest to fitting.
    llama = ["--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--global-batch", "2048", "--seq-len", "8192",
             "--tp", "8", "--pp", "16", "--micro-batch", "1", "--json"]
    code, out, err = run_cli(capsys, "estimate", *llama, "--gpus", "16384", "--framework", "internevo")
    assert code == 0, err
    plain = json.loads(out)
    assert plain["schedule"] == "1f1b"
    # ... and what the same command with --schedule interleaved-1f1b (a schedule it also runs) answers: that command's
    # depth, knobs and step, printed beside the default it left on the table
    (said,) = [n for n in plain["assumptions"]["implied"]
               if n.startswith("1f1b (internevo's default pipeline schedule; --schedule not given); ")]
    hint = re.search(r"; --schedule interleaved-1f1b would take ([\d.]+) s against ([\d.]+) s \((\d+) virtual stages "
                     r"per rank, ZeRO-(\d), ([\w ]+?) recompute(?: of \d+ layers? per chunk)?\)$", said)
    assert hint and float(hint[2]) == pytest.approx(plain["step_time_s"], rel=5e-3), said
    code, out, err = run_cli(capsys, "estimate", *llama, "--gpus", "16384", "--framework", "internevo",
                             "--schedule", "interleaved-1f1b")
    assert code == 0, err
    flagged = json.loads(out)
    assert float(hint[1]) == pytest.approx(flagged["step_time_s"], rel=5e-3) and float(hint[1]) < 0.95 * float(hint[2])
    assert (flagged["vpp"], flagged["zero"], flagged["recompute"]) == (int(hint[3]), int(hint[4]),
                                                                      {"no": "none"}.get(hint[5], hint[5]))
    # torchtitan: the same, its default said and the faster interleaving hinted; the hint's numbers are the flag's
    code, out, err = run_cli(capsys, "estimate", *llama, "--gpus", "16384", "--framework", "torchtitan")
    assert code == 0, err
    titan_1f1b = json.loads(out)
    assert titan_1f1b["schedule"] == "1f1b" and titan_1f1b["fits"]
    (said,) = [n for n in titan_1f1b["assumptions"]["implied"]
               if n.startswith("1f1b (torchtitan's default pipeline schedule; --schedule not given); ")]
    hint = re.search(r"would take ([\d.]+) s against", said)
    code, out, err = run_cli(capsys, "estimate", *llama, "--gpus", "16384", "--framework", "torchtitan",
                             "--schedule", "interleaved-1f1b")
    assert code == 0, err
    assert hint and float(hint[1]) == pytest.approx(json.loads(out)["step_time_s"], rel=5e-3), said
    # automodel (torch pipelining too, its configs' pp_schedule interleaved1f1b) weighs it: the flag's answer, unnamed
    code, out, err = run_cli(capsys, "estimate", *llama, "--gpus", "16384", "--framework", "automodel")
    assert code == 0, err
    auto = json.loads(out)
    code, out, err = run_cli(capsys, "estimate", *llama, "--gpus", "16384", "--framework", "automodel",
                             "--schedule", "interleaved-1f1b")
    assert code == 0, err
    assert auto["schedule"] == "interleaved-1f1b" and auto["step_time_s"] == json.loads(out)["step_time_s"]
    # no hint where the stack has no interleaving (DeepSpeed's 1F1B only), a schedule is named, or interleaving cannot
    # run (24 micro-batches a replica over 16 stages: Megatron's rule wants a multiple of pp)
    for gpus, batch, flags in ((16384, 2048, ["--framework", "deepspeed"]),
                               (16384, 2048, ["--framework", "internevo", "--schedule", "1f1b"]),
                               (16384, 3072, ["--framework", "internevo"]), (16384, 3072, ["--framework", "megatron-core"])):
        argv = [a if a != "2048" else str(batch) for a in llama]
        code, out, err = run_cli(capsys, "estimate", *argv, "--gpus", str(gpus), *flags)
        assert code == 0, err
        assert not any("would take" in n for n in json.loads(out)["assumptions"]["implied"]), flags
    code, out, err = run_cli(capsys, "estimate", *llama, "--gpus", "16384", "--framework", "llama3")
    assert code == 0, err
    meta = json.loads(out)
    assert meta["schedule"] == "interleaved-1f1b" and meta["fits"] and meta["mfu"] > 1.5 * titan_1f1b["mfu"]
    assert any("llama3's published pipeline runs interleave" in n for n in meta["assumptions"]["implied"])
    code, out, err = run_cli(capsys, "estimate", *llama, "--gpus", "8192", "--framework", "llama3", "--recompute",
                             "none", "--schedule", "interleaved-1f1b")
    assert code == 0, err
    tight = json.loads(out)
    assert not tight["fits"]
    assert any("the closest to fitting: none fits; --vpp not given" in n for n in tight["assumptions"]["implied"])
    # megatron-core weighs interleaving there too: at 32 micro-batches a replica no depth holds the first stage's
    # warm-up without checkpoints, so plain 1F1B wins, and is said to be the fastest that fits, not a default
    code, out, err = run_cli(capsys, "estimate", *llama, "--gpus", "8192", "--framework", "megatron-core",
                             "--recompute", "none")
    assert code == 0, err
    weighed = json.loads(out)
    assert weighed["schedule"] == "1f1b" and weighed["fits"]
    assert ("plain 1F1B (of it and each interleaved depth, the fastest that fits; --schedule not given)"
            in weighed["assumptions"]["implied"])


def test_unnamed_virtual_stages_under_interleaving_are_chosen(capsys):
    # Llama 3 405B on 16,384 H100 (tp8 . pp16 . dp128: 16 micro-batches per replica), "interleaved" named, its depth
    # not reported (Llama 3 paper, Sec. 3.3.2). One chunk per rank would be plain 1F1B, idle (p-1)/(m+p-1) = 15/31 of
    # the step; any v >= 2 cuts that to 15/(16 v) (Narayanan et al. 2021, Sec. 2.2.2), so a deeper one is chosen, said
    # in assumptions.implied, and is exactly the layout its --vpp names.
    llama = ["--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--gpus", "16384", "--global-batch", "2048",
             "--seq-len", "8192", "--tp", "8", "--pp", "16", "--micro-batch", "1", "--schedule", "interleaved-1f1b",
             "--framework", "llama3", "--json"]
    code, out, err = run_cli(capsys, "estimate", *llama)
    assert code == 0, err
    unnamed = json.loads(out)
    assert unnamed["vpp"] >= 2 and any("virtual stages" in why for why in unnamed["assumptions"]["implied"])
    named = {}
    for v in ("1", str(unnamed["vpp"])):
        code, out, err = run_cli(capsys, "estimate", *llama, "--vpp", v)
        assert code == 0, err
        named[v] = json.loads(out)
    assert named[str(unnamed["vpp"])]["step_time_s"] == unnamed["step_time_s"] < named["1"]["step_time_s"]


def test_when_nothing_fits_the_unnamed_knobs_are_the_closest_to_fitting(capsys):
    # Meta's own 8K split of Llama 3 405B (tp8 . pp16, interleaved) without recompute: no ZeRO stage of the llama3
    # profile fits it with the planner's activation count, so the estimate shows the least memory the stack needs
    # (ZeRO-1: its FSDP accumulates whole FP32 gradients over the micro-batches whatever the stage, so ZeRO-2 holds
    # the same and the lower stage is named; sequence parallelism), not the first stage it tried.
    llama = ["--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--gpus", "8192", "--global-batch", "2048",
             "--seq-len", "8192", "--tp", "8", "--pp", "16", "--vpp", "7", "--micro-batch", "1", "--recompute", "none",
             "--framework", "llama3", "--json"]
    code, out, err = run_cli(capsys, "estimate", *llama)
    assert code == 0, err
    unnamed = json.loads(out)
    assert not unnamed["fits"] and unnamed["zero"] == 1 and unnamed["sequence_parallel"]
    for zero, sp in (("0", "--sequence-parallel"), ("2", "--sequence-parallel"), ("1", "--no-sequence-parallel")):
        code, out, err = run_cli(capsys, "estimate", *llama, "--zero", zero, sp)
        assert code == 0, err
        more = json.loads(out)["memory_gib_per_gpu"]
        assert more == unnamed["memory_gib_per_gpu"] if zero == "2" else more > unnamed["memory_gib_per_gpu"]


def test_help_names_the_default_framework_and_why(capsys):
    try:
        code = main(["plan", "--help"])
    except SystemExit as exc:  # argparse's own exit, if the CLI lets it through
        code = exc.code
    assert code in (0, None)
    out = " ".join(capsys.readouterr().out.split())
    assert "--framework" in out and "default torchtitan" in out and "shardwise" in out
    assert "--zero 1" in out and "megatron-core" in out  # what the default cannot run, and what runs it then


def test_estimate_help_names_the_stacks_that_weigh_interleaving(capsys):
    # only stacks that run interleaved 1F1B can weigh it: nanotron and aleph-alpha (1F1B only) and the FSDP-only
    # stacks are not listed, though their profiles inherit the weighing from a stack that interleaves
    try:
        main(["estimate", "--help"])
    except SystemExit:
        pass
    out = " ".join(capsys.readouterr().out.split())
    listed = re.search(r"vpp > 1; on (.*?), whose papers and recipes interleave", out)
    assert listed, out
    names = set(re.split(r", | and ", listed[1]))
    assert {"megatron-core", "nemo", "llama3", "automodel"} <= names
    assert not names & {"nanotron", "aleph-alpha", "composer", "lit-gpt", "fms-fsdp", "deepspeed", "shardwise",
                        "torchtitan"}


def test_an_unnamed_framework_is_the_default_or_the_fallback_where_the_flags_need_it(capsys):
    # plan and explain without --framework: torchtitan, or megatron-core (named with torchtitan's refusal) where the
    # flags ask what torchtitan cannot run; a named framework is never swapped (its refusal stays one line, exit 2).
    code, out, _ = run_cli(capsys, "plan", *ARTICLE, "--json", "--top", "1")
    plan = json.loads(out)
    assert code == 0 and plan["best"]["framework"] == "torchtitan" and "the default" in plan["framework_note"]
    code, out, _ = run_cli(capsys, "explain", *ARTICLE, "--json", "--zero", "1")
    why = json.loads(out)
    assert code == 0 and why["best"]["framework"] == "megatron-core" and why["best"]["zero"] == 1
    assert "the default torchtitan cannot run this: " in why["framework_note"]
    assert "torchtitan has no ZeRO-1" in why["framework_note"]
    code, out, err = run_cli(capsys, "plan", *ARTICLE, "--framework", "torchtitan", "--zero", "1")
    assert code == 2 and not out and "torchtitan has no ZeRO-1" in err and err.count("\n") == 1
    code, out, _ = run_cli(capsys, "plan", *ARTICLE, "--framework", "torchtitan", "--json", "--top", "1")
    assert code == 0 and "framework_note" not in json.loads(out)
    # neither runs it: each stack's own reason, one line
    code, out, err = run_cli(capsys, "estimate", *ARTICLE, "--tp", "8", "--micro-batch", "1", "--zero", "1", "--compile")
    assert code == 2 and not out and err.count("\n") == 1
    assert "torchtitan has no ZeRO-1" in err and "nor can megatron-core (--compile" in err
    # a refusal of the input itself (a range), which one stack meets before its own check, is said plainly
    # (helper-232: "the default torchtitan cannot run this (--gpus must be at least 1, got 0), nor can megatron-core")
    for bad in (["--gpus", "0", "--compile"], ["--pp", "-1", "--offload", "optimizer"]):
        code, out, err = run_cli(capsys, "estimate", *ARTICLE, *bad)
        assert code == 2 and err.startswith("shardwise: error: --") and "must be at least 1" in err, err
        assert "cannot run this" not in err and err.count("\n") == 1
    # a stack's own limit that names no stack (its stage cut's layers) keeps both reasons (helper-233)
    code, _, err = run_cli(capsys, "estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "8",
                           "--global-batch", "64", "--seq-len", "4096", "--pp", "2", "--zero", "1",
                           "--recompute-layers", "17")  # torchtitan's stage holds 17 layers, megatron-core's 16
    assert code == 2 and "torchtitan has no ZeRO-1" in err and "nor can megatron-core" in err, err


@pytest.mark.parametrize("framework, flags, later", [
    ("deepspeed", ["--sequence-parallel"], "deepspeed-2024"),  # Megatron-DeepSpeed's SP came after the 2021 releases
    ("megatron-2021", ["--zero", "3"], "megatron-core"),  # Megatron FSDP
])
def test_a_layout_a_later_release_runs_is_refused_naming_it(capsys, framework, flags, later):
    argv = ["estimate", *ARTICLE, "--tp", "8", "--micro-batch", "1", "--framework", framework, *flags]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and not out and err.count("\n") == 1 and f"--framework {later}" in err
    code, _, _ = run_cli(capsys, *argv[:-len(flags) - 2], "--framework", later, *flags, "--json")
    assert code == 0  # and that release does run it
    # a layout no later release runs either keeps the plain advice
    code, _, err = run_cli(capsys, "estimate", *ARTICLE, "--tp", "8", "--micro-batch", "1", "--framework", "deepspeed",
                           "--pp", "2", "--vpp", "2", "--schedule", "interleaved-1f1b")
    assert code == 2 and "pick another --framework" in err and "later releases" not in err


def test_malformed_config_names_the_missing_key(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    code, _, err = run_cli(capsys, "estimate", "--model", str(cfg), "--cluster", "dgx-a100-80gb", "--gpus", "1",
                           "--global-batch", "1", "--seq-len", "8", "--micro-batch", "1", "--json")
    assert code == 2 and "intermediate_size" in err


def test_planner_commands_do_not_import_torch():
    code = ("import sys; from shardwise.cli import main; "
            "main(['estimate','--model','tiny','--cluster','dgx-h100-80gb','--gpus','2','--global-batch','4',"
            "'--seq-len','16','--micro-batch','1','--json']); "
            "main(['plan','--model','tiny','--cluster','dgx-h100-80gb','--gpus','2','--global-batch','4',"
            "'--seq-len','16','--json','--explain']); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_json_answers_load_neither_the_terminal_library_nor_package_metadata():
    # rich (40-60 ms to import) draws tables, and the installed package's metadata (30-60 ms) answers --version: a
    # --json answer needs neither before it starts its search (the 405B plan's 2 s budget includes Python's start)
    code = ("import sys; from shardwise.cli import main; "
            "main(['plan','--model','tiny','--cluster','dgx-h100-80gb','--gpus','2','--global-batch','4',"
            "'--seq-len','16','--json','--explain']); "
            "main(['estimate','--model','tiny','--cluster','dgx-h100-80gb','--gpus','2','--global-batch','4',"
            "'--seq-len','16','--micro-batch','1','--json']); "
            "print(sorted(m for m in ('rich', 'importlib.metadata') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "[]", (r.stdout[-300:], r.stderr)
    table = subprocess.run([sys.executable, "-m", "shardwise", "plan", "--model", "tiny", "--cluster", "dgx-h100-80gb",
                            "--gpus", "2", "--global-batch", "4", "--seq-len", "16"], capture_output=True, text=True)
    assert table.returncode == 0 and "dp2" in table.stdout, table.stderr  # the table still draws, rich loaded on use


def test_plan_lists_one_layout_per_split_unless_all_variants(capsys):
    _, out, _ = run_cli(capsys, "plan", *ARTICLE, *NARROW, "--top", "6", "--json")
    splits = [(c["dp"], c["tp"], c["pp"]) for c in json.loads(out)["candidates"]]
    assert len(splits) == len(set(splits)) == 6
    _, out, _ = run_cli(capsys, "plan", *ARTICLE, *NARROW, "--top", "6", "--json", "--all-variants")
    cands = json.loads(out)["candidates"]
    times = [c["step_time_s"] for c in cands]
    assert times == sorted(times) and len({(c["dp"], c["tp"], c["pp"]) for c in cands}) < 6


def test_the_search_tries_one_shard_group_per_node_where_the_stack_runs_hsdp():
    import dataclasses

    from shardwise.planner.job import make_job

    # 800 Gb/s per node of 8 H100s (IBM's cluster behind fms-fsdp). With a BF16 reduce, FULL_SHARD's network carries
    # 2 + 2 + 2 bytes per parameter and step (two gathers, a reduce-scatter), HSDP's all-reduce 2 x 2: the search,
    # which now scores the node-sized shard groups too, picks them; a stack without HSDP never shows them.
    ibm = dataclasses.replace(load_cluster("dgx-h100-80gb"), inter_node_bandwidth=800 / 8 / 8 * 1e9)
    space = SearchSpace(zero=(3,))
    best = search(make_job(load_model("llama2-7b"), ibm, 192, 4096, "composer-pure"), 96, space).ranked[0].layout
    assert (best.dp_shard, best.replicas) == (8, 12)
    ranked = search(make_job(load_model("llama2-7b"), ibm, 192, 4096, "megatron-core"), 96, space).ranked
    assert ranked and all(e.layout.replicas == 1 for e in ranked)


@pytest.mark.parametrize("model, framework, seq", [("llama3.1-405b", "megatron-2021", 8192),
                                                    ("llama3.1-405b", "megatron-core", 8192),
                                                    ("deepseek-v3", "megatron-core", 4096)])  # fits only with its experts spread
def test_the_gpu_count_nothing_fits_suggests_is_one_where_a_layout_fits(model, framework, seq):
    import re

    from shardwise.planner.job import make_job
    from shardwise.planner.search import nothing_fits_message

    job = make_job(load_model(model), load_cluster("dgx-h100-80gb"), 1024, seq, framework)
    result = search(job, 64)
    assert not result.ranked
    n = int(re.search(r"use about (\d+) GPUs", nothing_fits_message(job, 64, result)).group(1))
    assert search(job, n).ranked  # following the hint ends the search for a fitting count


@pytest.mark.parametrize("model, framework, gpus, batch, seq, cluster", [
    ("llama2-70b", "deepspeed", 8, 64, 4096, "dgx-a100-80gb"),  # its pipeline caps ZeRO at 1: ZeRO-3 there is refused
    ("llama3-8b", "llama3", 1, 16, 8192, "dgx-h100-80gb"),  # its context parallelism is all-gather, not ring
    ("llama3-8b", "fms-fsdp", 16, 64, 32768, "dgx-h100-80gb"),  # no accumulation: a rank takes its share at once
])
def test_the_gpu_count_hint_is_found_where_the_leanest_layout_needs_the_stacks_own_knobs(model, framework, gpus, batch,
                                                                                        seq, cluster):
    """The leanest layout at a GPU count is the one the stack runs there: the highest ZeRO stage its pipeline allows,
    its own context-parallel mode, its one micro-batch a step. Checked with another stack's knobs, every count looked
    unfit (no hint, and a sentence that began "to make it fit: or ..."), or too small (32 GPUs where 64 are needed)."""
    import re

    from shardwise.planner.job import make_job
    from shardwise.planner.search import nothing_fits_message

    job = make_job(load_model(model), load_cluster(cluster), batch, seq, framework)
    result = search(job, gpus)
    assert not result.ranked
    msg = nothing_fits_message(job, gpus, result)
    assert "fit: or" not in msg and msg.endswith("or a cluster with more memory per GPU"), msg
    n = int(re.search(r"use about (\d+) GPUs", msg).group(1))
    assert search(job, n).ranked, msg  # following the hint fits


def test_no_gpu_count_is_suggested_where_more_gpus_cannot_shard_the_weights_enough():
    """Meta's 2022-23 stack (`llama2`) has no pipeline and no weight sharding: at tp 8 a 405B model's BF16 weights
    and FP32 gradients alone exceed a GPU, however many there are."""
    from shardwise.planner.job import make_job
    from shardwise.planner.search import nothing_fits_message

    job = make_job(load_model("llama3.1-405b"), load_cluster("dgx-h100-80gb"), 2048, 8192, "llama2")
    result = search(job, 16384)
    assert not result.ranked and "use about" not in nothing_fits_message(job, 16384, result)


def test_schedules_a_stack_runs_none_of_is_one_line_not_a_pipeline_free_plan(capsys):
    # megatron-core has no ZB-H1: --schedules zb-h1 would otherwise leave only pp 1 layouts, a plan that quietly
    # ignores what was asked. With a schedule it runs beside it, it plans.
    job = ["--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "64", "--seq-len",
           "4096", "--framework", "megatron-core", "--json"]
    code, _, err = run_cli(capsys, "plan", *job, "--schedules", "zb-h1")
    assert code == 2 and "megatron-core runs none of them" in err and err.count("\n") == 1
    code, out, err = run_cli(capsys, "plan", *job, "--schedules", "zb-h1,1f1b")
    assert code == 0, err
    # a stack without pipelines runs pp 1 whatever the schedule named: a row's "1F1B" narrows nothing there
    code, out, err = run_cli(capsys, "plan", *job[:-3], "--framework", "composer", "--schedules", "1f1b", "--json")
    assert code == 0 and json.loads(out)["best"]["pp"] == 1, err


def test_plan_finds_what_estimate_fills_in_with_partial_recompute(capsys):
    # Llama 3 70B on 64 H100 under torchtitan at tp 8 . pp 2: estimate's unnamed knobs find ZeRO-3 with 2 layers of
    # each chunk recomputed; plan over the same degrees once stopped at ZeRO-2 (FSDP's ZeRO-3 is never faster at the
    # same recompute) and at selective recompute, and missed it. Its best is at least as fast as that completion.
    job = ["--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "256",
           "--seq-len", "8192", "--framework", "torchtitan", "--json"]
    code, out, err = run_cli(capsys, "estimate", *job, "--tp", "8", "--pp", "2", "--schedule", "1f1b")
    assert code == 0, err
    filled = json.loads(out)
    assert filled["fits"] and filled["recompute"] == "full" and filled["recompute_layers"]
    code, out, err = run_cli(capsys, "plan", *job, "--tp", "8", "--pp", "2", "--cp", "1", "--top", "1")
    assert code == 0, err
    assert json.loads(out)["best"]["step_time_s"] <= filled["step_time_s"]


def test_ring_and_allgather_context_parallelism_are_each_scored_so_the_plan_is_the_faster():
    """Ring and all-gather CP differ in exposed K/V traffic and in the attention kernel's blocks (and in the K/V they
    hold): a plan over both modes is never slower than one restricted to either (the mode was once chosen per layer
    on its K/V traffic alone, and the full plan lost 0.9 % to `--cp 2 --cp-modes allgather`)."""
    from shardwise.model_spec import load_model
    from shardwise.planner.job import make_job
    from shardwise.specs import load_cluster
    from shardwise.planner.search import SearchSpace, search

    job = make_job(load_model("llama3-8b"), load_cluster("dgx-h100-80gb"), 512, 8192, "megatron-core")
    full = search(job, 64).ranked[0]
    for mode in ("ring", "allgather"):
        only = search(job, 64, SearchSpace(cp=(2,), cp_modes=(mode,))).ranked[0]
        assert only.layout.cp_mode == mode and full.step_time <= only.step_time
    assert full.layout.cp == 2 and full.layout.cp_mode == "allgather"  # the faster of the two at 8K here


def test_explain_says_when_the_search_was_narrowed():
    from shardwise.model_spec import load_model
    from shardwise.planner.explain import explain
    from shardwise.planner.job import make_job
    from shardwise.planner.search import search
    from shardwise.specs import load_cluster

    job = make_job(load_model("mixtral-8x7b"), load_cluster("dgx-h100-80gb"), 256, 4096, "megatron-core")
    result = search(job, 64)
    assert result.thinned and any(p.startswith("Search narrowed: ") for p in explain(job, 64, result))


def test_plan_says_which_recompute_policies_a_stack_searched_as_its_runs_trained_left_out(capsys):
    """deepspeed is searched with none and full recompute (its 2021-22 Megatron-DeepSpeed had no selective); plan says
    how to search selective too, and says nothing once --recompute is named."""
    import json

    from shardwise.cli import main

    common = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch", "64",
              "--seq-len", "4096", "--framework", "deepspeed", "--json", "--top", "1"]
    assert main(common) == 0
    note = json.loads(capsys.readouterr().out).get("winner_note", "")
    assert "--recompute none,full,selective searches selective too" in note
    assert main([*common, "--recompute", "none,full,selective"]) == 0
    assert "searches selective" not in json.loads(capsys.readouterr().out).get("winner_note", "")


def test_nothing_fits_offers_fewer_tokens_only_where_fewer_tokens_would_help(capsys):
    """Llama 3 70B on 8 A100 under megatron-2021 (no ZeRO): its weights, gradients and optimizer states alone are
    168 GiB a GPU, so a smaller batch or sequence cannot make it fit and is not offered (it was); Llama 3 8B at
    512K tokens on 8 GPUs is held back by its activations, and is offered it."""
    code, _, err = run_cli(capsys, "plan", "--model", "llama3-70b", "--cluster", "dgx-a100-80gb", "--gpus", "8",
                           "--global-batch", "512", "--seq-len", "8192", "--framework", "megatron-2021")
    assert code == 2 and "nothing fits" in err and "smaller global batch" not in err, err
    code, _, err = run_cli(capsys, "plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "8",
                           "--global-batch", "1", "--seq-len", "524288", "--framework", "megatron-core")
    assert code == 2 and "nothing fits" in err and "a smaller global batch or sequence length" in err, err


def test_nothing_fits_names_a_zero_stage_the_stack_runs_only_when_named(capsys):
    """megatron-2021's search leaves its distributed optimizer (ZeRO-1) out unless --zero names it; where that alone
    makes the leanest layout fit, the message says --zero 1, and following it plans a layout."""
    argv = ["plan", "--model", "llama2-70b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "256",
            "--seq-len", "4096", "--framework", "megatron-2021", "--tp", "4", "--pp", "2"]
    assert main(argv) == 2
    assert "--zero 1," in capsys.readouterr().err
    assert main([*argv, "--zero", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["best"]["zero"] == 1


def test_torchtitan_without_data_parallelism_is_refused_by_name_and_the_default_falls_back(capsys):
    """torchtitan applies mixed precision only through FSDP: tp 8 on 8 GPUs (no dp, no cp) would train in FP32. Named,
    the stack refuses it in one line saying so; as the default, the plan runs under megatron-core and its note gives
    the same reason once (not the search's framing inside the note's)."""
    argv = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8",
            "--seq-len", "1024", "--tp", "8"]
    assert main([*argv, "--framework", "torchtitan"]) == 2
    err = capsys.readouterr().err
    assert "runs mixed precision only through FSDP" in err and "no schedule" not in err and "\n" not in err.strip()
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best"]["framework"] == "megatron-core"
    assert "trains in FP32" in out["framework_note"] and "cannot run any layout" not in out["framework_note"]


def test_max_vpp_1_with_only_interleaving_names_the_depth(capsys):
    """--max-vpp 1 leaves interleaved 1F1B no depth to search (it interleaves two or more chunks a rank): the refusal
    names that, where it had blamed the micro-batch count and the layers, neither of which failed."""
    code, _, err = run_cli(capsys, "plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "8",
                           "--global-batch", "64", "--seq-len", "4096", "--pp", "2", "--max-vpp", "1",
                           "--schedules", "interleaved-1f1b", "--framework", "megatron-core")
    assert code == 2 and err.count("\n") == 1
    assert "--max-vpp 1" in err and "multiple of pp" not in err


def test_an_empty_name_in_a_list_flag_is_shown(capsys):
    code, _, err = run_cli(capsys, "plan", *ARTICLE, "--schedules", "1f1b,,gpipe")
    assert code == 2 and "unknown '' — choose from" in err


def test_nothing_fits_under_emit_suggests_a_count_the_target_can_run(tmp_path, capsys):
    """--emit deepspeed: the GPU count 'nothing fits' suggests is one where a layout DeepSpeed's files can express
    fits (no TP beside its pipeline); it had suggested 72, where only such a layout fits and the plan is refused."""
    import re

    job = ["--model", "gpt3-175b", "--cluster", "dgx-a100-40gb", "--global-batch", "512", "--seq-len", "128",
           "--emit", "deepspeed", "--out", str(tmp_path / "run.sh")]
    code, _, err = run_cli(capsys, "plan", *job, "--gpus", "64")
    assert code == 2, err
    n = int(re.search(r"use about (\d+) GPUs", err).group(1))
    code, _, err = run_cli(capsys, "plan", *job, "--gpus", str(n))
    assert code == 0, err
