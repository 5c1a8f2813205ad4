"""`plan --emit`: each file parses with its target's own parser and reads back to the planned layout.

The round trip of every test: the planner's layout -> the emitted file -> the target's parser ->
dp·tp·pp·vpp·micro-batch·ZeRO·recompute (and the stage split, the schedule, sequence parallelism),
read back with the target's semantics (written here from the targets' sources, not from the emitters):
  * Megatron-LM: the emitted bash script runs with a stand-in `torchrun` that records its argv; the
    arguments are parsed by Megatron-LM's option table (tests/data/megatron_lm_arguments.json, extracted
    from its argument parser — Megatron-LM is not on PyPI) and handed to megatron-core's own config
    classes (TransformerConfig, ModelParallelConfig, DistributedDataParallelConfig,
    PipelineParallelLayerLayout), which check them as Megatron does.
  * torchtitan: its ConfigManager reads the TOML (it rejects unknown keys); the stage split is
    torchtitan's own generate_llm_fqn_per_model_part.
  * DeepSpeed: DeepSpeedConfig reads the JSON and asserts train_batch_size = micro-batch x accumulation x
    data-parallel size for the planned data-parallel size.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import stat
import subprocess
import sys
import warnings
from dataclasses import fields, replace
from pathlib import Path

import pytest

from shardwise.cli import main
from shardwise.emit import FRAMEWORK, Target, emitter, render
from shardwise.planner import Job, estimate
from shardwise.planner.frameworks import FRAMEWORKS
from shardwise.planner.job import make_job
from shardwise.specs import Layout, TrainSpec, load_cluster, load_model
from shardwise.stage_split import stage_layer_counts

DATA = Path(__file__).parent / "data"
README_PLAN = ["plan", "--model", "llama-65b", "--cluster", "dgx-a100-80gb", "--gpus", "64", "--global-batch", "1024",
               "--seq-len", "2048"]
KNOBS = ("dp", "tp", "pp", "vpp", "micro_batch", "zero", "recompute", "recompute_layers", "cp", "ep", "etp")


def knobs(layout) -> dict:
    return {k: getattr(layout, k) for k in KNOBS}


# --------------------------------------------------------------------------- Megatron-LM


def megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's argument parser, rebuilt from its option table (flags, destinations, types, choices)."""
    table = json.loads((DATA / "megatron_lm_arguments.json").read_text())
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for o in table["options"]:
        kind = o["action"]
        if kind in ("store_true", "store_false"):
            p.add_argument(*o["flags"], dest=o["dest"], action=kind, default=None)
        elif kind == "boolean_optional":
            p.add_argument(*[f for f in o["flags"] if not f.startswith("--no-")], dest=o["dest"],
                           action=argparse.BooleanOptionalAction, default=None)
        else:
            typed = {"int": int, "float": float}.get(o["type"], str)
            plain = o["choices"] if o["type"] == "str" and o["choices"] else None  # enum choices are reprs: any string
            p.add_argument(*o["flags"], dest=o["dest"], type=typed, nargs=o["nargs"], choices=plain, default=None)
    return p


def run_megatron_script(path: Path, tmp_path: Path) -> tuple[int, list[str]]:
    """Run the emitted script with a stand-in torchrun; (world size, the arguments for pretrain_gpt.py)."""
    stub = tmp_path / "bin" / "torchrun"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text(f"#!{sys.executable}\nimport json, os, sys\njson.dump(sys.argv[1:], open(os.environ['ARGV_OUT'], 'w'))\n")
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / "argv.json"
    env = dict(os.environ, PATH=f"{stub.parent}{os.pathsep}{os.environ['PATH']}", ARGV_OUT=str(record))
    done = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    argv = json.loads(record.read_text())
    script = next(i for i, a in enumerate(argv) if a.endswith("pretrain_gpt.py"))
    launcher = dict(zip(argv[:script:2], argv[1:script:2]))
    return int(launcher["--nnodes"]) * int(launcher["--nproc-per-node"]), argv[script + 1:]


def read_megatron(path: Path, tmp_path: Path, num_layers: int) -> dict:
    """The layout Megatron-LM runs from this script, through megatron-core's config classes."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
        from megatron.core.transformer.transformer_config import TransformerConfig

    world, argv = run_megatron_script(path, tmp_path)
    ns, unknown = megatron_parser().parse_known_args(argv)
    assert unknown == [], f"not Megatron-LM options: {unknown}"
    tp, pp, cp = ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.context_parallel_size or 1
    dp = world // (tp * pp * cp)  # Megatron's data-parallel size
    assert dp * tp * pp * cp == world
    counts = None
    if ns.pipeline_model_parallel_layout:
        layout = PipelineParallelLayerLayout(ns.pipeline_model_parallel_layout, pp)
        layout.validate_layer_layout(num_layers, None)
        vpp = layout.virtual_pipeline_model_parallel_size
        counts = [sum(t.name == "decoder" for t in layout.layout[s % pp][s // pp]) for s in range(pp * vpp)]
    elif ns.num_layers_per_virtual_pipeline_stage:  # Megatron's validate_args
        vpp = num_layers // pp // ns.num_layers_per_virtual_pipeline_stage
    else:
        vpp = 1
    # As megatron.training.arguments.core_transformer_config_from_args: every field of the config taken from args.
    given = {f.name: getattr(ns, f.name) for f in fields(TransformerConfig) if getattr(ns, f.name, None) is not None}
    given.pop("attention_backend", None)  # an enum in megatron-core; the string was checked by the parser
    given |= {"virtual_pipeline_model_parallel_size": vpp if vpp > 1 else None, "pipeline_dtype": torch.bfloat16,
              "gated_linear_unit": bool(ns.swiglu)}  # what core_transformer_config_from_args derives
    if ns.cp_comm_type and len(ns.cp_comm_type) == 1:  # argument_utils: one type for every layer
        given["cp_comm_type"] = ns.cp_comm_type[0]
    if ns.num_experts:  # argument_utils: --num-experts is num_moe_experts; the layer pattern a Python list
        given["num_moe_experts"] = ns.num_experts
        if ns.moe_layer_freq:
            given["moe_layer_freq"] = ast.literal_eval(ns.moe_layer_freq)
        given["moe_aux_loss_coeff"] = (ns.moe_aux_loss_coeff or [0.0])[0]
        if ns.moe_router_load_balancing_type and len(ns.moe_router_load_balancing_type) == 1:  # validate_args, too
            given["moe_router_load_balancing_type"] = ns.moe_router_load_balancing_type[0]
        given["expert_tensor_parallel_size"] = ns.expert_tensor_parallel_size or tp  # validate_args' default
    config = TransformerConfig(**given)
    ddp = DistributedDataParallelConfig(
        use_distributed_optimizer=bool(ns.use_distributed_optimizer), overlap_grad_reduce=bool(ns.overlap_grad_reduce),
        overlap_param_gather=bool(ns.overlap_param_gather), use_megatron_fsdp=bool(ns.use_megatron_fsdp),
        data_parallel_sharding_strategy=ns.data_parallel_sharding_strategy or "no_shard")
    if ddp.use_megatron_fsdp:
        zero = {"optim": 1, "optim_grads": 2, "optim_grads_params": 3}[ddp.data_parallel_sharding_strategy]
        assert ns.ckpt_format == "fsdp_dtensor"  # Megatron-FSDP requires it (validate_args)
    else:
        zero = 1 if ddp.use_distributed_optimizer else 0
    if ddp.overlap_param_gather:  # validate_args: only with a sharded optimizer and overlapped reduction
        assert zero >= 1 and ddp.overlap_grad_reduce
    partial = None  # block: the first recompute_num_layers of each chunk (transformer_block.py); uniform 1: every layer
    if config.recompute_granularity == "full" and config.recompute_method == "block":
        partial = config.recompute_num_layers
    elif config.recompute_granularity == "full":
        assert (config.recompute_method, config.recompute_num_layers) == ("uniform", 1)  # every layer
    recompute = config.recompute_granularity or "none"
    return {"dp": dp, "tp": config.tensor_model_parallel_size, "pp": config.pipeline_model_parallel_size,
            "vpp": config.virtual_pipeline_model_parallel_size or 1, "micro_batch": ns.micro_batch_size,
            "zero": zero, "recompute": recompute, "recompute_layers": partial, "sequence_parallel": config.sequence_parallel,
            "ep": config.expert_model_parallel_size,
            "etp": config.expert_tensor_parallel_size if config.num_moe_experts else 1,
            "experts": config.num_moe_experts or 0, "moe_layers": _moe_layers(config, num_layers),
            "cp": config.context_parallel_size, "cp_mode": {"p2p": "ring", "all_gather": "allgather"}[(ns.cp_comm_type or ["p2p"])[0]],
            "microbatches": ns.global_batch_size // (ns.micro_batch_size * dp),
            "schedule": ("interleaved-1f1b" if vpp > 1 else "1f1b") if pp > 1 else None, "counts": counts}


def _moe_layers(config, num_layers: int):
    freq = config.moe_layer_freq
    if not config.num_moe_experts:
        return ()
    pattern = freq if isinstance(freq, list) else [int(i % freq == 0) for i in range(num_layers)]
    return tuple(i for i, moe in enumerate(pattern) if moe)


# --------------------------------------------------------------------------- torchtitan


def torchtitan_function(module: str, name: str):
    """A pure-Python function of torchtitan, compiled from its installed source alone (its module imports
    GPU kernels that need triton)."""
    import ast
    import importlib.util

    source = Path(importlib.util.find_spec("torchtitan").origin).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
    tree = ast.parse(source.read_text())
    tree.body = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
    scope: dict = {}
    exec(compile(tree, str(source), "exec"), scope)
    return scope[name]


def torchtitan_config_manager(monkeypatch):
    """torchtitan's ConfigManager, imported without torchtitan/__init__.py, which loads its float8 and MoE
    GPU kernels (they need triton, which a CPU machine does not have); the config package needs neither."""
    import importlib.util
    import types

    if "torchtitan.config" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        package = types.ModuleType("torchtitan")
        package.__path__, package.__spec__ = list(spec.submodule_search_locations), spec
        monkeypatch.setitem(sys.modules, "torchtitan", package)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchtitan.config import ConfigManager
    return ConfigManager


def read_torchtitan(path: Path, num_layers: int, monkeypatch) -> dict:
    ConfigManager = torchtitan_config_manager(monkeypatch)
    generate_llm_fqn_per_model_part = torchtitan_function("torchtitan.distributed.pipeline_parallel",
                                                          "generate_llm_fqn_per_model_part")

    cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
    par, train = cfg.parallelism, cfg.training
    tp, pp = par.tensor_parallel_degree, par.pipeline_parallel_degree
    replicate, shard = par.data_parallel_replicate_degree, par.data_parallel_shard_degree
    assert shard >= 1 and (replicate == 1 or shard == 1)  # DDP or FSDP, never both (HSDP)
    dp = replicate * shard
    zero = {"never": 2, "always": 3}[par.fsdp_reshard_after_forward] if shard > 1 else 0
    accumulation = train.global_batch_size // (train.local_batch_size * dp)  # torchtitan/train.py
    counts, vpp, schedule = None, 1, None
    if pp > 1:
        parts = par.module_fqns_per_model_part
        if parts is None:  # torchtitan/distributed/pipeline_parallel.py
            stages = math.ceil((num_layers + par.pipeline_parallel_first_stage_less_layers
                                + par.pipeline_parallel_last_stage_less_layers) / par.pipeline_parallel_layers_per_stage)
            parts = generate_llm_fqn_per_model_part(stages, num_layers, par.pipeline_parallel_first_stage_less_layers,
                                                    par.pipeline_parallel_last_stage_less_layers)
        vpp = len(parts) // pp
        counts = [sum(name.startswith("layers.") for name in part) for part in parts]
        schedule = {"GPipe": "gpipe", "1F1B": "1f1b", "Interleaved1F1B": "interleaved-1f1b"}[par.pipeline_parallel_schedule]
        micro_batch = par.pipeline_parallel_microbatch_size
        microbatches = train.local_batch_size // micro_batch * accumulation
    else:
        micro_batch, microbatches = train.local_batch_size, accumulation
    return {"dp": dp, "tp": tp, "pp": pp, "vpp": vpp, "micro_batch": micro_batch, "zero": zero,
            **_torchtitan_recompute(cfg.activation_checkpoint, max(counts) if counts else num_layers),
            "sequence_parallel": tp > 1,  # torchtitan's TP is always SP
            "cp": par.context_parallel_degree, "ep": 1, "etp": 1,
            "cp_mode": {"alltoall": "ring", "allgather": "allgather"}[par.context_parallel_rotate_method],
            "microbatches": microbatches, "schedule": schedule, "counts": counts}


# --------------------------------------------------------------------------- DeepSpeed


def read_deepspeed(path: Path, dp: int, monkeypatch) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from deepspeed.runtime import config as ds_config

    class DataParallel:  # the model-parallel unit DeepSpeed asks for the data-parallel size
        def get_data_parallel_world_size(self):
            return dp

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)  # as if torch.distributed were up
    raw = json.loads(path.read_text())
    tp = raw.get("tensor_parallel", {}).get("autotp_size", 1)
    if tp > 1:  # as deepspeed.initialize reads it, before AutoTP's groups exist: every rank counted, no mpu
        assert "train_batch_size" not in raw  # which DeepSpeed would check against every rank
        monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: dp * tp)
        cfg = ds_config.DeepSpeedConfig(str(path), mpu=None)
    else:
        cfg = ds_config.DeepSpeedConfig(str(path), mpu=DataParallel())  # asserts the batch arithmetic for this dp
    assert cfg.bfloat16_config.enabled
    raw = cfg._param_dict
    pp = cfg.pipeline["stages"] if "pipeline" in raw else 1
    full = cfg.pipeline["activation_checkpoint_interval"] > 0 if pp > 1 else "activation_checkpointing" in raw
    return {"dp": cfg.world_size // tp, "tp": cfg.tensor_parallel_config.autotp_size or 1, "pp": pp, "vpp": 1,
            "micro_batch": cfg.train_micro_batch_size_per_gpu, "zero": int(cfg.zero_optimization_stage),
            "recompute": "full" if full else "none", "recompute_layers": None, "sequence_parallel": False, "cp": 1, "cp_mode": "ring", "ep": 1, "etp": 1,
            "grad_bytes": 4 if cfg.grad_accum_dtype == "fp32" else 2,  # None: the model's dtype, bf16
            "microbatches": cfg.gradient_accumulation_steps, "schedule": "1f1b" if pp > 1 else None, "counts": None}


def _torchtitan_recompute(ac, chunk: int) -> dict:
    """torchtitan's activation_checkpoint as shardwise's knobs: selective with an integer k checkpoints every k-th
    block (distributed/activation_checkpoint.py _apply_layer_sac: a counter over blocks, `count % k == 0`)."""
    if ac.mode == "selective" and ac.selective_ac_option.isdigit():
        return {"recompute": "full", "recompute_layers": chunk // int(ac.selective_ac_option)}
    return {"recompute": ac.mode, "recompute_layers": None}


def read(target_name: str, path: Path, job, layout, tmp_path, monkeypatch) -> dict:
    if target_name == "megatron":
        return read_megatron(path, tmp_path, job.model.num_layers)
    if target_name == "torchtitan":
        return read_torchtitan(path, job.model.num_layers, monkeypatch)
    return read_deepspeed(path, layout.dp, monkeypatch)


def check_round_trip(got: dict, job, layout) -> None:
    assert {k: got[k] for k in KNOBS} == knobs(layout)
    assert got["microbatches"] == layout.num_microbatches(job.train.global_batch)
    assert got["sequence_parallel"] == (layout.sequence_parallel and layout.tp > 1)
    assert layout.cp == 1 or got["cp_mode"] == layout.cp_mode
    assert got.get("grad_bytes", job.train.grad_bytes) == job.train.grad_bytes  # the gradients the planner scored
    if "experts" in got:  # the model's experts and which layers have them
        assert (got["experts"], got["moe_layers"]) == (job.model.num_experts, tuple(job.model.moe_layers))
    if layout.pp > 1:
        assert got["schedule"] == layout.schedule
        if got["counts"] is not None:  # the target's stage split is the one the planner scored (its stack's)
            assert got["counts"] == list(stage_layer_counts(job.model, layout.pp * layout.vpp, job.train.seq_len,
                                                            FRAMEWORKS[job.framework].stage_split))


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_readme_plan_round_trips_through_the_targets_parser(target, tmp_path, capsys, monkeypatch):
    """The README's llama-65b plan, winner and runner-up, through `plan --emit` and back."""
    job = make_job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), 1024, 2048, FRAMEWORK[target])
    for rank in (1, 2):
        out = tmp_path / f"{target}-{rank}.out"
        capsys.readouterr()  # what the parsers printed (DeepSpeed logs to stdout)
        assert main(README_PLAN + ["--emit", target, "--out", str(out), "--rank", str(rank), "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        planned = printed["candidates"][rank - 1]  # row `rank` of plan's table
        assert printed["emitted"]["layout"] == planned and printed["emitted"]["rank"] == rank
        layout = Layout(dp=planned["dp"], tp=planned["tp"], pp=planned["pp"], micro_batch=planned["micro_batch"],
                        vpp=planned["vpp"], zero=planned["zero"], recompute=planned["recompute"],
                        recompute_layers=planned["recompute_layers"],
                        sequence_parallel=planned["sequence_parallel"], schedule=planned["schedule"],
                        cp=planned["cp"], cp_mode=planned["cp_mode"])
        check_round_trip(read(target, out, job, layout, tmp_path, monkeypatch), job, layout)


# Layouts beyond the README's winner: uneven stage splits, ZeRO-0/2/3, both recompute levels, no pipeline,
# gradient accumulation, GQA, a GPT-2-family model.
CASES = {
    "megatron": [
        ("llama3.1-405b", 16384, 2048, 8192, Layout(64, 8, 32, 1, 3, 1, "none", True, "interleaved-1f1b")),
        # 126 layers on 16 x 8 chunks, the first only the embedding, the last only the loss: "E|(t|)*126,L"
        ("llama3.1-405b", 8192, 2048, 8192, Layout(64, 8, 16, 1, 8, 1, "full", True, "interleaved-1f1b"), "megatron-core"),
        ("llama-65b", 48, 1024, 2048, Layout(2, 8, 3, 1, 1, 2, "selective", True, "1f1b")),
        ("llama-65b", 64, 1024, 2048, Layout(8, 8, 1, 2, 1, 3, "full", True)),
        ("gpt3-175b", 64, 512, 2048, Layout(1, 8, 8, 1, 1, 0, "full", False, "1f1b")),
        ("gpt3-175b", 64, 512, 2048, Layout(1, 8, 8, 1, 1, 0, "full", False, "1f1b", recompute_layers=4)),
        ("llama3-70b", 64, 64, 32768, Layout(2, 8, 2, 1, 1, 1, "selective", True, "1f1b", cp=2, cp_mode="allgather")),
        ("qwen3-30b-a3b", 64, 1024, 4096, Layout(8, 2, 4, 1, 1, 1, "selective", True, "1f1b", ep=8, etp=2)),
        ("deepseek-v3", 1024, 1024, 4096, Layout(8, 8, 16, 1, 1, 1, "full", True, "1f1b", ep=64)),
    ],
    "torchtitan": [
        ("llama3.1-405b", 16384, 2048, 8192, Layout(64, 8, 32, 1, 3, 3, "full", True, "interleaved-1f1b")),
        ("llama3-70b", 48, 96, 4096, Layout(2, 8, 3, 2, 1, 2, "none", True, "gpipe")),
        ("llama3-8b", 16, 64, 4096, Layout(16, 1, 1, 2, 1, 0, "full", False)),
        ("llama3-8b", 16, 64, 4096, Layout(16, 1, 1, 2, 1, 3, "full", False, recompute_layers=8)),  # every 4th block
        ("llama3-70b", 64, 64, 32768, Layout(2, 8, 2, 1, 1, 3, "none", True, "1f1b", cp=2)),
    ],
    "deepspeed": [
        ("llama-65b", 64, 1024, 2048, Layout(8, 1, 8, 2, 1, 1, "full", False, "1f1b")),
        ("llama3-8b", 16, 64, 4096, Layout(8, 2, 1, 2, 1, 3, "none", False)),
        ("llama3-8b", 16, 64, 4096, Layout(16, 1, 1, 1, 1, 2, "full", False)),
        ("llama3-8b", 16, 64, 4096, Layout(16, 1, 1, 2, 1, 0, "none", False), "deepspeed"),  # bf16 gradients
    ],
}


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_more_layouts_round_trip(target, tmp_path, monkeypatch):
    for i, (model, gpus, batch, seq, layout, *framework) in enumerate(CASES[target]):
        job = (make_job(load_model(model), load_cluster("dgx-h100-80gb"), batch, seq, framework[0]) if framework else
               Job(load_model(model), load_cluster("dgx-h100-80gb"), TrainSpec(batch, seq), flash_attention=True))
        out = tmp_path / f"case{i}"
        out.write_text(render(target, Target(job=job, estimate=estimate(job, layout), gpus=gpus, rank=1)))
        check_round_trip(read(target, out, job, layout, tmp_path, monkeypatch), job, layout)


def test_megatron_arguments_are_megatron_lm_options(tmp_path):
    """Every flag the script passes is one of Megatron-LM's options (argparse refuses unknown or misspelled ones)."""
    job = Job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), TrainSpec(1024, 2048), flash_attention=True,
              tp_comm_overlap=True)
    out = tmp_path / "m.sh"
    lay = Layout(4, 2, 8, 1, 10, 1, "selective", True, "interleaved-1f1b")
    out.write_text(render("megatron", Target(job=job, estimate=estimate(job, lay), gpus=64, rank=1)))
    _, argv = run_megatron_script(out, tmp_path)
    known = {f for o in json.loads((DATA / "megatron_lm_arguments.json").read_text())["options"] for f in o["flags"]}
    assert [a for a in argv if a.startswith("--") and a not in known] == []
    assert "--tp-comm-overlap" in argv
    # The rebuilt parser does refuse what Megatron-LM would: a misspelled flag, a value outside the choices.
    assert megatron_parser().parse_known_args(argv + ["--tensor-parallel-size", "2"])[1] == ["--tensor-parallel-size", "2"]
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        megatron_parser().parse_args(["--recompute-granularity", "some"])


def test_a_megatron_script_overlaps_the_gradient_reduction_only_where_the_plan_priced_it(tmp_path):
    # megatron-2021 (Narayanan et al.: the all-reduce after the backward) is priced without overlap: its script must
    # not turn Megatron-Core's --overlap-grad-reduce on; megatron-core's plan is priced with it, and its script has it
    lay = Layout(8, 8, 8, 1, 1, 1, "full", False, "1f1b")
    for framework, overlapped in (("megatron-2021", False), ("megatron-core", True)):
        job = make_job(load_model("gpt3-175b"), load_cluster("dgx-a100-80gb"), 1536, 2048, framework)
        out = tmp_path / f"{framework}.sh"
        out.write_text(render("megatron", Target(job=job, estimate=estimate(job, lay.with_(zero=int(overlapped))),
                                                 gpus=512, rank=1)))
        _, argv = run_megatron_script(out, tmp_path)
        assert ("--overlap-grad-reduce" in argv) is overlapped, framework
        assert ("--overlap-param-gather" in argv) is overlapped, framework
    # InternEvo overlaps its reduction but gathers the updated weights after the step: no --overlap-param-gather
    job = make_job(load_model("llama3-8b"), load_cluster("dgx-a100-80gb"), 64, 4096, "internevo")
    out = tmp_path / "internevo.sh"
    small = Layout(16, 1, 1, 1, 1, 1, "none", False, "1f1b")
    out.write_text(render("megatron", Target(job=job, estimate=estimate(job, small), gpus=16, rank=1)))
    _, argv = run_megatron_script(out, tmp_path)
    assert "--overlap-grad-reduce" in argv and "--overlap-param-gather" not in argv


@pytest.mark.parametrize("cluster, backend, written", [("dgx-h100-80gb", None, "fused"), ("dgx-h100-80gb", "flash", "flash"),
                                                      ("dgx-a100-80gb", None, "flash")])
def test_a_megatron_script_runs_the_attention_kernel_the_plan_priced(tmp_path, cluster, backend, written):
    # megatron-core on Hopper is priced with cuDNN's fused attention (Transformer Engine's pick): at 128K tokens its
    # step is a third shorter than FlashAttention-2's, so the script must ask for that kernel, not flash
    job = make_job(load_model("llama3-8b"), load_cluster(cluster), 64, 8192, "megatron-core",
                   attention_backend=backend)
    out = tmp_path / "m.sh"
    out.write_text(render("megatron", Target(job=job, estimate=estimate(job, Layout(8, 1, 1, 1, 1, 1, "none", False,
                                                                                      "1f1b")), gpus=8, rank=1)))
    _, argv = run_megatron_script(out, tmp_path)
    assert argv[argv.index("--attention-backend") + 1] == written


def test_an_fp8_plan_is_emitted_as_the_stack_trains_fp8(tmp_path, monkeypatch):
    """What the planner scored is what the file runs: torchtitan's torchao Float8 (tensor-wise, the LM head left in
    BF16) under torch.compile, read back by torchtitan's ConfigManager; Megatron-LM's Transformer Engine FP8 (and FP8
    parameter gathers) as Megatron-LM options; DeepSpeed, whose config has no FP8 switch, refused in one line."""
    lay = Layout(dp=8, tp=1, pp=1, micro_batch=1, zero=3, recompute="full")
    titan = make_job(load_model("llama3-8b"), load_cluster("dgx-h100-80gb"), 8, 8192, "torchtitan", precision="fp8",
                     compile=True)
    out = tmp_path / "titan.toml"
    out.write_text(render("torchtitan", Target(job=titan, estimate=estimate(titan, lay), gpus=8, rank=1)))
    cfg = torchtitan_config_manager(monkeypatch)().parse_args(["--job.config_file", str(out)])
    assert cfg.model.converters == ["quantize.linear.float8"] and cfg.compile.enable
    assert cfg.quantize.linear.float8.recipe_name == "tensorwise" and cfg.quantize.linear.float8.filter_fqns == ["output"]
    assert "fp8, compiled" in out.read_text()
    # --fp8-params under torchtitan: torchao's float8 all-gather, which torchtitan refuses beside a recipe name
    gather = replace(titan, fp8_all_gather=True)
    out.write_text(render("torchtitan", Target(job=gather, estimate=estimate(gather, lay), gpus=8, rank=1)))
    f8 = torchtitan_config_manager(monkeypatch)().parse_args(["--job.config_file", str(out)]).quantize.linear.float8
    assert f8.enable_fsdp_float8_all_gather and f8.precompute_float8_dynamic_scale_for_fsdp and f8.recipe_name is None
    assert f8.filter_fqns == ["output"] and not cfg.quantize.linear.float8.enable_fsdp_float8_all_gather
    # each stack's FP8 weights are its own: emitted for the other stack they would be dropped, so it refuses
    from shardwise.emit import megatron as mega_emit, torchtitan as titan_emit
    assert "--framework megatron-core --fp8-params" in mega_emit.problem(gather, lay.with_(zero=1))
    te_params = make_job(load_model("llama3-8b"), load_cluster("dgx-h100-80gb"), 8, 8192, "megatron-core",
                         precision="fp8", fp8_params=True)
    assert "--framework torchtitan --fp8-params" in titan_emit.problem(te_params, lay)
    mega = make_job(load_model("llama3-8b"), load_cluster("dgx-h100-80gb"), 8, 8192, "megatron-core", precision="fp8",
                    fp8_params=True)
    lay1 = lay.with_(zero=1, recompute="none")
    script = tmp_path / "m.sh"
    script.write_text(render("megatron", Target(job=mega, estimate=estimate(mega, lay1), gpus=8, rank=1)))
    _, argv = run_megatron_script(script, tmp_path)
    ns, unknown = megatron_parser().parse_known_args(argv)
    assert unknown == [] and ns.fp8 == "hybrid" and ns.fp8_param_gather
    assert "fp8-format" not in render("megatron", Target(job=replace(mega, precision="bf16"), estimate=estimate(mega, lay1),
                                                         gpus=8, rank=1))
    from shardwise.emit import deepspeed, megatron, torchtitan
    deep = make_job(load_model("llama3-8b"), load_cluster("dgx-h100-80gb"), 8, 8192, "deepspeed-2024", precision="fp8")
    assert "no FP8 switch" in deepspeed.problem(deep, lay1)
    # Megatron-LM refuses --fp8-param-gather without its distributed optimizer or FSDP (arguments.py validate_args);
    # torchtitan 0.2.x's Float8 TP plans never turn on for its own converter name ("float8" in model.converters)
    assert "--zero 1,2,3" in megatron.problem(mega, lay1.with_(zero=0))
    assert megatron.problem(replace(mega, train=replace(mega.train, weight_bytes=2)), lay1.with_(zero=0)) is None
    assert "--tp 1" in torchtitan.problem(titan, lay.with_(dp=4, tp=2)) and torchtitan.problem(titan, lay) is None


@pytest.mark.parametrize("target, narrow, knob", [
    ("megatron", ["--pp", "8", "--schedules", "zb-h1"], "zb-h1"),
    ("torchtitan", ["--zero", "1", "--tp", "2", "--pp", "8"], "ZeRO-1"),
    ("deepspeed", ["--pp", "8", "--schedules", "interleaved-1f1b"], "interleaved-1f1b"),
    ("deepspeed", ["--recompute", "selective", "--pp", "1", "--tp", "1"], "selective recompute"),
])
def test_a_layout_the_target_cannot_express_is_one_line_exit_2(target, narrow, knob, tmp_path, capsys):
    out = tmp_path / "x"
    assert main(README_PLAN + narrow + ["--emit", target, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and knob in err and not out.exists()


def test_problem_names_the_knob_for_each_target():
    job = Job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), TrainSpec(1024, 2048))
    zb = Layout(1, 8, 8, 1, 1, 0, "none", True, "zb-h1")
    assert "zb-h1" in emitter("megatron").problem(job, zb)
    # torchtitan: the split first — with neither dp nor cp there is no FSDP to apply mixed precision (maybe_enable_amp)
    assert "would train in FP32" in emitter("torchtitan").problem(job, zb)
    assert "zb-h1" in emitter("torchtitan").problem(job, zb.with_(dp=2, zero=2))
    # DeepSpeed: the split itself first (TP beside a pipeline), which no narrowing of the schedule or ZeRO fixes
    assert "TP with a pipeline" in emitter("deepspeed").problem(job, zb)
    assert "zb-h1" in emitter("deepspeed").problem(job, zb.with_(tp=1, sequence_parallel=False))
    assert "selective" in emitter("torchtitan").problem(job, zb.with_(dp=2, schedule="1f1b", recompute="selective",
                                                                      zero=2))
    # torchtitan's own selective recompute (per-op, as its profile prices it) is written, not refused; so is its FSDP
    # over cp ranks refused as ZeRO-0
    titan = make_job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), 1024, 2048, "torchtitan")
    sel = zb.with_(dp=2, schedule="1f1b", recompute="selective", zero=2)
    assert emitter("torchtitan").problem(titan, sel) is None
    assert emitter("torchtitan")._checkpointing(titan, sel) == {"mode": "selective", "selective_ac_option": "op"}
    # and Megatron's selective recompute (the attention core) is not the per-op kind that plan priced
    assert "per-op selective recompute" in emitter("megatron").problem(titan, sel)
    assert "FSDP over its context-parallel ranks" in emitter("torchtitan").problem(titan, Layout(1, 8, 1, 1, 1, 0, cp=8))
    assert "ZeRO-2" in emitter("deepspeed").problem(job, zb.with_(tp=1, sequence_parallel=False, schedule="1f1b", zero=2))
    assert "fp32 gradients" in emitter("deepspeed").problem(job, Layout(64, 1, 1, 1, 1, 0))  # 4-byte gradients scored
    assert "expert parallelism" in emitter("deepspeed").problem(job, Layout(64, 1, 1, 1, 1, 1, ep=8))
    moe = Job(load_model("mixtral-8x7b"), load_cluster("dgx-a100-80gb"), TrainSpec(1024, 2048))
    assert "mixture-of-experts" in emitter("torchtitan").problem(moe, Layout(8, 8, 1, 1, 1, 2, "none", True))
    assert emitter("megatron").problem(job, zb.with_(schedule="1f1b")) is None


@pytest.mark.parametrize("argv, words", [
    (["--emit", "megatron"], "--out"),
    (["--out", "x.sh"], "--emit"),
    (["--rank", "2"], "--emit"),
    (["--emit", "deepspeed", "--out", "x.json", "--rank", "0"], "--rank"),
    (["--emit", "deepspeed", "--out", "x.json", "--rank", "999"], "--rank 999"),
])
def test_emit_flag_mistakes_are_one_line_exit_2(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(README_PLAN + argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_emit_scores_with_the_targets_framework_profile(capsys):
    """--emit X plans with --framework FRAMEWORK[X] unless --framework is given; the row written is that plan's
    best layout the target can express."""
    from shardwise.emit import expressible
    from shardwise.planner.search import search

    for target in ("torchtitan", "deepspeed"):
        assert main(README_PLAN + ["--emit", target, "--out", os.devnull, "--json"]) == 0
        emitted = json.loads(capsys.readouterr().out)["emitted"]
        assert emitted["framework"] == FRAMEWORK[target]
        job = make_job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), 1024, 2048, FRAMEWORK[target])
        assert emitted["layout"] == expressible(target, job, search(job, 64).ranked)[0].to_dict()
    assert main(README_PLAN + ["--emit", "megatron", "--framework", "nemo", "--out", os.devnull, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["emitted"]["framework"] == "nemo"


def test_torchtitan_config_of_a_megatron_plan_cuts_the_layers_as_scored(tmp_path, capsys):
    # Llama 3 8B's 32 layers on pp 4, planned for megatron-core: Megatron builds 32 / 4 = 8 layers a stage
    # (transformer_block.py get_num_layers_to_build), what the planner scored; torchtitan's config must then say
    # 8 a stage, not the cost-balanced cut shardwise's runtime would take (a middle stage of 9, the last of 6).
    import tomllib

    out = tmp_path / "titan.toml"
    argv = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "64",
            "--seq-len", "4096", "--framework", "megatron-core", "--tp", "8", "--pp", "4",
            "--schedules", "1f1b", "--zero", "2", "--emit", "torchtitan", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    par = tomllib.loads(out.read_text())["parallelism"]
    assert par["pipeline_parallel_degree"] == 4 and par["pipeline_parallel_layers_per_stage"] == 8, par
    assert "module_fqns_per_model_part" not in par


def test_a_file_for_one_stack_from_a_plan_ranked_for_another_says_so(capsys):
    """--emit deepspeed --framework megatron-core writes the DeepSpeed file of the layout Megatron-Core would run
    best: the line that names the file says which stack ranked it, and what would rank it as DeepSpeed runs it."""
    assert main(README_PLAN + ["--emit", "deepspeed", "--framework", "megatron-core", "--out", os.devnull]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "ranked as megatron-core runs it (without --framework, as DeepSpeed does: deepspeed-2024)" in said
    assert main(README_PLAN + ["--emit", "deepspeed", "--out", os.devnull]) == 0
    assert "ranked as" not in capsys.readouterr().out


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_no_target_is_written_a_tp_above_the_kv_heads(target, tmp_path, capsys):
    """A plan under megatron-2021 may give each of 4 TP ranks a copy of a multi-query model's one K/V head; every
    target's release splits the KV heads over tp, so --tp 4 is one line naming it, and without --tp the file holds a
    layout the target can run."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 16,
                               "num_key_value_heads": 1, "num_hidden_layers": 8, "intermediate_size": 5632,
                               "vocab_size": 32000, "max_position_embeddings": 4096}))
    argv = ["plan", "--model", str(cfg), "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch", "64",
            "--seq-len", "4096", "--framework", "megatron-2021", "--flash-attention", "--emit", target]
    assert main(argv + ["--tp", "4", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not divide the 1 KV heads" in err
    out = tmp_path / "b"
    zero = ["--zero", "1"] if target == "deepspeed" else []  # DeepSpeed keeps a bf16 model's fp32 gradients under ZeRO
    assert main(argv + zero + ["--out", str(out)]) == 0
    text = out.read_text()
    spelled = ("tensor_parallel_degree = {}", "--tensor-model-parallel-size {}", '"autotp_size": {}')
    assert not any(s.format(t) in text for s in spelled for t in (2, 4, 8, 16))


def test_a_target_that_runs_no_fitting_layout_says_what_the_fastest_needs_and_who_runs_it(capsys, tmp_path):
    # Llama 3.1 70B at 128K on 64 H100: every layout that fits splits the sequence over TP (or CP), which DeepSpeed's
    # AutoTP does not: the one line names the fastest layout, what it needs and the targets that run it
    code = main(["plan", "--model", "llama3.1-70b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "8",
                 "--seq-len", "131072", "--emit", "deepspeed", "--out", str(tmp_path / "ds.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "DeepSpeed cannot run any layout that fits: the fastest, dp" in err and "can run it" in err, err


# Small Hugging Face configs with one block feature each beyond Llama's, and the TransformerConfig fields megatron-core
# must get from the script for the same blocks (what the planner counted: model_spec reads these keys).
_LLAMA = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
          "num_key_value_heads": 4, "vocab_size": 1024, "max_position_embeddings": 2048}
_MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128}
BLOCK_FEATURES = {
    "qwen2_moe": (_LLAMA | _MOE | {"model_type": "qwen2_moe", "shared_expert_intermediate_size": 256},
                  {"add_qkv_bias": True, "add_bias_linear": False, "moe_shared_expert_gate": True,
                   "gated_linear_unit": True, "moe_router_pre_softmax": True}),  # norm_topk_prob false: no renorm
    "qwen3_moe": (_LLAMA | _MOE | {"model_type": "qwen3_moe", "head_dim": 64},
                  {"qk_layernorm": True, "add_bias_linear": False, "add_qkv_bias": None, "kv_channels": 64}),
    "deepseek_v3": (_LLAMA | {"model_type": "deepseek_v3", "n_routed_experts": 8, "num_experts_per_tok": 2,
                              "moe_intermediate_size": 128, "n_shared_experts": 1, "first_k_dense_replace": 1,
                              "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
                              "v_head_dim": 32, "n_group": 1, "topk_group": 1,
                              "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                                               "original_max_position_embeddings": 4096, "beta_fast": 32,
                                               "beta_slow": 1}},
                    {"multi_latent_attention": True, "q_lora_rank": 96, "kv_lora_rank": 64, "qk_head_dim": 32,
                     "qk_pos_emb_head_dim": 16, "v_head_dim": 32,
                     "qk_layernorm": True,  # MLA's norms on the q and kv latents are built only with it
                     "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                     "moe_router_load_balancing_type": ["seq_aux_loss"],  # DeepSeek's per-sequence balance loss
                     "rotary_scaling_factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
    "llama 3.1 rope scaling": (_LLAMA | {"model_type": "llama", "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}}, {"use_rope_scaling": True, "rope_scaling_factor": 8.0}),
    "gelu, no model_type": (_LLAMA | {"hidden_act": "gelu"}, {"gated_linear_unit": False, "add_bias_linear": False}),
}


@pytest.mark.parametrize("name", BLOCK_FEATURES)
def test_a_megatron_script_builds_the_planned_blocks(name, tmp_path):
    """A model's block features reach Megatron-LM's arguments (QKV biases, the shared expert's gate, q/k norms,
    multi-head latent attention, a non-gated MLP), with the dropouts the planner priced (none)."""
    config, expected = BLOCK_FEATURES[name]
    (tmp_path / "config.json").write_text(json.dumps(config))
    job = make_job(load_model(str(tmp_path / "config.json")), load_cluster("dgx-h100-80gb"), 64, 1024, "megatron-core")
    out = tmp_path / "m.sh"
    out.write_text(render("megatron", Target(job=job, estimate=estimate(job, Layout(dp=8)), gpus=8, rank=1)))
    _, argv = run_megatron_script(out, tmp_path)
    ns, unknown = megatron_parser().parse_known_args(argv)
    assert unknown == []
    # core_transformer_config_from_args: --swiglu is the gated linear unit
    read = {k: getattr(ns, k) for k in expected if k != "gated_linear_unit"} | {"gated_linear_unit": bool(ns.swiglu)}
    assert read == {"gated_linear_unit": True} | expected
    assert (ns.attention_dropout, ns.hidden_dropout) == (0.0, 0.0)  # Megatron-LM's default is 0.1


def test_a_torchtitan_flavor_is_named_only_for_its_whole_shape(tmp_path):
    """torchtitan's llama3 "8B" fixes the FFN width, rope_theta and an untied head besides the four widths, and every
    flavor applies Llama 3.1's RoPE scaling (RoPEScalingArgs' defaults) with norm_eps 1e-5: Llama 3 8B (no scaling), a
    model with another scaling or epsilon, or Llama 3 8B's widths with Llama 2's FFN, base and tied head gets the
    register-a-flavor comment instead."""
    titan = emitter("torchtitan")
    assert titan.flavor(load_model("llama3.1-8b")) == "8B" and titan.flavor(load_model("llama3.1-405b")) == "405B"
    assert titan.flavor(load_model("llama3-8b")) is None  # the same shape, no RoPE scaling
    config = load_model("llama3.1-8b").to_hf_config()
    for other in ({"rms_norm_eps": 1e-6}, {"rope_scaling": {**config["rope_scaling"], "factor": 32.0}}):
        (tmp_path / "c.json").write_text(json.dumps(config | other))
        assert titan.flavor(load_model(str(tmp_path / "c.json"))) is None, other
    (tmp_path / "config.json").write_text(json.dumps(load_model("llama3-8b").to_hf_config() | {
        "intermediate_size": 11008, "rope_theta": 10000.0, "tie_word_embeddings": True}))
    job = make_job(load_model(str(tmp_path / "config.json")), load_cluster("dgx-h100-80gb"), 64, 1024, "torchtitan")
    text = render("torchtitan", Target(job=job, estimate=estimate(job, Layout(dp=8, zero=3)), gpus=8, rank=1))
    assert 'flavor = "8B"' not in text and "ffn hidden 11008, rope_theta=10000, no rope scaling, tied" in text


@pytest.mark.parametrize("config, target, words", [
    (_LLAMA | {"attention_bias": True}, "megatron", "biases on the attention's matrices but not on the MLP's"),
    (_LLAMA | {"attention_bias": True}, "torchtitan", "biases"),
    (_LLAMA | {"hidden_act": "gelu"}, "torchtitan", "a gelu MLP"),
    (_LLAMA | {"model_type": "nemotron", "hidden_act": "relu2"}, "megatron", "not nemotron's"),  # LayerNorm1P
    (BLOCK_FEATURES["deepseek_v3"][0], "torchtitan", "multi-head latent attention"),
    (_LLAMA | _MOE | {"model_type": "mixtral", "sliding_window": 512}, "megatron", "512-token sliding attention window"),
    (_LLAMA | {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "megatron", "linear RoPE scaling"),
    (_LLAMA | {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 4096}},
     "megatron", "llama3 RoPE scaling"),  # Megatron-Core fixes Llama 3.1's 8192
    ({**BLOCK_FEATURES["deepseek_v3"][0], "norm_topk_prob": False}, "megatron", "sigmoid routing without renormalising"),
    (_LLAMA | _MOE | {"model_type": "qwen2_moe", "shared_expert_intermediate_size": 256, "num_experts_per_tok": 1,
                      "norm_topk_prob": True}, "megatron",
     "top-1 routing renormalised"),
    (_LLAMA | {"attention_dropout": 0.1}, "torchtitan", "dropout"),
])
def test_emit_refuses_a_model_its_file_would_build_differently(config, target, words, tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(config))
    argv = ["plan", "--model", str(tmp_path / "config.json"), "--cluster", "dgx-h100-80gb", "--gpus", "8",
            "--global-batch", "64", "--seq-len", "1024", "--emit", target, "--out", str(tmp_path / "f")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and not (tmp_path / "f").exists()


# --------------------------------------------------------------------------- found by an outside fuzz of the emitters


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_gpus_that_are_not_whole_nodes_are_refused(target, tmp_path, capsys):
    """Every launch file starts as many processes on each node: 12 GPUs on 8-GPU nodes would start 16."""
    argv = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "12", "--global-batch", "192",
            "--seq-len", "4096", "--emit", target, "--out", str(tmp_path / "f")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "12 GPUs are not whole 8-GPU nodes" in err and err.count("\n") == 1 and not (tmp_path / "f").exists()


@pytest.mark.parametrize("command", ["plan", "report"])
def test_out_never_overwrites_the_config_it_plans_from(command, tmp_path, capsys):
    config = tmp_path / "m.json"
    config.write_text(json.dumps(load_model("llama3-8b").to_hf_config()))
    before = config.read_text()
    argv = [command, "--model", str(config), "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "512",
            "--seq-len", "8192", "--out", str(config)] + (["--emit", "deepspeed"] if command == "plan" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is the file --model names" in err and err.count("\n") == 1 and config.read_text() == before


def test_a_new_file_beside_a_model_folders_own_is_written(tmp_path, capsys):
    """A model folder is read for its own files (config.json, weights, tokenizer): a launch file written into it is
    fine, as `cd model && shardwise plan --model . --emit ... --out train.sh` writes it."""
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(load_model("llama3.1-8b").to_hf_config()))
    argv = ["plan", "--model", str(folder), "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "512",
            "--seq-len", "8192", "--emit", "deepspeed"]
    assert main(argv + ["--out", str(folder / "ds.json")]) == 0 and (folder / "ds.json").is_file()
    capsys.readouterr()
    assert main(argv + ["--out", str(folder / "config.json")]) == 2  # its own file: never
    assert "is the file --model" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_a_write_that_fails_is_one_line(capsys):
    argv = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "512",
            "--seq-len", "8192", "--emit", "deepspeed", "--out", "/dev/full"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot write it" in err and err.count("\n") == 1


def test_a_name_with_a_newline_stays_in_its_comment(tmp_path):
    folder = tmp_path / "inj\necho PWNED;x"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(load_model("llama3.1-8b").to_hf_config()))
    job = make_job(load_model(str(folder)), load_cluster("dgx-h100-80gb"), 64, 1024, "megatron-core")
    for target in ("megatron", "torchtitan"):
        text = render(target, Target(job=job, estimate=estimate(job, Layout(dp=8, zero=1 if target == "megatron" else 3)),
                                     gpus=8, rank=1))
        assert not any(line.startswith("echo PWNED") for line in text.splitlines()), target
        assert "inj\\x0aecho PWNED" in text


def _job(model="llama3.1-8b", framework="torchtitan", **kw):
    return make_job(load_model(model), load_cluster("dgx-h100-80gb"), 256, 4096, framework, **kw)


@pytest.mark.parametrize("target", ["megatron", "deepspeed"])
def test_hybrid_sharding_is_refused_where_the_file_cannot_say_it(target):
    job = _job()
    assert "hybrid sharding" in emitter(target).problem(job, Layout(dp=16, dp_shard=8, zero=3 if target == "megatron" else 2))
    assert emitter("torchtitan").problem(job, Layout(dp=16, dp_shard=8, zero=3)) is None  # its replicate x shard degrees


def test_torchtitan_refuses_what_its_release_runs_otherwise():
    job = _job()
    # FSDP over the cp ranks whenever cp > 1 (parallel_dims.fsdp_enabled): no ZeRO-1, even at dp 1
    assert "ZeRO-1" in emitter("torchtitan").problem(job, Layout(dp=1, cp=2, zero=1))
    # 0.2's llama3 runs nn.RMSNorm: fused norms were priced, not runnable
    assert "fused norms" in emitter("torchtitan").problem(_job(fused_norms=True), Layout(dp=8, zero=3))
    # one selective_ac counter per process over all its chunks: chunks of 3 and 4 layers cannot all recompute 1
    odd = _job("llama3-70b")  # 80 layers on pp 4 x vpp 6 = 24 chunks: 3 or 4 layers each
    lay = Layout(dp=2, pp=4, vpp=6, zero=2, schedule="interleaved-1f1b", recompute="full", recompute_layers=1)
    assert len(set(stage_layer_counts(odd.model, 24, 4096, FRAMEWORKS["torchtitan"].stage_split))) > 1
    assert "counted over all of a rank's chunks" in emitter("torchtitan").problem(odd, lay)


@pytest.mark.parametrize("dispatcher, overlap, expected", [
    ("alltoall", False, ["--moe-token-dispatcher-type", "alltoall"]),
    ("deepep", False, ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]),
    ("alltoall", True, ["--moe-token-dispatcher-type", "alltoall", "--overlap-moe-expert-parallel-comm"]),
    ("deepep-ep1", False, ["--moe-token-dispatcher-type", "alltoall"]),  # flex refuses DeepEP over one expert rank
])
def test_megatron_moe_runs_the_dispatcher_the_plan_priced(dispatcher, overlap, expected):
    """Megatron-Core's default dispatcher is allgather (TransformerConfig.moe_token_dispatcher_type): the file names the
    one the plan priced."""
    ep = 1 if dispatcher.endswith("-ep1") else 8
    job = replace(_job("mixtral-8x7b", "megatron-core"), moe_dispatcher=dispatcher.removesuffix("-ep1"),
                  ep_comm_overlap=overlap)
    lay = Layout(dp=32, tp=1, pp=1, ep=ep, zero=1)
    target = Target(job=job, estimate=estimate(job, lay), gpus=32, rank=1)
    text = " ".join(str(a) for a in emitter("megatron").arguments(target)["PARALLEL_ARGS"])
    assert " ".join(expected) in text and (("--overlap-moe-expert-parallel-comm" in text) == overlap)


def test_megatron_refuses_a_longer_sequence_than_a_learned_position_table(tmp_path, capsys):
    """GPT-2's 1,024 learned positions at --seq-len 2048: Megatron-LM would build a 2,048-row table, another model."""
    argv = ["plan", "--model", "gpt2", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "64",
            "--seq-len", "2048", "--emit", "megatron", "--out", str(tmp_path / "g.sh")]
    assert main(argv) == 2
    assert "1024 learned positions, fewer than the --seq-len 2048" in capsys.readouterr().err


@pytest.mark.parametrize("lay, words", [
    (Layout(dp=32, ep=8, zero=1, recompute="full"), "full recompute"),
    (Layout(dp=8, pp=4, ep=8, zero=1), "pipeline without virtual stages"),
])
def test_megatron_refuses_ep_overlap_where_megatron_core_does(lay, words):
    job = replace(_job("mixtral-8x7b", "megatron-core"), ep_comm_overlap=True)
    assert words in emitter("megatron").problem(job, lay)


def test_an_offloaded_plan_is_emitted_with_its_offload(tmp_path, monkeypatch):
    """--offload is part of what was priced: each file turns its stack's offload on, read back by the stack's own parser
    (DeepSpeed's config, torchtitan's ConfigManager) or checked against Megatron-LM's options."""
    model, cluster = load_model("llama2-70b"), load_cluster("dgx-a100-80gb")
    lay = Layout(8, 1, 1, 1, 1, 3, "full", False, "1f1b")
    for offload in ("optimizer", "params"):
        job = replace(make_job(model, cluster, 16, 4096, "deepspeed-2024"), offload=offload)
        out = tmp_path / f"ds-{offload}.json"
        out.write_text(render("deepspeed", Target(job=job, estimate=estimate(job, lay), gpus=8, rank=1)))
        read_deepspeed(out, 8, monkeypatch)  # DeepSpeed's own config class takes it
        zero = json.loads(out.read_text())["zero_optimization"]
        assert zero["offload_optimizer"]["device"] == "cpu"
        assert (zero.get("offload_param", {}).get("device") == "cpu") is (offload == "params")
    job = replace(make_job(model, cluster, 16, 4096, "torchtitan"), offload="params")
    out = tmp_path / "tt.toml"
    out.write_text(render("torchtitan", Target(job=job, estimate=estimate(job, lay), gpus=8, rank=1)))
    assert "enable_cpu_offload = true" in out.read_text()
    job = replace(make_job(model, cluster, 16, 4096, "megatron-core"), offload="optimizer")
    out = tmp_path / "m.sh"
    out.write_text(render("megatron", Target(job=job, estimate=estimate(job, lay.with_(zero=1)), gpus=8, rank=1)))
    _, argv = run_megatron_script(out, tmp_path)
    known = {f for o in json.loads((DATA / "megatron_lm_arguments.json").read_text())["options"] for f in o["flags"]}
    assert {"--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--use-distributed-optimizer"} <= set(argv)
    assert [a for a in argv if a.startswith("--") and a not in known] == []


def test_a_one_rank_deepspeed_offload_is_written_at_the_stage_deepspeed_offloads_from(tmp_path, monkeypatch):
    """At one data-parallel rank the plan prices ZeRO-0 (nothing to shard over), but DeepSpeed builds its offloading
    optimizer only from ZeRO-2 (2021-22) or ZeRO-1: the file asks for that stage, as single-GPU ZeRO-Offload does."""
    job = replace(make_job(load_model("llama3-8b"), load_cluster("aws-p4d"), 1024, 2048, "deepspeed"), offload="optimizer")
    lay = Layout(1, 8, 1, 4, 1, 0, "full", False, "1f1b")
    out = tmp_path / "ds.json"
    out.write_text(render("deepspeed", Target(job=job, estimate=estimate(job, lay), gpus=8, rank=1)))
    read_deepspeed(out, 1, monkeypatch)
    zero = json.loads(out.read_text())["zero_optimization"]
    assert zero["stage"] == 2 and zero["offload_optimizer"]["device"] == "cpu"


@pytest.mark.parametrize("lay, overlap, connections", [
    (Layout(dp=8, tp=2, zero=1), False, "1"),
    (Layout(dp=8, cp=2, zero=1), False, "1"),  # context parallelism asks for it too (validate_args)
    (Layout(dp=16, zero=1), False, None),
    (Layout(dp=4, tp=2, cp=2, zero=3), False, None),  # Megatron FSDP wants more than one
    (Layout(dp=8, tp=2, ep=8, zero=1, sequence_parallel=True), True, "32"),  # so does the EP overlap the plan priced
])
def test_megatron_script_sets_the_connections_megatron_lm_asks_for(lay, overlap, connections):
    # Megatron-LM's validate_args (before Blackwell) asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP unless
    # Megatron FSDP or the EP overlap runs; the script had exported it for TP only, so a CP plan failed at launch.
    model = "mixtral-8x7b" if lay.ep > 1 else "llama3.1-8b"
    job = replace(_job(model, "megatron-core"), ep_comm_overlap=overlap)
    target = Target(job=job, estimate=estimate(job, lay), gpus=lay.world_size, rank=1)
    exported = [line.split()[1].split("=")[1] for line in emitter("megatron").render(target).splitlines()
                if line.startswith("export CUDA_DEVICE_MAX_CONNECTIONS=")]
    assert exported == ([connections] if connections else [])


def test_an_autotp_deepspeed_config_leaves_the_batch_to_the_data_parallel_ranks(tmp_path, monkeypatch):
    # deepspeed.initialize reads the config before AutoTP's groups exist: with no mpu it counts every rank as
    # data-parallel, so a train_batch_size for the real dp failed its batch check at launch; the file leaves it out
    # and the launch line says what the batch is.
    job = _job("llama3-8b", "deepspeed-2024")
    lay = Layout(dp=8, tp=2, zero=1, micro_batch=4)
    target = Target(job=job, estimate=estimate(job, lay), gpus=16, rank=1)
    path = tmp_path / "ds.json"
    path.write_text(emitter("deepspeed").render(target))
    got = read_deepspeed(path, lay.dp, monkeypatch)
    assert (got["dp"], got["tp"], got["micro_batch"], got["microbatches"]) == (8, 2, 4, 8)
    assert "4 x 8 x 8 data-parallel ranks = 256" in emitter("deepspeed").launch(target, path)
    assert json.loads(path.read_text())["zero_optimization"]["overlap_comm"]
    # under a pipeline DeepSpeed turns the overlap off (engine.py: "Pipeline parallelism does not support overlapped
    # communication"): the file asks for what runs
    piped = Layout(dp=4, pp=4, zero=1, micro_batch=1)
    target = Target(job=job, estimate=estimate(job, piped), gpus=16, rank=1)
    assert json.loads(emitter("deepspeed").render(target))["zero_optimization"]["overlap_comm"] is False


def test_a_deepspeed_pipeline_with_more_stages_than_layers_names_its_partition(tmp_path):
    """More stages than layers run only where PipelineModule counts the embeddings as layers
    ('type:transformer|embedding', as BLOOM ran 70 layers on 72 stages); the file and the launch line say so, and
    keep 'parameters' otherwise."""
    job = _job("llama2-7b", "deepspeed-2024")  # 32 layers
    for pp, method in ((34, "type:transformer|embedding"), (8, "parameters")):
        lay = Layout(dp=1, pp=pp, micro_batch=1)
        target = Target(job=job, estimate=estimate(job, lay), gpus=pp, rank=0)
        assert json.loads(emitter("deepspeed").render(target))["pipeline"]["partition"] == method
        assert f"partition_method='{method}'" in emitter("deepspeed").launch(target, tmp_path / "ds.json")


def test_a_file_for_one_stack_holds_a_layout_that_stack_can_hold_in_memory(tmp_path, capsys):
    """Ranked for megatron-core, written for torchtitan: the file runs under torchtitan, whose eager layers keep more
    than megatron-core's fused ones. Llama 3 8B at 32K on 8 A100-40GB: megatron-core's winner needs 47.4 GiB as
    torchtitan runs it, and none of its fitting layouts fits there — one line, nothing written (it wrote the winner,
    an out-of-memory config carrying megatron-core's speed). Where one does fit (the README's plan, for DeepSpeed),
    the file's layout fits as the target runs it."""
    out = tmp_path / "tt.toml"
    argv = ["plan", "--model", "llama3-8b", "--cluster", "dgx-a100-40gb", "--gpus", "8", "--global-batch", "64",
            "--seq-len", "32768", "--framework", "megatron-core", "--emit", "torchtitan", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fits under torchtitan" in err[0] and "drop --framework" in err[0], err
    assert not out.exists()
    assert main(README_PLAN + ["--emit", "deepspeed", "--framework", "megatron-core", "--out", os.devnull, "--json"]) == 0
    emitted = json.loads(capsys.readouterr().out)["emitted"]["layout"]
    layout = Layout(**{f.name: emitted[f.name] for f in fields(Layout) if f.name in emitted})
    job = make_job(load_model("llama-65b"), load_cluster("dgx-a100-80gb"), 1024, 2048, FRAMEWORK["deepspeed"])
    assert estimate(job, layout).fits


def test_a_winner_its_stacks_own_launch_file_cannot_hold_is_said(capsys):
    """Llama 2 70B on 8 A100 under deepspeed-2024 with the optimizer offloaded: the winner is tp 2 x pp 4, which
    Megatron-DeepSpeed runs and DeepSpeed's own JSON cannot express (no TP beside its pipeline). explain and plan say
    so, and what --emit deepspeed writes instead; a winner the file holds gets no such note."""
    argv = ["--model", "llama2-70b", "--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "64", "--seq-len",
            "4096", "--framework", "deepspeed-2024", "--offload", "optimizer"]
    for command in ("explain", "plan"):
        assert main([command, *argv]) == 0
        said = " ".join(capsys.readouterr().out.split())
        assert "DeepSpeed's own launch file cannot hold the winner (it needs TP with a pipeline" in said, said[-600:]
    assert main(["plan", *argv, "--pp", "1"]) == 0  # its SP too: AutoTP splits the layers, not the sequence
    assert "own launch file cannot hold the winner (it needs sequence parallelism" in " ".join(capsys.readouterr().out.split())
    assert main(["plan", *argv, "--tp", "1", "--pp", "1"]) == 0
    assert "own launch file cannot hold" not in capsys.readouterr().out


def _megatron_args(job, lay, tmp_path, gpus):
    """The arguments the emitted Megatron script passes, parsed by Megatron-LM's option table."""
    out = tmp_path / "m.sh"
    out.write_text(render("megatron", Target(job=job, estimate=estimate(job, lay), gpus=gpus, rank=1)))
    return megatron_parser().parse_known_args(run_megatron_script(out, tmp_path)[1])[0]


def test_megatron_moe_experts_run_as_the_plan_priced_their_gemms(tmp_path):
    """Without --moe-grouped-gemm Megatron builds SequentialMLP, one local expert after another; megatron-core's plan
    priced Transformer Engine's GroupedLinear (expert_gemm_streams 4), a stack that runs them one by one did not."""
    lay = Layout(dp=16, ep=4, zero=1)
    assert _megatron_args(_job("qwen1.5-moe-a2.7b", "megatron-core"), lay, tmp_path, 16).moe_grouped_gemm is True
    assert FRAMEWORKS["deepspeed-2024"].expert_gemm_streams == 1
    assert not _megatron_args(_job("qwen1.5-moe-a2.7b", "deepspeed-2024"), lay, tmp_path, 16).moe_grouped_gemm


def test_megatron_gradients_are_reduced_in_the_dtype_the_plan_priced(tmp_path):
    """Megatron-FSDP accumulates and reduces in the model's dtype unless told ('auto'); the plan priced FP32 under
    megatron-core: the script says fp32. A plan priced with BF16 reductions (deepspeed-2024) asks Megatron's DDP for
    them; megatron-core's own DDP reduces FP32 by default and needs no flag."""
    job = _job("llama3.1-8b", "megatron-core")
    assert _megatron_args(job, Layout(dp=16, zero=3), tmp_path, 16).megatron_fsdp_main_grads_dtype == "fp32"
    assert _megatron_args(job, Layout(dp=16, zero=2), tmp_path, 16).megatron_fsdp_main_grads_dtype == "fp32"
    plain = _megatron_args(job, Layout(dp=16, zero=1), tmp_path, 16)
    assert not plain.grad_reduce_in_bf16 and plain.megatron_fsdp_main_grads_dtype is None
    assert FRAMEWORKS["deepspeed-2024"].grad_reduce_bytes == 2
    assert _megatron_args(_job("llama3.1-8b", "deepspeed-2024"), Layout(dp=16, zero=1), tmp_path, 16).grad_reduce_in_bf16


def test_megatron_overlaps_the_reduction_over_context_parallel_ranks_too(tmp_path):
    """DDP and the distributed optimizer reduce over dp x cp: a dp 1 layout with cp 2 reduces, overlapped as priced."""
    args = _megatron_args(_job("llama3.1-8b", "megatron-core"), Layout(dp=1, tp=4, cp=2, zero=1, sequence_parallel=True),
                          tmp_path, 8)
    assert args.overlap_grad_reduce and args.overlap_param_gather and args.context_parallel_size == 2


def test_deepspeed_refuses_a_stage_0_pipeline_it_would_run_as_zero_1():
    """engine.py: a bf16 pipeline at stage 0 gets BF16_Optimizer, which shards the optimizer states (ZeRO-1)."""
    job = _job("llama3.1-8b", "deepspeed-2024")
    assert "BF16_Optimizer" in emitter("deepspeed").problem(job, Layout(dp=8, pp=2, zero=0))
    assert emitter("deepspeed").problem(job, Layout(dp=8, pp=2, zero=1)) is None


def test_torchtitan_refuses_what_it_would_run_in_fp32_or_refuse_at_startup():
    """maybe_enable_amp: TP or PP without FSDP (dp_shard or cp > 1) trains in FP32; parallelize.py asserts seq_len %
    (tp x 2 x cp) == 0. The planner's torchtitan profile skips the first too."""
    job = _job()
    assert "FP32" in emitter("torchtitan").problem(job, Layout(dp=1, tp=8, zero=2, sequence_parallel=True))
    assert "FP32" in emitter("torchtitan").problem(job, Layout(dp=1, pp=4, zero=2))
    assert emitter("torchtitan").problem(job, Layout(dp=1, tp=4, cp=2, zero=2, sequence_parallel=True)) is None
    assert "FP32" in FRAMEWORKS["torchtitan"].refusal(Layout(dp=1, tp=8, zero=2, sequence_parallel=True))
    assert FRAMEWORKS["automodel"].refusal(Layout(dp=1, tp=8, zero=2, sequence_parallel=True)) is None  # BF16 weights
    odd = make_job(load_model("llama3.1-8b"), load_cluster("dgx-h100-80gb"), 256, 2050, "torchtitan")
    assert "tp x 2 x cp = 4" in emitter("torchtitan").problem(odd, Layout(dp=8, tp=2, zero=2, sequence_parallel=True))
    even = make_job(load_model("llama3.1-8b"), load_cluster("dgx-h100-80gb"), 256, 2052, "torchtitan")
    assert emitter("torchtitan").problem(even, Layout(dp=8, tp=2, zero=2, sequence_parallel=True)) is None
