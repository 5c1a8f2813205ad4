"""The MoE contract from outside: `train/estimate/plan` with --ep/--etp and Mixtral-key config files;
bad expert layouts are one line and exit 2, before any process group."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from shardwise.cli import main
from shardwise.specs import load_model

ENV_THREADS = {"OMP_NUM_THREADS": "1"}


def _mixtral_config(tmp_path, **changes):
    cfg = load_model("tiny-moe").to_hf_config() | changes
    cfg.pop("mlp_only_layers"), cfg.pop("decoder_sparse_step"), cfg.pop("scoring_func"), cfg.pop("routed_scaling_factor")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.mark.parametrize("argv, expected", [
    (["--model", "tiny-moe", "--dp", "4", "--ep", "3"], "ep=3 does not divide the 4 experts of tiny-moe"),
    (["--model", "tiny-moe", "--dp", "2", "--ep", "4"], "ep*etp = 4*1 = 4 does not divide dp*tp*cp = 2"),
    (["--model", "tiny-moe", "--dp", "2", "--ep", "2", "--etp", "2"], "ep*etp = 2*2 = 4 does not divide dp*tp*cp = 2"),
    (["--model", "tiny", "--dp", "2", "--ep", "2"], "tiny has no experts"),
    (["--model", "tiny-moe", "--ep", "0"], "--ep must be at least 1"),
    (["--model", "deepseek-v3", "--seq-len", "64"], "uses multi-head latent attention (MLA), yarn RoPE scaling and group-limited routing (n_group/topk_group), which shardwise's runtime does not implement"),
    (["--model", "tiny-moe", "--tp", "2", "--seq-len", "63"], "--seq-len 63 is not divisible by tp=2"),
])
def test_bad_expert_layouts_are_one_line_and_exit_2(argv, expected, capsys):
    assert main(["train", *argv, "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shardwise: error: ") and expected in err and "\n" not in err
    assert not dist.is_initialized()


def test_top_k_above_the_experts_in_a_config_file(tmp_path, capsys):
    path = _mixtral_config(tmp_path, num_experts_per_tok=6)
    for argv in (["train", "--model", path], ["estimate", "--model", path, "--cluster", "dgx-h100-80gb", "--gpus", "8",
                                               "--global-batch", "8", "--seq-len", "64", "--micro-batch", "1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "num_experts_per_tok 6 exceeds the 4 experts" in err and "\n" not in err


@pytest.mark.slow
def test_train_with_ep_from_a_mixtral_config_file(tmp_path):
    """`train --model path/config.json --dp 2 --ep 2 --checkpoint-dir`: two processes, experts split; metrics carry
    the aux loss and the layout its ep; the losses equal a one-process run of the same config (trained here), and
    `checkpoint export --format hf` of the ep run writes the Mixtral folder that one-process run exports."""
    from safetensors.torch import load_file

    from shardwise.specs import Layout
    from shardwise.train import TrainConfig, train

    path = _mixtral_config(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "shardwise", "train", "--model", path, "--steps", "3", "--global-batch",
                           "4", "--seq-len", "32", "--seed", "1", "--json", "--dp", "2", "--ep", "2",
                           "--metrics-file", str(tmp_path / "ep.jsonl"), "--checkpoint-dir", str(tmp_path / "ep")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **ENV_THREADS})
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    assert run["summary"]["layout"]["ep"] == 2
    ref = train(TrainConfig(load_model(path), Layout(micro_batch=4), steps=3, global_batch=4, seq_len=32, seed=1,
                            progress=False, checkpoint_dir=str(tmp_path / "one"))).records
    for ours, one in zip(run["records"], ref, strict=True):
        assert ours["aux_loss"] > 0 and ours["loss"] == pytest.approx(one["loss"], rel=1e-5)
        assert ours["aux_loss"] == pytest.approx(one["aux_loss"], rel=1e-5)
    lines = (tmp_path / "ep.jsonl").read_text().splitlines()
    assert len(lines) == 3 and "aux_loss" in json.loads(lines[0])
    for run_dir in ("ep", "one"):
        assert main(["checkpoint", "export", str(tmp_path / run_dir), "--format", "hf", "--to", str(tmp_path / f"{run_dir}-hf")]) == 0
    exported = [load_file(tmp_path / f"{d}-hf" / "model-00001-of-00001.safetensors") for d in ("ep", "one")]
    assert exported[0].keys() == exported[1].keys() and "model.layers.0.block_sparse_moe.experts.3.w2.weight" in exported[0]
    for name, t in exported[1].items():
        assert (exported[0][name] - t).abs().max() <= 1e-5, name


@pytest.mark.parametrize("changes", [{"num_local_experts": None}, {"num_local_experts": 0}])
def test_a_mixtral_config_without_an_expert_count_is_refused_not_planned_dense(tmp_path, capsys, changes):
    """transformers would fill in MixtralConfig's default; planning it as a dense model would count a sixth of its
    parameters. One line naming the key."""
    path = _mixtral_config(tmp_path, **changes)
    cfg = json.loads(open(path).read())
    cfg = {k: v for k, v in cfg.items() if v is not None}
    open(path, "w").write(json.dumps(cfg))
    assert main(["estimate", "--model", path, "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8",
                 "--seq-len", "64", "--micro-batch", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "mixture of experts" in err and "'num_local_experts'" in err and "\n" not in err
