"""Search, ranking, explanation and the plan / estimate / explain commands (contract, bad input)."""

import json
import subprocess
import sys

import pytest

from shardwise.cli import main
from shardwise.planner import Job, estimate
from shardwise.planner.search import search
from shardwise.specs import Layout, TrainSpec, load_cluster, load_model, validate_layout

ARTICLE = ["--model", "llama-65b", "--cluster", "dgx-a100-80gb", "--gpus", "64", "--global-batch", "256",
           "--seq-len", "2048"]


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
    for e in result.ranked[:50]:
        validate_layout(e.layout, job.model, 64, 16)
        assert e.fits


def test_search_winner_beats_every_fitting_layout_of_a_brute_force_sample():
    # Exhaustive over a small space: no unpruned fitting layout is faster than the winner.
    job = Job(load_model("llama2-7b"), load_cluster("dgx-a100-40gb"), TrainSpec(16, 1024))
    best = search(job, 8).ranked[0]
    from shardwise.specs import divisors
    for tp in (1, 2, 4, 8):
        for pp in divisors(8 // tp):
            dp = 8 // (tp * pp)
            for mb in divisors(16 // dp):
                for zero in (0, 1, 2, 3):
                    for rc in ("none", "selective", "full"):
                        for sp in {False, tp > 1}:
                            for sched in (("1f1b",) if pp == 1 else ("gpipe", "1f1b", "zb-h1")):
                                lay = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, zero=zero, recompute=rc,
                                             sequence_parallel=sp, schedule=sched)
                                e = estimate(job, lay)
                                if e.fits:
                                    assert e.step_time >= best.step_time * (1 - 1e-9), lay


def test_plan_json_contract(capsys):
    code, out, _ = run_cli(capsys, "plan", *ARTICLE, "--top", "3", "--json")
    assert code == 0
    data = json.loads(out)
    assert set(data) >= {"best", "candidates"} and len(data["candidates"]) == 3
    assert data["best"] == data["candidates"][0]
    best = data["best"]
    assert best["tp"] * best["pp"] * best["dp"] == 64 and best["fits"]
    assert best["num_microbatches"] == 256 // (best["dp"] * best["micro_batch"])


def test_plan_table_and_explain_use_the_articles_terms(capsys):
    code, out, _ = run_cli(capsys, "plan", *ARTICLE, "--top", "5", "--explain")
    assert code == 0 and "MFU" in out and "M_model" in out and "M_GPU" in out
    code, out, _ = run_cli(capsys, "explain", *ARTICLE)
    assert code == 0
    for needle in ("M_model", "TP =", "PP =", "DP =", "bubble", "Runner-up"):
        assert needle in out


def test_estimate_json_matches_the_library(capsys):
    argv = ["estimate", *ARTICLE, "--tp", "8", "--pp", "4", "--micro-batch", "1", "--vpp", "2", "--zero", "1",
            "--recompute", "selective", "--sequence-parallel", "--json"]
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    data = json.loads(out)
    job = Job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), TrainSpec(256, 2048), flash_attention=True)  # the CLI default
    lay = Layout(dp=2, tp=8, pp=4, micro_batch=1, vpp=2, zero=1, recompute="selective", sequence_parallel=True,
                 schedule="interleaved-1f1b")
    assert data == json.loads(json.dumps(estimate(job, lay).to_dict()))


@pytest.mark.parametrize("argv, needle", [
    (["estimate", *ARTICLE, "--tp", "3", "--micro-batch", "1"], "does not divide 64 GPUs"),
    (["estimate", "--model", "llama-65b", "--cluster", "dgx-a100-80gb", "--gpus", "48", "--global-batch", "256",
      "--seq-len", "2048", "--tp", "3", "--micro-batch", "1"], "does not divide the 64 attention heads"),
    (["estimate", *ARTICLE, "--tp", "8", "--micro-batch", "3"], "not divisible"),
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


def test_plan_lists_one_layout_per_split_unless_all_variants(capsys):
    _, out, _ = run_cli(capsys, "plan", *ARTICLE, "--top", "6", "--json")
    splits = [(c["dp"], c["tp"], c["pp"]) for c in json.loads(out)["candidates"]]
    assert len(splits) == len(set(splits)) == 6
    _, out, _ = run_cli(capsys, "plan", *ARTICLE, "--top", "6", "--json", "--all-variants")
    cands = json.loads(out)["candidates"]
    times = [c["step_time_s"] for c in cands]
    assert times == sorted(times) and len({(c["dp"], c["tp"], c["pp"]) for c in cands}) < 6
