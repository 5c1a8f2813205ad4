"""The planner against published runs (benchmarks/data/published_runs.csv), in each source's FLOP convention,
under the framework profile of the stack that ran each row. One constant comes from training runs (the in-situ
efficiency); its leave-one-source-out figures are checked too."""

import importlib.util
import itertools
import re
import statistics
import sys
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest

from shardwise.planner import estimate, kernels
from shardwise.planner.layer_time import attention_kernel
from shardwise.planner.memory import memory_breakdown

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "published_runs.py"


def _bench():
    spec = importlib.util.spec_from_file_location("published_runs", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


bench = _bench()


@lru_cache(maxsize=1)
def _compare():
    return bench.compare(bench.DEFAULT_CSV)


def _strong():
    rows, _ = _compare()
    return [r for r in rows if "error" in r and not r["weak"]]


def test_reads_only_the_shipped_file_and_names_every_skip():
    assert bench.DEFAULT_CSV == BENCH.parent / "data" / "published_runs.csv"
    assert "shared/reference" not in BENCH.read_text()
    rows, summary = _compare()
    assert len(rows) >= 100 and summary["rows"] >= 60
    for r in rows:
        assert "error" in r or r["skip"], r  # predicted, or skipped with the reason


def test_median_and_leave_one_source_out_within_ten_percent():
    _, s = _compare()
    assert s["median_abs_error"] <= 0.10
    assert s["leave_one_source_out"]["median_abs_error"] <= 0.10
    # the shipped constant is the one the reference set gives (nothing tuned beyond it)
    shipped, fitted = s["in_situ_efficiency"]["shipped"], s["in_situ_efficiency"]["fitted_on_all_rows"]
    for arch, value in fitted.items():  # decimal figures: 0.87 - 0.86 is 0.01, not the float's 0.010000000000000009
        assert round(abs(shipped[arch] - value), 9) <= 0.01, (arch, shipped, fitted)



def test_source_weighted_median_weighs_each_source_the_same():
    # Three sources of one row each and one of four rows: each source weighs 1, the four rows a quarter each. Sorted:
    # 1 (a), 2 (b) reach half the weight of 4, so the median lies between 2 and the next value, 3 (c): 2.5, where the
    # row-weighted median is 10, the long source's value.
    values, sources = [10, 3, 10, 1, 10, 2, 10], ["d", "c", "d", "a", "d", "b", "d"]
    assert bench.source_weighted_median(values, sources) == 2.5
    assert statistics.median(values) == 10
    # Weights 1, a third each for b's three rows, 1: half of 3 is passed at 5 (the plain median is b's 1)
    assert bench.source_weighted_median([5, 1, 1, 1, 7], ["a", "b", "b", "b", "c"]) == 5
    # one row per source: the plain median (odd and even counts)
    assert bench.source_weighted_median([4, 1, 3], ["a", "b", "c"]) == 3
    assert bench.source_weighted_median([4, 1, 3, 2], ["a", "b", "c", "d"]) == 2.5


def test_korthikanti_rows_match_and_fit():
    # The memory and time models follow this paper; its own runs must come out right. The bound is the in-situ
    # share's doing as much as the model's: fitted with every source weighing the same (0.81 on A100, 2026-12-02) the
    # 1T rows on 64 pipeline stages come out 13-14 % slow (11-12 % at the row-weighted 0.83 before).
    paper = [r for r in _strong() if r["run"].startswith("Korthikanti")]
    assert len(paper) == 9
    assert statistics.median(abs(r["error"]) for r in paper) <= 0.08
    for r in paper:
        assert abs(r["error"]) <= 0.14, r
        assert r["fits"], r


def test_selective_plus_sp_beats_full_recompute_like_the_paper():
    # Paper: +29..32 % throughput from full recompute to selective + SP on the same layout.
    rows = {r["run"]: r for r in _strong()}
    for size in ("22B", "175B (GPT-3)", "530B (MT-NLG)", "1T"):
        full = next(v for k, v in rows.items() if k.startswith(f"Korthikanti {size} full"))
        sel = next(v for k, v in rows.items() if k.startswith(f"Korthikanti {size} selective"))
        assert 1.2 < full["predicted_step_s"] / sel["predicted_step_s"] < 1.45


def test_every_published_layout_fits_but_llama3_405b_on_8192_gpus():
    # Nemotron-4's non-gated MLP without dropout and torchtitan's op-level checkpointing included. One published
    # layout is predicted not to fit, and the report says so: Llama 3 405B at tp 8 · pp 16 on 8,192 H100s without
    # activation checkpointing, as the paper says its 8K stage ran (docs/accuracy.md, "Llama 3 405B on 8,192 GPUs:
    # the published layout, as published").
    strong = _strong()
    assert [r["run"] for r in strong if not r["fits"]] == ["Llama 3 405B pre-training 8192 GPUs seq 8192"]


def test_fp8_rows_are_scored_with_their_own_in_situ_share():
    import statistics
    fp8 = [r for r in _strong() if r["arch"] == "hopper-fp8"]
    assert len(fp8) >= 30  # NeMo 24.07, its long-context table, MLPerf v3.1, Megatron-Bridge
    assert statistics.median(abs(r["error"]) for r in fp8) <= 0.10


def test_a_rows_precision_cell_outranks_its_name():
    # A paper named for FP8 prints BF16 baselines too ("FP8-LM GPT-7B ... BF16"): the cell says what ran; only a row
    # with the cell empty is read from its name.
    assert bench._precision({"run": "FP8-LM GPT-7B 32xH100 BF16", "precision": "bf16"}) == "bf16"
    assert bench._precision({"run": "GPT-7B 32xH100", "precision": "fp8"}) == "fp8"
    assert bench._precision({"run": "Llama 3 8B Float8 8xH100", "precision": ""}) == "fp8"
    assert bench._precision({"run": "Llama 3 8B 8xH100", "precision": ""}) == "bf16"


def _two_knobs(name: str, rows: list[dict]) -> bool:
    """A GPU-count or sequence-length series whose micro-batch was re-tuned along with it (MosaicML's sweeps: MPT-30B
    on 8-32 H100 at micro-batch 3 / 10 / 14; MosaicGPT on 8 A100 from 512 to 65,536 tokens at 128 down to 1)."""
    mbs = {re.search(r"mb(\d+)", r["layout"]).group(1) for r in rows if r.get("series") == name and "layout" in r}
    return name.endswith(("-gpus", "-seq")) and len(mbs) > 1


def test_ranking_within_series_that_vary_one_knob():
    # Kendall tau >= 0.8 on every series of three or more rows that varies one knob (a GPU-count or sequence-length
    # series that re-tunes the micro-batch with it varies two: _two_knobs), weak-scaling series included — unless every
    # pair ranked the other way is one its source separates by less than 1 %, a single run each (torchtitan's Llama 2
    # 13B: "selective layer" 1,914 and "selective op" 1,904 tokens/s per GPU).
    # Known misses, kept in the set and in the README rather than out of both (each must still miss: a fix removes it
    # here): Hagemann et al. 2023's micro-batch series under TP 4-8, where the published step falls with a larger
    # micro-batch by more than the planner's per-micro-batch costs, docs/accuracy.md "Aleph Alpha's layout sweep on
    # A100, 2023".
    # And dgxc-benchmarking v24.11.1's GPT-3 175B FP8 table, whose published step rises and falls with the GPU count
    # at one layout (5.92 / 5.96 / 6.44 / 6.72 / 6.24 s on 128-2,048 H100: 2,048 GPUs faster than 512 and 1,024), where
    # a larger data-parallel group of the same layout can only add time (docs/accuracy.md, "Blind rows, 2026-12-05").
    known_misses = {"hagemann-13b_32gpu-tp2pp2-mb", "hagemann-30b_256gpu-tp4pp4-mb", "hagemann-30b_64gpu-tp4pp2-sp-mb",
                    "dgxc-24.11-gpt-3-175b-dp-fp8"}
    # A source that prints its steps to two digits cannot separate runs closer than one unit of the last: dgxc-
    # benchmarking v25.02's Llama 3 8B SFT in FP8, 0.95 / 0.96 / 0.96 s on 8 / 16 / 32 H100 (1.05 % apart at most).
    print_resolution = {"dgxc-ft-llama3-8b-sft-fp8-gpus": 0.0106}
    rows, s = _compare()
    checked = 0
    for name, v in s["kendall_tau_by_series"].items():
        if name in known_misses:
            assert v["kendall_tau"] < 0.8, f"{name} now ranks right (tau {v['kendall_tau']:+.2f}): drop it from known_misses"
            continue
        if v["rows"] >= 3 and not _two_knobs(name, rows):
            checked += 1
            if v["kendall_tau"] >= 0.8:
                continue
            members = [(r["published_tokens_per_s_per_gpu"], r["predicted_tokens_per_s_per_gpu"]) for r in rows
                       if r.get("series") == name and "error" in r and not r["weak"]]
            swapped = [(a, b) for (a, p), (b, q) in itertools.combinations(members, 2) if (a - b) * (p - q) < 0]
            tie = print_resolution.get(name, 0.01)
            assert swapped and all(abs(a - b) < tie * max(a, b) for a, b in swapped), (name, v, swapped)
    assert checked >= 10


def test_moe_rows_fit_and_a_row_its_own_source_contradicts_is_named_not_scored():
    _, s = _compare()
    moe = s["moe"]
    assert moe["rows"] >= 30 and moe["not_fitting"] == []
    weak = {r["run"]: r for r in moe["runs"] if r["weak_reason"]}
    row = weak["Megatron-Bridge 25.11 Qwen3 30B-A3B 16xH100 FP8"]
    assert "10494" in row["weak_reason"] and row["weak"]
    assert "PP 1" in weak["Megatron-Bridge 25.11 GPT-OSS 120B 64xH100 BF16"]["weak_reason"]  # its columns do not multiply
    assert all(r["run"] not in weak for r in moe["runs"] if not r["weak"])


def test_torchtitan_eager_fsdp2_rows_on_a100_are_scored():
    # torchtitan's own A100 table (docs/performance.md: FSDP2 over 64 A100s, eager — "no torch.compile" in the
    # row's notes, which once read as a compiled run and skipped them): pure FSDP2 rows of 8B-70B models with
    # their activation-checkpointing variants, nothing fitted on them beyond the shared in-situ share.
    rows = [r for r in _strong() if r["run"].startswith("torchtitan") and "A100" in r["run"]]
    assert len(rows) == 8
    for r in rows:
        assert abs(r["error"]) <= 0.12, r


def test_torchtitans_500w_h100_rows_run_on_their_own_preset():
    # torchtitan's H100 tables ran on Meta's Grand Teton hosts, "96GB HBM2e with 2.4 TB/sec", "the default 500W power
    # limit" (benchmarks/llama3_h100_202412_torchtitan.md): scored on h100-96gb-500w, its tensor-core rates scaled by
    # the datasheet power curve, not skipped; its FP8 runs under torch.compile (tables 5 and 6 say "compile + Float8")
    # too, compiled, with torchao's casts as Inductor fuses them (kernels.FP8_CAST_FUSED).
    capped = [r for r in bench.read_rows(bench.DEFAULT_CSV) if bench.power_capped(r["gpu_type"])]
    runs = {r["run"]: (r, bench.parse(r)) for r in capped}
    assert len(runs) >= 25 and all(not run.skip for _, run in runs.values())
    for r, run in runs.values():
        c = run.job.cluster
        assert (c.power_limit_w, c.hbm_bandwidth) == (500, 2.4e12) and kernels.power_share(c) < 0.92
        assert run.job.precision == r["precision"]
    fp8 = [run for r, run in runs.values() if r["precision"] == "fp8"]
    assert len(fp8) >= 16 and all(run.job.compile for run in fp8)


def test_compiled_float8_runs_are_scored_with_the_casts_inductor_fuses():
    # torchtitan's and OLMo-core's FP8 runs were built with torch.compile over torchao's Float8Linear. Left out of the
    # set until the casts' fusion was derived (kernels.FP8_CAST_FUSED, from torchao's own float8 roofline), they are
    # scored now: every layout fits and the errors stay inside the bounds, and the fused casts score them
    # better than the eager passes did (most of these rows come out too slow either way).
    rows = [r for r in _strong() if r["arch"] == "hopper-fp8" and r["framework"] == "torchtitan"]
    assert len(rows) >= 25 and all(r["fits"] for r in rows)
    errors = [abs(r["error"]) for r in rows]
    assert statistics.median(errors) <= 0.10 and max(errors) <= 0.25
    fused = kernels.FP8_CAST_FUSED
    runs = [run for run in bench.load_runs(bench.DEFAULT_CSV) if run.name in {r["run"] for r in rows}]
    try:
        kernels.FP8_CAST_FUSED = (kernels.FP8_CAST_BYTES["torchao"], kernels.FP8_CAST_KERNELS["torchao"])
        _clear_planner_caches()  # the layer and stage costs cached with the fused casts
        eager = [abs(run.published_step_s / bench._predict(run).step_time - 1) for run in runs]
    finally:
        kernels.FP8_CAST_FUSED = fused
        _clear_planner_caches()
    assert len(eager) == len(rows) and statistics.median(eager) > statistics.median(errors)


def test_torchaos_float8_all_gather_gives_the_speed_ups_its_sources_measured():
    # torchao's float8 all-gather for FSDP (--fp8-params under torchtitan): the rows whose sources name it run it, and
    # the speed-ups the sources print against their own twins come out of the planner: AWS's SageMaker table (Float8
    # 8,624 -> Float8 all-gather 8,950 tokens/s per GPU, 1.038x) and OLMo-core's BF16 -> BF16/FP8 pairs (1B, 7B, 8B:
    # 1.18, 1.30, 1.32x), each within 3.5 points (the 1B pair 3.3 short, the others within 1: within 2.5 until the FP8
    # in-situ share was refitted to 0.72, 2026-12-05, once op-level checkpointing ran its recomputed matmuls in FP8).
    # Without the all-gather (the FP8 rows' jobs with it off) each comes out further short, the AWS pair predicted equal.
    runs = {run.name: run for run in bench.load_runs(bench.DEFAULT_CSV) if not run.skip}
    named = [name for name, run in runs.items() if run.job.fp8_all_gather]
    assert sum("OLMo-core" in n for n in named) == 4 and sum("Trainy" in n for n in named) == 2
    assert sum("405B" in n and "PP8" in n for n in named) == 6  # the 405B preset of torchtitan's 2024-12 tables
    assert "AWS SageMaker torchtitan Llama 3 8B FSDP + torch.compile + Float8 32xH100 (p5)" not in named

    def speed_up(slow, fast, gather=True):
        job = runs[fast].job if gather else replace(runs[fast].job, fp8_all_gather=False)
        return (bench._predict(runs[slow]).step_time / estimate(job, runs[fast].layout).step_time,
                runs[slow].published_step_s / runs[fast].published_step_s)

    aws = "AWS SageMaker torchtitan Llama 3 8B FSDP + torch.compile + Float8"
    pairs = [(f"{aws} 32xH100 (p5)", f"{aws} all-gather 32xH100 (p5)")]
    pairs += [(f"OLMo-core {m} 8?xH100 FSDP2 BF16", f"OLMo-core {m} 8?xH100 FSDP2 FP8")
              for m in ("1B (OLMo-1124)", "7B (OLMo-1124)", "8B (Llama)")]
    for slow, fast in pairs:
        (predicted, published), (without, _) = speed_up(slow, fast), speed_up(slow, fast, gather=False)
        assert abs(predicted / published - 1) <= 0.035, (fast, predicted, published)
        assert predicted > without + 0.005, (fast, predicted, without)
    assert speed_up(*pairs[0], gather=False)[0] == pytest.approx(1.0, abs=0.005)


def test_async_tp_is_read_however_the_source_spells_it():
    # torchtitan's tables write "Float8 + Async TP" and "2D + AsyncTP": both ran TP's collectives overlapped with the
    # GEMMs (torch's micro-pipelined async TP); read as plain TP, the 70B pair scored Kendall tau 0 (equal predictions).
    runs = {run.name: run for run in bench.load_runs(bench.DEFAULT_CSV) if run.name.startswith("torchtitan Llama 3.1")}
    for name in ("torchtitan Llama 3.1 405B FSDP16 TP8 128xH100 Float8 + Async TP",
                 "torchtitan Llama 3.1 70B FSDP32 TP8 2D + AsyncTP 256xH100"):
        assert runs[name].job.tp_comm_overlap, name
    assert not runs["torchtitan Llama 3.1 70B FSDP32 TP8 2D 256xH100"].job.tp_comm_overlap


def _clear_planner_caches():
    from shardwise.planner import estimate, layer_time, step_time
    for module in (layer_time, step_time, estimate):
        for cached in [f for f in vars(module).values() if hasattr(f, "cache_clear")]:
            cached.cache_clear()


def test_tinyllama_runs_lit_gpts_fused_kernels():
    # TinyLlama's README: "24k tokens per second per A100-40G GPU" for the 1.1B model (micro-batch 8 x 2,048, 16
    # GPUs, no activation checkpointing) with fused RMSNorm, rotary embedding, SwiGLU and cross-entropy. Scored as
    # torchtitan's eager kernels (an FP32 RMSNorm of 36 B per element where the fused one moves 4) the step came out
    # 16 % slow; under Lit-GPT's own profile it is within 10 % of the README's figure, and --six-profiles still names
    # torchtitan for it.
    row = next(r for r in _compare()[0] if r["run"].startswith("TinyLlama"))
    assert row["framework"] == "lit-gpt" and abs(row["error"]) <= 0.10, row
    assert bench.NEAREST_OF_SIX["lit-gpt"] == "torchtitan"


def test_flash_attn_training_rows_run_lightning_amp():
    # flash-attn's own GPT training code (the flash-attention README's training-speed rows, Lambda's FlashAttention-2
    # benchmark on its fork) trains under PyTorch Lightning's native AMP: FP32 parameters, each weight cast to the
    # 16-bit type in every forward and its gradient cast back and added into the FP32 gradient every micro-batch
    # (the flash-attn profile). Scored as megatron-core, whose 16-bit weights and fused FP32 accumulation skip those
    # HBM passes, Lambda's A100 rows came out 8-11 % fast and its H100 rows 36 %; under their own stack the A100 rows
    # and the README's are within 5 % of the published throughput, and the H100 rows, which have a further miss of their
    # own (docs/accuracy.md), within 16 %. --six-profiles still scores them as megatron-core.
    # The README's 125M-760M rows, added blind on 2026-12-05, scored +1 .. +11 % (760M: docs/accuracy.md).
    rows = [r for r in _compare()[0] if r["run"].startswith(("Lambda FA2", "flash-attention GPT3"))]
    assert len(rows) == 9
    for row in rows:
        small = any(f"GPT3-{m}M" in row["run"] for m in (125, 355, 760))
        assert row["framework"] == "flash-attn", row
        assert abs(row["error"]) <= (0.16 if "H100" in row["run"] else 0.12 if small else 0.05), row
    assert bench.NEAREST_OF_SIX["flash-attn"] == "megatron-core"


def test_pythia_rows_train_without_dropout_as_their_configs_say():
    # EleutherAI/pythia models/*/pythia-*.yml: "hidden-dropout": 0, "attention-dropout": 0 (quoted in every row's
    # notes). With p = 0 torch's dropout returns its input, so no mask is drawn and nothing crosses the s x s
    # probabilities: the rows' models train without dropout, like GPT-NeoX-20B's (configs/20B.yml).
    rows = [r for r in bench.read_rows(bench.DEFAULT_CSV) if r["run"].startswith("Pythia ")]
    assert len(rows) >= 8
    for row in rows:
        assert '"attention-dropout": 0' in row["notes"] and '"hidden-dropout": 0' in row["notes"], row["run"]
        run = bench.parse(row)
        assert not run.skip and not run.job.model.trains_with_dropout or "head sizes up to 128" in run.skip, run.name


def test_pythia_rows_run_the_flashattention_their_configs_name():
    # Pythia's configs (a19eecb) set "attention-config": [[["flash"], N]] and the paper says so (Sec. 2.4, "We use
    # Flash Attention"); GPT-NeoX of 2023-01 calls flash-attn 0.2.2, FlashAttention-1, whose kernel takes head sizes
    # up to 128. The rows are scored with it; 1B's heads of 256 it refuses, so what 1B ran is not known: not scored.
    rows = {r["run"]: r for r in bench.read_rows(bench.DEFAULT_CSV) if r["run"].startswith("Pythia ")}
    for name, row in rows.items():
        run = bench.parse(row)
        if run.skip:
            assert name.startswith("Pythia 1B") and "head sizes up to 128" in run.skip, (name, run.skip)
            continue
        assert run.job.flash_attention and attention_kernel(run.job) == "fa1", name
    assert sum(not bench.parse(r).skip for r in rows.values()) >= 7


def test_pythia_rows_run_gpt_neox_and_pay_its_copies_around_flash_attn():
    # GPT-NeoX v1.0's flash path (megatron/model/transformer.py) copies Q, K and V into flash-attn's packed layout
    # and the output back in every forward (and the gradients back in the backward): the Pythia rows run under the
    # gpt-neox profile, whose steps are longer than deepspeed's by those copies and no more (the rest of the profile
    # is deepspeed's); --six-profiles still names deepspeed for them.
    rows = [r for r in bench.read_rows(bench.DEFAULT_CSV) if r["run"].startswith("Pythia ")]
    scored = [bench.parse(r) for r in rows]
    scored = [run for run in scored if not run.skip]
    assert len(scored) >= 7 and all(run.framework == "gpt-neox" for run in scored)
    assert bench.NEAREST_OF_SIX["gpt-neox"] == "deepspeed"
    from dataclasses import replace
    from shardwise.planner.step_time import step_time
    for run in scored:
        neox = sum(step_time(run.job, run.layout).values())
        ds = sum(step_time(replace(run.job, framework="deepspeed"), run.layout).values())
        assert 1.01 < neox / ds < 1.08, (run.name, neox, ds)


def test_fms_fsdp_rows_run_fsdp1_with_bf16_reduce():
    # fms-fsdp (4ffb9bd) wraps its FP32 LLaMA in FSDP1 with bfSixteen (param, reduce and buffer dtype bfloat16): its
    # gradients cross the 400 / 800 Gb/s-per-node networks in BF16, half torchtitan's FP32 reduce. Under its own
    # profile the README's eight throughputs are within 13 % (torchtitan's FP32 reduce put the A100 70B row 15 % slow)
    # with A100's in-situ share at 0.86; refitted to 0.83 on the blind A100 rows (docs/accuracy.md, "Blind test on new
    # sources"), the A100 70B row is 15 % slow under its own profile, 18 % under torchtitan's.
    import dataclasses

    from shardwise.planner.job import make_job
    from shardwise.planner.step_time import step_time
    from shardwise.specs import Layout, load_cluster, load_model

    # bfSixteen is what Composer calls PURE mixed precision, on the same FSDP1: Llama 2 70B over two A100 nodes, ZeRO-3,
    # nothing overlapped (a calibrated backend that hides nothing), pays the same data-parallel seconds under either
    # profile, well below Composer's DEFAULT, whose FP32 reduce-scatter puts 2 + 2 + 4 bytes per parameter and
    # micro-batch on the wire where bfSixteen puts 2 + 2 + 2 (and FSDP1 casts and divides FP32 gradients around it).
    a100 = dataclasses.replace(load_cluster("dgx-a100-80gb"), measured={"world_size": 0, "comm_overlap": 0.0})
    lay = Layout(dp=16, zero=3, micro_batch=1)
    dp = {fw: step_time(make_job(load_model("llama2-70b"), a100, 16, 4096, fw), lay)["dp_comm"]
          for fw in ("fms-fsdp", "composer-pure", "composer")}
    assert dp["fms-fsdp"] == dp["composer-pure"] and dp["fms-fsdp"] < 0.8 * dp["composer"], dp
    rows = [r for r in _strong() if r["run"].startswith("fms-fsdp")]
    assert len(rows) == 8 and all(r["framework"] == "fms-fsdp" for r in rows)
    # 0.16 at A100 0.83; the A100 70B row -17 % at 0.81, the share fitted with every source weighing the same
    assert max(abs(r["error"]) for r in rows) <= 0.18, rows
    assert bench.NEAREST_OF_SIX["fms-fsdp"] == "torchtitan"


def test_a_row_its_own_sweep_contradicts_is_kept_out_of_the_summary():
    # llm-foundry's A100-40GB table: MPT-1B at micro-batch 10 on 32, 64 and 128 GPUs came from one sweep command;
    # 64 and 128 GPUs sit at 55.4 / 54.4 % MFU, 32 GPUs at 45.4 %, with the same work and FSDP traffic per GPU.
    rows = {r.name: r for r in bench.load_runs(bench.DEFAULT_CSV)}
    assert rows["MosaicML MPT-1b FSDP 32xA100"].weak and "one command" in rows["MosaicML MPT-1b FSDP 32xA100"].weak_reason
    assert not rows["MosaicML MPT-1b FSDP 64xA100"].weak and not rows["MosaicML MPT-1b FSDP 128xA100"].weak


def test_attention_dominated_long_context_rows():
    # NeMo's long-context Llama 2 7B table (4K-1M tokens, context parallelism up to 32): from 32K tokens the
    # attention core is half the step or more, so these rows check the attention model (Transformer Engine's cuDNN
    # kernel at its measured rates) rather than the GEMMs. They came out 22-37 % too fast with FlashAttention-3's
    # best figure standing in for TE's kernel.
    rows = [r for r in _strong() if r["run"].startswith("NeMo long-context")]
    assert len(rows) == 9
    # 0.10 at the row-weighted FP8 share 0.69; 0.12 at 0.70 with sources weighed the same (2026-12-02); 0.15 at 0.72,
    # refitted once the interleaved pipelines' fill and drain transfers were charged whole (the share had been
    # absorbing them); 0.16 at 0.73, refitted once torchtitan's compiled Float8 runs were scored (2026-12-04): losses
    # on these rows, not gains (docs/accuracy.md)
    for r in rows:
        assert abs(r["error"]) <= 0.16, r
    assert max(r["error"] for r in rows) - min(r["error"] for r in rows) <= 0.15  # no trend left with length


def test_a_run_that_says_tp_comm_overlap_off_is_scored_without_it():
    # NeMo's profile overlaps TP communication by default; the Grok-1 proxies' yaml of dgxc 25.02 sets
    # ub_tp_comm_overlap: false. Release 25.05's script turns it on (MegatronCommOverlapCallback tp_comm_overlap=True).
    runs = [r for r in bench.load_runs(bench.DEFAULT_CSV) if r.name.startswith("Grok-1") and r.job is not None]
    off = [r for r in runs if r.name.startswith("Grok-1 314B MoE (NeMo) ")]
    on = [r for r in runs if "dgxc 25.05" in r.name]
    assert len(off) == 9 and all(r.framework == "nemo" and not r.job.tp_comm_overlap for r in off)
    assert len(on) == 2 and all(r.job.tp_comm_overlap for r in on)


def test_mosaicml_large_scale_h100_table_is_scored_as_held_out_rows():
    # llm-foundry's "H100 80GB BF16 (Large Scale, >= 128 GPUs)" table (MPT 1B-70B on 128/256/512 H100, one micro-batch
    # per step), added as held-out rows and scored before any planner change: every row modelled and fitting; the
    # activation-checkpointed 13B-70B runs within 6 % (within 6.5 % since the H100 share was refitted 0.79 -> 0.78,
    # 2026-12-06: the worst -4.9 -> -6.2 %); the GPU-count series ordered as published (the slowest GPU of more GPUs
    # is slower).
    rows = [r for r in _strong() if "(large-scale table)" in r["run"]]
    assert len(rows) == 18 and all(r["fits"] for r in rows)
    for r in rows:
        if any(f"MPT-{m} " in r["run"] for m in ("13b", "30b", "70b")):
            assert abs(r["error"]) <= 0.065, r
    _, s = _compare()
    series = {k: v for k, v in s["kendall_tau_by_series"].items() if k.startswith("mosaicml-h100-large")}
    assert len(series) == 6 and all(v["kendall_tau"] >= 0.8 for v in series.values()), series


def test_moe_median_and_leave_one_source_out_within_ten_percent():
    # Issue 13's goal on the published MoE runs. Two constants come from them, a MoE layer's fixed cost per micro-batch
    # and the host time below which its pass does not go (moe.MOE_LAYER_OVERHEAD_S, MOE_LAYER_HOST_S): the shipped
    # values are the ones the runs give, and every source scored with them refitted without that source keeps the
    # median within the goal too.
    _, s = _compare()
    moe = s["moe"]
    assert moe["median_abs_error"] <= 0.10
    assert moe["leave_one_source_out"]["median_abs_error"] <= 0.10
    shipped, fitted = moe["moe_constants_s"]["shipped"], moe["moe_constants_s"]["fitted_on_all_rows"]
    assert round(abs(shipped["MOE_LAYER_OVERHEAD_S"] - fitted["MOE_LAYER_OVERHEAD_S"]), 9) <= 0.2e-3, (shipped, fitted)
    assert abs(shipped["MOE_LAYER_HOST_S"] - fitted["MOE_LAYER_HOST_S"]) <= 0.5e-3, (shipped, fitted)
    hosts = [v["moe_constants_fitted_without_s"]["MOE_LAYER_HOST_S"] for v in moe["by_source"].values()]
    assert len(hosts) >= 4 and max(hosts) - min(hosts) <= 1e-3, hosts  # no one source sets the host floor


def test_moe_layer_fixed_costs_cover_what_cuda_graphs_save():
    # An independent figure, from no scored row: the Megatron-MoE ModelZoo's tuned Qwen3-235B H100 command
    # (best_practice/qwen3/run_h100_235b.sh: TP 2, PP 8, VPP 4, EP 32, GBS 2048, EP overlap, forced balance) runs at
    # 320 TFLOP/s once the router and the dispatcher's preprocessing are captured in CUDA graphs
    # (--cuda-graph-scope moe_router moe_preprocess); its table's run of that layout without them at 276 (17.6 s).
    # Same FLOPs per step: the graphs take 17.6 - 17.6 x 276 / 320 = 2.4 s off a step. What the two constants add to
    # that layout's predicted step must cover it (graphs remove part of what they stand for: the router's and
    # preprocessing's launches and the host synchronisation, not the attention's or the experts' host work) and not
    # exceed it by much. The three published figures are given to three digits (the saving: 2.37-2.47 s); since the
    # H100 share was refitted to 0.78 (2026-12-06) the constants cover 2.36 s of it, 98 %.
    run = next(r for r in bench.load_runs(bench.DEFAULT_CSV)
               if r.job is not None and "TP2 PP8 EP32" in r.name and "overlapped with 1F1B" in r.name)
    fixed = bench._predict(run).step_time - bench._predict(run, moe=(0.0, 0.0)).step_time
    saved = 17.6 - 17.6 * 276 / 320
    assert 0.97 * saved <= fixed <= 2 * saved, (fixed, saved)


def test_mlperf_v40_rows_with_fp8_parameters():
    # NVIDIA's MLPerf Training v4.0 GPT-3 175B runs (held-out rows, scored at -8 % before FP8 parameters were modelled)
    # set FP8_PARAMS=True: the distributed optimizer gathers FP8 weights, half the bytes of BF16 ones.
    rows = {r["run"]: r for r in _strong() if r["run"].startswith("MLPerf v4.0 NVIDIA")}
    assert len(rows) == 3
    for gpus in (10752, 11616):
        assert abs(rows[f"MLPerf v4.0 NVIDIA GPT-3 175B {gpus}xH100 (Eos)"]["error"]) <= 0.05


def test_llama3_rows_with_unreported_interleaving_depth_take_estimates_rule():
    # Table 4 of "The Llama 3 Herd of Models" gives tp·cp·pp·dp but not the virtual stages per rank: the rows are
    # completed as `shardwise estimate` completes an unnamed --vpp (two chunks per rank up to one slot per chunk, the
    # embedding and the loss taking one each on this stack, with the unreported recompute and sequence parallelism,
    # the fastest that fits), under the profile of the stack
    # the paper describes, and the 128K row with the all-gather context parallelism its Sec. 3.3.2 names.
    runs = {r.name: r for r in bench.load_runs(bench.DEFAULT_CSV) if r.name.startswith("Llama 3 405B pre-training")}
    assert len(runs) == 3 and all(r.framework == "llama3" and not r.skip for r in runs.values())
    # The fastest depth that fits is the one the paper's words imply: "the first model chunk on the first stage has
    # only the embedding, and the last model chunk on the last stage has only output projection and loss
    # calculation", after "we reduce one Transformer layer each from the first and the last stages": one layer a
    # chunk, (126 + 2) / 16 = 8 chunks per rank.
    for gpus_seq in ("16384 GPUs seq 8192", "16384 GPUs seq 131072"):
        r = runs[f"Llama 3 405B pre-training {gpus_seq}"]
        assert r.layout.schedule == "interleaved-1f1b" and r.layout.vpp == 8, r.layout
    assert runs["Llama 3 405B pre-training 16384 GPUs seq 131072"].layout.cp_mode == "allgather"
    # 8,192 GPUs, 32 micro-batches, no recompute as the paper says: no depth fits, so the rule takes the one closest to
    # fitting. At v 8 rank 1 holds 2·14 + 7·16 + 1 = 141 one-layer chunk-micro-batches (Megatron's and torch's
    # warm-up, one forward more) beside all eight chunks' FP32 gradients (each chunk's backward has begun by the end
    # of the steady state): 4 B x its 8 layers' parameters on one GPU, (16384·(16384 + 2·1024) + 16384² + 3·16384·53248)/8.
    r8 = runs["Llama 3 405B pre-training 8192 GPUs seq 8192"]
    assert r8.layout.recompute == "none" and r8.layout.schedule == "interleaved-1f1b"
    rank, mem = memory_breakdown(r8.job, r8.layout.with_(vpp=8))
    per_layer = (12.25 * 16384 + 6 * 53248) * 8192 / 8
    layer_params = (16384 * (16384 + 2 * 1024) + 16384**2 + 3 * 16384 * 53248) / 8
    assert rank == 1 and abs(mem["activations"] - 141 * per_layer) < 0.5 * 2**30
    assert abs(mem["gradients"] / (4 * 8 * layer_params) - 1) < 1e-3
    assert sum(mem.values()) > r8.job.cluster.gpu_memory_bytes
    # 16,384 GPUs at 8K tokens: 2048 sequences over dp 128 = 16 micro-batches = pp. Megatron's interleaved warm-up,
    # 2(p - r - 1) + (v - 1)·p forwards (schedules.py get_pp_rank_microbatches), is at least v·m there, so every
    # micro-batch is in flight at once: 16 micro-batches x 8 layers (126 layers over 16 ranks, the first and last
    # hold 7) on the worst rank. Per layer and micro-batch, with SP over tp 8, in BF16: the two norms' inputs, the
    # QKV and FC1 inputs, Q, the attention output (h each), K and V (2 x 8/128 h, GQA) and SwiGLU's gate, up and
    # product (f each): (12.25·16384 + 6·53248) B x 8192 tokens / 8 = 0.4961 GiB. 128 x 0.4961 = 63.5 GiB.
    # The paper: "we could pre-train Llama 3 on sequences of 8K tokens without activation checkpointing".
    row = runs["Llama 3 405B pre-training 16384 GPUs seq 8192"]
    _, mem = memory_breakdown(row.job, row.layout)
    assert row.layout.recompute == "none"
    assert abs(mem["activations"] / 2**30 - 128 * (12.25 * 16384 + 6 * 53248) * 8192 / 8 / 2**30) < 0.5


def test_the_network_a_row_states_is_read_per_node_or_per_gpu():
    # Line rates as the rows state them, split over a node's 8 GPUs (Gb/s / 8 = GB/s): DGX H100's eight 400 Gb/s
    # NICs are 50 GB/s per GPU, like Llama 3's "400 Gb/s per GPU"; MosaicML's "RoCE 1600 Gbps node-node" 25 (DGX
    # A100's 8 x 200); IBM's "800 Gb/s per node" for fms-fsdp's H100s 12.5; a row that names none keeps the preset.
    read = bench.stated_network
    assert read("H100-SXM-80GB (DGX H100; 8x400 Gb/s IB per node)", 8) == 50e9
    assert read("H100-SXM5-80GB (Eos; 8x ConnectX-7 NDR 400 Gb/s IB per node, NVLink Gen4 900 GB/s)", 8) == 50e9
    assert read("H100-SXM-80GB (700 W, Meta Grand Teton; RoCE 400 Gb/s per GPU, 3-layer Clos)", 8) == 50e9
    assert read("A100-SXM4-80GB (RoCE 1600 Gbps node-node)", 8) == 25e9
    assert read("H100-80GB (800 Gb/s per node: README 'H100 96 GPUs with 800 Gbps')", 8) == 12.5e9
    assert read("A100-SXM4-80GB (64 GPUs; network NR)", 8) is None


def test_measured_fabric_what_if_scales_the_stated_network_and_leaves_the_shipped_figure(monkeypatch):
    # --measured-fabric (a what-if for docs/accuracy.md) takes a row's stated line rate to the measured share and adds
    # the measured time per network crossing; without it the row keeps its datasheet network.
    from shardwise.planner.explain import MEASURED_FABRIC
    gpu = "H100-SXM-80GB (DGX H100; 8x400 Gb/s IB per node)"
    plain = bench._cluster(gpu)
    assert plain.inter_node_bandwidth == 50e9 and plain.net_step_extra == 0
    monkeypatch.setattr(bench, "MEASURED_FABRIC", MEASURED_FABRIC)
    measured = bench._cluster(gpu)
    assert measured.inter_node_bandwidth == pytest.approx(50e9 * MEASURED_FABRIC["line_rate_share"])
    assert measured.net_step_extra == MEASURED_FABRIC["net_step_extra_s"] > 0
    assert measured.intra_node_bandwidth == plain.intra_node_bandwidth


def test_an_mlp_cells_parenthesis_is_a_note():
    # GPT-OSS's rows write 'swiglu (clamped)': its config.json has a SwiGLU MLP (clamped, swiglu_limit 7.0), rotary
    # positions and untied embeddings (tie_word_embeddings false), so each row is a Llama-style block with three MLP
    # matrices, untied; read as an unknown MLP name it fell back to GPT-2 blocks (two matrices, tied, learned
    # positions, biases).
    import csv

    with open(bench.DEFAULT_CSV, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("mlp", "").startswith("swiglu (")]
    assert rows
    for row in rows:
        model = bench._model(row)
        assert (model.family, model.gated_mlp, model.tie_embeddings) == ("llama", True, False), row["run"]


def test_composer_trains_fp8_as_llm_foundrys_fp8_table_ran():
    # llm-foundry's "H100 80GB FP8" table (b2a43a147): Composer's amp_fp8 (Transformer Engine fp8_autocast, MPT's
    # linears as te.Linear); the composer profile runs them in FP8 rather than refusing a run that was published.
    fp8 = [r for r in _strong() if r["run"].startswith("MosaicML MPT") and r["run"].endswith(" FP8")]
    assert len(fp8) == 7
    assert all(r["framework"] == "composer" and r["arch"] == "hopper-fp8" and r["fits"] for r in fp8)


def test_six_profiles_score_every_row_under_one_of_the_six_and_keep_the_rest_of_the_row():
    """--six-profiles: each row under the nearest of the six profiles most users name; every profile the rows use
    has a nearest among the six (a new profile must say which), and the row's stated degrees, step and model stay
    (cells a source leaves unstated, such as the interleaving or the recompute, are completed per profile)."""
    from shardwise.planner.frameworks import FRAMEWORKS

    assert set(bench.SIX_PROFILES) <= set(FRAMEWORKS) and set(bench.NEAREST_OF_SIX.values()) <= set(bench.SIX_PROFILES)
    own = [r for r in bench.load_runs(bench.DEFAULT_CSV) if not r.skip]
    six = [r for r in bench.load_runs(bench.DEFAULT_CSV, six_profiles=True) if not r.skip]
    assert [r.name for r in own] == [r.name for r in six]
    for a, b in zip(own, six):
        assert a.job.framework in bench.SIX_PROFILES or a.job.framework in bench.NEAREST_OF_SIX, a.name
        assert b.job.framework == bench.NEAREST_OF_SIX.get(a.job.framework, a.job.framework), a.name
        degrees = lambda r: (r.layout.dp, r.layout.tp, r.layout.pp, r.layout.cp, r.layout.ep)  # noqa: E731
        assert (degrees(b), b.published_step_s, b.job.model) == (degrees(a), a.published_step_s, a.job.model), a.name
    # MosaicML's Composer rows and Meta's Llama 3 rows are scored as torchtitan, BLOOM's bf16 row as deepspeed
    moved = {a.job.framework: b.job.framework for a, b in zip(own, six) if a.job.framework != b.job.framework}
    assert moved.get("composer-pure") == "torchtitan" and moved.get("llama3") == "torchtitan"
    assert moved.get("deepspeed-bf16") == "deepspeed"


def test_zero_bubble_rows_interleaving_ahead_of_1f1b_on_megatrons_cut():
    # Qi et al. 2023 Table 4 (1.5B, 8 A100, 24 / 32 / 64 microbatches): interleaved 1F1B 13.1 / 13.4 / 13.9 samples
    # per GPU per second against 1F1B's 11.8 / 12.5 / 13.6. Megatron-LM's cut (2, 3 x 6, 2 layers: Sec. 5.1) leaves the
    # last stage 2 layers and the LM head, the slowest; the interleaved run's one-layer chunks end in a loss-only one.
    rows = {r["run"]: r for r in _strong()}
    for m in (24, 32, 64):
        plain, inter = rows[f"Zero Bubble PP 1.5B 1F1B 8xA100 m={m}"], rows[f"Zero Bubble PP 1.5B 1F1B-I 8xA100 m={m}"]
        assert inter["predicted_step_s"] < plain["predicted_step_s"], (plain, inter)
        # the cost-balanced cut had them 21-23 % too fast; on Megatron's cut, with the paper's script's materialised
        # softmax (test below), they come out 14-16 % slow: the six-sequence micro-batches of this small model run
        # faster than the planner's kernels say (docs/accuracy.md)
        assert -0.20 <= plain["error"] <= 0.10, plain


def test_zero_bubble_rows_run_as_the_papers_script_did():
    # Qi et al. 2023 ran the code of sail-sg/zero-bubble-pipeline-parallelism's arxiv branch (f68d3879, 'for arxiv
    # paper'), whose examples/pretrain_zero_bubble.sh passes neither --use-flash-attn (Megatron-LM's default then: the
    # attention materialises the softmax) nor --untie-embeddings-and-output-weights; both entered the script in August
    # 2024, after the paper. Scored with FlashAttention and untied embeddings, the interleaved 14.6B rows were +25 %.
    qi = [r for r in bench.read_rows(bench.DEFAULT_CSV) if r["source"].startswith("Qi et al. 2023")]
    assert len(qi) == 24
    for row in qi:
        run = bench.parse(row)
        assert run.job.flash_attention is False and run.job.model.tie_embeddings, run.name
    scored = [r for r in _strong() if r["source"] == "Qi et al. 2023"]
    assert len(scored) == 24 and max(abs(r["error"]) for r in scored) <= 0.20


def test_a_csv_whose_scored_rows_are_all_weak_prints_its_rows_and_no_summary_figures(tmp_path, capsys):
    # A scratch CSV of new rows (the blind test's first look) can hold only rows kept out of the summary; the script
    # still prints each row, with the reason its notes give, and says the summary has no rows instead of failing on
    # the missing median.
    import csv

    with open(bench.DEFAULT_CSV, newline="") as f:
        reader = csv.DictReader(f)
        row = next(r for r in reader if r["run"] == "MosaicML MPT-1b FSDP 32xA100")
    path = tmp_path / "weak_only.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=reader.fieldnames)
        writer.writeheader()
        writer.writerow(row)
    assert bench.main(["--csv", str(path)]) == 0
    out = capsys.readouterr().out
    assert "MosaicML MPT-1b FSDP 32xA100" in out and "one command" in out
    assert "0 rows (0 skipped): no row in the summary" in out


def test_internevo_zero1_over_every_rank_pays_its_owners_broadcasts():
    # InternEvo's train_performance.md, 1,024 A100, InternLM-7B, TP 1: 2,271 tokens/s per GPU with the optimizer
    # sharded over every data-parallel rank (zero1=-1) against 3,625 within each node (zero1=8), 1.60x; on one node
    # (8 GPUs) 4,062 against 4,078. Its HybridZeroOptimizer all-reduces the gradients over all of dp either way; the
    # zero1 group only sets who updates which whole parameters and how far each owner broadcasts them after the step.
    rows = {r["run"]: r for r in _strong()}
    whole, grouped = rows["InternEvo 7B tp1 zero1=-1 1024xA100"], rows["InternEvo 7B tp1 zero1=8 1024xA100"]
    assert whole["framework"] == grouped["framework"] == "internevo"
    assert whole["predicted_step_s"] > 1.2 * grouped["predicted_step_s"], (whole, grouped)
    # 291 whole-tensor owners, each broadcasting over 1,024 ranks, one NCCL ring broadcast after the other: NCCL's
    # tuner charges each a network hop per rank (comm.broadcast_hops), ~4 ms apiece, beyond its bytes (the published
    # ratio is 1.60).
    assert whole["predicted_step_s"] > 1.3 * grouped["predicted_step_s"], (whole, grouped)
    one_whole, one_grouped = rows["InternEvo 7B tp1 zero1=-1 8xA100"], rows["InternEvo 7B tp1 zero1=8 8xA100"]
    assert abs(one_whole["predicted_step_s"] / one_grouped["predicted_step_s"] - 1) < 0.02
    assert bench.NEAREST_OF_SIX["internevo"] == "megatron-core"


def test_torchtitan_peak_memory_against_its_own_tables():
    # torchtitan's 2024-12 benchmark (benchmarks/llama3_h100_202412_torchtitan.md) prints each run's peak memory per GPU
    # (its memory monitor's peak, expandable segments on): Llama 3.1 8B, FSDP, local batch 2 x 8,192 tokens, op-level
    # selective checkpointing, on 8 and 128 H100s, eager and under torch.compile (its blocks; the loss stayed eager in
    # that release). The planner's memory for those layouts: its eager SwiGLU, eager RMSNorm and eager cross-entropy's
    # FP32 buffers counted, within 12 % of each (it was 19-26 % low with Megatron's counts; 2-9 % low before the last
    # rank's recomputed layer and its logits were counted as one peak, not two: 5-12 % low since, the published figure
    # being the caching allocator's reserved peak).
    notes = {r["run"]: r["notes"] for r in bench.read_rows(bench.DEFAULT_CSV)}
    runs = [r for r in bench.load_runs(bench.DEFAULT_CSV) if not r.skip and r.framework == "torchtitan"
            and "peak memory" in notes[r.name] and "Float8" not in r.name and "llama3_h100_202412" in r.source]
    assert sorted(r.name for r in runs) == sorted(f"torchtitan Llama 3.1 8B FSDP {c}{g}xH100"
                                                  for c in ("", "+ torch.compile ") for g in (8, 128))
    for run in runs:
        published = float(re.search(r"peak memory (\d+(?:\.\d+)?) GiB", notes[run.name]).group(1))
        predicted = sum(memory_breakdown(run.job, run.layout)[1].values()) / 2**30
        assert abs(predicted / published - 1) <= 0.12, (run.name, predicted, published)
    # torchao's float8 table (torchtitan 0.0.2, batch 1, op-level checkpointing): its "GB" are torchtitan's logged GiB
    ao = [r for r in bench.load_runs(bench.DEFAULT_CSV) if not r.skip and r.name.startswith("torchao float8 README")]
    assert len(ao) == 2
    for run in ao:
        published = float(re.search(r"peak memory (\d+(?:\.\d+)?) GB", notes[run.name]).group(1))
        predicted = sum(memory_breakdown(run.job, run.layout)[1].values()) / 2**30
        assert abs(predicted / published - 1) <= 0.10, (run.name, predicted, published)


def test_the_shipped_published_check_is_what_the_script_computes_now():
    # planner/published_check.json (what explain and estimate --json report of each stack's record) is written by
    # `published_runs.py --write-check`; a change to the planner or the set that moves any figure must rewrite it.
    import json

    from shardwise.planner import published_check

    rows, summary = _compare()
    assert json.loads(published_check.PATH.read_text()) == bench.check_table(rows, summary["moe"]["runs"])


def test_estimate_and_explain_report_the_stacks_record_on_its_gpu():
    from shardwise.planner.estimate import checked_record
    from shardwise.planner.explain import framework_paragraph
    from shardwise.planner.job import make_job
    from shardwise.specs import load_cluster, load_model

    strong = [r for r in _strong() if r["framework"] == "nemo" and r["arch"] == "hopper" and not r["stand_in"]]
    job = make_job(load_model("llama3-70b"), load_cluster("dgx-h100-80gb"), 512, 8192, "nemo")
    record = checked_record(job)
    assert record["rows"] == len(strong) > 10
    assert record["median_abs_error"] == pytest.approx(statistics.median(abs(r["error"]) for r in strong), abs=1e-4)
    assert f"Checked on {len(strong)} published nemo runs on H100/H200 (BF16)" in framework_paragraph(job, 512)
    # a stack with no published run on this GPU says so
    lone = make_job(load_model("llama3-70b"), load_cluster("dgx-h100-80gb"), 512, 8192, "deepspeed")
    assert checked_record(lone) is None and "No published deepspeed run on H100" in framework_paragraph(lone, 512)
    # another Hopper GPU (an H100 PCIe: 756 TFLOP/s) is not the SXM part those runs were on: no record, no sentence
    pcie = replace(job, cluster=replace(job.cluster, peak_flops=756e12))
    assert checked_record(pcie) is None and "published nemo run" not in framework_paragraph(pcie, 512)
    assert "No published run on this GPU is in shardwise's reference set" in framework_paragraph(pcie, 512)
    # runs of a stack without a profile, scored under a stand-in (BloombergGPT's SageMaker FSDP as torchtitan), are
    # not the stand-in's record
    titan = make_job(load_model("llama3-8b"), load_cluster("dgx-a100-80gb"), 512, 8192, "torchtitan")
    own = [r for r in _strong() if r["framework"] == "torchtitan" and r["arch"] == "ampere"]
    assert any(r["stand_in"] for r in own) and checked_record(titan)["rows"] == sum(not r["stand_in"] for r in own)
    # a mixture of experts: the stack's MoE runs on that GPU, scored apart
    _, summary = _compare()
    moe_rows = [r for r in summary["moe"]["runs"] if r["framework"] == "megatron-core" and r["arch"] == "hopper"
                and not r["weak"] and not r["stand_in"]]
    moe = make_job(load_model("mixtral-8x7b"), load_cluster("dgx-h100-80gb"), 512, 4096, "megatron-core")
    assert checked_record(moe)["rows"] == len(moe_rows) > 5
    assert f"Checked on {len(moe_rows)} published megatron-core mixture-of-experts runs" in framework_paragraph(moe, 512)


def test_a_file_whose_moe_rows_come_from_one_source_is_scored_without_a_leave_one_out_pair(tmp_path):
    # `published_runs.py --csv NEW.csv` on new rows of one source: nothing is left to fit the MoE constants on
    # without it, which used to crash (statistics.median of nothing).
    lines = bench.DEFAULT_CSV.read_text().splitlines(keepends=True)
    grok = [line for line in lines if line.startswith('"Grok-1 314B MoE (NeMo 25.04, dgxc 25.05)')]
    assert len(grok) == 2
    path = tmp_path / "one_source.csv"
    path.write_text(lines[0] + "".join(grok))
    _, summary = bench.compare(path, workers=1)
    moe = summary["moe"]
    assert moe["rows"] == 2 and moe["leave_one_source_out"]["median_abs_error"] is None
    (source,) = moe["by_source"].values()
    assert source["rows"] == 2 and "moe_constants_fitted_without_s" not in source
