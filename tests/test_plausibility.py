"""Layout-free plans against tuned published runs (benchmarks/plausibility.py), under the profile of the stack that
ran each: the planner's best plan must not claim much more than the stack delivered."""

import importlib.util
import sys
from pathlib import Path

import pytest

from shardwise.errors import UsageError
from shardwise.planner import estimate, frameworks
from shardwise.planner.job import make_job
from shardwise.planner.search import search
from shardwise.specs import Layout, load_cluster, load_model

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "plausibility.py"


def _bench():
    spec = importlib.util.spec_from_file_location("plausibility", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("case_name", ["LLaMA 65B", "Llama 2 70B", "Llama 2 7B", "Llama 2 13B"])
def test_meta_a100_runs_under_the_stack_that_ran_them(case_name):
    # LLaMA 65B (~380 tokens/s per GPU, LLaMA Sec. 2.4) and Llama 2 70B (323, its GPU-hours) on 2,048 A100s with
    # Meta's 2022-23 stack: planned with that stack's profile the best layout is at most 15 % faster (the issue's
    # goal); with a 2024 stack (FlashAttention-2, no recompute) more.
    bench = _bench()
    case = next(c for c in bench.CASES if c[0].startswith(case_name))
    saved = bench.CASES
    try:
        bench.CASES = [case]
        rows = {r["framework"]: r for r in bench.run(["llama2", "megatron-core"])}
    finally:
        bench.CASES = saved
    assert rows["llama2"]["ran_it"] and rows["llama2"]["faster_than_published"] <= 0.15
    assert rows["llama2"]["recompute"] != "none"
    assert rows["megatron-core"]["faster_than_published"] > rows["llama2"]["faster_than_published"]


def test_the_default_framework_plans_at_most_15_percent_above_every_tuned_run():
    # The plausibility goal for a user who names no stack: plan's best over the whole space, under the default
    # profile, against each tuned run (Meta's Llama 2 7B-70B and LLaMA 65B on 2,048 A100, Llama 3 405B on 8,192 and
    # 16,384 H100). megatron-core, the default before, claims more on every A100 case.
    rows = _bench().run([frameworks.DEFAULT_FRAMEWORK, frameworks.FALLBACK_FRAMEWORK])
    default = [r for r in rows if r["framework"] == frameworks.DEFAULT_FRAMEWORK]
    assert len(default) == 6 and all(r["best"] for r in default)
    assert all(r["faster_than_published"] <= 0.15 for r in default), [(r["case"], r["faster_than_published"]) for r in default]
    fallback = {r["case"]: r["faster_than_published"] for r in rows if r["framework"] == frameworks.FALLBACK_FRAMEWORK}
    assert all(fallback[r["case"]] > r["faster_than_published"] for r in default if "A100" in r["case"])


def test_llama2_profile_always_checkpoints():
    fw = frameworks.get("llama2")
    with pytest.raises(UsageError, match="llama2 always recomputes"):
        frameworks.check(fw, Layout(dp=2, tp=2, recompute="none", sequence_parallel=True))
    frameworks.check(fw, Layout(dp=2, tp=2, recompute="selective", sequence_parallel=True))


def test_llama2_data_parallelism_is_the_papers_all_reduce():
    # LLaMA Sec. 2.4: the network traffic is "due to all_reduce operations"; FSDP's ZeRO-2/3 gather and reduce-scatter.
    fw = frameworks.get("llama2")
    with pytest.raises(UsageError, match="no ZeRO-2"):
        frameworks.check(fw, Layout(dp=2, tp=2, zero=2, recompute="selective", sequence_parallel=True))
    frameworks.check(fw, Layout(dp=2, tp=2, zero=1, recompute="selective", sequence_parallel=True))


def test_llama2_checkpointing_keeps_the_attention_and_recomputes_the_norms():
    # LLaMA's hand-written backward keeps "the activations that are expensive to compute" and passes xformers' backward
    # the saved output and log-sum-exp: selective recompute runs no attention again, only the two RMSNorms.
    job = make_job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), 2048, 2048, "llama2")
    lay = Layout(dp=256, tp=8, micro_batch=1, zero=1, recompute="selective", sequence_parallel=True)
    est = estimate(job, lay)
    assert est.hardware_flops == est.model_flops
    # By hand: 80 layers x 8 micro-batches x two norms, each reading and writing 2 bytes per element of its
    # 8192 / 8 sequence-parallel columns for 2048 tokens, at 90 % of A100's 2,039 GB/s.
    by_hand = 80 * 8 * 2 * (2 + 2) * (8192 / 8) * 2048 / (2039e9 * 0.9)
    assert est.time_s["recompute"] == pytest.approx(by_hand, rel=0.01)


def test_llama2_has_no_pipeline():
    # LLaMA Sec. 2.4 names "model and sequence parallelism" and Meta's earlier stack (OPT Sec. 2.4: FSDP with Megatron
    # tensor parallelism) had no pipeline: the profile refuses one with the fix, and its plans are all pp 1.
    fw = frameworks.get("llama2")
    with pytest.raises(UsageError, match="no pipeline parallelism"):
        frameworks.check(fw, Layout(dp=2, tp=2, pp=2, recompute="selective", sequence_parallel=True))
    job = make_job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), 2048, 2048, "llama2")
    ranked = search(job, 2048).ranked
    assert ranked and all(e.layout.pp == 1 for e in ranked)
