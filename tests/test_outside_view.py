"""benchmarks/outside_view.py: the command line, given only what a published row states, predicts what
benchmarks/published_runs.py --six-profiles predicts (its job and layout built in Python, a separate path) wherever
the two start from the same facts; where they do not, the listing names what differs."""

import importlib.util
import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _outside_view():
    sys.path.insert(0, str(BENCHMARKS))  # it imports published_runs beside it
    try:
        spec = importlib.util.spec_from_file_location("outside_view", BENCHMARKS / "outside_view.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_command_line_predicts_the_internal_view_where_both_know_the_same(tmp_path):
    view = _outside_view()
    rows = view.score_rows(view.pr.read_rows(view.pr.DEFAULT_CSV), tmp_path, True)
    scored = [r for r in rows if "cli_step_s" in r]
    # every dense row the internal view scores goes through the command line; what the command line refuses with
    # "nothing fits" or predicts not to fit is what the internal view (the same six profiles) predicts not to fit (Llama
    # 3 405B's 8K rows without activation checkpointing, as the paper ran them; Composer's runs charged torchtitan's
    # eager loss: docs/accuracy.md); a release's fused norms and uncompiled loss are stated by flag
    assert len(rows) >= 226
    assert all("nothing fits" in r["cli_error"] for r in rows if "cli_step_s" not in r)
    cli = {r["run"] for r in rows if "cli_step_s" not in r} | {r["run"] for r in scored if not r["fits"] and not r["weak"]}
    internal = set(view.pr.compare(view.pr.DEFAULT_CSV, six_profiles=True)[1]["not_fitting"])
    assert cli == internal
    # on the estimate path the command line reads the same model from config.json and fills in every unstated knob
    # as the internal view sets it (a release's fused norms and uncompiled loss by --fused-norms and --no-compile-loss,
    # Transformer Engine's attention by --attention-backend); what may differ is only what no flag states: the row's
    # own network or memory against the cluster preset
    facts = [(r["run"], why) for r in scored if r["path"] == "estimate" for why in r["why"]
             if not why.startswith("cluster ")]
    assert not facts
    # rows with nothing listed as different (same model, cluster, knobs; no plan): the same step, to the JSON's
    # rounding (6 decimals of a step of 0.3 s or more)
    same = [r for r in scored if r["path"] == "estimate" and not r["why"]]
    assert len(same) >= 150
    apart = [(r["run"], r["cli_step_s"], r["internal_step_s"]) for r in same
             if abs(r["cli_step_s"] / r["internal_step_s"] - 1) > 1e-4]
    assert not apart
    # and a row that differs says why: Jean Zay's four Omni-Path links (6.25 GB/s per GPU) against the preset's 25
    bloom = next(r for r in scored if r["run"] == "BLOOM-176B production (tr11)")
    assert any("inter_node_bandwidth" in why for why in bloom["why"])
    assert bloom["cli_step_s"] < bloom["internal_step_s"]


def test_compiled_rows_pass_compile_to_the_command_line(tmp_path):
    # A run built with torch.compile is scored with --compile (Inductor's fused element-wise kernels); --as-eager
    # scores it without, as a checker who passes only the row's layout does. OLMo-core's 7B table row (README at
    # e27ba7455): 10,000 tokens/s per GPU, global batch 1,024 x 4,096 on 8 GPUs: 1024 * 4096 / (10000 * 8) = 52.43 s.
    view = _outside_view()
    row = next(r for r in view.pr.read_rows(view.pr.DEFAULT_CSV) if r["run"] == "OLMo-core 7B (OLMo-1124) 8?xH100 FSDP2 BF16")
    scored, eager = view.score_row(row, tmp_path, True), view.score_row(row, tmp_path, True, as_eager=True)
    assert "--compile" in scored["argv"] and "--compile" not in eager["argv"]
    assert abs(scored["published_step_s"] - 1024 * 4096 / (10000 * 8)) < 1e-6
    assert scored["fits"] and 0 < scored["cli_step_s"] < eager["cli_step_s"]
    assert abs(scored["cli_step_s"] / scored["internal_step_s"] - 1) < 1e-4  # the internal view compiles it too
    # torchtitan's runs on 500 W Grand Teton H100s are scored on their own preset (the power curve, HBM2e); a compiled
    # FP8 one with --precision fp8 --compile, as the command line and the internal view agree
    capped = [r for r in view.pr.read_rows(view.pr.DEFAULT_CSV) if "500 W" in r["gpu_type"]]
    bf16 = view.score_row(next(r for r in capped if r["run"] == "torchtitan Llama 3.1 8B FSDP 8xH100"), tmp_path, True)
    assert bf16["argv"][bf16["argv"].index("--cluster") + 1] == "h100-96gb-500w" and bf16["fits"]
    fp8 = view.score_row(next(r for r in capped if "Float8" in r["run"]), tmp_path, True)
    assert {"--compile", "fp8", "h100-96gb-500w"} <= set(fp8["argv"]) and fp8["fits"]
    assert abs(fp8["cli_step_s"] / fp8["internal_step_s"] - 1) < 1e-4


def test_a_row_that_states_sp_off_is_estimated_without_it(tmp_path):
    # InternEvo's tensor mode 'mtp' (its A100 table: "SP off") is plain Megatron TP. The command line must say so
    # (--no-sequence-parallel), or estimate, told nothing, picks sequence parallelism where it is faster
    # (megatron-core, the nearest of the six profiles) and scores another layout than the row ran.
    view = _outside_view()
    row = next(r for r in view.pr.read_rows(view.pr.DEFAULT_CSV) if r["run"] == "InternEvo 7B tp2 zero1=-1 8xA100")
    stated = view.score_row(row, tmp_path, True)
    assert "--no-sequence-parallel" in stated["argv"] and not any("sequence_parallel" in w for w in stated["why"])
    assert abs(stated["cli_step_s"] / stated["internal_step_s"] - 1) < 1e-4
    silent = view.score_row({**row, "notes": row["notes"].replace("SP off", "")}, tmp_path, True)
    assert not {"--sequence-parallel", "--no-sequence-parallel"} & set(silent["argv"])
    assert "sequence_parallel: command line True, internal False" in silent["why"]
    assert silent["cli_step_s"] != stated["cli_step_s"]


def test_rows_on_aws_p4d_name_a_preset_with_the_network_they_state():
    # AWS p4d / p4de: 400 Gb/s of EFA per instance of eight A100s (BloombergGPT, the PyTorch/AWS FSDP rows); the
    # command line can only say so by naming a preset, so the preset it names must carry that network, not a DGX's
    from shardwise.specs import load_cluster

    pr = _outside_view().pr
    aws = [r["gpu_type"] for r in pr.read_rows(pr.DEFAULT_CSV) if "p4d" in r["gpu_type"]]
    assert len(aws) >= 4
    for gpu_type in aws:
        cluster = load_cluster(pr.cluster_preset(gpu_type))
        assert cluster.inter_node_bandwidth == pr.stated_network(gpu_type, cluster.gpus_per_node) == 400e9 / 8 / 8
        assert cluster.gpu_memory_bytes == (40 if "40GB" in gpu_type else 80) * 2**30


def test_a_p4d_row_scores_the_same_through_the_command_line(capsys):
    # the PyTorch/AWS GPT-3 175B row (weak: the only row selected, so the summary has no strong row to print) was
    # 7 points more optimistic through the command line on the DGX preset's network; on aws-p4d the two views agree
    view = _outside_view()
    assert view.main(["--only", "PyTorch FSDP AWS GPT-3 175B", "--json"]) == 0
    row, = json.loads(capsys.readouterr().out)["rows"]
    assert row["path"] == "estimate" and abs(row["difference"]) < 0.005, row
    assert view.main(["--only", "PyTorch FSDP AWS GPT-3 175B"]) == 0
    assert "no strong dense row in the summary" in capsys.readouterr().out


def test_a_series_ranked_against_its_source_says_how_far_apart_the_source_has_those_rows(capsys):
    # NVIDIA dgxc-benchmarking 24.11, GPT-3 175B on 128..2,048 H100s: 459.7, 457.7, 450.6, 454.6, 454.1 tokens/s per
    # GPU. The planner falls monotonically with the GPU count (tau +0.60 over the five rows); the per-series line says
    # the pairs it swaps are at most 4.0 / 450.6 = 0.9 % apart in the source, tau itself unchanged. (torchtitan's Llama
    # 2 13B checkpointing trio served here until its layer policy's recompute stopped early, tau +1.)
    view = _outside_view()
    assert view.main(["--only", "GPT-3 175B (NeMo 24.11 recipe)"]) == 0
    line, = [x for x in capsys.readouterr().out.splitlines() if x.split()[:1] == ["dgxc-24.11-gpt-3-175b-dp"]]
    assert "tau +0.60 / +0.60" in line and "published at most 0.9% apart" in line, line


def test_widest_discordant_gap_is_read_from_the_measured_values():
    from shardwise.validate.stats import widest_discordant_gap

    # NVIDIA dgxc-benchmarking 24.11, GPT-3 175B on 128..2,048 H100s: 459.7, 457.7, 450.6, 454.6, 454.1 tokens/s
    # per GPU; a prediction falling with the GPU count swaps 512 with 1,024 (4.0 / 450.6 = 0.89 %) and with 2,048
    # (3.5 / 450.6 = 0.78 %)
    published = [459.7, 457.7, 450.6, 454.6, 454.1]
    assert abs(widest_discordant_gap(published, [5, 4, 3, 2, 1]) - 4.0 / 450.6) < 1e-9
    assert widest_discordant_gap(published, published) is None
    assert widest_discordant_gap([1.0, 2.0], [2.0, 2.0]) is None  # a tie in the prediction is not a swap


def test_rows_are_binned_by_how_full_the_planner_says_their_gpus_are():
    # Five rows: two at half memory (errors +10 % and -20 %), one at 0.96, one that does not fit (1.3), one at 0.1.
    view = _outside_view()
    rows = [{"memory_share": s, "cli_error_pct": e} for s, e in
            [(0.55, 0.10), (0.6, -0.20), (0.96, 0.30), (1.3, -0.05), (0.1, 0.02)]]
    bins = {(b["from"], b["to"]): b for b in view.by_memory_share(rows)}
    assert set(bins) == {(0.0, 0.5), (0.5, 0.7), (0.95, 1.0), (1.0, None)}  # empty bins are left out
    half = bins[(0.5, 0.7)]
    assert half["rows"] == 2 and abs(half["median_error"] + 0.05) < 1e-12 and abs(half["median_abs_error"] - 0.15) < 1e-12
    assert bins[(1.0, None)]["rows"] == 1 and bins[(1.0, None)]["median_error"] == -0.05
