"""Expert parallelism trains to the single-process numbers (dropless routing: the layout changes nothing).

CPU, gloo, fp32, 5 AdamW steps. The reference runs here without torch.distributed; one set of spawned
processes per world size runs every layout in turn. Compared per step: the loss (cross-entropy plus the
load-balancing term) and the global gradient norm (rtol 1e-5), the load-balancing term itself (rtol 1e-5);
after 5 steps every parameter, experts gathered over ep/etp, from every pipeline stage (atol 1e-5).
Two models: Mixtral-shaped `tiny-moe` (4 experts, softmax, top-2, renormalised) and a DeepSeek-shaped one
(a dense first layer, a shared expert, sigmoid scores, top-1, routed scaling 2).
"""

from __future__ import annotations

import pytest
import torch

from exactness import RTOL, collected, differences, reference_runs, saved_runs, train_layouts

from shardwise.launch import spawn_ranks
from shardwise.specs import Layout, load_model, model_from_hf_config, validate_layout
from shardwise.train import TrainConfig

LR = 2e-4  # see test_runtime_exactness.py
GLOBAL_BATCH = 8

MODELS = {
    "tiny-moe": load_model("tiny-moe"),
    "shared": model_from_hf_config({
        "hidden_size": 48, "intermediate_size": 96, "moe_intermediate_size": 24, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
        "n_routed_experts": 4, "num_experts_per_tok": 1, "n_shared_experts": 1, "first_k_dense_replace": 1,
        "scoring_func": "sigmoid", "norm_topk_prob": False, "routed_scaling_factor": 2.0, "aux_loss_alpha": 0.01},
        "shared", "test"),
}

LAYOUTS = {
    2: [("tiny-moe", Layout(dp=2, ep=2, micro_batch=2)),
        ("tiny-moe", Layout(tp=2, ep=2, sequence_parallel=True, micro_batch=4)),
        ("tiny-moe", Layout(dp=2, ep=2, zero=3, micro_batch=2)),
        ("tiny-moe", Layout(dp=2, etp=2, micro_batch=4)),
        ("shared", Layout(dp=2, ep=2, zero=1, micro_batch=2)),
        ("shared", Layout(tp=2, micro_batch=8)),
        ("tiny-moe", Layout(cp=2, ep=2, micro_batch=4))],
    4: [("tiny-moe", Layout(dp=4, ep=4, micro_batch=2)),
        ("tiny-moe", Layout(dp=2, tp=2, ep=4, sequence_parallel=True, micro_batch=4)),
        ("tiny-moe", Layout(dp=2, tp=2, ep=4, sequence_parallel=True, zero=3, micro_batch=4)),
        ("tiny-moe", Layout(dp=4, ep=2, zero=1, micro_batch=2)),
        ("tiny-moe", Layout(dp=4, ep=2, zero=3, micro_batch=1)),
        ("tiny-moe", Layout(dp=2, pp=2, ep=2, micro_batch=1, schedule="1f1b")),
        ("shared", Layout(dp=2, pp=2, ep=2, zero=1, micro_batch=2, schedule="zb-h1")),
        ("shared", Layout(dp=4, ep=2, etp=2, recompute="full", micro_batch=2)),
        ("shared", Layout(cp=2, tp=2, ep=4, sequence_parallel=True, micro_batch=8))],
}


# Memory is measured (first step, every rank) where each rank runs one micro-batch: its saved bytes are then that
# micro-batch's, whose mean over the ep group is the balanced routing the planner assumes (capacity factor 1).
MEASURED = {(4, 4, 1, 0), (2, 4, 2, 0), (2, 4, 2, 3), (4, 2, 1, 1)}  # (dp, ep, tp, zero)
STATES_RTOL = 1e-3  # states are counted exactly (the router and norms replicated over tp, experts over edp);
# what is left is AdamW's per-tensor step counters


def _cfg(model: str, layout: Layout | None = None) -> TrainConfig:
    lay = layout or Layout()
    return TrainConfig(MODELS[model], lay, steps=5, global_batch=GLOBAL_BATCH, seq_len=16, seed=3,
                       lr=LR, warmup_steps=1, progress=False, measure_memory=(lay.dp, lay.ep, lay.tp, lay.zero) in MEASURED)


def _jobs(world: int) -> list[tuple[str, TrainConfig]]:
    jobs = []
    for model, layout in LAYOUTS[world]:
        validate_layout(layout, MODELS[model], GLOBAL_BATCH, world)
        jobs.append((f"{model}-{layout.describe()}-z{layout.zero}{'-sp' if layout.sequence_parallel else ''}"
                     f"-{layout.schedule}-{layout.recompute}", _cfg(model, layout)))
    return jobs


@pytest.fixture(scope="module")
def references():
    return reference_runs(MODELS, _cfg)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_layouts_match_single_process(world, references, tmp_path):
    jobs = _jobs(world)
    spawn_ranks(train_layouts, world, jobs, str(tmp_path))
    failures = []
    for key, cfg in jobs:
        records, params = collected(tmp_path, key, cfg.layout.pp)
        failures += differences(key, records, params, references[cfg.spec.name], steps=5)
        ours, ref = [r["aux_loss"] for r in records], [r["aux_loss"] for r in references[cfg.spec.name][0]]
        if not torch.allclose(torch.tensor(ours), torch.tensor(ref), rtol=RTOL, atol=0):
            failures.append(f"{key}: aux_loss {ours} vs single process {ref}")
        if cfg.measure_memory:
            failures += _memory_differences(key, cfg, saved_runs(tmp_path, key, 1)[0]["memory_all"])
    assert not failures, "\n".join(failures)


def _memory_differences(key: str, cfg: TrainConfig, measured: list[dict]) -> list[str]:
    """Saved activations (mean over the ranks: routing loads them unevenly, the ep group's rows add up to the
    balanced figure) within 1 % of the planner, model states (every rank; ZeRO-1 partitions by tensor: the
    mean) within 0.1 %."""
    from shardwise.planner.job import runtime_job
    from shardwise.planner.memory import counted_memory
    from shardwise.specs import load_cluster

    predicted = counted_memory(runtime_job(cfg.spec, load_cluster("dgx-h100-80gb"), GLOBAL_BATCH, 16, gpu=False), cfg.layout)
    found = []
    for part in ("activations", "weights", "gradients", "optimizer"):
        got = sum(m[part] for m in measured) / len(measured)
        if abs(got / predicted[part] - 1) > (0.01 if part == "activations" else STATES_RTOL):
            found.append(f"{key}: {part} measured {got:.0f} B (mean over ranks) vs planner {predicted[part]:.0f} B")
    return found


def test_reference_has_a_real_load_balancing_term(references):
    """The comparison is not vacuous: the aux term is part of the loss, of the expected size (about coef * k
    at near-uniform routing), and training moves the experts."""
    records, params = references["tiny-moe"]
    spec = MODELS["tiny-moe"]
    for r in records:
        assert 0.5 * spec.aux_loss_coef * spec.experts_per_token < r["aux_loss"] < 2 * spec.aux_loss_coef * spec.experts_per_token
    from shardwise.model import Transformer

    start = dict(Transformer(spec, seed=3).named_parameters())
    assert (params["layers.0.feed_forward.experts.w1"] - start["layers.0.feed_forward.experts.w1"]).abs().max() > 50e-5


def test_json_records_of_a_recomputed_moe_run_are_its_losses(capsys):
    """--json measures a recomputed layer's working set by running the first block once more: a MoE block counted
    that probe's load-balancing loss into step 2's record (aux +25 %, loss 90x the tolerance off; helper-212)."""
    import json

    from shardwise.cli import main

    def records(*extra):
        assert main(["train", "--model", "tiny-moe", "--steps", "3", "--global-batch", "4", "--seq-len", "16", "--seed",
                     "0", "--lr", "2e-4", *extra, "--json"]) == 0
        return [(r["loss"], r["aux_loss"]) for r in json.loads(capsys.readouterr().out)["records"]]

    plain, recomputed = records(), records("--recompute", "full")
    assert len(plain) == 3
    for (loss, aux), (loss_r, aux_r) in zip(plain, recomputed):
        assert abs(loss - loss_r) <= 1e-6 * abs(loss) and abs(aux - aux_r) <= 1e-6 * abs(aux)


def test_export_hf_of_a_moe_shape_without_a_mapping_is_one_line_and_writes_nothing(tmp_path, capsys):
    """A shared expert and a dense first layer have no Hugging Face table: export raised a KeyError traceback after
    creating the --to folder (helper-212). Now one line naming the other format, exit 2, nothing created."""
    from shardwise.cli import main

    config = _dense_then_shared_expert_config(tmp_path / "shared.json", dense_ffn=96, layers=2)
    ckpt, out = tmp_path / "ck", tmp_path / "hf"
    code = main(["train", "--model", str(config), "--steps", "1", "--global-batch", "4", "--seq-len", "16",
                 "--no-progress", "--checkpoint-dir", str(ckpt)])
    assert code == 0, capsys.readouterr().err  # the runtime trains this shape (a dense first layer, a shared expert)
    capsys.readouterr()
    assert main(["checkpoint", "export", str(ckpt), "--format", "hf", "--to", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no Hugging Face mapping" in err and "--format safetensors" in err, err
    assert not out.exists()


@pytest.mark.parametrize("zero", [1, 3])
def test_unsplit_experts_beside_tp_are_predicted_as_the_runtime_shards_them(zero, capsys):
    """ep = etp = 1 with tp 2: the runtime shards the experts with their layer's dense weights over dp, each tp rank
    holding them whole; the planner divided their states by dp x tp (measured/predicted 1.115 at ZeRO-1, 1.304 at
    ZeRO-3; helper-212)."""
    import json

    from shardwise.cli import main

    assert main(["train", "--model", "tiny-moe", "--steps", "1", "--global-batch", "4", "--seq-len", "32", "--seed", "0",
                 "--dp", "2", "--tp", "2", "--zero", str(zero), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["memory_measured_gib"] == pytest.approx(summary["memory_predicted_gib"], rel=0.01), summary


def test_zero3_split_experts_are_gathered_one_layer_at_a_time_as_predicted(capsys):
    """ZeRO-3 with ep 2 over dp 4 (edp 2): each block's experts are an FSDP2 unit of their own, prefetched implicitly
    one unit ahead, so one layer's local experts are gathered at a time, not two as the planner counted (its weights
    one layer's local experts above the runtime's: measured/predicted 0.861). The states now exact."""
    import json

    from shardwise.cli import main

    assert main(["train", "--model", "tiny-moe", "--steps", "1", "--global-batch", "4", "--seq-len", "16", "--seed", "0",
                 "--dp", "4", "--ep", "2", "--zero", "3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    measured, predicted = summary["memory_measured_breakdown_gib"], summary["memory_predicted_breakdown_gib"]
    for part in ("weights", "gradients", "optimizer"):
        assert measured[part] == pytest.approx(predicted[part], rel=STATES_RTOL), (part, summary)


def test_full_recompute_of_narrow_experts_beside_a_wide_dense_layer_is_predicted(tmp_path, capsys):
    """The layer being recomputed holds its whole set: with a dense first layer wider than the experts, the dense
    one's. The planner took the MoE layer's (measured/predicted 1.225; helper-212)."""
    import json

    from shardwise.cli import main

    config = _dense_then_shared_expert_config(tmp_path / "wide-dense.json", dense_ffn=384, layers=3)
    assert main(["train", "--model", str(config), "--steps", "1", "--global-batch", "4", "--seq-len", "32", "--seed",
                 "0", "--recompute", "full", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["memory_measured_gib"] == pytest.approx(summary["memory_predicted_gib"], rel=0.01), summary


def _dense_then_shared_expert_config(path, dense_ffn: int, layers: int):
    """A DeepSeek-keyed config: a dense first layer of `dense_ffn`, then MoE layers of 4 narrow experts (24) and a
    shared one, top-1 — a shape the runtime trains and Hugging Face's Mixtral table does not hold."""
    import json

    path.write_text(json.dumps({
        "model_type": "deepseek_v2", "hidden_size": 48, "intermediate_size": dense_ffn, "moe_intermediate_size": 24,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256,
        "max_position_embeddings": 64, "n_routed_experts": 4, "num_experts_per_tok": 1, "n_shared_experts": 1,
        "first_k_dense_replace": 1, "kv_lora_rank": None, "q_lora_rank": None}))
    return path
